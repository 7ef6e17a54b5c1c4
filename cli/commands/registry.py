"""Registry credentials: `registry` saves them, `get registry` lists them, `delete registry` forgets them.

The original client's spelling: `paddlectl registry -username U -password P -server S -name N`.
A job names saved credentials with `submit -registry N`; the password never comes back.
"""

from __future__ import annotations

import argparse

from ..context import Context, UsageError
from ..flags import add_flag
from ..output import Column, render_table
from . import CommandTree

ORDER = 25

REGISTRY_COLUMNS: list[Column] = [
    ("NAME", "name"),
    ("SERVER", "server"),
    ("USERNAME", "username"),
    ("CREATED", "created_at"),
]


async def save_registry(ctx: Context, args: argparse.Namespace) -> int:
    password = args.password
    if args.password_stdin:
        if password is not None:
            raise UsageError("give -password or --password-stdin, not both")
        password = ctx.stdin.readline().rstrip("\r\n")
    missing = [
        flag
        for flag, value in (("-name", args.name), ("-server", args.server), ("-username", args.username))
        if not value
    ]
    if not password:
        missing.append("-password (or --password-stdin)")
    if missing:
        raise UsageError(
            f"registry needs {', '.join(missing)}: "
            f"{ctx.prog} registry -username U -password P -server S -name N"
        )
    saved = await ctx.client().save_registry(args.name, args.server, args.username, password)
    ctx.emit(
        saved,
        lambda: (
            f"Saved registry {args.name} ({args.server}, user {args.username}); "
            f"jobs use it with: {ctx.prog} submit -registry {args.name} ..."
        ),
    )
    return 0


async def list_registries(ctx: Context, args: argparse.Namespace) -> int:
    registries = await ctx.client().registries()
    empty = f"No registries saved ({ctx.prog} registry -username U -password P -server S -name N saves one)."
    ctx.emit({"registries": registries}, lambda: render_table(registries, REGISTRY_COLUMNS, empty=empty))
    return 0


async def delete_registry(ctx: Context, args: argparse.Namespace) -> int:
    for name in args.names:
        await ctx.client().delete_registry(name)
    ctx.emit({"deleted": args.names}, lambda: "\n".join(f"Deleted registry {name}." for name in args.names))
    return 0


def register(tree: CommandTree) -> None:
    save = tree.command(
        "registry",
        save_registry,
        help="save credentials for a container registry (-name N -server S -username U -password P)",
        description=(
            "Save your credentials for a container registry under a name; a job pulls its -image\n"
            "with them when it names them (submit -registry N). Saving a name again replaces it.\n"
            "The password is kept by the server for its Kubernetes backend and never shown again."
        ),
        epilog=(
            "examples:\n"
            "  paddlecloud registry -username alice -password secret -server r.example.com -name myreg\n"
            "  paddlecloud registry -username alice --password-stdin -server r.example.com -name myreg\n"
            "  paddlecloud get registry\n"
            "  paddlecloud delete registry myreg\n"
        ),
    )
    add_flag(save, "name", metavar="NAME", help="the name jobs use for these credentials")
    add_flag(save, "server", metavar="HOST", help="the registry, such as registry.example.com:5000")
    add_flag(save, "username", metavar="USER", help="your user name at the registry")
    add_flag(save, "password", metavar="PASSWORD", help="your password or token at the registry")
    add_flag(save, "password-stdin", action="store_true", help="read the password from stdin instead")

    tree.group("get").command(
        "registry",
        list_registries,
        aliases=["registries"],
        help="list your saved registry credentials (without passwords)",
        epilog="examples:\n  paddlecloud get registry\n  paddlecloud get registry -o json\n",
    )
    forget = tree.group("delete").command(
        "registry",
        delete_registry,
        aliases=["registries"],
        help="forget saved registry credentials",
        epilog="examples:\n  paddlecloud delete registry myreg\n",
    )
    forget.add_argument("names", nargs="+", metavar="NAME")
