"""The command groups: every module in this package registers its own subcommands, found by discovery.

A module here defines `register(tree: CommandTree) -> None` and, optionally, `ORDER` (an int,
default 50) to place its commands in `--help`. Adding a group means adding a module; nothing
else lists them.

A command's own parser is built only when the command is chosen (or its help asked for): what
its registration asks of the parser is kept as a list of calls (`flags.Deferred`) and replayed then.
argparse takes about a millisecond per parser and its arguments, and `--help` or `version`
would otherwise build some fifty of them on every run (docs/performance-history.md, "CLI
start-up"). Groups (`get`, `pfs`, `users`) are built at once: their commands live beneath them.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from ..context import Handler
from ..flags import ArgumentParser, Deferred, HelpFormatter

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


class LazySubParsers(argparse._SubParsersAction):
    """argparse's subcommands, with commands whose parsers are built on first use.

    `--help` lists a command from its name, aliases and one-line help, which `add_lazy` keeps
    as `add_parser` does; the parser itself is made when argparse dispatches to the command
    (`__call__`) or someone asks for it (`parser`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending: dict[str, tuple[str, dict[str, Any], Deferred]] = {}

    def add_lazy(self, name: str, *, help: str, aliases: Sequence[str], **kwargs: Any) -> Deferred:
        deferred = Deferred(lambda: self.parser(name))
        # The line `--help` shows, as add_parser makes it (the parser is then made without help).
        self._choices_actions.append(self._ChoicesPseudoAction(name, list(aliases), help))
        for spelling in (name, *aliases):
            if spelling in self._name_parser_map:
                raise argparse.ArgumentError(self, f"conflicting subparser: {spelling}")
            self._pending[spelling] = (name, {"aliases": list(aliases), **kwargs}, deferred)
            # A placeholder, so that argparse's own choice checks and messages see every name.
            self._name_parser_map[spelling] = None
        return deferred

    def parser(self, spelling: str) -> ArgumentParser:
        """The parser of the command named `spelling` (a name or an alias), built if need be."""
        pending = self._pending.get(spelling)
        if pending is not None:
            name, kwargs, deferred = pending
            order = list(self._name_parser_map)
            for alias in (name, *kwargs["aliases"]):
                del self._pending[alias]
                del self._name_parser_map[alias]
            made = self.add_parser(name, **kwargs)
            deferred.replay(made)
            # Back in registration order (`commands` lists them so); `choices` is this same map.
            parsers = dict(self._name_parser_map)
            self._name_parser_map.clear()
            self._name_parser_map.update((spelling, parsers[spelling]) for spelling in order)
        parser: ArgumentParser = self._name_parser_map[spelling]
        return parser

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        if values and values[0] in self._pending:
            self.parser(values[0])
        super().__call__(parser, namespace, values, option_string)


class CommandTree:
    """One level of subcommands; `group()` makes or finds a nested level, `command()` a leaf.

    `common` are the parsers whose options every command takes (the global options).
    """

    def __init__(
        self,
        subparsers: LazySubParsers,
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
        if first not in self._subparsers.choices:
            raise UnknownCommand(first, self.names)
        if rest:
            raise UnknownCommand(rest[0], [])  # a leaf has no commands beneath it
        return self._subparsers.parser(first)

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
    ) -> Deferred:
        """A leaf command running `handler`; add its own arguments to what is returned, as to a
        parser: they are added to the command's parser when it is built (see `Deferred`).

        `prepare_args` rewrites the command's arguments before they are parsed (see `ArgumentParser`).
        """
        parser = self._subparsers.add_lazy(
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
        subparsers = add_commands(parser)
        tree = CommandTree(subparsers, self._parents, parser)
        for spelling in (name, *aliases):
            self._groups[spelling] = tree
        return tree


def add_commands(parser: argparse.ArgumentParser) -> LazySubParsers:
    """The level of subcommands beneath `parser`, whose parsers are built when chosen."""
    subparsers = parser.add_subparsers(
        title="commands", metavar="COMMAND", dest="command", required=True, action=LazySubParsers
    )
    assert isinstance(subparsers, LazySubParsers)
    return subparsers


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
