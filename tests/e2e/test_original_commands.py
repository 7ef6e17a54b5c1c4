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
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith(("PADDLECLOUD_", "PADDLE_"))},
            "HOME": str(server.home),
        },
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd or server.home.parent,
        input=stdin,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stdout}\n{result.stderr}"
    return result.stdout


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
    (package / "modules" / "train.py").write_text("# the v1 topology\n")
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
    assert spec["entry"] == "python train.py"  # -m is the memory, not `python -m 10Gi`
    assert name in ok(paddlectl(server, "paddlecloud list -a"))
    assert name in ok(paddlectl(server, "paddlecloud jobs -a"))
    ok(paddlectl(server, f"paddlecloud cancel {name}"))

    # A spec the server refuses never "starts": one line, and no "Starting job" before it.
    refused = paddlectl(server, "paddlectl submit -memory 10GB ./job_word_emb", cwd=tmp_path)
    assert refused.returncode == 1
    assert "Start" not in refused.stdout, refused.stdout
    assert "Value error" not in refused.stderr and "memory" in refused.stderr

    # A bare paddlectl prints help, naming itself.
    bare = paddlectl(server, "paddlectl")
    assert bare.returncode == 0 and bare.stdout.startswith("usage: paddlectl")
