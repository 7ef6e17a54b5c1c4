"""A worker's log with a cap: the supervisor writes it, and drops its oldest bytes beyond the cap.

Why the supervisor writes it. A worker's stdout and stderr used to be the log file
itself, so nothing could bound what a worker wrote but the disk. Now they are a pipe,
and the supervisor copies what comes out of it into `logs/<worker>.log` (a worker that
writes faster than the supervisor copies waits on the pipe), so every byte that reaches
the disk is counted as it is written, whatever the worker does with its descriptors.

Why holes, not rotation. Log readers hold byte offsets into the file (the NDJSON cursors
of `logs -f`, services/common/logstream.py). When a log grows past its cap, its oldest
bytes are dropped by punching a hole over them (fallocate PUNCH_HOLE): the blocks go
back to the filesystem, and every offset stays where it was, so a follower never breaks
and never repeats a line. The file's apparent size keeps growing; its allocated blocks
stay under the cap (plus one copy and a block). Where the filesystem cannot punch holes,
the log keeps its first `cap` bytes instead and says so in a last line.

`<worker>.log.dropped` records the offset below which the bytes were dropped (written
before the hole is punched, so a reader that reads it after the data knows whether what
it read was dropped meanwhile), with the cap, so readers can say what was dropped in a
marker line where the dropped bytes were.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
from dataclasses import dataclass
from pathlib import Path

from paddlecloud.common.quantity import format_bytes, readable_bytes

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
# The oldest bytes are dropped in steps of an eighth of the cap (at least this much), so a
# busy log is trimmed now and then, not on every write.
MIN_STEP = 64 * 1024
# How far past the cut a new line is looked for, so the kept part begins with a whole line.
LINE_SEARCH = 64 * 1024
SETTING = "jobs.log_max_bytes"


@dataclass(frozen=True)
class Dropped:
    """What a log dropped: every byte below `offset`, under a cap of `cap` bytes."""

    offset: int = 0
    cap: int = 0

    def marker(self, since: int) -> str:
        """The line that stands for what was dropped after a reader's offset `since`."""
        return (
            f"--- {readable_bytes(self.offset - since)} of older output dropped: each worker's log "
            f"keeps its newest {format_bytes(self.cap)} ({SETTING}) ---"
        )


def dropped_path(log: Path) -> Path:
    return log.with_name(log.name + ".dropped")


def read_dropped(log: Path) -> Dropped:
    """What the log at `log` dropped so far (nothing, for a log that never reached its cap)."""
    try:
        data = json.loads(dropped_path(log).read_text(encoding="utf-8"))
        return Dropped(int(data["offset"]), int(data["cap"]))
    except FileNotFoundError:
        return Dropped()
    except (OSError, ValueError, KeyError, TypeError):
        return Dropped()  # replaced atomically: only a vanished or foreign file gets here


_libc = ctypes.CDLL(None, use_errno=True)


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Free the file's bytes in [offset, offset + length) (they read as zeros); OSError if
    the filesystem cannot."""
    if _libc.fallocate(
        fd,
        _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE,
        ctypes.c_longlong(offset),
        ctypes.c_longlong(length),
    ):
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


class CappedLog:
    """One worker's log file, appended by the supervisor only, keeping its newest `cap` bytes."""

    def __init__(self, path: Path, cap: int | None) -> None:
        self._path = path
        self._cap = cap
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self._end = os.fstat(self._fd).st_size
        self._dropped = read_dropped(path).offset
        self._step = max(cap // 8, MIN_STEP) if cap is not None else 0
        self._full = False  # no holes here: the cap was reached and the rest is dropped

    def write(self, data: bytes) -> None:
        if self._full or not data:
            return
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
            self._end += written
        if self._cap is not None and self._end - self._dropped > self._cap:
            self._trim(self._cap)

    def line(self, text: str) -> None:
        """Append a line of the supervisor's own (a restart marker)."""
        self.write(text.encode() + b"\n")

    def _trim(self, cap: int) -> None:
        cut = self._line_start(self._end - (cap - self._step))
        record = json.dumps({"offset": cut, "cap": cap})
        tmp = dropped_path(self._path).with_suffix(".tmp")
        tmp.write_text(record, encoding="utf-8")
        os.replace(tmp, dropped_path(self._path))  # before the hole: see the module's docstring
        try:
            punch_hole(self._fd, 0, cut)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            # No holes here: keep the oldest `cap` bytes rather than none, and say so.
            os.replace(dropped_path(self._path), tmp)
            tmp.unlink()
            note = f"--- log cap {format_bytes(cap)} reached ({SETTING}): later output dropped ---"
            os.write(self._fd, b"\n" + note.encode() + b"\n")
            self._full = True
            return
        self._dropped = cut

    def _line_start(self, at: int) -> int:
        """The first line start at or after `at` (within LINE_SEARCH), else `at` itself."""
        at = max(at, self._dropped)
        chunk = os.pread(self._fd, LINE_SEARCH, at - 1) if at > 0 else b"\n"
        newline = chunk.find(b"\n")
        return at + newline if newline >= 0 else at

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
