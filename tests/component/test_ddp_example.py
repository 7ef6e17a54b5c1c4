"""The PyTorch DDP example, run for real: two trainers under the local supervisor, and by hand.

Skipped where PyTorch is not installed (it is not a dependency of PaddleCloud).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from paddlecloud.jobs.local.backend import free_ports
from paddlecloud.jobs.local.plan import HostPlan, Ports, WorkerPaths, build_plan
from support import plan_launch

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the DDP example cannot run here")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp"
DEADLINE = 120.0
LOSS_LINE = re.compile(r"^epoch (\d+) rank (\d+) loss (\S+)$", re.MULTILINE)


def losses(log: str, rank: int) -> list[float]:
    return [float(loss) for _, r, loss in LOSS_LINE.findall(log) if int(r) == rank]


def test_two_trainers_train_one_model_with_ddp(tmp_path: Path) -> None:
    package = tmp_path / "package"
    shutil.copytree(EXAMPLE, package, ignore=shutil.ignore_patterns("__pycache__", "output"))
    output = tmp_path / "output"
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    ports = free_ports(3)
    plan = build_plan(
        plan_launch(name="ddp", entry=f"{sys.executable} train.py", trainers=2, pservers=0, passes=5),
        HostPlan(
            paths=WorkerPaths(pfs_home=str(tmp_path / "home"), output=str(output), package=str(package)),
            ports=Ports.split(ports, 0),
            grace_seconds=5.0,
        ),
    )
    (job_dir / "plan.json").write_text(json.dumps(plan.to_dict()))
    proc = subprocess.Popen(
        [sys.executable, "-m", "paddlecloud.jobs.local.supervisor", str(job_dir)], start_new_session=True
    )
    try:
        proc.wait(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    logs = {r: (job_dir / "logs" / f"trainer-{r}.log").read_text() for r in (0, 1)}
    state = json.loads((job_dir / "state.json").read_text())
    assert state["state"] == "SUCCEEDED", (state, logs)
    for rank in (0, 1):
        assert f"rank {rank} of 2: 2048 of 4096 rows per epoch, 5 epochs" in logs[rank]
        curve = losses(logs[rank], rank)
        assert len(curve) == 5 and curve[-1] < curve[0] / 10, curve
    # The epoch losses are all-reduced, so both ranks print the same numbers.
    assert losses(logs[0], 0) == losses(logs[1], 1)
    model = json.loads((output / "model.json").read_text())
    assert model["world_size"] == 2 and model["final_loss"] < model["threshold"]
    state_dict = torch.load(output / "model.pt")
    assert state_dict["weight"].shape == (1, 8)
    assert "saved the model" not in logs[1]


def test_run_by_hand_it_is_rank_0_of_1(tmp_path: Path) -> None:
    package = tmp_path / "ddp"
    shutil.copytree(EXAMPLE, package, ignore=shutil.ignore_patterns("__pycache__", "output"))
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    done = subprocess.run(
        [sys.executable, "train.py"], cwd=package, env=env, capture_output=True, text=True, timeout=DEADLINE
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rank 0 of 1" in done.stdout
    assert json.loads((package / "output" / "model.json").read_text())["world_size"] == 1
