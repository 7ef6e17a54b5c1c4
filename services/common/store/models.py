"""Plain records the store keeps. Times are timezone-aware UTC datetimes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

# User names become PFS home directories (`/pfs/<dc>/home/<name>`, typed in every job),
# Kubernetes namespace names (`<prefix><name>`) and label values, as they are spelled: a
# DNS label, so one name maps to one of each, readable, on both backends. An e-mail
# address is not one (docs/api.md, `POST users`, says why and what to do instead).
USER_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")
USER_NAME_RULE = "1 to 32 lowercase letters, digits and '-', starting and ending with a letter or digit"


def user_name_problem(name: str) -> str | None:
    """Why `name` cannot be a user's name, in words, or None when it can."""
    if USER_NAME.match(name):
        return None
    shown = repr(name[:64])
    if "@" in name:
        local = re.sub(r"[^a-z0-9-]+", "-", name.split("@", 1)[0].lower()).strip("-")[:32].strip("-")
        hint = f" (such as {local!r})" if local and USER_NAME.match(local) else ""
        return (
            f"{shown} is an e-mail address; a user name is {USER_NAME_RULE}, as it names the user's "
            f"PFS home and Kubernetes namespace: use the address's local part{hint}"
        )
    return f"{shown} is not a user name: a user name is {USER_NAME_RULE}"


def utcnow() -> datetime:
    """Now, in UTC, truncated to milliseconds: what both stores can keep exactly."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


@dataclass(frozen=True)
class Quota:
    """Per-user limits; None means unlimited."""

    cpu_milli: int | None = None
    gpu: int | None = None
    memory_bytes: int | None = None
    jobs: int | None = None
    storage_bytes: int | None = None
    # The ephemeral storage (a job's `disk`) of all the user's running workers together.
    disk_bytes: int | None = None


@dataclass(frozen=True)
class User:
    name: str
    password_hash: str = field(repr=False)
    admin: bool = False
    quota: Quota = Quota()
    created_at: datetime = field(default_factory=utcnow)


@dataclass(frozen=True)
class Token:
    """A bearer token as stored: only its sha256, never the token itself."""

    token_hash: str = field(repr=False)
    user: str
    expires_at: datetime
    created_at: datetime = field(default_factory=utcnow)


# Job states. Terminal states never change again.
PENDING = "PENDING"
BUILDING = "BUILDING"
RUNNING = "RUNNING"
SUCCEEDED = "SUCCEEDED"
FAILED = "FAILED"
KILLED = "KILLED"
JOB_STATES = (PENDING, BUILDING, RUNNING, SUCCEEDED, FAILED, KILLED)
TERMINAL_STATES = frozenset({SUCCEEDED, FAILED, KILLED})
ACTIVE_STATES = frozenset({PENDING, BUILDING, RUNNING})


@dataclass(frozen=True)
class Job:
    id: str
    owner: str
    name: str
    state: str
    spec: dict[str, Any]
    created_at: datetime = field(default_factory=utcnow)
    updated_at: datetime = field(default_factory=utcnow)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    reason: str = ""
    # What the backend needs to find the job again (supervisor directory, namespace, ...).
    backend: dict[str, Any] = field(default_factory=dict)
    build_id: str | None = None


# The fields a state change or an update may set besides the state itself.
JOB_MUTABLE_FIELDS = frozenset({"started_at", "finished_at", "reason", "backend", "build_id"})


@dataclass(frozen=True)
class JobEvent:
    """One thing that happened to a job: a state change or a notable occurrence."""

    job_id: str
    time: datetime
    type: str  # "state" for transitions, otherwise a short snake_case kind
    reason: str
    message: str = ""
    state: str | None = None


@dataclass(frozen=True)
class Build:
    id: str
    key: str
    owner: str
    state: str  # PENDING, RUNNING, SUCCEEDED, FAILED
    spec: dict[str, Any]
    created_at: datetime = field(default_factory=utcnow)
    updated_at: datetime = field(default_factory=utcnow)
    finished_at: datetime | None = None
    reason: str = ""
    info: dict[str, Any] = field(default_factory=dict)


BUILD_MUTABLE_FIELDS = frozenset({"finished_at", "reason", "info"})


@dataclass(frozen=True)
class Registry:
    """A user's saved credentials for one container registry (`paddlecloud registry`).

    The password is kept as given: a Kubernetes backend turns it into a
    `kubernetes.io/dockerconfigjson` Secret, and Kaniko pushes with it, so it cannot be hashed.
    It is never listed, logged or shown in a repr.
    """

    owner: str
    name: str
    server: str
    username: str
    password: str = field(repr=False)
    created_at: datetime = field(default_factory=utcnow)


@dataclass(frozen=True)
class KeptSeries:
    """One worker's resource series (services/jobs/resources.py), as JSON text: replaced
    whole when written, removed with its job."""

    job_id: str
    worker: str
    text: str


@dataclass(frozen=True)
class KeptLog:
    """One container's whole log (one attempt of one worker), kept after its pod is gone.
    `attempt` sorts attempts of a worker in the order they ran."""

    job_id: str
    worker: str
    attempt: str
    text: str
