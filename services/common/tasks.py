"""Named, guarded background tasks: a crash is logged at once, retries back off, shutdown cancels."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import structlog

log = structlog.get_logger()


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


@contextlib.asynccontextmanager
async def background(name: str, coro: Awaitable[None]) -> AsyncIterator[asyncio.Task[None]]:
    """Run `coro` as a named task for the duration of the block, then cancel and await it."""

    async def guarded() -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("background_task_crashed", task=name)
        else:
            log.warning("background_task_returned", task=name)

    task = asyncio.create_task(guarded(), name=name)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
