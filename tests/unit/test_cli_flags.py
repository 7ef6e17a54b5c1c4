"""Command-line flags: Go and GNU spellings of one flag, no abbreviations, global options anywhere."""

from __future__ import annotations

import argparse

import pytest

from paddlecloud.flags import ArgumentParser, add_flag
from paddlecloud.main import build_parser


def throwaway_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="t")
    add_flag(parser, "jobname", "job-name")
    add_flag(parser, "parallelism", "trainers", type=int)
    add_flag(parser, "output", short="-o")
    add_flag(parser, "rm", action="store_true")
    return parser


@pytest.mark.parametrize(
    "argv",
    [
        ["-jobname", "x", "-parallelism", "4"],
        ["--jobname", "x", "--parallelism", "4"],
        ["--job-name", "x", "--trainers", "4"],
        ["-jobname=x", "-trainers=4"],
        ["--job-name=x", "--parallelism=4"],
    ],
)
def test_go_and_gnu_spellings_of_a_flag_are_the_same_flag(argv: list[str]) -> None:
    args = throwaway_parser().parse_args(argv)
    assert (args.jobname, args.parallelism) == ("x", 4)


def test_booleans_and_short_options_keep_working() -> None:
    parser = throwaway_parser()
    assert parser.parse_args(["-rm"]).rm is True
    assert parser.parse_args(["--rm"]).rm is True
    assert parser.parse_args(["-ojson"]).output == "json"
    assert parser.parse_args(["-output", "yaml"]).output == "yaml"


@pytest.mark.parametrize("argv", [["--job", "x"], ["-job", "x"], ["-para", "2"], ["--train", "2"]])
def test_abbreviations_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        throwaway_parser().parse_args(argv)
    assert caught.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_help_names_the_value_once_per_flag() -> None:
    text = throwaway_parser().format_help()
    assert "-jobname, --jobname, --job-name JOBNAME" in text
    assert "-parallelism, --parallelism, -trainers, --trainers PARALLELISM" in text


@pytest.mark.parametrize("spelling", ["-cpu", "--cpu"])
def test_users_quota_takes_both_spellings(spelling: str) -> None:
    args = build_parser().parse_args(
        ["users", "quota", "bob", spelling, "2", "-gpu", "unlimited", "--jobs=3"]
    )
    assert (args.name, args.cpu, args.gpu, args.jobs) == ("bob", "2", None, 3)
    assert not hasattr(args, "memory")  # not given, so not changed


def test_global_options_go_before_or_after_the_command() -> None:
    parser = build_parser()
    before = parser.parse_args(["-o", "json", "--datacenter", "dc2", "users", "list"])
    after = parser.parse_args(["users", "list", "-o", "json", "-datacenter", "dc2"])
    plain = parser.parse_args(["users", "list"])
    assert (before.output, before.datacenter) == (after.output, after.datacenter) == ("json", "dc2")
    assert (plain.output, plain.datacenter, plain.debug) == ("table", None, False)


def test_every_command_group_is_discovered() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {"login", "logout", "whoami", "version", "users", "get", "config"} <= set(commands.choices)
