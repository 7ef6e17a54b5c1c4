"""Resource use per worker over time (docs/metrics.md, §1): sampled, downsampled, kept.

Every `jobs.metrics.interval` seconds the sampler asks the backend what each active job's
running workers use (`Backend.usage`: cgroups and nvidia-smi on one machine, the metrics
API on Kubernetes) and appends it to the job's series, one per worker. A series keeps
fewer than `MAX_POINTS` points: when it reaches them, neighbouring pairs merge into one (the max of memory
and GPU memory, so a peak is never averaged away; the mean of CPU and GPU utilisation,
which are rates) and from then on each point stands for twice as many samples. The series
go to the store (one record per worker, deleted with the job) every `FLUSH_SECONDS` and
when the job ends, not at every sample; the API reads the sampler's own copy first, so an
answer never lags behind the store.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from paddlecloud.common.config import Config
from paddlecloud.common.store import KeptSeries, Store

from .backend import Backend, JobUsage, WorkerUsage
from .records import JobRecord

log = structlog.get_logger(__name__)

# Points per worker (fewer than): an hour at the default 5 s before the first merge; after
# that the whole run at a coarser step. At most POINT_BYTES each as stored JSON (a test
# checks), so a worker's record stays under 46 KB.
MAX_POINTS = 720
POINT_BYTES = 64
FLUSH_SECONDS = 30.0
COLUMNS = ("t", "cpu_cores", "memory_bytes", "gpu_utilization", "gpu_memory_bytes")
_MAXED = frozenset({"memory_bytes", "gpu_memory_bytes"})  # merged by max; the rest by mean


def _mean(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _max(values: Iterable[Any]) -> Any:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _rounded(column: str, value: Any) -> Any:
    if value is None:
        return None
    if column in _MAXED:
        return int(value)
    if column == "gpu_utilization":
        return round(float(value), 1)
    return round(float(value), 3)


@dataclass
class WorkerSeries:
    """One worker's points, columnar as the API serves them; `step`: samples per point."""

    interval: float
    step: int = 1
    memory_limit_bytes: int | None = None
    columns: dict[str, list[Any]] = field(default_factory=lambda: {c: [] for c in COLUMNS})
    pending: list[dict[str, Any]] = field(default_factory=list)  # samples of the next point

    def __len__(self) -> int:
        return len(self.columns["t"])

    def add(self, t: float, usage: WorkerUsage) -> None:
        """Take one sample; a point is appended once `step` samples are in."""
        if usage.memory_limit_bytes is not None:
            self.memory_limit_bytes = usage.memory_limit_bytes
        self.pending.append(
            {
                "t": t,
                "cpu_cores": usage.cpu_cores,
                "memory_bytes": usage.memory_bytes,
                "gpu_utilization": usage.gpu_utilization,
                "gpu_memory_bytes": usage.gpu_memory_bytes,
            }
        )
        if len(self.pending) >= self.step:
            self.settle()

    def settle(self) -> None:
        """Append what is pending as one point (at the job's end, however few samples)."""
        if not self.pending:
            return
        point = _merge(self.pending)
        self.pending = []
        for column in COLUMNS:
            self.columns[column].append(point[column])
        if len(self) >= MAX_POINTS:  # even: every pair merges, so points stay evenly spaced
            self._halve()

    def _halve(self) -> None:
        points = [dict(zip(COLUMNS, row, strict=True)) for row in zip(*self.columns.values(), strict=True)]
        merged = [_merge(points[i : i + 2]) for i in range(0, len(points), 2)]
        self.columns = {c: [p[c] for p in merged] for c in COLUMNS}
        self.step *= 2

    def view(self, since: float | None) -> dict[str, Any]:
        """The columns (only the points after `since`), with the limit."""
        start = 0
        if since is not None:
            times = self.columns["t"]
            while start < len(times) and times[start] <= since:
                start += 1
        return {"memory_limit_bytes": self.memory_limit_bytes} | {c: self.columns[c][start:] for c in COLUMNS}

    def peaks(self) -> dict[str, Any]:
        return {
            "cpu_cores": _max(self.columns["cpu_cores"]),
            "memory_bytes": _max(self.columns["memory_bytes"]),
            "memory_limit_bytes": self.memory_limit_bytes,
            "gpu_utilization": _max(self.columns["gpu_utilization"]),
            "gpu_memory_bytes": _max(self.columns["gpu_memory_bytes"]),
        }

    def to_text(self) -> str:
        """As stored: the settled points only (the caller settles first at the job's end)."""
        kept = {"interval": self.interval, "step": self.step, "memory_limit_bytes": self.memory_limit_bytes}
        return json.dumps(kept | self.columns, separators=(",", ":"))

    @classmethod
    def from_text(cls, text: str) -> WorkerSeries:
        data = json.loads(text)
        columns = {c: list(data.get(c, [])) for c in COLUMNS}
        if len({len(v) for v in columns.values()}) != 1:
            raise ValueError("columns of different lengths")
        return cls(float(data["interval"]), int(data["step"]), data.get("memory_limit_bytes"), columns)


def _merge(points: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One point for several neighbours: it starts where the first did."""
    merged: dict[str, Any] = {"t": round(points[0]["t"], 3)}
    for column in COLUMNS[1:]:
        values = [p[column] for p in points]
        merged[column] = _rounded(column, _max(values) if column in _MAXED else _mean(values))
    return merged


@dataclass
class JobSeries:
    """A job's series by worker, and whether the backend could sample it at all."""

    job_id: str
    workers: dict[str, WorkerSeries] = field(default_factory=dict)
    available: bool = True
    reason: str | None = None
    dirty: set[str] = field(default_factory=set)  # workers changed since the last flush


class ResourceSampler:
    """The sampling loop and the series it keeps, for the API to read."""

    def __init__(
        self, config: Config, store: Store, backend: Backend, active: Callable[[], list[JobRecord]]
    ) -> None:
        self._interval = config.jobs.metrics.interval
        self._store = store
        self._backend = backend
        self._active = active
        self._series: dict[str, JobSeries] = {}
        self._last_flush = time.monotonic()
        self._flushing = asyncio.Lock()

    @property
    def interval(self) -> float:
        return self._interval

    async def run(self) -> None:
        """Sample every `interval` seconds forever (a failed tick is logged, and the next
        one comes as usual: sampling is best effort and must never stop)."""
        loop = asyncio.get_running_loop()
        next_tick = loop.time()
        try:
            while True:
                try:
                    await self.tick()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("resources_sample_failed")
                next_tick = max(next_tick + self._interval, loop.time())
                await asyncio.sleep(next_tick - loop.time())
        finally:
            await asyncio.shield(self.flush(ended=set(self._series)))

    async def tick(self, now: float | None = None) -> None:
        """One sample of every active job; the series of jobs that ended are settled and
        written, and the others every FLUSH_SECONDS."""
        jobs = [job for job in self._active() if job.backend]  # started: there is something to look at
        now = time.time() if now is None else now
        usage = await self._backend.usage(jobs) if jobs else {}
        for job in jobs:
            series = self._series.get(job.id) or await self._load(job.id)
            self._series[job.id] = series
            self._record(series, now, usage.get(job.id, JobUsage()))
        ended = set(self._series) - {job.id for job in jobs}
        due = time.monotonic() - self._last_flush >= FLUSH_SECONDS
        if ended or due:
            await self.flush(ended=ended, everything=due)

    def _record(self, series: JobSeries, now: float, usage: JobUsage) -> None:
        series.available, series.reason = usage.available, usage.reason
        for worker in usage.workers:
            kept = series.workers.get(worker.worker)
            if kept is None:
                kept = series.workers[worker.worker] = WorkerSeries(self._interval)
            kept.add(now, worker)
            series.dirty.add(worker.worker)

    async def _load(self, job_id: str) -> JobSeries:
        """What the store kept of a job (this service restarted while it ran)."""
        series = JobSeries(job_id)
        for kept in await self._store.list_series(job_id):
            try:
                series.workers[kept.worker] = WorkerSeries.from_text(kept.text)
            except (ValueError, KeyError, TypeError):
                log.warning("resources_unreadable", job_id=job_id, worker=kept.worker)
        return series

    async def flush(self, *, ended: Collection[str] = (), everything: bool = False) -> None:
        """Write the changed series of `ended` jobs (settled first, then forgotten) and,
        with `everything`, of all others."""
        async with self._flushing:
            if everything:
                self._last_flush = time.monotonic()
            for job_id in list(self._series):
                if job_id not in ended and not everything:
                    continue
                series = self._series[job_id]
                if job_id in ended:
                    for worker in series.workers.values():
                        worker.settle()
                dirty, series.dirty = series.dirty, set()
                try:
                    for name in sorted(dirty):
                        text = series.workers[name].to_text()
                        await self._store.keep_series(KeptSeries(job_id, name, text))
                except asyncio.CancelledError:
                    raise
                except Exception:
                    series.dirty |= dirty  # again at the next flush
                    log.exception("resources_not_kept", job_id=job_id)
                    continue
                if job_id in ended:
                    del self._series[job_id]

    def forget(self, job_id: str) -> None:
        """Drop a job removed from history (its records go with it in the store)."""
        self._series.pop(job_id, None)

    async def _current(self, job: JobRecord) -> JobSeries:
        return self._series.get(job.id) or await self._load(job.id)

    async def view(self, job: JobRecord, since: float | None) -> dict[str, Any]:
        """The job's series as `GET /jobs/{name}/resources` answers (docs/metrics.md §1.1)."""
        series = await self._current(job)
        available, reason = self._availability(series)
        return {
            "name": job.name,
            "available": available,
            "reason": reason,
            "interval_seconds": self._interval_of(series),
            "workers": [
                {"worker": name} | kept.view(since)
                for name, kept in sorted(series.workers.items(), key=lambda item: _worker_order(item[0]))
            ],
        }

    async def peaks(self, job: JobRecord) -> dict[str, Any] | None:
        """The peak of each figure per worker; None where nothing was sampled."""
        series = await self._current(job)
        sampled = {
            name: kept.peaks()
            for name, kept in sorted(series.workers.items(), key=lambda item: _worker_order(item[0]))
            if len(kept)
        }
        return sampled or None

    def _availability(self, series: JobSeries) -> tuple[bool, str | None]:
        if series.workers:
            return True, None
        if not series.available:
            return False, series.reason
        why = self._backend.usage_unavailable
        return (False, why) if why else (True, None)

    def _interval_of(self, series: JobSeries) -> float:
        intervals = [w.interval for w in series.workers.values()]
        return intervals[0] if intervals else self._interval


def _worker_order(name: str) -> tuple[str, int, str]:
    """pserver-0, pserver-1, ..., trainer-0, trainer-2, trainer-10: by role, then index."""
    role, _, index = name.rpartition("-")
    return (role, int(index), "") if index.isdigit() else (name, -1, name)


def finite_since(value: str | None) -> float | None:
    """`?since=` as a time, or ValueError naming what is wrong."""
    if value is None or value == "":
        return None
    since = float(value)
    if not math.isfinite(since) or since < 0:
        raise ValueError("not a finite, non-negative time")
    return since
