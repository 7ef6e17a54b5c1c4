"""The platform's own figures on /metrics: counts a scrape refreshes, at most once per cache period."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog

log = structlog.get_logger(__name__)


class ScrapeCache:
    """Runs `count` when a scrape asks, unless it ran less than `seconds` ago: a figure
    counted from the store or the storage costs one count per period, however many
    Prometheus servers scrape. Concurrent scrapes wait for one count rather than each
    starting their own. A count that fails is logged and tried again at the next scrape;
    the figures keep their last values meanwhile."""

    def __init__(
        self,
        name: str,
        count: Callable[[], Awaitable[None]],
        seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.__name__ = name  # named in the log line of a failed count
        self._count = count
        self._seconds = seconds
        self._clock = clock
        self._lock = asyncio.Lock()
        self._at: float | None = None

    async def __call__(self) -> None:
        async with self._lock:
            if self._at is not None and self._clock() - self._at < self._seconds:
                return
            try:
                await self._count()
            except Exception as exc:
                # A scrape still answers (the request figures, the last counts): a store
                # that is down shows in /readyz, not as a failed scrape.
                log.warning("metrics_count_failed", figure=self.__name__, error=str(exc))
                return
            self._at = self._clock()
