"""PFS's file endpoints (docs/pfs.md): download, ls, stat, mkdir, mv, rm, usage, and a
deleted user's home. Each handler parses its request, calls the file operations of
files.py (`Files`, which knows nothing of HTTP and holds the rules), and renders; the
domain's refusals become problems in the shared middleware (errors.PROBLEMS). Downloads
are sent from here (sendfile where the volume and the loop can, ranged reads otherwise)."""

from __future__ import annotations

import re
import time
from datetime import UTC
from email.utils import formatdate, parsedate_to_datetime
from urllib.parse import quote

import structlog
from aiohttp import web
from pydantic import BaseModel, ConfigDict

from paddlecloud.common import errors
from paddlecloud.common.keys import IDENTITY, REQUEST_ID
from paddlecloud.common.storage.base import Download
from paddlecloud.common.volume import PfsPath
from paddlecloud.common.web import REQUEST_ID_HEADER, json_response, parse_body

from .errors import RANGE_NOT_SATISFIABLE
from .keys import FILES, UPLOADS
from .listing import MAX_LIMIT, BadCursor, read_cursor

log = structlog.get_logger()


PREFIX = "/api/v1/pfs"


# How a storage quota holds, as `usage` says it (and `get quota` shows it).
STORAGE_ENFORCED = (
    "enforced by CephFS (ceph.quota.max_bytes on the home): uploads and jobs' own writes stop at the limit"
)
STORAGE_ADVISORY = (
    "advisory here: uploads and submits are refused once the home is at its limit, but this "
    "filesystem has no quota, so a running job's own writes into the home are not stopped"
)


def add_routes(app: web.Application) -> None:
    """The non-upload endpoints of docs/pfs.md, under /api/v1/pfs."""
    r = app.router
    r.add_get(f"{PREFIX}/files", get_file)  # and HEAD
    r.add_delete(f"{PREFIX}/files", delete_file)
    r.add_get(f"{PREFIX}/ls", list_path)
    r.add_get(f"{PREFIX}/stat", stat_path)
    r.add_post(f"{PREFIX}/mkdir", make_dir)
    r.add_post(f"{PREFIX}/mv", move)
    r.add_get(f"{PREFIX}/usage", usage)
    r.add_delete(f"{PREFIX}/homes/{{name}}", retire_home)


class MkdirBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    path: str
    parents: bool = False


class MoveBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    src: str
    dst: str
    overwrite: bool = False


def _query(request: web.Request, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, str]:
    """The query as exactly the parameters this endpoint takes, each at most once; else 400."""
    problems = []
    allowed = (*required, *optional)
    for key in dict.fromkeys(request.query.keys()):
        if key not in allowed:
            takes = ", ".join(allowed) or "none: the request is its JSON body"
            message = f"unknown query parameter (this call takes {takes})"
            problems.append({"field": key[:100], "message": message})
        elif len(request.query.getall(key)) > 1:
            problems.append({"field": key, "message": "given more than once"})
    for key in required:
        if key not in request.query:
            problems.append({"field": key, "message": "required"})
    if problems:
        summary = "; ".join(f"{p['field']}: {p['message']}" for p in problems)
        raise errors.BAD_REQUEST(summary, errors=problems)
    return {key: request.query[key] for key in allowed if key in request.query}


def _flag(query: dict[str, str], name: str) -> bool:
    value = query.get(name, "0")
    if value in ("1", "true"):
        return True
    if value in ("0", "false"):
        return False
    message = f"must be 1, 0, true or false, not {value[:40]!r}"
    raise errors.BAD_REQUEST(f"{name}: {message}", errors=[{"field": name, "message": message}])


def _resolve(request: web.Request, text: str, *, write: bool) -> PfsPath:
    return request.app[FILES].resolve(request[IDENTITY], text, write=write)


async def _listing(request: web.Request, path: PfsPath, recursive: bool) -> web.Response:
    entries = await request.app[FILES].listing(request[IDENTITY], path, recursive)
    return json_response({"path": path.text, "entries": entries})


async def get_file(request: web.Request) -> web.StreamResponse:
    """GET/HEAD files: a file's bytes (ranges, validators), or a directory's listing."""
    query = _query(request, ("path",))
    path = _resolve(request, query["path"], write=False)
    download = await request.app[FILES].open_file(request[IDENTITY], path)
    if download is None:
        return await _listing(request, path, recursive=False)
    try:
        return await _serve(request, path, download)
    finally:
        await download.close()


async def _serve(request: web.Request, path: PfsPath, download: Download) -> web.StreamResponse:
    """Stream the opened file with HTTP's validators and one byte range.

    FileResponse takes a path, and a path would be resolved again, outside our checks;
    so this sends what the volume opened (`_send`).
    """
    st = download.stat
    size = st.size
    modified = st.mtime_ns // 10**9
    etag = f'"{size:x}-{st.mtime_ns:x}-{st.ident}"'
    headers = {
        "ETag": etag,
        "Last-Modified": formatdate(modified, usegmt=True),
        "Accept-Ranges": "bytes",
        # Per user: no shared cache may keep it, and clients revalidate with the ETag.
        "Cache-Control": "private, no-cache",
        REQUEST_ID_HEADER: request[REQUEST_ID],
    }
    if _not_modified(request, etag, modified):
        return web.Response(status=304, headers=headers)

    status, start, length = 200, 0, size
    range_header = request.headers.get("Range")
    if range_header is not None and _if_range_holds(request.headers.get("If-Range"), etag, modified):
        span = _parse_range(range_header, size)
        if span is not None:
            first, last = span
            status, start, length = 206, first, last - first + 1
            headers["Content-Range"] = f"bytes {first}-{last}/{size}"

    response = web.StreamResponse(status=status, headers=headers)
    response.content_type = "application/octet-stream"
    response.content_length = length
    # User content is data, never a page for a browser to render or sniff.
    response.headers["Content-Disposition"] = f"attachment; filename*=UTF-8''{quote(path.name, safe='')}"
    response.headers["X-Content-Type-Options"] = "nosniff"
    await response.prepare(request)
    if request.method == "HEAD":
        await response.write_eof()
        return response
    try:
        sent = await _send(request, response, download, start, length)
    except ConnectionError:
        log.info("client_disconnected", path=path.text)
        return response
    if sent < length:
        # Truncated while we sent it: the length is promised, so cut the connection rather
        # than let a short body look complete.
        log.warning("download_truncated", path=path.text, sent=sent, promised=length)
        if request.transport is not None:
            request.transport.close()
        return response
    await response.write_eof()
    return response


async def _send(
    request: web.Request, response: web.StreamResponse, download: Download, start: int, length: int
) -> int:
    """Send `length` bytes of the file from `start` after the prepared headers; the bytes
    sent, fewer if the file ends sooner.

    Where the volume and the event loop can, the kernel copies them from the page cache to
    the socket (`Download.sendfile`: loop.sendfile). A 1 GiB download then costs pfs 0.1
    CPU-seconds rather than 0.4, and pfs and the gateway together about 15% less: CPU that
    the client shares with them on a small machine (docs/pfs.md, Throughput). uvloop has no
    sendfile, so the pfs service runs on asyncio's own loop. Elsewhere the volume's ranged
    reads (`Download.chunks`) are written as they come.
    """
    transport = request.transport
    if transport is None:
        raise ConnectionResetError("the client has gone")
    if length:
        sent_by_kernel = await download.sendfile(transport, start, length)
        if sent_by_kernel is not None:
            return sent_by_kernel
    sent = 0
    async for chunk in download.chunks(start, length):
        await response.write(chunk)
        sent += len(chunk)
    return sent


_ETAG = re.compile(r'(?:W/)?"[^"]*"')


def _not_modified(request: web.Request, etag: str, modified: int) -> bool:
    """If-None-Match (weak comparison), else If-Modified-Since (RFC 9110 §13.2.2)."""
    none_match = request.headers.get("If-None-Match")
    if none_match is not None:
        if none_match.strip() == "*":
            return True
        return any(tag.removeprefix("W/") == etag for tag in _ETAG.findall(none_match))
    since = _http_date(request.headers.get("If-Modified-Since"))
    return since is not None and since <= time.time() and modified <= since


def _if_range_holds(value: str | None, etag: str, modified: int) -> bool:
    """Whether a Range applies: no If-Range, or one naming exactly this version (strongly)."""
    if value is None:
        return True
    value = value.strip()
    if value.startswith('"'):
        return value == etag
    if value.startswith("W/"):
        return False  # weak tags never match in If-Range
    return _http_date(value) == modified


def _http_date(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        moment = parsedate_to_datetime(value)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return int(moment.timestamp())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


_BYTES_UNIT = re.compile(r"\s*bytes\s*=(.*)", re.IGNORECASE | re.DOTALL)


# Bounded digits: a position of 20 digits is already past any file, and Python's int()
# refuses very long strings with an error we would not want to turn into a 500.
_RANGE_SPEC = re.compile(r"([0-9]{1,20})-([0-9]{0,20})|-([0-9]{1,20})")


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """The one byte range asked for, as (first, last); None to send the whole file; 416 otherwise."""
    unit = _BYTES_UNIT.fullmatch(header)
    if unit is None:
        return None  # RFC 9110 §14.2: a range unit we do not know is ignored
    specs = [spec.strip() for spec in unit[1].split(",") if spec.strip()]

    def unsatisfiable(why: str) -> errors.ProblemError:
        return RANGE_NOT_SATISFIABLE(
            f"Range {header[:100]!r}: {why} (the file has {size} bytes)",
            headers={"Content-Range": f"bytes */{size}"},
        )

    if len(specs) != 1:
        raise unsatisfiable("exactly one range is served per request")
    match = _RANGE_SPEC.fullmatch(specs[0])
    if match is None:
        raise unsatisfiable("not a byte range")
    if match[3] is not None:
        suffix = int(match[3])
        if suffix == 0:
            raise unsatisfiable("an empty suffix range")
        if size == 0:
            return None  # the last N bytes of nothing: the whole (empty) file
        return max(0, size - suffix), size - 1
    first = int(match[1])
    last = int(match[2]) if match[2] else size - 1
    if last < first:
        raise unsatisfiable("the range ends before it starts")
    if first >= size:
        raise unsatisfiable("the range starts at or after the end")
    return first, min(last, size - 1)


async def list_path(request: web.Request) -> web.Response:
    """GET ls: a directory's entries (every descendant with recursive=1), or a file itself."""
    query = _query(request, ("path",), ("recursive", "limit", "after"))
    recursive = _flag(query, "recursive")
    limit = _limit(query)
    path = _resolve(request, query["path"], write=False)
    if limit is None:
        return await _listing(request, path, recursive)
    resume: tuple[str, ...] = ()
    if "after" in query:
        try:
            resume = read_cursor(query["after"], path, recursive)
        except BadCursor as exc:
            problems = [{"field": "after", "message": str(exc)}]
            raise errors.BAD_REQUEST(f"after: {exc}", errors=problems) from None
    entries, cursor = await request.app[FILES].page(
        request[IDENTITY], path, recursive=recursive, resume=resume, limit=limit
    )
    return json_response({"path": path.text, "entries": entries, "next": cursor})


def _limit(query: dict[str, str]) -> int | None:
    """`limit`, the entries a page holds (1 to listing.MAX_LIMIT); None: the whole listing at once."""
    if "limit" not in query:
        if "after" in query:
            message = "a cursor continues a paged listing: give limit too"
            raise errors.BAD_REQUEST(f"after: {message}", errors=[{"field": "after", "message": message}])
        return None
    value = query["limit"]
    if not (len(value) <= 6 and value.isascii() and value.isdigit() and 1 <= int(value) <= MAX_LIMIT):
        message = f"must be a whole number from 1 to {MAX_LIMIT}, not {value[:40]!r}"
        raise errors.BAD_REQUEST(f"limit: {message}", errors=[{"field": "limit", "message": message}])
    return int(value)


async def stat_path(request: web.Request) -> web.Response:
    """GET stat: one entry; with checksum=sha256 a file's also carries its sha256."""
    query = _query(request, ("path",), ("checksum",))
    checksum = query.get("checksum")
    if checksum is not None and checksum != "sha256":
        message = f"only sha256 is offered, not {checksum[:40]!r}"
        raise errors.BAD_REQUEST(f"checksum: {message}", errors=[{"field": "checksum", "message": message}])
    path = _resolve(request, query["path"], write=False)
    return json_response(await request.app[FILES].stat(path, sha256=checksum is not None))


async def make_dir(request: web.Request) -> web.Response:
    """POST mkdir: 201 with the new directory's entry; 200 if it existed and `parents` is set."""
    _query(request, ())  # everything is in the body
    body = await parse_body(request, MkdirBody)
    path = _resolve(request, body.path, write=True)
    created, entry = await request.app[FILES].mkdir(path, parents=body.parents)
    return json_response(entry, status=201 if created else 200)


async def delete_file(request: web.Request) -> web.Response:
    """DELETE files: 204; a directory with content needs recursive=1."""
    query = _query(request, ("path",), ("recursive",))
    recursive = _flag(query, "recursive")
    path = _resolve(request, query["path"], write=True)
    await request.app[FILES].remove(path, recursive=recursive)
    return web.Response(status=204)


async def move(request: web.Request) -> web.Response:
    """POST mv: 200 with the destination's entry; never replaces a directory."""
    _query(request, ())  # everything is in the body
    body = await parse_body(request, MoveBody)
    src = _resolve(request, body.src, write=True)
    dst = _resolve(request, body.dst, write=True)
    return json_response(await request.app[FILES].move(src, dst, overwrite=body.overwrite))


async def retire_home(request: web.Request) -> web.Response:
    """DELETE homes/{name}: a deleted user's home, archived (`archive=1`, the default) or
    removed, and their unfinished uploads ended. Admins only (the gateway, deleting a user)."""
    files = request.app[FILES]
    name = request.match_info["name"]
    files.check_retirement(request[IDENTITY], name)
    archive = _flag(_query(request, (), ("archive",)), "archive") if "archive" in request.query else True
    uploads = await request.app[UPLOADS].forget_user(name)
    where = await files.retire_home(name, archive=archive)
    log.info("home_retired", user=name, archived_to=where, uploads_ended=uploads)
    return json_response({"user": name, "archived_to": where, "uploads_ended": uploads})


async def usage(request: web.Request) -> web.Response:
    """GET usage: bytes and files in a home, and the owner's storage quota."""
    query = _query(request, (), ("user",))
    home = await request.app[FILES].usage_of(request[IDENTITY], query.get("user"))
    return json_response(
        {
            "user": home.user,
            "bytes": home.bytes,
            "files": home.files,
            "limit": home.limit,
            # Whether the filesystem holds jobs' own writes to the limit too (docs/security.md).
            "enforced": home.enforced,
            "enforcement": STORAGE_ENFORCED if home.enforced else STORAGE_ADVISORY,
        }
    )
