"""Real PaddlePaddle through `paddlecloud server` and the CLI: both examples built, run, checked.

The builder's pip installs each example's `requirements.txt` from a wheel directory kept
between runs in `~/.cache/paddlecloud-tests/wheels/<example>` (PADDLECLOUD_TEST_CACHE
moves it): the first run on a machine downloads the wheels there (about 200 MB for
Paddle), later runs install from it with no network. Nothing of it is in the repository.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_jobs_cli import as_json, ok, run_cli
from test_readme_tour import paddle_line

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# Far above what the examples reach (about 0.01 and 0.0001), far below where they start.
COLLECTIVE_THRESHOLD = 0.02
PS_THRESHOLD = 0.001


def wheelhouse(example: str) -> Path:
    """A directory with every wheel the example's requirements need, downloaded once."""
    requirements = EXAMPLES / example / "requirements.txt"
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()[:12]
    cache = Path(os.environ.get("PADDLECLOUD_TEST_CACHE", Path.home() / ".cache" / "paddlecloud-tests"))
    target = cache / "wheels" / f"{example}-{digest}"
    if (target / ".complete").exists():
        return target
    # Downloaded beside it under a name of this process's own, then renamed into place:
    # two runs at once do not mix their files, and a cut-off download is never taken.
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "-r", str(requirements), "-d", str(partial)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"cannot download the wheels of {example}: {done.stderr[-2000:]}"
    (partial / ".complete").write_text("")
    try:
        partial.rename(target)
    except OSError:  # another run finished first (or left an incomplete one): use a whole one
        if not (target / ".complete").exists():
            shutil.rmtree(target)
            partial.rename(target)
        else:
            shutil.rmtree(partial)
    return target


def start(server_factory: Any, tmp_path: Path, example: str) -> Any:
    config = tmp_path / "paddlecloud.yaml"
    builder = {"find_links": [str(wheelhouse(example))], "no_index": True}
    config.write_text(json.dumps({"builder": builder}))  # JSON is YAML
    return server_factory("--server-config", str(config))


def final_loss(log: str) -> float:
    lines = [line for line in log.splitlines() if line.startswith("[trainer-0] final loss ")]
    assert lines, log
    return float(lines[-1].split()[3])


def test_paddle_collective_runs_unchanged_with_two_trainers(server_factory: Any, tmp_path: Path) -> None:
    server = start(server_factory, tmp_path, "paddle_collective")
    package = tmp_path / "examples" / "paddle_collective"
    shutil.copytree(EXAMPLES / "paddle_collective", package, ignore=shutil.ignore_patterns("output"))
    # The README tour's own line (tests/e2e/test_readme_tour.py runs the rest of the tour).
    prog, *args = shlex.split(paddle_line(), comments=True)
    assert prog == "paddlecloud" and "-jobname" in args, args
    name = args[args.index("-jobname") + 1]
    out = ok(run_cli(server, *args, cwd=tmp_path))
    assert f"Job {name} SUCCEEDED" in out, out
    job = as_json(run_cli(server, "-o", "json", "get", "job", name))
    assert job["state"] == "SUCCEEDED", job["reason"]
    assert [e["state"] for e in job["events"] if e["type"] == "state"] == [
        "PENDING",
        "BUILDING",
        "RUNNING",
        "SUCCEEDED",
    ]
    logs = ok(run_cli(server, "logs", name))
    assert "[trainer-0] trainer 0 of 2 on cpu (backend gloo)" in logs
    assert "[trainer-1] trainer 1 of 2 on cpu (backend gloo)" in logs
    assert final_loss(logs) < COLLECTIVE_THRESHOLD, logs
    # -n counts per worker, the build's log one more.
    tail = ok(run_cli(server, "logs", "-n", "2", name)).splitlines()
    assert len(tail) <= 3 * 2 and sum(line.startswith("[build] ") for line in tail) == 2, tail


def test_paddle_ps_geo_sgd_with_two_pservers_learns_and_its_servers_show_stopped(
    server_factory: Any, tmp_path: Path
) -> None:
    server = start(server_factory, tmp_path, "paddle_ps")
    package = tmp_path / "paddle_ps"
    shutil.copytree(EXAMPLES / "paddle_ps", package, ignore=shutil.ignore_patterns("output"))
    submit = ["submit", "-f", "-jobname", "ps", "-parallelism", "2", "-pservers", "2", str(package)]
    out = ok(run_cli(server, *submit))
    assert "Job ps SUCCEEDED" in out, out
    job = as_json(run_cli(server, "-o", "json", "get", "job", "ps"))
    assert job["state"] == "SUCCEEDED", job["reason"]
    logs = ok(run_cli(server, "logs", "ps"))
    assert "[pserver-1] pserver 1 of 2 serving" in logs
    assert "[trainer-1] trainer 1 of 2, 2 parameter servers" in logs
    assert final_loss(logs) < PS_THRESHOLD, logs
    # Paddle's servers never exit by themselves: the platform stopped them, and says so.
    states = {w["name"]: w["state"] for w in job["workers"]}
    assert states == {
        "pserver-0": "STOPPED",
        "pserver-1": "STOPPED",
        "trainer-0": "SUCCEEDED",
        "trainer-1": "SUCCEEDED",
    }
    stopped = sorted(e["message"] for e in job["events"] if e["reason"] == "WorkerStopped")
    assert [m.split(" (")[0] for m in stopped] == [
        f"pserver-{i} stopped by the platform: every trainer exited 0" for i in range(2)
    ]
    table = ok(run_cli(server, "get", "workers", "ps"))
    assert [line.split()[3] for line in table.splitlines() if line.startswith("pserver-")] == ["STOPPED"] * 2
