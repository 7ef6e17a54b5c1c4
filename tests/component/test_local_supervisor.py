"""The local backend's job supervisor, run as a real process over real worker processes.

Every worker runs `main.py` of a package the test writes: parameter servers listen on
$PADDLE_PORT (and keep a helper child in their group), trainers connect to every server,
record the environment they saw and then behave as $TEST_MODE says.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest

from paddlecloud.common import sandbox
from paddlecloud.common.sandbox import Bind
from paddlecloud.jobs.contract import PYTORCH_ENV, RESERVED_ENV
from paddlecloud.jobs.local.backend import free_ports
from paddlecloud.jobs.local.plan import HostPlan, Plan, Ports, SandboxPlan, WorkerPaths, build_plan
from support import plan_launch

GRACE = 1.0
DEADLINE = 30.0

MAIN = textwrap.dedent(
    """
    import json, os, signal, socket, subprocess, sys, time
    from pathlib import Path

    out = Path(os.environ["PADDLE_CLOUD_OUTPUT"])
    mode = os.environ.get("TEST_MODE", "ok")
    role = os.environ["TRAINING_ROLE"]
    index = os.environ["TRAINER_ID"]

    def note_pid(kind, pid):
        with open(out / "pids", "a") as f:
            f.write(f"{kind} {pid}\\n")

    def record(name):
        seen = {"env": dict(os.environ), "cwd": os.getcwd(),
                "trainer_id": Path("trainer_id").read_text(),
                "trainer_count": Path("trainer_count").read_text(),
                "package_file": Path("data.txt").read_text()}
        (out / name).write_text(json.dumps(seen))

    note_pid("worker", os.getpid())
    if role == "PSERVER":
        if mode == "silent_pserver" and index == "1":
            time.sleep(600)
        if mode == "stubborn_pserver":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        note_pid("helper", helper.pid)
        server = socket.create_server(("127.0.0.1", int(os.environ["PADDLE_PORT"])))
        record(f"pserver-{index}.json")
        print(f"pserver {index} listening", flush=True)
        while True:
            conn, _ = server.accept()
            conn.close()

    for endpoint in os.environ["PADDLE_PSERVERS_IP_PORT_LIST"].split(","):
        host, port = endpoint.split(":")
        socket.create_connection((host, int(port)), timeout=5).close()
    runs = sorted(out.glob(f"trainer-{index}.run*.json"))
    record(f"trainer-{index}.run{len(runs)}.json")
    print(f"trainer {index} run {len(runs)} connected", flush=True)
    if mode == "fail" and index == "1":
        sys.exit(1)
    if mode == "oom" and index == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "flaky" and index == "1" and not runs:
        sys.exit(3)
    if mode == "hang":
        (out / f"trainer-{index}.started").touch()
        time.sleep(600)
    """
)


@dataclass
class Job:
    dir: Path
    output: Path
    plan: Plan
    proc: subprocess.Popen[bytes]

    def wait(self, timeout: float = DEADLINE) -> int:
        return self.proc.wait(timeout=timeout)

    def state(self) -> dict[str, Any]:
        return json.loads((self.dir / "state.json").read_text())

    def worker(self, name: str) -> dict[str, Any]:
        return next(w for w in self.state()["workers"] if w["name"] == name)

    def pids(self, kind: str | None = None) -> list[int]:
        path = self.output / "pids"
        lines = path.read_text().split() if path.exists() else []
        pairs = zip(lines[::2], lines[1::2], strict=True)
        return [int(pid) for k, pid in pairs if kind is None or k == kind]

    def seen(self, name: str) -> dict[str, Any]:
        return json.loads((self.output / name).read_text())

    def log(self, worker: str) -> str:
        return (self.dir / "logs" / f"{worker}.log").read_text()

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (self.dir / "events.jsonl").read_text().splitlines()]


def wait_until(condition: Callable[[], bool], timeout: float = DEADLINE, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not reached within {timeout} s")
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_all_gone(pids: list[int], timeout: float = 20.0) -> None:
    assert pids, "the workers recorded no pids"
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if alive(p)] == []


@pytest.fixture
def start_job(tmp_path: Path) -> Iterator[Callable[..., Job]]:
    started: list[Job] = []

    def start(
        mode: str = "ok",
        *,
        trainers: int = 2,
        pservers: int = 2,
        max_restarts: int = 0,
        port_timeout: float = 20.0,
    ) -> Job:
        package = tmp_path / "package"
        package.mkdir()
        (package / "main.py").write_text(MAIN)
        (package / "data.txt").write_text("shared package file")
        output = tmp_path / "output"
        output.mkdir()
        job_dir = tmp_path / "job"
        job_dir.mkdir()
        ports = free_ports(pservers + trainers + 1)
        plan = build_plan(
            plan_launch(
                entry=f"{sys.executable} main.py",
                trainers=trainers,
                pservers=pservers,
                passes=3,
                env={"TEST_MODE": mode},
                max_restarts=max_restarts,
            ),
            HostPlan(
                paths=WorkerPaths(pfs_home=str(tmp_path / "home"), output=str(output), package=str(package)),
                ports=Ports.split(ports, pservers),
                grace_seconds=GRACE,
                port_timeout_seconds=port_timeout,
                restart_delay_seconds=0.05,
            ),
        )
        (job_dir / "plan.json").write_text(json.dumps(plan.to_dict()))
        proc = subprocess.Popen(
            [sys.executable, "-m", "paddlecloud.jobs.local.supervisor", str(job_dir)],
            start_new_session=True,
        )
        job = Job(dir=job_dir, output=output, plan=plan, proc=proc)
        started.append(job)
        return job

    yield start
    for job in started:  # a failed test must not leave its processes running
        if job.proc.poll() is None:
            job.proc.kill()
            job.proc.wait()
        for pid in job.pids():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_job_whose_trainers_exit_0_succeeds_and_stops_its_pservers(start_job: Callable[..., Job]) -> None:
    job = start_job()
    assert job.wait() == 0
    state = job.state()
    assert state["state"] == "SUCCEEDED", state
    assert state["finished_at"] and state["started_at"]
    assert state["supervisor_pid"] == job.proc.pid
    workers = {w["name"]: w for w in state["workers"]}
    # Servers do not end by themselves: the platform stopped them, and says so (issue 27).
    assert {n: w["state"] for n, w in workers.items()} == {
        "pserver-0": "STOPPED",
        "pserver-1": "STOPPED",
        "trainer-0": "SUCCEEDED",
        "trainer-1": "SUCCEEDED",
    }
    assert all(w["host"] == "127.0.0.1" and w["restarts"] == 0 for w in workers.values())
    assert workers["trainer-1"]["exit_code"] == 0
    assert workers["pserver-0"]["exit_code"] is not None
    stopped = [e["message"] for e in job.events() if e["reason"] == "WorkerStopped"]
    assert sorted(stopped) == [
        f"pserver-{i} stopped by the platform: every trainer exited 0 "
        f"(it exited with {workers[f'pserver-{i}']['exit_code']})"
        for i in range(2)
    ]
    # pservers and the helper each one left in its process group
    assert len(job.pids("helper")) == 2
    assert_all_gone(job.pids())
    assert "pserver 0 listening" in job.log("pserver-0")
    assert "trainer 1 run 0 connected" in job.log("trainer-1")
    reasons = [e["reason"] for e in job.events()]
    assert reasons[0] == "JobRunning" and reasons[-1] == "JobSucceeded"
    assert "PserversReady" in reasons


def test_every_worker_sees_the_whole_runtime_contract(start_job: Callable[..., Job]) -> None:
    job = start_job()
    assert job.wait() == 0
    for planned in job.plan.workers:
        name = f"{planned.name}.json" if planned.role.value == "PSERVER" else f"{planned.name}.run0.json"
        seen = job.seen(name)
        env = seen["env"]
        expected = RESERVED_ENV if planned.role.value == "TRAINER" else RESERVED_ENV - set(PYTORCH_ENV)
        assert {k: env.get(k) for k in expected} == {k: planned.env[k] for k in expected}
        assert env["TEST_MODE"] == "ok"
        assert env["TRAINER_ID"] == str(planned.index)
        assert env["PADDLE_PSERVERS_IP_PORT_LIST"] == ",".join(
            f"127.0.0.1:{w.port}" for w in job.plan.pservers
        )
        # its own working directory, mirroring the package, with its own id files
        assert Path(seen["cwd"]) == job.dir / "work" / planned.name
        assert seen["trainer_id"].strip() == str(planned.index)
        assert seen["trainer_count"].strip() == "2"
        assert seen["package_file"] == "shared package file"
        # nothing of the supervisor's own environment beyond the basics
        assert "PYTEST_CURRENT_TEST" not in env


def test_a_trainer_that_exits_1_fails_the_job(start_job: Callable[..., Job]) -> None:
    job = start_job("fail")
    assert job.wait() == 1
    state = job.state()
    assert state["state"] == "FAILED"
    assert state["reason"] == "trainer-1 exited with 1 after 0 restarts"
    assert job.worker("trainer-1")["state"] == "FAILED"
    assert job.worker("trainer-1")["exit_code"] == 1
    assert job.worker("pserver-0")["state"] == "KILLED"
    assert_all_gone(job.pids())


def test_a_trainer_killed_by_sigkill_is_reported_as_out_of_memory(start_job: Callable[..., Job]) -> None:
    job = start_job("oom", pservers=1)
    assert job.wait() == 1
    state = job.state()
    assert state["state"] == "FAILED"
    assert "trainer-1 exited with 137" in state["reason"]
    assert "out of memory" in state["reason"]
    assert_all_gone(job.pids())


def test_a_failed_trainer_is_restarted_with_the_same_id(start_job: Callable[..., Job]) -> None:
    job = start_job("flaky", max_restarts=1)
    assert job.wait() == 0
    assert job.state()["state"] == "SUCCEEDED"
    trainer = job.worker("trainer-1")
    assert trainer["restarts"] == 1
    assert job.worker("trainer-0")["restarts"] == 0
    runs = [job.seen("trainer-1.run0.json"), job.seen("trainer-1.run1.json")]
    assert [r["env"]["TRAINER_ID"] for r in runs] == ["1", "1"]
    assert [r["trainer_id"].strip() for r in runs] == ["1", "1"]
    log = job.log("trainer-1")
    assert "--- restart 1 of 1 after exit 3 ---" in log
    assert log.index("run 0") < log.index("--- restart 1 of 1") < log.index("run 1")
    assert "WorkerRestarting" in [e["reason"] for e in job.events()]
    assert_all_gone(job.pids())


def test_sigterm_to_the_supervisor_kills_the_job(start_job: Callable[..., Job]) -> None:
    job = start_job("hang")
    wait_until(
        lambda: all((job.output / f"trainer-{i}.started").exists() for i in range(2)),
        what="both trainers running",
    )
    assert job.state()["state"] == "RUNNING"
    job.proc.send_signal(signal.SIGTERM)
    assert job.wait(timeout=GRACE + 10) == 1
    state = job.state()
    assert state["state"] == "KILLED"
    assert {w["state"] for w in state["workers"]} == {"KILLED"}
    assert_all_gone(job.pids())


def test_a_pserver_ignoring_sigterm_is_sigkilled_after_the_grace(start_job: Callable[..., Job]) -> None:
    job = start_job("stubborn_pserver")
    assert job.wait() == 0
    # The supervisor only exits once every worker is gone, SIGKILL included.
    assert job.state()["state"] == "SUCCEEDED"
    assert_all_gone(job.pids(), timeout=0.5)
    events = job.events()
    killed = [e["message"] for e in events if e["reason"] == "WorkerKilled"]
    assert sorted(killed) == [f"pserver-{i} ignored SIGTERM for {GRACE:g} s: SIGKILL" for i in range(2)]
    ended = [e["time"] for e in events if e["reason"] == "WorkerSucceeded"][-1]  # the last trainer
    finished = job.state()["finished_at"]
    assert finished > ended  # sanity: ISO-8601 UTC strings order by time
    assert _seconds_between(ended, finished) >= GRACE * 0.9, "the stubborn pserver was not given its grace"


def test_a_pserver_that_never_listens_fails_the_job(start_job: Callable[..., Job]) -> None:
    job = start_job("silent_pserver", port_timeout=1.5)
    assert job.wait() == 1
    state = job.state()
    assert state["state"] == "FAILED"
    assert state["reason"].startswith("pserver-1 did not accept connections on 127.0.0.1:")
    assert "within 1.5 s" in state["reason"]
    assert {w["state"] for w in state["workers"] if w["role"] == "TRAINER"} == {"PENDING"}
    assert not list(job.output.glob("trainer-*.json")), "trainers started before every pserver was ready"
    assert_all_gone(job.pids())


def test_a_sigkilled_supervisor_takes_its_workers_down(start_job: Callable[..., Job]) -> None:
    job = start_job("hang", pservers=1)
    wait_until(
        lambda: all((job.output / f"trainer-{i}.started").exists() for i in range(2)),
        what="both trainers running",
    )
    job.proc.kill()
    job.proc.wait()
    # The launchers learn of it from PR_SET_PDEATHSIG and kill their groups, helpers included.
    assert len(job.pids("helper")) == 1
    assert_all_gone(job.pids())


def _seconds_between(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def test_an_unreadable_plan_is_recorded_as_a_failed_job(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(json.dumps({"workers": []}))
    done = subprocess.run(
        [sys.executable, "-m", "paddlecloud.jobs.local.supervisor", str(tmp_path)], timeout=DEADLINE
    )
    assert done.returncode == 2
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["state"] == "FAILED"
    assert state["reason"] == "plan.json lacks the field 'job_name'"


# A sandboxed parameter server that takes its time over SIGTERM (or ignores it), and a
# trainer that exits 0 as soon as it starts, which is when the server accepts.
STOPPING = textwrap.dedent(
    """
    import os, signal, socket, sys, time

    def stop(signum, frame):
        time.sleep(0.2)  # what a real server does first (closing, saving): the race made wide
        print("pserver stopped by SIGTERM", flush=True)
        sys.exit(0)

    if os.environ["TRAINING_ROLE"] == "PSERVER":
        ignore = os.environ["TEST_MODE"] == "stubborn_pserver"
        signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore else stop)
        server = socket.create_server(("127.0.0.1", int(os.environ["PADDLE_PORT"])))
        print("pserver listening", flush=True)
        while True:
            server.accept()[0].close()
    print("trainer done", flush=True)
    """
)

needs_bwrap = pytest.mark.skipif(sandbox.detect("auto", "jobs").bwrap is None, reason="no bwrap here")


def run_sandboxed_job(tmp_path: Path, mode: str) -> tuple[Job, list[psutil.Process]]:
    """Run a one-server, one-trainer job of STOPPING in bwrap to its end; the job and every
    process seen below its supervisor while it ran (sandboxed workers' own pids are their
    PID namespace's, so they cannot note them as MAIN's do)."""
    home = tmp_path / "home"  # seen as the user's PFS home, where the package and output are
    package, output, job_dir = home / "package", home / "output", tmp_path / "job"
    for directory in (package, output, job_dir):
        directory.mkdir(parents=True)
    (package / "main.py").write_text(STOPPING)
    seen_home = "/pfs/dc1/home/alice"
    ports = free_ports(3)
    plan = build_plan(
        plan_launch(entry="python main.py", trainers=1, pservers=1, passes=1, env={"TEST_MODE": mode}),
        HostPlan(
            paths=WorkerPaths(
                pfs_home=seen_home, output=f"{seen_home}/output", package=f"{seen_home}/package"
            ),
            ports=Ports.split(ports, 1),
            grace_seconds=GRACE,
            sandbox=SandboxPlan(
                uid=os.geteuid(),
                gid=os.getegid(),
                binds=(Bind(str(home), seen_home, writable=True),),
                package_host=str(package),
            ),
        ),
    )
    (job_dir / "plan.json").write_text(json.dumps(plan.to_dict()))
    proc = subprocess.Popen(
        [sys.executable, "-m", "paddlecloud.jobs.local.supervisor", str(job_dir)], start_new_session=True
    )
    try:
        watched, seen = psutil.Process(proc.pid), {}
        while proc.poll() is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                seen |= {p.pid: p for p in watched.children(recursive=True)}
            time.sleep(0.02)
    finally:
        if proc.poll() is None:  # a failed test must not leave its processes running
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=DEADLINE)
    # At least the server's launcher, bwrap, bwrap's PID 1, the shell and the program.
    assert len(seen) >= 5, f"the workers were never seen running: {seen}"
    return Job(dir=job_dir, output=output, plan=plan, proc=proc), list(seen.values())


@needs_bwrap
def test_a_sandboxed_pserver_stopped_by_sigterm_has_its_last_line_logged(tmp_path: Path) -> None:
    # bwrap's own process, in the worker's group, dies of the stop's SIGTERM at once; with
    # --die-with-parent that took the sandbox down, the server in the middle of its handler.
    job, processes = run_sandboxed_job(tmp_path, "ok")
    assert job.proc.returncode == 0
    assert job.state()["state"] == "SUCCEEDED", job.state()
    assert "trainer done" in job.log("trainer-0")
    assert "pserver listening" in job.log("pserver-0")
    assert "pserver stopped by SIGTERM" in job.log("pserver-0"), job.log("pserver-0")
    assert [e for e in job.events() if e["reason"] == "WorkerKilled"] == []
    assert_all_gone([p.pid for p in processes])


@needs_bwrap
def test_a_sandboxed_pserver_ignoring_sigterm_is_sigkilled_after_the_grace(tmp_path: Path) -> None:
    job, processes = run_sandboxed_job(tmp_path, "stubborn_pserver")
    assert job.proc.returncode == 0
    assert job.state()["state"] == "SUCCEEDED", job.state()
    killed = [e["message"] for e in job.events() if e["reason"] == "WorkerKilled"]
    assert killed == [f"pserver-0 ignored SIGTERM for {GRACE:g} s: SIGKILL"]
    assert_all_gone([p.pid for p in processes])
