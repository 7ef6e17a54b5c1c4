"""Two jobs-service replicas on one store: the quota holds across them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from paddlecloud.common.store import Job, User, open_store
from paddlecloud.common.store.models import Quota
from paddlecloud.common.store.sqlite import SQLiteStore
from paddlecloud.jobs.app import create_app as create_jobs
from support import make_config, signed


class SlowToWrite(SQLiteStore):
    async def create_job(self, job: Job) -> None:
        await asyncio.sleep(0.05)
        await super().create_job(job)


async def test_concurrent_submits_to_two_replicas_never_exceed_the_quota(
    tmp_path: Path, aiohttp_client: Any
) -> None:
    config = make_config(tmp_path, pfs={"datacenter": "dc1"}, jobs={"poll_seconds": 0.05})
    store = open_store(config.store_url())
    await store.open()
    try:
        await store.create_user(User("alice", "!unused", quota=Quota(jobs=1)))
    finally:
        await store.close()
    package = tmp_path / "pfs" / "home" / "alice" / "pkg"
    package.mkdir(parents=True)
    (package / "train.py").write_text("import time\ntime.sleep(600)\n")
    # Each replica has a store of its own (as two processes would), whose writes come a
    # little after the quota check read: without a lock across replicas, both fit.
    stores = [SlowToWrite(config.store_url()) for _ in range(2)]
    for s in stores:
        await s.open()
    replicas = [await aiohttp_client(create_jobs(config, store=s)) for s in stores]

    async def submit(i: int) -> int:
        client = replicas[i % 2]
        spec = {"name": f"j{i}", "package": "/pfs/dc1/home/alice/pkg"}
        resp = await client.post("/api/v1/jobs", json=spec, headers=signed("POST", "/api/v1/jobs"))
        body = await resp.json(content_type=None)
        assert resp.status in (201, 403), body
        assert resp.status == 201 or body["code"] == "ERR_QUOTA_EXCEEDED", body
        return resp.status

    try:
        statuses = await asyncio.gather(*(submit(i) for i in range(10)))
        assert statuses.count(201) == 1, statuses
        seen = []
        for client in replicas:  # both see the same one: one history
            listed = await client.get("/api/v1/jobs", headers=signed("GET", "/api/v1/jobs"))
            seen.append(sorted(j["name"] for j in (await listed.json())["jobs"]))
        assert seen[0] == seen[1] and len(seen[0]) == 1, seen
    finally:
        listed = await replicas[0].get("/api/v1/jobs", headers=signed("GET", "/api/v1/jobs"))
        for job in (await listed.json())["jobs"]:
            path = f"/api/v1/jobs/{job['name']}"
            resp = await replicas[0].delete(path, headers=signed("DELETE", path))
            assert resp.status == 200, await resp.text()
        for s in stores:
            await s.close()
