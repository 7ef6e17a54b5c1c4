"""The README's "A short tour", every command line as written, against a real `paddlecloud server`.

The lines are read from README.md, so a change there changes what runs here. The client
lines run in one bash, in order, from a directory laid out as a clone (`.venv` and the
example they use), with the test's virtual environment off PATH: the tour's own
`. .venv/bin/activate` must put `paddlecloud` there. Two departures, both forced: the
server line gets `--port 0` (8080 may be taken where tests run side by side), and the
Paddle block, which builds 360 MB of wheels, runs in tests/e2e/test_paddle_examples.py
from the same README line.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env, start_server

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TOUR_TIMEOUT = 300
PADDLE_EXAMPLE = "examples/paddle_collective"


def tour_blocks(readme: Path = ROOT / "README.md") -> list[list[str]]:
    """The command lines of each `sh` block under "## A short tour": continuation lines
    joined, blank lines and comment-only lines (the output the README shows) left out."""
    text = readme.read_text()
    assert "\n## A short tour\n" in text, "README.md has no section 'A short tour'"
    section = text.split("\n## A short tour\n", 1)[1].split("\n## ", 1)[0]
    blocks = []
    for body in re.findall(r"```sh\n(.*?)```", section, flags=re.S):
        commands, pending = [], ""
        for line in body.splitlines():
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1].strip() + " "
                continue
            line, pending = pending + line.strip(), ""
            if line and not line.startswith("#"):
                commands.append(line)
        blocks.append(commands)
    return blocks


def paddle_line() -> str:
    """The tour's Paddle line (run by test_paddle_examples.py, where its wheels are)."""
    (line,) = [c for block in tour_blocks() for c in block if PADDLE_EXAMPLE in c]
    return line


def test_the_readme_tour_runs_as_written(tmp_path: Path) -> None:
    server_block, *client_blocks = tour_blocks()
    (server_line,) = server_block
    tour = [c for block in client_blocks for c in block if PADDLE_EXAMPLE not in c]
    venv = Path(sys.prefix)
    if not (venv / "bin" / "activate").is_file():
        pytest.skip(f"the tests do not run in a virtual environment ({venv}); the tour activates .venv")

    clone = tmp_path / "clone"
    (clone / "examples").mkdir(parents=True)
    (clone / ".venv").symlink_to(venv)
    shutil.copytree(
        ROOT / "examples" / "fit_a_line",
        clone / "examples" / "fit_a_line",
        ignore=shutil.ignore_patterns("__pycache__", "output"),
    )
    home = tmp_path / "home"
    server = start_server(
        home, home / ".paddlecloud", "--port", "0", command=shlex.split(server_line, comments=True), cwd=clone
    )
    try:
        script = []
        for number, command in enumerate(tour):
            script += [
                f"echo {shlex.quote(f'$ {command}')}",
                command,
                f'status=$?; [ "$status" = 0 ] || {{ echo "line {number} exited $status"; exit 1; }}',
            ]
        env = clean_env(home)
        env.pop("VIRTUAL_ENV", None)
        # Off PATH, so that only the README's own activation can put the CLI there.
        bin_dir = str(venv / "bin")
        env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != bin_dir)
        done = subprocess.run(
            ["bash", "-c", "\n".join(script)],
            cwd=clone,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=TOUR_TIMEOUT,
        )
    finally:
        server.stop()
    assert done.returncode == 0, done.stdout[-6000:]
    # Each line ran, and what the tour says it does happened.
    for command in tour:
        assert f"$ {command}" in done.stdout
    assert "Job fit-a-line SUCCEEDED" in done.stdout, done.stdout[-6000:]
    assert (clone / "a.csv").read_bytes() == (clone / "data" / "housing-00000.csv").read_bytes()
