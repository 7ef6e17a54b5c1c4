"""Local jobs on the platform's disk: archive packages bounded, logs capped, /tmp bounded, usage in blocks."""

from __future__ import annotations

import io
import json
import os
import re
import zipfile
from pathlib import Path
from typing import Any

import pytest
from test_jobs_api import NDJSON, Jobs, start_jobs

from paddlecloud.common import sandbox
from paddlecloud.common.quantity import parse_bytes
from support import zeros_tar_gz

MiB = 2**20


@pytest.fixture
async def jobs(tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any) -> Jobs:
    return await start_jobs(tmp_path, aiohttp_server, aiohttp_client, log_max_bytes="1Mi")


async def test_a_2mib_archive_that_unpacks_to_2gib_fails_the_job_and_writes_nothing(jobs: Jobs) -> None:
    # The default limit (1Gi): the review's archive, 2 MiB of gzip'd zeros that declare 2 GiB.
    jobs.home().mkdir(parents=True, exist_ok=True)
    (jobs.home() / "bomb.tar.gz").write_bytes(zeros_tar_gz(2 * 2**30))
    assert (jobs.home() / "bomb.tar.gz").stat().st_size < 3 * MiB
    await jobs.submit({"name": "bomb", "package": "/pfs/dc1/home/alice/bomb.tar.gz"})
    job = await jobs.wait("bomb", ("SUCCEEDED", "FAILED"))
    assert job["state"] == "FAILED", job
    assert "at least 2.0 GiB, the limit is 1Gi (jobs.package_max_bytes)" in job["reason"], job["reason"]
    unpacked = [p for p in jobs.work_dir.rglob("*") if p.is_file() and p.parent.name == "package"]
    assert unpacked == []


async def test_an_archive_within_the_limit_runs_and_is_removed_with_the_job(
    tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any
) -> None:
    jobs = await start_jobs(tmp_path, aiohttp_server, aiohttp_client, package_max_bytes="1Mi")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("train.py", "print('size', len(open('data.bin', 'rb').read()))\n")
        z.writestr("data.bin", bytes(512 * 1024))
    jobs.home().mkdir(parents=True, exist_ok=True)
    (jobs.home() / "ok.zip").write_bytes(buffer.getvalue())
    await jobs.submit({"name": "ok", "package": "/pfs/dc1/home/alice/ok.zip"})
    job = await jobs.wait("ok", ("SUCCEEDED", "FAILED"))
    assert job["state"] == "SUCCEEDED", job["reason"]
    assert "[trainer-0] size 524288" in await jobs.logs("ok")
    # The unpacked copy goes with the job (the archive stays in PFS); the logs stay.
    assert not [p for p in jobs.work_dir.rglob("package") if p.is_dir()]
    assert (jobs.home() / "ok.zip").exists()


async def test_a_job_writing_more_log_than_its_cap_leaves_a_capped_log_with_a_marker(jobs: Jobs) -> None:
    # 4 MiB of numbered lines, then a wait for a file, then 4 MiB more: a reader in between
    # holds a cursor into what is dropped later.
    program = """\
import os, sys, time
line = "x" * 90
for i in range(40000):
    print(f"{i:08d} {line}")
sys.stdout.flush()
go = os.path.join(os.environ["PADDLE_CLOUD_PFS_HOME"], "go")
give_up = time.monotonic() + 120  # a failed test leaves no job behind for long
while not os.path.exists(go) and time.monotonic() < give_up:
    time.sleep(0.02)
for i in range(40000, 80000):
    print(f"{i:08d} {line}")
print("the end")
"""
    package = jobs.package({"train.py": program})
    await jobs.submit({"name": "chatty", "package": package})

    async def ndjson(**params: str) -> list[dict[str, Any]]:
        resp = await jobs.call("GET", "jobs/chatty/logs", params=params, headers={"Accept": NDJSON})
        assert resp.status == 200, await resp.text()
        return [json.loads(line) for line in (await resp.text()).splitlines()]

    while True:  # the first 40000 lines are out (a marker stands for what was dropped)
        first = await ndjson()
        if first and first[-1]["line"].startswith("00039999"):
            break
    assert first[0]["line"].startswith("--- ") and "dropped" in first[0]["line"], first[0]
    cursor = first[1]["cursor"]  # the oldest line still kept: dropped soon
    (jobs.home() / "go").write_text("")
    job = await jobs.wait("chatty", ("SUCCEEDED", "FAILED"))
    assert job["state"] == "SUCCEEDED", job["reason"]

    text = await jobs.logs("chatty")
    lines = text.splitlines()
    marker = "of older output dropped: each worker's log keeps its newest 1Mi (jobs.log_max_bytes) ---"
    assert lines[0].startswith("[trainer-0] --- ") and lines[0].endswith(marker), lines[0]
    assert lines[-1] == "[trainer-0] the end"
    numbers = [int(line.split()[1]) for line in lines[1:-1]]
    assert numbers == list(range(numbers[0], 80000))  # the newest, in order, none missing
    # What the log kept (the lines as the worker wrote them, without the reader's prefix)
    # is at most the cap: trimming drops to an eighth under it, and writing grows it back.
    kept = sum(len(line.removeprefix("[trainer-0] ")) + 1 for line in lines[1:])
    assert kept <= MiB, kept
    log = next(jobs.work_dir.rglob("trainer-0.log"))
    assert os.stat(log).st_blocks * 512 <= MiB + 128 * 1024

    # The reader that was at a dropped line resumes: a marker, then the kept lines, no repeats.
    resumed = await ndjson(cursor=cursor)
    assert resumed[0]["line"].endswith(marker)
    assert [r["line"].split()[0] for r in resumed[1:3]] == [f"{numbers[0]:08d}", f"{numbers[1]:08d}"]
    assert resumed[-1]["line"] == "the end"


# The machine's bound, and the job's own `disk` (per worker, as on Kubernetes) below it.
@pytest.mark.parametrize(
    ("settings", "asked", "limit"),
    [({"scratch_max_bytes": "4Mi"}, {}, "4Mi"), ({}, {"disk": "16Mi"}, "16Mi")],
)
async def test_a_job_that_fills_its_working_directory_fails_and_says_why(
    tmp_path: Path,
    aiohttp_server: Any,
    aiohttp_client: Any,
    settings: dict[str, str],
    asked: dict[str, str],
    limit: str,
) -> None:
    jobs = await start_jobs(tmp_path, aiohttp_server, aiohttp_client, **settings)
    program = """\
import time
with open("checkpoint.bin", "wb") as f:  # the working directory: the platform's disk
    f.write(bytes(24 * 2**20))
print("written", flush=True)
time.sleep(120)
"""
    await jobs.submit({"name": "filler", "package": jobs.package({"train.py": program}), **asked})
    job = await jobs.wait("filler", ("SUCCEEDED", "FAILED", "KILLED"))
    assert job["state"] == "FAILED", job
    # The bound is checked every DISK_CHECK_SECONDS, so on a loaded machine the check may
    # come while the write is under way: what it saw is past the bound, not all 24 MiB.
    wrote = re.search(r"the job wrote ([0-9.]+) MiB", job["reason"])
    assert wrote and parse_bytes(limit) < float(wrote[1]) * 2**20 <= 24 * 2**20, job["reason"]
    assert f"than the {limit}" in job["reason"], job["reason"]
    assert (
        "(its -disk per worker, at most jobs.scratch_max_bytes): write outputs to PADDLE_CLOUD_OUTPUT"
        in job["reason"]
    )


@pytest.mark.skipif(sandbox.detect("auto", "jobs").bwrap is None, reason="no bwrap: jobs use the host's /tmp")
async def test_a_workers_tmp_is_bounded_by_its_memory(jobs: Jobs) -> None:
    program = """\
import os
import re
block = bytes(2**20)
written = 0
try:
    with open("/tmp/fill", "wb") as f:
        while written < 200:
            f.write(block)
            f.flush()
            written += 1
    print("wrote", written, "MiB")
except OSError as exc:
    print("stopped after", written, "MiB:", exc.strerror)
"""
    package = jobs.package({"train.py": program})
    await jobs.submit({"name": "tmpfill", "package": package, "memory": "64Mi"})
    job = await jobs.wait("tmpfill", ("SUCCEEDED", "FAILED"))
    text = await jobs.logs("tmpfill")
    # Either the tmpfs is full at the worker's memory, or the memory limit killed it first.
    if job["state"] == "SUCCEEDED":
        assert "stopped after" in text and "No space left on device" in text, text
        assert int(text.split("stopped after")[1].split()[0]) <= 64
    else:
        assert "exited with 137" in job["reason"], (job["reason"], text)
    assert "wrote 200 MiB" not in text
    assert not any(p.name == "fill" for p in jobs.work_dir.rglob("fill"))


async def test_storage_is_counted_in_allocated_blocks_and_the_quota_says_it_is_advisory(jobs: Jobs) -> None:
    jobs.home().mkdir(parents=True, exist_ok=True)
    with open(jobs.home() / "sparse.bin", "wb") as f:
        f.truncate(2**40)  # 1 TiB that holds nothing
    (jobs.home() / "real.bin").write_bytes(b"x" * 5000)
    os.link(jobs.home() / "real.bin", jobs.home() / "again.bin")
    usage = await (await jobs.call("GET", "pfs/usage")).json()
    assert usage["bytes"] == os.stat(jobs.home() / "real.bin").st_blocks * 512 <= 16 * 1024, usage
    assert usage["enforced"] is False and usage["enforcement"].startswith("advisory here")
    quota = await (await jobs.call("GET", "quota")).json()
    assert quota["machine"]["storage"] == "advisory"
    assert "a running job's own writes into the home are not stopped" in quota["machine"]["storage_detail"]
