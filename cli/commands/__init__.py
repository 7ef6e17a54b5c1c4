"""The command groups: every module in this package registers its own subcommands, found by discovery.

A module here defines `register(tree: CommandTree) -> None` and, optionally, `ORDER` (an int,
default 50) to place its commands in `--help`. Adding a group means adding a module; nothing
else lists them.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from collections.abc import Callable, Sequence
from types import ModuleType

from ..context import Handler
from ..flags import ArgumentParser, HelpFormatter

DEFAULT_ORDER = 50

# Verbs that several modules share: `get users` comes from users.py, `get jobs` from another
# module. Whichever registers first creates the group with this help.
SHARED_GROUPS = {
    "get": "show resources (get users, ...)",
    "delete": "delete resources",
}


class CommandTree:
    """One level of subcommands; `group()` makes or finds a nested level, `command()` a leaf."""

    def __init__(
        self,
        subparsers: argparse._SubParsersAction[ArgumentParser],
        parents: Sequence[ArgumentParser],
        parser: argparse.ArgumentParser,
    ) -> None:
        self.parser = parser
        self._subparsers = subparsers
        self._parents = list(parents)
        self._groups: dict[str, CommandTree] = {}

    def command(
        self,
        name: str,
        handler: Handler,
        *,
        help: str,
        description: str | None = None,
        epilog: str | None = None,
        aliases: Sequence[str] = (),
        prepare_args: Callable[[list[str]], list[str]] | None = None,
    ) -> ArgumentParser:
        """A leaf command running `handler`; add its own arguments to the parser returned.

        `prepare_args` rewrites the command's arguments before they are parsed (see `ArgumentParser`).
        """
        parser = self._subparsers.add_parser(
            name,
            help=help,
            description=description or _sentence(help),
            epilog=epilog,
            aliases=list(aliases),
            parents=self._parents,
            formatter_class=HelpFormatter,
            allow_abbrev=False,
            prepare_args=prepare_args,
        )
        parser.set_defaults(handler=handler)
        return parser

    def group(
        self,
        name: str,
        *,
        help: str | None = None,
        description: str | None = None,
        epilog: str | None = None,
        aliases: Sequence[str] = (),
    ) -> CommandTree:
        """The nested level `name` (`users`, `get`, `pfs`), made on first call, shared after."""
        if name in self._groups:
            return self._groups[name]
        help = help or SHARED_GROUPS.get(name) or name
        parser = self._subparsers.add_parser(
            name,
            help=help,
            description=description or _sentence(help),
            epilog=epilog,
            aliases=list(aliases),
            parents=self._parents,
            formatter_class=HelpFormatter,
            allow_abbrev=False,
        )
        subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", dest="command", required=True)
        tree = CommandTree(subparsers, self._parents, parser)
        for spelling in (name, *aliases):
            self._groups[spelling] = tree
        return tree


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def command_modules() -> list[ModuleType]:
    """Every command module of this package, in `--help` order."""
    modules = [
        importlib.import_module(f"{__name__}.{info.name}")
        for info in pkgutil.iter_modules(__path__)
        if not info.name.startswith("_")
    ]
    modules.sort(key=lambda module: (getattr(module, "ORDER", DEFAULT_ORDER), module.__name__))
    return modules


def register_all(tree: CommandTree) -> None:
    for module in command_modules():
        module.register(tree)
