"""Reading a local job's worker logs merged in the order their lines came, with resumable cursors.

The supervisor copies every worker's output into `logs/<worker>.log` and stamps the
order it wrote them in (caplog.py's order files); `LogMerge` reads what each log has
after its offset, a pass at a time, and hands the lines back sorted by those stamps, so
a finished job's logs interleave as a live follow did. A cursor is every worker's offset
(`l1.<o1>.<o2>...`), so a follower that reconnects gets exactly the lines after it.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from itertools import accumulate, repeat
from pathlib import Path

from paddlecloud.common.logstream import BadCursor, read_lines, tail_offset

from ..backend import LogLine, LogQuery
from .caplog import LogTimes, read_dropped

# Lines of one worker read together under one stamp: (the stamp, the worker's index, the
# offset after each line, their texts). Sorted by stamp and worker, that is the order they
# came in.
_Run = tuple[int, int, list[int], list[str]]
# LogLine(*fields) without the Python frame of a named tuple's __new__.
_new_line = partial(tuple.__new__, LogLine)


@dataclass
class LogMerge:
    """One reader of a job's worker logs (`names`, in the plan's order) under `logs`:
    where it is in each (`offsets`), and which workers the query wants."""

    logs: Path
    names: Sequence[str]
    offsets: list[int]
    wanted: Sequence[int]
    times: dict[int, LogTimes]

    @classmethod
    def start(cls, logs: Path, names: Sequence[str], query: LogQuery) -> LogMerge:
        """A reader at the query's cursor, or its tail, or the start; BadCursor for a cursor
        that is not one of this job's."""
        offsets = decode_cursor(query.cursor, names) if query.cursor else None
        if offsets is None:
            offsets = [0] * len(names)
            if query.tail is not None:
                offsets = [_tail(logs / f"{n}.log", query.tail) for n in names]
        wanted = [
            i
            for i, name in enumerate(names)
            if (not query.workers or name in query.workers)
            and (not query.roles or name.split("-", 1)[0].upper() in query.roles)
        ]
        return cls(logs, names, offsets, wanted, {i: LogTimes() for i in wanted})

    def read(self, final: bool) -> tuple[list[LogLine], bool]:
        """One pass: the lines every wanted log has after its offset, merged, each with the
        cursor after it; and whether more wait already (read again at once). `final`: no
        more will be written, so a last line without its newline is read too."""
        runs: list[_Run] = []
        more = False
        # A worker with more than one batch waiting was read only up to some stamp: what
        # others have after it waits for the next pass, so the merge never runs ahead.
        upto: int | None = None
        for i in self.wanted:
            found, partial, last = self._read_one(i, final)
            runs += found
            more = more or partial
            if last is not None:
                upto = last if upto is None else min(upto, last)
        batch: list[LogLine] = []
        offsets = self.offsets
        for stamp, i, ends, texts in sorted(runs, key=lambda run: (run[0], run[1])):
            if upto is not None and stamp > upto:
                continue  # read again next pass, after the lines that came before it
            # Only worker i's offset moves along a run: the others' are written once.
            head = "l1." + "".join(f"{o}." for o in offsets[:i])
            tail = "".join(f".{o}" for o in offsets[i + 1 :])
            # Built by C functions alone (no Python call per line): a burst makes one per line.
            cursors = map(f"{head}{{}}{tail}".format, ends)
            batch += map(_new_line, zip(repeat(self.names[i]), texts, cursors))
            offsets[i] = ends[-1]
        return batch, more

    def _read_one(self, i: int, final: bool) -> tuple[list[_Run], bool, int | None]:
        """What worker `i`'s log has after its offset, in runs of one stamp each; whether more
        waits there; and, when it was read only in part, the stamp of its last line read."""
        path = self.logs / f"{self.names[i]}.log"
        start = self.offsets[i]
        lines, truncated = read_lines(path, start, final)
        # Read after the lines: the cap drops bytes only once it has said so here.
        gone = read_dropped(path)
        if gone.offset > start:
            # What was read may be a dropped part's zeros: a marker stands for it, first.
            return [(-1, i, [gone.offset], [gone.marker(start)])], True, None
        if not lines:
            return [], False, None
        texts = [text for text, _ in lines]
        ends = list(accumulate((size for _, size in lines), initial=start))
        begins = ends[:-1]  # where each line begins: its stamp is that of the byte there
        del ends[0]
        times = self.times[i].refresh(path)
        # The order file says where a new stamp begins, seldom per line: the lines are cut
        # into runs there, and a run's lines share its stamp.
        runs: list[_Run] = []
        lo, stamp = 0, times.at(start)
        for r in range(bisect.bisect_right(times.starts, start), len(times.starts)):
            hi = bisect.bisect_left(begins, times.starts[r], lo)  # the lines that begin before it
            if hi == len(begins):
                break
            if hi > lo:
                runs.append((stamp, i, ends[lo:hi], texts[lo:hi]))
            lo, stamp = hi, times.stamps[r]
        runs.append((stamp, i, ends[lo:], texts[lo:]))
        return runs, truncated, stamp if truncated else None


def _tail(path: Path, lines: int) -> int:
    """Where a worker's log's last `lines` lines begin, among the bytes its cap kept."""
    return tail_offset(path, lines, read_dropped(path).offset)


def encode_cursor(offsets: Sequence[int]) -> str:
    return "l1." + ".".join(map(str, offsets))


def decode_cursor(cursor: str, names: Sequence[str]) -> list[int]:
    version, _, rest = cursor.partition(".")
    parts = rest.split(".") if rest else []
    if version != "l1" or len(parts) != len(names) or not all(p.isdigit() and len(p) < 16 for p in parts):
        raise BadCursor(f"{cursor[:60]!r} is not a log cursor of this job")
    return [int(p) for p in parts]
