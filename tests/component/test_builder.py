"""The builder service through the real gateway, building real virtualenvs with pip from a
wheelhouse written by the test (no network: `--no-index`, wheels on disk or on loopback)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import secrets
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest
import structlog
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient

from paddlecloud.builder.app import create_app as create_builder
from paddlecloud.builder.errors import PROBLEMS, RequestRefused
from paddlecloud.builder.spec import cache_key, check_requirements
from paddlecloud.common.clients import BuilderClient, BuilderError, BuilderUnavailable
from paddlecloud.common.errors import problem_for_domain
from paddlecloud.common.internal_auth import Identity
from paddlecloud.common.keys import STORE
from paddlecloud.common.store import Job, Token, User, open_store
from paddlecloud.common.store.models import RUNNING, SUCCEEDED, utcnow
from paddlecloud.gateway.accounts import hash_token
from paddlecloud.gateway.app import create_app as create_gateway
from support import free_port, make_config, make_wheel, make_wheelhouse, scrape

API = "/api/v1"
PROBLEM = "application/problem+json"
NDJSON = "application/x-ndjson"
FINAL = ("SUCCEEDED", "FAILED")


class SlowIndex:
    """A find-links page on loopback whose one wheel is held back until `release()`, so a
    test can act while pip is in the middle of a build."""

    def __init__(self, wheel: Path) -> None:
        self.wheel = wheel
        self.downloading = asyncio.Event()
        self.released = asyncio.Event()
        self.downloads = 0

    async def page(self, request: web.Request) -> web.Response:
        name = self.wheel.name
        html = f'<html><body><a href="/files/{name}">{name}</a></body></html>'
        return web.Response(text=html, content_type="text/html")

    async def file(self, request: web.Request) -> web.StreamResponse:
        self.downloads += 1
        self.downloading.set()
        await self.released.wait()
        return web.Response(body=self.wheel.read_bytes(), content_type="application/octet-stream")

    def release(self) -> None:
        self.released.set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/simple/", self.page)
        app.router.add_get("/files/{name}", self.file)
        return app


@dataclass
class Builds:
    """A builder service behind a gateway, with tokens for alice and bob."""

    client: TestClient[Any, Any]
    work_dir: Path
    headers: dict[str, dict[str, str]]
    builder_app: web.Application
    config: Any = None
    events: list[dict[str, Any]] = field(default_factory=list)

    async def call(self, method: str, endpoint: str, who: str = "alice", **kwargs: Any) -> ClientResponse:
        headers = {**self.headers[who], **kwargs.pop("headers", {})}
        return await self.client.request(method, f"{API}/{endpoint}", headers=headers, **kwargs)

    async def post(
        self, requirements: str, who: str = "alice", status: int | None = 201, **extra: Any
    ) -> dict[str, Any]:
        resp = await self.call("POST", "builds", who, json={"requirements": requirements, **extra})
        body = await resp.json(content_type=None)
        if status is not None:
            assert resp.status == status, body
        return body  # type: ignore[no-any-return]

    async def get(self, build_id: str, who: str = "alice") -> dict[str, Any]:
        resp = await self.call("GET", f"builds/{build_id}", who)
        assert resp.status == 200, await resp.text()
        return await resp.json()  # type: ignore[no-any-return]

    async def wait(self, build_id: str, who: str = "alice", timeout: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            build = await self.get(build_id, who)
            if build["state"] in FINAL:
                return build
            assert time.monotonic() < deadline, f"build still {build['state']}: {build}"
            await asyncio.sleep(0.05)

    async def logs(self, build_id: str, who: str = "alice", **params: str) -> str:
        resp = await self.call("GET", f"builds/{build_id}/logs", who, params=params)
        assert resp.status == 200, await resp.text()
        return await resp.text()

    def pip_runs(self) -> int:
        """How many times pip was started (the service's own log events)."""
        return sum(
            1 for e in self.events if e.get("event") == "build_step_started" and e["step"] == "pip install"
        )

    def envs(self) -> list[str]:
        return sorted(p.name for p in (self.work_dir / "envs").iterdir())


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    return make_wheelhouse(tmp_path / "wheelhouse")


@pytest.fixture
def builder_settings(wheelhouse: Path, tmp_path: Path) -> dict[str, Any]:
    """The builder section of the config; tests change it before asking for `builds`."""
    return {
        "work_dir": str(tmp_path / "builder"),
        "find_links": [str(wheelhouse)],
        "no_index": True,
        "poll_seconds": 0.05,
    }


@pytest.fixture
async def builds(
    tmp_path: Path, builder_settings: dict[str, Any], aiohttp_server: Any, aiohttp_client: Any
) -> AsyncIterator[Builds]:
    sections: dict[str, dict[str, Any]] = {"pfs": {"datacenter": "dc1"}, "builder": builder_settings}
    server = await aiohttp_server(create_builder(make_config(tmp_path, **sections)))
    config = make_config(
        tmp_path, **sections, gateway={"builder_url": str(server.make_url("")), "admin_password": None}
    )
    client = await aiohttp_client(create_gateway(config))
    store = client.app[STORE]
    headers = {}
    for name in ("alice", "bob"):
        await store.create_user(User(name, "!unused"))
        token = f"pc_{secrets.token_urlsafe(32)}"
        await store.add_token(Token(hash_token(token), name, expires_at=utcnow() + timedelta(hours=1)))
        headers[name] = {"Authorization": f"Bearer {token}"}
    result = Builds(client, Path(builder_settings["work_dir"]), headers, server.app, config)
    # Record the builder's log events (structlog's own test helper would replace the
    # processors; this keeps them and adds one).
    original = structlog.get_config()["processors"]

    def record(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
        result.events.append(dict(event))
        return event

    structlog.configure(processors=[record, *original])
    try:
        yield result
    finally:
        structlog.configure(processors=original)


@pytest.fixture
async def slow_index(tmp_path: Path, aiohttp_server: Any) -> AsyncIterator[tuple[SlowIndex, str]]:
    directory = tmp_path / "slow-wheels"
    directory.mkdir()
    index = SlowIndex(make_wheel(directory, "slowpkg", "1.0"))
    server = await aiohttp_server(index.app())
    try:
        yield index, str(server.make_url("/simple/"))
    finally:
        index.release()


def run_python(python: str, code: str) -> str:
    result = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, timeout=60, env={"PATH": os.environ["PATH"]}
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def pip_processes(work_dir: Path) -> list[psutil.Process]:
    """Live pip processes building under `work_dir`."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmdline = proc.info["cmdline"] or []
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if "pip" in cmdline and cmdline and cmdline[0].startswith(str(work_dir)):
            found.append(proc)
    return found


# -- building and the cache ------------------------------------------------------------


async def test_a_first_build_builds_and_its_python_imports_the_package_and_the_platform(
    builds: Builds,
) -> None:
    created = await builds.call("POST", "builds", json={"requirements": "tinypkg==1.0\nshadow-yaml\n"})
    first = await created.json()
    assert created.status == 201, first
    assert created.headers["Location"] == f"{API}/builds/{first['id']}"
    assert first["state"] in ("PENDING", "RUNNING") and first["cached"] is False and first["python"] is None
    assert len(first["key"]) == 64
    build = await builds.wait(first["id"])
    assert build["state"] == "SUCCEEDED", build
    assert build["key"] == first["key"] and build["cached"] is False
    assert build["finished_at"] is not None and build["created_at"] <= build["finished_at"]
    python = build["python"]
    assert Path(python).is_absolute() and Path(python).exists()
    # The user's packages, then the platform (paddlecloud and its dependencies), in that order:
    # the user's `yaml` hides the platform's PyYAML.
    out = run_python(
        python,
        "import tinypkg, yaml, paddlecloud.runtime, aiohttp\n"
        "print(tinypkg.VALUE, getattr(yaml, 'SHADOW', False))",
    )
    assert out == "1.0 True"
    logs = await builds.logs(first["id"])
    assert "Successfully installed" in logs and "tinypkg-1.0" in logs
    assert builds.pip_runs() == 1
    # What is built, in the user's words; not the sandbox's command line or the host's paths.
    assert "] $ pip install -r requirements.txt" in logs
    assert "bwrap" not in logs and "--ro-bind" not in logs and str(builds.work_dir) not in logs, logs


async def test_an_identical_request_is_a_cache_hit_that_runs_no_pip(
    builds: Builds, report_figure: Any
) -> None:
    requirements = "tinypkg==2.0\n"
    url = builds.config.gateway.builder_url
    figures = await scrape(url)
    assert figures.value("paddlecloud_build_cache_hits_total") == 0
    assert figures.value("paddlecloud_build_cache_misses_total") == 0
    dry = await builds.call("POST", "builds", params={"dry_run": "1"}, json={"requirements": requirements})
    before = await dry.json()
    assert dry.status == 200 and set(before) == {"key", "cached"} and before["cached"] is False
    first = await builds.post(requirements)
    assert first["key"] == before["key"]
    built = await builds.wait(first["id"])
    assert built["state"] == "SUCCEEDED"
    figures = await scrape(url)  # a dry run counts nothing; the build was a miss
    assert figures.value("paddlecloud_build_cache_hits_total") == 0
    assert figures.value("paddlecloud_build_cache_misses_total") == 1
    assert figures.value("paddlecloud_builds_finished_total", state="SUCCEEDED") == 1
    env = Path(built["python"]).parent.parent
    stamp = (env.resolve().stat().st_ino, env.resolve().stat().st_mtime_ns)
    logs_before = sorted((builds.work_dir / "logs").iterdir())

    start = time.monotonic()
    again = await builds.post(requirements, status=200)
    report_figure(f"builder: a cache hit answered in {(time.monotonic() - start) * 1000:.1f} ms")
    assert again["id"] == first["id"] and again["state"] == "SUCCEEDED" and again["cached"] is True
    assert again["python"] == built["python"]
    dry = await builds.call("POST", "builds", params={"dry_run": "1"}, json={"requirements": requirements})
    assert await dry.json() == {"key": first["key"], "cached": True}

    # Another user gets a build of their own, answered from the same environment.
    theirs = await builds.post(requirements, who="bob")
    assert theirs["id"] != first["id"] and theirs["key"] == first["key"]
    assert theirs["state"] == "SUCCEEDED" and theirs["cached"] is True and theirs["python"] == built["python"]
    assert "Successfully installed tinypkg-2.0" in await builds.logs(theirs["id"], who="bob")
    # ... and neither sees the other's.
    assert (await builds.call("GET", f"builds/{first['id']}", "bob")).status == 404
    assert (await builds.call("GET", f"builds/{theirs['id']}/logs", "alice")).status == 404

    assert builds.pip_runs() == 1
    figures = await scrape(url)  # alice's hit and bob's: nothing more was built
    assert figures.value("paddlecloud_build_cache_hits_total") == 2
    assert figures.value("paddlecloud_build_cache_misses_total") == 1
    assert figures.value("paddlecloud_builds_finished_total", state="SUCCEEDED") == 1
    assert sorted((builds.work_dir / "logs").iterdir()) == logs_before
    assert (env.resolve().stat().st_ino, env.resolve().stat().st_mtime_ns) == stamp
    assert builds.envs() == [first["key"]]


async def test_identical_requests_that_arrive_together_build_once(builds: Builds) -> None:
    requirements = "otherpkg\ntinypkg<2\n"
    answers = await asyncio.gather(
        *(builds.post(requirements, status=None) for _ in range(3)),
        builds.post(requirements, who="bob", status=None),
    )
    mine, theirs = answers[:3], answers[3]
    assert len({a["id"] for a in mine}) == 1, mine
    assert theirs["id"] != mine[0]["id"] and theirs["key"] == mine[0]["key"]
    done = await builds.wait(mine[0]["id"])
    followed = await builds.wait(theirs["id"], who="bob")
    assert done["state"] == followed["state"] == "SUCCEEDED"
    assert followed["python"] == done["python"] and followed["cached"] is False
    assert builds.pip_runs() == 1
    assert builds.envs() == [done["key"]]
    assert await builds.logs(theirs["id"], who="bob") == await builds.logs(mine[0]["id"])


async def test_a_bad_requirement_fails_with_pips_message_and_is_not_cached(builds: Builds) -> None:
    first = await builds.post("tinypkg\nnosuchpkg==1.0\n")
    failed = await builds.wait(first["id"])
    assert failed["state"] == "FAILED" and failed["python"] is None
    assert "No matching distribution found for nosuchpkg==1.0" in failed["reason"], failed
    logs = await builds.logs(first["id"])
    assert "ERROR: No matching distribution found for nosuchpkg==1.0" in logs
    assert "build failed: pip install failed (exit 1)" in logs
    # Nothing was published, and nothing of the build is left but its log.
    assert builds.envs() == []
    assert list((builds.work_dir / "builds").iterdir()) == []
    assert list((builds.work_dir / "runs").iterdir()) == []
    # A later identical request builds again.
    dry = await builds.call(
        "POST", "builds", params={"dry_run": "true"}, json={"requirements": "tinypkg\nnosuchpkg==1.0\n"}
    )
    assert (await dry.json())["cached"] is False
    second = await builds.post("tinypkg\nnosuchpkg==1.0\n")
    assert second["id"] != first["id"] and second["key"] == first["key"]
    assert (await builds.wait(second["id"]))["state"] == "FAILED"
    assert builds.pip_runs() == 2


@pytest.fixture
def tiny_cache(builder_settings: dict[str, Any]) -> None:
    builder_settings.update(cache_max_bytes=1, min_idle_seconds=0)


@pytest.mark.usefixtures("tiny_cache")
async def test_collection_removes_the_least_recently_used_environment_no_running_job_uses(
    builds: Builds,
) -> None:
    store = builds.client.app[STORE]

    async def build(requirements: str) -> dict[str, Any]:
        done = await builds.wait((await builds.post(requirements))["id"])
        assert done["state"] == "SUCCEEDED", done
        return done

    used = await build("tinypkg==1.0\n")
    await store.create_job(Job("j1", "alice", "train", RUNNING, {}, build_id=used["id"]))
    # Over the cap at once, but the first is in use and the second is the one just built.
    idle = await build("otherpkg\n")
    assert builds.envs() == sorted([used["key"], idle["key"]])
    # A finished job does not keep an environment.
    await store.create_job(Job("j2", "alice", "old", SUCCEEDED, {}, build_id=idle["id"]))
    newest = await build("tinypkg==2.0\n")
    assert builds.envs() == sorted([used["key"], newest["key"]])
    gone = await builds.get(idle["id"])
    assert gone["state"] == "SUCCEEDED" and gone["python"] is None and "size cap" in gone["reason"]
    assert not Path(idle["python"]).exists()
    assert run_python(used["python"], "import tinypkg; print(tinypkg.VALUE)") == "1.0"
    # Asking again builds it again.
    dry = await builds.call("POST", "builds", params={"dry_run": "1"}, json={"requirements": "otherpkg\n"})
    assert (await dry.json())["cached"] is False
    again = await builds.post("otherpkg\n")
    assert again["id"] != idle["id"] and again["cached"] is False
    assert (await builds.wait(again["id"]))["state"] == "SUCCEEDED"


# Asked for before `builds`, which reads the settings.
@pytest.fixture
def slow_settings(builder_settings: dict[str, Any], slow_index: tuple[SlowIndex, str]) -> SlowIndex:
    index, url = slow_index
    builder_settings.update(find_links=[url])
    return index


async def test_a_build_whose_pip_is_killed_leaves_nothing_and_the_next_builds_again(
    slow_settings: SlowIndex, builds: Builds
) -> None:
    first = await builds.post("slowpkg\n")
    await asyncio.wait_for(slow_settings.downloading.wait(), 60)
    pips = pip_processes(builds.work_dir)
    assert len(pips) == 1, pips
    pips[0].send_signal(signal.SIGKILL)
    failed = await builds.wait(first["id"])
    assert failed["state"] == "FAILED" and "pip install was killed by SIGKILL" in failed["reason"], failed
    assert builds.envs() == []
    assert list((builds.work_dir / "builds").iterdir()) == []
    assert list((builds.work_dir / "runs").iterdir()) == []
    slow_settings.release()
    second = await builds.post("slowpkg\n")
    assert second["id"] != first["id"]
    done = await builds.wait(second["id"])
    assert done["state"] == "SUCCEEDED", done
    assert run_python(done["python"], "import slowpkg; print(slowpkg.VALUE)") == "1.0"


async def test_follow_streams_a_build_until_it_ends_and_cursors_resume_exactly(
    slow_settings: SlowIndex, builds: Builds
) -> None:
    first = await builds.post("slowpkg==1.0\n")
    await asyncio.wait_for(slow_settings.downloading.wait(), 60)
    resp = await builds.call(
        "GET", f"builds/{first['id']}/logs", params={"follow": "1"}, headers={"Accept": NDJSON}
    )
    assert resp.status == 200 and resp.content_type == NDJSON
    seen: list[dict[str, str]] = []
    while not any("$ " in item["line"] and "pip install" in item["line"] for item in seen):
        seen.append(json.loads(await asyncio.wait_for(resp.content.readline(), 30)))
    assert (await builds.get(first["id"]))["state"] == "RUNNING"
    slow_settings.release()
    rest = [json.loads(line) for line in (await asyncio.wait_for(resp.content.read(), 60)).splitlines()]
    lines = seen + rest
    assert "published" in lines[-1]["line"]
    assert (await builds.get(first["id"]))["state"] == "SUCCEEDED"
    # Text and NDJSON carry the same lines; every cursor resumes right after its line.
    text = await builds.logs(first["id"])
    assert text.splitlines() == [item["line"] for item in lines]
    for i in (0, len(lines) // 2, len(lines) - 1):
        after = await builds.call(
            "GET",
            f"builds/{first['id']}/logs",
            params={"cursor": lines[i]["cursor"]},
            headers={"Accept": NDJSON},
        )
        assert [json.loads(x) for x in (await after.read()).splitlines()] == lines[i + 1 :]
    tail = await builds.logs(first["id"], tail="2")
    assert tail.splitlines() == [item["line"] for item in lines[-2:]]


async def test_stopping_the_service_fails_the_build_under_way_and_leaves_nothing(
    tmp_path: Path, builder_settings: dict[str, Any], slow_index: tuple[SlowIndex, str], aiohttp_server: Any
) -> None:
    index, url = slow_index
    builder_settings.update(find_links=[url])
    server = await aiohttp_server(create_builder(make_config(tmp_path, builder=builder_settings)))
    work_dir = Path(builder_settings["work_dir"])
    config = make_config(tmp_path, builder={**builder_settings, "url": str(server.make_url(""))})
    async with BuilderClient(config) as client:
        build = await client.request_build(
            Identity("alice"), requirements="slowpkg\n", base=None, package=None
        )
        await asyncio.wait_for(index.downloading.wait(), 60)
    await server.close()
    store = open_store(config.store_url())
    await store.open()
    try:
        stopped = await store.get_build(build["id"])
    finally:
        await store.close()
    assert stopped is not None and stopped.state == "FAILED" and "stopped during this build" in stopped.reason
    assert not pip_processes(work_dir)
    assert list((work_dir / "builds").iterdir()) == [] and list((work_dir / "envs").iterdir()) == []
    log = (work_dir / "logs" / f"{build['id']}.log").read_text()
    assert "the builder service is stopping; nothing was published" in log


# -- requests that are refused ------------------------------------------------------


BAD_REQUIREMENTS = [
    "-r /etc/passwd",
    "--requirement=/etc/passwd",
    "-c constraints.txt",
    "-e ./src",
    "--editable=git+https://example.com/x.git#egg=x",
    "./local-dir",
    "/abs/path/pkg",
    "~/pkg",
    "sub/dir",
    "file:///tmp/x-1.0-py3-none-any.whl",
    "x @ file:///tmp/x",
    "x @ /tmp/x",
    "pkg-1.0-py3-none-any.whl",
    "pkg.tar.gz",
    "--index-url https://evil.example/simple",
    "-i https://evil.example/simple",
    "tinypkg --extra-index-url=https://evil.example/simple",
    "--find-links /tmp",
    "--no-index",
    "--trusted-host evil.example",
    "https://example.com/${PADDLECLOUD_INTERNAL_SECRET}.whl",
    "git+ssh://git@example.com/x.git",
    "ftp://example.com/x.whl",
    "tinypkg --install-option=--prefix=/",
    "tinypkg --config-settings=x=y",
    "--use-feature=truststore",
    "tinypkg \\\n  -r other.txt",
]


@pytest.mark.parametrize("line", BAD_REQUIREMENTS)
def test_requirements_that_would_reach_beyond_package_names_are_refused(line: str) -> None:
    with pytest.raises(RequestRefused) as caught:
        check_requirements(f"# ok\ntinypkg\n{line}\n", 64 * 1024)
    problem = problem_for_domain(caught.value, PROBLEMS)  # as the service shows it
    assert problem.kind.status == 422
    assert problem.errors == [{"field": "requirements", "message": caught.value.message}]
    assert "line 3" in problem.detail


def test_requirements_pip_reads_as_names_versions_and_urls_are_accepted() -> None:
    check_requirements(
        "\n".join(
            [
                "# a comment",
                "numpy>=1.20,<2  # trailing comment",
                "torch==2.13.0; python_version >= '3.11'",
                "requests[socks]~=2.31",
                "Pillow",
                "pkg==1.0 --hash=sha256:0123abcd --hash sha256:4567",
                "--only-binary :all:",
                "--prefer-binary",
                "--pre",
                "name @ https://example.com/name-1.0-py3-none-any.whl",
                "https://example.com/other-1.0.tar.gz",
                "git+https://example.com/x.git@v1#egg=x",
                "six \\",
                "  >=1.16",
                "",
            ]
        ),
        64 * 1024,
    )


def test_the_cache_key_is_the_sha256_of_base_requirements_and_builder_version() -> None:
    key = cache_key("python 3.11", "numpy==2.0\n", "local-1")
    assert len(key) == 64 and key == cache_key("python 3.11", "numpy==2.0\n", "local-1")
    assert key != cache_key("python 3.12", "numpy==2.0\n", "local-1")
    assert key != cache_key("python 3.11", "numpy==2.1\n", "local-1")
    assert key != cache_key("python 3.11", "numpy==2.0\n", "local-2")
    material = json.dumps(
        {"base": "python 3.11", "builder": "local-1", "requirements": "numpy==2.0\n"}, sort_keys=True
    )
    assert key == hashlib.sha256(material.encode()).hexdigest()


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({}, 422, "requirements"),
        ({"requirements": 5}, 422, "requirements"),
        ({"requirements": ["tinypkg"]}, 422, "requirements"),
        ({"requirements": "tinypkg", "image": "x"}, 422, "image"),
        ([], 422, "(body)"),
        ({"requirements": "-r /etc/passwd"}, 422, "requirements"),
        ({"requirements": "x" * 70_000}, 422, "requirements"),
        ({"requirements": "tinypkg\x00"}, 422, "requirements"),
        ({"requirements": "tinypkg", "base": "python:3.11-slim"}, 422, "base"),
        ({"requirements": "tinypkg", "base": 3}, 422, "base"),
        ({"requirements": "tinypkg", "package": "/pfs/dc1/home/bob/pkg"}, 422, "package"),
        ({"requirements": "tinypkg", "package": "/pfs/dc1/home/alice/../bob"}, 422, "package"),
        ({"requirements": "tinypkg", "package": "/pfs/dc9/home/alice/pkg"}, 422, "package"),
        ({"requirements": "tinypkg", "package": "/etc/passwd"}, 422, "package"),
    ],
)
async def test_bad_requests_are_problems_naming_the_field(
    builds: Builds, body: Any, status: int, field: str
) -> None:
    resp = await builds.call("POST", "builds", json=body)
    problem = await resp.json(content_type=None)
    assert resp.status == status, problem
    assert resp.content_type == PROBLEM
    assert field in [e["field"] for e in problem["errors"]], problem
    assert builds.envs() == [] and builds.pip_runs() == 0


async def test_bad_queries_and_unknown_builds_are_4xx_problems(builds: Builds) -> None:
    cases = [
        ("POST", "builds?dry_run=maybe", {"json": {"requirements": "tinypkg"}}, 400),
        ("POST", "builds", {"data": b"{not json", "headers": {"Content-Type": "application/json"}}, 400),
        ("POST", "builds", {"data": b"tinypkg", "headers": {"Content-Type": "text/plain"}}, 415),
        ("GET", "builds/no-such-build", {}, 404),
        ("GET", "builds/" + "f" * 300, {}, 404),
        ("GET", "builds/no-such-build/logs", {}, 404),
        ("DELETE", "builds/no-such-build", {}, 405),
    ]
    for method, endpoint, kwargs, status in cases:
        resp = await builds.call(method, endpoint, **kwargs)
        assert resp.status == status, (endpoint, await resp.text())
        assert resp.content_type == PROBLEM
    # A relative package is the caller's home; a build that exists and bad log queries.
    build = await builds.post("tinypkg\n", package="pkg")
    for params, name in (
        ({"cursor": "nonsense"}, "cursor"),
        ({"cursor": "b1.99999999"}, "cursor"),
        ({"tail": "-1"}, "tail"),
        ({"follow": "perhaps"}, "follow"),
    ):
        resp = await builds.call("GET", f"builds/{build['id']}/logs", params=params)
        problem = await resp.json(content_type=None)
        assert resp.status == 400, problem
        assert problem["errors"][0]["field"] == name
    assert (await builds.wait(build["id"]))["state"] == "SUCCEEDED"
    assert (await builds.call("GET", f"builds/{build['id']}", "bob")).status == 404


async def test_requests_that_skip_the_gateway_are_refused(builds: Builds) -> None:
    async with aiohttp.ClientSession() as session:
        url = f"{builds.config.gateway.builder_url.rstrip('/')}{API}/builds"
        async with session.post(url, json={"requirements": "tinypkg"}) as resp:
            assert resp.status == 401 and (await resp.json())["code"] == "ERR_NOT_FROM_GATEWAY"
            assert resp.content_type == PROBLEM


# -- the client other services use ------------------------------------------------------


async def test_the_builder_client_requests_reads_and_follows_builds(
    tmp_path: Path, builder_settings: dict[str, Any], aiohttp_server: Any
) -> None:
    server = await aiohttp_server(create_builder(make_config(tmp_path, builder=builder_settings)))
    config = make_config(tmp_path, builder={**builder_settings, "url": str(server.make_url(""))})
    alice = Identity("alice")
    async with BuilderClient(config) as client:
        dry = await client.request_build(
            alice, requirements="tinypkg\n", base=None, package=None, dry_run=True
        )
        assert dry["cached"] is False
        build = await client.request_build(alice, requirements="tinypkg\n", base=None, package="pkg")
        assert build["key"] == dry["key"]
        lines = [item async for item in client.logs(alice, build["id"], follow=True)]
        assert "published" in lines[-1]["line"]
        done = await client.get_build(alice, build["id"])
        assert done["state"] == "SUCCEEDED" and done["python"]
        rest = [item async for item in client.logs(alice, build["id"], cursor=lines[0]["cursor"])]
        assert rest == lines[1:]
        hit = await client.request_build(alice, requirements="tinypkg\n", base=None, package=None)
        assert hit["id"] == build["id"] and hit["cached"] is True
        with pytest.raises(BuilderError) as refused:
            await client.request_build(alice, requirements="-e .", base=None, package=None)
        assert refused.value.status == 422 and refused.value.code == "ERR_VALIDATION"
        assert refused.value.problem["errors"][0]["field"] == "requirements"
        with pytest.raises(BuilderError) as missing:
            await client.get_build(Identity("bob"), build["id"])
        assert missing.value.status == 404
    down = make_config(tmp_path, builder={**builder_settings, "url": f"http://127.0.0.1:{free_port()}"})
    async with BuilderClient(down) as client:
        with pytest.raises(BuilderUnavailable):
            await client.get_build(alice, "x")


async def test_following_a_build_log_outlasts_a_silence_longer_than_the_read_timeout(
    tmp_path: Path, aiohttp_server: Any
) -> None:
    # pip says nothing while it unpacks a large wheel (Paddle's: over a minute on a busy
    # machine); a follower that gave up after its read timeout lost the rest of the build's
    # log (issue 27, found running examples/paddle_collective).
    async def logs(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        await resp.write(b'{"line": "Installing collected packages: paddlepaddle", "cursor": "1"}\n')
        await asyncio.sleep(1.0)  # silent for longer than the client's read timeout below
        await resp.write(b'{"line": "Successfully installed paddlepaddle", "cursor": "2"}\n')
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/api/v1/builds/{id}/logs", logs)
    server = await aiohttp_server(app)
    config = make_config(tmp_path)
    async with BuilderClient(config, timeout=0.2, url=str(server.make_url(""))) as client:
        lines = [item["line"] async for item in client.logs(Identity("alice"), "b1", follow=True)]
    assert lines == ["Installing collected packages: paddlepaddle", "Successfully installed paddlepaddle"]


# -- the sandbox ----------------------------------------------------------------------

# An in-tree PEP 517 backend: pip runs it to build the sdist, so it is code the user's
# requirements bring. It tries to write outside the build, then builds a wheel whose module
# says what it managed and as which uid it ran.
EVIL_BACKEND = """\
import base64, hashlib, json, os, zipfile

TARGETS = json.loads({targets!r})


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    outcome = {{"uid": os.getuid()}}
    for name, path in TARGETS.items():
        try:
            with open(path, "w") as f:
                f.write("pwned")
            outcome[name] = "wrote"
        except OSError as exc:
            outcome[name] = type(exc).__name__
    info = "evilpkg-1.0.dist-info"
    files = {{
        "evilpkg/__init__.py": ("OUTCOME = " + repr(outcome) + "\\n").encode(),
        info + "/METADATA": b"Metadata-Version: 2.1\\nName: evilpkg\\nVersion: 1.0\\n",
        info + "/WHEEL": b"Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }}
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{{path}},sha256={{digest}},{{len(data)}}")
    files[info + "/RECORD"] = ("\\n".join(record + [info + "/RECORD,,"]) + "\\n").encode()
    name = "evilpkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return name
"""


def make_evil_sdist(directory: Path, targets: dict[str, str], wrapper: str = "") -> Path:
    """evilpkg's sdist in `directory`; `wrapper` is backend code appended (it may wrap build_wheel)."""
    files = {
        "pyproject.toml": (
            '[build-system]\nrequires = []\nbuild-backend = "evil_backend"\nbackend-path = ["."]\n'
            '[project]\nname = "evilpkg"\nversion = "1.0"\n'
        ),
        "PKG-INFO": "Metadata-Version: 2.1\nName: evilpkg\nVersion: 1.0\n",
        "evil_backend.py": EVIL_BACKEND.format(targets=json.dumps(targets)) + wrapper,
    }
    with tarfile.open(directory / "evilpkg-1.0.tar.gz", "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            member = tarfile.TarInfo(f"evilpkg-1.0/{name}")
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    return directory / "evilpkg-1.0.tar.gz"


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed (make system-deps)")
async def test_a_build_step_that_writes_outside_its_build_cannot_touch_the_host(
    builds: Builds, wheelhouse: Path, tmp_path: Path
) -> None:
    marker = secrets.token_hex(4)
    targets = {
        "outside_tmp": str(tmp_path / f"outside-{marker}"),
        "published_envs": str(builds.work_dir / "envs" / f"pwned-{marker}"),
        "wheelhouse": str(wheelhouse / f"pwned-{marker}"),
        "host_etc": f"/etc/pwned-{marker}",
        "host_root": f"/pwned-{marker}",
    }
    make_evil_sdist(wheelhouse, targets)
    build = await builds.wait((await builds.post("evilpkg\n"))["id"])
    assert build["state"] == "SUCCEEDED", build
    for name, path in targets.items():
        assert not Path(path).exists(), f"the build wrote {name} at {path}"
    outcome = run_python(build["python"], "import evilpkg; print(evilpkg.OUTCOME)")
    assert "'wrote'" not in outcome.replace("'published_envs'", ""), outcome
    assert "'uid': 0," not in outcome, outcome  # pip ran unprivileged
    # What it built is the platform's now: no later build or job can change it.
    env = Path(build["python"]).parent.parent.resolve()
    assert env.stat().st_uid == 0 and (env / "lib").stat().st_uid == 0
