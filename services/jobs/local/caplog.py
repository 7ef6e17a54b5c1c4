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

Why an order file. One supervisor copies every worker's output, so the order of its writes
is the order the lines came in. `<worker>.log.order` keeps it: a record (offset, stamp) each
time this log is written after another worker's was, saying that the bytes from `offset` on
came at `stamp` (nanoseconds since the epoch, strictly increasing across the job's logs: a
`LogClock`). Readers merge the workers' lines by stamp (`LogTimes`), so a finished job's
`logs` interleave as they did live instead of coming worker by worker. A worker that writes
alone adds no record; the file is trimmed with the log, so it stays small beside it.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import errno
import json
import os
import struct
import time
from dataclasses import dataclass, field
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


def order_path(log: Path) -> Path:
    return log.with_name(log.name + ".order")


def _tmp(path: Path) -> Path:
    """Where `path`'s next content is written before it replaces it: its own name, so the
    `.dropped` and `.order` files of one log never share a temporary file."""
    return path.with_name(path.name + ".tmp")


# One record of an order file: the offset where a run of bytes begins, and its stamp.
_RECORD = struct.Struct("<QQ")


class LogClock:
    """The supervisor's one clock for its workers' logs: which log wrote last, and stamps
    that never repeat or go back, so that two runs of bytes never tie."""

    def __init__(self) -> None:
        self.last: object | None = None
        self._stamp = 0

    def stamp(self) -> int:
        self._stamp = max(time.time_ns(), self._stamp + 1)
        return self._stamp


@dataclass
class LogTimes:
    """A log's order file as read: when the bytes from each recorded offset on came."""

    starts: list[int] = field(default_factory=list)
    stamps: list[int] = field(default_factory=list)
    key: tuple[int, int] = (0, 0)  # (inode, bytes read): what `refresh` has seen

    def at(self, offset: int) -> int:
        """The stamp of the byte at `offset` (0 where nothing says: a log of an older release)."""
        i = bisect.bisect_right(self.starts, offset) - 1
        return self.stamps[i] if i >= 0 else 0

    def refresh(self, log: Path) -> LogTimes:
        """This, with what was appended to the order file since (all of it, after a trim)."""
        try:
            with open(order_path(log), "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_ino != self.key[0]:
                    self.starts, self.stamps, self.key = [], [], (st.st_ino, 0)
                f.seek(self.key[1])
                data = f.read()
        except FileNotFoundError:
            return self
        whole = len(data) - len(data) % _RECORD.size  # a record being appended comes next time
        for start, stamp in _RECORD.iter_unpack(data[:whole]):
            self.starts.append(start)
            self.stamps.append(stamp)
        self.key = (self.key[0], self.key[1] + whole)
        return self


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

    def __init__(self, path: Path, cap: int | None, clock: LogClock | None = None) -> None:
        self._path = path
        self._cap = cap
        self._clock = clock
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self._order_fd = -1
        self._end = os.fstat(self._fd).st_size
        self._dropped = read_dropped(path).offset
        self._step = max(cap // 8, MIN_STEP) if cap is not None else 0
        self._full = False  # no holes here: the cap was reached and the rest is dropped

    def write(self, data: bytes) -> None:
        if self._full or not data:
            return
        if self._clock is not None and self._clock.last is not self:
            # Recorded before the bytes: a reader never sees bytes without their stamp.
            self._clock.last = self
            self._record(_RECORD.pack(self._end, self._clock.stamp()))
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
        tmp = _tmp(dropped_path(self._path))
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
        self._trim_order(cut)

    def _record(self, record: bytes) -> None:
        if self._order_fd < 0:
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
            self._order_fd = os.open(order_path(self._path), flags, 0o644)
        os.write(self._order_fd, record)

    def _trim_order(self, cut: int) -> None:
        """Drop the records of dropped bytes, keeping the one the first kept byte is in."""
        path = order_path(self._path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        records = list(_RECORD.iter_unpack(data[: len(data) - len(data) % _RECORD.size]))
        kept = [r for r in records if r[0] > cut]
        before = [r for r in records if r[0] <= cut]
        if before:
            kept.insert(0, (cut, before[-1][1]))
        tmp = _tmp(path)
        tmp.write_bytes(b"".join(_RECORD.pack(*r) for r in kept))
        os.replace(tmp, path)  # readers see a new inode and read it whole
        if self._order_fd >= 0:
            os.close(self._order_fd)
            self._order_fd = -1

    def _line_start(self, at: int) -> int:
        """The first line start at or after `at` (within LINE_SEARCH), else `at` itself."""
        at = max(at, self._dropped)
        chunk = os.pread(self._fd, LINE_SEARCH, at - 1) if at > 0 else b"\n"
        newline = chunk.find(b"\n")
        return at + newline if newline >= 0 else at

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
        if self._order_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._order_fd)
