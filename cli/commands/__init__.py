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


class UnknownCommand(LookupError):
    """`find` met a word that names no command at its level; `choices` are the names there."""

    def __init__(self, word: str, choices: Sequence[str]) -> None:
        super().__init__(word)
        self.word = word
        self.choices = list(choices)


class CommandTree:
    """One level of subcommands; `group()` makes or finds a nested level, `command()` a leaf.

    `common` are the parsers whose options every command takes (the global options).
    """

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

    @property
    def common(self) -> list[ArgumentParser]:
        return list(self._parents)

    @property
    def names(self) -> list[str]:
        """The commands of this level, aliases beside the names, in `--help` order."""
        return list(self._subparsers.choices)

    def find(self, words: Sequence[str]) -> argparse.ArgumentParser:
        """The parser of the command `words` names (`["get", "jobs"]`); `[]` is this level's own.

        `UnknownCommand` for a word that names nothing where it stands.
        """
        if not words:
            return self.parser
        first, rest = words[0], words[1:]
        if first in self._groups:
            return self._groups[first].find(rest)
        parser = self._subparsers.choices.get(first)
        if parser is None:
            raise UnknownCommand(first, self.names)
        if rest:
            raise UnknownCommand(rest[0], [])  # a leaf has no commands beneath it
        return parser

    def level(self, words: Sequence[str]) -> CommandTree:
        """The nested level `words` names (`["get"]`); `UnknownCommand` if it is not a group."""
        tree = self
        for word in words:
            if word not in tree._groups:
                raise UnknownCommand(word, list(tree._groups))
            tree = tree._groups[word]
        return tree

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
        prepare_args: Callable[[list[str]], list[str]] | None = None,
    ) -> CommandTree:
        """The nested level `name` (`users`, `get`, `pfs`), made on first call, shared after.

        `prepare_args` rewrites the level's arguments before they are parsed (see `ArgumentParser`).
        """
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
            prepare_args=prepare_args,
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
