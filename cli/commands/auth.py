"""`login`, `logout` and `whoami`: the credentials of the config turned into a cached token."""

from __future__ import annotations

import argparse

from ..context import Context
from . import CommandTree

ORDER = 10


async def login(ctx: Context, args: argparse.Namespace) -> int:
    datacenter = ctx.datacenter()
    client = ctx.client()
    answer = await client.login()
    # Not the server's answer as is: that holds the token, which has no business in a CI log.
    info = {
        "datacenter": datacenter.name,
        "endpoint": client.endpoint,
        "user": answer.user if "user" in answer else datacenter.username,
        "admin": answer.get("admin"),  # as the server said: None when it did not say
        "expires_at": answer.expires_at,
    }

    def text() -> str:
        role = " (admin)" if info["admin"] else ""
        expiry = f"; the token expires at {info['expires_at']}" if info["expires_at"] else ""
        return f"Logged in to {datacenter.name} ({client.endpoint}) as {info['user']}{role}{expiry}."

    ctx.emit(info, text)
    return 0


async def logout(ctx: Context, args: argparse.Namespace) -> int:
    datacenter = ctx.datacenter()
    revoked = await ctx.client().logout()
    info = {"datacenter": datacenter.name, "user": datacenter.username, "logged_out": revoked}
    ctx.emit(
        info,
        lambda: f"Logged out of {datacenter.name}." if revoked else f"Not logged in to {datacenter.name}.",
    )
    return 0


async def whoami(ctx: Context, args: argparse.Namespace) -> int:
    answer = await ctx.client().whoami()
    where = ctx.where()

    role = " (admin)" if answer.admin else ""
    expiry = f"; the token expires at {answer.expires_at}" if answer.expires_at else ""
    ctx.emit(answer, lambda: f"{answer.user}{role} on {where}{expiry}")
    return 0


def register(tree: CommandTree) -> None:
    tree.command(
        "login",
        login,
        help="log in with the config's credentials and cache the token",
        description=(
            "Log in to the selected datacenter with the username and password of the client\n"
            "config, cache the token (~/.paddle/tokens.json, mode 0600) and say who you are.\n"
            "Other commands log in by themselves when needed; this checks the credentials now."
        ),
        epilog="examples:\n  paddlecloud login\n  paddlecloud login --datacenter dc2\n",
    )
    tree.command(
        "logout",
        logout,
        help="revoke the cached token",
        description="Revoke the cached token on the server and remove it from the cache.",
        epilog="examples:\n  paddlecloud logout\n",
    )
    tree.command(
        "whoami",
        whoami,
        help="show the user and datacenter in use",
        epilog="examples:\n  paddlecloud whoami\n  paddlecloud whoami -o json\n",
    )
