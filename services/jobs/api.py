"""The jobs service's HTTP API (docs/api.md, "API notes (jobs)"). Every call acts on the
caller's own jobs: another user's job is a 404, as if it did not exist."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import replace

from aiohttp import web

from paddlecloud.builder.client import BuilderError
from paddlecloud.common import errors
from paddlecloud.common.internal_auth import Identity
from paddlecloud.common.keys import IDENTITY, STORE
from paddlecloud.common.logstream import BAD_CURSOR, BadCursor, stream_lines
from paddlecloud.common.store import Job, StoreError
from paddlecloud.common.store.models import ACTIVE_STATES, JOB_STATES, TERMINAL_STATES
from paddlecloud.common.web import json_response, query_flag, query_int, query_problem, read_json

from .backend import LogLine, LogQuery
from .keys import MANAGER
from .manager import JobManager, event_view, job_view

MAX_LIST_LIMIT = 500
ROLES = {"pserver": "PSERVER", "trainer": "TRAINER"}
BUILD = "build"  # the pseudo-worker whose lines are the job's environment build


def add_routes(app: web.Application) -> None:
    app.router.add_post("/api/v1/jobs", submit)
    app.router.add_get("/api/v1/jobs", list_jobs)
    app.router.add_get("/api/v1/jobs/{name}", get_job)
    app.router.add_delete("/api/v1/jobs/{name}", kill_job)
    app.router.add_get("/api/v1/jobs/{name}/workers", get_workers)
    app.router.add_get("/api/v1/jobs/{name}/events", get_events)
    app.router.add_get("/api/v1/jobs/{name}/logs", get_logs)
    app.router.add_get("/api/v1/quota", get_quota)


async def submit(request: web.Request) -> web.Response:
    dry_run = query_flag(request, "dry_run")
    body = await read_json(request)
    result = await request.app[MANAGER].submit(request[IDENTITY], body, dry_run=dry_run)
    if dry_run:
        return json_response(result)
    response = json_response(result, status=201)
    response.headers["Location"] = f"/api/v1/jobs/{result['name']}"
    return response


async def list_jobs(request: web.Request) -> web.Response:
    states: set[str] = set()
    for value in request.query.getall("state", []):
        for state in value.split(","):
            if state.strip().upper() not in JOB_STATES:
                message = f"{state[:40]!r} is not a job state; use one of {', '.join(JOB_STATES)}"
                raise query_problem("state", message)
            states.add(state.strip().upper())
    if not states and not query_flag(request, "all"):
        states = set(ACTIVE_STATES)
    limit = query_int(request, "limit", 1, MAX_LIST_LIMIT, default=50)
    assert limit is not None
    try:
        jobs, cursor = await request.app[STORE].list_jobs(
            request[IDENTITY].user, states=states or None, limit=limit, cursor=request.query.get("cursor")
        )
    except StoreError as exc:  # the only one list_jobs raises for what it was given: a bad cursor
        raise BAD_CURSOR(f"cursor: {exc}") from None
    return json_response({"jobs": [job_view(j) for j in jobs], "next_cursor": cursor})


async def get_job(request: web.Request) -> web.Response:
    manager = request.app[MANAGER]
    job = await manager.get(request[IDENTITY].user, request.match_info["name"])
    view = job_view(job)
    view["events"] = await manager.events(job)
    view["workers"] = [w.to_dict() for w in await manager.backend.workers(job)]
    return json_response(view)


async def get_workers(request: web.Request) -> web.Response:
    manager = request.app[MANAGER]
    job = await manager.get(request[IDENTITY].user, request.match_info["name"])
    return json_response({"workers": [w.to_dict() for w in await manager.backend.workers(job)]})


async def get_events(request: web.Request) -> web.Response:
    manager = request.app[MANAGER]
    job = await manager.get(request[IDENTITY].user, request.match_info["name"])
    events = await request.app[STORE].list_events(job.id)
    return json_response({"events": [event_view(e) for e in events]})


async def kill_job(request: web.Request) -> web.Response:
    remove = query_flag(request, "rm")
    job = await request.app[MANAGER].kill(request[IDENTITY], request.match_info["name"], remove=remove)
    if job is None:
        return web.Response(status=204)
    return json_response(job_view(job))


async def get_quota(request: web.Request) -> web.Response:
    return json_response(await request.app[MANAGER].quota(request[IDENTITY].user))


async def get_logs(request: web.Request) -> web.StreamResponse:
    manager = request.app[MANAGER]
    job = await manager.get(request[IDENTITY].user, request.match_info["name"])
    roles = set()
    for role in request.query.getall("role", []):
        if role.lower() not in ROLES:
            message = f"{role[:40]!r} is not a role; use pserver or trainer"
            raise query_problem("role", message)
        roles.add(ROLES[role.lower()])
    workers = set(request.query.getall("worker", []))
    known = {w.name for w in await manager.backend.workers(job)} | ({BUILD} if job.build_id else set())
    unknown = sorted(workers - known)
    if unknown:
        names = ", ".join(sorted(known)) or "none yet"
        message = f"job {job.name!r} has no worker {unknown[0][:60]!r}; its workers: {names}"
        raise errors.NOT_FOUND(message, errors=[{"field": "worker", "message": message}])
    query = LogQuery(
        tail=query_int(request, "tail", 0, 10_000_000),
        follow=query_flag(request, "follow"),
        roles=roles,
        workers=workers,
        cursor=request.query.get("cursor") or None,
    )
    return await stream_lines(
        request,
        _job_lines(manager, request[IDENTITY], job, query),
        as_text=lambda x: f"[{x.worker}] {x.line}",
        as_json=lambda x: {"worker": x.worker, "line": x.line, "cursor": x.cursor},
    )


async def _job_lines(
    manager: JobManager, identity: Identity, job: Job, query: LogQuery
) -> AsyncGenerator[list[LogLine], None]:
    """The build's log (as worker `build`, cursors `b.<builder's cursor>`) when the job had
    one, then the workers' logs; a follower waits for the job to start between the two."""
    cursor = query.cursor
    wanted = not query.roles and (not query.workers or BUILD in query.workers)
    if job.build_id and cursor is not None and cursor.startswith("b."):
        if not wanted:
            cursor = None
    if job.build_id and wanted and (cursor is None or cursor.startswith("b.")):
        try:
            async for item in manager.builder.logs(
                identity, job.build_id, follow=query.follow, cursor=cursor[2:] if cursor else None
            ):
                yield [LogLine(BUILD, item["line"], "b." + item["cursor"])]
        except BuilderError as exc:
            if exc.status == 400:
                raise BadCursor(exc.detail) from None
            yield [LogLine(BUILD, f"(the build's log is not available: {exc.detail})", cursor or "b.")]
        cursor = None
    if cursor is not None and cursor.startswith("b."):
        raise BadCursor(f"{cursor[:60]!r}: this job had no build")
    while query.follow and not job.backend and job.state not in TERMINAL_STATES:
        await asyncio.sleep(0.1)  # built, not started yet
        latest = await manager.find(job.id)
        if latest is None:
            return
        job = latest
    if job.backend and (not query.workers or set(query.workers) - {BUILD}):
        async for batch in manager.backend.logs(job, replace(query, cursor=cursor)):
            yield batch
