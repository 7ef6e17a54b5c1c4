"""The interface every builder backend implements: local virtualenvs, or images built by Kaniko.

The builder service owns the store, the cache policy (one build per key at a time, hits,
least-recently-used collection) and the HTTP API; a backend only builds what it is
given, says what it has published, and streams logs. The operations:

- `base_identity(base, registry)`: what the cache key says about the base (an image's
  digest, resolved from its registry with the user's credentials; or this platform's
  Python); `BaseRefused` for a base the backend cannot build on.
- `lookup(key)`: the published result for a key (`Published`), or None. Publishing is
  atomic, so a half-built result is never found.
- `build(request)`: run one build to its end and publish it on success. Cancelling the
  call stops the build and leaves nothing but its log.
- `logs(log_id, query, finished)`: a build's log lines with resumable cursors; a follow
  ends once `finished()` says the build is final and every line was sent.
- `recover(interrupted)`: on start, clean up what builds left when the previous
  process ended mid-build.
- `entries()` / `evict(key, ...)`: the published results with their size and last use,
  for the service's size cap (a registry that keeps its own retention lists none).

Kaniko (kaniko.py) maps these onto a Job per build (`FROM <base>@<digest>`, `pip install
-r`, push `<registry>/<repo>:<key>`), a HEAD on the registry for a lookup, and the pod's
log stream copied into the build's log; it lists no entries (the registry's own
retention rules apply).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator, Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from paddlecloud.common.dockerconfig import Credentials


class BaseRefused(ValueError):
    """The backend cannot build on this base; the message says why, for the user."""


class BackendUnavailable(Exception):
    """Something the backend depends on (a registry, the cluster) failed; the message says
    what, for the user, and the request may be tried again."""


@dataclass(frozen=True)
class PipIndex:
    """Where pip looks for packages in a build (`builder.index_url`, `find_links`,
    `no_index`, `kaniko.trusted_hosts`), as pip's arguments: for either backend."""

    index_url: str | None = None
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    trusted_hosts: tuple[str, ...] = ()

    def args(self) -> list[str]:
        args: list[str] = []
        if self.index_url:
            args += ["--index-url", self.index_url]
        for link in self.find_links:
            args += ["--find-links", link]
        if self.no_index:
            args.append("--no-index")
        for host in self.trusted_hosts:
            args += ["--trusted-host", host]
        return args


@dataclass(frozen=True)
class RegistryLogin:
    """A user's saved credentials for one registry (their `registry` by name): used to
    read and pull a private base image."""

    server: str
    credentials: Credentials


@dataclass(frozen=True)
class BuildRequest:
    """One build to run, as the service recorded it."""

    build_id: str
    key: str
    owner: str
    requirements: str  # the requirements.txt text, already checked
    base: str | None = None
    package: str | None = None  # a PFS path, recorded with the build
    # What base_identity said the base is (Kaniko: the image pinned by digest), so the
    # build uses exactly what the key names even if the tag moved since.
    base_ref: str | None = None
    registry: RegistryLogin | None = None


@dataclass(frozen=True)
class Outcome:
    """How a build ended. `reason` is for the user: on failure it quotes the tool's last
    error lines."""

    succeeded: bool
    reason: str
    artifact: dict[str, Any] = field(default_factory=dict)  # local: python; Kaniko: image


@dataclass(frozen=True)
class Published:
    """A key's published result and the build that made it (whose log tells how)."""

    artifact: dict[str, Any]
    build_id: str


@dataclass(frozen=True)
class CacheEntry:
    key: str
    size: int  # bytes on disk
    last_used: float  # epoch seconds: built, or last handed out


@dataclass(frozen=True)
class LogLine:
    line: str  # without its newline
    cursor: str  # resume after this line


@dataclass(frozen=True)
class LogQuery:
    tail: int | None = None  # only the last N lines
    follow: bool = False
    cursor: str | None = None


class BuildBackend(abc.ABC):
    name: str
    # Part of every cache key: bump it whenever the same request would build something else.
    version: str
    # The fields of `Outcome.artifact` (null in the API until a build succeeded).
    artifact_fields: tuple[str, ...]
    # Whether published results can go (the size cap): then a build's view asks `lookup`.
    evicts: bool = True
    # Whether each user's results are their own: the key holds the owner, so one user's
    # result is never handed to another (Kaniko: user code runs as root in the build, so
    # an image is only as trustworthy as the requests of its owner).
    per_user: bool = False

    async def open(self) -> None:  # noqa: B027 - most backends need nothing here
        """Prepare to build (called once when the service starts)."""

    async def close(self) -> None:  # noqa: B027
        """Release what `open` took; `build` calls in flight were cancelled before."""

    @abc.abstractmethod
    async def base_identity(self, base: str | None, registry: RegistryLogin | None = None) -> str:
        """What the cache key holds for `base`; BaseRefused if it cannot be built on,
        BackendUnavailable if that cannot be found out now."""

    @abc.abstractmethod
    async def lookup(self, key: str, *, touch: bool, owner: str) -> Published | None:
        """The published result for `key` (`owner`'s, where results are per user); with
        `touch`, count this as a use of it. BackendUnavailable when that cannot be known now."""

    @abc.abstractmethod
    async def build(self, request: BuildRequest) -> Outcome:
        """Build and, on success, publish under `request.key`; the log goes to the
        build's own log (`request.build_id`)."""

    @abc.abstractmethod
    def logs(
        self, log_id: str, query: LogQuery, finished: Callable[[], Awaitable[bool]]
    ) -> AsyncGenerator[list[LogLine], None]:
        """The log's lines in batches, as they are written; BadCursor for a cursor
        that is not ours."""

    @abc.abstractmethod
    async def recover(self, interrupted: Collection[str]) -> None:
        """After a restart: stop and remove whatever unpublished builds left behind;
        `interrupted` are the ids the store still called active."""

    @abc.abstractmethod
    async def entries(self) -> list[CacheEntry]:
        """Every published result, for the size cap."""

    @abc.abstractmethod
    async def evict(self, key: str, *, unless_used_after: float) -> bool:
        """Unpublish and remove `key`'s result, unless it was used after the given time
        (then it stays, and the answer is False)."""
