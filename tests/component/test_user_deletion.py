"""Deleting a user leaves nothing reachable, and a new account of the same name inherits nothing."""

from __future__ import annotations

import secrets
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from test_jobs_api import Jobs, job_processes, start_jobs

from paddlecloud.common.keys import STORE
from paddlecloud.common.store import Token, User
from paddlecloud.common.store.models import utcnow
from paddlecloud.gateway.accounts import hash_token
from support import wait_until

SLEEPER = "import time\nprint('up', flush=True)\ntime.sleep(600)\n"


@pytest.fixture
async def jobs(tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any) -> Jobs:
    jobs = await start_jobs(tmp_path, aiohttp_server, aiohttp_client)
    await add_account(jobs, "root", admin=True)
    return jobs


async def add_account(jobs: Jobs, name: str, *, admin: bool = False) -> None:
    store = jobs.client.app[STORE]
    await store.create_user(User(name, "!unused", admin=admin))
    token = f"pc_{secrets.token_urlsafe(32)}"
    await store.add_token(Token(hash_token(token), name, expires_at=utcnow() + timedelta(hours=1)))
    jobs.headers[name] = {"Authorization": f"Bearer {token}"}


async def test_a_deleted_users_jobs_stop_tokens_end_home_is_archived_and_a_new_alice_starts_empty(
    jobs: Jobs,
) -> None:
    package = jobs.package({"train.py": SLEEPER})
    (jobs.home() / "data.txt").write_text("alice's")
    await jobs.submit({"name": "running", "package": package})
    await jobs.wait("running", ("RUNNING",))
    alice_dir = jobs.work_dir / "alice"
    assert job_processes(alice_dir)

    resp = await jobs.call("DELETE", "users/alice", "root")
    assert resp.status == 204, await resp.text()

    assert (await jobs.call("GET", "jobs", "alice")).status == 401  # her token is gone
    assert await wait_until(lambda: not job_processes(alice_dir), 30), job_processes(alice_dir)
    archived = list((jobs.root / "archive").glob("alice.*"))
    assert len(archived) == 1 and (archived[0] / "data.txt").read_text() == "alice's"
    assert not jobs.home().exists()

    await add_account(jobs, "alice")
    listed = await (await jobs.call("GET", "jobs", "alice", params={"all": "1"})).json()
    assert listed["jobs"] == []
    quota = await (await jobs.call("GET", "quota", "alice")).json()
    assert quota["jobs"]["used"] == 0 and quota["cpu"]["used"] == "0"
    assert quota["storage"]["used"] == "0"
    # The name is free again for a job of the same name.
    await jobs.submit({"name": "running", "package": jobs.package({"train.py": "print(1)\n"})})
    assert (await jobs.wait("running", ("SUCCEEDED", "FAILED")))["state"] == "SUCCEEDED"


async def test_a_home_can_be_removed_instead_and_bad_choices_are_refused(jobs: Jobs) -> None:
    jobs.home("bob").mkdir(parents=True)
    (jobs.home("bob") / "x").write_text("bob's")
    bad = await jobs.call("DELETE", "users/bob", "root", params={"home": "shred"})
    assert bad.status == 400 and (await bad.json())["errors"][0]["field"] == "home"
    assert (await jobs.call("DELETE", "users/bob", "alice")).status == 403  # not an admin
    resp = await jobs.call("DELETE", "users/bob", "root", params={"home": "remove"})
    assert resp.status == 204, await resp.text()
    assert not jobs.home("bob").exists() and not list((jobs.root / "archive").glob("bob.*"))
    assert (await jobs.call("DELETE", "users/bob", "root")).status == 404
