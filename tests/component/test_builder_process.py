"""The builder service as a real process: killed in the middle of a build, it leaves
nothing a later build could pick up, and a restart records the build as failed."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from test_builder import SlowIndex, pip_processes

from support import ServiceProcess, make_wheel, signed, write_config


async def call(service: ServiceProcess, method: str, path_qs: str, **kwargs: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        url = f"{service.url}{path_qs}"
        async with session.request(method, url, headers=signed(method, path_qs), **kwargs) as resp:
            if resp.content_type == "text/plain":
                return resp.status, await resp.text()
            return resp.status, await resp.json(content_type=None)


async def wait_final(service: ServiceProcess, build_id: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        status, build = await call(service, "GET", f"/api/v1/builds/{build_id}")
        assert status == 200, build
        if build["state"] in ("SUCCEEDED", "FAILED"):
            return build  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, build
        await asyncio.sleep(0.05)


@pytest.fixture
async def slow(tmp_path: Path, aiohttp_server: Any) -> AsyncIterator[tuple[SlowIndex, str]]:
    directory = tmp_path / "slow-wheels"
    directory.mkdir()
    index = SlowIndex(make_wheel(directory, "slowpkg", "1.0"))
    server = await aiohttp_server(index.app())
    try:
        yield index, str(server.make_url("/simple/"))
    finally:
        index.release()


async def test_a_killed_service_leaves_no_environment_and_a_restart_fails_the_build(
    tmp_path: Path, slow: tuple[SlowIndex, str]
) -> None:
    index, url = slow
    work_dir = tmp_path / "builder"
    config = write_config(
        tmp_path, builder={"work_dir": str(work_dir), "find_links": [url], "no_index": True}
    )
    service = ServiceProcess("builder", config, tmp_path)
    service.start()
    try:
        status, first = await call(service, "POST", "/api/v1/builds", json={"requirements": "slowpkg\n"})
        assert status == 201, first
        await asyncio.wait_for(index.downloading.wait(), 60)
        assert len(pip_processes(work_dir)) == 1
        assert service.process is not None
        os.kill(service.process.pid, signal.SIGKILL)
        service.process.wait()
        # pip goes with the service (PR_SET_PDEATHSIG): nothing goes on building behind its back.
        deadline = time.monotonic() + 10
        while pip_processes(work_dir):
            assert time.monotonic() < deadline, pip_processes(work_dir)
            await asyncio.sleep(0.05)
        assert [p.name for p in (work_dir / "envs").iterdir()] == []

        service.start()
        failed = await wait_final(service, first["id"], timeout=10)
        assert failed["state"] == "FAILED" and failed["reason"].startswith("builder restarted"), failed
        assert list((work_dir / "builds").iterdir()) == []
        assert list((work_dir / "runs").iterdir()) == []
        status, logs = await call(service, "GET", f"/api/v1/builds/{first['id']}/logs")
        assert status == 200 and logs.splitlines()[-1].endswith(
            "the builder restarted during this build; nothing was published"
        )
        status, dry = await call(
            service, "POST", "/api/v1/builds?dry_run=1", json={"requirements": "slowpkg\n"}
        )
        assert status == 200 and dry == {"key": first["key"], "cached": False}

        index.release()
        status, second = await call(service, "POST", "/api/v1/builds", json={"requirements": "slowpkg\n"})
        assert status == 201 and second["id"] != first["id"], second
        done = await wait_final(service, second["id"])
        assert done["state"] == "SUCCEEDED", done
        assert Path(done["python"]).exists()
    finally:
        service.stop()
    assert not pip_processes(work_dir)
