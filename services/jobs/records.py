"""The jobs service's one conversion at the store boundary: a stored job read with its typed spec.

The store keeps a job's spec as the JSON its submit recorded (`Job.spec`, a dict). The jobs
service reads it once, where a job comes out of the store, into a `JobRecord`: the stored
`Job` and its `JobSpec`. A spec never changes after its submit, so a record the service
already holds keeps its spec across every later update of the job (`changed`): nothing
validates it twice. `JobRecords` is that boundary: the reads, updates and compare-and-set
transitions of jobs (with their events), each answered as records.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import structlog
from pydantic import ValidationError

from paddlecloud.common.store import Job, Store
from paddlecloud.common.store.models import (
    ACTIVE_STATES,
    BUILDING,
    FAILED,
    PENDING,
    TERMINAL_STATES,
    JobEvent,
    utcnow,
)

from .figures import JobFigures
from .spec import JobSpec

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class JobRecord:
    """A stored job and its spec, typed. Reads like the job: `record.owner`, `record.state`."""

    stored: Job
    spec: JobSpec
    # Why the stored spec no longer validates (a rule tightened since the job's submit); its
    # `spec` then holds the stored fields unchecked, enough to show, stop and remove the job.
    stale: str | None = None

    @classmethod
    def of(cls, job: Job) -> JobRecord:
        """The record of a job just read from the store; ValidationError if its stored spec
        no longer validates (a rule tightened since it was submitted)."""
        return cls(job, JobSpec.model_validate(job.spec))

    @classmethod
    def read(cls, job: Job) -> JobRecord:
        """The record of a job just read from the store, never refused: one whose stored
        spec no longer validates is read `stale`, so that its owner can still see it, kill
        it and remove it (nothing starts it: a restart fails it, and quota leaves it out)."""
        try:
            return cls.of(job)
        except ValidationError as exc:
            log.warning("stored_spec_invalid", job=job.name, owner=job.owner)
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "spec"
            known = {k: v for k, v in job.spec.items() if k in JobSpec.model_fields}
            return cls(job, JobSpec.model_construct(**known), stale=f"{where}: {first.get('msg')}")

    def changed(self, stored: Job) -> JobRecord:
        """The same job as the store answered after a change: its spec, which never changes, kept."""
        return replace(self, stored=stored)

    def evolve(self, **fields: Any) -> JobRecord:
        """This record with the stored job's `fields` replaced (not written to the store)."""
        return replace(self, stored=replace(self.stored, **fields))

    @property
    def id(self) -> str:
        return self.stored.id

    @property
    def owner(self) -> str:
        return self.stored.owner

    @property
    def name(self) -> str:
        return self.stored.name

    @property
    def state(self) -> str:
        return self.stored.state

    @property
    def reason(self) -> str:
        return self.stored.reason

    @property
    def backend(self) -> dict[str, Any]:
        return self.stored.backend

    @property
    def build_id(self) -> str | None:
        return self.stored.build_id

    @property
    def created_at(self) -> datetime:
        return self.stored.created_at

    @property
    def updated_at(self) -> datetime:
        return self.stored.updated_at

    @property
    def started_at(self) -> datetime | None:
        return self.stored.started_at

    @property
    def finished_at(self) -> datetime | None:
        return self.stored.finished_at


def started(job: JobRecord) -> bool:
    """Whether the backend has the job (it may be waiting for resources still)."""
    return bool(job.backend) and not job.backend.get("waiting")


class JobRecords:
    """The store's jobs as records, and the transitions of their states with the events
    that record them. `on_change` (the reconcile loop's) hears of every job a transition
    wrote or found changed, so what it keeps of active jobs stays current."""

    def __init__(self, store: Store, figures: JobFigures | None = None) -> None:
        self._store = store
        self._on_change: Callable[[JobRecord | None], None] = lambda _: None
        self._figures = figures
        # When each job that waits again after its build (BUILDING -> PENDING) went back to
        # PENDING, in this process; a job's first wait starts at its submit.
        self._pending_since: dict[str, datetime] = {}

    def on_change(self, callback: Callable[[JobRecord | None], None]) -> None:
        self._on_change = callback

    async def get(self, owner: str, name: str) -> JobRecord | None:
        """The owner's job of that name (read `stale` when its stored spec no longer validates)."""
        job = await self._store.get_job(owner, name)
        return None if job is None else JobRecord.read(job)

    async def by_id(self, job_id: str) -> JobRecord | None:
        job = await self._store.get_job_by_id(job_id)
        return None if job is None else JobRecord.read(job)

    async def refresh(self, record: JobRecord) -> JobRecord | None:
        """The job as the store has it now; None if it is gone."""
        job = await self._store.get_job_by_id(record.id)
        return None if job is None else record.changed(job)

    async def update(self, record: JobRecord, **fields: Any) -> JobRecord | None:
        """Set mutable fields without touching the state; None if the job is gone."""
        job = await self._store.update_job(record.id, **fields)
        return None if job is None else record.changed(job)

    async def create(self, record: JobRecord) -> None:
        await self._store.create_job(record.stored)
        if self._figures is not None:
            self._figures.submitted.inc()

    async def delete(self, record: JobRecord) -> None:
        await self._store.delete_job(record.id)

    async def all(self, owner: str | None, states: Collection[str] | None) -> AsyncIterator[Job]:
        """Every stored job of `owner` (everyone's for None) in `states`, as stored: the
        caller decides what a spec that no longer validates means for it."""
        cursor = None
        while True:
            page, cursor = await self._store.list_jobs(owner, states=states, limit=500, cursor=cursor)
            for job in page:
                yield job
            if cursor is None:
                return

    async def transition(self, job: JobRecord, state: str, reason: str, **fields: Any) -> JobRecord | None:
        """Compare-and-set the job's state (from any active state to a final one, from
        PENDING or BUILDING otherwise) with an event; None if another writer won."""
        expected = ACTIVE_STATES if state in TERMINAL_STATES else {PENDING, BUILDING}
        stored = await self._cas(job.stored, expected, state, reason=reason, **fields)
        if stored is None:
            self._on_change(await self.refresh(job))
            return None
        updated = job.changed(stored)
        title = {"RUNNING": "JobRunning"}.get(state, f"Job{state.capitalize()}")
        await self.state_event(updated, state, title, reason)
        self._on_change(updated)
        log.info("job_state_changed", job=job.name, owner=job.owner, state=state, reason=reason)
        return updated

    async def fail_stored(self, job: Job, reason: str) -> None:
        """FAILED, for an active job read from the store that nothing can run any more (its
        stored spec no longer validates, so it has no record)."""
        stored = await self._cas(job, ACTIVE_STATES, FAILED, reason=reason)
        if stored is not None:
            await self._store.add_event(
                JobEvent(
                    job_id=job.id,
                    time=utcnow(),
                    type="state",
                    reason="JobFailed",
                    message=reason,
                    state=FAILED,
                )
            )
            log.info("job_state_changed", job=job.name, owner=job.owner, state=FAILED, reason=reason)

    async def _cas(self, job: Job, expected: Collection[str], state: str, **fields: Any) -> Job | None:
        """The store's compare-and-set, counted: a job leaving PENDING (timed), a job ending.

        Whether the job left PENDING is known from which compare-and-set won: the states
        the caller's copy of the job suggests are tried first, and the rest only when that
        copy was stale (a second store call, then), so one transition is timed per wait."""
        if self._figures is None:
            return await self._store.transition_job(job.id, expected, state, **fields)
        pending = {PENDING} & set(expected) if state != PENDING else set()
        first = pending if job.state == PENDING else set(expected) - pending
        stored = await self._store.transition_job(job.id, first, state, **fields) if first else None
        won = first
        if stored is None and set(expected) - first:
            won = set(expected) - first
            stored = await self._store.transition_job(job.id, won, state, **fields)
        if stored is None:
            return None
        if won & pending:
            self._figures.left_pending(self._pending_since.pop(job.id, job.created_at))
        if state == PENDING:
            self._pending_since[job.id] = utcnow()
        if state in TERMINAL_STATES:
            self._figures.finished.labels(state).inc()
            self._pending_since.pop(job.id, None)
        return stored

    async def state_event(self, job: JobRecord, state: str, reason: str, message: str) -> None:
        await self._store.add_event(
            JobEvent(job_id=job.id, time=utcnow(), type="state", reason=reason, message=message, state=state)
        )

    async def event(self, job: JobRecord, kind: str, reason: str, message: str) -> None:
        await self._store.add_event(
            JobEvent(job_id=job.id, time=utcnow(), type=kind, reason=reason, message=message)
        )

    async def add_event(self, event: JobEvent) -> None:
        await self._store.add_event(event)

    async def events(self, job: JobRecord) -> list[JobEvent]:
        return await self._store.list_events(job.id)
