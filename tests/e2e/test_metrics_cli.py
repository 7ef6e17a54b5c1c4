"""`paddlecloud metrics` against a real `paddlecloud server` (issue 34's acceptance for training curves):
a job that logs 50 steps of loss with the SDK, in its own Python and with nothing installed,
shows 50 points while it runs and after it ended, as JSON, CSV and a table."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest
from test_jobs_cli import as_json, ok, one_error_line, run_cli, wait_for_state

pytestmark = pytest.mark.slow

# No requirements.txt: the job installs nothing, and imports the SDK from the job's Python.
TRAIN_PY = """\
import os, time
import paddlecloud.metrics

for step in range(50):
    paddlecloud.metrics.log(step=step, loss=2.0 / (step + 1))
path = paddlecloud.metrics.metrics_path()
with open(path, "a") as f:
    f.write("a line that is no JSON\\n")
print("logged 50 steps to", path, flush=True)
time.sleep(600)  # running until killed: the curves are read while the job runs
"""


def points(server: Any, name: str) -> dict[str, Any]:
    return as_json(run_cli(server, "-o", "json", "metrics", name))


def test_a_job_that_logs_50_steps_shows_50_points_live_and_after_it_ended(
    server_factory: Any, tmp_path: Path
) -> None:
    server = server_factory()
    package = tmp_path / "curves"
    package.mkdir()
    (package / "train.py").write_text(TRAIN_PY)
    ok(run_cli(server, "submit", "--name", "curves", str(package)))
    wait_for_state(server, "curves", ("RUNNING",))

    deadline = time.monotonic() + 120
    while True:  # the job logs at its own pace: read until its 50 points are on PFS
        answer = points(server, "curves")
        if answer["series"] and len(answer["series"][0]["step"]) == 50:
            break
        assert time.monotonic() < deadline, answer
        time.sleep(0.5)
    assert as_json(run_cli(server, "-o", "json", "get", "job", "curves"))["state"] == "RUNNING"
    (series,) = answer["series"]
    assert (series["worker"], series["source"], series["tag"]) == ("trainer-0", "sdk", "loss")
    assert series["step"] == list(range(50))
    assert series["value"] == [2.0 / (s + 1) for s in range(50)]
    assert answer["warnings"] == ["metrics/trainer-0.jsonl: 1 malformed records skipped"]

    ok(run_cli(server, "kill", "curves"))
    wait_for_state(server, "curves", ("KILLED",))
    assert points(server, "curves")["series"] == answer["series"]

    result = run_cli(server, "-o", "csv", "metrics", "curves")
    rows = list(csv.reader(io.StringIO(ok(result))))
    assert rows[0] == ["worker", "source", "tag", "step", "wall_time", "value"]
    assert len(rows) == 51
    assert [int(r[3]) for r in rows[1:]] == list(range(50))
    assert rows[50][:3] == ["trainer-0", "sdk", "loss"] and float(rows[50][5]) == 2.0 / 50
    # The reader's warning goes to stderr, never into the CSV.
    assert (
        result.stderr.strip() == "paddlecloud: warning: metrics/trainer-0.jsonl: 1 malformed records skipped"
    )

    table = ok(run_cli(server, "metrics", "curves")).splitlines()
    assert table[0].split() == ["WORKER", "SOURCE", "TAG", "POINTS", "LAST", "STEP", "LAST", "VALUE"]
    assert table[1].split() == ["trainer-0", "sdk", "loss", "50", "49", "0.04"]
    assert json.loads(ok(run_cli(server, "-o", "json", "metrics", "curves", "--tag", "acc")))["series"] == []

    # Mistakes: one line and a non-zero exit.
    assert "no job named 'nosuch'" in one_error_line(run_cli(server, "metrics", "nosuch"))
    assert "tag: a tag is 1 to 256 characters" in one_error_line(
        run_cli(server, "metrics", "curves", "--tag", "")
    )
    assert "-o csv is only for" in one_error_line(run_cli(server, "-o", "csv", "get", "jobs"), code=2)
