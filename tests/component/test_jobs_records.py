"""Jobs whose stored spec no longer validates (a rule tightened since their submit): the
jobs service reads every job once into a typed record, and such a job must not break a
listing, the quota or a restart of the service."""

from __future__ import annotations

import secrets
from datetime import timedelta
from pathlib import Path
from typing import Any

from paddlecloud.common.store import Job, Token, User, open_store
from paddlecloud.common.store.models import utcnow
from paddlecloud.gateway.accounts import hash_token
from paddlecloud.gateway.app import create_app as create_gateway
from paddlecloud.jobs.app import create_app as create_jobs
from support import make_config


async def test_a_stored_spec_that_no_longer_validates_is_listed_and_failed_at_the_restart(
    tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any
) -> None:
    sections: dict[str, dict[str, Any]] = {"pfs": {"datacenter": "dc1"}, "jobs": {"poll_seconds": 0.05}}
    config = make_config(tmp_path, **sections)
    store = open_store(config.store_url())
    await store.open()
    try:
        await store.create_user(User("alice", "!unused"))
        token = f"pc_{secrets.token_urlsafe(32)}"
        await store.add_token(Token(hash_token(token), "alice", expires_at=utcnow() + timedelta(hours=1)))
        # Recorded, never started, by a version that took no trainers at all.
        stale = {"name": "stale", "package": "/pfs/dc1/home/alice/pkg", "trainers": 0}
        await store.create_job(Job("j1", "alice", "stale", "PENDING", stale))
    finally:
        await store.close()
    jobs = await aiohttp_server(create_jobs(config))
    gateway = {"jobs_url": str(jobs.make_url("")), "admin_password": None}
    client = await aiohttp_client(create_gateway(make_config(tmp_path, **sections, gateway=gateway)))
    headers = {"Authorization": f"Bearer {token}"}

    resp = await client.get("/api/v1/jobs", params={"all": "1"}, headers=headers)
    listed = await resp.json()
    assert resp.status == 200, listed
    (job,) = listed["jobs"]
    assert job["name"] == "stale" and job["spec"]["trainers"] == 0
    assert job["state"] == "FAILED" and job["reason"].startswith("cannot start after a restart:"), job
    resp = await client.get("/api/v1/quota", headers=headers)
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["jobs"]["used"] == 0
