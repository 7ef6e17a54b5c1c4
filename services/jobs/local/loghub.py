"""One reader per followed job's logs, its lines fanned out to every follower.

A hundred `logs -f` of one job used to be a hundred readers of the same files, each reading
and merging every line on its own. Now a follower reads the history it asked for with its own
`LogMerge` and, once it has caught up, subscribes to the job's one `LogHub`, which reads the
logs every poll and puts each batch (the same list for everyone) on each follower's queue.

Without gap or repeat. A follower that joins a running hub subscribes first and then reads
its own reader to the files' end once more: the hub's queue holds every line after where the
hub was at the subscription, and the follower has read past that, so it skips the queued
lines it already has (a worker's line ends at or before its own offset in that log) and
rewrites the cursors of the others to its own position until the hub is past it everywhere.

A slow follower. Each queue holds at most QUEUE_BATCHES batches; a follower whose queue is
full is dropped by the hub and reads on with its own reader from its own offsets (as before
the hub), rejoining once it has caught up: it never stalls the others, and what is queued for
it is bounded (the batches are shared, so at most QUEUE_BATCHES batches are held however many
fall behind).

The hub stops when its last follower leaves, or after the job's last lines (then its
followers end too).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable

import structlog

from ..backend import LogLine, LogQuery
from .logmerge import LogMerge, decode_cursor, encode_cursor

log = structlog.get_logger(__name__)

# How many batches a follower may have waiting before it reads on by itself.
QUEUE_BATCHES = 16
_END: list[LogLine] | None = None  # the log ended: no more lines
_WAKE: list[LogLine] = []  # look at the subscription's state (the hub stopped)


async def follow(
    reader: LogMerge,
    is_final: Callable[[], bool],
    poll: float,
    live: bool,
    hub: Callable[[LogMerge], Follower] | None,
) -> AsyncGenerator[list[LogLine], None]:
    """A reader's lines from its offsets on, passes of `poll` seconds apart while `live` (a
    follower) until the log is final; once caught up, from `hub(reader)` (a place at the job's
    hub) when given, and alone again from where it is if the hub drops it."""
    while True:
        final = is_final()  # decided before reading, so nothing written after is missed
        batch, more = reader.read(final)
        if batch:
            yield batch
        if more:
            continue
        if final or not live:
            return
        if hub is not None:  # caught up: the rest from the job's one reader
            follower = hub(reader)
            try:
                async for batch in follower.lines(reader):
                    yield batch
            finally:
                follower.leave()
            if follower.ended:
                return
            continue  # dropped for being slow: read on alone from where it is
        await asyncio.sleep(poll)


class LogHubs:
    """The hubs of the jobs being followed, by job id."""

    def __init__(self, poll: float) -> None:
        self._poll = poll
        self._hubs: dict[str, LogHub] = {}

    def join(self, key: str, is_final: Callable[[], bool], reader: LogMerge) -> Follower:
        """A place at the hub of `key`'s logs; a new hub starts where `reader` is."""
        hub = self._hubs.get(key)
        if hub is not None and not hub.closed:
            return hub.join(fresh=False)
        merge = LogMerge.start(reader.logs, reader.names, LogQuery(cursor=encode_cursor(reader.offsets)))
        hub = LogHub(merge, is_final, self._poll)
        hub.on_close(lambda: self._hubs.pop(key, None))
        self._hubs[key] = hub
        return hub.join(fresh=True)

    def __len__(self) -> int:
        return len(self._hubs)

    def get(self, key: str) -> LogHub | None:
        """The running hub of `key`'s logs, if any."""
        return self._hubs.get(key)

    async def close(self) -> None:
        for hub in list(self._hubs.values()):
            await hub.close()


class Follower:
    """One follower's place at a hub: its queue, and why it left."""

    def __init__(self, hub: LogHub, fresh: bool) -> None:
        self.queue: asyncio.Queue[list[LogLine] | None] = asyncio.Queue(QUEUE_BATCHES)
        self.behind = False  # dropped by the hub: read on alone
        self.ended = False  # the log ended
        self._hub = hub
        self._fresh = fresh  # the hub started where this follower was

    def leave(self) -> None:
        self._hub.leave(self)

    async def lines(self, reader: LogMerge) -> AsyncGenerator[list[LogLine], None]:
        """The lines after `reader`'s offsets; `reader.offsets` follows what was yielded.
        Returns when the log ended (`ended`) or the hub dropped this follower (`behind`)."""
        if not self._fresh:  # what came between where the hub was and the files' end
            while True:
                batch, more = reader.read(False)
                if batch:
                    yield batch
                if not more:
                    break
        index = {name: i for i, name in enumerate(reader.names)}
        aligned = self._fresh
        while True:
            if self.behind and self.queue.empty():
                return
            queued = await self.queue.get()
            if queued is _END:
                self.ended = True
                return
            if not queued:
                continue  # _WAKE: look at `behind` again
            batch = queued
            if not aligned:
                batch, aligned = _rebase(batch, reader, index)
                if not batch:
                    continue
            else:
                reader.offsets[:] = decode_cursor(batch[-1].cursor, reader.names)
            yield batch


def _rebase(batch: list[LogLine], reader: LogMerge, index: dict[str, int]) -> tuple[list[LogLine], bool]:
    """The lines of a hub's batch the follower at `reader.offsets` has not had, with cursors
    of its own position; and whether the hub is now past it in every log."""
    mine = reader.offsets
    kept = []
    aligned = False
    for line in batch:
        theirs = decode_cursor(line.cursor, reader.names)
        i = index[line.worker]
        if aligned:
            kept.append(line)
        elif theirs[i] > mine[i]:
            mine[:] = [max(a, b) for a, b in zip(mine, theirs, strict=True)]
            aligned = mine == theirs
            kept.append(line if aligned else line._replace(cursor=encode_cursor(mine)))
        if aligned:
            mine[:] = theirs
    return kept, aligned


class LogHub:
    """The one reader of a job's logs (all its workers) for every follower that caught up."""

    def __init__(self, merge: LogMerge, is_final: Callable[[], bool], poll: float) -> None:
        self._merge = merge
        self._is_final = is_final
        self._poll = poll
        self._done: Callable[[], object] = lambda: None
        self._followers: set[Follower] = set()
        self.closed = False
        self._task = asyncio.create_task(self._run(), name="jobs-log-hub")
        self._task.add_done_callback(_report)

    @property
    def followers(self) -> frozenset[Follower]:
        """Those it puts its batches on the queues of now."""
        return frozenset(self._followers)

    def on_close(self, done: Callable[[], object]) -> None:
        """Call `done` when the hub stops (its last follower left, or the log ended)."""
        self._done = done

    def join(self, fresh: bool) -> Follower:
        follower = Follower(self, fresh)
        self._followers.add(follower)
        return follower

    def leave(self, follower: Follower) -> None:
        self._followers.discard(follower)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        try:
            while self._followers:
                final = self._is_final()  # before reading: nothing written after is missed
                batch, more = self._merge.read(final)
                if batch:
                    self._publish(batch)
                if more:
                    await asyncio.sleep(0)  # let the followers send it before reading on
                    continue
                if final:
                    self._publish(_END)
                    return
                await asyncio.sleep(self._poll)
        finally:
            self.closed = True
            self._done()
            for follower in self._followers:  # read on alone, if the hub stopped under them
                follower.behind = True
                if not follower.queue.full():
                    follower.queue.put_nowait(_WAKE)

    def _publish(self, batch: list[LogLine] | None) -> None:
        for follower in list(self._followers):
            try:
                follower.queue.put_nowait(batch)
            except asyncio.QueueFull:
                follower.behind = True  # it reads on alone: see the module's docstring
                self._followers.discard(follower)


def _report(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("log_hub_failed", error=repr(task.exception()))
