"""A worker's log read through the API server from where its reader is, positioned by the
kubelet's timestamps: a kubelet log rotation neither skips nor repeats a line.

Why timestamps and not line numbers: `pods/log` serves only the container's current log
file, so a rotation (`containerLogMaxSize`, 10Mi by default) starts its line numbers
again. A position here is (attempt, the kubelet timestamp of the last line sent, how many
lines at exactly that timestamp were sent); a read asks for `sinceTime` (whole seconds:
the API's precision), `timestamps=true`, and drops what the reader already has.

Why streams: a live attempt is read with one `follow=true` stream per reader and worker,
started from the reader's position, so each byte crosses the API server once. Asking
`sinceTime` every half second instead would cost a request per worker per poll, and the
kubelet reads the whole current file to answer each (it filters by time line by line;
only `tailLines` seeks). A stream that ends (the container ended, the connection broke,
the API server's timeout) is opened again from the position it reached.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from paddlecloud.common.errors import BadCursor
from paddlecloud.common.kube import Kube, KubeError

from .pods import Attempt

# A kept log whose lines carry the kubelet's timestamps starts with this line; one kept
# before them (by an earlier version) does not, and is positioned by line number.
STAMPED = "#paddlecloud-kept-log timestamps\n"
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$")


def canonical(stamp: str) -> str | None:
    """An RFC 3339 time with up to nanoseconds (the kubelet's RFC3339Nano, which drops
    trailing zeros and may carry the node's offset) as UTC with nine fraction digits, so
    that two compare as strings; None if it is not one."""
    match = _STAMP.match(stamp)
    if match is None:
        return None
    seconds, fraction, zone = match.groups()
    try:
        when = datetime.fromisoformat(seconds + ("+00:00" if zone == "Z" else zone)).astimezone(UTC)
    except ValueError:
        return None
    return f"{when:%Y-%m-%dT%H:%M:%S}.{(fraction or '').ljust(9, '0')}Z"


def since_time(stamp: str) -> str:
    """The `sinceTime` that includes a canonical stamp's line: its whole second."""
    return stamp[:19] + "Z"


@dataclass(frozen=True)
class Position:
    """Where a reader is in a worker's log: after `count` lines stamped exactly `stamp`
    of attempt `key`; `stamp` None (a cursor of an earlier version, or a kept log without
    timestamps): after the attempt's first `count` lines."""

    key: str
    stamp: str | None
    count: int


@dataclass(frozen=True)
class Row:
    stamp: str | None
    text: str


def stamped_rows(text: str, ended: bool) -> list[Row]:
    """`timestamps=true` output as rows; while the container runs, a last line without its
    newline is left for the next read, when it comes whole."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    elif lines and not ended:
        lines.pop()
    rows = []
    for line in lines:
        head, _, rest = line.partition(" ")
        stamp = canonical(head)
        rows.append(Row(stamp, rest) if stamp else Row(None, line))
    return rows


def kept_rows(text: str) -> list[Row]:
    """A kept log's rows: stamped as kept now, or plain lines as kept before."""
    if text.startswith(STAMPED):
        return stamped_rows(text[len(STAMPED) :], ended=True)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [Row(None, line) for line in lines]


def kept_text(text: str, limit: int) -> str:
    """`timestamps=true` output as the store keeps it: marked stamped, and cut to its last
    `limit` characters at a line's start, saying so on a line with that line's stamp (so
    positions in it stay in order)."""
    if len(text) > limit:
        cut = text[-limit:]
        cut = cut[cut.find("\n") + 1 :]
        stamp = cut.partition(" ")[0]
        dropped = len(text) - len(cut)
        text = f"{stamp} [... {dropped} earlier characters of this attempt were not kept ...]\n{cut}"
    return STAMPED + text


@dataclass
class _Run:
    """Counts rows as read from a point at or before a position, to tell the new ones."""

    key: str
    after: Position | None
    last: Position | None = None
    index: int = 0

    def new(self, rows: Iterable[Row]) -> list[tuple[Row, Position]]:
        out = []
        for row in rows:
            self.index += 1
            last = self.last
            if row.stamp is None:
                self.last = Position(self.key, None, self.index)
            elif last is not None and last.stamp == row.stamp:
                self.last = Position(self.key, row.stamp, last.count + 1)
            else:
                self.last = Position(self.key, row.stamp, 1)
            if _is_new(self.after, self.index, self.last):
                out.append((row, self.last))
        return out


def _runs(attempt: Attempt | None) -> bool:
    return attempt is not None and attempt.running


def after(rows: Iterable[Row], key: str, position: Position | None) -> list[tuple[Row, Position]]:
    """The rows of attempt `key`, as read from its start or from the `sinceTime` of
    `position`, that come after `position`, each with the position after it."""
    return _Run(key, position).new(rows)


def _is_new(after: Position | None, index: int, here: Position) -> bool:
    if after is None or after.key != here.key:
        return True
    if after.stamp is None:  # by line number, from the attempt's start
        return index > after.count
    if here.stamp is None:  # a line without a stamp in a stamped attempt: not placeable, sent
        return True
    return (here.stamp, here.count) > (after.stamp, after.count)


@dataclass
class Sources:
    """What a job's log readers see at one moment: whether the job is final (decided
    before the rest is read, so nothing after it is missed), the kept attempts' texts by
    (worker, attempt) and the live attempts by worker."""

    final: bool
    kept: dict[tuple[str, str], str]
    live: dict[str, list[Attempt]]


@dataclass
class WorkerLog:
    """One worker's lines after `position`, attempt by attempt, oldest first: kept text
    where an attempt was kept and does not run, the pod's log where it is live."""

    kube: Kube
    worker: str
    position: Position | None
    # `-n N` of a follower: its running attempt's stream starts at its last N lines.
    tail: int | None = None
    done: set[str] = field(default_factory=set)  # attempts read to their end

    def _pending(self, sources: Sources) -> list[tuple[str, Attempt | None]]:
        attempts: dict[str, Attempt | None] = {k: None for (w, k) in sources.kept if w == self.worker}
        attempts.update({a.key: a for a in sources.live.get(self.worker, [])})
        floor = self.position.key if self.position else ""
        return [(k, attempts[k]) for k in sorted(attempts) if k >= floor and k not in self.done]

    def finished(self, sources: Sources) -> bool:
        return sources.final and not self._pending(sources)

    async def read(
        self, sources: Sources, tail: int | None = None, *, to_stream: bool = False
    ) -> list[tuple[str, Position]]:
        """Every new line now, without waiting; `tail`: only the last so many. `to_stream`:
        up to the running attempt, whose lines its stream brings (from the position, or
        its last `tail` lines): reading it first would have the stream send again the
        lines of the position's second (sinceTime is in whole seconds)."""
        if to_stream and self._streams_first(sources, tail):
            self.tail = tail
            for key, attempt in self._pending(sources):
                if _runs(attempt):
                    break
                self.done.add(key)  # `-n` shows the running attempt's last lines only
            return []
        out: list[tuple[str, Position]] = []
        for key, attempt in self._pending(sources):
            if to_stream and _runs(attempt) and not sources.final:
                break
            rows, ended = await self._read_attempt(key, attempt, sources, tail)
            out += self._take(key, rows)
            if not ended:
                break  # a later attempt's lines come after this one's
            self.done.add(key)
            if self.position is None or self.position.key < key:
                self.position = Position(key, None, 0)
        return out[-tail:] if tail else ([] if tail == 0 else out)

    def _take(self, key: str, rows: list[Row]) -> list[tuple[str, Position]]:
        """The rows after the position, which moves past them."""
        run = _Run(key, self.position)
        by_number = self.position is not None and self.position.key == key and self.position.stamp is None
        out = []
        for row, self.position in run.new(rows):
            out.append((row.text, self.position))
        if by_number and run.last is not None and run.last.stamp is not None:
            self.position = run.last  # the same place, now by stamp: streams start there
        return out

    def _streams_first(self, sources: Sources, tail: int | None) -> bool:
        """With `-n`, a follower whose worker runs reads only its running attempt's last
        lines (its stream's), not earlier attempts'."""
        running = any(_runs(a) for _, a in self._pending(sources))
        return tail is not None and running and not sources.final

    def streamable(self, sources: Sources) -> Attempt | None:
        """The running attempt to follow next, once every earlier one was read."""
        pending = self._pending(sources)
        if sources.final or not pending:
            return None
        attempt = pending[0][1]
        return attempt if attempt is not None and attempt.running else None

    async def stream(self, attempt: Attempt) -> AsyncIterator[list[tuple[str, Position]]]:
        """A running attempt's new lines as they are written, until its stream ends (the
        container ended, or the stream broke: KubeError)."""
        since = self.position.stamp if self.position and self.position.key == attempt.key else None
        if self.position is not None and self.position.key == attempt.key and since is None:
            return  # placed by line number (an old cursor): read() places it first
        run = _Run(attempt.key, self.position)
        tail, self.tail = self.tail, None
        rest = b""
        async for chunk in self.kube.follow_log(
            attempt.namespace,
            attempt.pod,
            attempt.container,
            since_time=since_time(since) if since else None,
            tail=tail if since is None else None,
            timestamps=True,
        ):
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()  # a line not yet whole: with the next chunk
            rows = stamped_rows("".join(f"{line.decode('utf-8', 'replace')}\n" for line in lines), False)
            batch = []
            for row, self.position in run.new(rows):
                batch.append((row.text, self.position))
            if batch:
                yield batch

    async def _read_attempt(
        self, key: str, attempt: Attempt | None, sources: Sources, tail: int | None
    ) -> tuple[list[Row], bool]:
        """An attempt's rows from the reader's position on (and whether it has ended): the
        kept copy once it was kept and is not running, else the pod's (the kept copy again
        when the API server will not give it)."""
        kept = sources.kept.get((self.worker, key))
        if attempt is None or (not attempt.running and kept is not None):
            return kept_rows(kept or ""), True
        ended = attempt.terminated is not None or sources.final
        here = self.position if self.position and self.position.key == key else None
        try:
            text = await self.kube.log(
                attempt.namespace,
                attempt.pod,
                attempt.container,
                previous=attempt.previous,
                timestamps=True,
                since_time=since_time(here.stamp) if here and here.stamp else None,
                # A whole attempt's last lines are its log's last: the kubelet seeks to them.
                tail=tail if here is None and tail is not None else None,
            )
        except KubeError:
            return kept_rows(kept or ""), kept is not None or ended
        return stamped_rows(text, ended), ended


async def follow_worker(
    log: WorkerLog,
    look: Callable[[], Awaitable[Sources]],
    emit: Callable[[str, list[tuple[str, Position]]], Awaitable[None]],
    poll: float,
) -> None:
    """Follow one worker to the job's end: read what is new, stream its running attempt,
    and between streams wait `poll` for the watch cache and the store to change."""
    while True:
        sources = await look()
        attempt = log.streamable(sources)
        got = False
        if attempt is not None:
            try:
                async for batch in log.stream(attempt):
                    got = True
                    await emit(log.worker, batch)
            except KubeError:
                pass  # read again from the position it reached
        batch = await log.read(sources)
        if batch:
            got = True
            await emit(log.worker, batch)
        if log.finished(sources):
            return
        if not got:
            await asyncio.sleep(poll)


# Cursors: per worker, the attempt, the stamp of the last line sent and how many lines at
# that stamp were sent ("t"); an earlier version's ("p") named the attempt and the line
# number, and still decodes (placed by line number once, then by stamp). Opaque to
# clients: base64url JSON.


def _b64(data: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode()).decode().rstrip("=")


def _unb64(text: str) -> Any:
    return json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))


def encode(positions: dict[str, Position]) -> str:
    return "t" + _b64({w: [p.key, p.stamp, p.count] for w, p in sorted(positions.items())})


def decode(cursor: str, names: list[str]) -> dict[str, Position]:
    """The positions a cursor of this job's logs names (its other workers' are dropped)."""
    try:
        data = _unb64(cursor[1:])
        if cursor.startswith("t"):
            entries = {w: (k, s, n) for w, (k, s, n) in data.items()}
        elif cursor.startswith("p"):
            entries = {w: (k, None, n) for w, (k, n) in data.items()}
        else:
            raise ValueError(cursor[:1])
        return {
            str(w): Position(k, s if s is None else _stamp_of(s), n)
            for w, (k, s, n) in entries.items()
            if w in names and isinstance(k, str) and isinstance(n, int) and n >= 0
        }
    except (ValueError, binascii.Error, TypeError, AttributeError) as exc:
        raise BadCursor("this cursor was not handed out for this job's logs") from exc


def _stamp_of(value: Any) -> str:
    stamp = canonical(value) if isinstance(value, str) else None
    if stamp is None:
        raise ValueError(f"not a timestamp: {value!r}")
    return stamp
