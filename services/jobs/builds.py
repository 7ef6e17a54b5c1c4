"""A job's environment: asking the builder for it, waiting for it, and reading its build's log.

A job whose package has a requirements.txt (and names no ready image) is BUILDING until
the builder has its environment, then started in it. The build is asked for before the
job is recorded (a refusal refuses the submit); the wait happens in the background, and a
restarted service waits again. Starting the built job is the reconcile loop's (`start`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import replace
from typing import Any

from paddlecloud.common import errors
from paddlecloud.common.clients import BuilderClient, BuilderError, BuilderUnavailable
from paddlecloud.common.config import Config
from paddlecloud.common.errors import BadCursor, Invalid
from paddlecloud.common.internal_auth import Identity
from paddlecloud.common.store.models import BUILDING, FAILED, utcnow
from paddlecloud.common.tasks import Spawned

from .backend import Backend, Launch, LogLine, LogQuery, Runtime
from .errors import BuildRefused, BuildUnavailable
from .packages import REQUIREMENTS, Packages
from .records import JobRecord, JobRecords
from .spec import JobSpec

BUILD = "build"  # the pseudo-worker whose lines are the job's environment build
# How often one job asks for its build when the builder keeps stopping under it.
MAX_BUILD_REQUESTS = 3

# Starts a job that is PENDING or BUILDING (the reconcile loop's), answering the job as it is then.
Starter = Callable[[Launch], Awaitable[JobRecord]]


def build_refusal(exc: BuilderError) -> errors.DomainError:
    """A submit's refusal for what the builder answered: it refused the requirements (422
    naming the package), or it cannot answer now (503: try again)."""
    if isinstance(exc, BuilderUnavailable) or exc.status >= 500:
        return BuildUnavailable(f"the job's environment cannot be built now: {exc.detail}; try again")
    return BuildRefused(f"{REQUIREMENTS}: {exc.detail}", field="package")


class Builds:
    """Builds of jobs' environments, asked for and waited on; `start` runs a job once built."""

    def __init__(
        self,
        config: Config,
        builder: BuilderClient,
        backend: Backend,
        records: JobRecords,
        packages: Packages,
        start: Starter,
    ) -> None:
        self._config = config
        self._builder = builder
        self._backend = backend
        self._records = records
        self._packages = packages
        self._start = start
        self._watchers = Spawned()

    async def planned(
        self, identity: Identity, spec: JobSpec, requirements: str, package: str
    ) -> dict[str, Any]:
        """What a dry run says of the build: its cache key and whether it is cached."""
        try:
            answer = await self._builder.request_build(
                identity, requirements=requirements, dry_run=True, **self._target(spec, package)
            )
        except BuilderError as exc:
            raise build_refusal(exc) from None
        return {"key": answer.get("key"), "cached": bool(answer.get("cached"))}

    async def request(
        self, identity: Identity, spec: JobSpec, requirements: str, package: str
    ) -> dict[str, Any]:
        """Ask the builder for the environment of a job about to be recorded; a refusal
        (or no answer) refuses the submit."""
        try:
            return await self._builder.request_build(
                identity, requirements=requirements, **self._target(spec, package)
            )
        except BuilderError as exc:
            raise build_refusal(exc) from None

    def _target(self, spec: JobSpec, package: str) -> dict[str, Any]:
        """What a build for `spec` is asked to start from: the backend's base image, read
        with the job's registry credentials (a private base), or the builder's default."""
        base = self._backend.build_base(spec)
        return {"base": base, "package": package, "registry": spec.registry if base else None}

    async def build_then_start(
        self, identity: Identity, launch: Launch, requirements: str, build: dict[str, Any] | None = None
    ) -> JobRecord:
        """BUILDING until the builder has the job's environment, then start it in that.
        `build` is the one a submit asked for before recording the job; without it (a job
        recorded before a restart) it is asked for here, and a refusal fails the job."""
        job = launch.job
        building = await self._records.transition(
            job, BUILDING, f"building the environment for {REQUIREMENTS}"
        )
        if building is None:
            return await self._records.refresh(job) or job
        if build is None:
            try:
                build = await self._builder.request_build(
                    identity, requirements=requirements, **self._target(launch.spec, launch.package.text)
                )
            except BuilderError as exc:
                failed = await self._records.transition(
                    building, FAILED, f"cannot build the environment: {exc.detail}", finished_at=utcnow()
                )
                return failed or building
        job = await self._records.update(job, build_id=str(build["id"])) or building
        how = "a cached environment" if build.get("cached") else "a new build"
        await self._records.event(
            job, "notice", "BuildRequested", f"build {build['id']} ({how}, key {build.get('key')})"
        )
        self.watch(replace(launch, job=job), str(build["id"]))
        return job

    def watch(self, launch: Launch, build_id: str) -> None:
        """Wait for the build in the background, then start the job (or fail it)."""
        self._watchers.spawn(f"build-of-{launch.job.id}", self._await_build(launch, build_id))

    def spawn(self, name: str, work: Awaitable[Any]) -> None:
        """Run `work` (a job's build, asked for after a restart) with the watchers."""
        self._watchers.spawn(name, work)

    async def close(self) -> None:
        """Stop waiting for builds (they go on; a restarted service waits again)."""
        await self._watchers.cancel()

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
            current = await self._records.refresh(job)
            if current is None or current.state != BUILDING:
                return  # killed or removed while it built
            await asyncio.sleep(self._config.jobs.poll_seconds * 5)
        if state == "FAILED":
            why = build.get("reason") or "no reason given"
            await self._failed(job, f"the environment build failed: {why}")
            return
        await self._start(replace(launch, runtime=Runtime.from_dict(build)))

    async def _failed(self, job: JobRecord, reason: str) -> None:
        """The job's build failed: so does the job, unless it stopped waiting for it (killed)."""
        current = await self._records.refresh(job)
        if current is not None and current.state == BUILDING:
            await self._records.event(current, "warning", "BuildFailed", reason)
            await self._records.transition(current, FAILED, reason, finished_at=utcnow())

    async def _request_again(self, launch: Launch, old_build: str) -> str | None:
        """Request the build of a BUILDING job again; its new id, or None when the job
        no longer waits for one (killed) or the request failed (the job FAILED)."""
        current = await self._records.refresh(launch.job)
        if current is None or current.state != BUILDING:
            return None
        owner = Identity(current.owner)
        try:
            requirements = await self._packages.requirements(launch.package, launch.package_kind)
            if requirements is None:
                raise Invalid(f"its {REQUIREMENTS} is gone", field="package")
            build = await self._builder.request_build(
                owner, requirements=requirements, **self._target(launch.spec, launch.package.text)
            )
        except (BuilderError, errors.DomainError, OSError) as exc:
            detail = exc.detail if isinstance(exc, BuilderError) else str(exc)
            reason = f"cannot build the environment again: {detail}"
            await self._records.transition(current, FAILED, reason, finished_at=utcnow())
            return None
        new_id = str(build["id"])
        current = await self._records.update(current, build_id=new_id) or current
        await self._records.event(
            current,
            "notice",
            "BuildRequestedAgain",
            f"build {old_build} stopped with the builder; requested again as build {new_id}",
        )
        return new_id

    async def log_lines(
        self, job: JobRecord, query: LogQuery, cursor: str | None
    ) -> AsyncGenerator[list[LogLine], None]:
        """The build's log as the pseudo-worker `build`, cursors `b.<builder's cursor>`
        (`cursor` one of those, or None for the start)."""
        assert job.build_id is not None
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
