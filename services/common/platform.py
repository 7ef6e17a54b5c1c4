"""`paddlecloud server`: the whole platform on one machine, as supervised processes on loopback.

The supervisor binds every listening socket itself and hands each service its socket
by file descriptor. A crashed service is restarted on the same socket, so the gateway's
upstream addresses never change and no port can be taken in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import yaml

from .config import ConfigError, apply_env, validate_config
from .runner import LISTEN_BACKLOG

SERVICES = ("jobs", "pfs", "builder")  # started first; the gateway last, once they answer
ADMIN = "admin"
STOP_GRACE = 10.0
STARTUP_TIMEOUT = 60.0
MAX_RESTART_DELAY = 30.0
# A service that ran this long before crashing is restarted at once again.
HEALTHY_RUN = 60.0


class StartupError(Exception):
    """The platform could not start; the message says which part and why."""


# What `paddlecloud server` sets itself, whatever a --server-config or a PADDLECLOUD_*
# variable says: each is refused at start with what to do instead, never dropped unseen.
_OWN_PORT = "paddlecloud server gives each service a free loopback port of its own choosing"
_OWN_ADMIN = "the server's administrator is 'admin', its password kept in DATA_DIR/admin.password"
SERVER_OWNED_SETTINGS = {
    "gateway.host": "use --host",
    "gateway.port": "use --port",
    **{f"{name}.{key}": _OWN_PORT for name in SERVICES for key in ("host", "port")},
    **{f"gateway.{name}_url": "the server connects its services itself" for name in SERVICES},
    "builder.url": "the server connects its services itself",
    "pfs.url": "the server connects its services itself",
    "gateway.admin_username": _OWN_ADMIN,
    "gateway.admin_password": _OWN_ADMIN,
    "gateway.admin_password_file": _OWN_ADMIN,
    "internal.secret": "the server keeps its own secret in DATA_DIR/internal.secret",
    "internal.secret_file": "the server keeps its own secret in DATA_DIR/internal.secret",
}


def read_server_config(path: Path | None, env: Mapping[str, str], datacenter: str) -> dict[str, Any]:
    """The sections of a `--server-config` file, once it and the environment's
    PADDLECLOUD_* variables validate under the server's own defaults (an unknown section or
    key, or a bad value, is named) and set nothing the server sets itself; StartupError
    otherwise."""
    where = f"--server-config {path}" if path is not None else "the environment"
    raw: Any = {}
    if path is not None:
        try:
            raw = yaml.safe_load(path.expanduser().read_text()) or {}
        except OSError as exc:
            raise StartupError(f"{where}: cannot read it: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise StartupError(f"{where} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise StartupError(f"{where}: the top level must be a mapping of sections")
    try:
        from_env = apply_env({}, env)
        probe = dict(raw)
        probe["pfs"] = {"datacenter": datacenter, **(raw.get("pfs") or {})}
        validate_config(probe, env)
    except ConfigError as exc:
        raise StartupError(f"{where}: {exc}") from None
    clashes = [
        f"{key} ({why})"
        for key, why in SERVER_OWNED_SETTINGS.items()
        if key.partition(".")[2] in (raw.get(key.partition(".")[0]) or {})
    ]
    clashes += [
        f"PADDLECLOUD_{key.replace('.', '_').upper()} ({why})"
        for key, why in SERVER_OWNED_SETTINGS.items()
        if key.partition(".")[2] in from_env.get(key.partition(".")[0], {})
    ]
    if clashes:
        raise StartupError(f"{where} sets what paddlecloud server sets itself: " + "; ".join(clashes))
    return raw


@dataclass
class Child:
    name: str
    sock: socket.socket
    url: str
    process: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    restarts: int = 0
    log_path: Path = field(default=Path())


def _listen(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror} (choose another --port)") from exc
    sock.listen(LISTEN_BACKLOG)
    sock.set_inheritable(True)
    return sock


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read, atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


@dataclass
class Platform:
    """Everything `paddlecloud server` needs to know to run the services."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 8080
    base_config: Path | None = None
    datacenter: str = "datacenter1"
    out: TextIO = sys.stdout
    log: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr, flush=True))

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.expanduser().resolve()
        self.run_dir = self.data_dir / "run"
        self.log_dir = self.data_dir / "logs"
        self.children: dict[str, Child] = {}
        self._stopping = asyncio.Event()
        self.endpoint = ""
        self._lock_fd: int | None = None

    # The data directory's lock ------------------------------------------------

    @property
    def lock_path(self) -> Path:
        return self.data_dir / "server.lock"

    def lock(self) -> None:
        """Hold an exclusive lock on the data directory for as long as this process runs.

        Two servers on one data directory would share the store and each clean up what it
        takes for the other's leftovers (the builder kills "interrupted" builds on start), so
        the second refuses, naming the first. The lock is an flock on `server.lock`: the
        kernel drops it when the holder dies, so a crashed server never blocks the next.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._lock_holder(fd)
            os.close(fd)
            raise StartupError(
                f"another paddlecloud server ({holder}) is running on {self.data_dir}; "
                "stop it, or give this one another --data-dir"
            ) from None
        self._lock_fd = fd
        self._write_lock({"pid": os.getpid()})

    def _lock_holder(self, fd: int) -> str:
        try:
            holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        except (OSError, ValueError):
            holder = {}
        pid = holder.get("pid", "unknown")
        port = holder.get("port")
        return f"pid {pid}, port {port}" if port is not None else f"pid {pid}, still starting"

    def _write_lock(self, holder: dict[str, Any]) -> None:
        if self._lock_fd is None:
            return
        data = json.dumps(holder).encode()
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, data, 0)

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    # Set-up -----------------------------------------------------------------

    def prepare(self) -> str | None:
        """Lock the data directory, create it and its secrets; the new admin password on a
        first run. `StartupError` when another server holds the directory."""
        read_server_config(self.base_config, os.environ, self.datacenter)  # refused before anything starts
        if self._lock_fd is None:
            self.lock()
        for d in (self.data_dir, self.run_dir, self.log_dir, self.data_dir / "pfs"):
            d.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o700)
        secret_file = self.data_dir / "internal.secret"
        if not secret_file.exists():
            _write_private(secret_file, secrets.token_hex(32))
        password_file = self.data_dir / "admin.password"
        if password_file.exists():
            return None
        password = secrets.token_urlsafe(18)
        _write_private(password_file, password)
        return password

    def admin_password(self) -> str:
        return (self.data_dir / "admin.password").read_text().strip()

    def _bind(self) -> None:
        for name in SERVICES:
            sock = _listen("127.0.0.1", 0)
            self.children[name] = Child(name, sock, f"http://127.0.0.1:{sock.getsockname()[1]}")
        gateway = _listen(self.host, self.port)
        port = gateway.getsockname()[1]
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.endpoint = f"http://{host}:{port}"
        self._write_lock({"pid": os.getpid(), "port": port, "endpoint": self.endpoint})
        self.children["gateway"] = Child("gateway", gateway, self.endpoint)
        for child in self.children.values():
            child.log_path = self.log_dir / f"{child.name}.log"

    def _config_file(self) -> Path:
        raw = read_server_config(self.base_config, os.environ, self.datacenter)
        raw.setdefault("store", {}).setdefault("url", f"sqlite:///{self.data_dir}/paddlecloud.db")
        raw.setdefault("pfs", {}).setdefault("root", str(self.data_dir / "pfs"))
        raw["pfs"].setdefault("datacenter", self.datacenter)
        raw.setdefault("jobs", {}).setdefault("work_dir", str(self.data_dir / "jobs"))
        raw.setdefault("builder", {}).setdefault("work_dir", str(self.data_dir / "builder"))
        raw.setdefault("internal", {})["secret_file"] = str(self.data_dir / "internal.secret")
        gateway = raw.setdefault("gateway", {})
        gateway["admin_username"] = ADMIN
        gateway["admin_password_file"] = str(self.data_dir / "admin.password")
        for name in SERVICES:
            gateway[f"{name}_url"] = self.children[name].url
        # The jobs service asks the builder directly for a job's environment, and pfs for usage.
        raw.setdefault("builder", {})["url"] = self.children["builder"].url
        raw["pfs"]["url"] = self.children["pfs"].url
        raw.setdefault("log", {}).setdefault("format", "json")
        path = self.run_dir / "paddlecloud.yaml"
        _write_private(path, yaml.safe_dump(raw, sort_keys=False))
        return path

    # Running ----------------------------------------------------------------

    async def _spawn(self, child: Child, config: Path) -> None:
        fd = child.sock.fileno()
        # Opening a local file for append is quick; the child inherits it, we close ours.
        log_file = open(child.log_path, "ab")  # noqa: ASYNC230
        try:
            child.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                f"paddlecloud.{child.name}",
                "--config",
                str(config),
                "--fd",
                str(fd),
                "--parent-pid",
                str(os.getpid()),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                pass_fds=(fd,),
                # Own session: a Ctrl-C in the terminal reaches the supervisor only,
                # which then stops the services in order.
                start_new_session=True,
            )
        finally:
            log_file.close()
        child.started_at = time.monotonic()

    async def _wait_healthy(self, child: Child, session: aiohttp.ClientSession) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        assert child.process is not None
        while time.monotonic() < deadline:
            if child.process.returncode is not None:
                raise StartupError(
                    f"the {child.name} service exited with {child.process.returncode} while starting:\n"
                    + self.tail(child.name)
                )
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(f"{child.url}/healthz") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.05)
        raise StartupError(f"the {child.name} service did not answer within {STARTUP_TIMEOUT:.0f}s")

    def tail(self, name: str, lines: int = 20) -> str:
        try:
            text = self.children[name].log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    async def start(self) -> None:
        self._bind()
        config = self._config_file()
        timeout = aiohttp.ClientTimeout(total=1)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for name in (*SERVICES, "gateway"):
                await self._spawn(self.children[name], config)
                await self._wait_healthy(self.children[name], session)
                self.log(f"started {name} (pid {self.children[name].process.pid})")  # type: ignore[union-attr]
        state = {"endpoint": self.endpoint, "pid": os.getpid(), "data_dir": str(self.data_dir)}
        _write_private(self.run_dir / "server.json", json.dumps(state))
        self._config = config

    async def supervise(self) -> None:
        """Restart crashed services, with a capped backoff, until asked to stop."""
        watchers = [
            asyncio.create_task(self._watch(child), name=f"supervise-{child.name}")
            for child in self.children.values()
        ]
        try:
            await self._stopping.wait()
        finally:
            for task in watchers:
                task.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)

    async def _watch(self, child: Child) -> None:
        delay = 1.0
        while not self._stopping.is_set():
            assert child.process is not None
            code = await child.process.wait()
            if self._stopping.is_set():
                return
            ran = time.monotonic() - child.started_at
            delay = 0.0 if ran > HEALTHY_RUN else min(max(delay * 2, 1.0), MAX_RESTART_DELAY)
            self.log(f"{child.name} exited with {code} after {ran:.1f}s; restarting in {delay:.0f}s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=delay)
            if self._stopping.is_set():
                return
            await self._spawn(child, self._config)
            child.restarts += 1
            self.log(f"restarted {child.name} (pid {child.process.pid}, restart {child.restarts})")

    def request_stop(self) -> None:
        self._stopping.set()

    async def stop(self) -> None:
        """SIGTERM every service (gateway first, so no new work arrives), then SIGKILL stragglers."""
        self._stopping.set()
        order = ["gateway", *SERVICES]
        running = [self.children[n].process for n in order if n in self.children]
        for proc in running:
            if proc is not None and proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
        for proc in running:
            if proc is None:
                continue
            try:
                await asyncio.wait_for(proc.wait(), timeout=STOP_GRACE)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        for child in self.children.values():
            child.sock.close()
        with contextlib.suppress(FileNotFoundError):
            (self.run_dir / "server.json").unlink()


async def run_platform(platform: Platform, on_ready: Callable[[Platform], None]) -> int:
    """Start the platform, call `on_ready`, supervise until SIGINT/SIGTERM, stop cleanly."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, platform.request_stop)
    try:
        await platform.start()
        on_ready(platform)
        await platform.supervise()
    except StartupError as exc:
        platform.log(str(exc))  # `log` adds the "paddlecloud server:" prefix itself
        return 1
    finally:
        await platform.stop()
        platform.log("stopped")
        platform.unlock()
    return 0
