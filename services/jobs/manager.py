"""The jobs service's core: submit, kill, quota, and the loop that records what backends see.

The store is the history; the backend runs jobs. `JobManager` keeps the two in step:
a submit is validated (spec, package on PFS, name, quota) and recorded `PENDING` before
the backend starts it; a reconcile loop observes every active job, records the backend's
events and turns state changes into compare-and-set transitions, so a kill and a natural
end racing each other leave exactly one final state. On start the manager re-attaches to
every job the store still calls active: a job that ran on while the service was down
gets the final state its supervisor recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import tarfile
import zipfile
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, BinaryIO
from uuid import uuid4

import structlog
from pydantic import ValidationError

from paddlecloud.common import errors
from paddlecloud.common.clients import (
    BuilderClient,
    BuilderError,
    BuilderUnavailable,
    PfsClient,
    ServiceError,
    ServiceUnavailable,
)
from paddlecloud.common.config import Config
from paddlecloud.common.errors import BadCursor, Exists, Invalid, NotFound
from paddlecloud.common.internal_auth import Identity
from paddlecloud.common.quantity import format_bytes, format_cpu_milli
from paddlecloud.common.store import AlreadyExists, Job, Registry, Store, StoreError
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
from paddlecloud.common.volume import PfsPath, Root, resolve_for

from .backend import (
    Backend,
    Launch,
    LogLine,
    LogQuery,
    NotYet,
    Runtime,
    StartFailed,
    WorkerInfo,
    planned_workers,
)
from .errors import (
    BuildRefused,
    BuildUnavailable,
    JobNotFound,
    PackageNotFound,
    PfsUnavailable,
    QuotaExceeded,
    SubmitBusy,
    UnknownUser,
)
from .spec import JobSpec, RegistrySpec

log = structlog.get_logger(__name__)

REQUIREMENTS = "requirements.txt"
MAX_REQUIREMENTS = 64 * 1024
# A submit's quota check holds a lease in the store: long enough for any check, short
# enough that a replica that died holding it blocks its user's submits only briefly.
QUOTA_LEASE_SECONDS = 30.0
QUOTA_LEASE_WAIT = 10.0
BUILD = "build"  # the pseudo-worker whose lines are the job's environment build
ARCHIVE_SUFFIXES = {".tar.gz": "tar", ".tgz": "tar", ".tar": "tar", ".zip": "zip"}


def iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def job_view(job: Job) -> dict[str, Any]:
    return {
        "name": job.name,
        "owner": job.owner,
        "state": job.state,
        "reason": job.reason,
        "created_at": iso(job.created_at),
        "updated_at": iso(job.updated_at),
        "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at),
        "spec": job.spec,
    }


def registry_view(registry: Registry) -> dict[str, Any]:
    """A saved registry as the API shows it: never its password."""
    return {
        "name": registry.name,
        "server": registry.server,
        "username": registry.username,
        "created_at": iso(registry.created_at),
    }


def event_view(event: JobEvent) -> dict[str, Any]:
    return {
        "time": iso(event.time),
        "type": event.type,
        "reason": event.reason,
        "message": event.message,
        "state": event.state,
    }


# How often one job asks for its build when the builder keeps stopping under it.
MAX_BUILD_REQUESTS = 3


@dataclass(frozen=True)
class Submission:
    """A spec whose paths are resolved and checked, ready to start."""

    spec: JobSpec
    launch_paths: dict[str, Any]


@dataclass(frozen=True)
class Resources:
    cpu_milli: int = 0
    gpu: int = 0
    memory_bytes: int = 0
    jobs: int = 0

    @classmethod
    def of(cls, spec: JobSpec) -> Resources:
        return cls(
            cpu_milli=spec.trainers * spec.cpu_milli + spec.pservers * spec.pscpu_milli,
            gpu=spec.trainers * spec.gpu,
            memory_bytes=spec.trainers * spec.memory_bytes + spec.pservers * spec.psmemory_bytes,
            jobs=1,
        )

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu_milli + other.cpu_milli,
            self.gpu + other.gpu,
            self.memory_bytes + other.memory_bytes,
            self.jobs + other.jobs,
        )


def _build_refusal(exc: BuilderError) -> errors.DomainError:
    """A submit's refusal for what the builder answered: it refused the requirements (422
    naming the package), or it cannot answer now (503: try again)."""
    if isinstance(exc, BuilderUnavailable) or exc.status >= 500:
        return BuildUnavailable(f"the job's environment cannot be built now: {exc.detail}; try again")
    return BuildRefused(f"{REQUIREMENTS}: {exc.detail}", field="package")


class JobManager:
    def __init__(
        self,
        config: Config,
        store: Store,
        backend: Backend,
        root: Root,
        builder: BuilderClient,
        pfs: PfsClient,
    ) -> None:
        self._config = config
        self._builder = builder
        self._build_watchers = Spawned()
        self._starts = Spawned()
        self._store = store
        self._backend = backend
        self._root = root
        self._pfs = pfs
        self._datacenter = config.pfs.datacenter
        self._submit_locks: dict[str, asyncio.Lock] = {}
        self._active: dict[str, Job] = {}
        # Where each active job's backend events were last read (the backend's own cursor).
        self._event_cursors: dict[str, str | None] = {}
        self._job_locks: dict[str, asyncio.Lock] = {}
        # Jobs that wait for resources (GPUs), first submitted first: the reconcile loop
        # starts the head of the queue once it fits, and nothing behind it jumps ahead.
        self._waiting: dict[str, Launch] = {}
        # Jobs the backend said changed since the reconcile loop last looked, and its alarm.
        self._changed: set[str] = set()
        self._wake = asyncio.Event()
        backend.watch(self._job_changed)

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def builder(self) -> BuilderClient:
        return self._builder

    # -- submit ----------------------------------------------------------------------

    def home(self, user: str) -> str:
        return f"/pfs/{self._datacenter}/home/{user}"

    async def submit(self, identity: Identity, spec: JobSpec, *, dry_run: bool = False) -> dict[str, Any]:
        """Check `spec` (paths, name, quota, GPUs, package, its environment's build), record
        the job PENDING and start it; with `dry_run`, only check and say what would run.

        Every refusal comes before the job is recorded: a refused submit leaves nothing (no
        job, no name taken), and a 201 is a promise that the job is run."""
        owner = identity.user
        # A job reads and writes PFS with its owner's rights, an admin's job too: its
        # workers run as the owner, and a restarted service finds its paths again as the
        # owner. So its paths are checked as the job will use them, not with the
        # submitter's admin rights (which let an admin's job be recorded, then refused).
        runs_as = Identity(owner)
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
        package = self._job_path(identity, "package", spec.package, write=False)
        self._job_path(identity, "output", self._output(spec, owner), write=True)
        if spec.input is not None:
            input_path = self._job_path(identity, "input", spec.input, write=False)
            await asyncio.to_thread(self._must_exist, "input", input_path)
        lock = self._submit_locks.setdefault(owner, asyncio.Lock())
        # One submit per user at a time, so two cannot both fit the quota: the lock in this
        # process, the store's lease across every replica of the service.
        async with lock, self._quota_lease(owner):
            existing = await self._store.get_job(owner, spec.name)
            if existing is not None:
                raise Exists(
                    f"job {spec.name!r} already exists ({existing.state}); "
                    f"`paddlecloud kill -rm {spec.name}` removes it, or choose another name"
                )
            await self._check_quota(owner, spec)
            refusal = self._backend.refusal(spec)
            if refusal is not None:
                field, reason = refusal
                raise Invalid(reason, field=field)
            # Last, so a dry run of a package not uploaded yet still checks name and quota.
            try:
                package_kind = await asyncio.to_thread(self._check_package, package)
            except PackageNotFound:
                if not dry_run:
                    raise
                package_kind = None
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
            launch = self._launch(job, spec, package_kind or "dir")
            requirements = None
            if spec.image is None and package_kind is not None:
                requirements = await asyncio.to_thread(self._requirements, package, package_kind)
            if dry_run:
                answer = {
                    "dry_run": True,
                    "job": job_view(job),
                    "workers": [w.to_dict() for w in planned_workers(spec)],
                    "package": {
                        "path": package.text,
                        "kind": package_kind,
                        "found": package_kind is not None,
                    },
                    "output": launch.output,
                    "build": None,
                }
                if requirements is not None:
                    answer["build"] = await self._planned_build(runs_as, spec, requirements, package.text)
                objects = await self._backend.preview(launch)
                if objects:
                    answer["objects"] = objects
                return answer
            # The build is asked for before the job is recorded: a requirements.txt the
            # builder refuses, or a builder that does not answer, refuses the submit.
            build = None
            if requirements is not None:
                build = await self._request_build(runs_as, spec, requirements, package.text)
            try:
                await self._store.create_job(job)
            except AlreadyExists:
                raise Exists(f"job {spec.name!r} already exists") from None
        await self._state_event(job, PENDING, "JobSubmitted", f"submitted by {identity.user}")
        if requirements is not None:
            return job_view(await self._build_then_start(runs_as, launch, requirements, build))
        # The answer does not wait for processes: the job is recorded, and starts (or
        # fails to, with the reason) while the client reads it.
        self._starts.spawn(f"start-{job.id}", self._start(launch))
        return job_view(job)

    def _job_path(self, identity: Identity, field: str, text: str, *, write: bool) -> PfsPath:
        """A path of the caller's job, checked as its owner will use it (never with admin
        rights); an admin is told why their own rights do not reach it."""
        try:
            return resolve_for(Identity(identity.user), text, self._datacenter, write=write)
        except errors.ProblemError as exc:
            detail = exc.detail
            if identity.admin:
                detail += (
                    "; a job reads and writes PFS with its owner's rights, an admin's too: "
                    "copy what it needs into your home"
                )
            raise Invalid(detail, field=field) from None

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

    async def _start(self, launch: Launch) -> Job:
        """Start a job that is PENDING or BUILDING, unless it was killed meanwhile."""
        job = launch.job
        async with self._job_lock(job.id):
            current = await self._store.get_job_by_id(job.id)
            if current is None or current.state not in (PENDING, BUILDING):
                return current or job
            try:
                info = await self._backend.start(replace(launch, job=current))
            except StartFailed as exc:
                self._waiting.pop(job.id, None)
                failed = await self._transition(current, FAILED, str(exc), finished_at=utcnow())
                return failed or current
            except NotYet as exc:
                # Recorded, so a restarted service queues it again (with its environment).
                waiting = {
                    "waiting": str(exc),
                    "runtime": launch.runtime.to_dict() if launch.runtime else None,
                }
                if job.id not in self._waiting:
                    self._waiting[job.id] = launch
                    await self._event(current, "notice", "WaitingForResources", str(exc))
                if current.state == BUILDING:  # built, and now waits like any other job
                    current = await self._transition(current, PENDING, str(exc)) or current
                if current.reason != str(exc) or current.backend != waiting:
                    current = (
                        await self._store.update_job(job.id, reason=str(exc), backend=waiting) or current
                    )
                return current
            self._waiting.pop(job.id, None)
            updated = await self._store.update_job(job.id, backend=info)
            job = updated or current
            self._active[job.id] = job
        return job

    async def _start_waiting(self) -> None:
        """Start queued jobs in the order they came, while the head of the queue fits."""
        for job_id, launch in list(self._waiting.items()):
            job = await self._start(launch)
            if job.id in self._waiting and job.state in (PENDING, BUILDING):
                return  # still waits: those behind it wait too
            self._waiting.pop(job_id, None)

    # -- builds ----------------------------------------------------------------------

    def _requirements(self, package: PfsPath, kind: str) -> str | None:
        """The package's requirements.txt, if it has one with something in it."""
        data: bytes | None = None
        try:
            if kind == "dir":
                fd = self._root.open(package.child(REQUIREMENTS), os.O_RDONLY | os.O_CLOEXEC)
                with os.fdopen(fd, "rb") as f:
                    data = f.read(MAX_REQUIREMENTS + 1)
            else:
                fd = self._root.open(package, os.O_RDONLY | os.O_CLOEXEC)
                with os.fdopen(fd, "rb") as f:
                    data = _archived_requirements(f, kind)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        except (OSError, tarfile.TarError, zipfile.BadZipFile) as exc:
            raise Invalid(f"cannot read {package}: {exc}", field="package") from None
        if data is None:
            return None
        if len(data) > MAX_REQUIREMENTS:
            raise Invalid(
                f"its {REQUIREMENTS} is larger than {MAX_REQUIREMENTS // 1024} KiB", field="package"
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise Invalid(f"its {REQUIREMENTS} is not UTF-8 text", field="package") from None
        return text if text.strip() else None

    async def _planned_build(
        self, identity: Identity, spec: JobSpec, requirements: str, package: str
    ) -> dict[str, Any]:
        try:
            answer = await self._builder.request_build(
                identity, requirements=requirements, dry_run=True, **self._build_target(spec, package)
            )
        except BuilderError as exc:
            raise _build_refusal(exc) from None
        return {"key": answer.get("key"), "cached": bool(answer.get("cached"))}

    async def _request_build(
        self, identity: Identity, spec: JobSpec, requirements: str, package: str
    ) -> dict[str, Any]:
        """Ask the builder for the environment of a job about to be recorded; a refusal
        (or no answer) refuses the submit."""
        try:
            return await self._builder.request_build(
                identity, requirements=requirements, **self._build_target(spec, package)
            )
        except BuilderError as exc:
            raise _build_refusal(exc) from None

    def _build_target(self, spec: JobSpec, package: str) -> dict[str, Any]:
        """What a build for `spec` is asked to start from: the backend's base image, read
        with the job's registry credentials (a private base), or the builder's default."""
        base = self._backend.build_base(spec)
        return {"base": base, "package": package, "registry": spec.registry if base else None}

    async def _build_then_start(
        self, identity: Identity, launch: Launch, requirements: str, build: dict[str, Any] | None = None
    ) -> Job:
        """BUILDING until the builder has the job's environment, then start it in that.
        `build` is the one a submit asked for before recording the job; without it (a job
        recorded before a restart) it is asked for here, and a refusal fails the job."""
        job = launch.job
        building = await self._transition(job, BUILDING, f"building the environment for {REQUIREMENTS}")
        if building is None:
            return await self._store.get_job_by_id(job.id) or job
        if build is None:
            try:
                build = await self._builder.request_build(
                    identity, requirements=requirements, **self._build_target(launch.spec, launch.package)
                )
            except BuilderError as exc:
                failed = await self._transition(
                    building, FAILED, f"cannot build the environment: {exc.detail}", finished_at=utcnow()
                )
                return failed or building
        job = await self._store.update_job(job.id, build_id=str(build["id"])) or building
        how = "a cached environment" if build.get("cached") else "a new build"
        await self._event(
            job, "notice", "BuildRequested", f"build {build['id']} ({how}, key {build.get('key')})"
        )
        self._watch_build(replace(launch, job=job), str(build["id"]))
        return job

    def _watch_build(self, launch: Launch, build_id: str) -> None:
        self._build_watchers.spawn(f"build-of-{launch.job.id}", self._await_build(launch, build_id))

    async def _await_build(self, launch: Launch, build_id: str) -> None:
        job = launch.job
        identity = Identity(job.owner)
        requests = 1
        while True:
            try:
                build = await self._builder.get_build(identity, build_id)
            except BuilderUnavailable:
                build = {"state": "UNKNOWN"}  # it may be restarting: ask again
            except BuilderError as exc:
                build = {"state": "FAILED", "reason": exc.detail}
            state = build.get("state")
            if state == "FAILED" and build.get("interrupted") and requests <= MAX_BUILD_REQUESTS:
                # The builder stopped mid-build (`paddlecloud server` restarted, say): that is
                # no fault of the job's, so ask again; the build resumes from nothing or hits
                # the cache if it got that far.
                renewed = await self._request_again(launch, build_id)
                if renewed is None:
                    return
                build_id, requests = renewed, requests + 1
                continue
            if state in ("SUCCEEDED", "FAILED"):
                break
            current = await self._store.get_job_by_id(job.id)
            if current is None or current.state != BUILDING:
                return  # killed or removed while it built
            await asyncio.sleep(self._config.jobs.poll_seconds * 5)
        if state == "FAILED":
            reason = f"the environment build failed: {build.get('reason') or 'no reason given'}"
            current = await self._store.get_job_by_id(job.id)
            if current is not None and current.state == BUILDING:
                await self._event(current, "warning", "BuildFailed", reason)
                await self._transition(current, FAILED, reason, finished_at=utcnow())
            return
        await self._start(replace(launch, runtime=Runtime.from_dict(build)))

    async def _request_again(self, launch: Launch, old_build: str) -> str | None:
        """Request the build of a BUILDING job again; its new id, or None when the job
        no longer waits for one (killed) or the request failed (the job FAILED)."""
        job = launch.job
        current = await self._store.get_job_by_id(job.id)
        if current is None or current.state != BUILDING:
            return None
        owner = Identity(job.owner)
        try:
            package = self._resolve(owner, "package", launch.spec.package, write=False)
            requirements = await asyncio.to_thread(self._requirements, package, launch.package_kind)
            if requirements is None:
                raise Invalid(f"its {REQUIREMENTS} is gone", field="package")
            build = await self._builder.request_build(
                owner, requirements=requirements, **self._build_target(launch.spec, launch.package)
            )
        except (BuilderError, errors.DomainError, OSError) as exc:
            detail = exc.detail if isinstance(exc, BuilderError) else str(exc)
            reason = f"cannot build the environment again: {detail}"
            await self._transition(current, FAILED, reason, finished_at=utcnow())
            return None
        new_id = str(build["id"])
        current = await self._store.update_job(job.id, build_id=new_id) or current
        await self._event(
            current,
            "notice",
            "BuildRequestedAgain",
            f"build {old_build} stopped with the builder; requested again as build {new_id}",
        )
        return new_id

    async def close(self) -> None:
        """Stop waiting for builds (they go on; a restarted service waits again) and stop
        starting jobs (one recorded but not started is started at the restart, where the
        backend can tell a half-made start from a done one: `resumes_unstarted`)."""
        await self._starts.cancel()
        await self._build_watchers.cancel()

    def _launch_for(self, job: Job) -> Launch:
        """The launch of a recorded job, its package looked at again (after a restart)."""
        spec = JobSpec.model_validate(job.spec)
        package = self._resolve(Identity(job.owner), "package", spec.package, write=False)
        return self._launch(job, spec, self._check_package(package))

    def _launch(self, job: Job, spec: JobSpec, package_kind: str) -> Launch:
        """What the backend needs to run a job whose spec's paths were checked at submit."""
        owner = Identity(job.owner)
        package = self._resolve(owner, "package", spec.package, write=False)
        output = self._resolve(owner, "output", self._output(spec, job.owner), write=True)
        input_path = None if spec.input is None else self._resolve(owner, "input", spec.input, write=False)
        return Launch(
            job=job,
            spec=spec,
            datacenter=self._datacenter,
            pfs_home=self.home(job.owner),
            output=output.text,
            package=package.text,
            package_kind=package_kind,
            input=None if input_path is None else input_path.text,
        )

    def _output(self, spec: JobSpec, owner: str) -> str:
        return spec.output or f"{self.home(owner)}/jobs/{spec.name}/output"

    def _resolve(self, identity: Identity, field: str, text: str, *, write: bool) -> PfsPath:
        try:
            return resolve_for(identity, text, self._datacenter, write=write)
        except errors.ProblemError as exc:  # the path grammar's refusal, shown as this field's
            raise Invalid(exc.detail, field=field) from None

    def _must_exist(self, field: str, path: PfsPath) -> os.stat_result:
        try:
            fd = self._root.open(path, os.O_PATH | os.O_CLOEXEC)
        except PermissionError:
            raise Invalid(f"{path} leads outside its area through a symlink", field=field) from None
        except (FileNotFoundError, NotADirectoryError, errors.ProblemError):
            raise Invalid(f"{path} does not exist on PFS", field=field) from None
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def _check_package(self, path: PfsPath) -> str:
        """The package's kind (dir, tar or zip); 422 if it is missing or neither."""
        try:
            st = self._must_exist("package", path)
        except Invalid:
            # One line a person reads: where it was looked for, and the first two things to try.
            raise PackageNotFound(
                f"{path} not found on PFS: upload it (`paddlecloud submit DIR` does) or check the path "
                f"(`paddlecloud ls {path.parent()}`); a full storage quota stops uploads too",
                field="package",
            ) from None
        if stat.S_ISDIR(st.st_mode):
            return "dir"
        kind = next((k for suffix, k in ARCHIVE_SUFFIXES.items() if path.name.endswith(suffix)), None)
        if stat.S_ISREG(st.st_mode) and kind is not None:
            return kind
        raise Invalid(f"{path} must be a directory or a .tar.gz, .tgz, .tar or .zip archive", field="package")

    # -- quota -----------------------------------------------------------------------

    async def _in_use(self, owner: str) -> Resources:
        total = Resources()
        async for job in self._all_jobs(owner, ACTIVE_STATES):
            try:
                total = total + Resources.of(JobSpec.model_validate(job.spec))
            except ValidationError:
                log.warning("stored_spec_invalid", job=job.name, owner=owner)
        return total

    async def _all_jobs(self, owner: str | None, states: Collection[str] | None) -> AsyncIterator[Job]:
        cursor = None
        while True:
            page, cursor = await self._store.list_jobs(owner, states=states, limit=500, cursor=cursor)
            for job in page:
                yield job
            if cursor is None:
                return

    async def _check_quota(self, owner: str, spec: JobSpec) -> None:
        user = await self._store.get_user(owner)
        if user is None:
            raise UnknownUser(f"user {owner!r} does not exist")
        quota = user.quota
        used = await self._in_use(owner)
        asked = Resources.of(spec)
        over = []
        checks: list[tuple[str, int, int, int | None, Callable[[int], str]]] = [
            ("cpu", asked.cpu_milli, used.cpu_milli, quota.cpu_milli, format_cpu_milli),
            ("gpu", asked.gpu, used.gpu, quota.gpu, str),
            ("memory", asked.memory_bytes, used.memory_bytes, quota.memory_bytes, format_bytes),
            ("jobs", asked.jobs, used.jobs, quota.jobs, str),
        ]
        for resource, want, have, limit, fmt in checks:
            if limit is not None and want + have > limit:
                over.append((resource, fmt(want), fmt(have), fmt(limit)))
        if quota.storage_bytes is not None:
            stored = int((await self._storage(owner)).get("bytes", 0))
            if stored >= quota.storage_bytes:
                over.append(("storage", "0", format_bytes(stored), format_bytes(quota.storage_bytes)))
        if over:
            parts = [f"{r}: asked {a}, in use {u}, allowed {lim}" for r, a, u, lim in over]
            raise QuotaExceeded(
                f"job {spec.name!r} does not fit your quota — " + "; ".join(parts),
                quota=[{"resource": r, "requested": a, "used": u, "limit": lim} for r, a, u, lim in over],
            )

    async def _storage(self, owner: str) -> dict[str, Any]:
        """The owner's home as pfs counts it (it owns the count and its cache): `bytes`, and
        whether its filesystem enforces the limit (`enforced`, `enforcement`)."""
        try:
            return await self._pfs.usage(Identity(owner))
        except ServiceUnavailable as exc:
            raise PfsUnavailable(f"storage use cannot be checked now: {exc.detail}") from None
        except ServiceError as exc:
            raise PfsUnavailable(f"storage use cannot be checked now: pfs said {exc.code}") from None

    async def quota(self, owner: str) -> dict[str, Any]:
        user = await self._store.get_user(owner)
        if user is None:
            raise UnknownUser(f"user {owner!r} does not exist")
        q = user.quota
        used = await self._in_use(owner)
        machine = dict(self._backend.capacity())
        stored: int | None = None  # unknown while pfs does not answer; nothing here depends on it
        with contextlib.suppress(PfsUnavailable):
            storage = await self._storage(owner)
            stored = int(storage.get("bytes", 0))
            machine["storage"] = "enforced" if storage.get("enforced") else "advisory"
            machine["storage_detail"] = str(storage.get("enforcement", ""))

        def opt(value: int | None, fmt: Any) -> Any:
            return None if value is None else fmt(value)

        devices: list[dict[str, Any]] = []
        async for job in self._all_jobs(owner, ACTIVE_STATES):
            for worker, held in sorted(self._backend.devices(job).items()):
                devices += [{"job": job.name, "worker": worker, "device": d} for d in held]
        return {
            "user": owner,
            "cpu": {"used": format_cpu_milli(used.cpu_milli), "limit": opt(q.cpu_milli, format_cpu_milli)},
            "gpu": {"used": used.gpu, "limit": q.gpu},
            "devices": devices,
            "memory": {"used": format_bytes(used.memory_bytes), "limit": opt(q.memory_bytes, format_bytes)},
            "jobs": {"used": used.jobs, "limit": q.jobs},
            "storage": {"used": opt(stored, format_bytes), "limit": opt(q.storage_bytes, format_bytes)},
            "machine": machine,
        }

    # -- reading ---------------------------------------------------------------------

    async def get(self, owner: str, name: str) -> Job:
        job = await self._store.get_job(owner, name)
        if job is None:
            raise JobNotFound(f"no job named {name!r}")
        return job

    async def list_jobs(
        self, owner: str | None, *, states: Collection[str] | None, limit: int, cursor: str | None
    ) -> tuple[list[Job], str | None]:
        """A page of the owner's jobs (every user's for None), newest first, and the cursor of
        the next page."""
        try:
            return await self._store.list_jobs(owner, states=states, limit=limit, cursor=cursor)
        except StoreError as exc:  # the only one list_jobs raises for what it was given
            raise BadCursor(str(exc)) from None

    async def events(self, job: Job) -> list[JobEvent]:
        return await self._store.list_events(job.id)

    async def workers(self, job: Job) -> list[WorkerInfo]:
        return await self._backend.workers(job)

    async def logs(
        self, identity: Identity, job: Job, query: LogQuery
    ) -> AsyncGenerator[list[LogLine], None]:
        """The job's log lines for `query`: its environment's build (as the pseudo-worker
        `build`) when it had one, then its workers'. NotFound for a worker it has not."""
        known = {w.name for w in await self._backend.workers(job)} | ({BUILD} if job.build_id else set())
        unknown = sorted(set(query.workers) - known)
        if unknown:
            names = ", ".join(sorted(known)) or "none yet"
            message = f"job {job.name!r} has no worker {unknown[0][:60]!r}; its workers: {names}"
            raise NotFound(message, field="worker")
        return self._job_lines(identity, job, query)

    async def _job_lines(
        self, identity: Identity, job: Job, query: LogQuery
    ) -> AsyncGenerator[list[LogLine], None]:
        """The build's log (cursors `b.<builder's cursor>`), then the workers' logs; a
        follower waits for the job to start between the two."""
        cursor = query.cursor
        wanted = not query.roles and (not query.workers or BUILD in query.workers)
        if job.build_id and cursor is not None and cursor.startswith("b.") and not wanted:
            cursor = None
        if job.build_id and wanted and (cursor is None or cursor.startswith("b.")):
            try:
                # `tail` counts per worker, and the build is one more (docs/jobs.md).
                async for item in self._builder.logs(
                    # The build is the job owner's, whoever reads its log (an administrator).
                    Identity(job.owner),
                    job.build_id,
                    follow=query.follow,
                    cursor=cursor[2:] if cursor else None,
                    tail=query.tail,
                ):
                    yield [LogLine(BUILD, item["line"], "b." + item["cursor"])]
            except BuilderError as exc:
                if exc.status == 400:
                    raise BadCursor(exc.detail) from None
                yield [LogLine(BUILD, f"(the build's log is not available: {exc.detail})", cursor or "b.")]
            cursor = None
        if cursor is not None and cursor.startswith("b."):
            raise BadCursor(f"{cursor[:60]!r}: this job had no build")
        while query.follow and not _started(job) and job.state not in TERMINAL_STATES:
            await asyncio.sleep(self._config.jobs.poll_seconds)  # built (or waiting), not started
            latest = await self._store.get_job_by_id(job.id)
            if latest is None:
                return
            job = latest
        if _started(job) and (not query.workers or set(query.workers) - {BUILD}):
            async for batch in self._backend.logs(job, replace(query, cursor=cursor)):
                yield batch

    # -- kill ------------------------------------------------------------------------

    async def kill(
        self, identity: Identity, name: str, *, remove: bool, owner: str | None = None
    ) -> Job | None:
        """Stop the job (the caller's, or `owner`'s) if it is active and record KILLED, who
        killed it in the reason; with `remove`, forget it too."""
        job = await self.get(owner or identity.user, name)
        if job.state in ACTIVE_STATES:
            log.info("job_killing", job=name, owner=job.owner)
            # Who and when, on every backend: "killed" alone leaves a team asking who did it.
            when = utcnow().isoformat(timespec="seconds").replace("+00:00", "Z")
            reason = f"killed by {identity.user} at {when}"
            # Under the job's lock, so a build that finishes now cannot start it behind our back.
            async with self._job_lock(job.id):
                job = await self._store.get_job_by_id(job.id) or job
                await self._backend.stop(job, self._config.jobs.grace_seconds, reason)
                await self._reconcile_locked(job)
                current = await self._store.get_job_by_id(job.id)
                if current is not None and current.state in ACTIVE_STATES:
                    await self._transition(current, KILLED, reason, finished_at=utcnow())
                self._drop(job)
        if remove:
            await self._backend.remove(job)
            await self._store.delete_job(job.id)
            return None
        return await self._store.get_job_by_id(job.id)

    async def forget_user(self, admin: Identity, user: str) -> int:
        """Stop every job of a user being deleted and remove them all from history, so
        that an account made later with the same name inherits none of them. How many."""
        jobs = [job async for job in self._all_jobs(user, None)]
        for job in jobs:
            if job.state in ACTIVE_STATES:
                await self.kill(Identity(user), job.name, remove=False)
            current = await self._store.get_job_by_id(job.id) or job
            await self._backend.remove(current)
            await self._store.delete_job(job.id)
        # Their saved registry credentials go too: a later account of the name gets none.
        for registry in await self._store.list_registries(user):
            await self._store.delete_registry(user, registry.name)
        await self._backend.forget_user(user)
        log.info("user_jobs_forgotten", user=user, jobs=len(jobs), by=admin.user)
        return len(jobs)

    # -- registry credentials ----------------------------------------------------------

    async def save_registry(self, owner: str, spec: RegistrySpec) -> dict[str, Any]:
        """Save (or replace) the owner's credentials for one registry; its view, no password."""
        registry = Registry(owner, spec.name, spec.server, spec.username, spec.password)
        await self._store.put_registry(registry)
        log.info("registry_saved", owner=owner, registry=spec.name, server=spec.server)
        return registry_view(registry)

    async def registries(self, owner: str) -> list[dict[str, Any]]:
        return [registry_view(r) for r in await self._store.list_registries(owner)]

    async def delete_registry(self, owner: str, name: str) -> None:
        if not await self._store.delete_registry(owner, name):
            raise NotFound(f"no registry named {name[:64]!r}; `paddlecloud get registry` lists yours")
        log.info("registry_deleted", owner=owner, registry=name)

    # -- reconcile -------------------------------------------------------------------

    async def resume(self) -> None:
        """Re-attach to every job the store calls active (after a restart of this service)."""
        waiting: list[Job] = []
        restart: list[Job] = []  # recorded, never started, nothing to adopt: start them now
        known: set[str] = set()
        async for job in self._all_jobs(None, ACTIVE_STATES):
            known.add(job.id)
            if job.backend.get("waiting"):
                waiting.append(job)
                continue
            if not job.backend and job.state == BUILDING and job.build_id:
                try:
                    launch = await asyncio.to_thread(self._launch_for, job)
                except (errors.ProblemError, ValidationError) as exc:
                    await self._transition(job, FAILED, f"cannot start after a restart: {exc}")
                else:
                    self._watch_build(launch, job.build_id)
                continue
            if not job.backend:
                info = await self._backend.adopt(job)
                if info is not None:
                    job = await self._store.update_job(job.id, backend=info) or job
                elif self._backend.resumes_unstarted and (
                    job.state == PENDING or (job.state == BUILDING and not job.build_id)
                ):
                    # Recorded (a submit answered 201 keeps its promise) and not started:
                    # started now. BUILDING without a build: stopped before asking for one.
                    restart.append(job)
                    continue
                else:
                    await self._transition(job, FAILED, "the jobs service stopped before it started the job")
                    continue
            self._active[job.id] = job
            self._backend.attach(job)
            cursor = job.backend.get("events_cursor")
            self._event_cursors[job.id] = cursor if isinstance(cursor, str) else None
        # Queued again oldest first, once every running job holds its resources again.
        for job in sorted(waiting, key=lambda j: j.created_at):
            try:
                launch = await asyncio.to_thread(self._launch_for, job)
            except (errors.ProblemError, ValidationError) as exc:
                await self._transition(job, FAILED, f"cannot start after a restart: {exc}")
                continue
            self._waiting[job.id] = replace(launch, runtime=Runtime.from_dict(job.backend.get("runtime")))
        for job in restart:
            try:
                launch = await asyncio.to_thread(self._launch_for, job)
                requirements = None
                if launch.spec.image is None:
                    package = self._resolve(Identity(job.owner), "package", launch.package, write=False)
                    requirements = await asyncio.to_thread(self._requirements, package, launch.package_kind)
            except (errors.ProblemError, errors.DomainError, ValidationError, OSError) as exc:
                await self._transition(job, FAILED, f"cannot start after a restart: {exc}")
                continue
            if requirements is not None:
                # Its environment first, as at its submit (which stopped before asking for it).
                start = self._build_then_start(Identity(job.owner), launch, requirements)
                self._build_watchers.spawn(f"build-for-{job.id}", start)
            else:
                self._waiting[job.id] = launch
        if self._active or self._waiting:
            log.info("jobs_reattached", running=len(self._active), waiting=len(self._waiting))
        # Whatever the backend still runs for a job that is no longer active goes.
        await self._backend.sweep(known)

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
            await self._reconcile_all(jobs)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.0, next_round - loop.time()))

    async def _reconcile_all(self, jobs: list[Job]) -> None:
        await asyncio.gather(*(self._reconcile_one(job) for job in jobs))

    async def _reconcile_one(self, job: Job) -> None:
        if self._job_lock(job.id).locked():
            return  # being killed or started; the next round sees the outcome
        try:
            async with self._job_lock(job.id):
                await self._reconcile_locked(job)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("reconcile_failed", job=job.name, owner=job.owner)

    def _job_lock(self, job_id: str) -> asyncio.Lock:
        return self._job_locks.setdefault(job_id, asyncio.Lock())

    def _drop(self, job: Job) -> None:
        self._active.pop(job.id, None)
        self._waiting.pop(job.id, None)
        self._event_cursors.pop(job.id, None)
        self._job_locks.pop(job.id, None)
        self._backend.forget(job)

    async def _reconcile_locked(self, job: Job) -> None:
        current = self._active.get(job.id) or await self._store.get_job_by_id(job.id)
        if current is None or current.state in TERMINAL_STATES:
            self._drop(job)
            return
        observed = await self._backend.observe(current, self._event_cursors.get(job.id))
        for event in observed.events:
            await self._store.add_event(
                JobEvent(
                    job_id=job.id,
                    time=_parse_time(event.time) or utcnow(),
                    type=event.type.lower(),
                    reason=event.reason,
                    message=event.message,
                )
            )
        if observed.events:
            # Recorded, then remembered: a crash in between records them again, never loses them.
            backend = {**current.backend, "events_cursor": observed.cursor}
            current = await self._store.update_job(job.id, backend=backend) or current
            self._remember(current)
        self._event_cursors[job.id] = observed.cursor
        state = observed.state
        if state == current.state:
            if observed.reason and observed.reason != current.reason:
                updated = await self._store.update_job(job.id, reason=observed.reason)
                self._remember(updated)
            return
        skipped_running = state in TERMINAL_STATES and current.state != RUNNING and observed.started_at
        if state == RUNNING or skipped_running:
            started = _parse_time(observed.started_at) or utcnow()
            reason = observed.reason if state == RUNNING else "running"
            updated = await self._transition(current, RUNNING, reason, started_at=started)
            if updated is None:
                return
            current = updated
        if state in TERMINAL_STATES:
            finished = _parse_time(observed.finished_at) or utcnow()
            await self._transition(current, state, observed.reason, finished_at=finished)
            self._drop(job)

    def _remember(self, job: Job | None) -> None:
        if job is not None and job.id in self._active:
            if job.state in TERMINAL_STATES:
                self._drop(job)
            else:
                self._active[job.id] = job

    async def _transition(self, job: Job, state: str, reason: str, **fields: Any) -> Job | None:
        expected = ACTIVE_STATES if state in TERMINAL_STATES else {PENDING, BUILDING}
        updated = await self._store.transition_job(job.id, expected, state, reason=reason, **fields)
        if updated is None:
            latest = await self._store.get_job_by_id(job.id)
            self._remember(latest)
            return None
        title = {"RUNNING": "JobRunning"}.get(state, f"Job{state.capitalize()}")
        await self._state_event(updated, state, title, reason)
        self._remember(updated)
        log.info("job_state_changed", job=job.name, owner=job.owner, state=state, reason=reason)
        return updated

    async def _state_event(self, job: Job, state: str, reason: str, message: str) -> None:
        await self._store.add_event(
            JobEvent(job_id=job.id, time=utcnow(), type="state", reason=reason, message=message, state=state)
        )

    async def _event(self, job: Job, kind: str, reason: str, message: str) -> None:
        event = JobEvent(job_id=job.id, time=utcnow(), type=kind, reason=reason, message=message)
        await self._store.add_event(event)


def _started(job: Job) -> bool:
    """Whether the backend has the job (it may be waiting for resources still)."""
    return bool(job.backend) and not job.backend.get("waiting")


def _archived_requirements(archive: BinaryIO, kind: str) -> bytes | None:
    """requirements.txt at the top of a .tar.gz/.tar or .zip package, or None."""
    if kind == "zip":
        with zipfile.ZipFile(archive) as z:
            names = set(z.namelist())
            for name in (REQUIREMENTS, f"./{REQUIREMENTS}"):
                if name in names:
                    with z.open(name) as f:
                        return f.read(MAX_REQUIREMENTS + 1)
        return None
    with tarfile.open(fileobj=archive, mode="r:*") as tar:
        for member in tar:
            if member.name in (REQUIREMENTS, f"./{REQUIREMENTS}") and member.isfile():
                extracted = tar.extractfile(member)
                return None if extracted is None else extracted.read(MAX_REQUIREMENTS + 1)
    return None


@contextlib.asynccontextmanager
async def reconciling(manager: JobManager) -> AsyncIterator[None]:
    """Re-attach, then run the reconcile loop for the duration of the block."""
    await manager.resume()
    try:
        async with background("jobs-reconcile", manager.run()):
            yield
    finally:
        await manager.close()
