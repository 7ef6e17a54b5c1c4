"""common/tasks.restarting: a task that crashes, returns or is killed is started again;
cancelling the supervisor stops it and what it runs."""

from __future__ import annotations

import asyncio

from paddlecloud.common.tasks import restarting


async def test_a_task_that_crashes_or_returns_is_started_again_until_the_supervisor_is_cancelled() -> None:
    runs: list[asyncio.Task[None] | None] = []
    third = asyncio.Event()
    stopped = asyncio.Event()

    async def work() -> None:
        runs.append(asyncio.current_task())
        if len(runs) == 1:
            raise RuntimeError("a bug")  # crashed
        if len(runs) == 2:
            return  # returned, as a loop never should
        third.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    supervisor = asyncio.create_task(restarting("worker", work, max_backoff=0.01), name="supervisor")
    await third.wait()
    assert [t.get_name() for t in runs if t] == ["worker"] * 3 and len(set(runs)) == 3
    supervisor.cancel()
    await asyncio.gather(supervisor, return_exceptions=True)
    assert supervisor.cancelled() and stopped.is_set() and runs[-1] is not None and runs[-1].done()
