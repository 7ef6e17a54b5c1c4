"""The kubernetes jobs backend: the five calls of backend.py on a cluster.

- `start` makes the user's namespace ready (tenancy: quota, limits, network policy),
  then creates the job's owner ConfigMap and the objects it owns (manifests.py).
  Creating is idempotent: a 409 reads the object back and adopts it when it carries
  this job's id, so a retry or a restart converges.
- `observe`, `workers` and `logs` read the watch cache (cache.py); nothing polls the
  API server per job. While the API server is unreachable the job keeps its state
  with a reason that says so: an outage never fails a job.
- A job ends when its trainers' Indexed Job says Complete or Failed (or its workers
  were evicted too often, or a parameter server failed past its restarts). Then the
  backend keeps every container's log in the store and deletes the owner, which
  removes the parameter servers and everything else. `stop` does the same with the
  grace period; `remove` also drops the kept logs.
- Logs: a container's log is kept whole in the store when it terminates (and, for a
  restarted parameter server, its previous attempt's), so a finished job's logs and an
  earlier attempt's stay readable after the pods go. A reader merges the kept attempts
  with the live ones; its cursor names the attempt and the line, so a follower resumes
  across the switch from live to kept.

docs/kubernetes.md describes the objects and the states in words.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import hashlib
import json
import time
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import structlog

from paddlecloud.common.config import Config
from paddlecloud.common.errors import BadCursor
from paddlecloud.common.kube import Kube, KubeError
from paddlecloud.common.quantity import parse_bytes, parse_cpu_milli
from paddlecloud.common.store import Job, KeptLog, Quota, Store
from paddlecloud.common.store.models import FAILED, PENDING, RUNNING, SUCCEEDED, TERMINAL_STATES

from ..backend import (
    Backend,
    Launch,
    LogLine,
    LogQuery,
    NotYet,
    Observation,
    ObservedEvent,
    StartFailed,
    WorkerInfo,
    planned_workers,
)
from ..exits import WORKER_STOPPED, describe_exit
from ..records import JobRecord
from ..spec import JobSpec
from . import manifests
from .cache import Informer, backoff
from .names import (
    ANNOTATION_USER,
    COMPLETION_INDEX,
    INDEX_FAILURES,
    LABEL_JOB_ID,
    LABEL_ROLE,
    POD_INDEX,
    QUOTA_NAME,
    managed_selector,
    namespace_for,
    owner_name,
    pserver_name,
)

log = structlog.get_logger("paddlecloud.jobs.kube")

KINDS = ("ConfigMap", "StatefulSet", "Job", "Pod")
# How often a stuck PENDING job's Kubernetes events are read for a refusal (quota).
EVENT_CHECK_SECONDS = 5.0
LOG_POLL_SECONDS = 0.5
PULL_FAILURE = "cannot pull image"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def _status(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("status") or {}


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in _status(obj).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


@dataclass(frozen=True)
class Attempt:
    """One run of one container: a pod of an Indexed Job, or a restart in place of a
    parameter server's container. `key` sorts a worker's attempts in the order they ran."""

    worker: str
    role: str
    index: int
    key: str
    pod: str
    namespace: str
    container: str
    restart: int
    previous: bool  # its log is the container's previous one (it was restarted since)
    running: bool
    terminated: dict[str, Any] | None
    started_at: str | None = None


def _worker_of(pod: dict[str, Any]) -> tuple[str, str, int] | None:
    meta = _meta(pod)
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    role = str(labels.get(LABEL_ROLE) or "").upper()
    raw = annotations.get(COMPLETION_INDEX) or labels.get(COMPLETION_INDEX) or labels.get(POD_INDEX)
    if raw is None and role == "PSERVER":
        raw = str(meta.get("name", "")).rsplit("-", 1)[-1]
    if role not in ("PSERVER", "TRAINER") or raw is None or not str(raw).isdigit():
        return None
    return f"{role.lower()}-{int(raw)}", role, int(raw)


def _main_status(pod: dict[str, Any]) -> dict[str, Any] | None:
    statuses = _status(pod).get("containerStatuses") or []
    return statuses[0] if statuses else None


def attempts_of(pods: Iterable[dict[str, Any]]) -> dict[str, list[Attempt]]:
    """Every container attempt the pods show, by worker, oldest first."""
    result: dict[str, list[Attempt]] = {}
    for pod in pods:
        for attempt in _pod_attempts(pod):
            result.setdefault(attempt.worker, []).append(attempt)
    for items in result.values():
        items.sort(key=lambda a: a.key)
    return result


def _pod_attempts(pod: dict[str, Any]) -> list[Attempt]:
    """The attempts of one pod's main container: its current one, and the one before
    when it was restarted in place (the kubelet keeps the previous log only)."""
    who = _worker_of(pod)
    cs = _main_status(pod)
    if who is None or cs is None:
        return []
    worker, role, index = who
    meta = _meta(pod)
    # An Indexed Job's retries of one index are ordered by the failures before them
    # (creationTimestamp has whole seconds only); a StatefulSet pod by when it was made.
    failures = (meta.get("annotations") or {}).get(INDEX_FAILURES, "0")
    failures = int(failures) if str(failures).isdigit() else 0
    base = f"{failures:05d}|{meta.get('creationTimestamp', '')}|{meta.get('name', '')}"

    def attempt(restart: int, previous: bool, now: dict[str, Any]) -> Attempt:
        ran = now.get("running") or now.get("terminated") or {}
        return Attempt(
            worker=worker,
            role=role,
            index=index,
            key=f"{base}|{restart:05d}",
            pod=str(meta.get("name")),
            namespace=str(meta.get("namespace")),
            container=str(cs.get("name")),
            restart=restart,
            previous=previous,
            running=bool(now.get("running")),
            terminated=now.get("terminated"),
            started_at=ran.get("startedAt"),
        )

    restarts = int(cs.get("restartCount") or 0)
    state, last = cs.get("state") or {}, cs.get("lastState") or {}
    found = []
    if restarts and last.get("terminated"):
        found.append(attempt(restarts - 1, True, last))
    if state.get("running") or state.get("terminated"):
        found.append(attempt(restarts, False, state))
    return found


def _exit_words(terminated: dict[str, Any], memory: str) -> str:
    code = int(terminated.get("exitCode") or 0)
    if terminated.get("reason") == "OOMKilled":
        return describe_exit(code, f"OOMKilled: it used more than its {memory} of memory — raise -memory")
    return describe_exit(code)


def _pending_reason(pods: list[dict[str, Any]]) -> tuple[str, dict[str, Any]] | None:
    """Why pods wait, in the scheduler's and the kubelet's words, and the pod that waits."""
    for pod in sorted(pods, key=lambda p: str(_meta(p).get("name"))):
        name = str(_meta(pod).get("name"))
        for cond in _status(pod).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                return f"cannot be scheduled: {cond.get('message') or cond.get('reason')} (pod {name})", pod
        for cs in (_status(pod).get("initContainerStatuses") or []) + (
            _status(pod).get("containerStatuses") or []
        ):
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in ("ImagePullBackOff", "ErrImagePull", "InvalidImageName"):
                why = waiting.get("message") or waiting.get("reason")
                return f"{PULL_FAILURE} {cs.get('image')}: {why}", pod
    return None


def _age_seconds(obj: dict[str, Any]) -> float:
    created = str(_meta(obj).get("creationTimestamp") or "")
    try:
        return (datetime.now(UTC) - datetime.fromisoformat(created.replace("Z", "+00:00"))).total_seconds()
    except ValueError:
        return 0.0


class KubernetesBackend(Backend):
    name = "kubernetes"
    # A job recorded but not created (the service stopped in between) is created then:
    # creating is idempotent, so a half-made one is completed, not made twice.
    resumes_unstarted = True

    def __init__(self, config: Config, store: Store) -> None:
        self._config = config
        self._settings = config.jobs.kubernetes
        self._store = store
        self._kube: Kube | None = None
        self._informers: dict[str, Informer] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._tenancy: dict[str, Quota | None] = {}  # namespace → the quota it was given
        self._users: dict[str, str] = {}  # namespace → user, for the quota sync
        self._kept: dict[str, dict[tuple[str, str], bool]] = {}  # job id → (worker, attempt) → whole
        self._finishing: dict[str, asyncio.Task[None]] = {}
        self._refusals: dict[str, tuple[float, str | None]] = {}  # job id → (checked, quota event)
        self._background: set[asyncio.Task[None]] = set()
        self._keeping: set[tuple[str, str, str]] = set()  # (job id, worker, attempt) being kept
        self._stopped: set[str] = set()  # killed: the service records KILLED, not what is left

    # -- life --------------------------------------------------------------------------

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            raise RuntimeError("the kubernetes backend is not open")
        return self._kube

    def _shared(self) -> bool:
        return self._settings.namespace_mode == "shared"

    async def open(self) -> None:
        self._kube = await Kube.connect(self._settings)
        scope = self._settings.namespace if self._shared() else None
        for kind in KINDS:
            informer = Informer(
                self._kube,
                kind,
                scope,
                managed_selector(),
                max_backoff=self._settings.max_backoff_seconds,
                on_change=self._changed if kind == "Pod" else None,
            )
            self._informers[kind] = informer
            self._tasks.append(asyncio.create_task(informer.run(), name=f"kube-watch-{kind}"))
        self._tasks.append(asyncio.create_task(self._sync_quotas(), name="kube-quota-sync"))
        try:
            await asyncio.wait_for(self._synced(), self._settings.request_timeout_seconds)
        except TimeoutError:
            log.warning("kubernetes_not_synced", host=self._kube.host, error=self._api_error())
        log.info("kubernetes_backend_open", host=self._kube.host, mode=self._settings.namespace_mode)

    async def _synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self._informers.values()))

    async def close(self) -> None:
        for task in [*self._tasks, *self._background, *self._finishing.values()]:
            task.cancel()
        await asyncio.gather(
            *self._tasks, *self._background, *self._finishing.values(), return_exceptions=True
        )
        self._tasks.clear()
        if self._kube is not None:
            await self._kube.close()
            self._kube = None

    def _is_synced(self) -> bool:
        return bool(self._informers) and all(i.synced.is_set() for i in self._informers.values())

    def _api_error(self) -> str | None:
        return next((i.error for i in self._informers.values() if i.error), None)

    def capacity(self) -> dict[str, Any]:
        return {"backend": self.name, "namespace_mode": self._settings.namespace_mode}

    def refusal(self, spec: JobSpec) -> tuple[str, str] | None:
        """A worker larger than a namespace's LimitRange admits would never get a pod."""
        cpu = parse_cpu_milli(self._settings.max_container_cpu)
        memory = parse_bytes(self._settings.max_container_memory)
        for role, prefix, asked_cpu, asked_memory in (
            ("trainer", "", spec.cpu_milli, spec.memory_bytes),
            ("parameter server", "ps", spec.pscpu_milli, spec.psmemory_bytes),
        ):
            if asked_cpu > cpu:
                return (
                    f"{prefix}cpu",
                    f"a {role} asks for {asked_cpu / 1000:g} cpu; a pod here may have {cpu / 1000:g} at most",
                )
            if asked_memory > memory:
                return (
                    f"{prefix}memory",
                    f"a {role} asks for {asked_memory} bytes of memory; a pod here may have "
                    f"{self._settings.max_container_memory} at most",
                )
        return None

    # -- start -------------------------------------------------------------------------

    def attach(self, job: JobRecord) -> None:
        """After a restart: this user's quota is kept in step again from now on."""
        self._users.setdefault(self.namespace(job.owner), job.owner)

    def namespace(self, user: str) -> str:
        return (
            self._settings.namespace
            if self._shared()
            else namespace_for(user, self._settings.namespace_prefix)
        )

    async def _plan(self, launch: Launch, owner_uid: str | None = None) -> manifests.JobPlan:
        registry = None
        if launch.spec.registry:
            registry = await self._store.get_registry(launch.job.owner, launch.spec.registry)
            if registry is None:
                raise StartFailed(
                    f"no registry named {launch.spec.registry!r}; `paddlecloud get registry` lists yours"
                )
        plan = manifests.JobPlan(
            launch=launch,
            settings=self._settings,
            namespace=self.namespace(launch.job.owner),
            image=manifests.image_for(launch, self._settings),
            registry=registry,
        )
        plan = replace(plan, owner_uid=owner_uid) if owner_uid else plan
        try:
            manifests.owner_object(plan)  # checks paths, volumes and the registry
        except ValueError as exc:
            raise StartFailed(str(exc)) from exc
        return plan

    def build_base(self, spec: JobSpec) -> str | None:
        # What image_for gives a job without a built image: the runtime image adds to it.
        if spec.gpu > 0 and self._settings.gpu_image:
            return self._settings.gpu_image
        return self._settings.default_image

    async def preview(self, launch: Launch) -> list[dict[str, Any]]:
        """Every object `start` would create, as `kubectl --dry-run -o yaml` shows them."""
        user = await self._store.get_user(launch.job.owner)
        quota = user.quota if user is not None else Quota()
        objects = manifests.all_objects(await self._plan(launch))
        return manifests.redacted(
            [*manifests.tenancy_objects(launch.job.owner, quota, self._settings), *objects]
        )

    async def start(self, launch: Launch) -> dict[str, Any]:
        plan = await self._plan(launch)
        try:
            await self._ensure_tenancy(launch.job.owner)
            owner = await self._create_owned(manifests.owner_object(plan), launch.job.id)
            uid = str(_meta(owner)["uid"])
            for manifest in manifests.job_objects(replace(plan, owner_uid=uid)):
                await self._create_owned(manifest, launch.job.id)
        except KubeError as exc:
            if exc.status in (0, 429) or exc.status >= 500:
                # An outage is not the job's fault: it waits, and starts once the API answers.
                raise NotYet(
                    f"the Kubernetes API is not answering ({exc}); the job starts once it does"
                ) from exc
            raise StartFailed(f"Kubernetes refused the job: {exc}") from exc
        log.info("kube_job_created", job=launch.job.name, owner=launch.job.owner, namespace=plan.namespace)
        return {"namespace": plan.namespace, "owner_uid": uid}

    async def adopt(self, job: JobRecord) -> dict[str, Any] | None:
        """The backend record of a job whose objects exist although the store does not
        say so (the service stopped between creating them and recording it), or None."""
        owner = await self.kube.get("ConfigMap", self.namespace(job.owner), owner_name(job.name))
        if owner is None or (_meta(owner).get("labels") or {}).get(LABEL_JOB_ID) != job.id:
            return None
        return {"namespace": self.namespace(job.owner), "owner_uid": str(_meta(owner)["uid"])}

    async def _create_owned(self, manifest: dict[str, Any], job_id: str) -> dict[str, Any]:
        """Create, or adopt what a previous try of this job created (409)."""
        try:
            return await self.kube.create(manifest)
        except KubeError as exc:
            if exc.status != 409:
                raise
        kind, meta = manifest["kind"], manifest["metadata"]
        if kind == "Secret":  # never read back: replaced whole, as the service may not read Secrets
            return await self.kube.replace(manifest)
        existing = await self.kube.get(kind, meta.get("namespace"), meta["name"])
        if existing is None:
            return await self.kube.create(manifest)
        if (_meta(existing).get("labels") or {}).get(LABEL_JOB_ID) != job_id:
            whose = (_meta(existing).get("annotations") or {}).get(ANNOTATION_USER)
            if (
                self._shared()
                and whose
                and whose != (manifest["metadata"].get("annotations") or {}).get(ANNOTATION_USER)
            ):
                raise StartFailed(
                    f"another user's job is named {meta['name']!r} in the shared namespace "
                    f"{meta.get('namespace')}; choose another name"
                )
            raise StartFailed(
                f"{kind} {meta['name']} in namespace {meta.get('namespace')} belongs to another job "
                "(an earlier job of this name may still be being deleted); try again in a minute"
            )
        return existing

    async def _ensure_tenancy(self, user: str) -> None:
        """The user's namespace with its quota, limits and network policy (once per
        process per namespace; a quota change is applied by _sync_quotas)."""
        namespace = self.namespace(user)
        stored = await self._store.get_user(user)
        quota = stored.quota if stored is not None else Quota()
        if self._tenancy.get(namespace, "unset") == quota:
            return
        for manifest in manifests.tenancy_objects(user, quota, self._settings):
            await self._apply(manifest)
        self._tenancy[namespace] = quota
        self._users[namespace] = user

    async def _apply(self, manifest: dict[str, Any]) -> None:
        """Create, or bring an existing object's spec and labels to `manifest`."""
        try:
            await self.kube.create(manifest)
            return
        except KubeError as exc:
            if exc.status != 409:
                raise
        meta = manifest["metadata"]
        patch: dict[str, Any] = {"metadata": {"labels": meta.get("labels") or {}}}
        for field in ("spec", "data"):
            if field in manifest:
                patch[field] = manifest[field]
        await self.kube.patch(manifest["kind"], meta.get("namespace"), meta["name"], patch)

    async def _sync_quotas(self) -> None:
        """Bring each known namespace's ResourceQuota to its user's current quota."""
        while True:
            await asyncio.sleep(self._settings.quota_sync_seconds)
            for namespace, user in list(self._users.items()):
                try:
                    stored = await self._store.get_user(user)
                    quota = stored.quota if stored is not None else Quota()
                    if self._tenancy.get(namespace) != quota and not self._shared():
                        manifest = manifests.resource_quota(namespace, user, quota)
                        if manifest is not None:
                            await self._apply(manifest)
                        else:
                            await self.kube.delete("ResourceQuota", namespace, QUOTA_NAME)
                        self._tenancy[namespace] = quota
                        log.info("quota_synced", namespace=namespace, user=user)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # retried next round
                    log.warning("quota_sync_failed", namespace=namespace, error=str(exc))

    # -- observe -----------------------------------------------------------------------

    def _objects(
        self, job: Job | JobRecord
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None, list[dict[str, Any]]]:
        owners = self._informers["ConfigMap"].of_job(job.id)
        jobs = self._informers["Job"].of_job(job.id)
        return (
            (owners[0] if owners else None),
            (jobs[0] if jobs else None),
            self._informers["Pod"].of_job(job.id),
        )

    async def observe(self, job: JobRecord, cursor: str | None) -> Observation:
        reported = _decode_reported(cursor)
        if job.id in self._stopped:
            return Observation(job.state, job.reason, cursor=cursor)
        error = self._api_error()
        if error is not None:
            note = f"the Kubernetes API is not answering ({error}); the job's state is as last seen"
            return Observation(job.state, note, cursor=cursor)
        if not self._is_synced():
            return Observation(job.state, job.reason, cursor=cursor)
        owner, trainers, pods = self._objects(job)
        if owner is None and not await self._owner_gone(job):
            return Observation(job.state, job.reason, cursor=cursor)  # the watch has yet to show it
        attempts = attempts_of(pods)
        events = self._new_events(attempts, reported)
        state, reason, started, finished = self._judge(job, owner, trainers, pods, attempts)
        if state == SUCCEEDED:
            events += _stopped_events(job, reported, finished or _now())
        new_cursor = _encode_reported(reported)
        if state in TERMINAL_STATES and job.id not in self._finishing:
            task = asyncio.create_task(self._finish(job), name=f"kube-finish-{job.name}")
            self._finishing[job.id] = task
            task.add_done_callback(functools.partial(self._finished, job.id))
        return Observation(state, reason, started, finished, tuple(events), new_cursor)

    async def _owner_gone(self, job: JobRecord) -> bool:
        """Whether the job's owner is really gone, asked of the API server itself: the cache
        may not have seen a just-created owner yet, and must not fail a job for that."""
        namespace = job.backend.get("namespace") or self.namespace(job.owner)
        try:
            owner = await self.kube.get("ConfigMap", namespace, owner_name(job.name))
        except KubeError:
            return False
        return owner is None or (_meta(owner).get("labels") or {}).get(LABEL_JOB_ID) != job.id

    def _judge(
        self,
        job: JobRecord,
        owner: dict[str, Any] | None,
        trainers: dict[str, Any] | None,
        pods: list[dict[str, Any]],
        attempts: dict[str, list[Attempt]],
    ) -> tuple[str, str, str | None, str | None]:
        spec = job.spec
        trainer_runs = [a for items in attempts.values() for a in items if a.role == "TRAINER"]
        # RUNNING once a trainer's program runs (never before); its first start is the job's.
        running = sorted(str(a.started_at) for a in trainer_runs if a.running and a.started_at)
        started = running[0] if running else None
        first_start = min((str(a.started_at) for a in trainer_runs if a.started_at), default=None)
        if owner is None:
            return FAILED, "its Kubernetes objects were deleted outside PaddleCloud", first_start, _now()
        if trainers is not None:
            done = _condition(trainers, "Complete")
            if done is not None:
                finished = _status(trainers).get("completionTime") or done.get("lastTransitionTime")
                return SUCCEEDED, "every trainer exited 0", first_start, finished
            failed = _condition(trainers, "Failed")
            if failed is not None:
                return (
                    FAILED,
                    self._failure(spec, attempts, failed),
                    first_start,
                    failed.get("lastTransitionTime"),
                )
        evicted = [
            p for p in pods if _status(p).get("reason") == "Evicted" or _condition(p, "DisruptionTarget")
        ]
        if len(evicted) > self._settings.max_evictions:
            return (
                FAILED,
                f"its pods were evicted {len(evicted)} times (more than {self._settings.max_evictions})",
                first_start,
                _now(),
            )
        max_restarts = spec.max_restarts
        for worker, items in sorted(attempts.items()):
            if items and items[0].role == "PSERVER":
                failures = [a for a in items if a.terminated]
                if len(failures) > max_restarts:
                    how = _exit_words(failures[-1].terminated or {}, str(spec.psmemory))
                    return FAILED, f"{worker} {how} after {max_restarts} restarts", first_start, _now()
        if started is not None:
            return RUNNING, "running", first_start, None
        if job.state == RUNNING:
            return (
                RUNNING,
                job.reason or "running",
                job.started_at.isoformat() if job.started_at else None,
                None,
            )
        found = _pending_reason(pods)
        waiting = found[0] if found else None
        if found and waiting and waiting.startswith(PULL_FAILURE):
            limit = self._settings.image_pull_timeout_seconds
            if _age_seconds(found[1]) > limit:
                return FAILED, f"{waiting} (for more than {limit:g} s)", None, _now()
        if waiting is None:
            waiting = self._refusal(job, trainers, pods)
        if waiting is None:
            ps_ready = sum(
                1 for p in pods if (_worker_of(p) or ("", "", 0))[1] == "PSERVER" and _condition(p, "Ready")
            )
            wanted = spec.pservers
            if wanted and ps_ready < wanted:
                waiting = f"waiting for the parameter servers: {ps_ready} of {wanted} ready"
            else:
                waiting = "waiting for the trainers' pods to start"
        return PENDING, waiting, None, None

    def _failure(self, spec: JobSpec, attempts: dict[str, list[Attempt]], condition: dict[str, Any]) -> str:
        """Why the trainers' Job failed, in words: the last failed trainer's exit."""
        failed = [
            a
            for items in attempts.values()
            for a in items
            if a.role == "TRAINER" and a.terminated and int(a.terminated.get("exitCode") or 0) != 0
        ]
        if not failed:
            return f"the trainers failed: {condition.get('message') or condition.get('reason')}"
        last = max(failed, key=lambda a: a.key)
        tries = sum(1 for a in attempts[last.worker] if a.terminated)
        restarts = tries - 1
        plural = "" if restarts == 1 else "s"
        how = _exit_words(last.terminated or {}, str(spec.memory))
        return f"{last.worker} {how} after {restarts} restart{plural}"

    def _refusal(
        self, job: JobRecord, trainers: dict[str, Any] | None, pods: list[dict[str, Any]]
    ) -> str | None:
        """A quota refusal of the trainers' pods, from the Job's events (read at most every
        EVENT_CHECK_SECONDS, in the background, while the job has fewer pods than it asks)."""
        wanted = job.spec.trainers + job.spec.pservers
        if trainers is None or len(pods) >= wanted:
            self._refusals.pop(job.id, None)
            return None
        checked, message = self._refusals.get(job.id, (0.0, None))
        if time.monotonic() - checked > EVENT_CHECK_SECONDS:
            self._refusals[job.id] = (time.monotonic(), message)
            task = asyncio.create_task(self._read_refusal(job, _meta(trainers)))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        return message

    async def _read_refusal(self, job: JobRecord, meta: dict[str, Any]) -> None:
        try:
            answer = await self.kube.list(
                "Event", meta.get("namespace"), fields=f"involvedObject.name={meta.get('name')}"
            )
        except KubeError:
            return
        refusals = [
            e
            for e in answer.get("items") or []
            if e.get("reason") == "FailedCreate" and "quota" in str(e.get("message"))
        ]
        if refusals:
            latest = max(refusals, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
            message = str(latest.get("message"))
            self._refusals[job.id] = (time.monotonic(), f"the namespace's quota refuses its pods: {message}")

    def _new_events(self, attempts: dict[str, list[Attempt]], reported: set[str]) -> list[ObservedEvent]:
        events = []
        for worker, items in sorted(attempts.items()):
            for attempt in items:
                tag = f"{worker}/{hashlib.sha256(attempt.key.encode()).hexdigest()[:10]}"
                if attempt.terminated and f"{tag}/end" not in reported:
                    reported.add(f"{tag}/end")
                    code = int(attempt.terminated.get("exitCode") or 0)
                    when = str(attempt.terminated.get("finishedAt") or _now())
                    if code == 0:
                        events.append(ObservedEvent(when, "Normal", "WorkerSucceeded", f"{worker} exited 0"))
                    else:
                        how = _exit_words(attempt.terminated, "its limit")
                        events.append(ObservedEvent(when, "Warning", "WorkerFailed", f"{worker} {how}"))
        return events

    # -- workers -----------------------------------------------------------------------

    async def workers(self, job: JobRecord) -> list[WorkerInfo]:
        _, _, pods = self._objects(job)
        latest: dict[str, tuple[dict[str, Any], int]] = {}
        tries: dict[str, int] = {}
        for pod in sorted(pods, key=lambda p: str(_meta(p).get("creationTimestamp") or "")):
            who = _worker_of(pod)
            if who is None:
                continue
            tries[who[0]] = tries.get(who[0], 0) + 1
            latest[who[0]] = (pod, who[2])
        result = []
        for planned in planned_workers(_spec_of(job)):
            found = latest.get(planned.name)
            # The job's success stopped its parameter servers (their StatefulSet is deleted):
            # they show that, not the job's state nor how their pods ended.
            stopped = job.state == SUCCEEDED and planned.role == "PSERVER"
            if found is None:
                state = "PENDING" if job.state not in TERMINAL_STATES else job.state
                state = WORKER_STOPPED if stopped else state
                result.append(WorkerInfo(planned.name, planned.role, planned.index, state))
                continue
            pod, _ = found
            cs = _main_status(pod) or {}
            restarts = int(cs.get("restartCount") or 0) + tries[planned.name] - 1
            terminated = (cs.get("state") or {}).get("terminated")
            phase = str(_status(pod).get("phase") or "Pending")
            state = {
                "Pending": "PENDING",
                "Running": "RUNNING",
                "Succeeded": "SUCCEEDED",
                "Failed": "FAILED",
            }.get(phase, phase.upper())
            state = WORKER_STOPPED if stopped else state
            started = ((cs.get("state") or {}).get("running") or terminated or {}).get("startedAt")
            result.append(
                WorkerInfo(
                    planned.name,
                    planned.role,
                    planned.index,
                    state,
                    restarts=restarts,
                    started_at=started,
                    exit_code=int(terminated["exitCode"]) if terminated else None,
                    host=(pod.get("spec") or {}).get("nodeName"),
                )
            )
        return result

    # -- logs --------------------------------------------------------------------------

    def _changed(self, kind: str, pod: dict[str, Any]) -> None:
        """A pod changed: keep the log of every container attempt that has ended."""
        if kind == "DELETED":
            return
        job_id = (_meta(pod).get("labels") or {}).get(LABEL_JOB_ID)
        if not job_id:
            return
        for items in attempts_of([pod]).values():
            for attempt in items:
                key = (job_id, attempt.worker, attempt.key)
                if (
                    attempt.terminated
                    and key not in self._keeping
                    and not self._kept.get(job_id, {}).get(key[1:])
                ):
                    self._keeping.add(key)
                    self._spawn(self._keep_once(key, attempt))

    async def _keep_once(self, key: tuple[str, str, str], attempt: Attempt) -> None:
        try:
            await self._keep(key[0], attempt)
        finally:
            self._keeping.discard(key)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _keep(self, job_id: str, attempt: Attempt) -> None:
        """Save one attempt's log in the store (whole once it has ended)."""
        kept = self._kept.setdefault(job_id, {})
        if kept.get((attempt.worker, attempt.key)):
            return
        try:
            text = await self.kube.log(
                attempt.namespace,
                attempt.pod,
                attempt.container,
                previous=attempt.previous,
                limit_bytes=None,
            )
        except KubeError as exc:
            log.warning("log_not_kept", job_id=job_id, worker=attempt.worker, error=str(exc))
            return
        limit = self._settings.kept_log_bytes
        if len(text) > limit:
            cut = text[-limit:]
            dropped = len(text) - limit
            text = (
                f"[... {dropped} earlier characters of this attempt were not kept ...]\n"
                + cut[cut.find("\n") + 1 :]
            )
        await self._store.keep_log(KeptLog(job_id, attempt.worker, attempt.key, text))
        kept[(attempt.worker, attempt.key)] = attempt.terminated is not None

    async def _keep_all(self, job: Job | JobRecord) -> None:
        _, _, pods = self._objects(job)
        for items in attempts_of(pods).values():
            for attempt in items:
                await self._keep(job.id, attempt)

    def _finished(self, job_id: str, _: asyncio.Task[None]) -> None:
        self._finishing.pop(job_id, None)

    async def _finish(self, job: JobRecord) -> None:
        """The job is final: keep its logs, then delete its objects; again, backing off,
        while the API server fails (a restart's sweep finishes it otherwise)."""
        failures = 0
        while True:
            try:
                await self._keep_all(job)
                await self._delete(job, grace_seconds=None)
                break
            except KubeError as exc:
                failures += 1
                delay = backoff(failures, self._settings.max_backoff_seconds)
                log.warning("kube_cleanup_failed", job=job.name, error=str(exc), retry_in=round(delay, 2))
                await asyncio.sleep(delay)
        self._kept.pop(job.id, None)

    async def _delete(self, job: JobRecord, grace_seconds: float | None) -> None:
        namespace = job.backend.get("namespace") or self.namespace(job.owner)
        uid = job.backend.get("owner_uid")
        await self.kube.delete(
            "ConfigMap", namespace, owner_name(job.name), grace_seconds=grace_seconds, uid=uid
        )
        # The parameter servers go at once, not when the garbage collector gets to them.
        await self.kube.delete("StatefulSet", namespace, pserver_name(job.name), grace_seconds=grace_seconds)

    def logs(self, job: JobRecord, query: LogQuery) -> AsyncGenerator[list[LogLine], None]:
        return self._logs(job, query)

    async def _logs(self, job: JobRecord, query: LogQuery) -> AsyncGenerator[list[LogLine], None]:
        names = [w.name for w in planned_workers(_spec_of(job))]
        wanted = [
            n
            for n in names
            if (not query.workers or n in query.workers)
            and (not query.roles or n.split("-", 1)[0].upper() in query.roles)
        ]
        position = _decode_position(query.cursor, names) if query.cursor else {}
        first = True
        while True:
            final = await self._final(job)  # decided before reading: nothing after it is missed
            kept = {(k.worker, k.attempt): k.text for k in await self._store.list_kept_logs(job.id)}
            _, _, pods = self._objects(job)
            live = attempts_of(pods)
            for worker in wanted:
                batch = await self._read_worker(job, worker, kept, live.get(worker, []), position, final)
                if first and query.tail is not None and query.cursor is None:
                    batch = batch[-query.tail :] if query.tail else []
                if batch:
                    yield batch
            first = False
            if final or not query.follow:
                return
            await asyncio.sleep(LOG_POLL_SECONDS)

    async def _final(self, job: JobRecord) -> bool:
        current = await self._store.get_job_by_id(job.id)
        return current is None or (current.state in TERMINAL_STATES and job.id not in self._finishing)

    async def _read_worker(
        self,
        job: JobRecord,
        worker: str,
        kept: dict[tuple[str, str], str],
        live: list[Attempt],
        position: dict[str, tuple[str, int]],
        final: bool,
    ) -> list[LogLine]:
        """The worker's lines after its position, attempt by attempt: kept text where the
        attempt was kept, the pod's log where it is still live."""
        attempts = {key: None for (w, key) in kept if w == worker}
        attempts.update({a.key: a for a in live})  # type: ignore[misc]
        done_key, done_lines = position.get(worker, ("", 0))
        lines: list[LogLine] = []
        for key in sorted(attempts):
            if key < done_key:
                continue
            attempt = attempts[key]
            ended = attempt is None or attempt.terminated is not None or final
            if attempt is None or (not attempt.running and (worker, key) in kept):
                text = kept.get((worker, key), "")
            else:
                try:
                    text = await self.kube.log(
                        attempt.namespace, attempt.pod, attempt.container, previous=attempt.previous
                    )
                except KubeError:
                    text = kept.get((worker, key), "")
            rows = text.split("\n")
            if rows and rows[-1] == "":
                rows.pop()
            elif rows and not ended:
                rows.pop()  # a line still being written comes whole next time
            skip = done_lines if key == done_key else 0
            for number, row in enumerate(rows[skip:], start=skip + 1):
                position[worker] = (key, number)
                lines.append(LogLine(worker, row, _encode_position(position)))
            if key != done_key and not rows:
                position[worker] = (key, 0)
        return lines

    # -- stop and remove ---------------------------------------------------------------

    async def stop(self, job: JobRecord, grace_seconds: float, reason: str | None = None) -> None:
        # Nothing here records the end: the service records KILLED with `reason` itself.
        if not job.backend:
            return
        self._stopped.add(job.id)
        try:
            await self._keep_all(job)
        except KubeError as exc:
            log.warning("logs_not_kept_before_kill", job=job.name, error=str(exc))
        await self._delete(job, grace_seconds=grace_seconds)

    def forget(self, job: JobRecord) -> None:
        self._refusals.pop(job.id, None)
        self._stopped.discard(job.id)
        if job.id not in self._finishing:  # else _finish drops it when it is done
            self._kept.pop(job.id, None)

    async def remove(self, job: JobRecord) -> None:
        if job.backend:
            await self._delete(job, grace_seconds=None)
        self._kept.pop(job.id, None)
        self._finishing.pop(job.id, None)

    async def forget_user(self, user: str) -> None:
        """A deleted user's namespace goes, with its quota and everything left in it."""
        namespace = self.namespace(user)
        self._tenancy.pop(namespace, None)
        self._users.pop(namespace, None)
        if not self._shared():
            await self.kube.delete("Namespace", None, namespace)

    async def sweep(self, keep: set[str]) -> int:
        """Delete the objects of every job not in `keep` (active job ids): leftovers of a
        job that ended while the service was down, or of one the store forgot. Their logs
        are kept first when the store still has the job."""
        swept = 0
        for owner in self._informers["ConfigMap"].all():
            job_id = (_meta(owner).get("labels") or {}).get(LABEL_JOB_ID)
            if not job_id or job_id in keep:
                continue
            job = await self._store.get_job_by_id(job_id)
            meta = _meta(owner)
            try:
                if job is not None:
                    await self._keep_all(job)
                await self.kube.delete(
                    "ConfigMap", meta.get("namespace"), str(meta.get("name")), uid=meta.get("uid")
                )
                swept += 1
            except KubeError as exc:
                log.warning("sweep_failed", owner=meta.get("name"), error=str(exc))
        if swept:
            log.info("kube_objects_swept", jobs=swept)
        return swept


def _spec_of(job: JobRecord) -> JobSpec:
    return job.spec


# Cursors --------------------------------------------------------------------------------
def _stopped_events(job: JobRecord, reported: set[str], when: str) -> list[ObservedEvent]:
    """One `WorkerStopped` per parameter server of a job that succeeded, as on the local
    backend: the platform stops them (deleting their StatefulSet) once every trainer exited 0."""
    events = []
    for index in range(job.spec.pservers):
        tag = f"pserver-{index}/stopped"
        if tag not in reported:
            reported.add(tag)
            message = f"pserver-{index} stopped by the platform: every trainer exited 0"
            events.append(ObservedEvent(when, "Normal", "WorkerStopped", message))
    return events


# Events: the set of what was reported, as sorted tags. Logs: per worker, the attempt and
# the line last sent. Both are opaque to clients: base64url JSON.


def _b64(data: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode()).decode().rstrip("=")


def _unb64(text: str) -> Any:
    return json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))


def _encode_reported(reported: set[str]) -> str:
    return "k" + _b64(sorted(reported))


def _decode_reported(cursor: str | None) -> set[str]:
    if not cursor or not cursor.startswith("k"):
        return set()
    try:
        return {str(t) for t in _unb64(cursor[1:])}
    except (ValueError, binascii.Error, TypeError):
        return set()


def _encode_position(position: dict[str, tuple[str, int]]) -> str:
    return "p" + _b64({w: [k, n] for w, (k, n) in sorted(position.items())})


def _decode_position(cursor: str, names: list[str]) -> dict[str, tuple[str, int]]:
    try:
        if not cursor.startswith("p"):
            raise ValueError
        data = _unb64(cursor[1:])
        return {
            str(w): (str(k), int(n))
            for w, (k, n) in data.items()
            if w in names and isinstance(k, str) and isinstance(n, int) and n >= 0
        }
    except (ValueError, binascii.Error, TypeError, AttributeError) as exc:
        raise BadCursor("this cursor was not handed out for this job's logs") from exc
