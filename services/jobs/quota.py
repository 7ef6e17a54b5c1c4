"""Quota: what a user's active jobs hold, whether one more fits, and `GET /quota`'s answer."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from paddlecloud.common.clients import PfsClient, ServiceError, ServiceUnavailable
from paddlecloud.common.internal_auth import Identity
from paddlecloud.common.quantity import format_bytes, format_cpu_milli
from paddlecloud.common.store import Store
from paddlecloud.common.store.models import ACTIVE_STATES

from .backend import Backend
from .errors import PfsUnavailable, QuotaExceeded, UnknownUser
from .records import JobRecord, JobRecords
from .spec import JobSpec


@dataclass(frozen=True)
class Resources:
    cpu_milli: int = 0
    gpu: int = 0
    memory_bytes: int = 0
    jobs: int = 0
    disk_bytes: int = 0

    @classmethod
    def of(cls, spec: JobSpec) -> Resources:
        return cls(
            cpu_milli=spec.trainers * spec.cpu_milli + spec.pservers * spec.pscpu_milli,
            gpu=spec.trainers * spec.gpu,
            memory_bytes=spec.trainers * spec.memory_bytes + spec.pservers * spec.psmemory_bytes,
            jobs=1,
            disk_bytes=(spec.trainers + spec.pservers) * spec.disk_bytes,
        )

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu_milli + other.cpu_milli,
            self.gpu + other.gpu,
            self.memory_bytes + other.memory_bytes,
            self.jobs + other.jobs,
            self.disk_bytes + other.disk_bytes,
        )


class Quotas:
    """Users' limits against what their active jobs hold, storage counted by pfs."""

    def __init__(self, store: Store, records: JobRecords, backend: Backend, pfs: PfsClient) -> None:
        self._store = store
        self._records = records
        self._backend = backend
        self._pfs = pfs

    async def _active(self, owner: str) -> list[JobRecord]:
        """The owner's active jobs; one whose stored spec no longer validates is left out
        of the count (logged), not a reason to refuse every later submit."""
        records = [JobRecord.read(job) async for job in self._records.all(owner, ACTIVE_STATES)]
        return [record for record in records if record.stale is None]

    @staticmethod
    def _in_use(jobs: list[JobRecord]) -> Resources:
        total = Resources()
        for job in jobs:
            total = total + Resources.of(job.spec)
        return total

    async def check(self, owner: str, spec: JobSpec) -> None:
        """QuotaExceeded, with what was asked, used and allowed, if `spec` does not fit."""
        user = await self._store.get_user(owner)
        if user is None:
            raise UnknownUser(f"user {owner!r} does not exist")
        quota = user.quota
        used = self._in_use(await self._active(owner))
        asked = Resources.of(spec)
        over = []
        checks: list[tuple[str, int, int, int | None, Callable[[int], str]]] = [
            ("cpu", asked.cpu_milli, used.cpu_milli, quota.cpu_milli, format_cpu_milli),
            ("gpu", asked.gpu, used.gpu, quota.gpu, str),
            ("memory", asked.memory_bytes, used.memory_bytes, quota.memory_bytes, format_bytes),
            ("jobs", asked.jobs, used.jobs, quota.jobs, str),
            ("disk", asked.disk_bytes, used.disk_bytes, quota.disk_bytes, format_bytes),
        ]
        for resource, want, have, limit, fmt in checks:
            if limit is not None and want + have > limit:
                over.append((resource, fmt(want), fmt(have), fmt(limit)))
        if quota.storage_bytes is not None:
            stored = int((await self._storage(owner)).get("bytes", 0))
            if stored >= quota.storage_bytes:
                over.append(("storage", "0", format_bytes(stored), format_bytes(quota.storage_bytes)))
        if over:
            parts = [f"{r}: asked {a}, in use {u}, allowed {lim}" for r, a, u, lim in over]
            raise QuotaExceeded(
                f"job {spec.name!r} does not fit your quota — " + "; ".join(parts),
                quota=[{"resource": r, "requested": a, "used": u, "limit": lim} for r, a, u, lim in over],
            )

    async def _storage(self, owner: str) -> dict[str, Any]:
        """The owner's home as pfs counts it (it owns the count and its cache): `bytes`, and
        whether its filesystem enforces the limit (`enforced`, `enforcement`)."""
        try:
            return await self._pfs.usage(Identity(owner))
        except ServiceUnavailable as exc:
            raise PfsUnavailable(f"storage use cannot be checked now: {exc.detail}") from None
        except ServiceError as exc:
            raise PfsUnavailable(f"storage use cannot be checked now: pfs said {exc.code}") from None

    async def view(self, owner: str) -> dict[str, Any]:
        """`GET /quota`: usage against limits, the GPUs held, what the machine enforces."""
        user = await self._store.get_user(owner)
        if user is None:
            raise UnknownUser(f"user {owner!r} does not exist")
        q = user.quota
        active = await self._active(owner)
        used = self._in_use(active)
        machine = dict(self._backend.capacity())
        stored: int | None = None  # unknown while pfs does not answer; nothing here depends on it
        with contextlib.suppress(PfsUnavailable):
            storage = await self._storage(owner)
            stored = int(storage.get("bytes", 0))
            machine["storage"] = "enforced" if storage.get("enforced") else "advisory"
            machine["storage_detail"] = str(storage.get("enforcement", ""))

        def opt(value: int | None, fmt: Any) -> Any:
            return None if value is None else fmt(value)

        devices: list[dict[str, Any]] = []
        for job in active:
            for worker, held in sorted(self._backend.devices(job).items()):
                devices += [{"job": job.name, "worker": worker, "device": d} for d in held]
        return {
            "user": owner,
            "cpu": {"used": format_cpu_milli(used.cpu_milli), "limit": opt(q.cpu_milli, format_cpu_milli)},
            "gpu": {"used": used.gpu, "limit": q.gpu},
            "devices": devices,
            "memory": {"used": format_bytes(used.memory_bytes), "limit": opt(q.memory_bytes, format_bytes)},
            "jobs": {"used": used.jobs, "limit": q.jobs},
            "storage": {"used": opt(stored, format_bytes), "limit": opt(q.storage_bytes, format_bytes)},
            "disk": {"used": format_bytes(used.disk_bytes), "limit": opt(q.disk_bytes, format_bytes)},
            "machine": machine,
        }
