"""Jobs whose stored spec no longer validates (a rule tightened since their submit): the
jobs service reads every job once into a typed record, and such a job must not break a
listing, the quota or a restart of the service."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_jobs_api import start_jobs

from paddlecloud.common.keys import STORE
from paddlecloud.common.store import Job
from paddlecloud.jobs.app import create_app as create_jobs
from support import make_config


async def test_a_stored_spec_that_no_longer_validates_is_listed_and_failed_at_the_restart(
    tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any
) -> None:
    jobs = await start_jobs(tmp_path, aiohttp_server, aiohttp_client)
    # Recorded, never started, by a version that took no trainers at all.
    stale = {"name": "stale", "package": "/pfs/dc1/home/alice/pkg", "trainers": 0}
    await jobs.client.app[STORE].create_job(Job("j1", "alice", "stale", "PENDING", stale))
    # A restart of the service: the second one re-attaches to what the store calls active.
    await aiohttp_server(create_jobs(make_config(tmp_path, pfs={"datacenter": "dc1"})))

    resp = await jobs.call("GET", "jobs", params={"all": "1"})
    listed = await resp.json()
    assert resp.status == 200, listed
    (job,) = listed["jobs"]
    assert job["name"] == "stale" and job["spec"]["trainers"] == 0
    assert job["state"] == "FAILED" and job["reason"].startswith("cannot start after a restart:"), job
    resp = await jobs.call("GET", "quota")
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["jobs"]["used"] == 0
    # Asked for by name, it is shown as stored, and its owner can remove it.
    resp = await jobs.call("GET", "jobs/stale")
    body = await resp.json(content_type=None)
    assert resp.status == 200 and body["spec"]["trainers"] == 0, body
    resp = await jobs.call("DELETE", "jobs/stale", params={"rm": "1"})
    assert resp.status == 204, await resp.text()
    resp = await jobs.call("GET", "jobs/stale")
    assert resp.status == 404, await resp.text()
