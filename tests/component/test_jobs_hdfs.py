"""Jobs of an HDFS datacenter on one machine: refused at submit, and nothing recorded.

The local backend runs a job against the datacenter's POSIX root on this host; with
`pfs.hdfs` there is none, and a job that started would find none of its files. The jobs
service here has `pfs.hdfs` set (its NameNode is never asked: the refusal comes first).
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from pathlib import Path
from typing import Any

from paddlecloud.common.keys import STORE
from paddlecloud.common.store import Token, User
from paddlecloud.common.store.models import utcnow
from paddlecloud.gateway.accounts import hash_token
from paddlecloud.gateway.app import create_app as create_gateway
from paddlecloud.jobs.app import create_app as create_jobs
from support import free_port, make_config

API = "/api/v1"


async def test_a_local_job_of_an_hdfs_datacenter_is_refused_and_leaves_nothing(
    tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any
) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    pfs = {"datacenter": "dc1", "url": nowhere, "hdfs": {"namenode": nowhere}}
    jobs = await aiohttp_server(create_jobs(make_config(tmp_path, pfs=pfs)))
    gateway = {"jobs_url": str(jobs.make_url("")), "pfs_url": nowhere, "admin_password": None}
    client = await aiohttp_client(create_gateway(make_config(tmp_path, pfs=pfs, gateway=gateway)))
    store = client.app[STORE]
    await store.create_user(User("alice", "!unused"))
    token = f"pc_{secrets.token_urlsafe(32)}"
    await store.add_token(Token(hash_token(token), "alice", expires_at=utcnow() + timedelta(hours=1)))
    headers = {"Authorization": f"Bearer {token}"}

    spec = {"name": "train", "package": "/pfs/dc1/home/alice/pkg"}
    for params in ({}, {"dry_run": "1"}):
        resp = await client.post(f"{API}/jobs", json=spec, headers=headers, params=params)
        problem = await resp.json(content_type=None)
        assert resp.status == 422, problem
        assert resp.content_type == "application/problem+json"
        assert problem["errors"][0]["field"] == "datacenter", problem
        assert "keeps its files in HDFS" in problem["detail"], problem
        assert "run the jobs of an HDFS datacenter on Kubernetes" in problem["detail"], problem

    # A 201 is a promise: nothing was recorded, listed, or made on disk.
    page, _ = await store.list_jobs(None, states=None, limit=10)
    assert page == []
    listed = await client.get(f"{API}/jobs", headers=headers, params={"all": "1"})
    assert (await listed.json())["jobs"] == []
    assert not any((tmp_path / "jobs").glob("*/*"))
