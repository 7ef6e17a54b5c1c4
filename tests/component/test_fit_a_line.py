"""The fit_a_line example, run for real: 2 parameter servers and 2 trainers under the local supervisor.

The package is a copy of examples/fit_a_line with the data set make_data.py writes; the
job runs as `python train.py` exactly as a user's would. Also: the program run by hand,
and the parameter servers on their own, exiting once every trainer is done.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from paddlecloud.jobs.local.backend import free_ports
from paddlecloud.jobs.local.plan import HostPlan, Ports, WorkerPaths, build_plan
from support import plan_launch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fit_a_line"
DEADLINE = 60.0
LOSS_LINE = re.compile(r"^pass (\d+) trainer (\d+) loss (\S+)$", re.MULTILINE)
# What a worker may inherit from the test's environment; the rest of it stays out.
BASE_ENV = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}


def make_package(tmp_path: Path) -> Path:
    """A copy of the example with the default data set in `data/`, as a user would submit it."""
    package = tmp_path / "package"
    shutil.copytree(EXAMPLE, package, ignore=shutil.ignore_patterns("__pycache__", "data", "output"))
    subprocess.run([sys.executable, "make_data.py", "data"], cwd=package, check=True, capture_output=True)
    return package


def losses(log: str, trainer: int) -> list[float]:
    found = [(int(p), float(loss)) for p, t, loss in LOSS_LINE.findall(log) if int(t) == trainer]
    assert [p for p, _ in found] == list(range(len(found))), log
    return [loss for _, loss in found]


def data_set_loss(package: Path, model: dict[str, Any]) -> float:
    """The model's mean squared error on the whole data set, computed here from the CSV files."""
    norm = model["normalisation"]
    squares = []
    for path in sorted(package.glob("data/housing-*.csv")):
        with path.open(newline="") as f:
            rows = csv.reader(f)
            next(rows)
            for row in rows:
                *x, y = map(float, row)
                scaled = [(v - m) / s for v, m, s in zip(x, norm["mean"], norm["std"], strict=True)]
                guess = sum(w * v for w, v in zip(model["weights"], scaled, strict=True)) + model["bias"]
                squares.append((guess - y) ** 2)
    return math.fsum(squares) / len(squares)


def all_gone(processes: list[psutil.Process], timeout: float = 5.0) -> None:
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    assert alive == [], f"processes left behind: {alive}"


@dataclass
class Job:
    dir: Path
    output: Path
    package: Path
    proc: subprocess.Popen[bytes]
    seconds: float = 0.0

    def state(self) -> dict[str, Any]:
        return json.loads((self.dir / "state.json").read_text())

    def log(self, worker: str) -> str:
        return (self.dir / "logs" / f"{worker}.log").read_text()


@pytest.fixture
def job_runner(tmp_path: Path) -> Iterator[Any]:
    started: list[subprocess.Popen[bytes]] = []

    def run(*, trainers: int = 2, pservers: int = 2, passes: int = 10) -> Job:
        package = make_package(tmp_path)
        output = tmp_path / "output"  # not created: the program makes it
        job_dir = tmp_path / "job"
        job_dir.mkdir()
        ports = free_ports(pservers + trainers + 1)
        plan = build_plan(
            plan_launch(
                name="fit-a-line",
                entry=f"{sys.executable} train.py",
                trainers=trainers,
                pservers=pservers,
                passes=passes,
            ),
            HostPlan(
                paths=WorkerPaths(pfs_home=str(tmp_path / "home"), output=str(output), package=str(package)),
                ports=Ports.split(ports, pservers),
                grace_seconds=5.0,
                port_timeout_seconds=20.0,
            ),
        )
        (job_dir / "plan.json").write_text(json.dumps(plan.to_dict()))
        began = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "paddlecloud.jobs.local.supervisor", str(job_dir)],
            start_new_session=True,
        )
        started.append(proc)
        job = Job(dir=job_dir, output=output, package=package, proc=proc)
        # Everything the supervisor starts, seen while it runs, to check that none outlives it.
        watched = psutil.Process(proc.pid)
        seen: dict[int, psutil.Process] = {}
        while proc.poll() is None and time.monotonic() - began < DEADLINE:
            try:
                seen |= {p.pid: p for p in watched.children(recursive=True)}
            except psutil.NoSuchProcess:
                break
            time.sleep(0.02)
        proc.wait(timeout=max(1.0, DEADLINE - (time.monotonic() - began)))
        job.seconds = time.monotonic() - began
        all_gone(list(seen.values()))
        assert len(seen) >= 2 * (pservers + trainers), "the workers were never seen running"
        return job

    yield run
    for proc in started:  # a failed test must not leave its processes running
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_two_pservers_and_two_trainers_fit_the_line(job_runner: Any, report_figure: Any) -> None:
    job = job_runner(trainers=2, pservers=2, passes=10)
    state = job.state()
    logs = {w: job.log(w) for w in ("pserver-0", "pserver-1", "trainer-0", "trainer-1")}
    assert state["state"] == "SUCCEEDED", (state, logs)
    assert job.proc.returncode == 0
    # Trainers exited 0; the servers were stopped by the platform once they had.
    assert {w["name"]: w["state"] for w in state["workers"]} == {
        "pserver-0": "STOPPED",
        "pserver-1": "STOPPED",
        "trainer-0": "SUCCEEDED",
        "trainer-1": "SUCCEEDED",
    }

    # Each trainer learnt: a loss line per pass, falling by orders of magnitude, never rising.
    for trainer in (0, 1):
        curve = losses(logs[f"trainer-{trainer}"], trainer)
        assert len(curve) == 10, logs[f"trainer-{trainer}"]
        assert curve[-1] < curve[0] / 10, curve
        assert all(b <= a * 1.001 for a, b in itertools.pairwise(curve)), curve
        assert "1 of 2 trainers" not in logs[f"trainer-{trainer}"]
        assert f"trainer {trainer} of 2: 2048 of 4096 rows" in logs[f"trainer-{trainer}"]

    # Trainer 0 saved the model, and it is what it says it is.
    model = json.loads((job.output / "model.json").read_text())
    assert model["features"][0] == "CRIM" and len(model["weights"]) == 13
    assert all(math.isfinite(w) for w in [*model["weights"], model["bias"]])
    assert (model["trainers"], model["pservers"], model["passes"], model["rows"]) == (2, 2, 10, 4096)
    assert model["final_loss"] < model["threshold"] == 0.5
    assert data_set_loss(job.package, model) == pytest.approx(model["final_loss"], rel=1e-9)
    assert 20.0 < model["bias"] < 24.0  # the mean price, on normalised features
    # Both trainers trained the same model and say so.
    final = f"final loss {model['final_loss']:.6f}"
    assert final in logs["trainer-0"] and final in logs["trainer-1"]
    assert "saved the model" in logs["trainer-0"] and "saved the model" not in logs["trainer-1"]

    # Every parameter server held its own half of the parameters and served both trainers.
    assert "holding parameters 0..6 of 14" in logs["pserver-0"]
    assert "holding parameters 7..13 of 14" in logs["pserver-1"]
    for name in ("pserver-0", "pserver-1"):
        for trainer in (0, 1):
            assert f"serving trainer {trainer}" in logs[name], logs[name]
            assert f"trainer {trainer} done" in logs[name], logs[name]
        assert "all 2 trainers done after 640 rounds" in logs[name], logs[name]
        assert "stopped by SIGTERM" in logs[name], logs[name]
        assert "Traceback" not in logs[name]
    report_figure(
        f"fit_a_line, 2 pservers + 2 trainers: {job.seconds:.1f} s, "
        f"final loss {model['final_loss']:.4f} (threshold {model['threshold']:g})"
    )


def test_the_same_job_gives_the_same_model_every_time(job_runner: Any, tmp_path: Path) -> None:
    first = job_runner(trainers=2, pservers=2, passes=3)
    assert first.state()["state"] == "SUCCEEDED"
    model = json.loads((first.output / "model.json").read_text())
    shutil.rmtree(tmp_path / "job")
    shutil.rmtree(tmp_path / "package")
    shutil.rmtree(tmp_path / "output")
    second = job_runner(trainers=2, pservers=2, passes=3)
    assert second.state()["state"] == "SUCCEEDED"
    assert json.loads((second.output / "model.json").read_text()) == model


def test_more_pservers_and_uneven_shards_still_train(job_runner: Any) -> None:
    """3 trainers over 4 files: trainer 0 reads two, so it trains alone in its last rounds."""
    job = job_runner(trainers=3, pservers=3, passes=5)
    state = job.state()
    assert state["state"] == "SUCCEEDED", (state, job.log("trainer-0"), job.log("pserver-0"))
    assert "trainer 0 of 3: 2048 of 4096 rows" in job.log("trainer-0")
    assert "trainer 2 of 3: 1024 of 4096 rows" in job.log("trainer-2")
    assert "holding parameters 10..13 of 14" in job.log("pserver-2")
    model = json.loads((job.output / "model.json").read_text())
    assert model["final_loss"] < model["threshold"]


def test_run_by_hand_it_makes_the_data_trains_alone_and_saves(tmp_path: Path) -> None:
    package = tmp_path / "fit_a_line"
    shutil.copytree(EXAMPLE, package, ignore=shutil.ignore_patterns("__pycache__", "data", "output"))
    done = subprocess.run(
        [sys.executable, "train.py"],
        cwd=package,
        env=BASE_ENV,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no data in data/: making it with make_data.py" in done.stdout
    assert "trainer 0 of 1: 4096 of 4096 rows" in done.stdout
    assert "no parameter servers" in done.stdout
    curve = losses(done.stdout, 0)
    assert len(curve) == 10 and curve[-1] < curve[0] / 10
    model = json.loads((package / "output" / "model.json").read_text())
    assert (model["trainers"], model["pservers"]) == (1, 0)
    assert model["final_loss"] < model["threshold"]
    assert data_set_loss(package, model) == pytest.approx(model["final_loss"], rel=1e-9)


def test_a_loss_above_the_threshold_fails_the_trainer(tmp_path: Path) -> None:
    """One pass on data whose prices are not linear in the features: the loss stays high."""
    package = make_package(tmp_path)
    for path in package.glob("data/*.csv"):
        lines = path.read_text().splitlines()
        scrambled = [lines[0]]
        for i, line in enumerate(lines[1:]):
            *x, _ = line.split(",")
            scrambled.append(",".join([*x, str(10 + 30 * (i % 2))]))
        path.write_text("\n".join(scrambled) + "\n")
    done = subprocess.run(
        [sys.executable, "train.py"],
        cwd=package,
        env=BASE_ENV,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "NOT REACHED" in done.stdout
    assert (package / "output" / "model.json").exists()  # saved anyway, to look at


def test_pservers_run_by_hand_exit_0_once_every_trainer_is_done(tmp_path: Path) -> None:
    """Without a platform to stop them, the servers leave on their own after the last trainer."""
    package = make_package(tmp_path)
    ports = free_ports(2)
    endpoints = ",".join(f"127.0.0.1:{p}" for p in ports)
    common = BASE_ENV | {
        "PADDLE_JOB_NAME": "by-hand",
        "PADDLE_PSERVERS_IP_PORT_LIST": endpoints,
        "PSERVERS": "2",
        "TRAINERS": "2",
        "PADDLE_INIT_NUM_PASSES": "2",
        "PADDLE_CLOUD_OUTPUT": str(tmp_path / "output"),
        "FIT_A_LINE_PSERVER_LINGER": "0.2",
    }
    procs = []
    try:
        for port in ports:
            env = common | {"TRAINING_ROLE": "PSERVER", "PADDLE_CURRENT_ENDPOINT": f"127.0.0.1:{port}"}
            procs.append(_start(package, env))
        # The trainers start at once: they retry until the servers listen.
        for i in range(2):
            procs.append(_start(package, common | {"TRAINING_ROLE": "TRAINER", "TRAINER_ID": str(i)}))
        outputs = [p.communicate(timeout=DEADLINE)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outputs
    for server in outputs[:2]:
        assert "all 2 trainers done" in server and "exiting: every trainer is done" in server
    assert (tmp_path / "output" / "model.json").exists()


def test_a_pserver_exits_0_on_sigterm_while_it_waits_for_trainers(tmp_path: Path, report_figure: Any) -> None:
    package = make_package(tmp_path)
    (port,) = free_ports(1)
    env = BASE_ENV | {
        "PADDLE_JOB_NAME": "by-hand",
        "TRAINING_ROLE": "PSERVER",
        "PADDLE_PSERVERS_IP_PORT_LIST": f"127.0.0.1:{port}",
        "PADDLE_CURRENT_ENDPOINT": f"127.0.0.1:{port}",
        "PSERVERS": "1",
        "TRAINERS": "2",
    }
    server = _start(package, env)
    try:
        assert server.stdout is not None
        assert "listening on" in server.stdout.readline()
        # A trainer that connects and pushes, then waits for the round its peer never joins.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            _send(sock, {"op": "hello", "trainer": 0, "trainers": 2})
            assert len(_receive(sock)["params"]) == 14
            _send(sock, {"op": "push", "grad": [0.0] * 14})
            assert "serving trainer 0" in server.stdout.readline()
            began = time.monotonic()
            server.send_signal(signal.SIGTERM)
            out, _ = server.communicate(timeout=10)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 0, out
    report_figure(f"fit_a_line pserver waiting for a round: SIGTERM to exit {time.monotonic() - began:.2f} s")
    assert "stopped by SIGTERM after 0 rounds" in out


def test_a_pserver_refuses_a_trainer_of_another_job_shape(tmp_path: Path) -> None:
    package = make_package(tmp_path)
    (port,) = free_ports(1)
    env = BASE_ENV | {
        "PADDLE_JOB_NAME": "by-hand",
        "TRAINING_ROLE": "PSERVER",
        "PADDLE_PSERVERS_IP_PORT_LIST": f"127.0.0.1:{port}",
        "PADDLE_CURRENT_ENDPOINT": f"127.0.0.1:{port}",
        "PSERVERS": "1",
        "TRAINERS": "2",
    }
    server = _start(package, env)
    try:
        assert server.stdout is not None
        assert "listening on" in server.stdout.readline()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            _send(sock, {"op": "hello", "trainer": 1, "trainers": 3})
            assert "expects trainers 0..1 of 2, not trainer 1 of 3" in _receive(sock)["error"]
            assert sock.recv(1) == b""  # and it hung up
        server.send_signal(signal.SIGTERM)
        out, _ = server.communicate(timeout=10)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 0, out


def test_the_rounds_go_on_without_a_lost_trainer_and_take_it_back(tmp_path: Path) -> None:
    """The protocol, spoken by hand: rounds average the gradients of the trainers still there."""
    package = make_package(tmp_path)
    (port,) = free_ports(1)
    env = BASE_ENV | {
        "PADDLE_JOB_NAME": "by-hand",
        "TRAINING_ROLE": "PSERVER",
        "PADDLE_PSERVERS_IP_PORT_LIST": f"127.0.0.1:{port}",
        "PADDLE_CURRENT_ENDPOINT": f"127.0.0.1:{port}",
        "PSERVERS": "1",
        "TRAINERS": "2",
        "FIT_A_LINE_PSERVER_LINGER": "0.1",
    }
    server = _start(package, env)
    lr = 0.02  # train.py's LEARNING_RATE

    def hello(trainer: int) -> tuple[socket.socket, list[float]]:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        _send(sock, {"op": "hello", "trainer": trainer, "trainers": 2})
        return sock, _receive(sock)["params"]

    try:
        assert server.stdout is not None
        assert "listening on" in server.stdout.readline()
        a, start = hello(0)
        b, _ = hello(1)
        assert start == [0.0] * 14
        # Round 1: both push; the mean gradient is 2, so every parameter moves by -2 lr.
        _send(a, {"op": "push", "grad": [1.0] * 14})
        _send(b, {"op": "push", "grad": [3.0] * 14})
        after_one = [_receive(a)["params"], _receive(b)["params"]]
        assert after_one == [[-2 * lr] * 14] * 2
        # Trainer 1 crashes: round 2 is trainer 0's alone.
        b.close()
        _send(a, {"op": "push", "grad": [1.0] * 14})
        assert _receive(a)["params"] == pytest.approx([-3 * lr] * 14)
        # Restarted, it says hello again, gets the current parameters and joins the rounds.
        b, current = hello(1)
        assert current == pytest.approx([-3 * lr] * 14)
        _send(a, {"op": "push", "grad": [0.0] * 14})
        _send(b, {"op": "push", "grad": [2.0] * 14})
        assert _receive(a)["params"] == _receive(b)["params"] == pytest.approx([-4 * lr] * 14)
        # "done" answers only once both are done, with the final parameters.
        _send(a, {"op": "done"})
        _send(b, {"op": "done"})
        assert _receive(a)["params"] == _receive(b)["params"] == pytest.approx([-4 * lr] * 14)
        a.close()
        b.close()
        out, _ = server.communicate(timeout=10)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 0, out
    assert "lost trainer 1 before it was done" in out
    assert "all 2 trainers done after 3 rounds" in out
    assert "exiting: every trainer is done" in out


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    body = json.dumps(message).encode()
    sock.sendall(struct.pack(">I", len(body)) + body)


def _receive(sock: socket.socket) -> dict[str, Any]:
    head = sock.recv(4, socket.MSG_WAITALL)
    (length,) = struct.unpack(">I", head)
    return json.loads(sock.recv(length, socket.MSG_WAITALL))


def _start(package: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "train.py"],
        cwd=package,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
