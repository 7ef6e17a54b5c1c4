"""`version`: the client's version, and the server's when it can be reached."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Awaitable, Mapping
from typing import Any
from urllib.parse import urlsplit

from .. import __version__
from ..config import DEFAULT_TIMEOUT
from ..context import Context
from ..errors import ConnectionProblem, PaddleCloudError
from . import CommandTree

ORDER = 90
VERSION_PATH = "/api/v1/version"
# Far more than a version answer; a server that sends more is not a PaddleCloud gateway.
MAX_ANSWER = 64 * 1024


def version(ctx: Context, args: argparse.Namespace) -> int | Awaitable[int]:
    """Asks with the standard library, and answers at once when the server answers plainly;
    anything else is asked again through the client (a coroutine for main's event loop), which
    says what went wrong as every other command does, and logs in should a server insist."""
    data: dict[str, Any] = {"client": {"version": __version__}, "server": None}
    try:
        endpoint = ctx.endpoint()
        server = _ask(endpoint, ctx)
    except PaddleCloudError:
        _client_only(ctx, data)
        raise
    if server is None:
        return _through_client(ctx, data)
    return _show(ctx, data, server, endpoint)


async def _through_client(ctx: Context, data: dict[str, Any]) -> int:
    try:
        client = ctx.client(anonymous_ok=True)
        server = await client.version()
    except PaddleCloudError:
        _client_only(ctx, data)
        raise
    return _show(ctx, data, server, client.endpoint)


def _client_only(ctx: Context, data: dict[str, Any]) -> None:
    # The client's own version is worth printing even when the server is out of reach; the
    # failure then gets its one line on stderr and its exit status from main().
    ctx.emit(data, lambda: f"Client: {__version__}")


def _show(ctx: Context, data: dict[str, Any], server: Mapping[str, Any], endpoint: str) -> int:
    # A map either way (the client's `Version` is one too): the answer types cost start-up time.
    data["server"] = server
    data["endpoint"] = endpoint
    api = f" (API {server['api']})" if server.get("api") else ""
    ctx.emit(data, lambda: f"Client: {__version__}\nServer: {server.get('version')}{api} at {ctx.where()}")
    return 0


def _ask(endpoint: str, ctx: Context) -> dict[str, Any] | None:
    """The server's version through the standard library's HTTP client, or None where it did
    not answer plainly (refused, TLS, an error status, not JSON).

    `version` is what scripts and health checks run in loops, and the server's version needs no
    login: importing aiohttp, which builds TLS contexts at import, would cost more than the rest
    of the command (docs/performance-history.md, "CLI start-up").
    """
    import http.client

    url = urlsplit(endpoint)
    if url.scheme not in ("http", "https") or not url.hostname:
        return None
    connection: http.client.HTTPConnection
    try:
        if url.scheme == "https":
            import ssl

            connection = http.client.HTTPSConnection(
                url.hostname, url.port, timeout=DEFAULT_TIMEOUT, context=ssl.create_default_context()
            )
        else:
            connection = http.client.HTTPConnection(url.hostname, url.port, timeout=DEFAULT_TIMEOUT)
    except ValueError:  # a port out of range: the client words it
        return None
    request_id = os.urandom(16).hex()  # as the client's uuid4().hex; `secrets` costs start-up time
    headers = {"X-Request-ID": request_id, "User-Agent": f"paddlecloud/{__version__}"}
    try:
        connection.request("GET", url.path.rstrip("/") + VERSION_PATH, headers=headers)
        response = connection.getresponse()
        body = response.read(MAX_ANSWER)
    except TimeoutError:
        # Asking again would only wait as long a second time.
        raise ConnectionProblem(endpoint, f"no answer within {DEFAULT_TIMEOUT:g}s") from None
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()
    request_id = response.getheader("X-Request-ID") or request_id
    ctx.log(f"GET {endpoint}{VERSION_PATH} -> {response.status} (request id {request_id})")
    if response.status != 200:
        return None
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def register(tree: CommandTree) -> None:
    tree.command(
        "version",
        version,
        help="show the client's and the server's versions",
        description=(
            "Show the client's version and the server's (GET /api/v1/version). If the server\n"
            "cannot be reached, the client's version is still printed and the exit status is 3."
        ),
        epilog=(
            "examples:\n"
            "  paddlecloud version\n"
            "  paddlecloud version -o json\n"
            "  paddlecloud --endpoint http://127.0.0.1:8080 version   # no config needed\n"
        ),
    )
