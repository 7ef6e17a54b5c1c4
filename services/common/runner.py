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
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT)
    await runner.setup()
    assert runner.server is not None
    runner.server.__class__ = _ProblemServer  # see _ProblemHandler
    try:
        site: web.BaseSite
        if sock is not None:
            # asyncio listens again on a socket it is handed, with the site's backlog
            # (aiohttp's default, 128): the queue must be the one asked for here too.
            site = web.SockSite(runner, sock, backlog=LISTEN_BACKLOG)
        else:
            site = web.TCPSite(runner, host, port, reuse_address=True, backlog=LISTEN_BACKLOG)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
        log.info("service_started", host=bound_host, port=bound_port, pid=os.getpid())
        if ready_file is not None:
            _write_atomically(ready_file, json.dumps({"host": bound_host, "port": bound_port}))
        await stop.wait()
        log.info("service_stopping")
    finally:
        await runner.cleanup()


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
