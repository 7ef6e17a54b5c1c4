"""The SDK's `paddlecloud.metrics.log`: the lines it writes, what it refuses, and that it
needs nothing beyond the standard library (docs/metrics.md §2.1)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import paddlecloud.metrics as metrics

PROGRAM = """
import paddlecloud.metrics as m
for i in range(3):
    m.log(loss=1.0 / (i + 1))
m.log(step=10, loss=0.1, acc=0.9)
"""


def _run(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # A `paddlecloud` package holding only the SDK, in an interpreter started without
    # site-packages (-S) or the environment's paths (-I): what a job's bare Python has.
    package = tmp_path / "sdk" / "paddlecloud"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    shutil.copy(metrics.__file__, package / "metrics.py")
    code = f"import sys; sys.path.insert(0, {str(package.parent)!r})\n" + PROGRAM
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", code],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_worker_appends_one_line_per_call_to_its_own_file(tmp_path: Path) -> None:
    env = {"PADDLE_CLOUD_OUTPUT": str(tmp_path / "out"), "TRAINING_ROLE": "TRAINER", "TRAINER_ID": "1"}
    done = _run(tmp_path, env)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in (tmp_path / "out/metrics/trainer-1.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1, 2, 10]
    assert lines[1]["scalars"] == {"loss": 0.5}
    assert lines[3]["scalars"] == {"loss": 0.1, "acc": 0.9}
    assert all(isinstance(line["time"], float) for line in lines)


def test_outside_the_platform_it_writes_beside_the_program(tmp_path: Path) -> None:
    done = _run(tmp_path, {})
    assert done.returncode == 0, done.stderr
    assert len((tmp_path / "paddlecloud-metrics/local.jsonl").read_text().splitlines()) == 4


@pytest.mark.parametrize(
    ("step", "scalars", "message"),
    [
        (None, {}, "at least one scalar"),
        (None, {"loss": float("nan")}, "'loss' must be a finite number"),
        (None, {"loss": "0.5"}, "'loss' must be a finite number"),
        (None, {"ok": True}, "'ok' must be a finite number"),
        (-1, {"loss": 1.0}, "step must be a non-negative int"),
        (1.5, {"loss": 1.0}, "step must be a non-negative int"),
    ],
)
def test_bad_values_are_refused_at_the_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: object, scalars: dict[str, object], message: str
) -> None:
    monkeypatch.setenv("PADDLE_CLOUD_OUTPUT", str(tmp_path))
    with pytest.raises(ValueError, match=message):
        metrics.log(step=step, **scalars)  # type: ignore[arg-type]
    assert not (tmp_path / "metrics").exists() or not any((tmp_path / "metrics").iterdir())
