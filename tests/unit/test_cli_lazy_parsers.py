"""Commands' parsers built only when chosen: `--help` still lists them all, each still parses
and describes itself as before, and a run builds only the parser of the command it runs."""

from __future__ import annotations

import argparse

import pytest

from paddlecloud.commands import LazySubParsers
from paddlecloud.flags import ArgumentParser, Deferred, add_flag
from paddlecloud.main import build_parser


def _arguments(parser: ArgumentParser | Deferred) -> None:
    """The same registration, run on a real parser or on a Deferred."""
    parser.add_argument("path", metavar="PATH")
    job = parser.add_argument_group("the job")
    add_flag(job, "jobname", "job-name", help="its name")
    either = job.add_mutually_exclusive_group()
    add_flag(either, "quiet", short="-q", action="store_true")
    add_flag(either, "verbose", short="-v", action="store_true")
    parser.set_defaults(kind="x")


def test_a_deferred_replays_every_call_in_order_groups_included() -> None:
    direct = ArgumentParser(prog="t")
    _arguments(direct)
    deferred = Deferred()
    _arguments(deferred)
    replayed = ArgumentParser(prog="t")
    deferred.replay(replayed)
    assert replayed.format_help() == direct.format_help()
    args = replayed.parse_args(["p", "--job-name", "j", "-q"])
    assert (args.path, args.jobname, args.quiet, args.kind) == ("p", "j", True, "x")
    with pytest.raises(SystemExit):
        replayed.parse_args(["p", "-q", "-v"])  # the exclusive group came through


def _levels(parser: argparse.ArgumentParser) -> list[LazySubParsers]:
    """Every level of commands beneath `parser` whose parser is built, `parser`'s own first."""
    found: list[LazySubParsers] = []
    for action in parser._actions:
        if isinstance(action, LazySubParsers):
            found.append(action)
            for sub in {id(p): p for p in action.choices.values() if p is not None}.values():
                found.extend(_levels(sub))
    return found


def _built(parser: argparse.ArgumentParser) -> set[str]:
    return {p.prog for level in _levels(parser) for p in level.choices.values() if p is not None}


def test_help_lists_every_command_without_building_one() -> None:
    parser = build_parser()
    leaves = _built(parser)
    top = _levels(parser)[0]
    listed = {action.dest for action in top._get_subactions()}
    assert {"submit", "logs", "version", "server", "help"} <= listed
    # Only the groups (get, pfs, users, ...) are built; their commands wait beneath them.
    assert "paddlecloud get" in leaves and "paddlecloud submit" not in leaves
    assert not any(prog.startswith("paddlecloud get ") for prog in leaves)


@pytest.mark.parametrize(
    ("argv", "prog"),
    [(["submit", "./pkg"], "paddlecloud submit"), (["get", "jobs"], "paddlecloud get jobs")],
)
def test_running_a_command_builds_its_parser_alone(argv: list[str], prog: str) -> None:
    parser = build_parser()
    before = _built(parser)
    args = parser.parse_args(argv)
    assert callable(args.handler)
    assert _built(parser) - before == {prog}


def test_an_alias_builds_the_command_once_under_every_name() -> None:
    parser = build_parser()
    parser.parse_args(["train", "./pkg"])
    top = _levels(parser)[0]
    assert top.choices["train"] is top.choices["submit"] is not None
    assert list(top.choices).index("submit") < list(top.choices).index("version")  # order kept
