"""Build logs on the builder's disk, one file per build, read with resumable cursors.

Both backends write a build's output here as it comes (pip's, or the Kaniko pod's log
stream) with the builder's own lines between (`[builder <time>] ...`), so a build's log
outlives its process or pod and every reader gets the same cursors: `b1.<byte offset>`,
just past the line it was given.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from pathlib import Path
from typing import BinaryIO

from paddlecloud.common.logstream import BadCursor, read_lines, tail_offset

from .backend import LogLine, LogQuery


class BuildLogs:
    """The log files under `directory`, `<log id>.log`."""

    def __init__(self, directory: Path, poll_seconds: float) -> None:
        self.directory = directory
        self._poll = poll_seconds

    def path(self, log_id: str) -> Path:
        return self.directory / f"{log_id}.log"

    async def read(
        self, log_id: str, query: LogQuery, finished: Callable[[], Awaitable[bool]]
    ) -> AsyncGenerator[list[LogLine], None]:
        """The log's lines in batches as they are written; a follow ends once `finished()`
        and every line was sent. BadCursor for a cursor this log did not hand out."""
        path = self.path(log_id)
        size = _size(path)
        if query.cursor is not None:
            offset = _decode_cursor(query.cursor)
            if offset > size:
                raise BadCursor(f"{query.cursor[:60]!r} is past the end of this build's log")
        elif query.tail is not None:
            offset = tail_offset(path, query.tail)
        else:
            offset = 0
        yield []  # the query is good: the caller may answer now, before the first line
        while True:
            final = await finished()  # decided before reading, so nothing written after is missed
            lines, offset, more = _read_lines(path, offset, final)
            if lines:
                yield lines
            if more:
                continue
            if final or not query.follow:
                return
            await asyncio.sleep(self._poll)


def say(out: BinaryIO, text: str) -> None:
    """One line of the builder's own in a build's log."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out.write(f"[builder {stamp}] {text}\n".encode())


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _encode_cursor(offset: int) -> str:
    return f"b1.{offset}"


def _decode_cursor(cursor: str) -> int:
    version, _, rest = cursor.partition(".")
    if version != "b1" or not rest.isdigit() or len(rest) > 15:
        raise BadCursor(f"{cursor[:60]!r} is not a log cursor of this build")
    return int(rest)


def _read_lines(path: Path, offset: int, final: bool) -> tuple[list[LogLine], int, bool]:
    """Whole lines from `offset` on, each with the cursor just past it, the offset after
    them, and whether more than one batch was waiting (see logstream.read_lines)."""
    read, more = read_lines(path, offset, final)
    lines = []
    for text, size in read:
        offset += size
        lines.append(LogLine(text, _encode_cursor(offset)))
    return lines, offset, more
