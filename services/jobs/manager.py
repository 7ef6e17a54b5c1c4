"""The jobs service's domain, as its API calls it: one facade over the parts of a job's life.

The store is the history; the backend runs jobs. `JobManager` wires the parts that keep
the two in step and answers the API with domain objects (records, registries, a dry run),
which api.py renders through views.py:

- submit.py: a submit's checks, ending in one launch whose paths were resolved once;
- builds.py: a job's environment, asked for and waited on, and its build's log;
- reconcile.py: starting, the queue of jobs waiting for resources, the loop that records
  what the backend sees, and re-attaching after a restart;
- quota.py, packages.py, launches.py: quota, the package on PFS, the launch's paths;
- resources.py: what each worker uses, sampled while it runs and kept with the job;
- records.py: the store boundary, where a stored job is read once into a typed record.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Collection
from dataclasses import replace
from typing import Any

import structlog

from paddlecloud.common.clients import BuilderClient, PfsClient
from paddlecloud.common.config import Config
from paddlecloud.common.errors import BadCursor, NotFound, ProblemError
from paddlecloud.common.internal_auth import Identity
from paddlecloud.common.storage.base import ReadVolume
from paddlecloud.common.store import Job, Registry, Store, StoreError
from paddlecloud.common.store.models import ACTIVE_STATES, TERMINAL_STATES, JobEvent, utcnow
from paddlecloud.common.tasks import background
from paddlecloud.common.volume import resolve_for

from .backend import Backend, LogLine, LogQuery, WorkerInfo
from .builds import BUILD, Builds
from .errors import JobNotFound
from .launches import output_text
from .packages import Packages
from .quota import Quotas
from .reconcile import Reconciler
from .records import JobRecord, JobRecords, started
from .resources import ResourceSampler
from .scalars import Scalars, read_scalars
from .spec import JobSpec, RegistrySpec
from .submit import Submitter
from .views import DryRun

log = structlog.get_logger(__name__)


class JobManager:
    """What api.py calls: the parts of a job's life wired over one store and one backend."""

    def __init__(
        self,
        config: Config,
        store: Store,
        backend: Backend,
        volume: ReadVolume,
        builder: BuilderClient,
        pfs: PfsClient,
    ) -> None:
        self._config = config
        self._store = store
        self._backend = backend
        self._records = JobRecords(store)
        self._volume = volume
        packages = Packages(volume)
        self._quotas = Quotas(store, self._records, backend, pfs)
        self._reconciler = Reconciler(config, self._records, backend, packages)
        self._sampler = ResourceSampler(config, store, backend, self._reconciler.active_jobs)
        self._builds = Builds(config, builder, backend, self._records, packages, self._reconciler.start)
        self._submitter = Submitter(
            config,
            store,
            self._records,
            backend,
            packages,
            self._quotas,
            self._builds,
            self._reconciler.spawn_start,
        )

    @property
    def backend(self) -> Backend:
        return self._backend

    # -- submit, quota ------------------------------------------------------------------

    async def submit(self, identity: Identity, spec: JobSpec, *, dry_run: bool = False) -> JobRecord | DryRun:
        """Check `spec`, record the job PENDING and start it (submit.py); with `dry_run`,
        only check and say what would run."""
        return await self._submitter.submit(identity, spec, dry_run=dry_run)

    async def quota(self, owner: str) -> dict[str, Any]:
        return await self._quotas.view(owner)

    # -- reading ---------------------------------------------------------------------

    async def get(self, owner: str, name: str) -> JobRecord:
        job = await self._records.get(owner, name)
        if job is None:
            raise JobNotFound(f"no job named {name!r}")
        return job

    async def list_jobs(
        self, owner: str | None, *, states: Collection[str] | None, limit: int, cursor: str | None
    ) -> tuple[list[Job], str | None]:
        """A page of the owner's jobs (every user's for None), newest first, and the cursor of
        the next page: as stored, so a job whose spec no longer validates is still listed."""
        try:
            return await self._store.list_jobs(owner, states=states, limit=limit, cursor=cursor)
        except StoreError as exc:  # the only one list_jobs raises for what it was given
            raise BadCursor(str(exc)) from None

    async def events(self, job: JobRecord) -> list[JobEvent]:
        return await self._records.events(job)

    async def workers(self, job: JobRecord) -> list[WorkerInfo]:
        return await self._backend.workers(job)

    async def resources(self, job: JobRecord, since: float | None) -> dict[str, Any]:
        """The job's resource series per worker (docs/metrics.md §1.1)."""
        return await self._sampler.view(job, since)

    async def peaks(self, job: JobRecord) -> dict[str, Any] | None:
        """The peak of each resource figure per worker; None if nothing was sampled."""
        return await self._sampler.peaks(job)

    async def scalars(self, job: JobRecord, tags: Collection[str] = ()) -> Scalars:
        """The job's training curves as its output on PFS holds them now (scalars.py): while
        it runs and after it ended alike."""
        datacenter = self._config.pfs.datacenter
        text = output_text(job.spec, datacenter, job.owner)
        try:
            output = resolve_for(Identity(job.owner), text, datacenter, write=True)
        except ProblemError as exc:  # a path that no longer resolves for its owner: nothing to read
            return Scalars(warnings=[f"the job's output {text} cannot be read: {exc.detail}"])
        return await read_scalars(self._volume, output, tuple(tags))

    async def logs(
        self, identity: Identity, job: JobRecord, query: LogQuery
    ) -> AsyncGenerator[list[LogLine], None]:
        """The job's log lines for `query`: its environment's build (as the pseudo-worker
        `build`) when it had one, then its workers'. NotFound for a worker it has not."""
        known = {w.name for w in await self._backend.workers(job)} | ({BUILD} if job.build_id else set())
        unknown = sorted(set(query.workers) - known)
        if unknown:
            names = ", ".join(sorted(known)) or "none yet"
            message = f"job {job.name!r} has no worker {unknown[0][:60]!r}; its workers: {names}"
            raise NotFound(message, field="worker")
        return self._job_lines(job, query)

    async def _job_lines(self, job: JobRecord, query: LogQuery) -> AsyncGenerator[list[LogLine], None]:
        """The build's lines (cursors `b.<builder's cursor>`), then the workers'; a
        follower waits for the job to start between the two."""
        cursor = query.cursor
        if job.build_id and (cursor is None or cursor.startswith("b.")):
            if _wants_build(query):
                async for batch in self._builds.log_lines(job, query, cursor):
                    yield batch
            cursor = None  # the workers' lines from their start
        if cursor is not None and cursor.startswith("b."):
            raise BadCursor(f"{cursor[:60]!r}: this job had no build")
        current = await self._until_started(job, query)
        if current is not None and started(current) and _wants_workers(query):
            async for batch in self._backend.logs(current, replace(query, cursor=cursor)):
                yield batch

    async def _until_started(self, job: JobRecord, query: LogQuery) -> JobRecord | None:
        """The job once it started (or ended) when following; as it is otherwise. None if it is gone."""
        current: JobRecord | None = job
        while current is not None and query.follow and not started(current):
            if current.state in TERMINAL_STATES:
                break
            await asyncio.sleep(self._config.jobs.poll_seconds)  # built (or waiting), not started
            current = await self._records.refresh(current)
        return current

    # -- kill ------------------------------------------------------------------------

    async def kill(
        self, identity: Identity, name: str, *, remove: bool, owner: str | None = None
    ) -> JobRecord | None:
        """Stop the job (the caller's, or `owner`'s) if it is active and record KILLED, who
        killed it in the reason; with `remove`, forget it too."""
        job = await self.get(owner or identity.user, name)
        if job.state in ACTIVE_STATES:
            log.info("job_killing", job=name, owner=job.owner)
            # Who and when, on every backend: "killed" alone leaves a team asking who did it.
            when = utcnow().isoformat(timespec="seconds").replace("+00:00", "Z")
            await self._reconciler.stop(job, f"killed by {identity.user} at {when}")
        if remove:
            await self._backend.remove(job)
            await self._records.delete(job)
            self._sampler.forget(job.id)
            return None
        return await self._records.refresh(job)

    async def forget_user(self, admin: Identity, user: str) -> int:
        """Stop every job of a user being deleted and remove them all from history, so
        that an account made later with the same name inherits none of them. How many."""
        stored = [job async for job in self._records.all(user, None)]
        for one in stored:
            job = JobRecord.read(one)
            if job.state in ACTIVE_STATES:
                await self.kill(Identity(user), job.name, remove=False)
            current = await self._records.refresh(job) or job
            await self._backend.remove(current)
            await self._records.delete(job)
            self._sampler.forget(job.id)
        # Their saved registry credentials go too: a later account of the name gets none.
        for registry in await self._store.list_registries(user):
            await self._store.delete_registry(user, registry.name)
        await self._backend.forget_user(user)
        log.info("user_jobs_forgotten", user=user, jobs=len(stored), by=admin.user)
        return len(stored)

    # -- registry credentials ----------------------------------------------------------

    async def save_registry(self, owner: str, spec: RegistrySpec) -> Registry:
        """Save (or replace) the owner's credentials for one registry."""
        registry = Registry(owner, spec.name, spec.server, spec.username, spec.password)
        await self._store.put_registry(registry)
        log.info("registry_saved", owner=owner, registry=spec.name, server=spec.server)
        return registry

    async def registries(self, owner: str) -> list[Registry]:
        return await self._store.list_registries(owner)

    async def delete_registry(self, owner: str, name: str) -> None:
        if not await self._store.delete_registry(owner, name):
            raise NotFound(f"no registry named {name[:64]!r}; `paddlecloud get registry` lists yours")
        log.info("registry_deleted", owner=owner, registry=name)

    # -- the reconcile loop (reconcile.py) ----------------------------------------------

    async def resume(self) -> None:
        """Re-attach to every job the store calls active (after a restart of this service)."""
        await self._reconciler.resume(self._builds)

    async def run(self) -> None:
        """The reconcile loop and the resource sampler, forever."""
        async with background("jobs-resources", self._sampler.run()):
            await self._reconciler.run()

    async def close(self) -> None:
        """Stop starting jobs and waiting for builds (a restarted service takes both up again)."""
        await self._reconciler.close()
        await self._builds.close()


def _wants_build(query: LogQuery) -> bool:
    """Whether `query` asks for the build's lines: no role named, and the build among the workers."""
    return not query.roles and (not query.workers or BUILD in query.workers)


def _wants_workers(query: LogQuery) -> bool:
    """Whether `query` asks for any worker's lines besides the build's."""
    return not query.workers or bool(set(query.workers) - {BUILD})
