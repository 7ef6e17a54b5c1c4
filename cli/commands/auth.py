"""`login`, `logout` and `whoami`: the credentials of the config turned into a cached token."""

from __future__ import annotations

import argparse
import getpass

from ..config import Datacenter, save_password
from ..context import Context, UsageError
from ..flags import add_flag
from . import CommandTree

ORDER = 10


async def login(ctx: Context, args: argparse.Namespace) -> int:
    datacenter = ctx.datacenter()
    password = _password(ctx, args, datacenter) if args.password_stdin or not datacenter.password else None
    if password is None:
        client = ctx.client()
        answer = await client.login()
    else:
        from ..client import AsyncClient

        slot = ctx.token_cache().slot(datacenter.name, datacenter.username, datacenter.endpoint)
        async with AsyncClient(
            datacenter.endpoint, datacenter.username, password, token_cache=slot, log=ctx.log
        ) as client:
            answer = await client.login()
        # Kept where `config add` keeps it, so that later commands log in again by themselves
        # when the token expires, until the next `logout`.
        config = ctx.config()
        entry = config.get(datacenter.name) or datacenter
        save_password(config, entry, password)
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


def _password(ctx: Context, args: argparse.Namespace, datacenter: Datacenter) -> str:
    """The password from stdin's first line (--password-stdin), else asked on the terminal."""
    if args.password_stdin:
        password = ctx.stdin.readline().rstrip("\r\n")
    elif ctx.stdin.isatty():
        password = getpass.getpass(f"Password for {datacenter.username} at {datacenter.endpoint}: ")
    else:
        raise UsageError(
            f"login: the config holds no password for {datacenter.name} (logged out); "
            "give it with --password-stdin"
        )
    if not password:
        raise UsageError("login: the password is empty")
    return password


async def logout(ctx: Context, args: argparse.Namespace) -> int:
    datacenter = ctx.datacenter()
    revoked = await ctx.client().logout()
    # The password goes too: kept, it would log the next command in again without a word.
    config = ctx.config()
    entry = config.get(datacenter.name)
    forgot = entry is not None and bool(entry.password)
    if entry is not None and forgot:
        save_password(config, entry, "")
    info = {
        "datacenter": datacenter.name,
        "user": datacenter.username,
        "logged_out": revoked or forgot,
        "token_revoked": revoked,
        "password_removed": forgot,
    }

    def text() -> str:
        if not (revoked or forgot):
            return f"Not logged in to {datacenter.name}."
        removed = f"; the password is removed from {config.path}" if forgot else ""
        return f"Logged out of {datacenter.name}{removed}. Run {ctx.prog} login to log in again."

    ctx.emit(info, text)
    return 0


async def whoami(ctx: Context, args: argparse.Namespace) -> int:
    answer = await ctx.client().whoami()
    where = ctx.where()

    role = " (admin)" if answer.admin else ""
    expiry = f"; the token expires at {answer.expires_at}" if answer.expires_at else ""
    ctx.emit(answer, lambda: f"{answer.user}{role} on {where}{expiry}")
    return 0


def register(tree: CommandTree) -> None:
    login_parser = tree.command(
        "login",
        login,
        help="log in with the config's credentials and cache the token",
        description=(
            "Log in to the selected datacenter with the username and password of the client\n"
            "config, cache the token (~/.paddle/tokens.json, mode 0600) and say who you are.\n"
            "Other commands log in by themselves when needed; this checks the credentials now.\n"
            "After logout the config holds no password: login asks for it (on a terminal, or\n"
            "--password-stdin) and keeps it in the config again."
        ),
        epilog=(
            "examples:\n  paddlecloud login\n  paddlecloud login --datacenter dc2\n"
            "  printf '%s\\n' \"$PASSWORD\" | paddlecloud login --password-stdin\n"
        ),
    )
    add_flag(
        login_parser, "password-stdin", action="store_true", help="read the password from stdin's first line"
    )
    tree.command(
        "logout",
        logout,
        help="revoke the token and remove the password from the config",
        description=(
            "Revoke the cached token on the server, remove it from the cache, and remove the\n"
            "datacenter's password from the client config, so that the next command needs\n"
            "`paddlecloud login` (which asks for the password)."
        ),
        epilog="examples:\n  paddlecloud logout\n",
    )
    tree.command(
        "whoami",
        whoami,
        help="show the user and datacenter in use",
        epilog="examples:\n  paddlecloud whoami\n  paddlecloud whoami -o json\n",
    )
