"""The kubernetes jobs backend: the five calls of backend.py on a cluster.

- `start` makes the user's namespace ready (tenancy: quota, limits, network policy),
  then creates the job's owner ConfigMap and the objects it owns (manifests.py).
  Creating is idempotent: a 409 reads the object back and adopts it when it carries
  this job's id, so a retry or a restart converges.
- `observe`, `workers` and `logs` read the watch cache (cache.py); nothing polls the
  API server per job. While the API server is unreachable the job keeps its state
  with a reason that says so: an outage never fails a job.
- A job's state is judged from the cache by judge.py, a pure function. It ends when its
  trainers' Indexed Job says Complete or Failed (or its workers were evicted too often,
  or a parameter server failed past its restarts). Then the backend keeps every
  container's log in the store and deletes the owner, which removes the parameter
  servers and everything else. `stop` does the same with the grace period; `remove`
  also drops the kept logs.
- Tasks: the informers and the quota sync run for the backend's life under
  `common/tasks.restarting` (a crash is logged and the task started again with backoff);
  work as it arrives (keeping a log, reading Events, a job's clean-up) is `Spawned`,
  named, and retries itself with backoff rather than being started again.
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
import re
import time
from collections.abc import AsyncGenerator, Callable, Coroutine
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import structlog

from paddlecloud.common.config import Config
from paddlecloud.common.errors import BadCursor
from paddlecloud.common.kube import Conflict, Forbidden, Kube, KubeError, NotFound, Unavailable
from paddlecloud.common.quantity import parse_bytes, parse_cpu_milli
from paddlecloud.common.store import Job, KeptLog, Quota, Store
from paddlecloud.common.store.models import SUCCEEDED, TERMINAL_STATES
from paddlecloud.common.tasks import Spawned, backoff, restarting

from ..backend import (
    Backend,
    Launch,
    LogLine,
    LogQuery,
    NotYet,
    Observation,
    ObservedEvent,
    PlannedWorker,
    StartFailed,
    WorkerInfo,
    planned_workers,
)
from ..exits import WORKER_STOPPED
from ..records import JobRecord
from ..spec import JobSpec
from . import manifests
from .cache import Informer
from .judge import Observed, Recorded, Refusal, Rules, exit_words, iso, judge
from .names import (
    ANNOTATION_USER,
    LABEL_JOB_ID,
    QUOTA_NAME,
    managed_selector,
    namespace_for,
    owner_name,
    pserver_name,
)
from .pods import Attempt, attempts_of, main_status, worker_of
from .pods import meta as _meta
from .pods import status as _status

log = structlog.get_logger("paddlecloud.jobs.kube")

KINDS = ("ConfigMap", "StatefulSet", "Job", "Pod")
# Kubernetes' StatusCause of a create refused in a namespace that is being deleted.
NAMESPACE_TERMINATING = "NamespaceTerminating"
# How RBAC's authorizer words a refusal (k8s.io/apiserver's forbiddenMessage).
_RBAC_REFUSAL = re.compile(r'User ".*" cannot [a-z]+ resource "')
# How often a stuck PENDING job's Kubernetes events are read for a refusal (quota, Pod Security).
EVENT_CHECK_SECONDS = 5.0
LOG_POLL_SECONDS = 0.5
# A log kept when its container ends is tried this many times, backing off, before it is
# left to the job's final clean-up (which keeps every log again).
KEEP_TRIES = 5


def _now() -> str:
    return iso(datetime.now(UTC))


_PHASES = {"Pending": "PENDING", "Running": "RUNNING", "Succeeded": "SUCCEEDED", "Failed": "FAILED"}


def _worker_info(planned: PlannedWorker, pod: dict[str, Any], replaced: int, stopped: bool) -> WorkerInfo:
    """A planned worker as its newest pod shows it. `replaced` counts the pods it had
    before, whose ends count as restarts with the container's own; `stopped`: the platform
    stopped it (a parameter server of a job that succeeded), whatever its pod says."""
    cs = main_status(pod) or {}
    state = cs.get("state") or {}
    terminated = state.get("terminated")
    phase = str(_status(pod).get("phase") or "Pending")
    return WorkerInfo(
        planned.name,
        planned.role,
        planned.index,
        WORKER_STOPPED if stopped else _PHASES.get(phase, phase.upper()),
        restarts=int(cs.get("restartCount") or 0) + replaced,
        started_at=(state.get("running") or terminated or {}).get("startedAt"),
        exit_code=int(terminated["exitCode"]) if terminated else None,
        host=(pod.get("spec") or {}).get("nodeName"),
    )


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
        self._finishing: dict[str, asyncio.Task[None]] = {}  # job id → its final clean-up
        # job id → (when its Events were read, the refusal of its pods they told)
        self._refusals: dict[str, tuple[float, Refusal | None]] = {}
        # Tasks started as work arrives (a log to keep, Events to read, a clean-up): named,
        # a crash logged at once, cancelled by close().
        self._spawned = Spawned()
        self._rules = Rules(self._settings.max_evictions, self._settings.image_pull_timeout_seconds)
        # (job id, worker, attempt) whose log is being kept, or given up on until the clean-up
        self._keeping: set[tuple[str, str, str]] = set()
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
            self._keep_running(f"kube-watch-{kind}", informer.run)
        self._keep_running("kube-quota-sync", self._sync_quotas)
        try:
            await asyncio.wait_for(self._synced(), self._settings.request_timeout_seconds)
        except TimeoutError:
            log.warning("kubernetes_not_synced", host=self._kube.host, error=self._api_error())
        log.info("kubernetes_backend_open", host=self._kube.host, mode=self._settings.namespace_mode)

    async def _synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self._informers.values()))

    def _keep_running(self, name: str, start: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """A task for the backend's life, as kopf runs a daemon: `name` runs `start()` in a
        task of its own (`name` + "-run"), restarted with backoff whenever it crashes, returns
        or is killed; cancelling the `name` task (close) stops both."""
        self._tasks.append(
            asyncio.create_task(
                restarting(f"{name}-run", start, max_backoff=self._settings.max_backoff_seconds),
                name=name,
            )
        )

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._spawned.cancel()
        self._tasks.clear()
        if self._kube is not None:
            await self._kube.close()
            self._kube = None

    def _is_synced(self) -> bool:
        return bool(self._informers) and all(i.synced.is_set() for i in self._informers.values())

    def _api_error(self) -> str | None:
        return next((i.error for i in self._informers.values() if i.error), None)

    def _stale(self) -> str | None:
        """Why the watch cache may be stale, as a job's reason, or None: a kind the
        service may not watch (403: the operator's to mend) before an outage."""
        for informer in self._informers.values():
            if informer.error and informer.refused:
                return (
                    f"the jobs service may not watch {informer.kind}s ({informer.error}): an operator "
                    "must grant it the rights that charts/paddlecloud gives; the job's state is as last seen"
                )
        error = self._api_error()
        if error is not None:
            return f"the Kubernetes API is not answering ({error}); the job's state is as last seen"
        return None

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
        # One disk for every worker: its containers (init containers too) each ask for it.
        if spec.disk_bytes > parse_bytes(self._settings.max_container_disk):
            return (
                "disk",
                f"each worker asks for {spec.disk} of disk; a pod here may have "
                f"{self._settings.max_container_disk} at most (jobs.kubernetes.max_container_disk)",
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
        uid: str | None = None  # the owner's, once made: a refused start deletes it
        try:
            await self._ensure_tenancy(launch.job.owner)
            owner = await self._create_owned(manifests.owner_object(plan), launch.job.id)
            uid = str(_meta(owner)["uid"])
            for manifest in manifests.job_objects(replace(plan, owner_uid=uid)):
                await self._create_owned(manifest, launch.job.id)
        except Unavailable as exc:
            # An outage is not the job's fault: it waits, and starts once the API answers.
            raise NotYet(f"the Kubernetes API is not answering ({exc}); the job starts once it does") from exc
        except KubeError as exc:
            # A namespace being deleted refuses creates (403, NamespaceTerminating); one
            # that went between two creates answers 404. A user's is made again: the job
            # waits. (The shared one is the operator's: without it the job cannot run.)
            gone = NAMESPACE_TERMINATING in exc.causes or isinstance(exc, NotFound)
            if gone and not self._shared():
                raise NotYet(self._terminating(plan.namespace)) from exc
            await self._undo(plan, uid)
            raise StartFailed(_refused(exc)) from exc
        except StartFailed:
            await self._undo(plan, uid)
            raise
        log.info("kube_job_created", job=launch.job.name, owner=launch.job.owner, namespace=plan.namespace)
        return {"namespace": plan.namespace, "owner_uid": uid}

    def _terminating(self, namespace: str) -> str:
        """Why a job waits whose user's namespace is being deleted (the user deleted and
        made again, an operator's clean-up): the API server refuses every create there
        until it is gone. Whatever was made of the job goes with it; the namespace's
        tenancy is forgotten, so a later try makes the namespace again."""
        self._tenancy.pop(namespace, None)
        return f"the namespace {namespace} is being deleted; the job starts once it is gone and made again"

    async def _undo(self, plan: manifests.JobPlan, uid: str | None) -> None:
        """A start refused part-way: the owner made for it is deleted, and the garbage
        collector removes what it owns, so a FAILED job leaves nothing. Should that fail
        too, a restart's sweep removes it (the job is no longer active)."""
        if uid is None:
            return
        name = owner_name(plan.launch.spec.name)
        try:
            await self.kube.delete("ConfigMap", plan.namespace, name, uid=uid)
        except KubeError as exc:
            log.warning("kube_refused_start_not_undone", job=name, namespace=plan.namespace, error=str(exc))

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
        except Conflict:
            pass  # made by an earlier try, or another job's: read on
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
        except Conflict:
            pass  # it exists: bring it to the manifest
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
        note = self._stale()
        if note is not None:
            return Observation(job.state, note, cursor=cursor)
        if not self._is_synced():
            return Observation(job.state, job.reason, cursor=cursor)
        owner, trainers, pods = self._objects(job)
        if owner is None and not await self._owner_gone(job):
            return Observation(job.state, job.reason, cursor=cursor)  # the watch has yet to show it
        spec = job.spec
        observed = Observed(owner, trainers, pods, refusal=self._refusals.get(job.id, (0.0, None))[1])
        recorded = Recorded(job.state, job.reason, job.started_at.isoformat() if job.started_at else None)
        verdict = judge(spec, recorded, observed, self._rules, datetime.now(UTC))
        if verdict.read_events and trainers is not None:
            self._check_refusal(job, trainers)
        else:
            self._refusals.pop(job.id, None)
        events = self._new_events(observed.attempts, reported)
        if verdict.state == SUCCEEDED:
            events += _stopped_events(spec, reported, verdict.finished_at or _now())
        if verdict.state in TERMINAL_STATES:
            self._finish_once(job)
        return Observation(
            verdict.state,
            verdict.reason,
            verdict.started_at,
            verdict.finished_at,
            tuple(events),
            _encode_reported(reported),
        )

    async def _owner_gone(self, job: JobRecord) -> bool:
        """Whether the job's owner is really gone, asked of the API server itself: the cache
        may not have seen a just-created owner yet, and must not fail a job for that."""
        namespace = job.backend.get("namespace") or self.namespace(job.owner)
        try:
            owner = await self.kube.get("ConfigMap", namespace, owner_name(job.name))
        except KubeError:
            return False
        return owner is None or (_meta(owner).get("labels") or {}).get(LABEL_JOB_ID) != job.id

    def _check_refusal(self, job: JobRecord, trainers: dict[str, Any]) -> None:
        """Read the trainers' Job's Events for a refusal of its pods, in the background, at most
        every EVENT_CHECK_SECONDS while the job waits with fewer pods than it asks for."""
        checked, message = self._refusals.get(job.id, (0.0, None))
        if time.monotonic() - checked > EVENT_CHECK_SECONDS:
            self._refusals[job.id] = (time.monotonic(), message)
            self._spawned.spawn(f"kube-events-{job.name}", self._read_refusal(job, _meta(trainers)))

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
            if e.get("reason") == "FailedCreate" and _refusal_of(str(e.get("message"))) is not None
        ]
        if refusals:
            latest = max(refusals, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
            self._refusals[job.id] = (time.monotonic(), _refusal_of(str(latest.get("message"))))

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
                        how = exit_words(attempt.terminated, "its limit")
                        events.append(ObservedEvent(when, "Warning", "WorkerFailed", f"{worker} {how}"))
        return events

    # -- workers -----------------------------------------------------------------------

    async def workers(self, job: JobRecord) -> list[WorkerInfo]:
        _, _, pods = self._objects(job)
        latest: dict[str, dict[str, Any]] = {}  # worker → its newest pod
        tries: dict[str, int] = {}  # worker → how many pods it has had
        for pod in sorted(pods, key=lambda p: str(_meta(p).get("creationTimestamp") or "")):
            who = worker_of(pod)
            if who is not None:
                tries[who[0]] = tries.get(who[0], 0) + 1
                latest[who[0]] = pod
        result = []
        for planned in planned_workers(job.spec):
            # The job's success stopped its parameter servers (their StatefulSet is deleted):
            # they show that, not the job's state nor how their pods ended.
            stopped = job.state == SUCCEEDED and planned.role == "PSERVER"
            newest = latest.get(planned.name)
            if newest is None:
                state = "PENDING" if job.state not in TERMINAL_STATES else job.state
                result.append(
                    WorkerInfo(
                        planned.name, planned.role, planned.index, WORKER_STOPPED if stopped else state
                    )
                )
            else:
                result.append(_worker_info(planned, newest, tries[planned.name] - 1, stopped))
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
                    self._spawned.spawn(f"kube-keep-{attempt.pod}", self._keep_once(key, attempt))

    async def _keep_once(self, key: tuple[str, str, str], attempt: Attempt) -> None:
        """Keep an ended attempt's log. A failure is retried here, backing off, up to
        KEEP_TRIES times, and then left to the job's final clean-up (which keeps every log):
        the key stays in `_keeping` meanwhile, so the pod's later changes start no other try."""
        for tries in range(1, KEEP_TRIES + 1):
            try:
                await self._keep(key[0], attempt)
                break
            except NotFound:
                break  # the pod went, and its log with it
            except Exception as exc:  # the API server's or the store's failure: try again
                if tries == KEEP_TRIES:
                    log.warning("log_not_kept", job_id=key[0], worker=attempt.worker, error=str(exc))
                    return  # given up until the clean-up: still in _keeping
                delay = backoff(tries, self._settings.max_backoff_seconds)
                log.warning(
                    "log_keep_failed", job_id=key[0], worker=attempt.worker, error=str(exc), retry_in=delay
                )
                await asyncio.sleep(delay)
        self._keeping.discard(key)

    async def _keep(self, job_id: str, attempt: Attempt) -> None:
        """Save one attempt's log in the store (whole once it has ended)."""
        kept = self._kept.setdefault(job_id, {})
        if kept.get((attempt.worker, attempt.key)):
            return
        text = await self.kube.log(
            attempt.namespace,
            attempt.pod,
            attempt.container,
            previous=attempt.previous,
            limit_bytes=None,
        )
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
        """Keep every attempt's log; one the API server will not give is left out, said so."""
        _, _, pods = self._objects(job)
        for items in attempts_of(pods).values():
            for attempt in items:
                try:
                    await self._keep(job.id, attempt)
                except KubeError as exc:
                    log.warning("log_not_kept", job_id=job.id, worker=attempt.worker, error=str(exc))

    def _finish_once(self, job: JobRecord) -> None:
        """Start the job's final clean-up unless it runs already. The one task retries,
        backing off, until it is done: a failing clean-up is never started again by the
        next observation, and `logs -f` ends only once it is done."""
        if job.id in self._finishing:
            return
        task = self._spawned.spawn(f"kube-finish-{job.name}", self._finish(job))
        self._finishing[job.id] = task
        task.add_done_callback(functools.partial(self._finished, job.id))

    def _finished(self, job_id: str, _: asyncio.Task[None]) -> None:
        self._finishing.pop(job_id, None)
        self._keeping = {key for key in self._keeping if key[0] != job_id}

    async def _finish(self, job: JobRecord) -> None:
        """The job is final: keep its logs, then delete its objects; again, backing off,
        while that fails (a restart's sweep finishes it otherwise)."""
        failures = 0
        while True:
            try:
                await self._keep_all(job)
                await self._delete(job, grace_seconds=None)
                break
            except Exception as exc:  # the API server's or the store's failure: tried again here
                failures += 1
                delay = backoff(failures, self._settings.max_backoff_seconds)
                log.warning(
                    "kube_cleanup_failed",
                    job=job.name,
                    error=str(exc) or type(exc).__name__,
                    retry_in=round(delay, 2),
                    exc_info=not isinstance(exc, KubeError),  # an API refusal needs no traceback
                )
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
        names = [w.name for w in planned_workers(job.spec)]
        wanted = [n for n in names if _asked_for(n, query)]
        position = _decode_position(query.cursor, names) if query.cursor else {}
        first = True
        while True:
            final = await self._final(job)  # decided before reading: nothing after it is missed
            kept = {(k.worker, k.attempt): k.text for k in await self._store.list_kept_logs(job.id)}
            _, _, pods = self._objects(job)
            live = attempts_of(pods)
            for worker in wanted:
                batch = await self._read_worker(worker, kept, live.get(worker, []), position, final)
                batch = _tail(batch, query) if first else batch
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
        worker: str,
        kept: dict[tuple[str, str], str],
        live: list[Attempt],
        position: dict[str, tuple[str, int]],
        final: bool,
    ) -> list[LogLine]:
        """The worker's lines after its position, attempt by attempt: kept text where the
        attempt was kept, the pod's log where it is still live."""
        attempts: dict[str, Attempt | None] = {key: None for (w, key) in kept if w == worker}
        attempts.update({a.key: a for a in live})
        done_key, done_lines = position.get(worker, ("", 0))
        lines: list[LogLine] = []
        for key in sorted(k for k in attempts if k >= done_key):
            attempt = attempts[key]
            ended = attempt is None or attempt.terminated is not None or final
            rows = _whole_lines(await self._attempt_text(worker, key, attempt, kept), ended)
            skip = done_lines if key == done_key else 0
            for number, row in enumerate(rows[skip:], start=skip + 1):
                position[worker] = (key, number)
                lines.append(LogLine(worker, row, _encode_position(position)))
            if key != done_key and not rows:
                position[worker] = (key, 0)
        return lines

    async def _attempt_text(
        self, worker: str, key: str, attempt: Attempt | None, kept: dict[tuple[str, str], str]
    ) -> str:
        """An attempt's log: the kept copy once it was kept and is not running, else the
        pod's (the kept copy again when the API server will not give it)."""
        if attempt is None or (not attempt.running and (worker, key) in kept):
            return kept.get((worker, key), "")
        try:
            return await self.kube.log(
                attempt.namespace, attempt.pod, attempt.container, previous=attempt.previous
            )
        except KubeError:
            return kept.get((worker, key), "")

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


def _refusal_of(message: str) -> Refusal | None:
    """What a FailedCreate Event of the trainers' Job means for the job: Pod Security
    admission refusing its pods fails it (`lasting`), the namespace's quota makes it wait;
    any other (a ServiceAccount not made yet in a new namespace) passes by itself."""
    if "violates PodSecurity" in message:
        return Refusal(f"Kubernetes refuses its pods (Pod Security admission): {message}", lasting=True)
    if "quota" in message:
        return Refusal(f"the namespace's quota refuses its pods: {message}")
    return None


def _refused(exc: KubeError) -> str:
    """A refused create as the job's reason. RBAC's refusal (`User "..." cannot create
    resource ...`) is the operator's to mend: the service's account lacks a right of the
    chart's. The job fails rather than waits: nothing but a fixed installation lets it
    start, and a waiting job would hold the head of the start queue meanwhile."""
    words = f"Kubernetes refused the job: {exc}"
    if isinstance(exc, Forbidden) and _RBAC_REFUSAL.search(str(exc)):
        words += (
            " (the jobs service's account lacks this right: an operator must grant it the rights "
            "that charts/paddlecloud gives)"
        )
    return words


def _asked_for(worker: str, query: LogQuery) -> bool:
    """Whether a log query asks for this worker's lines (by name, and by role)."""
    role = worker.split("-", 1)[0].upper()
    return (not query.workers or worker in query.workers) and (not query.roles or role in query.roles)


def _tail(batch: list[LogLine], query: LogQuery) -> list[LogLine]:
    """A worker's first batch as `-n N` asks: its last N lines (none for 0); all of them
    without `-n`, or when the reader resumes from a cursor."""
    if query.tail is None or query.cursor is not None:
        return batch
    return batch[-query.tail :] if query.tail else []


def _whole_lines(text: str, ended: bool) -> list[str]:
    """A log's lines; while its container runs, the last line without its newline is left
    for next time, when it comes whole."""
    rows = text.split("\n")
    if rows and rows[-1] == "":
        rows.pop()
    elif rows and not ended:
        rows.pop()
    return rows


# Cursors --------------------------------------------------------------------------------
def _stopped_events(spec: JobSpec, reported: set[str], when: str) -> list[ObservedEvent]:
    """One `WorkerStopped` per parameter server of a job that succeeded, as on the local
    backend: the platform stops them (deleting their StatefulSet) once every trainer exited 0."""
    events = []
    for index in range(spec.pservers):
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
