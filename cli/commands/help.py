"""`help [COMMAND]`, `commands` and `flags`: the help screen's own commands, as the original client had them.

The original Go client (google/subcommands) listed `commands` (every command's name),
`flags` (the flags every command takes) and `help <command>` (one command's usage) on its
help screen; users who learnt it type them.
"""

from __future__ import annotations

import argparse

from ..context import Context, UsageError
from ..flags import ArgumentParser, did_you_mean
from . import CommandTree, UnknownCommand

ORDER = 99


def _unknown(ctx: Context, command: str, exc: UnknownCommand) -> UsageError:
    hint = did_you_mean(exc.word, exc.choices)
    return UsageError(f"{command}: no command {exc.word!r}{hint} (`{ctx.prog} commands` lists them)")


async def help_command(ctx: Context, args: argparse.Namespace) -> int:
    tree: CommandTree = args.tree
    try:
        parser = tree.find(args.words)
    except UnknownCommand as exc:
        raise _unknown(ctx, "help", exc) from None
    ctx.out(parser.format_help())
    return 0


async def commands(ctx: Context, args: argparse.Namespace) -> int:
    tree: CommandTree = args.tree
    try:
        level = tree.level(args.words)
    except UnknownCommand as exc:
        raise _unknown(ctx, "commands", exc) from None
    ctx.emit({"commands": level.names}, lambda: "\n".join(level.names))
    return 0


async def flags(ctx: Context, args: argparse.Namespace) -> int:
    tree: CommandTree = args.tree
    if args.words:
        try:
            ctx.out(tree.find(args.words).format_help())
        except UnknownCommand as exc:
            raise _unknown(ctx, "flags", exc) from None
        return 0
    shown = ArgumentParser(
        prog=tree.parser.prog,
        usage="%(prog)s [FLAGS] COMMAND ...",
        description=(
            "The flags every command takes, before or after it. Each is spelled Go style, as the\n"
            "original docs write them (-datacenter dc2), or GNU style (--datacenter dc2)."
        ),
        epilog="Each command's own flags: paddlecloud help COMMAND (or paddlecloud COMMAND --help).",
        parents=tree.common,
    )
    ctx.out(shown.format_help())
    return 0


def register(tree: CommandTree) -> None:
    shown = tree.command(
        "help",
        help_command,
        help="describe a command and its syntax (help COMMAND), or all of them",
        epilog="examples:\n  paddlecloud help\n  paddlecloud help submit\n  paddlecloud help get jobs\n",
    )
    shown.add_argument("words", nargs="*", metavar="COMMAND", help="a command, such as submit or get jobs")
    listed = tree.command(
        "commands",
        commands,
        help="list every command's name, one a line",
        epilog="examples:\n  paddlecloud commands\n  paddlecloud commands get\n",
    )
    listed.add_argument("words", nargs="*", metavar="GROUP", help="a group's commands instead (get, pfs)")
    described = tree.command(
        "flags",
        flags,
        help="describe the flags every command takes (flags COMMAND: that command's)",
        epilog="examples:\n  paddlecloud flags\n  paddlecloud flags submit\n",
    )
    described.add_argument("words", nargs="*", metavar="COMMAND", help="a command whose flags to describe")
    for parser in (shown, listed, described):
        parser.set_defaults(tree=tree)
