"""Job commands' command lines: Go and GNU spellings give one spec, only given fields, usage errors."""

from __future__ import annotations

import argparse
import io
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from paddlecloud.commands.jobs import (
    _split_output,
    age,
    big_package_note,
    build_spec,
    default_name,
    job_text,
    package_argument,
    parse_env,
    quota_rows,
)
from paddlecloud.context import UsageError
from paddlecloud.main import EXIT_USAGE, build_parser, main
from paddlecloud.package import Package
from paddlecloud.paddlejob import PaddleJob, log_text, pfs_package

PACKAGE = "/pfs/dc1/home/alice/.paddlecloud/packages/abc.tar.gz"

GO_STYLE = [
    *"submit -jobname fit-a-line -cpu 1 -gpu 0 -memory 1Gi -parallelism 2 -pscpu 1 -pservers 2".split(),
    *"-psmemory 1Gi -passes 1 -entry".split(),
    "python train.py",
    "./examples/fit_a_line",
]
GNU_STYLE = [
    "submit",
    "--job-name=fit-a-line",
    "--cpu",
    "1",
    "--gpu=0",
    "--memory",
    "1Gi",
    "--trainers",
    "2",
    "--pscpu=1",
    "--pservers",
    "2",
    "--psmemory",
    "1Gi",
    "--passes",
    "1",
    "--entry-point",
    "python train.py",
    "--package-path",
    "./examples/fit_a_line",
]
EXPECTED = {
    "name": "fit-a-line",
    "package": PACKAGE,
    "entry": "python train.py",
    "trainers": 2,
    "pservers": 2,
    "cpu": "1",
    "gpu": 0,
    "memory": "1Gi",
    "pscpu": "1",
    "psmemory": "1Gi",
    "passes": 1,
}


def parse(argv: list[str], prog: str = "paddlecloud") -> argparse.Namespace:
    return build_parser(prog).parse_args(argv)


def spec_of(argv: list[str], prog: str = "paddlecloud") -> dict[str, Any]:
    return build_spec(parse(argv, prog), PACKAGE)


@pytest.mark.parametrize("prog", ["paddlecloud", "paddlectl"])
def test_the_original_go_style_command_line_and_gnu_spellings_give_the_same_spec(prog: str) -> None:
    go = parse(GO_STYLE, prog)
    gnu = parse(GNU_STYLE, prog)
    assert package_argument(go) == package_argument(gnu) == "./examples/fit_a_line"
    assert build_spec(go, PACKAGE) == build_spec(gnu, PACKAGE) == EXPECTED


def test_other_spellings_of_the_same_flags() -> None:
    argv = ["submit", "--name", "x", "--parallelism", "3", "-trainers", "4", "--jobname", "y", "pkg"]
    spec = spec_of(argv)
    assert spec["name"] == "y" and spec["trainers"] == 4  # the last one given wins, as usual
    assert spec_of(["submit", "-name", "z", "-package", "pkg"])["name"] == "z"


def test_only_the_flags_given_are_sent() -> None:
    assert spec_of(["submit", "--name", "x", "pkg"]) == {"name": "x", "package": PACKAGE}
    spec = spec_of(
        ["submit", "--name", "x", "--env", "A=1", "-e", "B=two=2", "--env", "A=3", "--input", "pfs:data",
         "--output", "/pfs/dc1/home/alice/out", "--image", "paddle:2", "--registry", "hub", "--topology",
         "conf.py", "--max-restarts", "2", "pkg"]
    )  # fmt: skip
    assert spec == {
        "name": "x",
        "package": PACKAGE,
        "env": {"A": "3", "B": "two=2"},
        "input": "data",
        "output": "/pfs/dc1/home/alice/out",
        "image": "paddle:2",
        "registry": "hub",
        "topology": "conf.py",
        "max_restarts": 2,
    }


def test_module_becomes_the_entry_and_cannot_be_given_with_entry() -> None:
    assert (
        spec_of(["submit", "--name", "x", "--module", "trainer.main", "pkg"])["entry"]
        == "python -m trainer.main"
    )
    assert spec_of(["submit", "--name", "x", "--module-name", "t", "pkg"])["entry"] == "python -m t"
    with pytest.raises(UsageError, match="either --entry or --module"):
        spec_of(["submit", "--name", "x", "--module", "m", "--entry", "python a.py", "pkg"])


def test_a_module_path_from_the_packages_parent_is_refused_saying_what_it_is_relative_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "train.py").write_text("print(1)\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=r"relative to the package directory.*did you mean --module train"):
        spec_of(["submit", "--module=demo.train", "--package-path=./demo"])
    assert spec_of(["submit", "--module", "train", "./demo"])["entry"] == "python -m train"
    # One the package does not hold may come from its requirements: not ours to refuse.
    assert spec_of(["submit", "--module", "paddle.run", "./demo"])["entry"] == "python -m paddle.run"


@pytest.mark.parametrize(
    ("argv", "package", "job_output", "fmt"),
    [
        (["--output", "/pfs/dc1/home/alice/out", "pkg"], "pkg", "/pfs/dc1/home/alice/out", "table"),
        (["-output", "out", "pkg"], "pkg", "out", "table"),
        (["--output=out", "pkg"], "pkg", "out", "table"),
        (["--output", "json", "pkg"], "pkg", None, "json"),
        (["-output=yaml", "pkg"], "pkg", None, "yaml"),
        (["-o", "json", "--output", "out", "pkg"], "pkg", "out", "json"),
        (["--output-path", "json", "pkg"], "pkg", "json", "table"),
        (["pkg", "--output-dir", "o"], "pkg", "o", "table"),
    ],
)
def test_submit_output_is_the_jobs_output_path_unless_it_names_a_format(
    argv: list[str], package: str, job_output: str | None, fmt: str
) -> None:
    args = parse(["submit", *argv])
    assert (args.package, args.job_output, args.output) == (package, job_output, fmt)


def test_the_global_output_format_still_works_before_the_command() -> None:
    args = parse(["-o", "json", "submit", "--output", "out", "pkg"])
    assert (args.output, args.job_output) == ("json", "out")


def test_split_output_leaves_everything_after_a_double_dash_alone() -> None:
    assert _split_output(["--output", "x", "--", "--output", "y"]) == [
        "--output-path",
        "x",
        "--",
        "--output",
        "y",
    ]
    assert _split_output(["--output"]) == ["--output"]


@pytest.mark.parametrize("item", ["NOEQUALS", "=value", " A=1"])
def test_bad_env_syntax_is_a_usage_error(item: str) -> None:
    with pytest.raises(UsageError, match="KEY=VALUE"):
        parse_env([item])
    assert parse_env(["EMPTY="]) == {"EMPTY": ""}


def run(argv: list[str], tmp_path: Path) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    code = main(argv, env={"HOME": str(tmp_path)}, stdout=stdout, stderr=stderr, stdin=io.StringIO())
    return code, stdout.getvalue(), stderr.getvalue()


def test_bad_env_on_the_command_line_is_one_line_and_exit_2_before_anything_else(tmp_path: Path) -> None:
    # No config exists: the mistake is reported before the command needs one.
    code, out, err = run(["submit", "--name", "x", "--env", "LR", str(tmp_path)], tmp_path)
    assert code == EXIT_USAGE and out == ""
    assert err.splitlines() == [
        "paddlecloud: error: --env 'LR': expected KEY=VALUE, such as --env LEARNING_RATE=0.01"
    ]


def test_a_missing_or_doubled_package_is_a_usage_error(tmp_path: Path) -> None:
    code, _, err = run(["submit", "--name", "x"], tmp_path)
    assert code == EXIT_USAGE and "which package?" in err and len(err.splitlines()) == 1
    code, _, err = run(["submit", "--package-path", "a", "b"], tmp_path)
    assert code == EXIT_USAGE and "two packages given" in err


def test_counts_must_be_whole_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parse(["submit", "-parallelism", "two", "pkg"])
    assert caught.value.code == 2
    assert "expected a whole number, got 'two'" in capsys.readouterr().err


def test_get_jobs_all_goes_before_or_after_the_resource() -> None:
    assert not getattr(parse(["get", "jobs"]), "all", False)
    assert parse(["get", "jobs", "-a"]).all is True
    assert parse(["get", "-a", "jobs"]).all is True
    assert parse(["get", "jobs", "--all"]).all is True
    assert parse(["get", "jobs", "--state", "failed", "--state", "KILLED"]).state == ["FAILED", "KILLED"]
    assert parse(["get", "job", "x"]).job == "x"
    assert parse(["get", "workers", "x", "-o", "json"]).output == "json"


def test_logs_and_kill_flags() -> None:
    args = parse(
        ["logs", "-n", "5", "-f", "--role", "PServer", "-w", "trainer-0", "--worker", "trainer-1", "job"]
    )
    assert (args.tail, args.follow, args.role, args.worker, args.job) == (
        5,
        True,
        "pserver",
        ["trainer-0", "trainer-1"],
        "job",
    )
    args = parse(["logs", "job"])
    assert (args.tail, args.follow, args.role, args.worker) == (None, False, None, None)
    assert parse(["kill", "-rm", "a"]).rm is True
    assert parse(["kill", "--rm", "a", "b"]).jobs == ["a", "b"]
    assert parse(["kill", "a"]).rm is False


@pytest.mark.parametrize(
    ("package", "name"),
    [
        ("./examples/fit_a_line", "fit-a-line-abcde"),
        ("./examples/fit_a_line/", "fit-a-line-abcde"),
        ("/pfs/dc1/home/alice/pkgs/Mnist_V2.tar.gz", "mnist-v2-abcde"),
        ("pfs:2048", "job-2048-abcde"),
        (".", "job-abcde"),
        ("./" + "x" * 80, "x" * 38 + "-abcde"),
    ],
)
def test_a_default_name_comes_from_the_package(package: str, name: str) -> None:
    assert default_name(package, "abcde") == name
    assert len(default_name(package)) <= 44


def test_without_a_name_one_is_made_up() -> None:
    spec = spec_of(["submit", "./examples/fit_a_line"])
    assert spec["name"].startswith("fit-a-line-") and len(spec["name"]) == len("fit-a-line-") + 5


def test_ages_and_quota_rows() -> None:
    now = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    assert age((now - timedelta(seconds=5)).isoformat(), now) == "5s"
    assert age("2026-11-22T11:45:00Z", now) == "15m"
    assert age("2026-11-20T11:00:00Z", now) == "2d"
    assert age(None, now) == "-"
    rows = quota_rows(
        {
            "user": "a",
            "cpu": {"used": "1500m", "limit": "4"},
            "gpu": {"used": 0, "limit": None},
            "memory": {"used": "3Gi", "limit": "8Gi"},
            "storage": {"used": "435781", "limit": "1000"},
        }
    )
    assert rows == [
        {"resource": "cpu", "used": "1500m", "limit": "4"},
        {"resource": "gpu", "used": 0, "limit": "unlimited"},
        {"resource": "memory", "used": "3Gi", "limit": "8Gi"},
        {"resource": "storage", "used": "425.6 KiB", "limit": "1000"},
    ]


def test_get_job_text_shows_spec_workers_and_events() -> None:
    job = {
        "name": "fit",
        "state": "FAILED",
        "reason": "trainer-0 exited 137: killed, often out of memory",
        "owner": "alice",
        "created_at": "2026-11-22T12:00:00Z",
        "started_at": None,
        "finished_at": None,
        "spec": {"package": PACKAGE, "entry": "python train.py", "trainers": 1, "pservers": 0,
                 "cpu": "1", "memory": "1Gi", "gpu": 0, "pscpu": "1", "psmemory": "1Gi",
                 "env": {"A": "1"}, "image": None},
        "workers": [{"name": "trainer-0", "role": "TRAINER", "index": 0, "state": "FAILED",
                     "restarts": 0, "started_at": None, "host": "127.0.0.1", "exit_code": 137}],
        "events": [{"time": "2026-11-22T12:00:00Z", "type": "state", "state": "PENDING",
                    "reason": "submitted", "message": None}],
    }  # fmt: skip
    text = job_text(job)
    assert "State:    FAILED" in text and "out of memory" in text
    assert "Trainers: 1 (each cpu 1, memory 1Gi, gpu 0)" in text
    assert "Env:      A=1" in text and "Image" not in text
    assert "NAME       ROLE     INDEX  STATE   RESTARTS  STARTED  HOST       EXIT" in text
    assert "137" in text and "submitted" in text


def test_the_sdk_job_sends_only_what_it_was_given() -> None:
    job = PaddleJob("fit", package="./fit", trainers=2, env={"A": "1"})
    assert job.spec(PACKAGE) == {"name": "fit", "package": PACKAGE, "trainers": 2, "env": {"A": "1"}}
    assert pfs_package("pfs:pkgs/a.tar.gz") == "pkgs/a.tar.gz"
    assert pfs_package("/pfs/dc1/home/alice/a") == "/pfs/dc1/home/alice/a"
    assert pfs_package("./a") is None
    assert log_text({"worker": "trainer-0", "line": "hi"}) == "[trainer-0] hi"


def test_a_big_package_is_named_with_its_largest_paths_and_what_to_do(tmp_path: Path) -> None:
    pkg = Package(
        source=tmp_path,
        archive=tmp_path / "x.tar.gz",
        sha256="0" * 64,
        size=1,
        files=3,
        bytes=300 * 2**20,
        largest=(("data/", 250 * 2**20), ("data/train.bin", 200 * 2**20), ("model.bin", 50 * 2**20)),
    )
    note = big_package_note(pkg)
    assert note.startswith("the package is 300.0 MiB (over 100.0 MiB); largest: data/ (250.0 MiB), ")
    assert "data/train.bin (200.0 MiB), model.bin (50.0 MiB)" in note and ".paddlecloudignore" in note


def test_a_package_given_as_dot_is_named_after_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_model").mkdir()
    monkeypatch.chdir(tmp_path / "my_model")
    assert spec_of(["submit", "."])["name"].startswith("my-model-")


def test_the_original_short_forms_mean_what_the_original_docs_say() -> None:
    """`paddlecloud submit ./job_word_emb -p 4 -c 2 -m 10Gi -t modules/train.py`: -m is the
    memory, never a module (it used to become `python -m 10Gi`)."""
    spec = spec_of(["submit", "./job_word_emb", "-p", "4", "-c", "2", "-m", "10Gi", "-t", "modules/train.py"])
    assert (spec["trainers"], spec["cpu"], spec["memory"], spec["topology"]) == (
        4,
        "2",
        "10Gi",
        "modules/train.py",
    )
    assert "entry" not in spec  # the server runs the topology: python modules/train.py
    # "-pservers defaults to -p" in that design; every other spelling's default is none.
    assert spec["pservers"] == 4
    assert spec_of(["submit", "-p", "4", "-pservers", "1", "pkg"])["pservers"] == 1
    assert "pservers" not in spec_of(["submit", "-parallelism", "4", "pkg"])
    assert "pservers" not in spec_of(["submit", "--trainers", "4", "pkg"])
    with pytest.raises(SystemExit):
        spec_of(["submit", "--name", "x", "-m", "trainer.main", "pkg"])  # ambiguous: refused, saying which


def test_the_original_designs_long_flags() -> None:
    spec = spec_of(
        [
            "submit",
            "--job-name",
            "j",
            "--package-path",
            "pkg",
            "--entry-point",
            "python t.py",
            "--trainers",
            "3",
            "--pservers",
            "2",
            "--base-image",
            "img:1",
            "--trainer-gpu-num",
            "0",
            "--input",
            "in",
            "--output",
            "out",
            "--env",
            "K=V",
        ]
    )
    wanted = {
        "name": "j",
        "entry": "python t.py",
        "trainers": 3,
        "pservers": 2,
        "image": "img:1",
        "gpu": 0,
        "input": "in",
        "output": "out",
        "env": {"K": "V"},
    }
    assert {k: spec.get(k) for k in wanted} == wanted
    spec = spec_of(
        ["submit", "--name", "j", "--pserver-count", "2", "--trainer-count", "3", "--use-gpu", "pkg"]
    )
    assert (spec["pservers"], spec["trainers"], spec["gpu"]) == (2, 3, 1)


@pytest.mark.parametrize("flag", ["-psentry", "--psentry", "--pserver-entry"])
def test_the_parameter_servers_entry_has_its_original_spelling_and_a_long_one(flag: str) -> None:
    spec = spec_of(["submit", "-jobname", "j", "-pservers", "2", flag, "python serve.py", "./pkg"])
    assert spec["psentry"] == "python serve.py" and spec["pservers"] == 2
    assert "psentry" not in spec_of(["submit", "-jobname", "j", "./pkg"])
