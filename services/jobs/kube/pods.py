"""Reading the cluster's objects as the watch cache holds them: plain dicts in, the
facts the backend judges by out (conditions, which worker a pod is, its container's
attempts). Pure functions: no I/O, no clock."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .names import COMPLETION_INDEX, INDEX_FAILURES, LABEL_ROLE, POD_INDEX


def meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def status(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("status") or {}


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The object's condition `kind` when it is True, else None."""
    for cond in status(obj).get("conditions") or []:
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


def worker_of(pod: dict[str, Any]) -> tuple[str, str, int] | None:
    """(worker name, role, index) of a pod of a job, or None for any other pod."""
    labels, annotations = meta(pod).get("labels") or {}, meta(pod).get("annotations") or {}
    role = str(labels.get(LABEL_ROLE) or "").upper()
    raw = annotations.get(COMPLETION_INDEX) or labels.get(COMPLETION_INDEX) or labels.get(POD_INDEX)
    if raw is None and role == "PSERVER":
        raw = str(meta(pod).get("name", "")).rsplit("-", 1)[-1]
    if role not in ("PSERVER", "TRAINER") or raw is None or not str(raw).isdigit():
        return None
    return f"{role.lower()}-{int(raw)}", role, int(raw)


def main_status(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The status of the pod's main (first) container, once the kubelet reports one."""
    statuses = status(pod).get("containerStatuses") or []
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
    who = worker_of(pod)
    cs = main_status(pod)
    if who is None or cs is None:
        return []
    worker, role, index = who
    info = meta(pod)
    # An Indexed Job's retries of one index are ordered by the failures before them
    # (creationTimestamp has whole seconds only); a StatefulSet pod by when it was made.
    failures = (info.get("annotations") or {}).get(INDEX_FAILURES, "0")
    failures = int(failures) if str(failures).isdigit() else 0
    base = f"{failures:05d}|{info.get('creationTimestamp', '')}|{info.get('name', '')}"

    def attempt(restart: int, previous: bool, now: dict[str, Any]) -> Attempt:
        ran = now.get("running") or now.get("terminated") or {}
        return Attempt(
            worker=worker,
            role=role,
            index=index,
            key=f"{base}|{restart:05d}",
            pod=str(info.get("name")),
            namespace=str(info.get("namespace")),
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
