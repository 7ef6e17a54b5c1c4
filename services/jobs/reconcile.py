"""The reconcile loop: starting jobs, the queue of those that wait for resources, following
what the backend sees into the store's transitions, and re-attaching after a restart.

A reconcile round observes every active job, records the backend's events and turns state
changes into compare-and-set transitions, so a kill and a natural end racing each other
leave exactly one final state. On start the service re-attaches to every job the store
still calls active: a job that ran on while the service was down gets the final state its
supervisor recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import datetime
from typing import Protocol

import structlog

from paddlecloud.common import errors
from paddlecloud.common.config import Config
from paddlecloud.common.internal_auth import Identity
from paddlecloud.common.store.models import (
    ACTIVE_STATES,
    BUILDING,
    FAILED,
    KILLED,
    PENDING,
    RUNNING,
    TERMINAL_STATES,
    JobEvent,
    utcnow,
)
from paddlecloud.common.tasks import Spawned, background

from .backend import Backend, Launch, NotYet, Observation, Runtime, StartFailed
from .builds import Builds
from .launches import JobPaths, launch_of
from .packages import Packages
from .records import JobRecord, JobRecords, started

log = structlog.get_logger(__name__)


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


class Reconciler:
    """Active jobs as the backend sees them, kept in step with the store."""

    def __init__(self, config: Config, records: JobRecords, backend: Backend, packages: Packages) -> None:
        self._config = config
        self._records = records
        self._backend = backend
        self._packages = packages
        self._datacenter = config.pfs.datacenter
        self._starts = Spawned()
        self._active: dict[str, JobRecord] = {}
        # Where each active job's backend events were last read (the backend's own cursor).
        self._event_cursors: dict[str, str | None] = {}
        self._job_locks: dict[str, asyncio.Lock] = {}
        # Jobs that wait for resources (GPUs), first submitted first: the reconcile loop
        # starts the head of the queue once it fits, and nothing behind it jumps ahead.
        self._waiting: dict[str, Launch] = {}
        # Those of them that wait for what only their user lacks: the queue passes them.
        self._passed: set[str] = set()
        # Jobs the backend said changed since the reconcile loop last looked, and its alarm.
        self._changed: set[str] = set()
        self._wake = asyncio.Event()
        backend.watch(self._job_changed)
        records.on_change(self._remember)

    # -- starting ----------------------------------------------------------------------

    def spawn_start(self, launch: Launch) -> None:
        """Start the job in the background: a submit's answer does not wait for processes."""
        self._starts.spawn(f"start-{launch.job.id}", self.start(launch))

    async def start(self, launch: Launch) -> JobRecord:
        """Start a job that is PENDING or BUILDING, unless it was killed meanwhile."""
        job = launch.job
        async with self.job_lock(job.id):
            current = await self._records.refresh(job)
            if current is None or current.state not in (PENDING, BUILDING):
                return current or job
            try:
                info = await self._backend.start(replace(launch, job=current))
            except StartFailed as exc:
                self._unqueue(job.id)
                failed = await self._records.transition(current, FAILED, str(exc), finished_at=utcnow())
                return failed or current
            except NotYet as exc:
                if exc.holds_queue:
                    self._passed.discard(job.id)
                else:
                    self._passed.add(job.id)
                return await self._wait(launch, current, str(exc))
            self._unqueue(job.id)
            job = await self._records.update(current, backend=info) or current
            self._active[job.id] = job
        return job

    async def _wait(self, launch: Launch, current: JobRecord, why: str) -> JobRecord:
        """Queue a job the backend cannot start yet; recorded, so a restarted service
        queues it again (with its environment)."""
        waiting = {"waiting": why, "runtime": launch.runtime.to_dict() if launch.runtime else None}
        if current.id not in self._waiting:
            self._waiting[current.id] = launch
            await self._records.event(current, "notice", "WaitingForResources", why)
        if current.state == BUILDING:  # built, and now waits like any other job
            current = await self._records.transition(current, PENDING, why) or current
        if current.reason != why or current.backend != waiting:
            current = await self._records.update(current, reason=why, backend=waiting) or current
        return current

    async def _start_waiting(self) -> None:
        """Start queued jobs in the order they came, while the head of the queue fits;
        a job that waits for what only its user lacks is passed."""
        for job_id, launch in list(self._waiting.items()):
            job = await self.start(launch)
            if job.id in self._waiting and job.state in (PENDING, BUILDING):
                if job.id in self._passed:
                    continue
                return  # still waits: those behind it wait too
            self._unqueue(job_id)

    def _unqueue(self, job_id: str) -> None:
        self._waiting.pop(job_id, None)
        self._passed.discard(job_id)

    async def close(self) -> None:
        """Stop starting jobs (one recorded but not started is started at the restart,
        where the backend can tell a half-made start from a done one: `resumes_unstarted`)."""
        await self._starts.cancel()

    # -- stopping ----------------------------------------------------------------------

    async def stop(self, job: JobRecord, reason: str) -> None:
        """Stop an active job and record KILLED with `reason`, unless it ended first. Under
        the job's lock, so a build that finishes now cannot start it behind our back."""
        async with self.job_lock(job.id):
            job = await self._records.refresh(job) or job
            await self._backend.stop(job, self._config.jobs.grace_seconds, reason)
            await self._reconcile_locked(job)
            current = await self._records.refresh(job)
            if current is not None and current.state in ACTIVE_STATES:
                await self._records.transition(current, KILLED, reason, finished_at=utcnow())
            self._drop(job)

    # -- re-attaching after a restart --------------------------------------------------

    async def resume(self, builds: Builds) -> None:
        """Re-attach to every job the store calls active (after a restart of this service)."""
        waiting: list[JobRecord] = []
        restart: list[JobRecord] = []  # recorded, never started, nothing to adopt: start them now
        known: set[str] = set()
        async for stored in self._records.all(None, ACTIVE_STATES):
            job = JobRecord.read(stored)
            if job.stale is not None and not started(job):
                # A spec this version refuses is never started; one that runs is followed to its end.
                await self._records.fail_stored(stored, f"cannot start after a restart: {job.stale}")
                continue
            known.add(job.id)
            if job.backend.get("waiting"):
                waiting.append(job)
            elif await self._resume_one(job, builds):
                restart.append(job)
        # Queued again oldest first, once every running job holds its resources again.
        for job in sorted(waiting, key=lambda j: j.created_at):
            launch = await self._launch_for(job)
            if launch is not None:
                self._waiting[job.id] = replace(launch, runtime=Runtime.from_dict(job.backend.get("runtime")))
        for job in restart:
            await self._restart(job, builds)
        if self._active or self._waiting:
            log.info("jobs_reattached", running=len(self._active), waiting=len(self._waiting))
        # Whatever the backend still runs for a job that is no longer active goes.
        await self._backend.sweep(known)

    async def _resume_one(self, job: JobRecord, builds: Builds) -> bool:
        """Re-attach to one active job that is not waiting; True if it must be started anew."""
        if not job.backend and job.state == BUILDING and job.build_id:
            launch = await self._launch_for(job)
            if launch is not None:
                builds.watch(launch, job.build_id)
            return False
        if not job.backend:
            info = await self._backend.adopt(job)
            if info is None:
                # Recorded (a submit answered 201 keeps its promise) and not started: started
                # now. BUILDING without a build: stopped before asking for one.
                unstarted = job.state == PENDING or (job.state == BUILDING and not job.build_id)
                if self._backend.resumes_unstarted and unstarted:
                    return True
                await self._records.transition(
                    job, FAILED, "the jobs service stopped before it started the job"
                )
                return False
            job = await self._records.update(job, backend=info) or job
        self._active[job.id] = job
        self._backend.attach(job)
        cursor = job.backend.get("events_cursor")
        self._event_cursors[job.id] = cursor if isinstance(cursor, str) else None
        return False

    async def _restart(self, job: JobRecord, builds: Builds) -> None:
        """Start a job recorded before a restart but never started: its environment first
        when it needs one, as at its submit (which stopped before asking for it)."""
        launch = await self._launch_for(job)
        if launch is None:
            return
        try:
            requirements = None
            if launch.spec.image is None:
                requirements = await self._packages.requirements(launch.package, launch.package_kind)
        except (errors.DomainError, OSError) as exc:
            await self._records.transition(job, FAILED, f"cannot start after a restart: {exc}")
            return
        if requirements is not None:
            start = builds.build_then_start(Identity(job.owner), launch, requirements)
            builds.spawn(f"build-for-{job.id}", start)
        else:
            self._waiting[job.id] = launch

    async def _launch_for(self, job: JobRecord) -> Launch | None:
        """The launch of a recorded job, its paths and package looked at again; None (the
        job FAILED, saying why) when it can no longer start."""
        try:
            paths = JobPaths.resolve(Identity(job.owner), job.spec, self._datacenter)
            kind = await self._packages.kind(paths.package)
        except (errors.ProblemError, errors.DomainError, OSError) as exc:
            await self._records.transition(job, FAILED, f"cannot start after a restart: {exc}")
            return None
        return launch_of(job, paths, kind, self._datacenter)

    def active_jobs(self) -> list[JobRecord]:
        """The jobs this service follows now (started, not final), as last recorded."""
        return list(self._active.values())

    # -- the loop ----------------------------------------------------------------------

    def _job_changed(self, job_id: str) -> None:
        if job_id in self._active:
            self._changed.add(job_id)
            self._wake.set()

    async def run(self) -> None:
        """Observe active jobs forever: each one the backend says changed at once, and
        every one every `jobs.poll_seconds` (which also starts jobs waiting for resources)."""
        loop = asyncio.get_running_loop()
        next_round = loop.time()
        while True:
            self._wake.clear()
            changed, self._changed = self._changed, set()
            if loop.time() < next_round:
                jobs = [self._active[job_id] for job_id in changed if job_id in self._active]
            else:
                next_round = loop.time() + self._config.jobs.poll_seconds
                jobs = list(self._active.values())
                if self._waiting:
                    try:
                        await self._start_waiting()
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        log.exception("start_waiting_failed")
            await asyncio.gather(*(self._reconcile_one(job) for job in jobs))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.0, next_round - loop.time()))

    async def _reconcile_one(self, job: JobRecord) -> None:
        if self.job_lock(job.id).locked():
            return  # being killed or started; the next round sees the outcome
        try:
            async with self.job_lock(job.id):
                await self._reconcile_locked(job)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("reconcile_failed", job=job.name, owner=job.owner)

    def job_lock(self, job_id: str) -> asyncio.Lock:
        return self._job_locks.setdefault(job_id, asyncio.Lock())

    def _drop(self, job: JobRecord) -> None:
        self._active.pop(job.id, None)
        self._unqueue(job.id)
        self._event_cursors.pop(job.id, None)
        self._job_locks.pop(job.id, None)
        self._backend.forget(job)

    async def _reconcile_locked(self, job: JobRecord) -> None:
        current = self._active.get(job.id) or await self._records.refresh(job)
        if current is None or current.state in TERMINAL_STATES:
            self._drop(job)
            return
        observed = await self._backend.observe(current, self._event_cursors.get(job.id))
        current = await self._record_events(current, observed)
        self._event_cursors[job.id] = observed.cursor
        if observed.state == current.state:
            if observed.reason and observed.reason != current.reason:
                self._remember(await self._records.update(current, reason=observed.reason))
            return
        await self._follow(current, observed)

    async def _record_events(self, current: JobRecord, observed: Observation) -> JobRecord:
        """Record the events the backend reported, then remember where they ended: a crash
        in between records them again, never loses them."""
        for event in observed.events:
            await self._records.add_event(
                JobEvent(
                    job_id=current.id,
                    time=_parse_time(event.time) or utcnow(),
                    type=event.type.lower(),
                    reason=event.reason,
                    message=event.message,
                )
            )
        if observed.events:
            backend = {**current.backend, "events_cursor": observed.cursor}
            current = await self._records.update(current, backend=backend) or current
            self._remember(current)
        return current

    async def _follow(self, current: JobRecord, observed: Observation) -> None:
        """Turn a state the backend sees into transitions (RUNNING first, if a job ended
        before a round saw it run)."""
        state = observed.state
        skipped_running = state in TERMINAL_STATES and current.state != RUNNING and observed.started_at
        if state == RUNNING or skipped_running:
            started = _parse_time(observed.started_at) or utcnow()
            reason = observed.reason if state == RUNNING else "running"
            updated = await self._records.transition(current, RUNNING, reason, started_at=started)
            if updated is None:
                return
            current = updated
        if state in TERMINAL_STATES:
            finished = _parse_time(observed.finished_at) or utcnow()
            await self._records.transition(current, state, observed.reason, finished_at=finished)
            self._drop(current)

    def _remember(self, job: JobRecord | None) -> None:
        if job is not None and job.id in self._active:
            if job.state in TERMINAL_STATES:
                self._drop(job)
            else:
                self._active[job.id] = job


class Reconciling(Protocol):
    async def resume(self) -> None: ...
    async def run(self) -> None: ...
    async def close(self) -> None: ...


@contextlib.asynccontextmanager
async def reconciling(service: Reconciling) -> AsyncIterator[None]:
    """Re-attach, then run the reconcile loop for the duration of the block."""
    await service.resume()
    try:
        async with background("jobs-reconcile", service.run()):
            yield
    finally:
        await service.close()
