"""The fake's controllers: Indexed batch/v1 Jobs, apps/v1 StatefulSets and ResourceQuota
usage, reconciled level-triggered on every change of what they watch and every `resync`."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
from collections.abc import Callable, Iterable

from kube_fake import quota
from kube_fake.kubelet import COMPLETION_INDEX, POD_INDEX, pod_index
from kube_fake.resources import (
    JOBS,
    PODS,
    QUOTAS,
    STATEFULSETS,
    KubeError,
    Obj,
    condition,
    controller_uid,
    owner_reference,
    timestamp,
)
from kube_fake.store import Change, Store

JOB_NAME = "batch.kubernetes.io/job-name"
INDEX_FAILURES = "batch.kubernetes.io/job-index-failure-count"
INDEX_IGNORED = "batch.kubernetes.io/job-index-ignored-failure-count"
STATEFULSET_POD_NAME = "statefulset.kubernetes.io/pod-name"
REVISION = "controller-revision-hash"
_WATCHED = {PODS.plural, JOBS.plural, STATEFULSETS.plural, QUOTAS.plural}


def compress_indexes(indexes: Iterable[int]) -> str:
    """Indexes as a Job's status lists them: `0-2,4`."""
    ranges: list[list[int]] = []
    for i in sorted(indexes):
        if ranges and i == ranges[-1][1] + 1:
            ranges[-1][1] = i
        else:
            ranges.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def _phase(pod: Obj) -> str:
    return str(pod.get("status", {}).get("phase", "Pending"))


def _ready(pod: Obj) -> bool:
    cond = condition(pod, "Ready")
    return cond is not None and cond["status"] == "True"


def _set_conditions(status: Obj, reason: str, message: str, *kinds: str) -> None:
    when = timestamp()
    status.setdefault("conditions", []).extend(
        {
            "type": kind,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastProbeTime": when,
            "lastTransitionTime": when,
        }
        for kind in kinds
    )


class Controllers:
    """The Job, StatefulSet and quota controllers, in one loop."""

    def __init__(self, store: Store, resync: float, report: Callable[[BaseException], None]) -> None:
        self.store = store
        self.resync = resync
        self._report = report
        self._dirty = asyncio.Event()
        # After a refused create, an owner's next try waits (doubling, capped), as the real
        # controllers back off, so a quota refusal is retried without spinning.
        self._retry: dict[str, tuple[float, float]] = {}  # owner uid: (not before, delay)
        store.subscribe(self._on_change)

    def _on_change(self, change: Change) -> None:
        if change.resource.plural in _WATCHED:
            self._dirty.set()

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), self.resync)
            self._dirty.clear()
            try:
                self.reconcile()
            except Exception as e:  # a bug in the fake: reported, and the loop goes on
                self._report(e)

    def reconcile(self) -> None:
        for job in self.store.list(JOBS):
            self._job(job)
        for sts in self.store.list(STATEFULSETS):
            self._statefulset(sts)
        for q in self.store.list(QUOTAS):
            self._quota(q)

    # Creating pods, with back-off after a refusal.
    def _may_create(self, owner: Obj) -> bool:
        not_before, _ = self._retry.get(owner["metadata"]["uid"], (0.0, 0.0))
        return asyncio.get_running_loop().time() >= not_before

    def _create_pod(self, owner: Obj, pod: Obj, refused: Callable[[str, str], str]) -> bool:
        uid, namespace = owner["metadata"]["uid"], owner["metadata"]["namespace"]
        try:
            created = self.store.create(PODS, namespace, pod)
        except KubeError as e:
            _, delay = self._retry.get(uid, (0.0, 0.05))
            delay = min(delay * 2, 1.0)
            self._retry[uid] = (asyncio.get_running_loop().time() + delay, delay)
            name = pod["metadata"].get("name") or pod["metadata"]["generateName"]
            self.store.record_event(
                owner, "Warning", "FailedCreate", refused(name, e.message), _component(owner)
            )
            return False
        self._retry.pop(uid, None)
        name = created["metadata"]["name"]
        message = (
            f"Created pod: {name}"
            if owner["kind"] == "Job"
            else f"create Pod {name} in StatefulSet {owner['metadata']['name']} successful"
        )
        self.store.record_event(owner, "Normal", "SuccessfulCreate", message, _component(owner))
        return True

    def _owned_pods(self, owner: Obj) -> list[Obj]:
        uid = owner["metadata"]["uid"]
        pods = [p for p in self.store.list(PODS, owner["metadata"]["namespace"]) if controller_uid(p) == uid]
        return sorted(pods, key=self.store.created)

    # Jobs.
    def _job(self, job: Obj) -> None:
        """One pass over an Indexed Job: count what its pods did, decide whether it is done
        (and how), else create a pod for every index that needs one."""
        status = job.get("status") or {}
        if any(condition(job, kind) for kind in ("Complete", "Failed")):
            return
        spec, meta = job["spec"], job["metadata"]
        per_index = spec.get("backoffLimitPerIndex")
        pods = self._owned_pods(job)
        active = [p for p in pods if _phase(p) not in ("Succeeded", "Failed")]
        succeeded = {pod_index(p) for p in pods if _phase(p) == "Succeeded"}
        failures: collections.Counter[int] = collections.Counter()
        ignored: collections.Counter[int] = collections.Counter()
        failed_indexes: set[int] = set()
        fail_job: str | None = None
        for pod in pods:
            if _phase(pod) != "Failed" or (index := pod_index(pod)) is None:
                continue
            action, matched = _failure_policy(spec.get("podFailurePolicy"), pod)
            if action == "Ignore":
                ignored[index] += 1
                continue
            failures[index] += 1
            if action == "FailJob" and fail_job is None:
                fail_job = f"{matched} matching FailJob rule at index {index}"
            if action == "FailIndex" or (per_index is not None and failures[index] > per_index):
                failed_indexes.add(index)
        failed_indexes -= succeeded
        completions = spec["completions"]

        new = copy.deepcopy(job)
        new_status = new.setdefault("status", {})
        new_status.setdefault("startTime", timestamp())
        failure: tuple[str, str] | None = None
        if fail_job:
            failure = ("PodFailurePolicy", fail_job)
        elif sum(failures.values()) > spec["backoffLimit"]:
            failure = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
        elif spec.get("maxFailedIndexes") is not None and len(failed_indexes) > spec["maxFailedIndexes"]:
            failure = (
                "MaxFailedIndexesExceeded",
                "Job has exceeded the specified maximal number of failed indexes",
            )
        elif len(succeeded) < completions and len(succeeded | failed_indexes) == completions:
            failure = ("FailedIndexes", "Job has failed indexes")

        if failure:
            # The real controller deletes the pods still running once the Job has failed.
            for pod in active:
                self.store.delete(PODS, meta["namespace"], pod["metadata"]["name"])
            active = []
            _set_conditions(new_status, *failure, "FailureTarget", "Failed")
            self.store.record_event(job, "Warning", failure[0], failure[1], "job-controller")
        elif len(succeeded) == completions:
            new_status["completionTime"] = timestamp()
            _set_conditions(
                new_status,
                "CompletionsReached",
                "Reached expected number of succeeded pods",
                "SuccessCriteriaMet",
                "Complete",
            )
            self.store.record_event(job, "Normal", "Completed", "Job completed", "job-controller")
        elif self._may_create(job):
            busy = {pod_index(p) for p in active}
            waiting = sorted(set(range(completions)) - succeeded - failed_indexes - busy)
            for index in waiting[: max(0, spec["parallelism"] - len(active))]:
                pod = _job_pod(job, index, failures[index], ignored[index])
                if not self._create_pod(job, pod, lambda name, why: f"Error creating: {why}"):
                    break
                active.append(pod)

        new_status.update(
            active=len(active),
            ready=sum(1 for p in active if _ready(p)),
            succeeded=len(succeeded),
            failed=sum(failures.values()),
            terminating=0,
        )
        for key, indexes in (("completedIndexes", succeeded), ("failedIndexes", failed_indexes)):
            if indexes:
                new_status[key] = compress_indexes(i for i in indexes if i is not None)
            else:
                new_status.pop(key, None)
        if new_status != status:
            self.store.commit(JOBS, job, new)

    # StatefulSets.
    def _statefulset(self, sts: Obj) -> None:
        """Pods `<name>-0` … `<name>-(replicas-1)`: a missing or finished one is (re)made, in
        order and each after the one before is Ready unless podManagementPolicy is Parallel;
        extra ones are deleted."""
        spec, meta = sts["spec"], sts["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        ordered = spec.get("podManagementPolicy") != "Parallel"
        pods = {p["metadata"]["name"]: p for p in self._owned_pods(sts)}
        for i in range(spec["replicas"]):
            pod = pods.get(f"{name}-{i}")
            if pod is None:
                if not self._may_create(sts):
                    break
                created = self._create_pod(
                    sts,
                    _statefulset_pod(sts, i),
                    lambda pod_name, why: f"create Pod {pod_name} in StatefulSet {name} failed error: {why}",
                )
                if not created or ordered:
                    break
            elif _phase(pod) in ("Succeeded", "Failed"):
                # A pod that cannot restart in place (evicted) is replaced, under the same name.
                self.store.delete(PODS, namespace, pod["metadata"]["name"])
                if ordered:
                    break
            elif ordered and not _ready(pod):
                break
        for pod in pods.values():
            if (pod_index(pod) or 0) >= spec["replicas"] and self.store.find(
                PODS, namespace, pod["metadata"]["name"]
            ):
                self.store.delete(PODS, namespace, pod["metadata"]["name"])

        current = self._owned_pods(sts)
        ready = sum(1 for p in current if _ready(p))
        new = copy.deepcopy(sts)
        new["status"] = {
            "observedGeneration": meta["generation"],
            "replicas": len(current),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "currentReplicas": len(current),
            "updatedReplicas": len(current),
            "currentRevision": _revision(sts),
            "updateRevision": _revision(sts),
            "collisionCount": 0,
        }
        if new["status"] != sts.get("status"):
            self.store.commit(STATEFULSETS, sts, new)

    # Quotas.
    def _quota(self, q: Obj) -> None:
        hard = (q.get("spec") or {}).get("hard") or {}
        used = quota.quota_used(self.store.list(PODS, q["metadata"]["namespace"]), hard)
        status = {
            "hard": dict(hard),
            "used": {name: quota.format_quantity(used[quota.canonical(name)], name) for name in hard},
        }
        if q.get("status") != status:
            self.store.commit(QUOTAS, q, {**q, "status": status})


def _component(owner: Obj) -> str:
    return "job-controller" if owner["kind"] == "Job" else "statefulset-controller"


def _failure_policy(policy: Obj | None, pod: Obj) -> tuple[str, str]:
    """The action of the first podFailurePolicy rule that a failed pod matches (Count when
    none does), and what matched, in the words of the real controller's messages."""
    where = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
    for rule in (policy or {}).get("rules") or ():
        for wanted in rule.get("onPodConditions") or ():
            got = condition(pod, wanted["type"])
            if got and got["status"] == wanted.get("status", "True"):
                return rule["action"], f"Pod {where} has condition {wanted['type']}"
        codes = rule.get("onExitCodes")
        if codes:
            for status in pod.get("status", {}).get("containerStatuses") or ():
                if codes.get("containerName") not in (None, status["name"]):
                    continue
                code = status["state"].get("terminated", {}).get("exitCode")
                # Containers that succeeded are left out of the check, with either operator.
                if code in (None, 0):
                    continue
                if (code in codes["values"]) == (codes["operator"] == "In"):
                    return rule[
                        "action"
                    ], f"Container {status['name']} for pod {where} failed with exit code {code}"
    return "Count", ""


def _job_pod(job: Obj, index: int, failures: int, ignored: int) -> Obj:
    """The pod of one index, as the real Job controller makes it."""
    template = copy.deepcopy(job["spec"]["template"])
    name = job["metadata"]["name"]
    meta = template.get("metadata") or {}
    labels = {**(meta.get("labels") or {}), COMPLETION_INDEX: str(index)}
    annotations = {**(meta.get("annotations") or {}), COMPLETION_INDEX: str(index)}
    if "backoffLimitPerIndex" in job["spec"]:
        annotations[INDEX_FAILURES] = str(failures)
        if ignored:
            annotations[INDEX_IGNORED] = str(ignored)
    spec = template["spec"]
    spec["hostname"] = f"{name}-{index}"
    index_env = {
        "name": "JOB_COMPLETION_INDEX",
        "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}},
    }
    for container in (*spec.get("initContainers", ()), *spec["containers"]):
        container["env"] = [*(container.get("env") or ()), index_env]
    return {
        "metadata": {
            "generateName": f"{name}-{index}-",
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner_reference(job, JOBS)],
        },
        "spec": spec,
    }


def _revision(sts: Obj) -> str:
    return f"{sts['metadata']['name']}-{sts['metadata']['uid'][:10].replace('-', '')}"


def _statefulset_pod(sts: Obj, index: int) -> Obj:
    template = copy.deepcopy(sts["spec"]["template"])
    name = f"{sts['metadata']['name']}-{index}"
    meta = template.get("metadata") or {}
    spec = template["spec"]
    spec["hostname"] = name
    if sts["spec"].get("serviceName"):
        spec["subdomain"] = sts["spec"]["serviceName"]
    labels = {
        **(meta.get("labels") or {}),
        STATEFULSET_POD_NAME: name,
        POD_INDEX: str(index),
        REVISION: _revision(sts),
    }
    return {
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": dict(meta.get("annotations") or {}),
            "ownerReferences": [owner_reference(sts, STATEFULSETS)],
        },
        "spec": spec,
    }
