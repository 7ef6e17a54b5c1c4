"""A submit: the checks of a job spec, in order, ending in one launch whose paths were
resolved once; then the job recorded PENDING and started (or built first).

Every refusal comes before the job is recorded: a refused submit leaves nothing (no job,
no name taken), and a 201 is a promise that the job is run.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from uuid import uuid4

from paddlecloud.common.config import Config
from paddlecloud.common.errors import Exists, Invalid
from paddlecloud.common.internal_auth import Identity
from paddlecloud.common.store import AlreadyExists, Job, Store
from paddlecloud.common.store.models import PENDING, utcnow
from paddlecloud.common.volume import PfsPath

from .backend import Backend, Launch, planned_workers
from .backends import unrunnable
from .builds import Builds
from .errors import PackageNotFound, SubmitBusy
from .launches import JobPaths, launch_of
from .packages import Packages
from .quota import Quotas
from .records import JobRecord, JobRecords
from .spec import JobSpec
from .views import DryRun

# A submit's quota check holds a lease in the store: long enough for any check, short
# enough that a replica that died holding it blocks its user's submits only briefly.
QUOTA_LEASE_SECONDS = 30.0
QUOTA_LEASE_WAIT = 10.0


class Submitter:
    """Checks and records submits; `spawn_start` starts a recorded job in the background."""

    def __init__(
        self,
        config: Config,
        store: Store,
        records: JobRecords,
        backend: Backend,
        packages: Packages,
        quotas: Quotas,
        builds: Builds,
        spawn_start: Callable[[Launch], None],
    ) -> None:
        self._store = store
        self._records = records
        self._backend = backend
        self._packages = packages
        self._quotas = quotas
        self._builds = builds
        self._spawn_start = spawn_start
        self._datacenter = config.pfs.datacenter
        self._unrunnable = unrunnable(config)
        self._locks: dict[str, asyncio.Lock] = {}

    async def submit(self, identity: Identity, spec: JobSpec, *, dry_run: bool = False) -> JobRecord | DryRun:
        """Check `spec` (datacenter, registry, paths, name, quota, backend, package, its
        environment's build), record the job PENDING and start it; with `dry_run`, only
        check and say what would run."""
        owner = identity.user
        if self._unrunnable is not None:
            # First: nothing else is worth checking (nor reading off the storage).
            raise Invalid(self._unrunnable, field="datacenter")
        # A job reads and writes PFS with its owner's rights, an admin's job too: its
        # workers run as the owner, and a restarted service finds its paths again as the
        # owner. So its paths are checked as the job will use them, not with the
        # submitter's admin rights (which let an admin's job be recorded, then refused).
        runs_as = Identity(owner)
        await self._check_names(owner, spec)
        paths = JobPaths.resolve(identity, spec, self._datacenter)
        if paths.input is not None:
            await self._packages.must_exist("input", paths.input)
        # One submit per user at a time, so two cannot both fit the quota: the lock in this
        # process, the store's lease across every replica of the service.
        async with self._locks.setdefault(owner, asyncio.Lock()), self._quota_lease(owner):
            await self._check_fits(owner, spec)
            # Last, so a dry run of a package not uploaded yet still checks name and quota.
            package_kind = await self._package_kind(paths.package, dry_run=dry_run)
            job = _new_job(owner, spec)
            launch = launch_of(job, paths, package_kind or "dir", self._datacenter)
            requirements = None
            if spec.image is None and package_kind is not None:
                requirements = await self._packages.requirements(paths.package, package_kind)
            if dry_run:
                return await self._dry_run(runs_as, launch, package_kind, requirements)
            # The build is asked for before the job is recorded: a requirements.txt the
            # builder refuses, or a builder that does not answer, refuses the submit.
            build = None
            if requirements is not None:
                build = await self._builds.request(runs_as, spec, requirements, paths.package.text)
            try:
                await self._records.create(job)
            except AlreadyExists:
                raise Exists(f"job {spec.name!r} already exists") from None
        await self._records.state_event(job, PENDING, "JobSubmitted", f"submitted by {identity.user}")
        if requirements is not None:
            return await self._builds.build_then_start(runs_as, launch, requirements, build)
        # The answer does not wait for processes: the job is recorded, and starts (or
        # fails to, with the reason) while the client reads it.
        self._spawn_start(launch)
        return job

    async def _check_names(self, owner: str, spec: JobSpec) -> None:
        """The datacenter is this one, and the registry is one the owner saved."""
        if spec.datacenter is not None and spec.datacenter != self._datacenter:
            message = f"unknown datacenter {spec.datacenter!r}; this server runs {self._datacenter!r}"
            raise Invalid(message, field="datacenter")
        if spec.registry is not None and await self._store.get_registry(owner, spec.registry) is None:
            raise Invalid(
                f"no registry named {spec.registry!r} is saved for {owner}; save it with "
                f"`paddlecloud registry -name {spec.registry} -server ... -username ... -password ...`, "
                "or see `paddlecloud get registry`",
                field="registry",
            )

    async def _check_fits(self, owner: str, spec: JobSpec) -> None:
        """The name is free, the quota has room, and the backend could ever run it."""
        existing = await self._store.get_job(owner, spec.name)
        if existing is not None:
            raise Exists(
                f"job {spec.name!r} already exists ({existing.state}); "
                f"`paddlecloud kill -rm {spec.name}` removes it, or choose another name"
            )
        await self._quotas.check(owner, spec)
        refusal = self._backend.refusal(spec)
        if refusal is not None:
            field, reason = refusal
            raise Invalid(reason, field=field)

    async def _package_kind(self, package: PfsPath, *, dry_run: bool) -> str | None:
        """The package's kind; None for a dry run of a package not uploaded yet."""
        try:
            return await self._packages.kind(package)
        except PackageNotFound:
            if not dry_run:
                raise
            return None

    async def _dry_run(
        self, runs_as: Identity, launch: Launch, package_kind: str | None, requirements: str | None
    ) -> DryRun:
        build = None
        if requirements is not None:
            build = await self._builds.planned(runs_as, launch.spec, requirements, launch.package.text)
        return DryRun(
            job=launch.job,
            workers=planned_workers(launch.spec),
            package=launch.package.text,
            package_kind=package_kind,
            output=launch.output.text,
            build=build,
            objects=await self._backend.preview(launch),
        )

    @contextlib.asynccontextmanager
    async def _quota_lease(self, owner: str) -> AsyncIterator[None]:
        name, holder = f"submit:{owner}", uuid4().hex
        loop = asyncio.get_running_loop()
        deadline, delay = loop.time() + QUOTA_LEASE_WAIT, 0.01
        while not await self._store.acquire_lease(name, holder, QUOTA_LEASE_SECONDS):
            if loop.time() > deadline:
                raise SubmitBusy(f"another submit of {owner}'s is still being checked; try again")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)
        try:
            yield
        finally:
            await self._store.release_lease(name, holder)


def _new_job(owner: str, spec: JobSpec) -> JobRecord:
    """The record of a job about to be stored: its spec is the one just checked."""
    now = utcnow()
    job = Job(
        id=uuid4().hex,
        owner=owner,
        name=spec.name,
        state=PENDING,
        spec=spec.to_dict(),
        created_at=now,
        updated_at=now,
        reason="submitted",
    )
    return JobRecord(job, spec)
