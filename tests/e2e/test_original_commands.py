"""The original product's command lines, spelled exactly as its docs quote them (issue 16),
against one real `paddlecloud server`."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

DC = "datacenter1"
HOME = f"/pfs/{DC}/home/admin"

# A package whose entry serves as a parameter server when told so (TRAINING_ROLE=PSERVER,
# the default for parameter servers) and trains otherwise; serve.py only serves, for
# -psentry, and trainer_mod.py trains when run as a module, for --module.
SERVE_PY = """\
import os, socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(os.environ["PADDLE_PORT"]))); s.listen()
print("serving as", os.environ["TRAINING_ROLE"], flush=True)
while True:
    time.sleep(1)
"""
TRAIN_PY = """\
import os, runpy, time
if os.environ["TRAINING_ROLE"] == "PSERVER":
    runpy.run_path("serve.py")
env = os.environ
print("trainer", env["TRAINER_ID"], "of", env["TRAINERS"], "K=" + env.get("K", "-"), flush=True)
print("input", env.get("PADDLE_CLOUD_INPUT"), "output", env.get("PADDLE_CLOUD_OUTPUT"), flush=True)
time.sleep(float(env.get("SLEEP", "0")))
"""
TRAINER_MOD_PY = """\
import os
print("module trainer", os.environ["TRAINER_ID"], "of", os.environ["TRAINERS"], flush=True)
"""


def make_package(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "train.py").write_text(TRAIN_PY)
    (root / "serve.py").write_text(SERVE_PY)
    (root / "trainer_mod.py").write_text(TRAINER_MOD_PY)
    return root


@pytest.fixture
def server(server_factory: Any) -> Any:
    return server_factory()


def paddlectl(
    server: Any, line: str, *, cwd: Path | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """One command line as a user types it, split as a shell would, run as that program."""
    words = shlex.split(line)
    assert words[0] in ("paddlectl", "paddlecloud"), line
    program = Path(sys.executable).parent / words[0]
    return subprocess.run(
        [str(program), *words[1:]],
        env=user_env(server),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd or server.home.parent,
        input=stdin,
    )


def user_env(server: Any) -> dict[str, str]:
    """The environment of a user at a terminal: their HOME, no PaddleCloud settings."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PADDLECLOUD_", "PADDLE_"))},
        "HOME": str(server.home),
    }


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stdout}\n{result.stderr}"
    return result.stdout


def refused(result: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """The one line a refused command prints (after argparse's usage, for a usage error)."""
    assert result.returncode == code, f"exit {result.returncode}: {result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    if code != 2:
        assert len(lines) == 1, result.stderr
    return lines[-1]


def spec_of(server: Any, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(ok(paddlectl(server, f"paddlectl -o json status {name}")))["spec"]
    return spec


def test_registry_credentials_are_saved_listed_without_the_password_used_and_deleted(
    server: Any, tmp_path: Path
) -> None:
    saved = ok(paddlectl(server, "paddlectl registry -username U -password P -server S -name N"))
    assert "Saved registry N" in saved
    assert "N" in ok(paddlectl(server, "paddlectl get registry"))
    ok(paddlectl(server, "paddlectl delete registry N"))
    ok(
        paddlectl(
            server, "paddlectl registry -username alice -password s3cret -server r.example.com -name myreg"
        )
    )
    listed = ok(paddlectl(server, "paddlectl get registry"))
    assert "myreg" in listed and "r.example.com" in listed and "s3cret" not in listed
    as_json = json.loads(ok(paddlectl(server, "paddlectl -o json get registry")))
    assert [r["name"] for r in as_json["registries"]] == ["myreg"]
    assert "s3cret" not in json.dumps(as_json)

    package = tmp_path / "pkg"
    package.mkdir()
    (package / "train.py").write_text("print('hi')\n")
    refused = paddlectl(server, f"paddlectl submit -registry nosuch --dry-run {package}")
    assert refused.returncode == 1 and "registry" in refused.stderr and "nosuch" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    ok(paddlectl(server, f"paddlectl submit -registry myreg --dry-run {package}"))

    ok(paddlectl(server, "paddlectl delete registry myreg"))
    assert "myreg" not in ok(paddlectl(server, "paddlectl get registry"))
    logs = "".join(p.read_text(errors="replace") for p in (server.data_dir / "logs").glob("*.log"))
    assert "s3cret" not in logs


def test_the_paddlecloud_designs_short_forms_and_verbs(server: Any, tmp_path: Path) -> None:
    package = tmp_path / "job_word_emb"
    (package / "modules").mkdir(parents=True)
    (package / "train.py").write_text("import os; print('trainer', os.environ['TRAINER_ID'])\n")
    (package / "modules" / "train.py").write_text(
        "import os; print('topology trainer', os.environ['TRAINER_ID'])\n"
    )
    out = ok(
        paddlectl(
            server, "paddlecloud submit ./job_word_emb -p 4 -c 2 -m 10Gi -t modules/train.py", cwd=tmp_path
        )
    )
    name = next(line.split()[2] for line in out.splitlines() if line.startswith("Started job "))
    job = json.loads(ok(paddlectl(server, f"paddlectl -o json status {name}")))
    spec = job["spec"]
    assert (spec["trainers"], spec["cpu"], spec["memory"], spec["topology"]) == (
        4,
        "2",
        "10Gi",
        "modules/train.py",
    )
    # -m is the memory, not `python -m 10Gi`; -t is the script that runs, not ignored; and
    # that design's "-pservers defaults to -p".
    assert (spec["entry"], spec["pservers"]) == ("python modules/train.py", 4)
    assert name in ok(paddlectl(server, "paddlecloud list -a"))
    assert name in ok(paddlectl(server, "paddlecloud jobs -a"))
    ok(paddlectl(server, f"paddlecloud cancel {name}"))
    out = ok(
        paddlectl(
            server, "paddlecloud submit ./job_word_emb -p 1 -pservers 0 -t modules/train.py -f", cwd=tmp_path
        )
    )
    assert "[trainer-0] topology trainer 0" in out, out
    both = paddlectl(
        server, 'paddlectl submit -t modules/train.py -entry "python x.py" ./job_word_emb', cwd=tmp_path
    )
    assert both.returncode == 1 and "topology" in both.stderr and "not both" in both.stderr

    # A spec the server refuses never "starts": one line, and no "Starting job" before it.
    refused = paddlectl(server, "paddlectl submit -memory 10GB ./job_word_emb", cwd=tmp_path)
    assert refused.returncode == 1
    assert "Start" not in refused.stdout, refused.stdout
    assert "Value error" not in refused.stderr and "memory" in refused.stderr

    # A bare paddlectl prints help, naming itself.
    bare = paddlectl(server, "paddlectl")
    assert bare.returncode == 0 and bare.stdout.startswith("usage: paddlectl")


def test_the_original_designs_gnu_long_flags_spelled_as_written(server: Any, tmp_path: Path) -> None:
    make_package(tmp_path / "pkg")
    ok(paddlectl(server, "paddlectl mkdir data"))

    submitted = paddlectl(
        server,
        'paddlectl submit --job-name gnu-a --package-path ./pkg --entry-point "python train.py" '
        "--trainers 2 --pservers 1 --base-image python:3.11-slim --input data --output out "
        '--env "K=V" -f',
        cwd=tmp_path,
    )
    out = ok(submitted)
    # An image on one machine is accepted and not used: said at submit, in one line.
    warned = [line for line in submitted.stderr.splitlines() if "warning" in line]
    note = "image python:3.11-slim is not used: this backend runs jobs with the platform's Python"
    assert warned == [f"paddlectl: warning: {note}"], submitted.stderr
    assert "[trainer-0] trainer 0 of 2 K=V" in out and "[trainer-1] trainer 1 of 2 K=V" in out
    assert "[pserver-0] serving as PSERVER" in out and "Job gnu-a SUCCEEDED" in out
    spec = spec_of(server, "gnu-a")
    assert (spec["entry"], spec["trainers"], spec["pservers"], spec["image"]) == (
        "python train.py",
        2,
        1,
        "python:3.11-slim",
    )
    assert (spec["input"], spec["output"], spec["env"]) == ("data", "out", {"K": "V"})
    assert f"[trainer-0] input {HOME}/data output {HOME}/out" in out

    out = ok(
        paddlectl(
            server,
            "paddlectl submit --job-name gnu-b --package-path ./pkg --trainer-count 2 --pserver-count 1 "
            '--module trainer_mod --pserver-entry "python serve.py" -f',
            cwd=tmp_path,
        )
    )
    assert "[trainer-1] module trainer 1 of 2" in out and "[pserver-0] serving as PSERVER" in out
    spec = spec_of(server, "gnu-b")
    assert (spec["trainers"], spec["pservers"], spec["entry"], spec["psentry"]) == (
        2,
        1,
        "python -m trainer_mod",
        "python serve.py",
    )
    out = ok(
        paddlectl(
            server,
            "paddlectl submit --job-name gnu-c --package-path ./pkg --module-name trainer_mod -f",
            cwd=tmp_path,
        )
    )
    assert "[trainer-0] module trainer 0 of 1" in out
    assert spec_of(server, "gnu-c")["entry"] == "python -m trainer_mod"

    # GPUs: a machine without them refuses, naming the count the flags asked for.
    for line, gpus in (
        ("paddlectl submit --job-name gnu-d --package-path ./pkg --use-gpu --trainer-gpu-num 2 --dry-run", 2),
        ("paddlectl submit --job-name gnu-e --package-path ./pkg --use-gpu --dry-run", 1),
        ("paddlectl submit --job-name gnu-e --package-path=./pkg --use-gpu=true --dry-run", 1),
        ("paddlectl submit --job-name gnu-e --package-path=./pkg --use-gpu=false --dry-run", 0),
    ):
        result = paddlectl(server, line, cwd=tmp_path)
        if result.returncode == 0:
            plan = [row.split() for row in result.stdout.splitlines() if row.startswith("trainer-0 ")]
            assert plan and plan[0][-1] == str(gpus), result.stdout
        else:
            assert f"the job asks for {gpus}" in refused(result), result.stderr


def test_the_original_verbs_are_aliases_of_the_commands_they_describe(server: Any, tmp_path: Path) -> None:
    make_package(tmp_path / "pkg")
    out = ok(
        paddlectl(
            server, "paddlecloud train --job-name verbs --trainers 1 --pservers 0 -f ./pkg", cwd=tmp_path
        )
    )
    assert "Job verbs SUCCEEDED" in out
    assert "verbs" in ok(paddlectl(server, "paddlecloud jobs -a")) and "verbs" in ok(
        paddlectl(server, "paddlecloud list -a")
    )
    assert "SUCCEEDED" in ok(paddlectl(server, "paddlecloud status verbs"))
    (tmp_path / "a.txt").write_text("alpha\n")
    assert "uploaded 1 file" in ok(paddlectl(server, "paddlecloud upload a.txt pfs:a.txt", cwd=tmp_path))
    assert "downloaded 1 file" in ok(paddlectl(server, "paddlecloud download a.txt back.txt", cwd=tmp_path))
    assert (tmp_path / "back.txt").read_text() == "alpha\n"
    started = ok(paddlectl(server, 'paddlecloud submit --job-name long --env "SLEEP=60" ./pkg', cwd=tmp_path))
    assert "Started job long" in started
    assert "job long killed" in ok(paddlectl(server, "paddlecloud cancel long"))


def test_the_help_screen_and_its_commands(server: Any, tmp_path: Path) -> None:
    bare = ok(paddlectl(server, "paddlectl"))
    assert bare.startswith("usage: paddlectl") and "commands " in bare and "flags " in bare
    names = ok(paddlectl(server, "paddlectl commands")).split()
    assert {
        "submit",
        "train",
        "jobs",
        "list",
        "status",
        "cancel",
        "upload",
        "download",
        "help",
        "flags",
    } <= set(names)
    one = ok(paddlectl(server, "paddlectl help submit"))
    assert one.startswith("usage: paddlectl submit ") and "--job-name" in one
    assert "  paddlectl submit -jobname fit-a-line" in one  # the examples name the program run
    flags = ok(paddlectl(server, "paddlectl flags"))
    assert "-datacenter, --datacenter NAME" in flags and "-jobname" not in flags

    make_package(tmp_path / "pkg")
    mistyped = paddlectl(server, "paddlectl submit --jobnme x ./pkg", cwd=tmp_path)
    assert mistyped.returncode == 2 and mistyped.stderr.startswith("usage: paddlectl submit ")
    assert refused(mistyped, 2) == (
        "paddlectl submit: error: unrecognized arguments: --jobnme ./pkg; did you mean --jobname?"
    )
    # A Go-style long flag misspelt is not the short flag with a value attached.
    for typed, meant in (("-parallelsim 2", "-parallelism"), ("-memroy 1Gi", "-memory")):
        line = refused(paddlectl(server, f"paddlectl submit {typed} ./pkg", cwd=tmp_path), 2)
        assert line.endswith(f"did you mean {meant}?"), line
    # The module path is relative to the package directory, and the error says so.
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "train.py").write_text("print('demo')\n")
    line = refused(
        paddlectl(server, "paddlectl submit --module=demo.train --package-path=./demo", cwd=tmp_path), 2
    )
    assert "relative to the package directory" in line and "did you mean --module train?" in line, line
    nothing_started = ok(paddlectl(server, "paddlectl -o json get jobs -a"))
    assert json.loads(nothing_started)["jobs"] == []
    assert "did you mean help?" in refused(paddlectl(server, "paddlectl hepl submit"), 2)


def test_parameter_servers_run_the_psentry_and_one_that_exits_early_is_explained(
    server: Any, tmp_path: Path
) -> None:
    make_package(tmp_path / "pkg")
    out = ok(
        paddlectl(
            server,
            'paddlectl submit -jobname split -pservers 1 -entry "python trainer_mod.py" '
            '-psentry "python serve.py" -f ./pkg',
            cwd=tmp_path,
        )
    )
    assert "[pserver-0] serving as PSERVER" in out and "[trainer-0] module trainer 0 of 1" in out
    # One entry for both roles that ignores TRAINING_ROLE: the server "finishes" at once.
    early = paddlectl(
        server,
        'paddlectl submit -jobname naive -pservers 1 -entry "python trainer_mod.py" -f ./pkg',
        cwd=tmp_path,
    )
    assert early.returncode == 1
    assert early.stderr.strip().endswith(
        "pserver-0 exited before the trainers started: does your entry handle "
        "TRAINING_ROLE=PSERVER, or should you set --pserver-entry?"
    ), early.stderr
