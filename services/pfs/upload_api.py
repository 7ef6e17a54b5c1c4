"""PFS's upload endpoints: tus 1.0 (TUS.md, docs/pfs.md) over the uploads of uploads.py.

Each handler reads the tus headers into values, hands the body to the uploads as a
byte source, and writes the tus headers of the answer; the uploads know no HTTP. Their
refusals (domain errors) become problems here, once (`_problem`), so that they too carry
the tus headers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

from paddlecloud.common import errors
from paddlecloud.common.errors import DomainError, ProblemError, problem_for_domain
from paddlecloud.common.keys import IDENTITY, REQUEST_ID

from . import tus
from .errors import (
    BAD_HEADER,
    PROBLEMS,
    UPLOAD_TOO_LARGE,
    OverMaxSize,
)
from .keys import UPLOADS
from .records import Record
from .uploads import ByteSource, Uploads

log = structlog.get_logger()

PREFIX = "/api/v1/pfs/uploads"


def body_of(request: web.Request) -> ByteSource:
    """The request's body as the uploads read it: piece by piece, as it arrives."""

    async def read() -> bytes:
        try:
            return await request.content.readany()
        except web.RequestPayloadError as exc:  # a body cut short: the connection broke
            raise ConnectionError(str(exc)) from exc

    return read


def _headers(**extra: str) -> dict[str, str]:
    return {"Tus-Resumable": tus.VERSION, **extra}


async def _state_headers(uploads: Uploads, record: Record, offset: int) -> dict[str, str]:
    headers = _headers(**{"Upload-Offset": str(offset)})
    if record.state == "complete":
        headers["PaddleCloud-Path"] = record.path
        headers["PaddleCloud-Sha256"] = record.result_sha256 or ""
    else:
        headers["Upload-Expires"] = tus.http_date(await uploads.expiry(record))
    return headers


def _method(request: web.Request) -> str:
    # tus: clients behind proxies that only pass GET and POST name the real method here.
    return request.headers.get("X-HTTP-Method-Override", request.method).strip().upper()


async def options(request: web.Request) -> web.Response:
    uploads = request.app[UPLOADS]
    return web.Response(
        status=204,
        headers=_headers(
            **{
                "Tus-Version": tus.VERSION,
                "Tus-Extension": ",".join(tus.EXTENSIONS),
                "Tus-Max-Size": str(uploads.max_size),
                "Tus-Checksum-Algorithm": ",".join(tus.CHECKSUMS),
            }
        ),
    )


async def create(request: web.Request) -> web.Response:
    """POST: creation, creation-defer-length and creation-with-upload."""
    uploads = request.app[UPLOADS]
    identity = request[IDENTITY]
    length = tus.parse_size(request.headers, "Upload-Length")
    deferred = tus.parse_defer_length(request.headers)
    if (length is None) == (not deferred):
        raise BAD_HEADER("Send either Upload-Length or Upload-Defer-Length: 1 (not both).")
    metadata = tus.parse_metadata(request.headers.get("Upload-Metadata"))
    with_body = request.body_exists and request.content_length != 0
    if with_body and request.content_type != tus.OFFSET_OCTET_STREAM:
        raise errors.UNSUPPORTED_MEDIA_TYPE(
            f"A body sent with the creation must be {tus.OFFSET_OCTET_STREAM}, not {request.content_type}."
        )
    checksum = tus.parse_checksum(request.headers) if with_body else None
    if with_body and length is not None and (request.content_length or 0) > length:
        raise UPLOAD_TOO_LARGE(f"The body is longer than Upload-Length ({length}); nothing was created.")
    record = await uploads.create(identity, length, metadata)
    location = f"{PREFIX}/{record.id}"
    headers = _headers(Location=location, **{"Upload-Expires": tus.http_date(record.expires)})
    if length != 0 and not with_body:
        return web.Response(status=201, headers=headers)
    try:
        record, offset = await uploads.receive_first(record, identity, body_of(request), checksum)
    except DomainError as exc:
        answer = _problem(uploads, exc)
        answer.headers.update(Location=location)
        raise answer from exc
    headers.update(await _state_headers(uploads, record, offset))
    headers["Location"] = location
    return web.Response(status=201, headers=headers)


async def head(request: web.Request, upload_id: str) -> web.Response:
    uploads = request.app[UPLOADS]
    identity = request[IDENTITY]
    record, offset = await uploads.status(upload_id, identity)
    headers = await _state_headers(uploads, record, offset)
    headers["Cache-Control"] = "no-store"
    if record.length is None:
        headers["Upload-Defer-Length"] = "1"
    else:
        headers["Upload-Length"] = str(record.length)
    if record.metadata:
        headers["Upload-Metadata"] = record.metadata
    return web.Response(status=200, headers=headers)


async def patch(request: web.Request, upload_id: str) -> web.Response:
    uploads = request.app[UPLOADS]
    identity = request[IDENTITY]
    if request.content_type != tus.OFFSET_OCTET_STREAM:
        raise errors.UNSUPPORTED_MEDIA_TYPE(
            f"PATCH bodies are {tus.OFFSET_OCTET_STREAM}, not {request.content_type or 'untyped'}."
        )
    offset = tus.parse_size(request.headers, "Upload-Offset")
    if offset is None:
        raise BAD_HEADER("PATCH needs Upload-Offset: the offset this body starts at.")
    checksum = tus.parse_checksum(request.headers)
    new_length = tus.parse_size(request.headers, "Upload-Length")
    record, current = await uploads.append(
        upload_id, identity, body_of(request), request.content_length, offset, checksum, new_length
    )
    return web.Response(status=204, headers=await _state_headers(uploads, record, current))


async def delete(request: web.Request, upload_id: str) -> web.Response:
    uploads = request.app[UPLOADS]
    identity = request[IDENTITY]
    await uploads.end(upload_id, identity)
    return web.Response(status=204, headers=_headers())


def _problem(uploads: Uploads, exc: ProblemError | DomainError) -> ProblemError:
    """A refusal as its problem (errors.PROBLEMS); one over Tus-Max-Size names that size."""
    if isinstance(exc, ProblemError):
        return exc
    problem = problem_for_domain(exc, PROBLEMS)
    if isinstance(exc, OverMaxSize):
        problem.headers["Tus-Max-Size"] = str(uploads.max_size)
    return problem


async def _tus(request: web.Request, handler: Callable[[], Awaitable[web.Response]]) -> web.Response:
    """Every answer, refusals included, speaks tus; statuses tus adds get their reason phrase."""
    try:
        return await handler()
    except (ProblemError, DomainError) as caught:
        exc = _problem(request.app[UPLOADS], caught)
        exc.headers.setdefault("Tus-Resumable", tus.VERSION)
        reason = tus.REASONS.get(exc.kind.status)
        if reason is None:
            if exc is caught:
                raise
            raise exc from caught
        response = errors.problem_response(exc.body(request.get(REQUEST_ID)), exc.headers)
        response.set_status(exc.kind.status, reason)
        return response


async def collection(request: web.Request) -> web.Response:
    async def dispatch() -> web.Response:
        method = _method(request)
        if method == "OPTIONS":
            return await options(request)
        tus.check_version(request.headers)
        if method == "POST":
            return await create(request)
        raise errors.METHOD_NOT_ALLOWED(
            f"{method} is not allowed on {PREFIX}: OPTIONS, or POST to create an upload.",
            headers={"Allow": "OPTIONS, POST"},
        )

    return await _tus(request, dispatch)


async def resource(request: web.Request) -> web.Response:
    upload_id = request.match_info["upload_id"]

    async def dispatch() -> web.Response:
        method = _method(request)
        if method == "OPTIONS":
            return await options(request)
        tus.check_version(request.headers)
        if method == "HEAD":
            return await head(request, upload_id)
        if method == "PATCH":
            return await patch(request, upload_id)
        if method == "DELETE":
            return await delete(request, upload_id)
        raise errors.METHOD_NOT_ALLOWED(
            f"{method} is not allowed on an upload: HEAD, PATCH or DELETE.",
            headers={"Allow": "OPTIONS, HEAD, PATCH, DELETE"},
        )

    return await _tus(request, dispatch)


def add_routes(app: web.Application) -> None:
    """The tus endpoints: the collection (OPTIONS, POST) and each upload (HEAD, PATCH, DELETE)."""
    app.router.add_route("*", PREFIX, collection)
    app.router.add_route("*", PREFIX + "/{upload_id}", resource)
