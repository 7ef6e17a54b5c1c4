"""`passwd` (change your own password) and `users passwd` (an admin sets another user's)."""

from __future__ import annotations

import argparse
import getpass

from ..config import save_password
from ..context import Context, UsageError
from ..flags import add_flag
from . import CommandTree
from .users import _password

# After users.py, whose `users` group this adds a command to.
ORDER = 35


def _read_line(ctx: Context, what: str) -> str:
    line = ctx.stdin.readline()
    if not line:
        raise UsageError(f"stdin ended before the {what}; give the current and the new password, one a line")
    value = line.rstrip("\r\n")
    if not value:
        raise UsageError(f"stdin gave an empty {what}")
    return value


def _ask(ctx: Context, prompt: str) -> str:
    # getpass reads from the terminal with echo off; the prompt goes to stderr, so that
    # stdout stays the command's answer.
    try:
        return getpass.getpass(prompt, stream=ctx.stderr)
    except EOFError:
        raise UsageError("no password typed") from None


def _passwords(ctx: Context, args: argparse.Namespace) -> tuple[str, str]:
    """The current and the new password: typed at the terminal without echo (the new one
    twice), or, for scripts, the first two lines of stdin."""
    if args.password_stdin or not ctx.stdin.isatty():
        return _read_line(ctx, "current password"), _read_line(ctx, "new password")
    current = _ask(ctx, "Current password: ")
    if not current:
        raise UsageError("the current password is empty")
    new = _ask(ctx, "New password: ")
    if new != _ask(ctx, "New password again: "):
        raise UsageError("the two new passwords differ; nothing was changed")
    if not new:
        raise UsageError("the new password is empty")
    return current, new


async def change_password(ctx: Context, args: argparse.Namespace) -> int:
    current, new = _passwords(ctx, args)
    datacenter = ctx.datacenter()
    client = ctx.client()
    answer = await client.change_password(current, new)
    user = answer.user or datacenter.username
    # The config holds the password the CLI logs in with: the old one would now fail.
    saved = False
    config = ctx.config()
    entry = config.get(datacenter.name)
    if entry is not None and entry.username == user:
        save_password(config, entry, new)
        saved = True
    info = {
        "user": user,
        "datacenter": datacenter.name,
        "config_updated": saved,
        "other_sessions_ended": True,
    }

    said = f"Changed the password of {user} on {datacenter.name}; their other sessions have ended."
    said += f"\nThe new password is saved in {config.path}." if saved else ""
    ctx.emit(info, lambda: said)
    return 0


async def reset_password(ctx: Context, args: argparse.Namespace) -> int:
    password, generated = _password(ctx, args)
    await ctx.client().reset_password(args.name, password)
    data = {"name": args.name, "password": password} if generated else {"name": args.name}

    said = f"Set a new password for {args.name}; every session of {args.name} has ended."
    # A generated password exists nowhere else: scripts get it in the data, people on screen.
    said += f"\nPassword (shown only this once): {password}" if generated else ""
    ctx.emit(data, lambda: said)
    return 0


def register(tree: CommandTree) -> None:
    own = tree.command(
        "passwd",
        change_password,
        help="change your own password",
        description=(
            "Change your password on the selected datacenter. It asks for the current password and\n"
            "the new one twice, without echo; a script gives the current and the new password as\n"
            "the first two lines of stdin. Every other session of yours ends (the dashboard's and\n"
            "other machines' tokens), and the new password replaces the old one in the client config."
        ),
        epilog=(
            "examples:\n"
            "  paddlecloud passwd\n"
            '  printf \'%s\\n%s\\n\' "$OLD" "$NEW" | paddlecloud passwd --password-stdin\n'
        ),
    )
    add_flag(
        own,
        "password-stdin",
        action="store_true",
        help="read the current and the new password from stdin's first two lines",
    )

    users = tree.group("users")
    reset = users.command(
        "passwd",
        reset_password,
        help="set a user's password (a forgotten one)",
        description=(
            "Set another user's password, for one who forgot theirs; every session of theirs ends.\n"
            "Without --password or --password-stdin a strong password is generated and printed\n"
            "once: pass it on, it cannot be shown again. Change your own with `paddlecloud passwd`."
        ),
        epilog=(
            "examples:\n"
            "  paddlecloud users passwd bob\n"
            "  printf '%s\\n' \"$PASSWORD\" | paddlecloud users passwd bob --password-stdin\n"
        ),
        aliases=["reset-password"],
    )
    reset.add_argument("name", metavar="NAME", help="the user")
    secret = reset.add_mutually_exclusive_group()
    add_flag(secret, "password", metavar="P", help="the password (visible to other local users in ps)")
    add_flag(secret, "password-stdin", action="store_true", help="read the password from stdin's first line")
