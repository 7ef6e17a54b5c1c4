"""`config show|use|add`: read and edit the client config without opening an editor."""

from __future__ import annotations

import argparse

from ..config import EXAMPLE_CONFIG, ClientConfig, ConfigError, ConfigMissing, Datacenter, save_config
from ..context import Context, UsageError
from ..flags import add_flag
from ..output import render_table
from . import CommandTree

ORDER = 80


async def show(ctx: Context, args: argparse.Namespace) -> int:
    config = ctx.config()
    # Passwords never reach the screen or a pipe.
    data = config.to_dict()
    for entry in data["datacenters"]:
        if "password" in entry:  # none after `logout`
            entry["password"] = "********"  # noqa: S105 - a mask, not a password
    try:
        current: str | None = config.select(ctx.datacenter_name).name
    except ConfigError:
        current = None  # listing the datacenters is how one finds out which to pick
    rows = [
        {
            "current": "*" if dc.name == current else "",
            "name": dc.name,
            "username": dc.username,
            "endpoint": dc.endpoint,
        }
        for dc in config.datacenters
    ]
    columns = [("CURRENT", "current"), ("NAME", "name"), ("USERNAME", "username"), ("ENDPOINT", "endpoint")]
    ctx.emit({"path": str(config.path), **data}, lambda: render_table(rows, columns))
    return 0


async def use(ctx: Context, args: argparse.Namespace) -> int:
    config = ctx.config().with_current(args.name)
    save_config(config)
    ctx.emit({"current-datacenter": args.name}, lambda: f"Now using datacenter {args.name}.")
    return 0


async def add(ctx: Context, args: argparse.Namespace) -> int:
    if not ctx.endpoint_override:
        raise UsageError("config add: --endpoint URL is required")
    if args.password_stdin:
        password = ctx.stdin.readline().rstrip("\r\n")
    elif args.password is not None:
        password = args.password
    else:
        raise UsageError("config add: give the password with --password-stdin (or --password)")
    if not password:
        raise UsageError("config add: the password is empty")
    try:
        config = ctx.config()
    except ConfigMissing:
        config = ClientConfig(path=ctx.config_path)
    datacenter = Datacenter(
        name=args.name, username=args.username, password=password, endpoint=ctx.endpoint_override
    )
    config = config.with_datacenter(datacenter, make_current=args.current)
    save_config(config)
    ctx.emit(
        {"path": str(config.path), "datacenter": args.name, "current-datacenter": config.current_datacenter},
        lambda: (
            f"Saved datacenter {args.name} in {config.path}"
            + (" and made it current." if config.current_datacenter == args.name else ".")
        ),
    )
    return 0


def register(tree: CommandTree) -> None:
    group = tree.group(
        "config",
        help="show or edit the client config (~/.paddle/config)",
        description=(
            "The client config is $PADDLE_CONFIG, else ~/.paddle/config, mode 0600. It looks like:\n\n"
            + "\n".join("  " + line for line in EXAMPLE_CONFIG.splitlines())
        ),
        epilog=(
            "examples:\n"
            "  paddlecloud config add dc1 --endpoint http://127.0.0.1:8080 \\\n"
            "      --username alice --password-stdin\n"
            "  paddlecloud config use dc1\n"
            "  paddlecloud config show\n"
        ),
    )
    group.command("show", show, help="list the datacenters (passwords hidden)", aliases=["view"])
    use_parser = group.command(
        "use",
        use,
        help="make a datacenter the current one",
        epilog="examples:\n  paddlecloud config use dc2\n",
    )
    use_parser.add_argument("name", metavar="NAME", help="a datacenter of the config")
    add_parser = group.command(
        "add",
        add,
        help="add or replace a datacenter, creating the file if needed",
        description=(
            "Add a datacenter to the client config, or replace the one of the same name, creating\n"
            "the file (mode 0600) if there is none. --endpoint URL says where its gateway is."
        ),
        epilog=(
            "examples:\n"
            "  paddlecloud config add dc1 --endpoint http://127.0.0.1:8080 \\\n"
            "      --username alice --password-stdin\n"
            "  paddlecloud config add dc2 --endpoint https://paddle.example.com --username alice \\\n"
            "      --password-stdin --current\n"
        ),
    )
    add_parser.add_argument("name", metavar="NAME", help="the datacenter's name")
    # The gateway's URL comes from the global --endpoint, which every command already accepts
    # (and validates); a second flag of the same name here would clash with it.
    add_flag(add_parser, "username", required=True, metavar="USER", help="who to log in as")
    secret = add_parser.add_mutually_exclusive_group()
    add_flag(secret, "password", metavar="P", help="the password (visible to other local users in ps)")
    add_flag(secret, "password-stdin", action="store_true", help="read the password from stdin's first line")
    add_flag(add_parser, "current", action="store_true", help="make it the current datacenter")
