"""Command-line parsing helpers: one flag answers to Go style (`-jobname`) and GNU style (`--job-name`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps epilogs' examples as written, and names a flag's value once (`-cpu, --cpu CPU`)."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not action.option_strings or action.nargs == 0:
            return super()._format_action_invocation(action)
        value = self._format_args(action, self._get_default_metavar_for_optional(action))
        return f"{', '.join(action.option_strings)} {value}"


class ArgumentParser(argparse.ArgumentParser):
    """argparse with prefix matching off (`--job` must not mean `--jobname`) and our help layout.

    `prepare_args` rewrites the arguments this parser is given before it parses them: for a
    flag whose meaning depends on its value, which argparse cannot express (`submit --output`).
    """

    def __init__(
        self, *args: Any, prepare_args: Callable[[list[str]], list[str]] | None = None, **kwargs: Any
    ) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.prepare_args = prepare_args

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if args is not None and self.prepare_args is not None:
            args = self.prepare_args(list(args))
        return super().parse_known_args(args, namespace)

    def _get_option_tuples(self, option_string: str) -> list[Any]:
        tuples: list[Any] = super()._get_option_tuples(option_string)
        if self.allow_abbrev:
            return tuples
        # Python 3.11 still expands single-dash prefixes with allow_abbrev off (`-job` would mean
        # `-jobname`, `-p` any of `-pservers`/`-passes`). Keep only a real short option with its
        # value attached (`-ojson`); each tuple's second item is the option string it matched.
        return [found for found in tuples if found[1] == option_string[:2]]


def flag_names(name: str, *aliases: str, short: str | None = None) -> list[str]:
    """Every spelling of a flag: `-name` and `--name` for Go-style names, `--alias` for the rest.

    The original PaddleCloud client was written in Go, whose flag package treats `-jobname` and
    `--jobname` alike; its docs use the single dash. Names with a hyphen are GNU spellings
    (`job-name`) and get the double dash only.
    """
    names = [short] if short else []
    for spelling in (name, *aliases):
        if len(spelling) == 1:
            names.append(f"-{spelling}")
            continue
        if "-" not in spelling:
            names.append(f"-{spelling}")
        names.append(f"--{spelling}")
    return list(dict.fromkeys(names))


def add_flag(
    parser: argparse._ActionsContainer,
    name: str,
    *aliases: str,
    short: str | None = None,
    **kwargs: Any,
) -> argparse.Action:
    """Register one option under all its spellings; the value lands in `name` (hyphens as `_`).

    `add_flag(p, "jobname", "job-name")` accepts `-jobname x`, `--jobname x`, `--job-name x` and the
    `=x` forms of each. Keyword arguments go to `add_argument` unchanged.
    """
    kwargs.setdefault("dest", name.replace("-", "_"))
    if kwargs.get("action") not in ("store_true", "store_false", "count", "help", "version"):
        kwargs.setdefault("metavar", name.upper().replace("-", "_"))
    return parser.add_argument(*flag_names(name, *aliases, short=short), **kwargs)
