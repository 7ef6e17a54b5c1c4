"""A job's TensorBoard or VisualDL on one machine: the real server, sandboxed as its user, on a UNIX socket.

The viewer parses files the user wrote, so it runs like the job itself (services/common/
sandbox.py): bubblewrap namespaces, setpriv to the user's uid, seeing the system, its own
Python environment and the job's output directory, read-only, at the PFS path the job
wrote it under, and nothing else of PFS. It has no network at all (a network namespace of
its own, loopback only). The service makes the listening UNIX socket itself, in a
directory of its own (0700, root's), and hands the descriptor over (viewer_serve.py): no
TCP port exists that anyone on the machine could connect to, and nothing in the sandbox
can name another socket for the service to connect to. The output directory is bound
from a descriptor opened beneath the PFS root by the kernel (`Root.open`), so a link the
user made is never followed. `--die-with-parent`: the viewer ends with the service even
when the service is killed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import os
import shutil
import signal
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import structlog

from paddlecloud.common import sandbox as sandboxes
from paddlecloud.common.sandbox import Bind, View
from paddlecloud.common.volume import PfsPath, Root

from ..errors import ViewerFailed
from ..viewers import Upstream

log = structlog.get_logger(__name__)

SERVE = Path(__file__).with_name("viewer_serve.py")
# The environment of a viewer's process: none of the service's own (its secrets).
ENVIRONMENT = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}  # noqa: S108 - the sandbox's own tmpfs
STDERR_LINES = 20


class LocalViewer(Upstream):
    """One running viewer process (bwrap and what it runs), reached on its socket."""

    base_url = "http://viewer"

    def __init__(self, process: asyncio.subprocess.Process, path: str, read_timeout: float) -> None:
        self._process = process
        self._path = path
        self._read_timeout = read_timeout
        self._said: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._reader = asyncio.create_task(self._read_stderr(), name="jobs-viewer-stderr")
        self._session: aiohttp.ClientSession | None = None

    async def _read_stderr(self) -> None:
        assert self._process.stderr is not None
        async for line in self._process.stderr:
            self._said.append(line.decode(errors="replace").rstrip())

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=self._path),
                # Bodies pass through as the viewer encoded them.
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                # A viewer that just started answers once it has loaded: the first request
                # waits for it, up to the start timeout.
                timeout=aiohttp.ClientTimeout(total=None, sock_read=self._read_timeout),
            )
        return self._session

    def ended(self) -> str | None:
        code = self._process.returncode
        if code is None:
            return None
        last = " | ".join(list(self._said)[-3:])
        return f"exited with status {code}" + (f": {last}" if last else "")

    async def stop(self) -> None:
        # bwrap leads the process group: the group's SIGKILL ends it and, with
        # --die-with-parent, the sandbox's init and all under it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGKILL)
        await self._process.wait()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        if self._session is not None:
            await self._session.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)


@dataclass(frozen=True)
class Wanted:
    """Which viewer (`kind`) of which output directory, under which URL path, run by which Python."""

    kind: str
    output: PfsPath
    prefix: str
    python: str


class ViewerLauncher:
    """Starts viewers for the local backend: the sandbox and uids are the backend's own."""

    def __init__(self, root: Root, read_timeout: float) -> None:
        self._root = root
        self._read_timeout = read_timeout
        self._dir: str | None = None
        self._numbers = itertools.count()

    def _socket_dir(self) -> str:
        # Short (a UNIX socket's path has at most 107 bytes) and private: made by root,
        # 0700, in the system's temporary directory, once per service.
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="paddlecloud-viewers-")
        return self._dir

    async def start(self, sandbox: sandboxes.Sandbox, uid: int, wanted: Wanted) -> LocalViewer:
        """The viewer `wanted`, started as `uid`; ViewerFailed saying why not."""
        kind = wanted.kind
        command, listener, out, path = await asyncio.to_thread(self._prepare, sandbox, uid, wanted)
        try:
            process = await asyncio.create_subprocess_exec(
                *command.argv,
                pass_fds=(*command.fds, listener.fileno(), out),
                start_new_session=True,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env=ENVIRONMENT,
                cwd="/",
            )
        except OSError as exc:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            raise ViewerFailed(f"{kind} cannot start: {exc}") from None
        finally:
            # The viewer holds its own copies; with ours closed, a viewer that died refuses
            # connections at once rather than leaving them in the backlog.
            command.close()
            listener.close()
            os.close(out)
        log.info("viewer_process_started", kind=kind, pid=process.pid, sandboxed=sandbox.enabled, uid=uid)
        return LocalViewer(process, path, self._read_timeout)

    def _prepare(
        self, sandbox: sandboxes.Sandbox, uid: int, wanted: Wanted
    ) -> tuple[sandboxes.Command, socket.socket, int, str]:
        """The command, the listening socket, the output's descriptor and the socket's path."""
        kind, output, prefix, python = wanted.kind, wanted.output, wanted.prefix, wanted.python
        if not os.path.isfile(python):
            raise ViewerFailed(f"{kind}: the interpreter {python} set as jobs.viewers.{kind} does not exist")
        try:
            out = self._root.open(output, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ViewerFailed(f"the job's output directory {output} does not exist (yet)") from None
        except OSError as exc:
            message = f"the job's output directory {output} cannot be opened: {exc.strerror}"
            raise ViewerFailed(message) from None
        path = os.path.join(self._socket_dir(), f"{next(self._numbers)}.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            listener.listen(128)
            if sandbox.enabled:
                logdir = output.text
                view = View(
                    uid=uid,
                    gid=uid,
                    binds=(Bind(f"/proc/self/fd/{out}", logdir), *_environment_binds(python)),
                    no_network=True,
                )
                argv = [python, "-I", str(SERVE), kind, logdir, str(listener.fileno()), prefix]
                command = sandbox.wrap(view, argv)
            else:
                # No sandbox on this machine (jobs.sandbox: off, or no bwrap): the viewer runs
                # as the jobs do here, as the service's user; still on the socket only.
                logdir = os.readlink(f"/proc/self/fd/{out}")
                argv = [python, "-I", str(SERVE), kind, logdir, str(listener.fileno()), prefix]
                command = sandboxes.Command(argv)
        except OSError as exc:
            listener.close()
            os.close(out)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            raise ViewerFailed(f"{kind} cannot start: {exc}") from None
        return command, listener, out, path

    def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _environment_binds(python: str) -> tuple[Bind, ...]:
    """The viewer's Python environment, read-only at its own path: the virtual environment
    and the installation its `pyvenv.cfg` names (beyond what every sandbox sees already)."""
    prefix = os.path.realpath(os.path.dirname(os.path.dirname(python)))
    wanted = [prefix]
    with contextlib.suppress(OSError), open(os.path.join(prefix, "pyvenv.cfg"), encoding="utf-8") as f:
        for line in f:
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                wanted.append(os.path.realpath(os.path.dirname(value.strip())))
    seen = [*sandboxes.python_paths()]
    binds = []
    for path in wanted:
        parts = Path(path).parts
        if len(parts) > 1 and parts[1] in sandboxes.SYSTEM_DIRS:
            continue  # the system is visible already
        if any(path == p or path.startswith(p + "/") for p in seen):
            continue
        seen.append(path)
        binds.append(Bind(path, path))
    return tuple(binds)
