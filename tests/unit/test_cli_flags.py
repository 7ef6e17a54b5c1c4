"""Command-line flags: Go and GNU spellings of one flag, no abbreviations, global options anywhere."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import pytest

from paddlecloud.flags import ArgumentParser, add_flag
from paddlecloud.main import build_parser, main


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
    # Go's flag package takes =true/=false for an on/off flag; the other value is its default.
    assert parser.parse_args(["--rm=true"]).rm is True
    assert parser.parse_args(["-rm=false"]).rm is False
    with pytest.raises(SystemExit):
        parser.parse_args(["--rm=maybe"])
    # A short flag with its value attached is not taken for a misspelt long flag.
    attached = build_parser().parse_args(["submit", "-p4", "-m10Gi", "-c2", "-tmodules/t.py", "pkg"])
    assert (attached.parallelism, attached.memory, attached.cpu, attached.topology) == (
        4,
        "10Gi",
        "2",
        "modules/t.py",
    )


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


def run(argv: list[str], tmp_path: Path, prog: str = "paddlecloud") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, env={"HOME": str(tmp_path)}, stdout=out, stderr=err, stdin=io.StringIO(), prog=prog)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    ("argv", "usage", "hint"),
    [
        (["submit", "--jobnme", "x", "."], "usage: paddlectl submit ", "did you mean --jobname?"),
        (["get", "jobs", "--stat", "FAILED"], "usage: paddlectl get jobs ", "did you mean --state?"),
        (["cp", "-recursiv", "a", "pfs:b"], "usage: paddlectl cp ", "did you mean -recursive?"),
        (["users", "quota", "bob", "-cpus", "2"], "usage: paddlectl users quota ", "did you mean -cpu?"),
    ],
)
def test_an_unknown_flag_gets_the_subcommands_usage_and_the_closest_spelling(
    argv: list[str], usage: str, hint: str, tmp_path: Path
) -> None:
    code, out, err = run(argv, tmp_path, prog="paddlectl")
    assert code == 2 and out == ""
    assert err.startswith(usage), err
    last = err.strip().splitlines()[-1]
    assert last.startswith(usage.removeprefix("usage: ").strip() + ": error: unrecognized arguments: ")
    assert last.endswith(hint), last


@pytest.mark.parametrize(
    ("argv", "hint"), [(["submti", "."], "did you mean submit?"), (["get", "quotas"], "did you mean quota?")]
)
def test_a_misspelt_command_names_the_closest_one(argv: list[str], hint: str, tmp_path: Path) -> None:
    code, _, err = run(argv, tmp_path)
    assert code == 2 and err.strip().endswith(hint), err


def test_help_commands_and_flags_work_as_the_original_help_screen_lists_them(tmp_path: Path) -> None:
    code, out, _ = run(["help"], tmp_path, prog="paddlectl")
    assert code == 0 and out.startswith("usage: paddlectl ")
    assert all(f"\n    {name} " in out for name in ("help", "commands", "flags"))
    code, out, _ = run(["help", "submit"], tmp_path, prog="paddlectl")
    assert code == 0 and out.startswith("usage: paddlectl submit ") and "-jobname" in out
    code, out, _ = run(["help", "get", "jobs"], tmp_path)
    assert code == 0 and out.startswith("usage: paddlecloud get jobs ")
    code, out, err = run(["help", "subimt"], tmp_path)
    assert code == 2 and out == "" and "no command 'subimt'; did you mean submit?" in err
    assert len(err.strip().splitlines()) == 1

    code, out, _ = run(["commands"], tmp_path)
    names = out.split()
    verbs = {"submit", "train", "jobs", "list", "status", "cancel", "upload", "download"}
    assert code == 0 and verbs <= set(names)
    assert names.index("submit") < names.index("help")
    code, out, _ = run(["commands", "get"], tmp_path)
    assert code == 0 and out.split() == ["jobs", "job", "workers", "quota", "registry", "registries", "users"]

    code, out, _ = run(["flags"], tmp_path, prog="paddlectl")
    assert code == 0 and "-datacenter, --datacenter NAME" in out and "-o, -output, --output FORMAT" in out
    assert "-jobname" not in out  # a command's own flags are `flags COMMAND`'s
    code, out, _ = run(["flags", "submit"], tmp_path)
    assert code == 0 and "-jobname, --jobname, --job-name, -name, --name NAME" in out


def test_help_examples_name_the_program_as_it_was_run(tmp_path: Path) -> None:
    for argv in (["--help"], ["cp", "--help"], ["submit", "--help"], ["help", "users", "create"]):
        code, out, _ = run(argv, tmp_path, prog="paddlectl")
        assert code == 0 and "  paddlectl " in out and "paddlecloud " not in out
        assert ".paddlecloud" in out or argv[0] != "submit"  # a path keeps its name
    code, out, _ = run(["cp", "--help"], tmp_path)
    assert "  paddlecloud cp " in out and "paddlectl" not in out


def test_a_message_that_suggests_a_command_names_the_program_as_it_was_run(tmp_path: Path) -> None:
    code, _, err = run(["get", "jobs"], tmp_path / "nowhere", prog="paddlectl")
    assert code == 4 and "paddlectl config add" in err and "paddlecloud config" not in err
