"""The interface every jobs backend implements: local processes (local/) and Kubernetes (kube/).

The jobs service owns the store, the spec, quota and the HTTP API; a backend only runs
what it is given and reports what it sees. Five operations:

- `start(launch)`: run a validated job; returns what the backend needs to find it again
  (stored in `Job.backend`, so a restarted service can re-attach).
- `stop(job, grace_seconds)`: stop every process of the job (grace, then force).
- `observe(job)`: the job's state as the backend sees it now, with events it has not
  reported yet; the service turns changes into store transitions.
- `workers(job)`: per-worker state (role, index, state, restarts, start time, host).
- `logs(job, ...)`: lines with opaque, resumable cursors; a follow ends when the job is
  final and every line was sent.

`remove(job)` forgets the job's files or objects (`kill -rm`). The kubernetes backend maps
the same calls onto a StatefulSet, an Indexed Job and watches; nothing above changes. A
few optional hooks serve restarts and dry runs: `adopt` and `sweep` after a restart,
`preview` for `submit --dry-run`, `forget_user` when a user is deleted; `usage` for the
resource series (resources.py samples it every `jobs.metrics.interval`), `start_viewer`
for a job's TensorBoard or VisualDL.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from paddlecloud.common.config import ViewersSection
from paddlecloud.common.volume import PfsPath

from .errors import ViewerNotOffered
from .records import JobRecord
from .spec import JobSpec
from .viewers import Upstream


class StartFailed(Exception):
    """The job cannot start; the message says why, for the user."""


class NotYet(Exception):
    """The job cannot start now but will once resources free up (GPUs held by other
    jobs); the message says what it waits for, with the numbers.

    `holds_queue`: whether the jobs queued behind it wait too. Yes for what every job
    waits for in its turn (GPUs, an API outage: first come, first started); no for what
    only this job's user lacks (their namespace being deleted, or another's by that
    name): the queue passes it, or one user's trouble would stop everyone's jobs."""

    def __init__(self, message: str, *, holds_queue: bool = True) -> None:
        super().__init__(message)
        self.holds_queue = holds_queue


@dataclass(frozen=True)
class Runtime:
    """What a job runs with, as the builder made it for the job's requirements: a Python
    environment's interpreter (the local builder) or an image (a registry builder)."""

    python: str | None = None
    image: str | None = None

    def to_dict(self) -> dict[str, str]:
        return {k: v for k, v in (("python", self.python), ("image", self.image)) if v is not None}

    @classmethod
    def from_dict(cls, data: Any) -> Runtime | None:
        if not isinstance(data, dict) or not data:
            return None
        python, image = data.get("python"), data.get("image")
        return cls(python if isinstance(python, str) else None, image if isinstance(image, str) else None)


@dataclass(frozen=True)
class Launch:
    """Everything a backend needs to run one job, resolved by the service: its paths are
    parsed and checked once, at its submit (or when a restarted service reads it again),
    and a backend takes them as they are (`.text` where it needs the path's words)."""

    job: JobRecord
    spec: JobSpec
    datacenter: str
    pfs_home: str  # /pfs/<dc>/home/<user>
    output: PfsPath  # the job's output directory
    package: PfsPath  # the package (a directory, .tar.gz or .zip)
    package_kind: str  # "dir", "tar" or "zip"
    input: PfsPath | None = None
    runtime: Runtime | None = None  # the built environment, when the job has requirements


@dataclass(frozen=True)
class ObservedEvent:
    time: str  # ISO 8601, UTC
    type: str  # "Normal" or "Warning"
    reason: str  # CamelCase kind, e.g. WorkerFailed
    message: str


@dataclass(frozen=True)
class Observation:
    """What the backend sees of one job. `events` are those after the cursor asked with;
    `cursor` is where the next observation resumes."""

    state: str  # one of the store's job states
    reason: str
    started_at: str | None = None
    finished_at: str | None = None
    events: tuple[ObservedEvent, ...] = ()
    cursor: str | None = None


@dataclass(frozen=True)
class WorkerInfo:
    name: str
    role: str  # PSERVER or TRAINER
    index: int
    state: str
    restarts: int = 0
    started_at: str | None = None
    exit_code: int | None = None
    host: str | None = None
    devices: tuple[str, ...] = ()  # the GPUs it holds

    def to_dict(self) -> dict[str, Any]:
        return {
            "devices": list(self.devices),
            "name": self.name,
            "role": self.role,
            "index": self.index,
            "state": self.state,
            "restarts": self.restarts,
            "started_at": self.started_at,
            "exit_code": self.exit_code,
            "host": self.host,
        }


@dataclass(frozen=True)
class WorkerUsage:
    """What one worker uses at one moment; None where the backend cannot know it (GPU
    figures of a worker without GPUs, CPU on the first look at a worker)."""

    worker: str
    cpu_cores: float | None = None
    memory_bytes: int | None = None
    memory_limit_bytes: int | None = None
    gpu_utilization: float | None = None  # percent, the mean over the worker's GPUs
    gpu_memory_bytes: int | None = None  # the sum over the worker's GPUs


@dataclass(frozen=True)
class JobUsage:
    """What a backend sees of one job's workers now: those running, or why it cannot say."""

    workers: tuple[WorkerUsage, ...] = ()
    available: bool = True
    reason: str | None = None


class LogLine(NamedTuple):
    """One line of a worker's log. A tuple, not a dataclass: a burst makes one per line."""

    worker: str
    line: str  # without its newline
    cursor: str  # resume after this line


@dataclass(frozen=True)
class LogQuery:
    tail: int | None = None  # last N lines of each worker
    follow: bool = False
    roles: Collection[str] = ()  # PSERVER / TRAINER; empty: all
    workers: Collection[str] = ()  # worker names; empty: all
    cursor: str | None = None


@dataclass(frozen=True)
class PlannedWorker:
    name: str
    role: str
    index: int
    cpu: str
    memory: str
    gpu: int
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "index": self.index,
            "cpu": self.cpu,
            "memory": self.memory,
            "gpu": self.gpu,
            **self.extra,
        }


def planned_workers(spec: JobSpec) -> list[PlannedWorker]:
    """The processes (pods) a spec asks for, the same on every backend."""
    workers = [
        PlannedWorker(f"pserver-{i}", "PSERVER", i, str(spec.pscpu), str(spec.psmemory), 0)
        for i in range(spec.pservers)
    ]
    workers += [
        PlannedWorker(f"trainer-{i}", "TRAINER", i, str(spec.cpu), str(spec.memory), spec.gpu)
        for i in range(spec.trainers)
    ]
    return workers


class Backend(abc.ABC):
    name: str
    # Whether a job the store holds as PENDING (or BUILDING with no build asked for), with
    # nothing started and nothing to adopt, is started after a restart of the service
    # rather than failed: the backend's `adopt` must tell a start that half happened from
    # one that did, so the job runs once.
    resumes_unstarted = False
    # Why this backend cannot sample what jobs use (no cgroups, no metrics API on the
    # cluster), for the resources of a job that has no series; None while it can.
    usage_unavailable: str | None = None

    async def open(self) -> None:  # noqa: B027 - most backends need nothing here
        """Prepare to run jobs (called once when the service starts)."""

    async def close(self) -> None:  # noqa: B027
        """Release what `open` took; running jobs keep running."""

    def build_base(self, spec: JobSpec) -> str | None:
        """The image a build for `spec`'s requirements starts from: the image the job would
        run without one (the builder's own default when None: the local builder builds on
        the platform's Python)."""
        return None

    def notes(self, spec: JobSpec) -> list[str]:
        """What the owner should be told at submit about how this backend runs `spec`
        (what it accepts but does not use); shown by the CLI as warnings."""
        return []

    def refusal(self, spec: JobSpec) -> tuple[str, str] | None:
        """Why this backend can never run `spec` (it asks for more than there is), as the
        spec's field at fault and the reason; None if it can."""
        return None

    def capacity(self) -> dict[str, Any]:
        """What this backend offers and enforces, for `GET /quota` (GPUs, limits)."""
        return {}

    def devices(self, job: JobRecord) -> dict[str, list[str]]:
        """The GPUs each worker of an active job holds."""
        return {}

    def attach(self, job: JobRecord) -> None:  # noqa: B027 - a backend without held resources needs nothing
        """Take up again what an active job holds (after a restart of the service)."""

    async def preview(self, launch: Launch) -> list[dict[str, Any]]:
        """What `start` would create, for `submit --dry-run` (objects, on a cluster)."""
        return []

    async def adopt(self, job: JobRecord) -> dict[str, Any] | None:
        """What `start` would have returned, for a job the backend runs although the store
        has no record of starting it (the service stopped in between); None if it does not."""
        return None

    async def sweep(self, keep: set[str]) -> int:
        """Remove what the backend runs for jobs not in `keep` (the active job ids), after
        a restart; how many jobs' leftovers it removed."""
        return 0

    @abc.abstractmethod
    async def start(self, launch: Launch) -> dict[str, Any]:
        """Start the job; the returned mapping is stored as `Job.backend`. StartFailed if
        it cannot run, NotYet if it must wait for resources."""

    @abc.abstractmethod
    async def stop(self, job: JobRecord, grace_seconds: float, reason: str | None = None) -> None:
        """Stop every process of the job: SIGTERM (or delete), the grace, then force.
        `reason` is what the job's end should say (who killed it, and when)."""

    @abc.abstractmethod
    async def observe(self, job: JobRecord, cursor: str | None) -> Observation:
        """The job's current state, with the events after `cursor` (an opaque position
        this backend handed out in an earlier Observation; None: from the start)."""

    @abc.abstractmethod
    async def workers(self, job: JobRecord) -> list[WorkerInfo]: ...

    @abc.abstractmethod
    def logs(self, job: JobRecord, query: LogQuery) -> AsyncGenerator[list[LogLine], None]:
        """The job's log lines in batches, as they become available; BadCursor for a
        cursor that is not ours."""

    async def usage(self, jobs: Sequence[JobRecord]) -> dict[str, JobUsage]:
        """What each job's running workers use now, by job id: called once per sampling
        tick for every active job at once (so a backend reads shared sources, nvidia-smi,
        the metrics API, once per tick)."""
        unavailable = JobUsage(available=False, reason=f"not sampled by the {self.name} backend")
        return {job.id: unavailable for job in jobs}

    def watch(self, changed: Callable[[str], None]) -> None:  # noqa: B027 - a backend may only be polled
        """Call `changed(job_id)` when a job may have changed, so the service observes it
        at once; a hint, on top of the poll every `jobs.poll_seconds`."""

    def forget(self, job: JobRecord) -> None:  # noqa: B027 - a backend that caches nothing has nothing to drop
        """Drop whatever the backend cached about a job that is now final."""

    async def forget_user(self, user: str) -> None:  # noqa: B027 - most backends keep nothing per user
        """Remove what the backend keeps for a user being deleted (after their jobs)."""

    def viewer_runner(self, kind: str, config: ViewersSection) -> str:
        """What runs the `kind` viewer here: the interpreter `jobs.viewers.<kind>` where the
        backend runs processes; ViewerNotOffered naming the setting when it is unset."""
        python: str | None = getattr(config, kind)
        if python is None:
            raise ViewerNotOffered(
                f"{kind} is not offered on this platform: the operator has not set jobs.viewers.{kind} "
                "(docs/configuration.md)"
            )
        return python

    async def start_viewer(
        self, job: JobRecord, kind: str, output: PfsPath, prefix: str, python: str
    ) -> Upstream:
        """Start the job's `kind` viewer (viewers.py) serving `output` read-only under the URL
        path `prefix`, with `python`, what `viewer_runner` named (an interpreter where the
        backend runs processes, an image on Kubernetes)."""
        raise ViewerNotOffered(f"{kind} is not offered for jobs of the {self.name} backend")

    @abc.abstractmethod
    async def remove(self, job: JobRecord) -> None:
        """Forget the job's files or objects; it is already final."""
