"""Where a job on Kubernetes stands, judged from what the watch cache holds of it.

`judge` is a pure function: the job's typed spec, what the store last recorded, the
observed owner, Indexed Job and pods (plain dicts, as the API server sent them), the
rules from the settings and the time now go in; a `Verdict` (state, reason in words,
start and end times) comes out. The backend gathers the inputs and acts on the verdict
(keeping logs, deleting objects, reading Events); nothing here does I/O. The order of
the checks is the order of precedence: objects gone, the trainers' Job ended, evictions,
parameter servers failed past their restarts, a trainer running, and only then the
reasons a job still waits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from paddlecloud.common.kuberefusal import CREATE_FAILED, VOLUME_FAILED, Refusal, refusal_in
from paddlecloud.common.store.models import FAILED, PENDING, RUNNING, SUCCEEDED

from ..exits import describe_exit
from ..spec import JobSpec
from .pods import Attempt, attempts_of, condition, meta, status, worker_of

PULL_FAILURE = "cannot pull image"
_PULL_WAITING = ("ImagePullBackOff", "ErrImagePull", "InvalidImageName")


def iso(when: datetime) -> str:
    """A time as the API server writes one: UTC, milliseconds, `Z`."""
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Recorded:
    """What the store says of the job now: a job once RUNNING stays so between attempts."""

    state: str
    reason: str | None = None
    started_at: str | None = None


# Warning Events the judge reads (the backend lists the namespace's, `type=Warning`):
# the Job and StatefulSet controllers' FailedCreate (CREATE_FAILED), the kubelet's
# FailedMount and the attach/detach controller's FailedAttachVolume (VOLUME_FAILED); what
# each means is paddlecloud.common.kuberefusal.refusal_in, which the kaniko builder shares.
# FailedScheduling is not among them: the scheduler writes the same message into the
# pod's PodScheduled condition, which `_pod_waiting` reads, so a reason has one source.


@dataclass(frozen=True)
class Observed:
    """The job's objects as the watch cache holds them. `warnings` are the Warning Events
    of the job's namespace as last read (the backend reads them at most every few
    seconds, in the background, while a job waits); the judge picks its objects' by uid."""

    owner: dict[str, Any] | None
    trainers: dict[str, Any] | None  # the Indexed batch/v1 Job
    pods: list[dict[str, Any]] = field(default_factory=list)
    pservers: dict[str, Any] | None = None  # the parameter servers' StatefulSet
    warnings: tuple[dict[str, Any], ...] = ()

    @cached_property
    def attempts(self) -> dict[str, list[Attempt]]:
        """The pods' attempts, read once (the judge and the backend's events both use them)."""
        return attempts_of(self.pods)


@dataclass(frozen=True)
class Rules:
    """The settings a verdict depends on (`jobs.kubernetes`)."""

    max_evictions: int
    image_pull_timeout_seconds: float


@dataclass(frozen=True)
class Verdict:
    state: str
    reason: str
    started_at: str | None = None
    finished_at: str | None = None
    # The job waits: the backend should read its namespace's Warning Events (it gives
    # them in `Observed.warnings`) for a refusal of its pods or of their volumes.
    read_events: bool = False


def exit_words(terminated: dict[str, Any], memory: str) -> str:
    """How a container ended, in words; an OOM kill names the memory it was given."""
    code = int(terminated.get("exitCode") or 0)
    if terminated.get("reason") == "OOMKilled":
        return describe_exit(code, f"OOMKilled: it used more than its {memory} of memory — raise -memory")
    return describe_exit(code)


def judge(spec: JobSpec, recorded: Recorded, observed: Observed, rules: Rules, now: datetime) -> Verdict:
    """The job's state now, and why, in words."""
    attempts = observed.attempts
    trainer_runs = [a for items in attempts.values() for a in items if a.role == "TRAINER"]
    # RUNNING once a trainer's program runs (never before); its first start is the job's.
    first_start = min((str(a.started_at) for a in trainer_runs if a.started_at), default=None)
    if observed.owner is None:
        return Verdict(
            FAILED, "its Kubernetes objects were deleted outside PaddleCloud", first_start, iso(now)
        )
    ended = _trainers_ended(spec, observed.trainers, attempts, first_start)
    if ended is None:
        ended = _workers_failed(spec, observed.pods, attempts, rules, first_start, iso(now))
    if ended is not None:
        return ended
    if any(a.running and a.started_at for a in trainer_runs):
        return Verdict(RUNNING, "running", first_start)
    if recorded.state == RUNNING:
        return Verdict(RUNNING, recorded.reason or "running", recorded.started_at)
    return _pending(spec, observed, rules, now)


def _trainers_ended(
    spec: JobSpec,
    trainers: dict[str, Any] | None,
    attempts: dict[str, list[Attempt]],
    first_start: str | None,
) -> Verdict | None:
    """SUCCEEDED or FAILED as the trainers' Indexed Job says, or None while it runs."""
    if trainers is None:
        return None
    done = condition(trainers, "Complete")
    if done is not None:
        finished = status(trainers).get("completionTime") or done.get("lastTransitionTime")
        return Verdict(SUCCEEDED, "every trainer exited 0", first_start, finished)
    failed = condition(trainers, "Failed")
    if failed is not None:
        return Verdict(
            FAILED, _failure(spec, attempts, failed), first_start, failed.get("lastTransitionTime")
        )
    return None


def _failure(spec: JobSpec, attempts: dict[str, list[Attempt]], cond: dict[str, Any]) -> str:
    """Why the trainers' Job failed, in words: the last failed trainer's exit."""
    failed = [
        a
        for items in attempts.values()
        for a in items
        if a.role == "TRAINER" and a.terminated and int(a.terminated.get("exitCode") or 0) != 0
    ]
    if not failed:
        return f"the trainers failed: {cond.get('message') or cond.get('reason')}"
    last = max(failed, key=lambda a: a.key)
    restarts = sum(1 for a in attempts[last.worker] if a.terminated) - 1
    plural = "" if restarts == 1 else "s"
    how = exit_words(last.terminated or {}, str(spec.memory))
    return f"{last.worker} {how} after {restarts} restart{plural}"


def _workers_failed(
    spec: JobSpec,
    pods: list[dict[str, Any]],
    attempts: dict[str, list[Attempt]],
    rules: Rules,
    first_start: str | None,
    now: str,
) -> Verdict | None:
    """FAILED when pods were evicted too often or a parameter server failed past its
    restarts (the Indexed Job says nothing of either), else None."""
    evicted = [p for p in pods if status(p).get("reason") == "Evicted" or condition(p, "DisruptionTarget")]
    if len(evicted) > rules.max_evictions:
        why = f"its pods were evicted {len(evicted)} times (more than {rules.max_evictions})"
        return Verdict(FAILED, why, first_start, now)
    for worker, items in sorted(attempts.items()):
        failures = [a for a in items if a.terminated] if items[0].role == "PSERVER" else []
        if len(failures) > spec.max_restarts:
            how = exit_words(failures[-1].terminated or {}, str(spec.psmemory))
            return Verdict(FAILED, f"{worker} {how} after {spec.max_restarts} restarts", first_start, now)
    return None


def _pending(spec: JobSpec, observed: Observed, rules: Rules, now: datetime) -> Verdict:
    """Why the job waits: a pod's scheduler or image message, a refusal of its pods or
    their volumes, or the workers it waits for; FAILED once an image could not be pulled
    for too long, or when Kubernetes refuses its pods for good (`Refusal.lasting`)."""
    read = observed.trainers is not None
    found = _pod_waiting(observed.pods)
    if found is not None:
        why, pod = found
        limit = rules.image_pull_timeout_seconds
        if why.startswith(PULL_FAILURE) and _age_seconds(pod, now) > limit:
            return Verdict(FAILED, f"{why} (for more than {limit:g} s)", None, iso(now))
        return Verdict(PENDING, why)  # the pod says why: no Event is read
    refusal = _refusal(spec, observed)
    if refusal is not None:
        if refusal.lasting:
            return Verdict(FAILED, refusal.message, None, iso(now))
        return Verdict(PENDING, refusal.message, read_events=True)
    ready = sum(
        1 for p in observed.pods if (worker_of(p) or ("", "", 0))[1] == "PSERVER" and condition(p, "Ready")
    )
    if spec.pservers and ready < spec.pservers:
        why = f"waiting for the parameter servers: {ready} of {spec.pservers} ready"
    else:
        why = "waiting for the trainers' pods to start"
    return Verdict(PENDING, why, read_events=read)


def _refusal(spec: JobSpec, observed: Observed) -> Refusal | None:
    """The newest Warning Event that tells why the job's pods are not there or do not
    start: a FailedCreate of the trainers' Job or the parameter servers' StatefulSet
    while it has fewer live pods than asked for (an Event stays an hour: one about pods
    made since says nothing now), a volume's failure of one of its pods still Pending."""
    live = [p for p in observed.pods if _phase(p) != "Failed" and not _deleted(p)]
    waiting = frozenset(str(meta(p).get("uid")) for p in live if _phase(p) == "Pending")
    about = {CREATE_FAILED: _short_of_pods(spec, observed, live), **dict.fromkeys(VOLUME_FAILED, waiting)}
    found = [e for e in observed.warnings if _uid(e) in about.get(str(e.get("reason")), ())]
    if not found:
        return None
    latest = max(found, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    refusal = refusal_in(str(latest.get("reason")), str(latest.get("message")))
    if latest.get("reason") in VOLUME_FAILED:
        name = (latest.get("involvedObject") or {}).get("name")
        return Refusal(f"{refusal.message} (pod {name})", refusal.lasting)
    return refusal


def _short_of_pods(spec: JobSpec, observed: Observed, live: list[dict[str, Any]]) -> frozenset[str]:
    """The uids of the trainers' Job and the parameter servers' StatefulSet, each while it
    has fewer live pods than the job asks for."""
    roles = [(worker_of(p) or ("", "", 0))[1] for p in live]
    return frozenset(
        str(meta(obj).get("uid"))
        for obj, role, wanted in (
            (observed.trainers, "TRAINER", spec.trainers),
            (observed.pservers, "PSERVER", spec.pservers),
        )
        if obj is not None and roles.count(role) < wanted
    )


def _phase(pod: dict[str, Any]) -> str:
    return str(status(pod).get("phase") or "Pending")


def _deleted(obj: dict[str, Any]) -> bool:
    return bool(meta(obj).get("deletionTimestamp"))


def _uid(event: dict[str, Any]) -> str:
    return str((event.get("involvedObject") or {}).get("uid") or "")


def _pod_waiting(pods: list[dict[str, Any]]) -> tuple[str, dict[str, Any]] | None:
    """Why pods wait, in the scheduler's and the kubelet's words, and the pod that waits."""
    for pod in sorted(pods, key=lambda p: str(meta(p).get("name"))):
        name = str(meta(pod).get("name"))
        for cond in status(pod).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                return f"cannot be scheduled: {cond.get('message') or cond.get('reason')} (pod {name})", pod
        for cs in (status(pod).get("initContainerStatuses") or []) + (
            status(pod).get("containerStatuses") or []
        ):
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in _PULL_WAITING:
                return (
                    f"{PULL_FAILURE} {cs.get('image')}: {waiting.get('message') or waiting.get('reason')}",
                    pod,
                )
    return None


def _age_seconds(obj: dict[str, Any], now: datetime) -> float:
    created = str(meta(obj).get("creationTimestamp") or "")
    try:
        return (now - datetime.fromisoformat(created.replace("Z", "+00:00"))).total_seconds()
    except ValueError:
        return 0.0
