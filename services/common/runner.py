"""Running one service as a process: `python -m paddlecloud.<service> --config FILE`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import structlog
from aiohttp import web, web_protocol, web_server
from aiohttp.web_request import BaseRequest

from . import errors
from .config import Config, ConfigError, load_config
from .keys import CONFIG, SERVICE_NAME
from .logging import configure_logging

log = structlog.get_logger()

# Grace for in-flight requests (a finishing upload chunk, a log stream) on shutdown.
SHUTDOWN_TIMEOUT = 10.0
# Connections the kernel queues before the service accepts them (capped by
# net.core.somaxconn); at 128 a burst of 200 clients overflowed it.
LISTEN_BACKLOG = 1024
_PR_SET_PDEATHSIG = 1


async def serve(
    app: web.Application,
    *,
    host: str,
    port: int,
    sock: socket.socket | None = None,
    ready_file: Path | None = None,
) -> None:
    """Serve `app` until SIGTERM or SIGINT, then shut down gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    section = getattr(app[CONFIG], app[SERVICE_NAME])
    runner = web.AppRunner(
        app,
        access_log=None,
        shutdown_timeout=SHUTDOWN_TIMEOUT,
        # aiohttp's keep-alive timer is also its only header timeout: it starts when a
        # connection opens and again when an answer ends, and closes the connection if no
        # whole request line and headers arrived by then (nothing sent, half a request
        # line, unfinished headers: byte by byte or not). Its default is an hour.
        keepalive_timeout=section.header_timeout,
    )
    await runner.setup()
    assert runner.server is not None
    runner.server.__class__ = _ProblemServer  # see _ProblemHandler
    try:
        if sock is None:
            sock = listen_socket(host, port)
        else:
            sock.listen(LISTEN_BACKLOG)  # whatever queue the parent asked for, ours is this one
        site = EagerAcceptSite(runner, sock, backlog=LISTEN_BACKLOG)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
        log.info("service_started", host=bound_host, port=bound_port, pid=os.getpid())
        if ready_file is not None:
            _write_atomically(ready_file, json.dumps({"host": bound_host, "port": bound_port}))
        await stop.wait()
        log.info("service_stopping")
    finally:
        await runner.cleanup()


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host:port` (port 0: a free one), address reuse on."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


# Connections taken from the kernel's queue per wake-up, at most: the whole queue, as
# asyncio's own loop does. How long to stop accepting when out of descriptors or memory.
ACCEPT_BATCH = LISTEN_BACKLOG
ACCEPT_PAUSE_SECONDS = 1.0


class EagerAcceptSite(web.SockSite):
    """A site that takes every waiting connection each time its socket is ready.

    uvloop's libuv accepts one connection per turn of the event loop. Under load a turn
    serves every busy connection first, so a burst of 200 clients waited up to half a
    second in the kernel's queue (strace: one accept4 per turn, never EAGAIN; `ss -ltn`:
    a queue of 107 drained at ~5 per 20 ms), which was the p99 of short runs at 200
    connections, and the gateway's connect timeouts to its services. This accepts in a
    loop until the queue is empty, as asyncio's own loop does, and hands each socket to
    the event loop's `connect_accepted_socket`.
    """

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site; SockSite's would listen too
        assert self._runner.server is not None
        self._server = _Listener(asyncio.get_running_loop(), self._sock, self._runner.server)


class _Listener(asyncio.AbstractServer):
    """What aiohttp's runner needs of a server (its sockets, `close`), accepting eagerly."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.Protocol],
    ) -> None:
        self._loop = loop
        self._sock = sock
        self._factory = protocol_factory
        self._adopting: set[asyncio.Task[object]] = set()
        self._serving = True
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self._accept)

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return (self._sock,) if self._serving else ()

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _peer = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return  # the queue is empty
            except ConnectionAbortedError:
                continue  # the client gave up while queued
            except OSError as exc:
                # EMFILE, ENFILE, ENOBUFS, ENOMEM: pause rather than spin on a ready socket
                # that cannot be accepted; the kernel keeps queueing meanwhile.
                log.warning("accept_paused", error=str(exc), seconds=ACCEPT_PAUSE_SECONDS)
                self._loop.remove_reader(self._sock.fileno())
                self._loop.call_later(ACCEPT_PAUSE_SECONDS, self._resume)
                return
            conn.setblocking(False)
            task = self._loop.create_task(self._adopt(conn), name="accept-connection")
            self._adopting.add(task)
            task.add_done_callback(self._adopting.discard)

    def _resume(self) -> None:
        if self._serving:
            self._loop.add_reader(self._sock.fileno(), self._accept)

    async def _adopt(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)
        except OSError as exc:  # reset before it was adopted
            log.info("connection_lost_before_serving", error=str(exc))
            conn.close()

    def close(self) -> None:
        if not self._serving:
            return
        self._serving = False
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return self._serving

    async def start_serving(self) -> None:
        return  # serving since it was made

    async def serve_forever(self) -> None:
        raise NotImplementedError("aiohttp's runner serves this listener until it is closed")

    async def wait_closed(self) -> None:
        return


class _ProblemHandler(web_protocol.RequestHandler):
    """aiohttp answers a request it cannot even parse (a header over 8190 bytes, broken
    HTTP) itself, before any middleware, in plain text that echoes the offending bytes.
    This answers the same statuses as problem+json without echoing anything."""

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500 or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        kind = errors.HTTP_STATUS_KINDS.get(status, errors.BAD_REQUEST)
        detail = (
            "The request could not be read: a header or the request line is too long "
            "(at most 8190 bytes each), or it is not well-formed HTTP."
        )
        body = errors.problem_body(kind.code, status, kind.title, detail, None)
        response = web.Response(
            status=status, body=json.dumps(body).encode(), content_type=errors.PROBLEM_CONTENT_TYPE
        )
        response.force_close()
        return response


class _ProblemServer(web_server.Server):
    """aiohttp's server, making its connections' handlers `_ProblemHandler`s."""

    def __call__(self) -> web_protocol.RequestHandler:
        return _ProblemHandler(self, loop=self._loop, **self._kwargs)


def die_with_parent(parent_pid: int) -> None:
    """Get SIGTERM when the supervisor dies, even by SIGKILL (Linux), and exit if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:
        sys.exit(0)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def service_main(
    service: str,
    create_app: Callable[[Config], web.Application],
    argv: list[str] | None = None,
    *,
    uvloop: bool = True,
) -> int:
    """Parse the standard service flags, load the config and serve until told to stop.

    `uvloop=False` keeps asyncio's own event loop, for a service that needs what uvloop
    lacks (pfs: `loop.sendfile`).
    """
    parser = argparse.ArgumentParser(
        prog=f"python -m paddlecloud.{service}",
        description=f"Run the PaddleCloud {service} service on its own.",
    )
    parser.add_argument("--config", type=Path, help="paddlecloud.yaml (default: built-in defaults)")
    parser.add_argument("--host", help=f"override {service}.host")
    parser.add_argument("--port", type=int, help=f"override {service}.port (0 picks a free port)")
    parser.add_argument("--fd", type=int, help="serve on this inherited, listening socket")
    parser.add_argument("--ready-file", type=Path, help="write the bound address here once serving")
    parser.add_argument("--parent-pid", type=int, help="exit when this process (a supervisor) dies")
    args = parser.parse_args(argv)
    if args.parent_pid is not None:
        die_with_parent(args.parent_pid)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"paddlecloud {service}: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log.format, config.log.level, service=service)
    section = getattr(config, service)
    sock = socket.socket(fileno=args.fd) if args.fd is not None else None
    if sock is not None:
        # Inherited on purpose, and ours alone from here: uvloop's subprocesses keep every
        # inheritable descriptor, so a job's supervisor would hold this port after we die.
        sock.set_inheritable(False)
    try:
        app = create_app(config)
    except ConfigError as exc:
        print(f"paddlecloud {service}: {exc}", file=sys.stderr)
        return 2
    server = serve(
        app,
        host=args.host or section.host,
        port=section.port if args.port is None else args.port,
        sock=sock,
        ready_file=args.ready_file,
    )
    with asyncio.Runner(loop_factory=_loop_factory() if uvloop else None) as loop_runner:
        try:
            loop_runner.run(server)
        except ConfigError as exc:  # found while starting up: a backend's own settings
            print(f"paddlecloud {service}: {exc}", file=sys.stderr)
            return 2
    return 0


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed (Linux, macOS): the proxy path costs far less on it."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
