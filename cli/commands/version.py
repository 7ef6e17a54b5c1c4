"""`version`: the client's version, and the server's when it can be reached."""

from __future__ import annotations

import argparse
from typing import Any

from .. import __version__
from ..context import Context
from ..errors import PaddleCloudError
from . import CommandTree

ORDER = 90


async def version(ctx: Context, args: argparse.Namespace) -> int:
    data: dict[str, Any] = {"client": {"version": __version__}, "server": None}
    try:
        client = ctx.client(anonymous_ok=True)
        server = data["server"] = await client.version()
        data["endpoint"] = client.endpoint
    except PaddleCloudError:
        # The client's own version is worth printing even when the server is out of reach;
        # the failure then gets its one line on stderr and its exit status from main().
        ctx.emit(data, lambda: f"Client: {__version__}")
        raise
    api = f" (API {server.api})" if server.api else ""
    ctx.emit(data, lambda: f"Client: {__version__}\nServer: {server.version}{api} at {ctx.where()}")
    return 0


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
