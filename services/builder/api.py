"""The builder service's HTTP API (docs/builder.md): parse, call the builder, render. Every
call acts on the caller's own builds: another user's build id is a 404, as if it did not
exist. Refusals come from the domain as its errors (errors.py)."""

from __future__ import annotations

from aiohttp import web

from paddlecloud.common.keys import IDENTITY
from paddlecloud.common.logstream import stream_lines
from paddlecloud.common.web import json_response, query_flag, query_int, read_json, validate

from .backend import LogQuery
from .keys import BUILDER
from .spec import BuildSpec


def add_routes(app: web.Application) -> None:
    app.router.add_post("/api/v1/builds", request_build)
    app.router.add_get("/api/v1/builds/{id}", get_build)
    app.router.add_get("/api/v1/builds/{id}/logs", get_logs)


async def request_build(request: web.Request) -> web.Response:
    dry_run = query_flag(request, "dry_run")
    spec = validate(BuildSpec, await read_json(request))
    builder = request.app[BUILDER]
    if dry_run:
        planned = await builder.plan(request[IDENTITY], spec)
        return json_response({"key": planned.key, "cached": planned.cached})
    answer = await builder.request(request[IDENTITY], spec)
    response = json_response(
        await builder.view(answer.build, cached=answer.cached), status=201 if answer.created else 200
    )
    if answer.created:
        response.headers["Location"] = f"/api/v1/builds/{answer.build.id}"
    return response


async def get_build(request: web.Request) -> web.Response:
    builder = request.app[BUILDER]
    build = await builder.get(request[IDENTITY].user, request.match_info["id"])
    return json_response(await builder.view(build))


async def get_logs(request: web.Request) -> web.StreamResponse:
    builder = request.app[BUILDER]
    build = await builder.get(request[IDENTITY].user, request.match_info["id"])
    query = LogQuery(
        tail=query_int(request, "tail", 0, 10_000_000),
        follow=query_flag(request, "follow"),
        cursor=request.query.get("cursor") or None,
    )
    return await stream_lines(
        request,
        builder.logs(build, query),
        as_text=lambda x: x.line,
        json_fields=("line", "cursor"),
    )
