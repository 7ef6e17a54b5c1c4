"""The SDK's job calls against stateful fakes: log streams broken on purpose, pages, waiting.

The real jobs service is exercised end to end in tests/e2e; what cannot be provoked there at a
chosen point is a connection dropping in the middle of a line, or 500 jobs to page through.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from paddlecloud import client as client_module
from paddlecloud.client import AsyncClient, Client
from paddlecloud.errors import ApiError
from paddlecloud.paddlejob import JobWaitTimeout, LogStreamLost

LINES = [{"worker": f"trainer-{i % 2}", "line": f"step {i}", "cursor": f"c{i}"} for i in range(10)]


class FakeLogs:
    """Serves LINES as NDJSON after `cursor`; the scripted answers come first, one per request."""

    def __init__(self, script: list[Any]) -> None:
        self.script = list(script)
        self.queries: list[dict[str, list[str]]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.queries.append({k: request.query.getall(k) for k in request.query})
        assert request.headers["Accept"] == "application/x-ndjson"
        action = self.script.pop(0) if self.script else "all"
        if isinstance(action, int) and action >= 500:
            raise web.HTTPServiceUnavailable(text="away for a moment")
        if action == "missing":
            raise web.HTTPNotFound(
                text=json.dumps({"title": "Not found", "detail": "no job 'x'", "code": "ERR_NOT_FOUND"}),
                content_type="application/problem+json",
            )
        cursor = request.query.get("cursor")
        start = 0 if cursor is None else [x["cursor"] for x in LINES].index(cursor) + 1
        if "tail" in request.query:
            start = max(start, len(LINES) - int(request.query["tail"]))
        response = web.StreamResponse()
        response.content_type = "application/x-ndjson"
        response.enable_chunked_encoding()
        await response.prepare(request)
        body = "".join(json.dumps(x) + "\n" for x in LINES[start:]).encode()
        if isinstance(action, tuple) and action[0] == "break":
            # Whole lines up to the Nth, half of the next, then the connection goes.
            whole = "".join(json.dumps(x) + "\n" for x in LINES[start : start + action[1]]).encode()
            await response.write(whole + body[len(whole) : len(whole) + 9])
            assert request.transport is not None
            request.transport.close()
            return response
        await response.write(body)
        await response.write_eof()
        return response


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "LOG_RETRY_BASE_DELAY", 0.01)
    monkeypatch.setattr(client_module, "LOG_RETRY_MAX_DELAY", 0.05)


async def serve(aiohttp_server: Any, fake: FakeLogs) -> AsyncIterator[AsyncClient]:
    app = web.Application()
    app.router.add_get("/api/v1/jobs/{name}/logs", fake.handle)
    server = await aiohttp_server(app)
    client = AsyncClient(str(server.make_url("/")), token="test-token")
    try:
        yield client
    finally:
        await client.close()


async def collect(client: AsyncClient, **kwargs: Any) -> list[dict[str, Any]]:
    return [entry async for entry in client.logs("fit", **kwargs)]


async def test_a_stream_broken_mid_line_resumes_after_the_last_whole_line(
    aiohttp_server, fast_retries
) -> None:
    fake = FakeLogs([("break", 3), 503, ("break", 2)])
    async for client in serve(aiohttp_server, fake):
        got = await collect(client, follow=True, role="trainer", worker=["trainer-0", "trainer-1"])
    assert got == LINES  # nothing lost, nothing repeated
    assert [q.get("cursor") for q in fake.queries] == [None, ["c2"], ["c2"], ["c4"]]
    assert all(q["follow"] == ["1"] and q["worker"] == ["trainer-0", "trainer-1"] for q in fake.queries)
    assert all(q["role"] == ["trainer"] for q in fake.queries)


async def test_tail_is_asked_for_once_and_the_cursor_takes_over(aiohttp_server, fast_retries) -> None:
    fake = FakeLogs([("break", 1)])
    async for client in serve(aiohttp_server, fake):
        got = await collect(client, tail=4)
    assert got == LINES[-4:]
    assert fake.queries[0]["tail"] == ["4"] and "tail" not in fake.queries[1]
    assert fake.queries[1]["cursor"] == ["c6"]


async def test_it_gives_up_in_one_line_when_the_server_stays_away(aiohttp_server, fast_retries) -> None:
    fake = FakeLogs([("break", 2), *([503] * 1000)])
    async for client in serve(aiohttp_server, fake):
        got: list[dict[str, Any]] = []
        with pytest.raises(LogStreamLost) as caught:
            async for entry in client.logs("fit", follow=True, reconnect_for=0.3):
                got.append(entry)
    assert got == LINES[:2]
    assert caught.value.cursor == "c1"
    assert "lost the log stream of job fit and could not reconnect for 0.3s" in str(caught.value)
    assert "\n" not in str(caught.value)


async def test_refusals_are_not_retried(aiohttp_server, fast_retries) -> None:
    fake = FakeLogs(["missing"])
    async for client in serve(aiohttp_server, fake):
        with pytest.raises(ApiError) as caught:
            await collect(client)
    assert caught.value.status == 404 and len(fake.queries) == 1


def test_the_blocking_client_gives_a_plain_iterator(unused_tcp_port: int) -> None:
    # A real server in a thread would be needed for the blocking client; here it only has to
    # refuse cleanly and close what it opened when the iterator is dropped early.
    with Client(f"http://127.0.0.1:{unused_tcp_port}", token="t") as blocking:
        entries = blocking.logs("fit", reconnect_for=0.0)
        with pytest.raises(LogStreamLost, match="connection refused"):
            next(entries)


class FakeJobs:
    """GET jobs in pages (cursor = index of the next job) and GET jobs/{name} moving on a script."""

    def __init__(self, count: int, states: list[str]) -> None:
        self.jobs = [{"name": f"job-{i}", "state": "SUCCEEDED"} for i in range(count)]
        self.states = list(states)
        self.queries: list[dict[str, str]] = []

    async def list(self, request: web.Request) -> web.Response:
        self.queries.append(dict(request.query))
        start = int(request.query.get("cursor", "0"))
        limit = int(request.query["limit"])
        page = self.jobs[start : start + limit]
        following = start + limit if start + limit < len(self.jobs) else None
        return web.json_response({"jobs": page, "next_cursor": None if following is None else str(following)})

    async def one(self, request: web.Request) -> web.Response:
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return web.json_response({"name": request.match_info["name"], "state": state, "reason": "because"})


async def jobs_client(aiohttp_server: Any, fake: FakeJobs) -> AsyncClient:
    app = web.Application()
    app.router.add_get("/api/v1/jobs", fake.list)
    app.router.add_get("/api/v1/jobs/{name}", fake.one)
    server = await aiohttp_server(app)
    return AsyncClient(str(server.make_url("/")), token="test-token")


async def test_jobs_follows_the_cursor_to_the_end_or_the_limit(aiohttp_server, monkeypatch) -> None:
    monkeypatch.setattr(client_module, "JOBS_PAGE", 3)
    fake = FakeJobs(7, ["RUNNING"])
    client = await jobs_client(aiohttp_server, fake)
    try:
        assert [j["name"] for j in await client.jobs(all=True)] == [f"job-{i}" for i in range(7)]
        assert [q.get("cursor") for q in fake.queries] == [None, "3", "6"]
        assert all(q["all"] == "1" and q["limit"] == "3" for q in fake.queries)
        fake.queries.clear()
        assert len(await client.jobs(state=["FAILED", "KILLED"], limit=5)) == 5
        assert [(q.get("cursor"), q["limit"]) for q in fake.queries] == [(None, "3"), ("3", "2")]
        assert fake.queries[0]["state"] == "FAILED,KILLED" and "all" not in fake.queries[0]
    finally:
        await client.close()


async def test_wait_polls_until_a_final_state_or_the_timeout(aiohttp_server) -> None:
    fake = FakeJobs(0, ["PENDING", "RUNNING", "RUNNING", "KILLED"])
    client = await jobs_client(aiohttp_server, fake)
    try:
        assert (await client.wait("x", interval=0.01))["state"] == "KILLED"
        fake.states = ["RUNNING"]
        with pytest.raises(JobWaitTimeout, match=r"job x is still RUNNING after 0.05s \(because\)"):
            await client.wait("x", timeout=0.05, interval=0.01)
    finally:
        await client.close()
