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
