"""Named, guarded background tasks: a crash is logged at once, retries back off, shutdown cancels."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import structlog

log = structlog.get_logger()


def backoff(failures: int, cap: float) -> float:
    """Seconds to wait after `failures` failures in a row: full jitter, from 0.2 s to `cap`."""
    return random.uniform(0, min(cap, 0.2 * 2 ** min(failures, 10)))  # noqa: S311 - not a secret


async def run_periodically(
    name: str,
    step: Callable[[], Awaitable[None]],
    interval: float,
    *,
    max_backoff: float = 300.0,
) -> None:
    """Run `step` every `interval` seconds forever; a failing step backs off, capped."""
    delay = interval
    while True:
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception:
            delay = min(max(delay * 2, 1.0), max_backoff)
            log.exception("background_step_failed", task=name, retry_in=delay)
        else:
            delay = interval
        await asyncio.sleep(delay)


async def restarting(
    name: str, start: Callable[[], Coroutine[Any, Any, None]], *, max_backoff: float
) -> None:
    """Keep `start()` running as a task named `name`, as kopf keeps a daemon: whenever
    that task ends — it crashed, returned, or something cancelled it — say so in the log
    and start it again after a backoff (full jitter, capped at `max_backoff`; a run that
    lasted longer than the cap starts the count again). Only cancelling this coroutine's
    own task stops it, and that cancels the running one too."""
    loop = asyncio.get_running_loop()
    failures = 0
    while True:
        began = loop.time()
        task = asyncio.create_task(start(), name=name)
        try:
            # wait(), not await: cancelling `task` from outside must not end this loop.
            await asyncio.wait([task])
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        failures = 1 if loop.time() - began > max_backoff else failures + 1
        delay = backoff(failures, max_backoff)
        if task.cancelled():
            log.warning("background_task_killed", task=name, restart_in=round(delay, 2))
        elif (error := task.exception()) is not None:
            log.error("background_task_crashed", task=name, restart_in=round(delay, 2), exc_info=error)
        else:
            log.warning("background_task_returned", task=name, restart_in=round(delay, 2))
        await asyncio.sleep(delay)


class Spawned:
    """Named tasks started as work arrives (a build to wait for, a build to run), each
    guarded like `background`'s: a crash is logged at once, with the task's name. They are
    kept until they end, and `cancel()` stops those still running (on shutdown)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, name: str, coro: Awaitable[object]) -> asyncio.Task[None]:
        """Run `coro` as a task of its own; what it returns is dropped."""
        task = asyncio.create_task(_guarded(name, coro, report_return=False), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def cancel(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _guarded(name: str, coro: Awaitable[object], *, report_return: bool) -> None:
    try:
        await coro
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("background_task_crashed", task=name)
    else:
        if report_return:
            log.warning("background_task_returned", task=name)


@contextlib.asynccontextmanager
async def background(name: str, coro: Awaitable[None]) -> AsyncIterator[asyncio.Task[None]]:
    """Run `coro` as a named task for the duration of the block, then cancel and await it."""

    task = asyncio.create_task(_guarded(name, coro, report_return=True), name=name)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
