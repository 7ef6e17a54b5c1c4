"""What the backend knows of the cluster: one list-then-watch per kind, kept in memory.

Each `Informer` lists its kind in one namespace (or, for Namespaces, the cluster) over
the release's labels, then watches from the list's resourceVersion; a `Fleet` keeps one
per kind in each namespace the service owns, and `KindView` reads a kind across them. A
watch that ends (at its timeout) starts again from the last resourceVersion seen; one answered 410 Gone lists
again, so no transition is missed: the list is the truth, and the cache is replaced by
it. Failures back off from 0.2 s to `max_backoff_seconds` with full jitter, and `error`
says what is wrong meanwhile, for the job's reason. Anything else that goes wrong ends
`run`: the backend runs it under `common/tasks.restarting`, which logs the crash and
starts it again with backoff, and a start lists first, so the cache is never left stale
by a dead task. A 403 (the service may not list or watch the kind) is a failure like
the others, retried with the same backoff; `refused` says it is one, for words that send
the user to the operator. `observe`, `workers` and the log readers read the cache;
nothing polls the API server per job.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import structlog

from paddlecloud.common.kube import Forbidden, Gone, Kube, KubeError, Unavailable
from paddlecloud.common.tasks import backoff

from .names import LABEL_JOB_ID

log = structlog.get_logger("paddlecloud.jobs.kube")

Key = tuple[str, str]  # namespace, name


def _key(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def job_id_of(obj: dict[str, Any]) -> str | None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    value = labels.get(LABEL_JOB_ID)
    return value if isinstance(value, str) else None


class Informer:
    """The objects of one kind that carry `selector`, as the API server last said."""

    def __init__(
        self,
        kube: Kube,
        kind: str,
        namespace: str | None,
        selector: str,
        *,
        max_backoff: float,
        on_change: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.kind = kind
        self._kube = kube
        self._namespace = namespace
        self._selector = selector
        self._max_backoff = max_backoff
        self._on_change = on_change
        self._objects: dict[Key, dict[str, Any]] = {}
        self._by_job: dict[str, dict[Key, dict[str, Any]]] = defaultdict(dict)
        self.synced = asyncio.Event()
        self.error: str | None = None  # why the cache may be stale, while it may be
        # The error is the API server's 403: the service may not list or watch this kind
        # (an installation without the chart's rule for it); retrying mends nothing until
        # an operator grants the right.
        self.refused = False
        self.relists = 0  # lists after the first: a watch expired (410) or failed
        self.changed = asyncio.Condition()

    def of_job(self, job_id: str) -> list[dict[str, Any]]:
        return list(self._by_job.get(job_id, {}).values())

    def all(self) -> list[dict[str, Any]]:
        return list(self._objects.values())

    def _put(self, obj: dict[str, Any]) -> None:
        key = _key(obj)
        old = self._objects.get(key)
        if old is not None:
            self._unindex(key, old)
        self._objects[key] = obj
        job_id = job_id_of(obj)
        if job_id:
            self._by_job[job_id][key] = obj

    def _unindex(self, key: Key, obj: dict[str, Any]) -> None:
        job_id = job_id_of(obj)
        if job_id and job_id in self._by_job:
            self._by_job[job_id].pop(key, None)
            if not self._by_job[job_id]:
                del self._by_job[job_id]

    def _remove(self, obj: dict[str, Any]) -> None:
        key = _key(obj)
        old = self._objects.pop(key, None)
        if old is not None:
            self._unindex(key, old)

    async def _notify(self, kind: str, obj: dict[str, Any]) -> None:
        if self._on_change is not None:
            try:
                self._on_change(kind, obj)
            except Exception:
                log.exception("informer_callback_failed", kind=self.kind)
        async with self.changed:
            self.changed.notify_all()

    async def _list(self) -> str:
        answer = await self._kube.list(self.kind, self._namespace, selector=self._selector)
        fresh = {_key(o): o for o in answer.get("items") or []}
        for key in [k for k in self._objects if k not in fresh]:
            gone = self._objects[key]
            self._remove(gone)
            await self._notify("DELETED", gone)
        for obj in fresh.values():
            obj.setdefault("kind", self.kind)
            self._put(obj)
            await self._notify("MODIFIED", obj)
        return str((answer.get("metadata") or {}).get("resourceVersion") or "0")

    async def run(self) -> None:
        """List and watch until cancelled. The backend runs this under `restarting`: should
        it crash, it is logged and started again, and a start lists first."""
        failures = 0
        version: str | None = None
        while True:
            try:
                if version is None:
                    version = await self._list()
                    self.synced.set()
                async for event in self._kube.watch(
                    self.kind, self._namespace, selector=self._selector, resource_version=version
                ):
                    version = await self._apply(event, version)
                    failures = 0
                    self.error, self.refused = None, False
                failures = 0
                self.error, self.refused = None, False
            except Gone:
                log.info("watch_expired", kind=self.kind, resource_version=version)
                version = None
                self.relists += 1
            except KubeError as exc:
                failures += 1
                self.error, self.refused = str(exc), isinstance(exc, Forbidden)
                if not isinstance(exc, Unavailable):
                    version = None  # lost our place some other way than an outage: list again
                    self.relists += 1
                delay = backoff(failures, self._max_backoff)
                log.warning("watch_failed", kind=self.kind, error=str(exc), retry_in=round(delay, 2))
                await asyncio.sleep(delay)

    async def _apply(self, event: dict[str, Any], version: str) -> str:
        """One watch event into the cache; the resourceVersion to resume from after it."""
        obj = event.get("object") or {}
        kind = event.get("type")
        version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
        if kind == "BOOKMARK":
            return version
        obj.setdefault("kind", self.kind)
        if kind == "DELETED":
            self._remove(obj)
        else:
            self._put(obj)
        await self._notify(str(kind), obj)
        return version


class _Synced:
    """`synced` of a kind across namespaces: set once the namespaces are known and every
    namespace's informer of the kind has listed (asked again as namespaces come)."""

    def __init__(self, known: asyncio.Event, parts: Callable[[], list[asyncio.Event]]) -> None:
        self._known = known
        self._parts = parts

    def is_set(self) -> bool:
        return self._known.is_set() and all(part.is_set() for part in self._parts())

    async def wait(self) -> None:
        while not self.is_set():
            await self._known.wait()
            for part in self._parts():
                await part.wait()


class KindView:
    """One kind's objects over every namespace a `Fleet` watches, with an `Informer`'s
    interface (`of_job`, `all`, `synced`, `error`, `refused`), so the backend reads the
    cache alike whether it watches one namespace or many."""

    def __init__(self, fleet: Fleet, kind: str) -> None:
        self.kind = kind
        self._fleet = fleet
        self.synced = _Synced(fleet.known, lambda: [i.synced for i in self._parts()])

    def _parts(self) -> list[Informer]:
        return [kinds[self.kind] for kinds in list(self._fleet.informers.values())]

    def of_job(self, job_id: str) -> list[dict[str, Any]]:
        return [obj for part in self._parts() for obj in part.of_job(job_id)]

    def all(self) -> list[dict[str, Any]]:
        return [obj for part in self._parts() for obj in part.all()]

    @property
    def error(self) -> str | None:
        return next((part.error for part in self._parts() if part.error), None)

    @property
    def refused(self) -> bool:
        return any(part.error and part.refused for part in self._parts())


Start = Callable[[str, Callable[[], Any]], "asyncio.Task[None]"]


class Fleet:
    """Informers of `kinds` in each namespace of a changing set: the service may list and
    watch its objects only in the namespaces it owns (their RoleBinding grants it), never
    across the cluster. `add` starts a namespace's informers (each a task from `start`,
    which the backend supervises with `restarting`), `discard` stops them and drops their
    objects; `known` is set once the set of namespaces has been read (the Namespace
    informer's `synced`; a fixed set when not given)."""

    def __init__(
        self,
        kube: Kube,
        kinds: tuple[str, ...],
        selector: str,
        *,
        max_backoff: float,
        start: Start,
        on_change: dict[str, Callable[[str, dict[str, Any]], None]] | None = None,
        known: asyncio.Event | None = None,
    ) -> None:
        self._kube = kube
        self._kinds = kinds
        self._selector = selector
        self._max_backoff = max_backoff
        self._start = start
        self._on_change = on_change or {}
        self.informers: dict[str, dict[str, Informer]] = {}  # namespace → kind → informer
        self._tasks: dict[str, list[asyncio.Task[None]]] = {}
        if known is None:  # a fixed set: known from the start
            known = asyncio.Event()
            known.set()
        self.known = known
        self.views = {kind: KindView(self, kind) for kind in kinds}

    def add(self, namespace: str) -> None:
        if namespace in self.informers:
            return
        kinds = {
            kind: Informer(
                self._kube,
                kind,
                namespace,
                self._selector,
                max_backoff=self._max_backoff,
                on_change=self._on_change.get(kind),
            )
            for kind in self._kinds
        }
        self.informers[namespace] = kinds
        self._tasks[namespace] = [
            self._start(f"kube-watch-{kind}-{namespace}", informer.run) for kind, informer in kinds.items()
        ]
        log.info("namespace_watched", namespace=namespace)

    def discard(self, namespace: str) -> None:
        for task in self._tasks.pop(namespace, []):
            task.cancel()
        if self.informers.pop(namespace, None) is not None:
            log.info("namespace_unwatched", namespace=namespace)

    def close(self) -> list[asyncio.Task[None]]:
        """Cancel every namespace's informers; the tasks, to await."""
        tasks = [task for tasks in self._tasks.values() for task in tasks]
        for task in tasks:
            task.cancel()
        self._tasks.clear()
        self.informers.clear()
        return tasks
