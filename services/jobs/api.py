"""The jobs service's HTTP API (docs/api.md, "API notes (jobs)"): parse, call the manager,
render. Every call acts on the caller's own jobs: another user's job is a 404, as if it did
not exist. An administrator may name another user's jobs with `?user=NAME`, and list every
user's with `?all_users=1` (docs/api.md); anyone else asking so is refused with a 403.
Refusals come from the domain as its errors (errors.py), which the service's middleware
shows as problems."""

from __future__ import annotations

import functools

from aiohttp import web
from pydantic import ValidationError

from paddlecloud.common import errors
from paddlecloud.common.keys import IDENTITY
from paddlecloud.common.logstream import stream_lines
from paddlecloud.common.store.models import ACTIVE_STATES, JOB_STATES, USER_NAME
from paddlecloud.common.web import (
    json_response,
    query_flag,
    query_int,
    query_problem,
    read_json,
    validation_problem,
)

from .backend import LogQuery
from .keys import MANAGER, VIEWERS
from .resources import finite_since
from .spec import RegistrySpec, parse_submission
from .viewer_proxy import relay
from .viewers import KINDS
from .views import DryRun, dry_run_view, event_view, job_view, registry_view, scalars_view

MAX_LIST_LIMIT = 500
MAX_TAG = 256
ROLES = {"pserver": "PSERVER", "trainer": "TRAINER"}


def add_routes(app: web.Application) -> None:
    app.router.add_post("/api/v1/jobs", submit)
    app.router.add_get("/api/v1/jobs", list_jobs)
    app.router.add_get("/api/v1/jobs/{name}", get_job)
    app.router.add_delete("/api/v1/jobs/{name}", kill_job)
    app.router.add_get("/api/v1/jobs/{name}/workers", get_workers)
    app.router.add_get("/api/v1/jobs/{name}/events", get_events)
    app.router.add_get("/api/v1/jobs/{name}/logs", get_logs)
    app.router.add_get("/api/v1/jobs/{name}/metrics", get_metrics)
    app.router.add_get("/api/v1/jobs/{name}/resources", get_resources)
    # A job's TensorBoard or VisualDL, and everything below it (viewer_proxy.py).
    for kind in KINDS:
        viewer_path = f"/api/v1/jobs/{{name}}/{kind}{{tail:(/.*)?}}"
        app.router.add_get(viewer_path, functools.partial(viewer, kind=kind))
        app.router.add_post(viewer_path, functools.partial(viewer, kind=kind))
    app.router.add_get("/api/v1/quota", get_quota)
    # Internal: the gateway calls it when an admin deletes a user (it is not proxied).
    app.router.add_delete("/api/v1/users/{name}/jobs", forget_user)
    app.router.add_get("/api/v1/registries", list_registries)
    app.router.add_post("/api/v1/registries", save_registry)
    app.router.add_delete("/api/v1/registries/{name}", delete_registry)


def _owner(request: web.Request) -> str:
    """Whose jobs the call is about: the caller's, or with `?user=NAME` that user's, which
    only an administrator may name."""
    identity = request[IDENTITY]
    user = request.query.get("user")
    if user is None or user == identity.user:
        return identity.user
    if not identity.admin:
        message = f"only administrators may see or stop another user's jobs, and {user[:40]!r} is not you"
        raise errors.FORBIDDEN(f"user: {message}", errors=[{"field": "user", "message": message}])
    if not USER_NAME.match(user):
        raise query_problem("user", f"{user[:40]!r} is not a user name")
    return user


async def submit(request: web.Request) -> web.Response:
    dry_run = query_flag(request, "dry_run")
    try:
        spec = parse_submission(await read_json(request))
    except ValidationError as exc:
        raise validation_problem(exc) from exc
    manager = request.app[MANAGER]
    result = await manager.submit(request[IDENTITY], spec, dry_run=dry_run)
    body = dry_run_view(result) if isinstance(result, DryRun) else job_view(result)
    notes = manager.backend.notes(spec)
    if notes:
        # Said at once, not only as an event the user may never read.
        body["warnings"] = notes
    if isinstance(result, DryRun):
        return json_response(body)
    response = json_response(body, status=201)
    response.headers["Location"] = f"/api/v1/jobs/{result.name}"
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
    owner: str | None = _owner(request)
    if query_flag(request, "all_users"):
        if not request[IDENTITY].admin:
            message = "only administrators may list every user's jobs"
            raise errors.FORBIDDEN(
                f"all_users: {message}", errors=[{"field": "all_users", "message": message}]
            )
        owner = None
    jobs, cursor = await request.app[MANAGER].list_jobs(
        owner, states=states or None, limit=limit, cursor=request.query.get("cursor")
    )
    return json_response({"jobs": [job_view(j) for j in jobs], "next_cursor": cursor})


async def get_job(request: web.Request) -> web.Response:
    manager = request.app[MANAGER]
    job = await manager.get(_owner(request), request.match_info["name"])
    view = job_view(job)
    view["events"] = [event_view(e) for e in await manager.events(job)]
    view["workers"] = [w.to_dict() for w in await manager.workers(job)]
    view["resources"] = await manager.peaks(job)
    return json_response(view)


async def get_resources(request: web.Request) -> web.Response:
    manager = request.app[MANAGER]
    job = await manager.get(_owner(request), request.match_info["name"])
    raw = request.query.get("since")
    try:
        since = finite_since(raw)
    except ValueError:
        message = f"{(raw or '')[:40]!r} is not a time: give Unix seconds, as the series' `t`"
        raise query_problem("since", message) from None
    return json_response(await manager.resources(job, since))


async def get_workers(request: web.Request) -> web.Response:
    manager = request.app[MANAGER]
    job = await manager.get(_owner(request), request.match_info["name"])
    return json_response({"workers": [w.to_dict() for w in await manager.workers(job)]})


async def get_events(request: web.Request) -> web.Response:
    manager = request.app[MANAGER]
    job = await manager.get(_owner(request), request.match_info["name"])
    return json_response({"events": [event_view(e) for e in await manager.events(job)]})


async def get_metrics(request: web.Request) -> web.Response:
    """The job's training curves (docs/metrics.md §2.3), `?tag=T` (repeatable) for some."""
    manager = request.app[MANAGER]
    job = await manager.get(_owner(request), request.match_info["name"])
    tags = request.query.getall("tag", [])
    if any(not tag or len(tag) > MAX_TAG for tag in tags):
        raise query_problem("tag", f"a tag is 1 to {MAX_TAG} characters")
    found = await manager.scalars(job, tags)
    return json_response(scalars_view(job.name, found))


async def kill_job(request: web.Request) -> web.Response:
    remove = query_flag(request, "rm")
    manager = request.app[MANAGER]
    if remove:
        # Its viewers go with it (what they serve is the job's, and a new job may take its name).
        await request.app[VIEWERS].stop_job(
            (await manager.get(_owner(request), request.match_info["name"])).id
        )
    job = await manager.kill(
        request[IDENTITY], request.match_info["name"], remove=remove, owner=_owner(request)
    )
    if job is None:
        return web.Response(status=204)
    return json_response(job_view(job))


async def viewer(request: web.Request, *, kind: str) -> web.StreamResponse:
    """The job's own viewer, for its owner only: it serves the owner's private files, so an
    administrator naming `?user=` is refused too (403), and another user's job is a 404."""
    identity = request[IDENTITY]
    user = request.query.get("user")
    if user is not None and user != identity.user:
        message = (
            f"a job's {kind} shows its owner's private files: only its owner "
            f"may open it, and {user[:40]!r} is not you (administrators included)"
        )
        raise errors.FORBIDDEN(f"user: {message}", errors=[{"field": "user", "message": message}])
    manager = request.app[MANAGER]
    job = await manager.get(identity.user, request.match_info["name"])
    viewers = request.app[VIEWERS]
    viewers.interpreter(kind)  # refused before anything is resolved when not offered
    prefix = f"/api/v1/jobs/{job.name}/{kind}"
    async with viewers.use(job, kind, manager.output(job), prefix) as upstream:
        return await relay(request, upstream)


async def forget_user(request: web.Request) -> web.Response:
    identity = request[IDENTITY]
    if not identity.admin:
        raise errors.FORBIDDEN("only an administrator may remove a user's jobs")
    removed = await request.app[MANAGER].forget_user(identity, request.match_info["name"])
    return json_response({"user": request.match_info["name"], "jobs_removed": removed})


async def get_quota(request: web.Request) -> web.Response:
    return json_response(await request.app[MANAGER].quota(request[IDENTITY].user))


async def list_registries(request: web.Request) -> web.Response:
    registries = await request.app[MANAGER].registries(request[IDENTITY].user)
    return json_response({"registries": [registry_view(r) for r in registries]})


async def save_registry(request: web.Request) -> web.Response:
    try:
        spec = RegistrySpec.model_validate(await read_json(request))
    except ValidationError as exc:
        raise validation_problem(exc) from exc
    registry = await request.app[MANAGER].save_registry(request[IDENTITY].user, spec)
    response = json_response(registry_view(registry), status=201)
    response.headers["Location"] = f"/api/v1/registries/{spec.name}"
    return response


async def delete_registry(request: web.Request) -> web.Response:
    await request.app[MANAGER].delete_registry(request[IDENTITY].user, request.match_info["name"])
    return web.Response(status=204)


async def get_logs(request: web.Request) -> web.StreamResponse:
    manager = request.app[MANAGER]
    job = await manager.get(_owner(request), request.match_info["name"])
    roles = set()
    for role in request.query.getall("role", []):
        if role.lower() not in ROLES:
            message = f"{role[:40]!r} is not a role; use pserver or trainer"
            raise query_problem("role", message)
        roles.add(ROLES[role.lower()])
    query = LogQuery(
        tail=query_int(request, "tail", 0, 10_000_000),
        follow=query_flag(request, "follow"),
        roles=roles,
        workers=set(request.query.getall("worker", [])),
        cursor=request.query.get("cursor") or None,
    )
    return await stream_lines(
        request,
        await manager.logs(request[IDENTITY], job, query),
        as_text=lambda x: f"[{x.worker}] {x.line}",
        json_fields=("worker", "line", "cursor"),
    )
