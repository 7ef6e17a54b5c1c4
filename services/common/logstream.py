"""What the jobs and builder services share about logs kept in files and streamed to followers."""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from . import errors

NDJSON = "application/x-ndjson"
BAD_CURSOR = errors.ErrorKind("ERR_BAD_CURSOR", 400, "Bad cursor")

Line = TypeVar("Line")


class BadCursor(ValueError):
    """A log cursor this service did not hand out."""


def tail_offset(path: Path, lines: int) -> int:
    """The offset where the last `lines` whole lines of a file begin (0 for a missing file)."""
    try:
        with open(path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            if lines <= 0:
                return end
            pos, found = end, 0
            skip_last_newline = True  # the newline that ends the last line starts nothing
            while pos > 0:
                size = min(64 * 1024, pos)
                pos -= size
                f.seek(pos)
                chunk = f.read(size)
                i = len(chunk)
                while (i := chunk.rfind(b"\n", 0, i)) >= 0:
                    if skip_last_newline and pos + i == end - 1:
                        skip_last_newline = False
                        continue
                    found += 1
                    if found == lines:
                        return pos + i + 1
                skip_last_newline = False
            return 0
    except FileNotFoundError:
        return 0


async def stream_lines(
    request: web.Request,
    batches: AsyncGenerator[list[Line], None],
    *,
    as_text: Callable[[Line], str],
    as_json: Callable[[Line], dict[str, Any]],
) -> web.StreamResponse:
    """Send batches of log lines as they come: text lines, or NDJSON (one object with its
    cursor per line) when the client's Accept asks for it. The first batch is awaited
    before answering, so a bad cursor (BadCursor) is a 400 and not a broken stream; a
    follower that goes away ends the stream quietly (it resumes from its last cursor)."""
    import json

    ndjson = NDJSON in request.headers.get("Accept", "")
    try:
        first = await anext(batches, None)
    except BadCursor as exc:
        await batches.aclose()
        raise BAD_CURSOR(f"cursor: {exc}", errors=[{"field": "cursor", "message": str(exc)}]) from None
    response = web.StreamResponse(headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})
    response.content_type = NDJSON if ndjson else "text/plain"
    response.charset = "utf-8"
    response.enable_chunked_encoding()
    await response.prepare(request)
    batch = first
    try:
        while batch is not None:
            if ndjson:
                text = "".join(json.dumps(as_json(line)) + "\n" for line in batch)
            else:
                text = "".join(as_text(line) + "\n" for line in batch)
            if text:
                await response.write(text.encode())
            batch = await anext(batches, None)
        await response.write_eof()
    except ConnectionResetError:
        pass
    finally:
        await batches.aclose()
    return response
