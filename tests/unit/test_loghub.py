"""One reader per followed job's logs, fanned out: every follower gets every line once, in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path

from paddlecloud.jobs.backend import LogLine, LogQuery
from paddlecloud.jobs.local import loghub
from paddlecloud.jobs.local.caplog import CappedLog, LogClock
from paddlecloud.jobs.local.loghub import LogHubs, follow
from paddlecloud.jobs.local.logmerge import LogMerge

NAMES = ["pserver-0", "trainer-0"]
POLL = 0.001


class Job:
    """Two workers' capped logs written as the supervisor writes them, and whether it ended."""

    def __init__(self, logs: Path) -> None:
        clock = LogClock()
        self.logs = logs
        self.files = {name: CappedLog(logs / f"{name}.log", None, clock) for name in NAMES}
        self.written: list[str] = []
        self.final = False

    def write(self, count: int) -> None:
        for _ in range(count):
            name = NAMES[len(self.written) % 3 == 0]  # uneven runs of each worker
            text = f"{name} {len(self.written)}"
            self.files[name].write(text.encode() + b"\n")
            self.written.append(text)

    def end(self) -> None:
        for f in self.files.values():
            f.close()
        self.final = True

    def follower(self, hubs: LogHubs, cursor: str | None = None) -> AsyncGenerator[list[LogLine], None]:
        reader = LogMerge.start(self.logs, NAMES, LogQuery(follow=True, cursor=cursor))
        return follow(
            reader, lambda: self.final, POLL, True, lambda r: hubs.join("job", lambda: self.final, r)
        )


async def collect(lines: AsyncGenerator[list[LogLine], None], into: list[LogLine]) -> None:
    async for batch in lines:
        into += batch


async def until(condition, what: str) -> None:
    for _ in range(5000):
        if condition():
            return
        await asyncio.sleep(POLL)
    raise AssertionError(f"never: {what}")


def texts(lines: list[LogLine]) -> list[str]:
    return [line.line for line in lines]


def resumes_exactly(job: Job, lines: list[LogLine]) -> None:
    """Each line's cursor, read from again, gives exactly the lines after it."""
    for i in (0, len(lines) // 3, len(lines) // 2, len(lines) - 2):
        rest, _ = LogMerge.start(job.logs, NAMES, LogQuery(cursor=lines[i].cursor)).read(final=True)
        assert sorted(texts(rest)) == sorted(texts(lines[i + 1 :])), f"after line {i}"


async def test_every_follower_and_a_late_joiner_get_every_line_once_in_order_from_one_reader(
    tmp_path: Path,
) -> None:
    job, hubs = Job(tmp_path), LogHubs(POLL)
    got: list[list[LogLine]] = [[] for _ in range(4)]
    tasks = [asyncio.create_task(collect(job.follower(hubs), got[i])) for i in range(3)]
    for _ in range(20):
        job.write(7)
        await asyncio.sleep(POLL)
    await until(lambda: all(len(g) == len(job.written) for g in got[:3]), "the first followers caught up")
    assert len(hubs) == 1  # one reader for all of them
    tasks.append(asyncio.create_task(collect(job.follower(hubs), got[3])))  # late: history first
    for _ in range(20):
        job.write(5)
        await asyncio.sleep(0)
    job.end()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    for lines in got:
        assert texts(lines) == job.written  # the order written, no gap, no repeat
        resumes_exactly(job, lines)
    assert len(hubs) == 0  # the hub stopped with the log's end


async def test_a_follower_joining_a_running_hub_mid_stream_skips_nothing_and_repeats_nothing(
    tmp_path: Path,
) -> None:
    job, hubs = Job(tmp_path), LogHubs(POLL)
    first: list[LogLine] = []
    task = asyncio.create_task(collect(job.follower(hubs), first))
    job.write(30)
    await until(lambda: len(first) == 30, "the first follower caught up")
    job.write(11)  # written while the hub has not read them: the joiner reads them itself
    late: list[LogLine] = []
    lines = job.follower(hubs, cursor=first[9].cursor)  # resumes after its 10th line
    joined = asyncio.create_task(collect(lines, late))
    for _ in range(10):
        job.write(3)
        await asyncio.sleep(POLL)
    job.end()
    await asyncio.wait_for(asyncio.gather(task, joined), 30)
    assert texts(late) == job.written[10:]
    resumes_exactly(job, late)


async def test_a_slow_follower_stalls_no_one_is_dropped_with_a_bounded_queue_and_reads_on_alone(
    tmp_path: Path,
) -> None:
    job, hubs = Job(tmp_path), LogHubs(POLL)
    job.write(2)
    fast: list[LogLine] = []
    fast_task = asyncio.create_task(collect(job.follower(hubs), fast))
    await until(lambda: len(hubs) == 1 and len(fast) == 2, "the fast follower at the hub")
    hub = hubs.get("job")
    assert hub is not None
    (fast_place,) = hub.followers
    slow = job.follower(hubs)
    slow_lines = list(await anext(slow))  # its history; then it joins and takes one batch only
    pending = asyncio.create_task(anext(slow))
    await until(lambda: len(hub.followers) == 2, "the slow follower at the hub")
    (slow_place,) = hub.followers - {fast_place}
    for _ in range(3 * loghub.QUEUE_BATCHES):  # a batch each: the fast one gets each line first
        job.write(1)
        await until(lambda: len(fast) == len(job.written), "the fast follower got the line")
    assert slow_place.behind and slow_place not in hub.followers  # let go, not queued for
    assert slow_place.queue.qsize() <= loghub.QUEUE_BATCHES
    slow_lines += await pending
    job.end()
    await collect(slow, slow_lines)  # it reads on alone from its own offsets
    await asyncio.wait_for(fast_task, 30)
    assert texts(slow_lines) == texts(fast) == job.written


async def test_a_follower_that_leaves_frees_its_place_and_the_last_one_stops_the_reader(
    tmp_path: Path,
) -> None:
    job, hubs = Job(tmp_path), LogHubs(POLL)
    job.write(5)
    one, two = job.follower(hubs), job.follower(hubs)
    await anext(one)
    await anext(two)
    get_one, get_two = asyncio.create_task(anext(one)), asyncio.create_task(anext(two))
    await until(
        lambda: len(hubs) == 1 and len(next(iter(hubs._hubs.values()))._followers) == 2, "both joined"
    )
    hub = next(iter(hubs._hubs.values()))
    get_one.cancel()
    await asyncio.gather(get_one, return_exceptions=True)
    await one.aclose()
    assert len(hub.followers) == 1  # its queue went with it
    job.write(1)
    assert texts(await get_two) == [job.written[-1]]
    get_two = asyncio.create_task(anext(two))
    await asyncio.sleep(POLL)
    get_two.cancel()
    await asyncio.gather(get_two, return_exceptions=True)
    await two.aclose()
    await until(lambda: len(hubs) == 0, "the reader stopped")
    assert hub.closed


async def test_a_follower_that_joins_behind_the_hub_reads_the_lines_in_between_itself(tmp_path: Path) -> None:
    job, hubs = Job(tmp_path), LogHubs(POLL)
    first: list[LogLine] = []
    task = asyncio.create_task(collect(job.follower(hubs), first))
    job.write(4)
    await until(lambda: len(first) == 4, "the first follower caught up")
    late = job.follower(hubs)
    history = list(await anext(late))  # read alone, not yet at the hub
    job.write(6)  # the hub reads these before the late one joins it
    await until(lambda: len(first) == 10, "the hub read on")
    rest = asyncio.create_task(collect(late, history))
    await until(lambda: len(history) == 10, "the late one got the lines in between")
    job.write(3)
    job.end()
    await asyncio.wait_for(asyncio.gather(task, rest), 30)
    assert texts(history) == job.written
    resumes_exactly(job, history)


def test_a_hub_batch_behind_the_follower_in_one_log_is_cut_and_its_cursors_are_the_followers(
    tmp_path: Path,
) -> None:
    reader = LogMerge.start(tmp_path, NAMES, LogQuery(cursor="l1.10.20"))
    index = {name: i for i, name in enumerate(NAMES)}
    batch = [
        LogLine("pserver-0", "had it", "l1.5.15"),
        LogLine("pserver-0", "new, the hub behind in trainer-0", "l1.12.15"),
        LogLine("trainer-0", "had it too", "l1.12.20"),
        LogLine("trainer-0", "new", "l1.12.25"),
    ]
    kept, aligned = loghub._rebase(batch, reader, index)
    assert [(x.line, x.cursor) for x in kept] == [
        ("new, the hub behind in trainer-0", "l1.12.20"),  # where the follower is in both
        ("new", "l1.12.25"),
    ]
    assert aligned and reader.offsets == [12, 25]
