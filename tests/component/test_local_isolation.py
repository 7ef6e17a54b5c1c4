"""Local jobs' limits and devices: memory enforced and explained, GPUs handed out one job at a time."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from test_jobs_api import Jobs, start_jobs

from paddlecloud.jobs.keys import MANAGER

# Holds its GPUs (prints what it sees) until a file named after the job appears in its home.
HOLDS_GPUS = """\
import os, time
seen = os.environ["CUDA_VISIBLE_DEVICES"], os.environ["NVIDIA_VISIBLE_DEVICES"]
print("devices", *map(repr, seen), flush=True)
release = os.path.join(os.environ["PADDLE_CLOUD_PFS_HOME"], "release-" + os.environ["PADDLE_JOB_NAME"])
while not os.path.exists(release):
    time.sleep(0.05)
"""


@pytest.fixture
async def jobs(tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any) -> Jobs:
    return await start_jobs(tmp_path, aiohttp_server, aiohttp_client)


@pytest.fixture
async def gpu_jobs(tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any) -> Jobs:
    return await start_jobs(tmp_path, aiohttp_server, aiohttp_client, gpus=["0", "1"])


async def logs_saying(jobs: Jobs, name: str, needle: str, timeout: float = 30.0) -> str:
    """The job's logs once they contain `needle` (or as they are after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        text = await jobs.logs(name)
        if needle in text or time.monotonic() > deadline:
            return text
        await asyncio.sleep(0.05)


def backend_of(jobs: Jobs) -> Any:
    return jobs.server_app[MANAGER].backend  # type: ignore[attr-defined]


async def test_a_worker_that_allocates_past_its_memory_is_killed_and_told_why(jobs: Jobs) -> None:
    if not backend_of(jobs).limits_enforced:
        pytest.skip("this machine gives the service no cgroups: limits are advisory here")
    package = jobs.package({"train.py": "x = bytearray(600 * 2**20)\nprint('allocated', len(x))\n"})
    await jobs.submit({"name": "greedy", "package": package, "memory": "64Mi"})
    job = await jobs.wait("greedy", ("SUCCEEDED", "FAILED"))
    assert job["state"] == "FAILED", (job["reason"], await jobs.logs("greedy"))
    assert "trainer-0 exited with 137 (out of memory: used 64Mi of 64Mi; raise -memory)" in job["reason"]
    assert "allocated" not in await jobs.logs("greedy")
    # The same program within its limit runs, so the kill above was the limit's doing.
    await jobs.submit({"name": "fits", "package": package, "memory": "1Gi"})
    fits = await jobs.wait("fits", ("SUCCEEDED", "FAILED"))
    assert fits["state"] == "SUCCEEDED", fits["reason"]
    quota = await (await jobs.call("GET", "quota")).json()
    assert quota["machine"]["limits"] == "enforced"


async def test_limits_and_their_absence_are_said_in_the_quota(
    tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any
) -> None:
    # No GPUs configured, so the figures below do not depend on the machine's own.
    jobs = await start_jobs(tmp_path, aiohttp_server, aiohttp_client, limits="off", gpus=[])
    quota = await (await jobs.call("GET", "quota")).json()
    assert quota["machine"]["limits"] == "advisory"
    assert "not enforced" in quota["machine"]["limits_detail"]
    assert quota["machine"]["gpus"] == 0 and quota["devices"] == []


async def test_two_gpu_jobs_get_different_devices_and_a_third_waits_with_the_numbers(gpu_jobs: Jobs) -> None:
    jobs = gpu_jobs
    package = jobs.package({"train.py": HOLDS_GPUS})
    for name in ("first", "second"):
        await jobs.submit({"name": name, "package": package, "gpu": 1})
        await jobs.wait(name, ("RUNNING",))
    seen = {}
    for name in ("first", "second"):
        text = await logs_saying(jobs, name, "devices")
        workers = (await (await jobs.call("GET", f"jobs/{name}/workers")).json())["workers"]
        seen[name] = workers[0]["devices"]
        assert f"[trainer-0] devices {seen[name][0]!r} {seen[name][0]!r}" in text, text
    assert sorted(d for ds in seen.values() for d in ds) == ["0", "1"]

    third = await jobs.submit({"name": "third", "package": package, "gpu": 1})
    assert third["state"] == "PENDING"
    # The answer does not wait for the start; the job says why it waits once it tried.
    waiting = "waiting for GPUs: the job needs 1, 0 of this machine's 2 are free"
    deadline = time.monotonic() + 10
    while third["reason"] != waiting and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        third = await jobs.job("third")
    assert (third["state"], third["reason"]) == ("PENDING", waiting)
    quota = await (await jobs.call("GET", "quota")).json()
    held = {(d["job"], d["device"]) for d in quota["devices"]}
    assert held == {("first", seen["first"][0]), ("second", seen["second"][0])}
    assert quota["machine"]["gpus"] == 2 and quota["machine"]["gpus_free"] == 0

    (jobs.home() / "release-first").write_text("")
    assert (await jobs.wait("first", ("SUCCEEDED", "FAILED")))["state"] == "SUCCEEDED"
    await jobs.wait("third", ("RUNNING",))
    workers = (await (await jobs.call("GET", "jobs/third/workers")).json())["workers"]
    assert workers[0]["devices"] == seen["first"]  # the device the first job gave back
    events = [e["reason"] for e in (await jobs.job("third"))["events"]]
    assert "WaitingForResources" in events
    for name in ("second", "third"):
        (jobs.home() / f"release-{name}").write_text("")
        assert (await jobs.wait(name, ("SUCCEEDED", "FAILED")))["state"] == "SUCCEEDED"


async def test_a_waiting_job_can_be_killed_and_frees_its_place(gpu_jobs: Jobs) -> None:
    jobs = gpu_jobs
    package = jobs.package({"train.py": HOLDS_GPUS})
    await jobs.submit({"name": "both", "package": package, "gpu": 2})
    await jobs.wait("both", ("RUNNING",))
    await jobs.submit({"name": "queued", "package": package, "gpu": 1})
    resp = await jobs.call("DELETE", "jobs/queued")
    assert resp.status == 200, await resp.text()
    assert (await jobs.job("queued"))["state"] == "KILLED"
    (jobs.home() / "release-both").write_text("")
    assert (await jobs.wait("both", ("SUCCEEDED", "FAILED")))["state"] == "SUCCEEDED"
    assert (await jobs.job("queued"))["state"] == "KILLED"  # never started after its kill


@pytest.mark.parametrize("dry_run", [False, True])
async def test_more_gpus_than_the_machine_has_are_refused_at_submit(gpu_jobs: Jobs, dry_run: bool) -> None:
    package = gpu_jobs.package({"train.py": "print(1)\n"})
    params = {"dry_run": "1"} if dry_run else {}
    spec = {"name": "huge", "package": package, "gpu": 2, "trainers": 2}
    resp = await gpu_jobs.call("POST", "jobs", json=spec, params=params)
    body = await resp.json(content_type=None)
    assert resp.status == 422, body
    assert body["errors"] == [
        {"field": "gpu", "message": "the job asks for 4 GPUs (2 trainers x 2), and this machine has 2"}
    ]


async def test_any_gpu_on_a_machine_without_gpus_is_refused(jobs: Jobs) -> None:
    if backend_of(jobs).capacity()["gpus"]:
        pytest.skip("this machine has GPUs")
    package = jobs.package({"train.py": "print(1)\n"})
    for params in ({}, {"dry_run": "1"}):
        resp = await jobs.call(
            "POST", "jobs", json={"name": "g", "package": package, "gpu": 1}, params=params
        )
        body = await resp.json(content_type=None)
        assert resp.status == 422, body
        assert "this machine has no GPUs for jobs, and the job asks for 1" in body["detail"]


@pytest.mark.skipif(
    shutil.which("nvidia-smi") is None, reason="no NVIDIA GPU on this machine (no nvidia-smi)"
)
async def test_a_one_gpu_trainer_sees_one_device_and_torch_runs_a_step_on_it(jobs: Jobs) -> None:
    pytest.importorskip("torch")
    program = """\
import os, torch
print("count", torch.cuda.device_count(), "local rank", os.environ["LOCAL_RANK"], flush=True)
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))  # the usual DDP line: its own GPU
x = torch.randn(64, 64, device="cuda")
print("step", float((x @ x).sum().item()) == float((x @ x).sum().item()), flush=True)
"""
    package = jobs.package({"train.py": program})
    await jobs.submit({"name": "cuda", "package": package, "gpu": 1})
    job = await jobs.wait("cuda", ("SUCCEEDED", "FAILED"), timeout=300)
    text = await jobs.logs("cuda")
    assert job["state"] == "SUCCEEDED", (job["reason"], text)
    assert "[trainer-0] count 1 local rank 0" in text and "[trainer-0] step True" in text
