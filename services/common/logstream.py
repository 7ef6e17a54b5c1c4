"""What the jobs and builder services share about logs kept in files and streamed to followers."""

from __future__ import annotations

import operator
import os
from collections.abc import AsyncGenerator, Callable
from json.encoder import encode_basestring_ascii as escape
from pathlib import Path
from typing import TypeVar

from aiohttp import web

from . import errors

NDJSON = "application/x-ndjson"
BAD_CURSOR = errors.BAD_CURSOR

Line = TypeVar("Line")
# A longer line without a newline is cut into pieces of this size.
LOG_READ_SIZE = 64 * 1024
# At most this much of a log is read at a time.
LOG_BATCH_SIZE = 4 * 1024 * 1024


BadCursor = errors.BadCursor


def tail_offset(path: Path, lines: int, floor: int = 0) -> int:
    """The offset where the last `lines` whole lines of a file begin (0 for a missing file),
    looking no further back than `floor` (where a capped log's kept bytes begin)."""
    try:
        with open(path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            if lines <= 0:
                return end
            pos, found = end, 0
            skip_last_newline = True  # the newline that ends the last line starts nothing
            while pos > floor:
                size = min(64 * 1024, pos - floor)
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
            return min(floor, end)
    except FileNotFoundError:
        return 0


def read_lines(path: Path, offset: int, final: bool) -> tuple[list[tuple[str, int]], bool]:
    """Whole lines of a log file from `offset` on, each with the bytes it takes in the file,
    and whether more than one batch was waiting.

    A line longer than LOG_READ_SIZE comes in pieces of that size; a last line without its
    newline waits for more unless the log is `final`. A missing file has no lines yet.
    """
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(LOG_BATCH_SIZE)
    except FileNotFoundError:
        return [], False
    whole = len(data) < LOG_BATCH_SIZE  # the file's end is in this batch
    pieces = data.split(b"\n")
    rest = pieces.pop()  # what follows the last newline: a line still being written
    if len(rest) >= LOG_READ_SIZE or (pieces and max(map(len, pieces)) >= LOG_READ_SIZE):
        return _cut_lines(data, final and whole), not whole
    # Split by the C string methods, not a loop per line: a burst of short lines is the
    # common case, and the jobs service reads every line of every follower's log.
    if data.isascii():  # most logs: decoded at once, the sizes are the lengths
        lines = [(text, len(text) + 1) for text in data[: len(data) - len(rest)].decode("ascii").split("\n")]
        lines.pop()  # the empty string after the last newline
    else:
        lines = [(piece.decode("utf-8", errors="replace"), len(piece) + 1) for piece in pieces]
    if rest and final and whole:
        lines.append((rest.decode("utf-8", errors="replace"), len(rest)))
    return lines, not whole


def _cut_lines(data: bytes, final: bool) -> list[tuple[str, int]]:
    """read_lines for a batch with a line longer than LOG_READ_SIZE: such a line in pieces."""
    lines: list[tuple[str, int]] = []
    start = 0
    while start < len(data):
        end = data.find(b"\n", start, start + LOG_READ_SIZE)
        if end < 0:
            if len(data) - start >= LOG_READ_SIZE:
                end = start + LOG_READ_SIZE - 1  # an endless line, cut
            elif final:
                end = len(data) - 1
            else:
                break
            piece = data[start : end + 1]
        else:
            piece = data[start:end]
        lines.append((piece.decode("utf-8", errors="replace"), end + 1 - start))
        start = end + 1
    return lines


async def stream_lines(
    request: web.Request,
    batches: AsyncGenerator[list[Line], None],
    *,
    as_text: Callable[[Line], str],
    json_fields: tuple[str, ...],
) -> web.StreamResponse:
    """Send batches of log lines as they come: text lines, or NDJSON (one object per line of
    the lines' string attributes `json_fields`, its cursor among them) when the client's
    Accept asks for it. The first batch is awaited before answering, so a bad cursor
    (BadCursor) is a 400 and not a broken stream; a follower that goes away ends the stream
    quietly (it resumes from its last cursor)."""
    ndjson = NDJSON in request.headers.get("Accept", "")
    try:
        first = await anext(batches, None)
    except BadCursor:
        await batches.aclose()
        raise  # shown as a 400 naming the cursor, by the service's problem table
    # What json.dumps writes for such an object, without building a dict and an encoder per
    # line (a third of the jobs service's time in a burst): the stdlib's string escaping,
    # between the keys written once.
    template = "{" + ", ".join(f"{escape(name)}: %s" for name in json_fields) + "}\n"
    get = operator.attrgetter(*json_fields)
    fields = get if len(json_fields) > 1 else lambda line: (get(line),)
    response = web.StreamResponse(headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})
    response.content_type = NDJSON if ndjson else "text/plain"
    response.charset = "utf-8"
    response.enable_chunked_encoding()
    await response.prepare(request)
    batch = first
    try:
        while batch is not None:
            if ndjson:
                text = "".join([template % tuple(map(escape, fields(line))) for line in batch])
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
