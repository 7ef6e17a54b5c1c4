"""The local backend: one virtualenv per cache key, built with pip on this machine.

Layout under `builder.work_dir`:

- `builds/<build id>/`: a virtualenv, built in place. It never moves, because pip
  writes its absolute path into the scripts it installs (`#!.../bin/python`).
- `envs/<key>`: a symlink to the build directory, created under a temporary name and
  renamed into place once pip succeeded. That rename is the publication: a half-built
  environment has no `envs/` link and is never used; a failed or interrupted build's
  directory is removed, leaving only its log.
- `runs/<build id>/`: the requirements file and pip's TMPDIR while the build runs.
- `logs/<build id>.log`: what the build printed, kept after it ends.
- `pip/pip`: a link to the service's own pip, which builds run from (below).

How an environment is made. `python -m venv --without-pip` from the service's own
interpreter (sub-second; no pip copied into every environment), then pip from the
service's own installation, run by the new environment's interpreter with only pip on
PYTHONPATH, so it installs into the environment and sees none of the platform's
packages as already installed: the requirements are resolved as if in an empty
virtualenv. Last, a `.pth` file calls `site.addsitedir` on the platform's
site-packages, which appends them to `sys.path` after the environment's own and
processes their `.pth` files too (the editable install of `paddlecloud` is one): a job
imports `paddlecloud` and its dependencies from the platform, while every package the
user asked for wins over the platform's copy. `--system-site-packages` would not do:
from a platform that itself runs in a virtualenv it exposes the base interpreter's
packages, not the platform's.

Sandbox. pip runs code the requirements name (a source distribution's build backend),
so where bubblewrap is installed (`builder.sandbox: auto`) `pip install` runs in a
sandbox (services/common/sandbox.py) as the unprivileged `builder.sandbox_uid`, seeing
the system and the platform's Python read-only, its own environment and run directory
(requirements, TMPDIR, a pip cache of its own) read-write, and the local wheel
directories it was told about read-only: nothing else of the machine, no other build,
no published environment. Once pip succeeded the environment is given back to root, so
no later build or job can change what was published. As root, pip also runs in a network
namespace of its own (services/common/netns.py): outbound through pasta, and of the
host's loopback only the package index's ports.

Processes. Every command runs in its own process group, started through a few lines
that ask the kernel to SIGKILL it should the service die (PR_SET_PDEATHSIG), so pip
does not outlive a killed service; a restarted service also kills whatever still runs
from an unpublished build directory before removing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import ipaddress
import json
import os
import platform
import signal
import site
import stat
import sys
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

import structlog

from paddlecloud.common import beneath, netns, trees
from paddlecloud.common import sandbox as sandboxes
from paddlecloud.common.beneath import chown_tree
from paddlecloud.common.config import Config
from paddlecloud.common.diskuse import allocated_beneath
from paddlecloud.common.sandbox import Bind, Command, View

from .backend import (
    BaseRefused,
    BuildBackend,
    BuildRequest,
    CacheEntry,
    LogLine,
    LogQuery,
    Outcome,
    PipIndex,
    Published,
    RegistryLogin,
)
from .buildlog import BuildLogs, say

log = structlog.get_logger(__name__)

META = "paddlecloud-env.json"
LAST_USED = "paddlecloud-last-used"
PLATFORM_PTH = "_paddlecloud_platform.pth"
REASON_LINES = 3
REASON_CHARS = 2000
# What pip may see of the service's environment: enough to reach an index through the
# operator's proxy and certificates; never the service's secrets. Where packages come
# from is `builder.*` alone: pip's own configuration files and PIP_* index settings on
# this machine are ignored, so a build means the same wherever the service runs.
PASS_ENV = frozenset(
    {
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "TZ",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "NETRC",
        "PIP_CERT",
        "PIP_CLIENT_CERT",
        "PIP_PROXY",
        "PIP_TIMEOUT",
        "PIP_DEFAULT_TIMEOUT",
        "PIP_RETRIES",
    }
)
# Run argv[2:] with PR_SET_PDEATHSIG = SIGKILL, unless the service (argv[1]) is already gone.
LAUNCHER = """\
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""


class _Failed(Exception):
    """A step of the build failed; the message is the build's reason."""


class LocalBuildBackend(BuildBackend):
    name = "local"
    version = "local-1"
    artifact_fields = ("python",)

    def __init__(self, config: Config) -> None:
        section = config.builder
        self._root = section.work_dir.expanduser().absolute()
        self._envs = self._root / "envs"
        self._builds = self._root / "builds"
        self._runs = self._root / "runs"
        self._logs = self._root / "logs"
        self._pip_dir = self._root / "pip"
        self._python = sys.executable
        self._site_dirs = [d for d in site.getsitepackages() if os.path.isdir(d)]
        self._log_files = BuildLogs(self._logs, section.poll_seconds)
        self._timeout = section.build_timeout_seconds
        self._index_args = PipIndex(section.index_url, section.find_links, section.no_index).args()
        # Local wheel directories and file:// indexes the sandboxed pip must see.
        self._sources = [
            os.path.realpath(link.removeprefix("file://"))
            for link in (*section.find_links, section.index_url or "")
            if link and ("://" not in link or link.startswith("file://"))
        ]
        self._sandbox_mode = section.sandbox
        self._sandbox = sandboxes.Sandbox(None, None, os.geteuid() == 0)
        # The host loopback ports of the package index and find-links pages, the only ones
        # a build's network namespace reaches (forwarded by pasta).
        self._index_ports = loopback_ports((section.index_url or "", *section.find_links))
        self._network: list[str] | None = None  # the command pip runs under; None: the host's network
        self._uid = section.sandbox_uid
        version = sys.version_info
        self._site_packages = Path("lib") / f"python{version.major}.{version.minor}" / "site-packages"
        base = getattr(sys, "_base_executable", sys.executable)
        # The key says which Python and which platform packages an environment extends:
        # the platform moved or rebuilt elsewhere gets environments of its own.
        self._identity = (
            f"{platform.python_implementation()} {platform.python_version()} {os.path.realpath(base)}"
            f" platform-site={':'.join(self._site_dirs)}"
        )

    @property
    def work_dir(self) -> Path:
        return self._root

    async def open(self) -> None:
        for d in (self._envs, self._builds, self._runs, self._logs, self._pip_dir):
            d.mkdir(parents=True, exist_ok=True)
        spec = importlib.util.find_spec("pip")
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(
                "the builder runs pip from its own environment, and pip is not installed there"
            )
        pip_package = Path(next(iter(spec.submodule_search_locations)))
        link = self._pip_dir / "pip"
        if not link.is_symlink() or os.readlink(link) != str(pip_package):
            tmp = self._pip_dir / ".pip.tmp"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(pip_package)
            os.replace(tmp, link)
        try:
            self._sandbox = sandboxes.detect(self._sandbox_mode, "builds")
        except sandboxes.SandboxUnavailable as exc:
            raise RuntimeError(f"builder.sandbox is 'required': {exc}") from None
        if not self._sandbox.enabled:
            log.warning("builds_not_sandboxed", detail="pip runs as this service's user: install bubblewrap")
        self._network = self._network_wrapper()
        log.info(
            "local_builder_ready",
            work_dir=str(self._root),
            python=self._python,
            index=self._index_args,
            sandbox=self._sandbox.describe(),
            network="own namespace, outbound through pasta" if self._network else "host",
        )

    def _network_wrapper(self) -> list[str] | None:
        """The command that runs pip in a network namespace of its own, outbound through
        pasta with only the index's loopback ports forwarded; None where builds share the
        host's network (not root, no sandbox, or pasta cannot run and `builder.sandbox:
        auto`)."""
        if not self._sandbox.switches_uid:
            return None
        reason = netns.no_outbound_reason()
        if reason is not None:
            if self._sandbox_mode == "required":
                raise RuntimeError(f"builder.sandbox is 'required', but {reason}")
            log.warning("builds_share_host_network", detail=reason)
            return None
        forwards = [arg for port in self._index_ports for arg in ("--forward-tcp", str(port))]
        return [self._python, "-m", netns.__name__, "--outbound", *forwards, "--"]

    # -- keys and lookups ------------------------------------------------------------

    async def base_identity(self, base: str | None, registry: RegistryLogin | None = None) -> str:
        if base is not None:
            raise BaseRefused(
                f"the local builder builds on this platform's Python ({platform.python_version()}), "
                "not on an image; leave base out (base images need the Kubernetes builder)"
            )
        return self._identity

    def _python_of(self, key: str) -> str:
        return str(self._envs / key / "bin" / "python")

    def _published_dir(self, key: str) -> Path | None:
        """The build directory `envs/<key>` points at, if it is a whole environment."""
        try:
            target = os.readlink(self._envs / key)
        except (FileNotFoundError, NotADirectoryError, OSError):
            return None
        env = self._builds / Path(target).name
        try:
            whole = stat.S_ISREG(os.lstat(env / META).st_mode)
        except OSError:
            return None
        return env if whole else None

    @staticmethod
    def _read_meta(env: Path) -> dict[str, Any]:
        """The environment's metadata, read without following a link (OSError, ValueError)."""
        fd = beneath.open_top(env)
        try:
            meta = json.loads(beneath.read_file(fd, META))
        finally:
            os.close(fd)
        if not isinstance(meta, dict):
            raise ValueError(f"{META} is not an object")
        return meta

    @staticmethod
    def _touch(env: Path) -> None:
        fd = beneath.open_top(env)
        try:
            beneath.touch(fd, LAST_USED)
        finally:
            os.close(fd)

    async def lookup(self, key: str, *, touch: bool, owner: str = "") -> Published | None:
        env = self._published_dir(key)
        if env is None:
            return None
        try:
            meta = self._read_meta(env)
        except (OSError, ValueError):
            return None
        if touch:
            with contextlib.suppress(OSError):
                self._touch(env)
        return Published({"python": self._python_of(key)}, str(meta.get("build_id", "")))

    # -- building --------------------------------------------------------------------

    async def build(self, request: BuildRequest) -> Outcome:
        env = self._builds / request.build_id
        run = self._runs / request.build_id
        started = time.monotonic()
        deadline = started + self._timeout
        published = False
        with open(self._log_path(request.build_id), "ab", buffering=0) as out:  # noqa: ASYNC230 - local append
            try:
                await asyncio.to_thread(self._prepare_run, run, request.requirements)
                say(out, f"build {request.build_id} of key {request.key}")
                venv = [self._python, "-m", "venv", "--without-pip", str(env)]
                await self._step(
                    out, "creating the virtualenv", venv, run, deadline, shown="creating the virtualenv"
                )
                python = str(env / "bin" / "python")
                pip = [
                    python,
                    *("-m", "pip", "install", "--no-input", "--disable-pip-version-check"),
                    *("--progress-bar", "off", "--no-warn-script-location"),
                    *self._index_args,
                    *("-r", "requirements.txt"),
                ]
                command = Command(pip)
                if self._sandbox.enabled:
                    await asyncio.to_thread(self._hand_over, env, run, self._build_uid)
                    command = self._sandbox.wrap(self._view(env, run), pip)
                    if self._network is not None:
                        # The wrapper hands bwrap's descriptors on to it, at the same numbers.
                        keep = [arg for fd in command.fds for arg in ("--keep-fd", str(fd))]
                        command = Command([*self._network[:-1], *keep, "--", *command.argv], command.fds)
                try:
                    # The user reads what is installed, not the wrappers' command line (the
                    # host's paths, thousands of characters of them): the service's log has it.
                    shown = "$ pip install -r requirements.txt" + (
                        " (sandboxed)" if self._sandbox.enabled else ""
                    )
                    await self._step(
                        out, "pip install", command.argv, run, deadline, command.fds, shown=shown
                    )
                finally:
                    command.close()
                if self._sandbox.enabled:
                    try:
                        await asyncio.to_thread(self._hand_over, env, run, 0)
                    except OSError as exc:
                        raise _Failed(f"cannot take the environment back from the build: {exc}") from None
                await asyncio.to_thread(self._finish, env, request)
                self._publish(request.key, env)
                published = True
                elapsed = time.monotonic() - started
                say(out, f"published the environment in {elapsed:.1f} s")
                return Outcome(True, f"built in {elapsed:.1f} s", {"python": self._python_of(request.key)})
            except _Failed as exc:
                say(out, f"build failed: {exc}")
                return Outcome(False, str(exc))
            except asyncio.CancelledError:
                say(out, "stopped: the builder service is stopping; nothing was published")
                raise
            finally:
                if not published:
                    await asyncio.to_thread(_remove, env)
                await asyncio.to_thread(_remove, run)

    def _log_path(self, log_id: str) -> Path:
        return self._log_files.path(log_id)

    @property
    def _build_uid(self) -> int:
        return self._uid if self._sandbox.switches_uid else os.geteuid()

    def _view(self, env: Path, run: Path) -> View:
        """What a sandboxed pip sees besides the system and the platform's Python."""
        binds = [Bind(str(env), str(env), writable=True), Bind(str(run), str(run), writable=True)]
        binds.append(Bind(str(self._pip_dir), str(self._pip_dir)))
        binds += [Bind(path, path) for path in self._sources if os.path.exists(path)]
        uid = self._build_uid
        return View(uid=uid, gid=uid, binds=tuple(binds), cwd=str(run), tmp=str(run / "tmp"))

    @staticmethod
    def _hand_over(env: Path, run: Path, uid: int) -> None:
        """Give the environment and the run directory to the build's uid, or back to root.

        Back to root only once pip's sandbox is gone (its PID namespace dies with it), and
        through descriptors even so: a link the build left is changed itself, never what
        it points at."""
        chown_tree(env, uid, uid)
        chown_tree(run, uid, uid)

    @staticmethod
    def _prepare_run(run: Path, requirements: str) -> None:
        (run / "tmp").mkdir(parents=True)
        (run / "requirements.txt").write_text(requirements, encoding="utf-8")

    def _environ(self, run: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k in PASS_ENV}
        env.update(
            PIP_CONFIG_FILE=os.devnull,  # pip reads no configuration file at all then
            PYTHONPATH=str(self._pip_dir),
            PYTHONUNBUFFERED="1",
            PYTHONNOUSERSITE="1",
            PIP_DISABLE_PIP_VERSION_CHECK="1",
            PIP_NO_INPUT="1",
            TMPDIR=str(run / "tmp"),
        )
        if self._sandbox.enabled:
            # The service's HOME is not in the sandbox; the run's own cache goes with it.
            env.update(HOME=str(run / "tmp"), PIP_CACHE_DIR=str(run / "cache"))
        return env

    async def _step(
        self,
        out: BinaryIO,
        what: str,
        argv: list[str],
        run: Path,
        deadline: float,
        pass_fds: Sequence[int] = (),
        *,
        shown: str,
    ) -> None:
        """Run one command of the build with its output in the log; _Failed if it fails.
        `pass_fds`: descriptors the command reads (the sandbox's options and filter); `shown`:
        the step as the build's log says it."""
        say(out, shown)
        start_offset = os.fstat(out.fileno()).st_size
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Failed(f"{what}: the build took longer than {self._timeout:g} s")
        proc = await asyncio.create_subprocess_exec(
            self._python,
            "-c",
            LAUNCHER,
            str(os.getpid()),
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out.fileno(),
            stderr=asyncio.subprocess.STDOUT,
            cwd=run,
            env=self._environ(run),
            start_new_session=True,
            pass_fds=pass_fds,
        )
        log.info("build_step_started", step=what, pid=proc.pid, argv0=argv[0], argv=argv)
        try:
            code = await asyncio.wait_for(proc.wait(), remaining)
        except TimeoutError:
            _kill_group(proc.pid)
            await proc.wait()
            raise _Failed(f"{what}: the build took longer than {self._timeout:g} s and was stopped") from None
        except asyncio.CancelledError:
            _kill_group(proc.pid)
            await proc.wait()
            raise
        finally:
            _kill_group(proc.pid)  # whatever the command left behind in its group
        if code == 0:
            return
        boxed = argv[0] == self._sandbox.bwrap or argv[1:3] == ["-m", netns.__name__]
        if code > 128 and self._sandbox.enabled and boxed:
            code = 128 - code  # bwrap reports its program's death by signal N as 128 + N
        errors = _error_lines(Path(out.name), start_offset)
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            message = f"{what} was killed by {name}"
        else:
            message = f"{what} failed (exit {code})"
        raise _Failed(f"{message}: {errors}" if errors else message)

    def _finish(self, env: Path, request: BuildRequest) -> None:
        """Make the platform importable after the user's packages; record size and origin.

        The environment was the build's to write until a moment ago, and pip ran code the
        requirements named: anything may stand at these paths (a link aimed at a file of
        root's, a directory). So each file is created new, beneath the environment's
        descriptor, through no symlink, and never over something already there; what is
        in the way fails the build, saying what, and the environment is not published.
        """
        # A .pth line that starts with `import` is executed, one line at a time.
        lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in self._site_dirs)
        try:
            top = beneath.open_top(env)
        except OSError as exc:
            raise _Failed(f"the environment {env} cannot be opened: {exc.strerror}") from None
        try:
            self._create(top, f"{self._site_packages}/{PLATFORM_PTH}", lines)
            meta = {
                "key": request.key,
                "build_id": request.build_id,
                "built_at": time.time(),
                "size": _disk_usage(env),
            }
            self._create(top, LAST_USED, "")
            # Last: its presence is what makes the environment whole (_published_dir).
            self._create(top, META, json.dumps(meta) + "\n")
        finally:
            os.close(top)

    @staticmethod
    def _create(top: int, relative: str, text: str) -> None:
        try:
            beneath.write_new(top, relative, text.encode())
        except FileExistsError:
            raise _Failed(
                f"refused: the build left something at {relative} in the environment, where the "
                "builder writes its own file; nothing was published"
            ) from None
        except beneath.LinkRefused:
            raise _Failed(
                f"refused: the build left a symlink on the way to {relative} in the environment; the "
                "builder does not follow links a build made, and nothing was published"
            ) from None
        except OSError as exc:
            raise _Failed(f"cannot write {relative} in the environment: {exc.strerror}") from None

    def _publish(self, key: str, env: Path) -> None:
        """Point `envs/<key>` at the finished environment in one rename."""
        tmp = self._envs / f".{key}.{env.name}.tmp"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(Path("..") / "builds" / env.name)
        os.replace(tmp, self._envs / key)
        _fsync_dir(self._envs)

    # -- after a restart ------------------------------------------------------------

    async def recover(self, interrupted: Collection[str]) -> None:
        await asyncio.to_thread(self._recover, list(interrupted))

    def _recover(self, interrupted: list[str]) -> None:
        referenced = set()
        for link in self._envs.iterdir():
            if link.name.startswith("."):
                link.unlink(missing_ok=True)  # a publication that never happened
                continue
            env = self._published_dir(link.name)
            if env is None:
                link.unlink(missing_ok=True)
            else:
                referenced.add(env.name)
        leftovers = [d for d in self._builds.iterdir() if d.name not in referenced]
        _kill_processes_under([*leftovers, *self._runs.iterdir()])
        for d in leftovers:
            _remove(d)
        for d in self._runs.iterdir():
            _remove(d)
        for build_id in interrupted:
            path = self._log_path(build_id)
            if path.exists():
                with open(path, "ab") as out:
                    say(out, "build failed: the builder restarted during this build; nothing was published")
        if leftovers:
            log.info("unpublished_builds_removed", count=len(leftovers))

    # -- the size cap ----------------------------------------------------------------

    async def entries(self) -> list[CacheEntry]:
        return await asyncio.to_thread(self._entries)

    def _entries(self) -> list[CacheEntry]:
        result = []
        for link in self._envs.iterdir():
            if link.name.startswith("."):
                continue
            env = self._published_dir(link.name)
            if env is None:
                continue
            try:
                size = int(self._read_meta(env)["size"])
                last_used = os.lstat(env / LAST_USED).st_mtime
            except (OSError, ValueError, KeyError, TypeError):
                continue
            result.append(CacheEntry(link.name, size, last_used))
        return result

    async def evict(self, key: str, *, unless_used_after: float) -> bool:
        env = self._published_dir(key)
        if env is None:
            return False
        try:
            if os.lstat(env / LAST_USED).st_mtime > unless_used_after:
                return False
        except FileNotFoundError:
            pass
        (self._envs / key).unlink(missing_ok=True)  # unpublished: no lookup finds it any more
        _fsync_dir(self._envs)
        await asyncio.to_thread(_remove, env)
        return True

    # -- logs ------------------------------------------------------------------------

    def logs(
        self, log_id: str, query: LogQuery, finished: Callable[[], Awaitable[bool]]
    ) -> AsyncGenerator[list[LogLine], None]:
        return self._log_files.read(log_id, query, finished)


def loopback_ports(urls: Iterable[str]) -> list[int]:
    """The ports of the http(s) URLs among `urls` whose host is this machine's IPv4
    loopback (pasta runs IPv4 only, and forwards to the host's 127.0.0.1)."""
    ports: set[int] = set()
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or parts.hostname is None:
            continue
        try:
            address = ipaddress.ip_address("127.0.0.1" if parts.hostname == "localhost" else parts.hostname)
            loopback = address.version == 4 and address.is_loopback
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:  # a name (not an address), or a bad port: not this machine's loopback
            continue
        if loopback:
            ports.add(port)
    return sorted(ports)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _kill_processes_under(dirs: list[Path]) -> None:
    """SIGKILL every process whose command line names a path beneath one of `dirs` (what
    a killed service's builds left running), and wait a little for them to go."""
    if not dirs:
        return
    marks = [os.fsencode(str(d)) for d in dirs]
    deadline = time.monotonic() + 5.0
    while True:
        found = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            if any(arg.startswith(mark) for arg in args for mark in marks):
                found.append(int(entry.name))
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if not found or time.monotonic() > deadline:
            return
        time.sleep(0.05)


def _error_lines(path: Path, start: int) -> str:
    """The last error lines a command wrote to the log from `start` on."""
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        f.seek(max(start, end - 256 * 1024))
        text = f.read().decode("utf-8", errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")] or lines
    quoted = " | ".join(errors[-REASON_LINES:])
    return quoted if len(quoted) <= REASON_CHARS else "…" + quoted[-REASON_CHARS:]


def _disk_usage(path: Path) -> int:
    """Bytes allocated below `path`, walked at any depth without following symlinks."""
    return allocated_beneath(path).bytes


def _remove(path: Path) -> None:
    """Remove a build's directory, best effort: whatever depth pip's run left, never
    following its symlinks (`trees.remove_path`); what cannot go is logged."""
    try:
        trees.remove_path(path)
    except OSError as exc:
        log.warning("build_dir_not_removed", path=str(path), error=str(exc))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
