"""The kubernetes jobs backend: the five calls of backend.py on a cluster.

- `start` makes the user's namespace ready (tenancy: quota, limits, network policy),
  then creates the job's owner ConfigMap and the objects it owns (manifests.py).
- Ownership: everything made carries this installation's release label, and only what
  carries it is watched, adopted, swept or deleted. Per user, the service's rights in a
  namespace come from the RoleBinding it makes there right after the namespace; a
  namespace of that name it did not make is left alone, and the job waits saying why.
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
  with the live ones, positioned by the kubelet's timestamps (logs.py), so a follower
  resumes across the switch from live to kept and across the kubelet's log rotation; a
  follower streams each running attempt (`follow=true`) rather than reading it again.

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
from collections.abc import AsyncGenerator, Callable, Coroutine, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import structlog

from paddlecloud.common.config import Config, ViewersSection
from paddlecloud.common.kube import Conflict, Forbidden, Kube, KubeError, NotFound, Unavailable
from paddlecloud.common.quantity import parse_bytes, parse_cpu_milli
from paddlecloud.common.store import Job, KeptLog, Quota, Store
from paddlecloud.common.store.models import SUCCEEDED, TERMINAL_STATES
from paddlecloud.common.tasks import Spawned, backoff, restarting
from paddlecloud.common.volume import PfsPath

from ..backend import (
    Backend,
    JobUsage,
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
from ..errors import ViewerFailed, ViewerNotOffered
from ..exits import WORKER_STOPPED
from ..records import JobRecord
from ..spec import JobSpec
from ..viewers import Upstream
from . import logs as kubelogs
from . import manifests
from . import usage as kubeusage
from . import viewer as kubeviewer
from .cache import Fleet, Informer, KindView
from .judge import CREATE_FAILED, VOLUME_FAILED, Observed, Recorded, Rules, exit_words, iso, judge
from .names import (
    ANNOTATION_USER,
    LABEL_JOB_ID,
    LABEL_RELEASE,
    LABEL_VIEWER_OF,
    MANAGED_BY,
    MANAGER,
    QUOTA_NAME,
    is_ours,
    managed_selector,
    namespace_for,
    owner_name,
    pserver_name,
    release_label,
)
from .pods import Attempt, attempts_of, main_status, worker_of
from .pods import meta as _meta
from .pods import status as _status

log = structlog.get_logger("paddlecloud.jobs.kube")

KINDS = ("ConfigMap", "StatefulSet", "Job", "Pod")
# How long a namespace's new RoleBinding may take to reach the API server's RBAC
# authorizer (it reads bindings from a watch cache) before a 403 there counts.
BINDING_SETTLE_SECONDS = 5.0
# Kubernetes' StatusCause of a create refused in a namespace that is being deleted.
NAMESPACE_TERMINATING = "NamespaceTerminating"
# Kinds whose spec cannot change once made: `_apply` brings only their labels along.
_FIXED_SPEC = frozenset({"PersistentVolume", "PersistentVolumeClaim"})
# How RBAC's authorizer words a refusal (k8s.io/apiserver's forbiddenMessage).
_RBAC_REFUSAL = re.compile(r'User ".*" cannot [a-z]+ resource "')
# How often a namespace's Warning Events are read, at most, while a job of it waits
# (common.kuberefusal.refusal_in: quota, Pod Security, LimitRange, a missing ServiceAccount, a mount).
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
        # Each kind's cache over the namespaces watched (KindView), and in per-user mode
        # the Namespace informer that says which those are.
        self._informers: dict[str, KindView | Informer] = {}
        self._fleet: Fleet | None = None
        self._preparing: set[str] = set()  # namespaces being made: watched once their rights are
        # The service's own ServiceAccount (namespace, name), the subject of the tenant
        # RoleBindings; None once asked and the credentials are not a ServiceAccount's.
        self._account: tuple[str, str] | bool | None = False
        self._tasks: list[asyncio.Task[None]] = []
        self._tenancy: dict[str, Quota | None] = {}  # namespace → the quota it was given
        self._users: dict[str, str] = {}  # namespace → user, for the quota sync
        self._kept: dict[str, dict[tuple[str, str], bool]] = {}  # job id → (worker, attempt) → whole
        self._finishing: dict[str, asyncio.Task[None]] = {}  # job id → its final clean-up
        # namespace → (when its Warning Events were last asked for, those the judge reads):
        # one list per namespace however many of its jobs wait, not one per job or object.
        self._warnings: dict[str, tuple[float, tuple[dict[str, Any], ...]]] = {}
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
        """Watch this release's objects: in shared mode in the one namespace; per user in
        each namespace of this release (a Namespace informer on the release's labels adds
        and drops them), as the service may list and watch nothing cluster-wide but them."""
        self._kube = await Kube.connect(self._settings)
        selector = managed_selector(self._settings.release)
        namespaces = None
        if not self._shared():
            namespaces = Informer(
                self._kube,
                "Namespace",
                None,
                selector,
                max_backoff=self._settings.max_backoff_seconds,
                on_change=self._namespace_changed,
            )
        self._fleet = Fleet(
            self._kube,
            KINDS,
            selector,
            max_backoff=self._settings.max_backoff_seconds,
            start=self._supervised,
            on_change={"Pod": self._changed},
            known=namespaces.synced if namespaces is not None else None,
        )
        self._informers = dict(self._fleet.views)
        if namespaces is None:
            self._fleet.add(self._settings.namespace)
        else:
            self._informers["Namespace"] = namespaces
            self._keep_running("kube-watch-Namespace", namespaces.run)
        self._keep_running("kube-quota-sync", self._sync_quotas)
        try:
            await asyncio.wait_for(self._synced(), self._settings.request_timeout_seconds)
        except TimeoutError:
            log.warning("kubernetes_not_synced", host=self._kube.host, error=self._api_error())
        log.info("kubernetes_backend_open", host=self._kube.host, mode=self._settings.namespace_mode)

    def _namespace_changed(self, kind: str, namespace: dict[str, Any]) -> None:
        """A namespace of this release came or went: watch its objects, or stop. One being
        made is watched once its RoleBinding grants the rights (`_ensure_tenancy`)."""
        name = str(_meta(namespace).get("name") or "")
        if self._fleet is None or not name:
            return
        if kind == "DELETED":
            self._fleet.discard(name)
        elif name not in self._preparing:
            self._fleet.add(name)

    def _supervised(self, name: str, start: Callable[[], Coroutine[Any, Any, None]]) -> asyncio.Task[None]:
        return asyncio.create_task(
            restarting(f"{name}-run", start, max_backoff=self._settings.max_backoff_seconds), name=name
        )

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
        if self._fleet is not None:
            await asyncio.gather(*self._fleet.close(), return_exceptions=True)
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
            if not gone and isinstance(exc, Forbidden) and not self._shared():
                # The namespace controller deletes the service's RoleBinding with the rest
                # of a Terminating namespace: RBAC refuses before the namespace would.
                gone = await self._going(plan.namespace)
            if gone and not self._shared():
                raise NotYet(self._terminating(plan.namespace), holds_queue=False) from exc
            await self._undo(plan, uid)
            raise StartFailed(_refused(exc)) from exc
        except StartFailed:
            await self._undo(plan, uid)
            raise
        log.info("kube_job_created", job=launch.job.name, owner=launch.job.owner, namespace=plan.namespace)
        return {"namespace": plan.namespace, "owner_uid": uid}

    async def _going(self, namespace: str) -> bool:
        """Whether `namespace` is being deleted, or is gone (the API server says)."""
        try:
            found = await self.kube.get("Namespace", None, namespace)
        except KubeError:
            return False
        return found is None or (found.get("status") or {}).get("phase") == "Terminating"

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
        if owner is None or not self._is_job(owner, job.id):
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
        if not self._is_job(existing, job_id):
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

    def _is_job(self, obj: dict[str, Any], job_id: str) -> bool:
        """Whether `obj` was made for the job `job_id` by this release."""
        return (_meta(obj).get("labels") or {}).get(LABEL_JOB_ID) == job_id and is_ours(
            obj, self._settings.release
        )

    async def _ensure_tenancy(self, user: str) -> None:
        """The user's namespace with its quota, limits and network policy (once per
        process per namespace; a quota change is applied by _sync_quotas). Per user, the
        namespace must be this release's (`_own_namespace`), and the service's rights in it
        come from a RoleBinding it makes there first (`_bind_tenant`)."""
        namespace = self.namespace(user)
        stored = await self._store.get_user(user)
        quota = stored.quota if stored is not None else Quota()
        if self._tenancy.get(namespace, "unset") == quota:
            return
        objects = manifests.tenancy_objects(user, quota, self._settings)
        if self._shared():
            for manifest in objects:
                await self._apply(manifest)
        else:
            self._preparing.add(namespace)
            try:
                await self._own_namespace(objects[0])
                bound = await self._bind_tenant(namespace)
                for number, manifest in enumerate(objects[1:]):
                    await self._apply_settling(manifest, settle=bound and number == 0)
            finally:
                self._preparing.discard(namespace)
            if self._fleet is not None:
                self._fleet.add(namespace)
        self._tenancy[namespace] = quota
        self._users[namespace] = user

    async def _own_namespace(self, manifest: dict[str, Any]) -> None:
        """Create the user's namespace, or bring its labels to `manifest` when this release
        made it. One it did not make (another release's, a team's that happens to be named
        `<prefix><user>`) is left exactly as it is, and the job waits, saying why."""
        name = manifest["metadata"]["name"]
        try:
            await self.kube.create(manifest)
            return
        except Conflict:
            pass
        existing = await self.kube.get("Namespace", None, name)
        if existing is None:  # deleted in between: made again
            await self.kube.create(manifest)
            return
        if not is_ours(existing, self._settings.release):
            raise NotYet(self._not_ours(name, existing), holds_queue=False)
        patch = {"metadata": {"labels": manifest["metadata"].get("labels") or {}}}
        await self.kube.patch("Namespace", None, name, patch)

    def _not_ours(self, namespace: str, existing: dict[str, Any]) -> str:
        self._tenancy.pop(namespace, None)
        labels = _meta(existing).get("labels") or {}
        other = labels.get(LABEL_RELEASE)
        if other:
            whose = f"another PaddleCloud installation's (release {other})"
        elif labels.get(MANAGED_BY) == MANAGER:
            whose = (
                "a PaddleCloud namespace without a release label (an earlier version's: "
                "label it, docs/kubernetes.md)"
            )
        else:
            whose = "not PaddleCloud's"
        return (
            f"the namespace {namespace} exists and was not made by this installation "
            f"(release {release_label(self._settings.release)}): it is {whose}, and nothing in it is "
            "changed. An administrator can rename the user, change jobs.kubernetes.namespacePrefix, "
            "or remove that namespace; the job starts once the name is free"
        )

    async def _bind_tenant(self, namespace: str) -> bool:
        """Grant the service its rights in `namespace`: a RoleBinding there to the tenant
        ClusterRole, for its own ServiceAccount. False when its credentials are no
        ServiceAccount's (an administrator's kubeconfig on one machine): nothing to bind."""
        account = await self._own_account()
        if account is None:
            return False
        try:
            await self.kube.create(manifests.tenant_binding(namespace, account, self._settings))
        except Conflict:
            pass  # made by an earlier try: its roleRef and subject cannot have changed (the VAP)
        return True

    async def _own_account(self) -> tuple[str, str] | None:
        if self._account is False:
            if self._settings.service_account:
                namespace, _, name = self._settings.service_account.partition("/")
                self._account = (namespace, name)
            else:
                user = await self.kube.whoami()
                parts = user.split(":")
                if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"]:
                    self._account = (parts[2], parts[3])
                else:
                    log.warning("kube_not_a_service_account", user=user)
                    self._account = None
        return self._account if isinstance(self._account, tuple) else None

    async def _apply_settling(self, manifest: dict[str, Any], *, settle: bool) -> None:
        """`_apply`; right after a RoleBinding was made, RBAC's 403 is tried again for a
        few seconds, until the authorizer has seen the binding."""
        deadline = time.monotonic() + BINDING_SETTLE_SECONDS
        tries = 0
        while True:
            try:
                await self._apply(manifest)
                return
            except Forbidden as exc:
                tries += 1
                if not settle or time.monotonic() > deadline or not _RBAC_REFUSAL.search(str(exc)):
                    raise
                await asyncio.sleep(min(0.05 * 2**tries, 1.0))

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
            # A volume's and a claim's spec is fixed once made (and theirs is the same
            # for the same user): only their labels are brought to the manifest.
            if field in manifest and manifest["kind"] not in _FIXED_SPEC:
                patch[field] = manifest[field]
        found = await self.kube.patch(manifest["kind"], meta.get("namespace"), meta["name"], patch)
        if manifest["kind"] == "PersistentVolume":
            await self._rebind(found)

    async def _rebind(self, volume: dict[str, Any]) -> None:
        """A user's volume whose claim went without the user (their namespace deleted by
        hand) still names the old claim's uid, and would never bind the new claim: it is
        pointed at the claim by name alone again, and binds it (the data is the same)."""
        ref = (volume.get("spec") or {}).get("claimRef") or {}
        if not ref.get("uid"):
            return
        claim = await self.kube.get("PersistentVolumeClaim", ref.get("namespace"), str(ref.get("name")))
        if claim is not None and _meta(claim).get("uid") == ref["uid"]:
            return
        unbound = {"spec": {"claimRef": {"uid": None, "resourceVersion": None}}}
        await self.kube.patch("PersistentVolume", None, _meta(volume)["name"], unbound)

    async def _sync_quotas(self) -> None:
        """Bring each known namespace's ResourceQuota to its user's current quota."""
        while True:
            await asyncio.sleep(self._settings.quota_sync_seconds)
            for namespace, user in list(self._users.items()):
                if not self._shared() and (self._fleet is None or namespace not in self._fleet.informers):
                    continue  # not (or no longer) this release's namespace: never touched
                try:
                    stored = await self._store.get_user(user)
                    quota = stored.quota if stored is not None else Quota()
                    if self._tenancy.get(namespace) != quota and not self._shared():
                        manifest = manifests.resource_quota(namespace, user, quota, self._settings.release)
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

    def _pservers(self, job: JobRecord) -> dict[str, Any] | None:
        found = self._informers["StatefulSet"].of_job(job.id)
        return found[0] if found else None

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
        namespace = job.backend.get("namespace") or self.namespace(job.owner)
        warnings = self._warnings.get(namespace, (0.0, ()))[1]
        observed = Observed(owner, trainers, pods, self._pservers(job), warnings)
        recorded = Recorded(job.state, job.reason, job.started_at.isoformat() if job.started_at else None)
        verdict = judge(spec, recorded, observed, self._rules, datetime.now(UTC))
        if verdict.read_events:
            self._check_warnings(namespace)
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

    def _check_warnings(self, namespace: str) -> None:
        """Read the namespace's Warning Events in the background, at most every
        EVENT_CHECK_SECONDS while a job of it waits (the judge matches them to its objects)."""
        checked, known = self._warnings.get(namespace, (0.0, ()))
        if time.monotonic() - checked > EVENT_CHECK_SECONDS:
            self._warnings[namespace] = (time.monotonic(), known)
            self._spawned.spawn(f"kube-events-{namespace}", self._read_warnings(namespace))

    async def _read_warnings(self, namespace: str) -> None:
        """One list of the namespace's Warning Events, filtered by type on the API server;
        only the reasons the judge reads are kept. A failure keeps what was read before."""
        try:
            answer = await self.kube.list("Event", namespace, fields="type=Warning")
        except KubeError:
            return
        kept = tuple(
            e for e in answer.get("items") or [] if e.get("reason") in (CREATE_FAILED, *VOLUME_FAILED)
        )
        self._warnings[namespace] = (time.monotonic(), kept)

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

    # -- resource use ------------------------------------------------------------------

    async def usage(self, jobs: Sequence[JobRecord]) -> dict[str, JobUsage]:
        """Each job's PodMetrics (usage.py), one list per job by its id's label. A cluster
        that does not serve the group (404) or lets the service not read it (403) is said
        once for all jobs of the tick; an API server away leaves the tick without figures."""
        result: dict[str, JobUsage] = {}
        refused: JobUsage | None = None
        for job in jobs:
            _, _, pods = self._objects(job)
            names = {str(_meta(pod).get("name")): who[0] for pod in pods if (who := worker_of(pod))}
            if refused is not None or not names:
                result[job.id] = refused or JobUsage()
                continue
            namespace = self.namespace(job.owner)
            try:
                body = await self.kube.list("PodMetrics", namespace, selector=f"{LABEL_JOB_ID}={job.id}")
            except NotFound:
                refused = JobUsage(available=False, reason=kubeusage.NOT_SERVED)
            except Forbidden:
                refused = JobUsage(available=False, reason=kubeusage.NOT_ALLOWED)
            except KubeError as exc:
                log.debug("pod_metrics_unread", job=job.name, error=str(exc))
                result[job.id] = JobUsage()
                continue
            else:
                found = kubeusage.worker_usage(body.get("items") or [], names, planned_workers(job.spec))
                result[job.id] = JobUsage(tuple(found))
                self.usage_unavailable = None
                continue
            result[job.id] = refused
            self.usage_unavailable = refused.reason
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
        # With the kubelet's timestamps: readers are positioned by them (kubelogs.py).
        text = await self.kube.log(
            attempt.namespace, attempt.pod, attempt.container, previous=attempt.previous, timestamps=True
        )
        text = kubelogs.kept_text(text, self._settings.kept_log_bytes)
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
        """Each asked-for worker's lines after the reader's position (kubelogs.py): what there
        is now, worker by worker; then, following, each worker's running attempt streamed
        as it is written, until the job's end."""
        names = [w.name for w in planned_workers(job.spec)]
        wanted = [n for n in names if _asked_for(n, query)]
        positions = kubelogs.decode(query.cursor, names) if query.cursor else {}
        readers = {w: kubelogs.WorkerLog(self.kube, w, positions.get(w)) for w in wanted}
        look = _Looker(functools.partial(self._log_sources, job), LOG_POLL_SECONDS)
        sources = await look()
        # `-n N`: each worker's last N lines (none for 0); all of them when resuming.
        tail = query.tail if query.cursor is None else None
        for worker in wanted:
            # A follower's running attempts come through their streams (kubelogs.WorkerLog.read).
            batch = await readers[worker].read(sources, tail, to_stream=query.follow)
            if batch:
                yield _log_lines(worker, batch, positions)
        if sources.final or not query.follow:
            return
        async for lines in self._follow_logs(job, readers, look, positions):
            yield lines

    async def _follow_logs(
        self,
        job: JobRecord,
        readers: dict[str, kubelogs.WorkerLog],
        look: _Looker,
        positions: dict[str, kubelogs.Position],
    ) -> AsyncGenerator[list[LogLine], None]:
        """Every reader followed in a task of its own to the job's end, their lines as they come."""
        # Bounded, so a slow reader holds the streams back rather than filling memory.
        queue: asyncio.Queue[tuple[str, list[tuple[str, kubelogs.Position]] | BaseException | None]]
        queue = asyncio.Queue(maxsize=64)

        async def emit(worker: str, batch: list[tuple[str, kubelogs.Position]]) -> None:
            await queue.put((worker, batch))

        async def follow(worker: str) -> None:
            try:
                await kubelogs.follow_worker(readers[worker], look, emit, LOG_POLL_SECONDS)
                await queue.put((worker, None))
            except Exception as exc:  # raised by the reader, below
                await queue.put((worker, exc))

        tasks = [asyncio.create_task(follow(w), name=f"kube-logs-{job.name}-{w}") for w in readers]
        try:
            running = len(tasks)
            while running:
                worker, item = await queue.get()
                if item is None:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield _log_lines(worker, item, positions)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _log_sources(self, job: JobRecord) -> kubelogs.Sources:
        final = await self._final(job)  # decided before reading: nothing after it is missed
        kept = {(k.worker, k.attempt): k.text for k in await self._store.list_kept_logs(job.id)}
        _, _, pods = self._objects(job)
        return kubelogs.Sources(final, kept, attempts_of(pods))

    async def _final(self, job: JobRecord) -> bool:
        current = await self._store.get_job_by_id(job.id)
        return current is None or (current.state in TERMINAL_STATES and job.id not in self._finishing)

    # -- stop and remove ---------------------------------------------------------------

    async def stop(self, job: JobRecord, grace_seconds: float, reason: str | None = None) -> None:
        # Nothing here records the end: the service records KILLED with `reason` itself.
        # A job that only waited (its backend record says why) made nothing: its user's
        # namespace may not even be this release's to touch.
        if not _created(job):
            return
        self._stopped.add(job.id)
        try:
            await self._keep_all(job)
        except KubeError as exc:
            log.warning("logs_not_kept_before_kill", job=job.name, error=str(exc))
        await self._delete(job, grace_seconds=grace_seconds)

    def forget(self, job: JobRecord) -> None:
        self._stopped.discard(job.id)
        if job.id not in self._finishing:  # else _finish drops it when it is done
            self._kept.pop(job.id, None)

    async def remove(self, job: JobRecord) -> None:
        if _created(job):
            await self._delete(job, grace_seconds=None)
        try:
            await self._delete_viewers(self.namespace(job.owner), f"{LABEL_VIEWER_OF}={job.id}")
        except KubeError as exc:
            # A leader's sweep after a restart deletes what is left.
            log.warning("kube_viewers_not_deleted", job=job.name, error=str(exc))
        self._kept.pop(job.id, None)
        self._finishing.pop(job.id, None)

    async def forget_user(self, user: str) -> None:
        """A deleted user's namespace goes, with its quota and everything left in it, when
        this release made it; one it did not make is never deleted. The user's
        PersistentVolume objects go too (they would stay Released, bound to claims that are
        gone, and a user of that name made again could not have them): never their data,
        which a static ceph-csi volume's deletion leaves (Retain), and pfs keeps or
        archives (DELETE /api/v1/users)."""
        namespace = self.namespace(user)
        self._tenancy.pop(namespace, None)
        self._users.pop(namespace, None)
        self._warnings.pop(namespace, None)
        if self._shared():
            return
        existing = await self.kube.get("Namespace", None, namespace)
        if existing is not None and is_ours(existing, self._settings.release):
            await self.kube.delete("Namespace", None, namespace, uid=_meta(existing).get("uid"))
        for volume in manifests.user_volumes(user, self._settings):
            if volume["kind"] != "PersistentVolume":
                continue
            name = volume["metadata"]["name"]
            found = await self.kube.get("PersistentVolume", None, name)
            if found is not None and is_ours(found, self._settings.release):
                # Bound until the namespace's deletion removes its claim: the API server
                # marks it now and removes it then (kubernetes.io/pv-protection).
                await self.kube.delete("PersistentVolume", None, name, uid=_meta(found).get("uid"))

    async def sweep(self, keep: set[str]) -> int:
        """Delete the objects of every job not in `keep` (active job ids): leftovers of a
        job that ended while the service was down, or of one the store forgot. Their logs
        are kept first when the store still has the job. Every viewer goes too: the
        service that started them is gone (a viewer is started again on the next request)."""
        swept = 0
        for owner in self._informers["ConfigMap"].all():
            meta = _meta(owner)
            if (meta.get("labels") or {}).get(LABEL_VIEWER_OF) and is_ours(owner, self._settings.release):
                try:
                    await self.kube.delete(
                        "ConfigMap", meta.get("namespace"), str(meta.get("name")), uid=meta.get("uid")
                    )
                except KubeError as exc:
                    log.warning("sweep_failed", owner=meta.get("name"), error=str(exc))
        for owner in self._informers["ConfigMap"].all():
            job_id = (_meta(owner).get("labels") or {}).get(LABEL_JOB_ID)
            if not job_id or job_id in keep or not is_ours(owner, self._settings.release):
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

    # -- viewers -----------------------------------------------------------------------

    def viewer_runner(self, kind: str, config: ViewersSection) -> str:
        """The image of a viewer's pod (`jobs.viewers.image`), for either kind."""
        if config.image is None:
            raise ViewerNotOffered(
                f"{kind} is not offered on this platform: the operator has not set jobs.viewers.image, "
                "the image of a viewer's pod on Kubernetes (docs/configuration.md)"
            )
        return config.image

    async def start_viewer(
        self, job: JobRecord, kind: str, output: PfsPath, prefix: str, python: str
    ) -> Upstream:
        """A pod in the job's user's namespace (kube/viewer.py), with `python` as its image."""
        account = self._settings.service_account
        plan = manifests.ViewerPlan(
            job_name=job.name,
            job_id=job.id,
            owner=job.owner,
            datacenter=output.datacenter,
            kind=kind,
            output=output.text,
            prefix=prefix,
            image=python,
            settings=self._settings,
            namespace=self.namespace(job.owner),
            jobs_namespace=account.split("/", 1)[0] if account else None,
        )
        try:
            # A job that never started (refused at submit) has no namespace yet.
            await self._ensure_tenancy(job.owner)
        except KubeError as exc:
            raise ViewerFailed(f"the namespace {plan.namespace} cannot be made ready: {exc}") from None
        timeout = self._config.jobs.viewers.start_timeout_seconds
        return await kubeviewer.start(self.kube, plan, timeout, self._informers["Pod"].all)

    async def _delete_viewers(self, namespace: str, selector: str) -> None:
        """Delete the viewers `selector` picks (their ConfigMaps own the rest) and their pods."""
        selector = f"{managed_selector(self._settings.release)},{selector}"
        for kind in ("ConfigMap", "Pod"):
            for obj in (await self.kube.list(kind, namespace, selector=selector)).get("items") or ():
                meta = _meta(obj)
                await self.kube.delete(kind, namespace, str(meta.get("name")), uid=meta.get("uid"))


def _created(job: JobRecord) -> bool:
    """Whether `start` made the job's objects (its record names their namespace), rather
    than the job only waited or was never started."""
    return bool(job.backend) and "waiting" not in job.backend


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


def _log_lines(
    worker: str, batch: list[tuple[str, kubelogs.Position]], positions: dict[str, kubelogs.Position]
) -> list[LogLine]:
    """A worker's lines, each with the cursor of every worker's position after it."""
    lines = []
    for text, position in batch:
        positions[worker] = position
        lines.append(LogLine(worker, text, kubelogs.encode(positions)))
    return lines


class _Looker:
    """What a job's log readers see (kubelogs.Sources), read at most once per `period`
    for all of them: one store query and one cache read per poll, not one per worker."""

    def __init__(self, read: Callable[[], Coroutine[Any, Any, kubelogs.Sources]], period: float) -> None:
        self._read, self._period = read, period
        self._lock = asyncio.Lock()
        self._value: kubelogs.Sources | None = None
        self._at = 0.0

    async def __call__(self) -> kubelogs.Sources:
        async with self._lock:
            if self._value is None or time.monotonic() - self._at >= self._period:
                self._value = await self._read()
                self._at = time.monotonic()
            return self._value


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


# Events: the set of what was reported, as sorted tags, opaque to clients: base64url JSON.
# Logs' cursors are kubelogs.py's.


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
