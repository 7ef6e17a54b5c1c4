"""One acting jobs service among replicas: leader election on a coordination.k8s.io/v1 Lease.

The algorithm is client-go's (k8s.io/client-go/tools/leaderelection), on the service's own
API client (common/kube.py) rather than kubernetes_asyncio's `leaderelection` package,
which lets one API call hang past the renew deadline, writes naive local times as UTC and
stops its leader by cancelling a task instead of ending the process. Here:

- A replica reads the Lease and takes it when nobody holds it, or when what it holds has
  not changed for the holder's `leaseDurationSeconds`, measured on this replica's own
  monotonic clock from when it first saw that record (never by comparing the holder's
  `renewTime` with our clock: the two clocks need not agree). Every write is a PUT carrying
  the `resourceVersion` it read, so of two replicas racing for it one gets 409 and stays a
  follower.
- The holder renews every `retry_seconds`. A renew that has not succeeded for
  `renew_seconds` since the last one that did (each call bounded by what is left of that)
  means the lease is lost, or may be: `hold` returns and the caller stops acting at once.
  `renew_seconds < lease_seconds` (config.py checks it), so the old leader has stopped
  before any follower may take over.
- A leader that shuts down cleanly releases the Lease (empty holder), so a follower takes
  it at its next try instead of waiting out the lease.

The holder's identity is the pod's name (POD_NAME, set by the chart from the downward API,
else the host name) and a random suffix: a container restarted in the same pod is a new
holder and waits like any other follower.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import socket
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from paddlecloud.common.config import ConfigError, KubernetesSection, LeaderElection
from paddlecloud.common.kube import Kube, KubeError

from ..leadership import Leadership

log = structlog.get_logger("paddlecloud.jobs.kube.leader")

# Where a pod's service account token mount says which namespace the pod is in.
POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# client-go's jitter on a follower's retries, so that replicas do not try in lockstep.
JITTER = 1.2


def holder_identity() -> str:
    """This replica's name in the Lease: its pod's name and a random suffix."""
    pod = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{pod}_{secrets.token_hex(4)}"


def lease_namespace(settings: LeaderElection, pod_namespace_file: Path = POD_NAMESPACE_FILE) -> str:
    """The Lease's namespace: as configured, else the pod's own. ConfigError outside a pod."""
    if settings.namespace:
        return settings.namespace
    try:
        found = pod_namespace_file.read_text().strip()
    except OSError:
        found = ""
    if not found:
        raise ConfigError(
            "jobs.kubernetes.leader_election.namespace: not set, and the service does not run in a "
            f"pod ({pod_namespace_file} is missing): name the namespace that holds the Lease"
        )
    return found


def _micro_time(when: datetime) -> str:
    """A MicroTime as the API writes it (RFC 3339, microseconds, UTC)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _record(lease: dict[str, Any]) -> tuple[Any, ...]:
    """What of a Lease changes when its holder renews or another takes it."""
    spec = lease.get("spec") or {}
    return tuple(
        spec.get(key)
        for key in ("holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime", "leaseTransitions")
    )


class LeaseElector:
    """Takes, renews and releases one Lease for this replica (client-go's algorithm)."""

    def __init__(self, kube: Kube, settings: LeaderElection, namespace: str, identity: str) -> None:
        self._kube = kube
        self._settings = settings
        self.namespace = namespace
        self.name = settings.lease_name
        self.identity = identity
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0  # our monotonic clock when `_observed` was first seen
        self.holder: str | None = None  # who holds the Lease, as last read
        self.error: str | None = None  # why the last try failed, when the API refused it
        self.held = False  # whether this replica ever held the Lease

    async def acquire(self) -> None:
        """Return once this replica holds the Lease, trying every `retry_seconds` (jittered)."""
        while not await self.try_acquire_or_renew():  # noqa: ASYNC110 - polling the API is the point
            await asyncio.sleep(self._settings.retry_seconds * random.uniform(1, JITTER))  # noqa: S311

    async def hold(self) -> str:
        """Renew the Lease every `retry_seconds` for as long as that works; return, saying
        why in words, once no renew succeeded for `renew_seconds` or another replica holds it."""
        loop = asyncio.get_running_loop()
        renewed = loop.time()
        while True:
            await asyncio.sleep(self._settings.retry_seconds)
            while True:
                left = renewed + self._settings.renew_seconds - loop.time()
                if left <= 0:
                    why = f": {self.error}" if self.error else ""
                    return f"the Lease was not renewed for {self._settings.renew_seconds:g} s{why}"
                began = loop.time()
                try:
                    held = await asyncio.wait_for(self.try_acquire_or_renew(), left)
                except TimeoutError:
                    held = False
                    self.error = "the API server did not answer in time"
                if held:
                    # From before the call: the renew counts from no later than it happened,
                    # so this replica gives up no later than a follower may take over.
                    renewed = began
                    break
                if self.holder not in (None, "", self.identity):
                    return f"{self.holder} holds the Lease now"
                await asyncio.sleep(min(self._settings.retry_seconds, max(0.0, left)))

    async def try_acquire_or_renew(self) -> bool:
        """One try: True if this replica holds the Lease after it."""
        now = datetime.now(UTC)
        try:
            lease = await self._kube.get("Lease", self.namespace, self.name)
            if lease is None:
                await self._kube.create(self._manifest(now, None))
                self.holder, self.error, self.held = self.identity, None, True
                return True
        except KubeError as exc:
            self.error = str(exc)
            return False
        # When we saw it (after the read): a follower's wait starts no earlier than the renew.
        monotonic = asyncio.get_running_loop().time()
        record = _record(lease)
        if record != self._observed:
            self._observed, self._observed_at = record, monotonic
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        self.holder = holder
        duration = int(spec.get("leaseDurationSeconds") or self._settings.lease_seconds)
        if holder and holder != self.identity and monotonic < self._observed_at + duration:
            return False  # held, and renewed within its lease as far as we have watched
        try:
            updated = await self._kube.replace(self._manifest(now, lease))
        except KubeError as exc:  # 409: another replica wrote it since we read it
            self.error = str(exc)
            return False
        self._observed, self._observed_at = _record(updated), monotonic
        self.holder, self.error, self.held = self.identity, None, True
        return True

    def _manifest(self, now: datetime, current: dict[str, Any] | None) -> dict[str, Any]:
        """The Lease held by this replica from `now`: created, renewed or taken over. The
        read `resourceVersion` stays in the metadata, which makes the PUT conditional."""
        spec = (current or {}).get("spec") or {}
        ours = spec.get("holderIdentity") == self.identity
        transitions = int(spec.get("leaseTransitions") or 0)
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": (current or {}).get("metadata") or {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self._settings.lease_seconds,
                "acquireTime": spec.get("acquireTime") if ours else _micro_time(now),
                "renewTime": _micro_time(now),
                "leaseTransitions": transitions if ours or current is None else transitions + 1,
            },
        }

    async def release(self) -> None:
        """Give the Lease up (an empty holder), if this replica still holds it: a follower
        takes it at its next try. Best effort: a leader that cannot is waited out."""
        if not self.held:
            return
        try:
            lease = await self._kube.get("Lease", self.namespace, self.name)
            spec = (lease or {}).get("spec") or {}
            if lease is None or spec.get("holderIdentity") != self.identity:
                return
            now = _micro_time(datetime.now(UTC))
            released = {**spec, "holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": now}
            await self._kube.replace({**lease, "spec": released})
            log.info("leader_lease_released", lease=self.name, namespace=self.namespace)
        except KubeError as exc:
            log.warning("leader_lease_not_released", lease=self.name, error=str(exc))


def exit_now(why: str) -> None:
    """What a leader does when it lost the Lease, as client-go's users do (klog.Fatal): end
    the process at once, before it acts once more, with a non-zero status; the Deployment
    starts it again, as a follower."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(1)


@contextlib.asynccontextmanager
async def campaign(
    settings: KubernetesSection,
    leadership: Leadership,
    acting: Callable[[], AbstractAsyncContextManager[None]],
    on_lost: Callable[[str], None] = exit_now,
) -> AsyncIterator[None]:
    """For the block's duration: wait for the Lease, then act (`acting()`: open the backend,
    resume, reconcile) while holding it; `on_lost` once it is lost. On leaving the block,
    stop acting, then release the Lease."""
    election = settings.leader_election
    namespace = lease_namespace(election)
    kube = await Kube.connect(settings)
    elector = LeaseElector(kube, election, namespace, holder_identity())
    leadership.retry_after = max(1, round(election.retry_seconds))

    def follower_why() -> str:
        if elector.holder == elector.identity:
            return "this replica was elected and is taking up the jobs"
        if elector.error:
            return f"cannot read or take the Lease {namespace}/{elector.name}: {elector.error}"
        return f"{elector.holder or 'another replica'} holds the Lease {namespace}/{elector.name}"

    leadership.why = follower_why

    async def lead() -> None:
        where = {"lease": elector.name, "namespace": namespace, "identity": elector.identity}

        def lost(why: str) -> None:
            leadership.acting = False
            log.error(
                "leader_lease_lost",
                **where,
                why=why,
                message="this replica stops acting on the cluster now and exits; "
                "it starts again as a follower",
            )
            on_lost(why)

        log.info("leader_election_started", **where)
        await elector.acquire()
        log.info("leader_elected", **where)
        try:
            async with acting():
                leadership.acting = True
                lost(await elector.hold())  # before anything else acts once more
        except Exception as exc:
            # A leader that cannot act (its backend did not open) must not sit on the Lease.
            log.exception("leader_failed", **where)
            lost(f"the leader could not act: {exc}")

    task = asyncio.create_task(lead(), name="jobs-leader")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        leadership.acting = False
        with contextlib.suppress(TimeoutError):  # an API server that is away is not waited for
            await asyncio.wait_for(elector.release(), election.renew_seconds)
        await kube.close()
