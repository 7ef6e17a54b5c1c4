"""The supervisor zygote: each job's supervisor forked from one process that has already
imported it, and what the jobs service relies on of those forks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from test_jobs_api import start_jobs

from paddlecloud.common import cgroups
from paddlecloud.jobs.local.backend import SUPERVISOR_MODULE
from paddlecloud.jobs.local.plan import CgroupPlan, HostPlan, Ports, WorkerPaths, build_plan
from support import plan_launch


def write_job(
    root: Path,
    entry: str,
    *,
    pservers: int = 0,
    psentry: str | None = None,
    ports: Sequence[int] = (),
    cgroups: CgroupPlan | None = None,
) -> Path:
    """A one-trainer job's directory with its plan, unsandboxed; the rest as given."""
    package, output, job_dir = root / "package", root / "output", root / "jobs" / "alice" / "job1"
    for directory in (package, output, job_dir):
        directory.mkdir(parents=True)
    plan = build_plan(
        plan_launch(name="zygote-test", entry=entry, psentry=psentry, pservers=pservers, passes=1),
        HostPlan(
            paths=WorkerPaths(pfs_home=str(root / "home"), output=str(output), package=str(package)),
            ports=Ports(tuple(ports), (0,), 0),
            cgroups=cgroups,
        ),
    )
    (job_dir / "plan.json").write_text(json.dumps(plan.to_dict()))
    return job_dir


def start_zygote(*options: str) -> subprocess.Popen[bytes]:
    """A zygote as the local backend starts one: its own session, answering on stdout."""
    return subprocess.Popen(
        [sys.executable, "-m", SUPERVISOR_MODULE, "--zygote", *options],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
        cwd="/",
    )


def state_of(job_dir: Path) -> dict[str, Any]:
    path = job_dir / "state.json"
    return json.loads(path.read_text()) if path.exists() else {}


def test_a_forked_supervisor_is_in_its_jobs_directory_at_once_and_outlives_the_zygote(tmp_path: Path) -> None:
    job_dir = write_job(tmp_path, "sleep 1")
    zygote = start_zygote()
    assert zygote.stdin is not None and zygote.stdout is not None
    try:
        zygote.stdin.write(os.fsencode(job_dir) + b"\n")
        zygote.stdin.flush()
        pid = int(zygote.stdout.readline())
        # Read before the fork has run a line of its own: the service tells a job's
        # supervisor from a reused pid by this directory, and may look this early.
        assert os.readlink(f"/proc/{pid}/cwd") == str(job_dir.resolve())
        deadline = time.monotonic() + 10
        while os.getsid(pid) != pid and time.monotonic() < deadline:
            time.sleep(0.01)
        assert os.getsid(pid) == pid  # its own session: the zygote's end is not its end
        # A directory that cannot be used is answered, and the zygote goes on.
        zygote.stdin.write(b"/nonexistent/job\n")
        zygote.stdin.flush()
        assert zygote.stdout.readline().startswith(b"error: cannot fork a supervisor: ")
        zygote.stdin.close()  # what a stopping jobs service does
        assert zygote.wait(timeout=10) == 0
        # The supervisor, its zygote gone, still writes its job's state to the end (it may
        # not have written RUNNING yet on a loaded machine: wait, never assume it did).
        deadline = time.monotonic() + 20
        while state_of(job_dir).get("state") in (None, "RUNNING") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert state_of(job_dir)["state"] == "SUCCEEDED", state_of(job_dir)
        assert state_of(job_dir)["supervisor_pid"] == pid
    finally:
        if zygote.poll() is None:
            zygote.kill()
            zygote.wait()


async def test_the_service_learns_of_a_jobs_changes_without_waiting_for_its_poll(
    tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any
) -> None:
    # A poll of a minute: only the supervisors' notifications can make these in time.
    jobs = await start_jobs(tmp_path, aiohttp_server, aiohttp_client, poll_seconds=60.0)
    package = jobs.package({"train.py": "import time\ntime.sleep(0.5)\nprint('done')\n"})
    await jobs.submit({"name": "told", "package": package})
    running = await jobs.wait("told", ("RUNNING", "SUCCEEDED", "FAILED"), timeout=15)
    assert running["state"] == "RUNNING", running
    done = await jobs.wait("told", ("SUCCEEDED", "FAILED"), timeout=15)
    assert done["state"] == "SUCCEEDED", done
    assert "[trainer-0] done" in await jobs.logs("told")


def test_the_cgroup_the_zygote_moves_itself_into_is_the_one_it_is_in() -> None:
    # The no-op move that keeps cgroup moves quick must name the process's own group:
    # another would move the zygote (and every supervisor it forks after) elsewhere. A
    # process in a group of its own (joined through the worker launcher) must find it.
    hierarchy = cgroups.detect()
    if hierarchy is None:
        pytest.skip("this process cannot make cgroups here")
    relative = f"zygote-test-{os.getpid()}"
    groups = hierarchy.create(relative, cgroups.Limits())
    code = (
        "import os, sys\n"
        "from paddlecloud.jobs.local.supervisor import own_cgroup_procs\n"
        "procs = own_cgroup_procs()\n"
        "print(procs)\n"
        "sys.exit(0 if str(os.getpid()) in procs.read_text().split() else 1)\n"
    )
    joins = [arg for group in groups for arg in ("--cgroup", str(group))]
    launch = [sys.executable, "-m", "paddlecloud.jobs.local.launch", str(os.getpid()), *joins, "--"]
    try:
        done = subprocess.run(
            [*launch, sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    finally:
        hierarchy.remove(relative)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert relative in done.stdout


def test_the_groups_the_zygote_makes_for_workers_that_never_start_are_removed(tmp_path: Path) -> None:
    # The zygote makes every worker's group before it forks the supervisor. Here the
    # parameter server fails at once, so the trainer never starts: its group must not be
    # left behind, nor the job's level above it.
    hierarchy = cgroups.detect()
    if hierarchy is None:
        pytest.skip("this process cannot make cgroups here")
    job = f"zygote-test-{os.getpid()}"
    limits = CgroupPlan(hierarchy.version, str(hierarchy.root), hierarchy.parent, job, 64)
    job_dir = write_job(
        tmp_path,
        "sleep 30",
        psentry="exit 3",
        pservers=1,
        ports=[0],
        cgroups=limits,
    )
    zygote = start_zygote("--warm-cgroup-moves")
    assert zygote.stdin is not None and zygote.stdout is not None
    try:
        zygote.stdin.write(os.fsencode(job_dir) + b"\n")
        zygote.stdin.flush()
        assert zygote.stdout.readline().strip().isdigit()
        deadline = time.monotonic() + 20
        while state_of(job_dir).get("finished_at") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        final = state_of(job_dir)
        assert final["state"] == "FAILED", final
        assert [w["name"] for w in final["workers"] if w["pid"] is not None] == ["pserver-0"]
        left = [str(group) for group in hierarchy.groups(job) if group.exists()]
        assert left == [], f"cgroups left behind: {left}"
    finally:
        zygote.stdin.close()
        zygote.wait(timeout=10)
