"""Command-line parsing helpers: one flag answers to Go style (`-jobname`) and GNU style (`--job-name`)."""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn

# The name help texts are written with; shown as the name the program was run as.
WRITTEN_AS = "paddlecloud"
# "paddlecloud " as a command word: not in `.paddlecloudignore`, `~/.paddlecloud` or `paddlecloud.yaml`.
_COMMAND_WORD = re.compile(rf"(?<![\w.~/-]){WRITTEN_AS}(?= )")


def as_program(text: str, prog: str) -> str:
    """`text` with its example command lines naming `prog` (`paddlectl`) instead of `paddlecloud`."""
    name = prog.split()[0] if prog.strip() else WRITTEN_AS
    return text if name == WRITTEN_AS else _COMMAND_WORD.sub(name, text)


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice most like `word`, if one is alike enough to be what was meant."""
    close = difflib.get_close_matches(word, sorted(set(choices)), n=1, cutoff=0.7)
    return close[0] if close else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`; did you mean X?` for the choice closest to `word`, or '' when none is close."""
    found = closest(word, choices)
    return f"; did you mean {found}?" if found else ""


def closest_flag(typed: str, spellings: Iterable[str]) -> str | None:
    """The flag most like `typed`, compared without dashes (`--bogus` is not `--jobs` for
    sharing them), in the dash style typed where the flag has it."""
    by_name: dict[str, list[str]] = {}
    for spelling in spellings:
        by_name.setdefault(spelling.lstrip("-"), []).append(spelling)
    name = closest(typed.lstrip("-"), by_name)
    if name is None:
        return None
    dashes = typed[: len(typed) - len(typed.lstrip("-"))]
    return next((s for s in by_name[name] if s == dashes + name), by_name[name][0])


# What Go's strconv.ParseBool takes, which the original client's boolean flags went through.
GO_BOOLEANS = {"1": True, "t": True, "true": True, "0": False, "f": False, "false": False}


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

    A mistake is reported by the parser of the command it was made in, with that command's
    usage and the closest spelling (`paddlectl submit: error: unrecognized arguments:
    --jobnme; did you mean --jobname?`). Plain argparse hands a subcommand's unknown flags up
    to the top level, which then shows the top level's usage. Help texts name the program as
    it was run (`paddlectl` or `paddlecloud`).
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
        if args is not None:
            args = self._go_booleans(list(args))
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(self._unrecognized(extras))
        return parsed, extras

    def _go_booleans(self, args: list[str]) -> list[str]:
        """`-flag=true` and `-flag=false` for this parser's on/off flags, as Go's flag package
        takes them (`--use-gpu=true`); argparse itself refuses any value for such a flag."""
        out: list[str] = []
        for position, arg in enumerate(args):
            if arg == "--":
                return out + args[position:]
            flag, eq, value = arg.partition("=")
            action = self._option_string_actions.get(flag) if eq and flag.startswith("-") else None
            if action is None or action.nargs != 0 or not isinstance(action.const, bool):
                out.append(arg)
                continue
            truth = GO_BOOLEANS.get(value.lower())
            if truth is None:
                self.error(f"{flag}={value}: expected true or false")
            if truth == action.const:
                out.append(flag)
            # The other value is the flag's default: as if it had not been given.
        return out

    def _unrecognized(self, extras: Sequence[str]) -> str:
        message = f"unrecognized arguments: {' '.join(extras)}"
        for extra in extras:
            if extra.startswith("-") and extra != "--":
                found = closest_flag(extra.split("=", 1)[0], self._option_string_actions)
                return message + (f"; did you mean {found}?" if found else "")
        return message

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # A command's name (or a flag's value) not among the choices: name the closest one.
        if action.choices is not None and value not in action.choices:
            choices = ", ".join(map(repr, action.choices))
            hint = did_you_mean(str(value), map(str, action.choices))
            raise argparse.ArgumentError(action, f"invalid choice: {value!r} (choose from {choices}){hint}")
        super()._check_value(action, value)

    def format_help(self) -> str:
        return as_program(super().format_help(), self.prog)

    def error(self, message: str) -> NoReturn:
        super().error(as_program(message, self.prog))

    def _get_option_tuples(self, option_string: str) -> list[Any]:
        tuples: list[Any] = super()._get_option_tuples(option_string)
        if self.allow_abbrev:
            return tuples
        # Python 3.11 still expands single-dash prefixes with allow_abbrev off (`-job` would mean
        # `-jobname`, `-p` any of `-pservers`/`-passes`). Keep only a real short option with its
        # value attached (`-ojson`), or short flags run together (`-rq`); a misspelt Go-style
        # flag (`-recursiv`) is then unknown, and gets its "did you mean", rather than being
        # read as `-r` with a stray `ecursiv`. A tuple is (action, option string, ..., attached).
        if self._misspelt_long_flag(option_string):
            return []  # unknown, so reported with its "did you mean"
        return [
            found
            for found in tuples
            if found[1] == option_string[:2] and (found[0].nargs != 0 or self._all_flags(found[-1]))
        ]

    def _misspelt_long_flag(self, option_string: str) -> bool:
        """Whether `-parallelsim` (or `-memroy=1Gi`) is a Go-style long flag misspelt, not
        the short `-p` with `arallelsim` attached: a word close to one of this parser's long
        flags. A real attached value (`-p4`, `-m10Gi`, `-ojson`) is close to none."""
        if option_string.startswith("--") or len(option_string) < 4:
            return False
        typed = option_string.split("=", 1)[0]
        longs = [s for s in self._option_string_actions if len(s.lstrip("-")) > 1]
        return closest_flag(typed, longs) is not None

    def _all_flags(self, attached: str | None) -> bool:
        """Whether what follows a short flag is more short flags (`-rq`, `-rj8`), as argparse reads it."""
        for char in attached or "":
            action = self._option_string_actions.get(f"-{char}")
            if action is None:
                return False
            if action.nargs != 0:
                return True  # the rest is this flag's value
        return True


class Deferred:
    """The calls a command's registration makes on its parser (`add_argument`,
    `add_argument_group`, `add_mutually_exclusive_group`, `set_defaults`), kept in order to be
    replayed on the real parser when the command is chosen. `built()` is that parser, built now
    if need be (for code that reads a parser's options, such as a group's `prepare_args`)."""

    def __init__(self, build: Callable[[], ArgumentParser] | None = None) -> None:
        self._calls: list[tuple[str, tuple[Any, ...], dict[str, Any], Deferred | None]] = []
        self._build = build

    def add_argument(self, *args: Any, **kwargs: Any) -> None:
        self._calls.append(("add_argument", args, kwargs, None))

    def add_argument_group(self, *args: Any, **kwargs: Any) -> Deferred:
        return self._nested("add_argument_group", args, kwargs)

    def add_mutually_exclusive_group(self, *args: Any, **kwargs: Any) -> Deferred:
        return self._nested("add_mutually_exclusive_group", args, kwargs)

    def set_defaults(self, **kwargs: Any) -> None:
        self._calls.append(("set_defaults", (), kwargs, None))

    def built(self) -> ArgumentParser:
        if self._build is None:
            raise TypeError("only a command's own Deferred builds a parser, not one of its groups")
        return self._build()

    def replay(self, target: Any) -> None:
        """Make every kept call on `target` (a parser, or the group a kept call made)."""
        for method, args, kwargs, nested in self._calls:
            made = getattr(target, method)(*args, **kwargs)
            if nested is not None:
                nested.replay(made)

    def _nested(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Deferred:
        nested = Deferred()
        self._calls.append((method, args, kwargs, nested))
        return nested


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
    parser: argparse._ActionsContainer | Deferred,
    name: str,
    *aliases: str,
    short: str | None = None,
    **kwargs: Any,
) -> None:
    """Register one option under all its spellings; the value lands in `name` (hyphens as `_`).

    `add_flag(p, "jobname", "job-name")` accepts `-jobname x`, `--jobname x`, `--job-name x` and the
    `=x` forms of each. Keyword arguments go to `add_argument` unchanged.
    """
    kwargs.setdefault("dest", name.replace("-", "_"))
    if kwargs.get("action") not in ("store_true", "store_false", "count", "help", "version"):
        kwargs.setdefault("metavar", name.upper().replace("-", "_"))
    parser.add_argument(*flag_names(name, *aliases, short=short), **kwargs)
