"""The builder's core: requests, the cache, one build per key at a time, and the size cap.

Every request becomes a build record of its owner's (a user sees only their own), while
the work is shared by cache key (which holds the owner where the backend's results are
per user, `BuildBackend.per_user`: then nothing below is shared between users):

- a key with a published result is a hit: the caller's own newest successful build is
  answered again, or a record is made that is `SUCCEEDED` at once, and nothing runs;
- a key being built already gets no second build: the same owner is given the build
  under way (same id), another owner a record of their own that follows it (same log,
  same end);
- otherwise a build record starts `PENDING`, becomes `RUNNING` once one of
  `builder.max_concurrent_builds` slots is free, and ends `SUCCEEDED` or `FAILED`
  together with every record that followed it. A failed build publishes nothing, so
  the next identical request builds again.

One lock per key orders these decisions against a build's end and against collection,
so a request sees either the build under way or its published result, never neither.
A restarted service fails the builds the store still calls active ("builder
restarted") before it answers anything. One service replica is assumed, like the jobs
service's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from uuid import uuid4

import structlog
from prometheus_client import CollectorRegistry

from paddlecloud.common import errors
from paddlecloud.common.config import Config
from paddlecloud.common.dockerconfig import Credentials
from paddlecloud.common.internal_auth import Identity
from paddlecloud.common.store import Build, Store
from paddlecloud.common.store.models import ACTIVE_STATES, FAILED, PENDING, RUNNING, SUCCEEDED, utcnow
from paddlecloud.common.tasks import Spawned
from paddlecloud.common.volume import resolve_for

from .backend import (
    BackendUnavailable,
    BaseRefused,
    BuildBackend,
    BuildRequest,
    LogLine,
    LogQuery,
    Outcome,
    Published,
    RegistryLogin,
)
from .errors import BackendFailed, BuildNotFound, RequestRefused
from .figures import BuildFigures
from .spec import BuildSpec, cache_key, check_requirements

log = structlog.get_logger(__name__)

BUILD_ACTIVE = frozenset({PENDING, RUNNING})
BUILD_FINAL = frozenset({SUCCEEDED, FAILED})
RESTARTED = "builder restarted: the builder service stopped during this build; request it again"
STOPPED = "the builder service stopped during this build; request it again"
EVICTED = "its environment was removed to keep the cache under its size cap; request the build again"


def iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _KeyLocks:
    """One asyncio lock per cache key, forgotten once nobody holds or awaits it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    @contextlib.asynccontextmanager
    async def __call__(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._locks[key]


@dataclass(frozen=True)
class Planned:
    """A dry run's answer: the request's cache key, and whether it is built."""

    key: str
    cached: bool


@dataclass(frozen=True)
class Answer:
    """A request's build record: made for it (`created`) or an existing one; `cached`
    says the result was built before (None: as the record itself says)."""

    build: Build
    created: bool
    cached: bool | None = None


class Builder:
    def __init__(
        self, config: Config, store: Store, backend: BuildBackend, figures: BuildFigures | None = None
    ) -> None:
        self._figures = figures or BuildFigures(CollectorRegistry())
        self._section = config.builder
        self._datacenter = config.pfs.datacenter
        self._store = store
        self._backend = backend
        self._slots = asyncio.Semaphore(self._section.max_concurrent_builds)
        self._locked = _KeyLocks()
        self._runners: dict[str, asyncio.Task[None]] = {}
        self._running = Spawned()
        self._collect_lock = asyncio.Lock()

    @property
    def backend(self) -> BuildBackend:
        return self._backend

    # -- life ------------------------------------------------------------------------

    async def start(self) -> None:
        """Fail what a previous process left unfinished, clean up after it, apply the cap."""
        interrupted = await self._store.list_builds(BUILD_ACTIVE)
        for build in interrupted:
            await self._store.transition_build(
                build.id, BUILD_ACTIVE, FAILED, reason=RESTARTED, finished_at=utcnow()
            )
        logs = {str(build.info.get("log", build.id)) for build in interrupted}
        await self._backend.recover(sorted(logs))
        if interrupted:
            log.warning("builds_interrupted_by_restart", count=len(interrupted))
        await self.collect()

    async def stop(self) -> None:
        """Stop every build under way; each records FAILED with the reason."""
        await self._running.cancel()

    # -- requests --------------------------------------------------------------------

    async def plan(self, identity: Identity, spec: BuildSpec) -> Planned:
        """What a request would do: its cache key, and whether that is built already."""
        key, _, _ = await self._key_and_package(identity, spec)
        return Planned(key, await self._lookup(key, identity.user, touch=False) is not None)

    async def _key_and_package(
        self, identity: Identity, spec: BuildSpec
    ) -> tuple[str, str | None, BuildRequest]:
        """The request's key, its package's PFS path, and the build it would run (its id
        and key still to be filled in)."""
        check_requirements(spec.requirements, self._section.max_requirements_bytes)
        login = await self._registry(identity, spec.registry)
        try:
            base = await self._backend.base_identity(spec.base, login)
        except BaseRefused as exc:
            raise RequestRefused(str(exc), field="base") from None
        except BackendUnavailable as exc:
            raise BackendFailed(str(exc)) from None
        package = self._package(identity, spec.package)
        owner = identity.user if self._backend.per_user else None
        key = cache_key(base, spec.requirements, self._backend.version, owner)
        request = BuildRequest(
            build_id="",
            key=key,
            owner=identity.user,
            requirements=spec.requirements,
            base=spec.base,
            package=package,
            base_ref=base,
            registry=login,
        )
        return key, package, request

    async def _registry(self, identity: Identity, name: str | None) -> RegistryLogin | None:
        if name is None:
            return None
        saved = await self._store.get_registry(identity.user, name)
        if saved is None:
            raise RequestRefused(
                f"no registry named {name!r} is saved for {identity.user} (`paddlecloud registry`)",
                field="registry",
            )
        return RegistryLogin(saved.server, Credentials(saved.username, saved.password))

    async def _lookup(self, key: str, owner: str, *, touch: bool) -> Published | None:
        try:
            return await self._backend.lookup(key, touch=touch, owner=owner)
        except BackendUnavailable as exc:
            raise BackendFailed(str(exc)) from None

    async def request(self, identity: Identity, spec: BuildSpec) -> Answer:
        """Answer a build request with a build record of the caller's: a new one
        (`created`), or an existing one (the identical build under way, or a cached result)."""
        key, package, planned = await self._key_and_package(identity, spec)
        owner = identity.user
        record = {
            "requirements": spec.requirements,
            "base": spec.base,
            "package": package,
            "registry": spec.registry,
        }
        async with self._locked(key):
            active = await self._store.find_builds(key, BUILD_ACTIVE)
            if active:
                self._figures.hits.inc()  # nothing is built for this request
                own = next((b for b in active if b.owner == owner), None)
                if own is not None:
                    return Answer(own, created=False)
                leader = active[-1]  # the oldest: the one that is running
                follower = self._new(
                    key,
                    owner,
                    record,
                    state=leader.state,
                    reason="an identical build is under way; this one follows it",
                    info={"log": leader.info.get("log", leader.id), "cached": False},
                )
                await self._store.create_build(follower)
                log.info("build_joined", build=follower.id, key=key, log_of=follower.info["log"])
                return Answer(follower, created=True)
            published = await self._lookup(key, owner, touch=True)
            if published is not None:
                self._figures.hits.inc()
                own_builds = await self._store.find_builds(key, {SUCCEEDED})
                mine = next((b for b in own_builds if b.owner == owner and not b.info.get("evicted")), None)
                # A registry does not say which build pushed an image: the log of a hit
                # is that of the newest build of the key this service remembers.
                made_by = published.build_id or next(
                    (str(b.info.get("log", b.id)) for b in own_builds if not b.info.get("cached")), ""
                )
                if mine is not None:
                    log.info("build_cache_hit", build=mine.id, key=key)
                    return Answer(mine, created=False, cached=True)
                hit_id = uuid4().hex
                # Its log is that of the build that made the environment: how it was made.
                hit = self._new(
                    key,
                    owner,
                    record,
                    state=SUCCEEDED,
                    reason="cached: an identical environment was built before; nothing was run",
                    info={
                        "log": made_by or hit_id,
                        "cached": True,
                        "artifact": published.artifact,
                    },
                    build_id=hit_id,
                    finished=True,
                )
                await self._store.create_build(hit)
                log.info("build_cache_hit", build=hit.id, key=key)
                return Answer(hit, created=True)
            build_id = uuid4().hex
            build = self._new(
                key,
                owner,
                record,
                state=PENDING,
                reason="waiting for a build slot",
                info={"log": build_id, "cached": False},
                build_id=build_id,
            )
            await self._store.create_build(build)
            self._figures.misses.inc()
            self._start_runner(replace(planned, build_id=build.id))
        log.info("build_requested", build=build.id, key=key)
        return Answer(build, created=True)

    @staticmethod
    def _new(
        key: str,
        owner: str,
        spec: dict[str, Any],
        *,
        state: str,
        reason: str,
        info: dict[str, Any],
        finished: bool = False,
        build_id: str | None = None,
    ) -> Build:
        now = utcnow()
        return Build(
            id=build_id or uuid4().hex,
            key=key,
            owner=owner,
            state=state,
            spec=spec,
            created_at=now,
            updated_at=now,
            finished_at=now if finished else None,
            reason=reason,
            info=info,
        )

    def _package(self, identity: Identity, text: str | None) -> str | None:
        """The package's PFS path, made absolute and checked to be the caller's to read."""
        if text is None:
            return None
        try:
            return resolve_for(identity, text, self._datacenter, write=False).text
        except errors.ProblemError as exc:
            raise RequestRefused(exc.detail, field="package") from None

    # -- reading ---------------------------------------------------------------------

    async def get(self, owner: str, build_id: str) -> Build:
        build = await self._store.get_build(build_id) if len(build_id) <= 64 else None
        if build is None or build.owner != owner:
            raise BuildNotFound(f"no build with id {build_id[:64]!r}")
        return build

    async def view(self, build: Build, *, cached: bool | None = None) -> dict[str, Any]:
        """A build as the API shows it; `cached` overrides the record's own flag (a hit
        answered with an earlier build). The artifact (`python`) is shown while the
        result is published, and null once the size cap collected it."""
        artifact = build.info.get("artifact") or {}
        available = build.state == SUCCEEDED and (
            not self._backend.evicts or await self._lookup(build.key, build.owner, touch=False) is not None
        )
        view: dict[str, Any] = {
            "id": build.id,
            "key": build.key,
            "state": build.state,
            "reason": build.reason,
            "created_at": iso(build.created_at),
            "finished_at": iso(build.finished_at),
            "cached": bool(build.info.get("cached")) if cached is None else cached,
            # Failed only because the builder stopped: the same request again will build it.
            "interrupted": build.state == FAILED and build.reason in (RESTARTED, STOPPED),
        }
        for name in self._backend.artifact_fields:
            view[name] = artifact.get(name) if available else None
        return view

    def logs(self, build: Build, query: LogQuery) -> AsyncGenerator[list[LogLine], None]:
        async def finished() -> bool:
            current = await self._store.get_build(build.id)
            return current is None or current.state in BUILD_FINAL

        return self._backend.logs(str(build.info.get("log", build.id)), query, finished)

    # -- running ---------------------------------------------------------------------

    def _start_runner(self, request: BuildRequest) -> None:
        task = self._running.spawn(f"build-{request.build_id}", self._run(request))
        # Which keys are being built, for collection; a runner's crash is logged by Spawned.
        self._runners[request.key] = task
        task.add_done_callback(lambda t: self._forget_runner(request.key, t))

    def _forget_runner(self, key: str, task: asyncio.Task[None]) -> None:
        if self._runners.get(key) is task:
            del self._runners[key]

    async def _run(self, request: BuildRequest) -> None:
        key = request.key
        try:
            async with self._slots:
                async with self._locked(key):
                    for build in await self._store.find_builds(key, {PENDING}):
                        await self._store.transition_build(
                            build.id, {PENDING}, RUNNING, reason="installing the requirements"
                        )
                log.info("build_started", build=request.build_id, key=key)
                try:
                    outcome = await self._backend.build(request)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.exception("build_crashed", build=request.build_id, key=key)
                    outcome = Outcome(
                        False,
                        f"the builder failed ({type(exc).__name__}); quote build {request.build_id} "
                        "to the operator",
                    )
            if outcome.succeeded:
                # Before the build is reported done: whoever sees it SUCCEEDED also sees
                # a cache within its cap.
                try:
                    await self.collect(keep=key)
                except Exception:
                    log.exception("cache_collection_failed", key=key)
        except asyncio.CancelledError:
            await self._finish(request, Outcome(False, STOPPED))
            raise
        await self._finish(request, outcome)

    async def _finish(self, request: BuildRequest, outcome: Outcome) -> None:
        """Give every record of the key the build's end, at once."""
        state = SUCCEEDED if outcome.succeeded else FAILED
        async with self._locked(request.key):
            now = utcnow()
            for build in await self._store.find_builds(request.key, BUILD_ACTIVE):
                info = {**build.info, "artifact": outcome.artifact} if outcome.succeeded else build.info
                await self._store.transition_build(
                    build.id, BUILD_ACTIVE, state, reason=outcome.reason, finished_at=now, info=info
                )
        self._figures.finished.labels(state).inc()
        log.info(
            "build_finished", build=request.build_id, key=request.key, state=state, reason=outcome.reason
        )

    # -- the size cap ----------------------------------------------------------------

    async def collect(self, keep: str | None = None) -> list[str]:
        """Remove least recently used results until the cache fits `builder.cache_max_bytes`,
        sparing those an active job uses, those used in the last `min_idle_seconds` and
        `keep`. The keys removed."""
        async with self._collect_lock:
            entries = await self._backend.entries()
            total = sum(e.size for e in entries)
            cap = self._section.cache_max_bytes
            if total <= cap:
                return []
            spared = await self._keys_in_use()
            if keep is not None:
                spared.add(keep)
            cutoff = time.time() - self._section.min_idle_seconds
            removed = []
            for entry in sorted(entries, key=lambda e: e.last_used):
                if total <= cap:
                    break
                if entry.key in spared or entry.last_used > cutoff:
                    continue
                async with self._locked(entry.key):
                    if not await self._backend.evict(entry.key, unless_used_after=entry.last_used):
                        continue
                    await self._mark_evicted(entry.key)
                total -= entry.size
                removed.append(entry.key)
                log.info(
                    "environment_collected",
                    key=entry.key,
                    size=entry.size,
                    idle_seconds=round(time.time() - entry.last_used),
                )
            if total > cap:
                log.warning(
                    "build_cache_over_cap", total=total, cap=cap, detail="what is left is in use or recent"
                )
            return removed

    async def _keys_in_use(self) -> set[str]:
        """Keys of builds that active jobs point at, and keys being built."""
        build_ids: set[str] = set()
        cursor = None
        while True:
            page, cursor = await self._store.list_jobs(None, states=ACTIVE_STATES, limit=500, cursor=cursor)
            build_ids.update(job.build_id for job in page if job.build_id)
            if cursor is None:
                break
        keys = set(self._runners)
        for build_id in build_ids:
            build = await self._store.get_build(build_id)
            if build is not None:
                keys.add(build.key)
        return keys

    async def _mark_evicted(self, key: str) -> None:
        for build in await self._store.find_builds(key, {SUCCEEDED}):
            if not build.info.get("evicted"):
                info = {**build.info, "evicted": True}
                await self._store.transition_build(
                    build.id, {SUCCEEDED}, SUCCEEDED, reason=EVICTED, info=info
                )
