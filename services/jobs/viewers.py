"""Each job's own TensorBoard and VisualDL (docs/metrics.md §4): started on first request, stopped when idle.

`Viewers` keeps at most one running viewer per job and kind, started by the backend
(`Backend.start_viewer`: a sandboxed process on one machine, a pod on Kubernetes) the
first time its owner asks for it, and stopped once nobody asked anything of it for
`jobs.viewers.idle_seconds`, when its job is removed, and when the service stops.
Requests in flight keep a viewer from being stopped under them. The HTTP side (api.py)
proxies to the `Upstream` it answers.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp
import structlog

from paddlecloud.common.config import ViewersSection
from paddlecloud.common.volume import PfsPath

from .records import JobRecord

log = structlog.get_logger(__name__)

KINDS = ("tensorboard", "visualdl")


class Upstream(abc.ABC):
    """A running viewer as the proxy reaches it: a client session bound to it (a UNIX
    socket's connector, a Service's URL), and the base URL to put before a request's path."""

    base_url: str

    @abc.abstractmethod
    def session(self) -> aiohttp.ClientSession: ...

    @abc.abstractmethod
    def ended(self) -> str | None:
        """None while it runs; what it said before it ended, once it has."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop it and everything it started; idempotent."""


class Starter(Protocol):
    """What starts a viewer: the backend (`Backend.start_viewer`), with what `viewer_runner`
    names (an interpreter on one machine, an image on Kubernetes)."""

    def viewer_runner(self, kind: str, config: ViewersSection) -> str: ...

    async def start_viewer(
        self, job: JobRecord, kind: str, output: PfsPath, prefix: str, python: str
    ) -> Upstream: ...


@dataclass
class _Running:
    upstream: Upstream
    last_used: float
    in_flight: int = 0
    job_id: str = ""


@dataclass
class Viewers:
    """The running viewers of this service, started by `starter` (the backend)."""

    config: ViewersSection
    starter: Starter
    _running: dict[tuple[str, str], _Running] = field(default_factory=dict)
    _starting: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)
    _reaper: asyncio.Task[None] | None = None

    def interpreter(self, kind: str) -> str:
        """What runs `kind` on this backend (its interpreter, or on Kubernetes the image);
        ViewerNotOffered naming the setting when unset."""
        return self.starter.viewer_runner(kind, self.config)

    @contextlib.asynccontextmanager
    async def use(self, job: JobRecord, kind: str, output: PfsPath, prefix: str) -> AsyncIterator[Upstream]:
        """The job's running viewer of `kind` serving `output` under the URL path `prefix`
        (started now if need be), kept running for the block."""
        key = (job.id, kind)
        lock = self._starting.setdefault(key, asyncio.Lock())
        async with lock:
            running = self._running.get(key)
            if running is not None and running.upstream.ended() is not None:
                # It ended by itself (crashed): started afresh rather than answered dead.
                log.warning("viewer_ended", job=job.name, kind=kind, said=running.upstream.ended())
                del self._running[key]
                await running.upstream.stop()
                running = None
            if running is None:
                python = self.interpreter(kind)
                upstream = await self.starter.start_viewer(job, kind, output, prefix, python)
                running = _Running(upstream, time.monotonic(), job_id=job.id)
                self._running[key] = running
                log.info("viewer_started", job=job.name, owner=job.owner, kind=kind)
                self._ensure_reaper()
            running.in_flight += 1
        try:
            yield running.upstream
        finally:
            running.in_flight -= 1
            running.last_used = time.monotonic()

    async def stop_job(self, job_id: str) -> None:
        """Stop the job's viewers (it was removed)."""
        for key in [k for k in self._running if k[0] == job_id]:
            await self._stop(key, "job_removed")
        for key in [k for k in self._starting if k[0] == job_id]:
            del self._starting[key]

    async def _stop(self, key: tuple[str, str], why: str) -> None:
        running = self._running.pop(key, None)
        if running is not None:
            await running.upstream.stop()
            log.info("viewer_stopped", job_id=key[0], kind=key[1], reason=why)

    def _ensure_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap(), name="jobs-viewers-idle")

    async def _reap(self) -> None:
        """Stop the viewers idle for `idle_seconds`; ends when none runs (made again by the next start)."""
        idle = self.config.idle_seconds
        try:
            while self._running:
                await asyncio.sleep(min(idle / 4, 30.0))
                now = time.monotonic()
                for key, running in list(self._running.items()):
                    if running.in_flight == 0 and now - running.last_used >= idle:
                        await self._stop(key, "idle")
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("viewers_reaper_failed")

    async def close(self) -> None:
        """Stop every viewer (the service stops): none outlives it."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for key in list(self._running):
            await self._stop(key, "service_stopping")
