"""How the jobs service's API shows its domain's objects: jobs, events, registries, a dry run.

The domain answers with records (`JobRecord`, the store's `Job`, `Registry`, `DryRun`);
api.py renders them here, so the shape of an answer is decided in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from paddlecloud.common.store import Job, Registry
from paddlecloud.common.store.models import JobEvent

from .backend import PlannedWorker
from .records import JobRecord
from .scalars import Scalars


def iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def job_view(job: Job | JobRecord) -> dict[str, Any]:
    stored = job.stored if isinstance(job, JobRecord) else job
    return {
        "name": stored.name,
        "owner": stored.owner,
        "state": stored.state,
        "reason": stored.reason,
        "created_at": iso(stored.created_at),
        "updated_at": iso(stored.updated_at),
        "started_at": iso(stored.started_at),
        "finished_at": iso(stored.finished_at),
        "spec": stored.spec,
    }


def registry_view(registry: Registry) -> dict[str, Any]:
    """A saved registry as the API shows it: never its password."""
    return {
        "name": registry.name,
        "server": registry.server,
        "username": registry.username,
        "created_at": iso(registry.created_at),
    }


def event_view(event: JobEvent) -> dict[str, Any]:
    return {
        "time": iso(event.time),
        "type": event.type,
        "reason": event.reason,
        "message": event.message,
        "state": event.state,
    }


@dataclass(frozen=True)
class DryRun:
    """What a submit would do, checked as a real one is, with nothing recorded or started."""

    job: JobRecord
    workers: Sequence[PlannedWorker]
    package: str  # the package's PFS path
    package_kind: str | None  # None: not uploaded yet
    output: str
    build: dict[str, Any] | None  # the build's cache key and whether it is cached
    objects: list[dict[str, Any]]  # what the backend would create (on a cluster)


def dry_run_view(dry: DryRun) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "dry_run": True,
        "job": job_view(dry.job),
        "workers": [w.to_dict() for w in dry.workers],
        "package": {"path": dry.package, "kind": dry.package_kind, "found": dry.package_kind is not None},
        "output": dry.output,
        "build": dry.build,
    }
    if dry.objects:
        answer["objects"] = dry.objects
    return answer


def scalars_view(name: str, found: Scalars) -> dict[str, Any]:
    """A job's curves (docs/metrics.md §2.3): columnar series, and what was cut or refused."""
    return {"name": name, "series": [s.to_dict() for s in found.series], "warnings": found.warnings}
