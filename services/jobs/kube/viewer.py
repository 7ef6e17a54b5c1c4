"""A job's TensorBoard or VisualDL on Kubernetes (docs/metrics.md §4.5): a pod in the user's namespace.

`start` makes the viewer's objects (manifests.viewer_owner and viewer_objects: a
ConfigMap owning a Pod, a Service and a NetworkPolicy), waits until the pod is Ready for
at most `jobs.viewers.start_timeout_seconds`, and answers the `KubeViewer` the proxy
relays to: the pod's own address, not the Service's name. Once a pod is Ready its
address answers; the Service's endpoints follow it a moment later (the EndpointSlice
controller), so the first request through the Service could be refused, and the service
may run where cluster DNS does not resolve. The Service stays, for an operator's
`kubectl port-forward svc/...` and the NetworkPolicy's port, as the design asks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import aiohttp
import structlog

from paddlecloud.common.kube import Conflict, Kube, KubeError

from ..errors import ViewerFailed, ViewerNotReady
from ..viewers import Upstream
from . import manifests, names
from .pods import condition
from .pods import meta as _meta
from .pods import status as _status

log = structlog.get_logger(__name__)

POLL_SECONDS = 0.5


class KubeViewer(Upstream):
    """One running viewer pod, reached at its address."""

    def __init__(
        self,
        kube: Kube,
        plan: manifests.ViewerPlan,
        owner_uid: str,
        address: str,
        read_timeout: float,
        pods: Callable[[], list[dict[str, Any]]],
    ) -> None:
        host = f"[{address}]" if ":" in address else address
        self.base_url = f"http://{host}:{plan.port}"
        self._kube = kube
        self._plan = plan
        self._owner_uid = owner_uid
        self._read_timeout = read_timeout
        self._pods = pods  # the backend's watch cache of its pods
        self._seen = False
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=self._read_timeout, sock_read=self._read_timeout
                ),
            )
        return self._session

    def ended(self) -> str | None:
        """What became of the pod, from the watch cache: gone once it was seen there, or
        ended (a bare pod with restartPolicy Always ends only when its node does)."""
        plan = self._plan
        for pod in self._pods():
            meta = _meta(pod)
            if meta.get("name") == plan.name and meta.get("namespace") == plan.namespace:
                self._seen = True
                phase = _status(pod).get("phase")
                if meta.get("deletionTimestamp") or phase in ("Failed", "Succeeded"):
                    return f"its pod {plan.name} ended ({_status(pod).get('reason') or phase or 'deleted'})"
                return None
        return f"its pod {plan.name} is gone" if self._seen else None

    async def stop(self) -> None:
        # The ConfigMap owns the rest (the garbage collector's cascade); the pod goes at
        # once rather than when the collector gets to it.
        plan = self._plan
        try:
            await self._kube.delete("ConfigMap", plan.namespace, plan.name, uid=self._owner_uid)
            await self._kube.delete("Pod", plan.namespace, plan.name)
        except KubeError as exc:
            log.warning("kube_viewer_not_deleted", viewer=plan.name, namespace=plan.namespace, error=str(exc))
        if self._session is not None:
            await self._session.close()


async def start(
    kube: Kube,
    plan: manifests.ViewerPlan,
    wait_seconds: float,
    pods: Callable[[], list[dict[str, Any]]],
) -> KubeViewer:
    """The viewer `plan` running and Ready; ViewerFailed (502) or ViewerNotReady (504) saying why not."""
    try:
        owner_manifest = manifests.viewer_owner(plan)
    except ValueError as exc:
        raise ViewerFailed(f"{plan.kind} cannot start: {exc}") from None
    uid: str | None = None
    try:
        owner = await _create_or_adopt(kube, owner_manifest, plan)
        uid = str(_meta(owner)["uid"])
        plan = _with_uid(plan, uid)
        for manifest in manifests.viewer_objects(plan):
            await _create_or_adopt(kube, manifest, plan)
        address = await _ready(kube, plan, wait_seconds)
    except KubeError as exc:
        await _undo(kube, plan, uid)
        raise ViewerFailed(f"Kubernetes refused the job's {plan.kind}: {exc}") from None
    except (ViewerFailed, ViewerNotReady):
        await _undo(kube, plan, uid)
        raise
    log.info("kube_viewer_ready", viewer=plan.name, namespace=plan.namespace, address=address)
    return KubeViewer(kube, plan, uid, address, wait_seconds, pods)


def _with_uid(plan: manifests.ViewerPlan, uid: str) -> manifests.ViewerPlan:
    return replace(plan, owner_uid=uid)


async def _create_or_adopt(
    kube: Kube, manifest: dict[str, Any], plan: manifests.ViewerPlan
) -> dict[str, Any]:
    """Create, or take what an earlier start for this job made (a service that stopped
    without deleting it); another job's of that name is a refusal."""
    try:
        return await kube.create(manifest)
    except Conflict:
        pass
    kind, name = manifest["kind"], manifest["metadata"]["name"]
    existing = await kube.get(kind, plan.namespace, name)
    if existing is None:
        return await kube.create(manifest)
    labels = _meta(existing).get("labels") or {}
    if labels.get(names.LABEL_VIEWER_OF) != plan.job_id or not names.is_ours(existing, plan.settings.release):
        raise ViewerFailed(
            f"{kind} {name} in namespace {plan.namespace} belongs to another job (an earlier job "
            "of this name may still be being deleted); try again in a minute"
        )
    return existing


async def _ready(kube: Kube, plan: manifests.ViewerPlan, wait_seconds: float) -> str:
    """The pod's address once it is Ready; ViewerNotReady naming what holds it back."""
    deadline = time.monotonic() + wait_seconds
    pod: dict[str, Any] | None = None
    while True:
        pod = await kube.get("Pod", plan.namespace, plan.name)
        if pod is not None:
            status = _status(pod)
            ready = condition(pod, "Ready")
            address = status.get("podIP")
            if ready is not None and address:
                return str(address)
            if status.get("phase") in ("Failed", "Succeeded"):
                raise ViewerFailed(f"the {plan.kind} pod {plan.name} ended: {_why(pod)}")
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(POLL_SECONDS)
    why = _why(pod) if pod is not None else "the pod does not exist"
    raise ViewerNotReady(
        f"the {plan.kind} pod {plan.name} in namespace {plan.namespace} was not Ready within "
        f"{wait_seconds:g} s (jobs.viewers.start_timeout_seconds): {why}"
    )


def _why(pod: dict[str, Any]) -> str:
    """What holds a pod back, in the words Kubernetes gave: a container's waiting reason
    (ErrImagePull, ImagePullBackOff, CrashLoopBackOff), its last end, or the scheduler's."""
    status = _status(pod)
    for container in status.get("containerStatuses") or ():
        said = _state_words(container.get("state") or {})
        if said:
            return said
    for cond in status.get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"{cond.get('reason') or 'Unschedulable'}: {cond.get('message') or ''}".rstrip(": ")
    return f"{status.get('phase') or 'Pending'}, not Ready"


def _state_words(state: dict[str, Any]) -> str | None:
    """A container state's reason and message, when it waits or has ended."""
    for what in ("waiting", "terminated"):
        if what in state:
            found = state[what] or {}
            reason, message = found.get("reason") or what, found.get("message") or ""
            return f"{reason}: {message}" if message else str(reason)
    return None


async def _undo(kube: Kube, plan: manifests.ViewerPlan, uid: str | None) -> None:
    """A start that failed leaves nothing: the next request starts afresh."""
    if uid is None:
        return
    with contextlib.suppress(KubeError):
        await kube.delete("ConfigMap", plan.namespace, plan.name, uid=uid)
        await kube.delete("Pod", plan.namespace, plan.name)
