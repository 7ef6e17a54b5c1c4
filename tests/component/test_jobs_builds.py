"""Jobs whose package has a requirements.txt: PENDING → BUILDING → RUNNING in the built environment."""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from paddlecloud.builder.app import create_app as create_builder
from paddlecloud.common.keys import STORE
from paddlecloud.common.store import Token, User
from paddlecloud.common.store.models import utcnow
from paddlecloud.gateway.accounts import hash_token
from paddlecloud.gateway.app import create_app as create_gateway
from paddlecloud.jobs.app import create_app as create_jobs
from support import make_config, make_wheelhouse, wait_until

PROGRAM = "import tinypkg\nprint('tinypkg', tinypkg.VALUE, flush=True)\n"


@dataclass
class Platform:
    client: TestClient[Any, Any]
    home: Path
    headers: dict[str, str]
    builder_dir: Path

    def package(self, name: str, requirements: str) -> str:
        target = self.home / name
        target.mkdir(parents=True)
        (target / "train.py").write_text(PROGRAM)
        (target / "requirements.txt").write_text(requirements)
        return f"/pfs/dc1/home/alice/{name}"

    async def submit(self, spec: dict[str, Any], status: int = 201, **params: str) -> dict[str, Any]:
        resp = await self.client.post("/api/v1/jobs", json=spec, headers=self.headers, params=params)
        body = await resp.json(content_type=None)
        assert resp.status == status, body
        return body  # type: ignore[no-any-return]

    async def job(self, name: str) -> dict[str, Any]:
        resp = await self.client.get(f"/api/v1/jobs/{name}", headers=self.headers)
        assert resp.status == 200
        return await resp.json()  # type: ignore[no-any-return]

    async def wait(self, name: str, timeout: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        seen = []
        while True:
            job = await self.job(name)
            if not seen or seen[-1] != job["state"]:
                seen.append(job["state"])
            if job["state"] in ("SUCCEEDED", "FAILED", "KILLED"):
                job["seen"] = seen
                return job
            assert time.monotonic() < deadline, job
            await asyncio.sleep(0.05)

    async def logs(self, name: str, **params: str) -> str:
        resp = await self.client.get(f"/api/v1/jobs/{name}/logs", headers=self.headers, params=params)
        assert resp.status == 200, await resp.text()
        return await resp.text()


@pytest.fixture
async def platform(tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any) -> Platform:
    wheelhouse = make_wheelhouse(tmp_path / "wheelhouse")
    builder = {"work_dir": str(tmp_path / "builder"), "find_links": [str(wheelhouse)], "no_index": True}
    sections: dict[str, dict[str, Any]] = {"pfs": {"datacenter": "dc1"}, "builder": builder}
    builder_server = await aiohttp_server(create_builder(make_config(tmp_path, **sections)))
    sections["builder"] = builder | {"url": str(builder_server.make_url(""))}
    sections["jobs"] = {"poll_seconds": 0.05}
    jobs_server = await aiohttp_server(create_jobs(make_config(tmp_path, **sections)))
    gateway = {"jobs_url": str(jobs_server.make_url("")), "admin_password": None}
    client = await aiohttp_client(create_gateway(make_config(tmp_path, **sections, gateway=gateway)))
    store = client.app[STORE]
    await store.create_user(User("alice", "!unused"))
    token = f"pc_{secrets.token_urlsafe(32)}"
    await store.add_token(Token(hash_token(token), "alice", expires_at=utcnow() + timedelta(hours=1)))
    return Platform(
        client, tmp_path / "pfs" / "home" / "alice", {"Authorization": f"Bearer {token}"}, tmp_path
    )


async def test_a_job_with_requirements_builds_then_runs_in_that_environment_and_the_next_hits_the_cache(
    platform: Platform,
) -> None:
    package = platform.package("first", "tinypkg==2.0\n")
    dry = await platform.submit({"name": "one", "package": package}, status=200, dry_run="1")
    assert dry["build"]["cached"] is False and len(dry["build"]["key"]) == 64
    await platform.submit({"name": "one", "package": package})
    job = await platform.wait("one")
    assert job["state"] == "SUCCEEDED", job["reason"]
    assert job["seen"][-1] == "SUCCEEDED" and "BUILDING" in job["seen"], job["seen"]
    states = [e["state"] for e in job["events"] if e["type"] == "state"]
    assert states == ["PENDING", "BUILDING", "RUNNING", "SUCCEEDED"]
    assert any(e["reason"] == "BuildRequested" and "a new build" in e["message"] for e in job["events"])
    text = await platform.logs("one")
    assert "[trainer-0] tinypkg 2.0" in text  # the built environment's version, not another
    assert "[build] " in text
    assert (await platform.logs("one", worker="trainer-0")).splitlines() == ["[trainer-0] tinypkg 2.0"]

    # The same requirements in another package: a cache hit, no new build.
    again = platform.package("second", "tinypkg==2.0\n")
    dry = await platform.submit({"name": "two", "package": again}, status=200, dry_run="1")
    assert dry["build"]["cached"] is True
    await platform.submit({"name": "two", "package": again})
    job = await platform.wait("two")
    assert job["state"] == "SUCCEEDED", job["reason"]
    assert any(
        e["reason"] == "BuildRequested" and "a cached environment" in e["message"] for e in job["events"]
    )
    assert "[trainer-0] tinypkg 2.0" in await platform.logs("two")

    # `tail` is per worker and the build counts as one (docs/jobs.md): a cached build's
    # log is trimmed like the others, not replayed whole.
    for name in ("one", "two"):
        whole = [line for line in (await platform.logs(name)).splitlines() if line.startswith("[build] ")]
        assert len(whole) > 2, whole
        lines = (await platform.logs(name, tail="2")).splitlines()
        assert lines == [*whole[-2:], "[trainer-0] tinypkg 2.0"], lines


async def test_a_bad_requirement_fails_the_job_with_pips_message_in_events_and_logs(
    platform: Platform,
) -> None:
    package = platform.package("bad", "no-such-package-anywhere==1.0\n")
    await platform.submit({"name": "bad", "package": package})
    job = await platform.wait("bad")
    assert job["state"] == "FAILED"
    assert "the environment build failed" in job["reason"]
    assert "no-such-package-anywhere" in job["reason"], job["reason"]
    failed = [e for e in job["events"] if e["reason"] == "BuildFailed"]
    assert failed and "no-such-package-anywhere" in failed[0]["message"]
    text = await platform.logs("bad")
    assert "[build] " in text and "no-such-package-anywhere" in text
    assert "[trainer-0]" not in text  # nothing ran


async def test_a_build_log_follow_resumes_into_the_jobs_own_log(platform: Platform) -> None:
    package = platform.package("follow", "tinypkg==1.0\n")
    await platform.submit({"name": "follow", "package": package})
    resp = await platform.client.get(
        "/api/v1/jobs/follow/logs",
        headers={**platform.headers, "Accept": "application/x-ndjson"},
        params={"follow": "1"},
    )
    assert resp.status == 200
    items = [item async for item in _ndjson(resp)]
    workers = [i["worker"] for i in items]
    assert workers[0] == "build" and workers[-1] == "trainer-0", workers
    assert items[-1]["line"] == "tinypkg 1.0"
    # Resuming from the last build line gives exactly the job's own lines after it.
    last_build = [i for i in items if i["worker"] == "build"][-1]
    resp = await platform.client.get(
        "/api/v1/jobs/follow/logs",
        headers={**platform.headers, "Accept": "application/x-ndjson"},
        params={"cursor": last_build["cursor"]},
    )
    rest = [item async for item in _ndjson(resp)]
    assert [(i["worker"], i["line"]) for i in rest] == [("trainer-0", "tinypkg 1.0")]


async def _ndjson(resp: Any) -> Any:
    import json

    async for raw in resp.content:
        if raw.strip():
            yield json.loads(raw)


async def test_two_jobs_submitted_together_share_one_build(platform: Platform) -> None:
    first = platform.package("a", "tinypkg==1.0\notherpkg==1.0\n")
    second = platform.package("b", "tinypkg==1.0\notherpkg==1.0\n")
    await asyncio.gather(
        platform.submit({"name": "a", "package": first}), platform.submit({"name": "b", "package": second})
    )
    jobs = [await platform.wait("a"), await platform.wait("b")]
    assert [j["state"] for j in jobs] == ["SUCCEEDED", "SUCCEEDED"], [j["reason"] for j in jobs]
    builds = {e["message"].split()[1] for j in jobs for e in j["events"] if e["reason"] == "BuildRequested"}
    assert len(builds) == 1, builds  # one build id for both
    published = list((platform.builder_dir / "builder" / "envs").iterdir())
    assert len(published) == 1


async def test_a_job_killed_while_it_builds_never_runs_and_its_build_is_kept_for_the_next(
    platform: Platform,
) -> None:
    # A build may serve every job with the same requirements, so a kill does not stop it: the
    # job is KILLED at once and none of it runs; the environment is built and cached all the same.
    package = platform.package("early", "tinypkg==2.0\n")
    submitted = await platform.submit({"name": "early", "package": package})
    assert submitted["state"] == "BUILDING", submitted
    resp = await platform.client.delete("/api/v1/jobs/early", headers=platform.headers)
    killed = await resp.json()
    assert resp.status == 200 and killed["state"] == "KILLED", killed
    deadline = time.monotonic() + 120
    while not (await platform.submit({"name": "later", "package": package}, status=200, dry_run="1"))[
        "build"
    ]["cached"]:
        assert time.monotonic() < deadline, "the build of the killed job never finished"
        await asyncio.sleep(0.1)
    # The killed job's build watcher has seen the build end and gone (it would have started
    # the job then, had the kill not held): nothing can start it from now on.
    assert await wait_until(
        lambda: not any(t.get_name().startswith("build-of-") for t in asyncio.all_tasks()), 30
    )
    job = await platform.job("early")
    assert job["state"] == "KILLED"
    assert [e["state"] for e in job["events"] if e["type"] == "state"] == ["PENDING", "BUILDING", "KILLED"]
    assert "[trainer-0]" not in await platform.logs("early")
    await platform.submit({"name": "later", "package": package})
    later = await platform.wait("later")
    assert later["state"] == "SUCCEEDED", later["reason"]
    assert any(
        e["reason"] == "BuildRequested" and "a cached environment" in e["message"] for e in later["events"]
    )


async def test_a_job_building_when_the_platform_stopped_builds_again_after_the_restart(
    tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any
) -> None:
    """The store as a stop in mid-build leaves it: the job BUILDING, its build RUNNING. The
    restarted builder calls that build interrupted; the restarted jobs service asks again."""
    from paddlecloud.common.store import Build, Job, open_store
    from paddlecloud.jobs.spec import JobSpec

    wheelhouse = make_wheelhouse(tmp_path / "wheelhouse")
    builder = {"work_dir": str(tmp_path / "builder"), "find_links": [str(wheelhouse)], "no_index": True}
    sections: dict[str, dict[str, Any]] = {"pfs": {"datacenter": "dc1"}, "builder": builder}
    package = tmp_path / "pfs" / "home" / "alice" / "pkg"
    package.mkdir(parents=True)
    (package / "train.py").write_text(PROGRAM)
    (package / "requirements.txt").write_text("tinypkg==2.0\n")
    config = make_config(tmp_path, **sections)
    store = open_store(config.store_url())
    await store.open()
    try:
        await store.create_user(User("alice", "!unused"))
        token = f"pc_{secrets.token_urlsafe(32)}"
        await store.add_token(Token(hash_token(token), "alice", expires_at=utcnow() + timedelta(hours=1)))
        spec = JobSpec.model_validate({"name": "midway", "package": "/pfs/dc1/home/alice/pkg"})
        await store.create_build(Build("b-before-the-stop", "k" * 64, "alice", "RUNNING", spec={}))
        await store.create_job(
            Job("j1", "alice", "midway", "BUILDING", spec.to_dict(), build_id="b-before-the-stop")
        )
    finally:
        await store.close()

    builder_server = await aiohttp_server(create_builder(make_config(tmp_path, **sections)))
    sections["builder"] = builder | {"url": str(builder_server.make_url(""))}
    sections["jobs"] = {"poll_seconds": 0.05}
    jobs_server = await aiohttp_server(create_jobs(make_config(tmp_path, **sections)))
    gateway = {"jobs_url": str(jobs_server.make_url("")), "admin_password": None}
    client = await aiohttp_client(create_gateway(make_config(tmp_path, **sections, gateway=gateway)))
    platform = Platform(client, package.parent, {"Authorization": f"Bearer {token}"}, tmp_path)

    job = await platform.wait("midway")
    assert job["state"] == "SUCCEEDED", job["reason"]
    assert any(e["reason"] == "BuildRequestedAgain" for e in job["events"]), job["events"]
    assert "[trainer-0] tinypkg 2.0" in await platform.logs("midway")
