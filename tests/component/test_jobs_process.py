"""The jobs service as a real process: jobs outlive it, and a restarted service records their end."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from paddlecloud.common.store import User, open_store
from support import ServiceProcess, signed, wait_until, write_config


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceProcess]:
    config = write_config(tmp_path, pfs={"datacenter": "dc1"}, jobs={"poll_seconds": 0.05})
    process = ServiceProcess("jobs", config, tmp_path)
    process.start()
    try:
        yield process
    finally:
        process.stop()


async def call(service: ServiceProcess, method: str, path_qs: str, **kwargs: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        url = f"{service.url}{path_qs}"
        async with session.request(method, url, headers=signed(method, path_qs), **kwargs) as resp:
            return resp.status, await resp.json(content_type=None)


async def state_of(service: ServiceProcess, name: str) -> dict[str, Any]:
    status, body = await call(service, "GET", f"/api/v1/jobs/{name}")
    assert status == 200, body
    return body  # type: ignore[no-any-return]


async def wait_for(
    service: ServiceProcess, name: str, states: set[str], timeout: float = 60
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = await state_of(service, name)
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, job
        await asyncio.sleep(0.05)


async def add_alice(tmp_path: Path) -> None:
    """Alice straight into the store (the gateway, which owns users, is not running)."""
    store = open_store(f"sqlite:///{tmp_path}/store.db")
    await store.open()
    try:
        await store.create_user(User("alice", "!unused"))
    finally:
        await store.close()


async def alice_with_package(tmp_path: Path, train: str) -> Path:
    """Alice, and a package `/pfs/dc1/home/alice/pkg` of one train.py; her home."""
    await add_alice(tmp_path)
    home = tmp_path / "pfs" / "home" / "alice"
    (home / "pkg").mkdir(parents=True)
    (home / "pkg" / "train.py").write_text(train)
    return home


async def test_jobs_run_on_while_the_service_is_killed_and_a_restart_records_their_end(
    service: ServiceProcess, tmp_path: Path
) -> None:
    await add_alice(tmp_path)
    package = tmp_path / "pfs" / "home" / "alice" / "pkg"
    package.mkdir(parents=True)
    (package / "train.py").write_text(
        "import os, sys, time\ntime.sleep(float(os.environ['NAP']))\nprint('done', flush=True)\n"
    )
    for name, nap in (("short", "1.5"), ("long", "5")):
        spec = {"name": name, "package": "/pfs/dc1/home/alice/pkg", "env": {"NAP": nap}}
        status, body = await call(service, "POST", "/api/v1/jobs", json=spec)
        assert status == 201, body
    for name in ("short", "long"):
        await wait_for(service, name, {"RUNNING"})
    assert service.process is not None
    os.kill(service.process.pid, signal.SIGKILL)
    service.process.wait()

    # "short" ends while nobody is watching; "long" is still running at the restart.
    def states() -> list[str]:
        found = (tmp_path / "jobs" / "alice").glob("*/state.json")
        return sorted(json.loads(p.read_text())["state"] for p in found)

    assert await wait_until(lambda: "SUCCEEDED" in states(), 30), states()
    assert states() == ["RUNNING", "SUCCEEDED"]
    service.start()
    short = await wait_for(service, "short", {"SUCCEEDED", "FAILED", "KILLED"})
    assert short["state"] == "SUCCEEDED", short
    long = await wait_for(service, "long", {"SUCCEEDED", "FAILED", "KILLED"})
    assert long["state"] == "SUCCEEDED", long
    assert [e["state"] for e in long["events"] if e["type"] == "state"] == ["PENDING", "RUNNING", "SUCCEEDED"]
    # The supervisor's events were recorded once each, not again after the restart.
    reasons = [e["reason"] for e in long["events"] if e["type"] != "state"]
    assert reasons.count("WorkerStarted") == 1, reasons
    status, logs = await call(service, "GET", "/api/v1/jobs/long/events")
    assert status == 200 and len(logs["events"]) == len(long["events"])


async def test_gpus_held_and_jobs_waiting_for_them_are_taken_up_again_after_a_restart(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, pfs={"datacenter": "dc1"}, jobs={"poll_seconds": 0.05, "gpus": ["7"]})
    service = ServiceProcess("jobs", config, tmp_path)
    service.start()
    try:
        await add_alice(tmp_path)
        home = tmp_path / "pfs" / "home" / "alice"
        (home / "pkg").mkdir(parents=True)
        (home / "pkg" / "train.py").write_text(
            "import os, time\n"
            "print('devices', os.environ['CUDA_VISIBLE_DEVICES'], flush=True)\n"
            "home, name = os.environ['PADDLE_CLOUD_PFS_HOME'], os.environ['PADDLE_JOB_NAME']\n"
            "release = os.path.join(home, 'release-' + name)\n"
            "while not os.path.exists(release):\n    time.sleep(0.05)\n"
        )
        for name in ("holder", "waiter"):
            spec = {"name": name, "package": "/pfs/dc1/home/alice/pkg", "gpu": 1}
            status, body = await call(service, "POST", "/api/v1/jobs", json=spec)
            assert status == 201, body
        await wait_for(service, "holder", {"RUNNING"})
        assert (await state_of(service, "waiter"))["reason"].startswith("waiting for GPUs")
        assert service.process is not None
        os.kill(service.process.pid, signal.SIGKILL)
        service.process.wait()
        service.start()
        # The restarted service knows device 7 is the holder's, so the waiter still waits.
        status, quota = await call(service, "GET", "/api/v1/quota")
        assert status == 200 and quota["machine"]["gpus_free"] == 0, quota
        assert [(d["job"], d["device"]) for d in quota["devices"]] == [("holder", "7")]
        assert (await state_of(service, "waiter"))["state"] == "PENDING"
        status, workers = await call(service, "GET", "/api/v1/jobs/holder/workers")
        assert workers["workers"][0]["devices"] == ["7"]
        (home / "release-holder").write_text("")
        assert (await wait_for(service, "holder", {"SUCCEEDED", "FAILED"}))["state"] == "SUCCEEDED"
        await wait_for(service, "waiter", {"RUNNING"})
        status, workers = await call(service, "GET", "/api/v1/jobs/waiter/workers")
        assert workers["workers"][0]["devices"] == ["7"]
        (home / "release-waiter").write_text("")
        assert (await wait_for(service, "waiter", {"SUCCEEDED", "FAILED"}))["state"] == "SUCCEEDED"
    finally:
        service.stop()


async def test_every_submit_answered_201_runs_once_after_the_service_is_killed_amid_20_submits(
    service: ServiceProcess, tmp_path: Path
) -> None:
    """A 201 is a promise: a job recorded but not started (or started half-way: a job
    directory made, a supervisor forked but not recorded) when the service died is started
    by the restarted service, once."""
    home = await alice_with_package(
        tmp_path,
        "import os\n"
        "ran = os.path.join(os.environ['PADDLE_CLOUD_PFS_HOME'], 'ran-' + os.environ['PADDLE_JOB_NAME'])\n"
        "with open(ran, 'a') as f:\n    f.write('ran\\n')\n",
    )
    assert service.process is not None
    pid = service.process.pid
    answered: list[str] = []

    async def submit(name: str) -> None:
        spec = {"name": name, "package": "/pfs/dc1/home/alice/pkg"}
        try:
            status, body = await call(service, "POST", "/api/v1/jobs", json=spec)
        except aiohttp.ClientError:
            return  # cut off by the kill: no promise was made
        assert status == 201, body
        answered.append(name)
        if len(answered) == 3:
            os.kill(pid, signal.SIGKILL)  # while the other submits are in flight

    await asyncio.gather(*(submit(f"job-{i}") for i in range(20)))
    service.process.wait()
    assert len(answered) >= 3, answered
    service.start()
    for name in answered:
        job = await wait_for(service, name, {"SUCCEEDED", "FAILED", "KILLED"})
        assert job["state"] == "SUCCEEDED", job
        assert (home / f"ran-{name}").read_text() == "ran\n", name  # once, not twice


async def test_a_start_the_store_missed_is_adopted_and_a_half_made_one_started_afresh(
    service: ServiceProcess, tmp_path: Path
) -> None:
    """The two ways a start can have half happened when the service died: its supervisor
    forked but not recorded (adopted: it must not run twice), or its directory made and no
    supervisor (taken away and started again: it must not be lost)."""
    home = await alice_with_package(
        tmp_path,
        "import os, time\n"
        "home, name = os.environ['PADDLE_CLOUD_PFS_HOME'], os.environ['PADDLE_JOB_NAME']\n"
        "with open(os.path.join(home, 'ran-' + name), 'a') as f:\n    f.write('ran\\n')\n"
        "while not os.path.exists(os.path.join(home, 'release')):\n    time.sleep(0.05)\n",
    )
    for name in ("forked", "half"):
        status, body = await call(
            service, "POST", "/api/v1/jobs", json={"name": name, "package": "/pfs/dc1/home/alice/pkg"}
        )
        assert status == 201, body
        await wait_for(service, name, {"RUNNING"})
    assert await wait_until(lambda: (home / "ran-forked").exists() and (home / "ran-half").exists(), 30)
    assert service.process is not None
    os.kill(service.process.pid, signal.SIGKILL)
    service.process.wait()

    store = open_store(f"sqlite:///{tmp_path}/store.db")
    await store.open()
    try:
        forked = await store.get_job("alice", "forked")
        half = await store.get_job("alice", "half")
        assert forked is not None and half is not None
        # As if the service had died before recording either start.
        for job in (forked, half):
            assert await store.transition_job(job.id, {"RUNNING"}, "PENDING", backend={}) is not None
    finally:
        await store.close()
    # "half" had its directory made and no supervisor: stop the one it has, and forget it ran.
    half_dir = tmp_path / "jobs" / "alice" / half.id
    pid = json.loads((half_dir / "state.json").read_text())["supervisor_pid"]
    os.kill(pid, signal.SIGKILL)
    assert await wait_until(
        lambda: not Path(f"/proc/{pid}/cmdline").exists() or not Path(f"/proc/{pid}/cmdline").read_bytes(), 10
    )
    (half_dir / "state.json").unlink()
    (home / "ran-half").unlink()

    service.start()
    (home / "release").write_text("")
    for name in ("forked", "half"):
        job = await wait_for(service, name, {"SUCCEEDED", "FAILED", "KILLED"})
        assert job["state"] == "SUCCEEDED", job
        assert (home / f"ran-{name}").read_text() == "ran\n", name  # once each
