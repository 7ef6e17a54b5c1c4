"""The store interface both implementations fulfil, and the factory that picks one by URL."""

from __future__ import annotations

import abc
from collections.abc import Collection
from datetime import datetime
from typing import Any

from .models import Build, Job, JobEvent, KeptLog, KeptSeries, Quota, Registry, Token, User


class StoreError(Exception):
    """The store could not do what was asked."""


class AlreadyExists(StoreError):
    """A record with the same unique key (user name, job owner+name, build id) exists."""


class Store(abc.ABC):
    """Users, tokens, jobs, job events and builds.

    Every method is safe to call concurrently from one event loop. State changes are
    compare-and-set: they name the states they expect and fail (return None) if the
    record is no longer in one of them, so two writers cannot both win.
    """

    @abc.abstractmethod
    async def open(self) -> None:
        """Connect and create the schema and indexes (idempotent)."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def ping(self) -> None:
        """Raise if the store cannot be reached; used by /readyz."""

    # Users
    @abc.abstractmethod
    async def create_user(self, user: User) -> None:
        """Add a user; AlreadyExists if the name is taken."""

    @abc.abstractmethod
    async def get_user(self, name: str) -> User | None: ...

    @abc.abstractmethod
    async def list_users(self) -> list[User]:
        """All users, by name."""

    @abc.abstractmethod
    async def count_users(self) -> int: ...

    @abc.abstractmethod
    async def update_user(
        self,
        name: str,
        *,
        password_hash: str | None = None,
        admin: bool | None = None,
        quota: Quota | None = None,
    ) -> User | None:
        """Change the given fields; the updated user, or None if there is no such user."""

    @abc.abstractmethod
    async def delete_user(self, name: str) -> bool:
        """Remove the user and their tokens; False if there was no such user."""

    # Tokens
    @abc.abstractmethod
    async def add_token(self, token: Token) -> None: ...

    @abc.abstractmethod
    async def get_token(self, token_hash: str) -> Token | None: ...

    @abc.abstractmethod
    async def delete_token(self, token_hash: str) -> bool: ...

    @abc.abstractmethod
    async def delete_tokens_of(self, user: str) -> int:
        """Revoke every token of `user`; how many there were."""

    @abc.abstractmethod
    async def purge_expired_tokens(self, now: datetime) -> int:
        """Delete tokens that expired before `now`; how many went."""

    # Jobs
    @abc.abstractmethod
    async def create_job(self, job: Job) -> None:
        """Add a job; AlreadyExists if its id or its (owner, name) is taken."""

    @abc.abstractmethod
    async def get_job(self, owner: str, name: str) -> Job | None: ...

    @abc.abstractmethod
    async def get_job_by_id(self, job_id: str) -> Job | None: ...

    @abc.abstractmethod
    async def list_jobs(
        self,
        owner: str | None,
        *,
        states: Collection[str] | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> tuple[list[Job], str | None]:
        """A page of jobs, newest first, and the cursor for the next page (None at the end).

        `owner` None lists every user's jobs (for admins and the backends' reconcilers).
        """

    @abc.abstractmethod
    async def transition_job(
        self, job_id: str, expected: Collection[str], state: str, **fields: Any
    ) -> Job | None:
        """Set the state (and the given mutable fields) only if the job is in `expected`.

        Returns the updated job, or None if it is gone or no longer in an expected state.
        """

    @abc.abstractmethod
    async def update_job(self, job_id: str, **fields: Any) -> Job | None:
        """Set mutable fields without touching the state; None if the job is gone."""

    @abc.abstractmethod
    async def delete_job(self, job_id: str) -> bool:
        """Remove the job and its events; False if it was not there."""

    # Job events
    @abc.abstractmethod
    async def add_event(self, event: JobEvent) -> None: ...

    @abc.abstractmethod
    async def list_events(self, job_id: str) -> list[JobEvent]:
        """The job's events, oldest first, in the order they were added."""

    # Builds
    @abc.abstractmethod
    async def create_build(self, build: Build) -> None:
        """Add a build; AlreadyExists if its id is taken."""

    @abc.abstractmethod
    async def get_build(self, build_id: str) -> Build | None: ...

    @abc.abstractmethod
    async def find_builds(self, key: str, states: Collection[str]) -> list[Build]:
        """Builds with this cache key in one of `states`, newest first."""

    @abc.abstractmethod
    async def list_builds(self, states: Collection[str]) -> list[Build]:
        """Builds of every key and owner in one of `states`, newest first (a restarted
        builder finds the builds it was running this way)."""

    # Registry credentials, per user, by name.

    @abc.abstractmethod
    async def put_registry(self, registry: Registry) -> None:
        """Save `registry`, replacing the owner's registry of that name if there is one."""

    @abc.abstractmethod
    async def get_registry(self, owner: str, name: str) -> Registry | None: ...

    @abc.abstractmethod
    async def list_registries(self, owner: str) -> list[Registry]:
        """The owner's registries, by name."""

    @abc.abstractmethod
    async def delete_registry(self, owner: str, name: str) -> bool:
        """Whether there was one to delete."""

    # Logs a backend keeps after the processes that wrote them are gone (Kubernetes pods).

    @abc.abstractmethod
    async def keep_log(self, log: KeptLog) -> None:
        """Save `log`, replacing what was kept for that attempt before (a longer copy)."""

    @abc.abstractmethod
    async def list_kept_logs(self, job_id: str) -> list[KeptLog]:
        """The job's kept logs by worker, then attempt; `delete_job` removes them."""

    # Resource series per worker (services/jobs/resources.py), kept with the job's history.

    @abc.abstractmethod
    async def keep_series(self, series: KeptSeries) -> None:
        """Save `series`, replacing what was kept for that worker; nothing if its job is
        gone (a sampler's last write racing `delete_job` leaves no orphan)."""

    @abc.abstractmethod
    async def list_series(self, job_id: str) -> list[KeptSeries]:
        """The job's series by worker name; `delete_job` removes them."""

    # Leases: a named, expiring lock over every process that shares the store.

    @abc.abstractmethod
    async def acquire_lease(self, name: str, holder: str, seconds: float) -> bool:
        """Take the lease `name` for `seconds` if it is free, expired or `holder`'s own
        already (which renews it); whether `holder` holds it now. Atomic across processes."""

    @abc.abstractmethod
    async def release_lease(self, name: str, holder: str) -> None:
        """Give the lease back, if `holder` still holds it."""

    @abc.abstractmethod
    async def transition_build(
        self, build_id: str, expected: Collection[str], state: str, **fields: Any
    ) -> Build | None:
        """Compare-and-set on the build's state, like `transition_job`."""


def open_store(url: str) -> Store:
    """A store for `url`: `sqlite:///path/to.db` or `mongodb://host:port/database`.

    The caller awaits `open()` before use and `close()` after.
    """
    if url.startswith("sqlite://"):
        from .sqlite import SQLiteStore

        return SQLiteStore(url)
    if url.startswith(("mongodb://", "mongodb+srv://")):
        from .mongo import MongoStore

        return MongoStore(url)
    scheme = url.split(":", 1)[0] if ":" in url else url
    raise StoreError(f"store.url: unsupported scheme {scheme!r} (use sqlite:/// or mongodb://)")
