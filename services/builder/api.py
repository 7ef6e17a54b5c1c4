"""The builder service's HTTP API (docs/builder.md). Every call acts on the caller's own
builds: another user's build id is a 404, as if it did not exist."""

from __future__ import annotations

import json

from aiohttp import web

from paddlecloud.common import errors
from paddlecloud.common.keys import IDENTITY
from paddlecloud.common.web import json_response, read_json

from .backend import BadCursor, LogLine, LogQuery
from .keys import BUILDER

NDJSON = "application/x-ndjson"
BAD_CURSOR = errors.ErrorKind("ERR_BAD_CURSOR", 400, "Bad cursor")


def add_routes(app: web.Application) -> None:
    app.router.add_post("/api/v1/builds", request_build)
    app.router.add_get("/api/v1/builds/{id}", get_build)
    app.router.add_get("/api/v1/builds/{id}/logs", get_logs)


def _bad_query(name: str, message: str) -> errors.ProblemError:
    return errors.BAD_REQUEST(f"{name}: {message}", errors=[{"field": name, "message": message}])


def _flag(request: web.Request, name: str) -> bool:
    value = request.query.get(name, "0").lower()
    if value in ("1", "true", "yes", ""):
        return value != "" or name in request.query
    if value in ("0", "false", "no"):
        return False
    raise _bad_query(name, f"must be 1, 0, true or false, not {value[:40]!r}")


def _int(request: web.Request, name: str, low: int, high: int) -> int | None:
    text = request.query.get(name)
    if text is None:
        return None
    if not text.isdigit() or not low <= int(text) <= high:
        raise _bad_query(name, f"must be a whole number from {low} to {high}, not {text[:40]!r}")
    return int(text)


async def request_build(request: web.Request) -> web.Response:
    dry_run = _flag(request, "dry_run")
    body = await read_json(request)
    answer, status = await request.app[BUILDER].request(request[IDENTITY], body, dry_run=dry_run)
    response = json_response(answer, status=status)
    if status == 201:
        response.headers["Location"] = f"/api/v1/builds/{answer['id']}"
    return response


async def get_build(request: web.Request) -> web.Response:
    builder = request.app[BUILDER]
    build = await builder.get(request[IDENTITY].user, request.match_info["id"])
    return json_response(await builder.view(build))


async def get_logs(request: web.Request) -> web.StreamResponse:
    builder = request.app[BUILDER]
    build = await builder.get(request[IDENTITY].user, request.match_info["id"])
    query = LogQuery(
        tail=_int(request, "tail", 0, 10_000_000),
        follow=_flag(request, "follow"),
        cursor=request.query.get("cursor") or None,
    )
    ndjson = NDJSON in request.headers.get("Accept", "")
    lines = builder.logs(build, query)
    # The first batch comes once the query is checked, so a bad cursor is a 400 and not
    # a broken stream.
    try:
        first = await anext(lines, None)
    except BadCursor as exc:
        raise BAD_CURSOR(f"cursor: {exc}", errors=[{"field": "cursor", "message": str(exc)}]) from None
    response = web.StreamResponse(headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})
    response.content_type = NDJSON if ndjson else "text/plain"
    response.charset = "utf-8"
    response.enable_chunked_encoding()
    await response.prepare(request)
    batch: list[LogLine] | None = first
    try:
        while batch is not None:
            if ndjson:
                text = "".join(json.dumps({"line": x.line, "cursor": x.cursor}) + "\n" for x in batch)
            else:
                text = "".join(f"{x.line}\n" for x in batch)
            if text:
                await response.write(text.encode())
            batch = await anext(lines, None)
        await response.write_eof()
    except ConnectionResetError:
        pass  # the follower went away; it resumes from its last cursor
    finally:
        await lines.aclose()
    return response
