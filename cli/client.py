"""The Python SDK: `AsyncClient` speaks the gateway's HTTP API, `Client` is its blocking twin."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json as jsonlib
import os
import shutil
import tempfile
import time
import uuid
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Concatenate, Literal, ParamSpec, Protocol, TypeVar, overload
from urllib.parse import quote, urlencode

import aiohttp

from . import __version__, pfspaths
from .answers import (
    A,
    DryRun,
    Entry,
    Event,
    Job,
    Listing,
    LogEntry,
    Quota,
    Token,
    Usage,
    User,
    Version,
    Whoami,
    Worker,
)
from .config import DEFAULT_TIMEOUT, TokenCache, config_path, load_config, paddle_home, token_cache_path
from .errors import (
    MAX_ERROR_BODY,
    ApiError,
    ConnectionProblem,
    CredentialsMissing,
    PaddleCloudError,
    UnexpectedAnswer,
    summarize_body,
)
from .package import PACKAGE_DIR, Package, build, prepare
from .paddlejob import JobWaitTimeout, LogStreamLost
from .progress import Progress
from .steps import SubmitSteps
from .transfer import DEFAULT_JOBS, STATE_FILE, ResumeState, TransferFailed, TransferReport, Transfers

__all__ = [
    "ApiError",
    "AsyncClient",
    "Client",
    "ConnectionProblem",
    "DryRun",
    "Entry",
    "Event",
    "Job",
    "JobWaitTimeout",
    "LogStreamLost",
    "PaddleCloudError",
    "Quota",
    "SubmitSteps",
    "TokenSlot",
    "TransferFailed",
    "TransferReport",
    "Worker",
]

API_PREFIX = "/api/v1/"
REQUEST_ID_HEADER = "X-Request-ID"
QUOTA_KEYS = ("cpu", "gpu", "memory", "jobs", "storage", "disk")
USER_AGENT = f"paddlecloud/{__version__} aiohttp/{aiohttp.__version__}"
NDJSON = "application/x-ndjson"
# Jobs asked for per page when following `next_cursor` (the server allows 1-500).
JOBS_PAGE = 500
# `wait` polls this often at first, then backs off to the maximum.
WAIT_INTERVAL = 0.5
WAIT_MAX_INTERVAL = 5.0
# A broken log stream is resumed for this long (backing off between attempts) before giving up;
# 502-504 are the gateway saying the jobs service is away for a moment (a restart).
LOG_RECONNECT_SECONDS = 60.0
LOG_RETRY_BASE_DELAY = 0.5
LOG_RETRY_MAX_DELAY = 8.0
RECONNECT_STATUSES = frozenset({502, 503, 504})

# How a request obtains a token: log in before sending when none is at hand ("eager"), only
# after the server answered 401 ("lazy"), or not at all ("never").
LoginPolicy = Literal["eager", "lazy", "never"]
QueryValue = str | int | float | bool | None
# `ls` pages: a small first page so the first lines come at once, then large ones, since each
# page of a POSIX directory costs the service a read of every name in it (docs/pfs.md).
LS_FIRST_PAGE = 1000
LS_PAGE = 10_000

T = TypeVar("T")
P = ParamSpec("P")
_UNSET: Any = object()
LocalPaths = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
RemotePaths = str | Sequence[str]


class TokenSlot(Protocol):
    """Where a client keeps its token between runs (`config.TokenCache.slot` is one)."""

    def load(self) -> str | None: ...

    def store(self, token: str, expires_at: str | None) -> None: ...

    def clear(self) -> None: ...


# Request bodies longer than this are written a slice at a time (see _SlicedBody).
BODY_SLICE = 1024 * 1024


class _SlicedBody(aiohttp.payload.Payload):
    """A bytes body written to the connection a slice at a time, each a view of the bytes.

    Handed bytes, aiohttp joins the headers and the whole body into one new object (Python
    3.11's `transport.writelines` does), and the transport then copies what the socket did
    not take at once: two copies of every 16 MiB upload chunk, in the event loop, just when
    gateway and pfs wait for that chunk. In bench/pfs uploads were about 5% faster sliced.
    The bytes do not change, so the body can be sent again (the retry after a 401).
    """

    _value: bytes

    def __init__(self, value: bytes) -> None:
        super().__init__(value, content_type="application/octet-stream")
        self._size = len(value)

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self._value.decode(encoding, errors)

    async def write(self, writer: aiohttp.abc.AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(
        self, writer: aiohttp.abc.AbstractStreamWriter, content_length: int | None
    ) -> None:
        view = memoryview(self._value)[:content_length]
        for at in range(0, len(view), BODY_SLICE):
            await writer.write(view[at : at + BODY_SLICE])


class AsyncClient:
    """A client for one gateway endpoint and one user.

    With a password it logs in by itself: before the first call when it holds no token, and
    again, once, when the server answers 401 to a token that went stale (expired, revoked, or
    issued by a restarted server), retrying the call with the new token. Every non-2xx answer
    raises `ApiError`; an unreachable server raises `ConnectionProblem`.

    PFS methods take absolute paths (`/pfs/<datacenter>/home/<user>/x`) or paths relative to
    your home (`data/x` is `/pfs/<datacenter>/home/<user>/data/x`): `datacenter` names the
    datacenter for those (the CLI passes the config's datacenter name), and the user is
    `username`, or who the token belongs to.

    `on_chunk` is handed to every transfer: it is called with the running count after each
    chunk moved (see `paddlecloud.transfer`).
    """

    def __init__(
        self,
        endpoint: str,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        *,
        token_cache: TokenSlot | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        log: Callable[[str], None] | None = None,
        datacenter: str | None = None,
        on_chunk: Callable[[int], None] | None = None,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.username = username
        self.datacenter = datacenter
        self._home: str | None = None
        self._password = password
        self._token = token
        self._token_loaded = token is not None
        self._expires_at: str | None = None
        self._cache = token_cache
        self._timeout = timeout
        self._log = log
        # Called with the running count after each chunk a transfer moves (see `Transfers`).
        self._on_chunk = on_chunk
        self._session: aiohttp.ClientSession | None = None
        # Concurrent calls that all meet a stale token log in once between them.
        self._login_lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"AsyncClient({self.endpoint!r}, username={self.username!r})"

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    @property
    def token(self) -> str | None:
        """The token the next call will send, if any (loaded from the cache on first use)."""
        return self._current_token()

    @property
    def can_login(self) -> bool:
        return bool(self.username) and self._password is not None

    def url(self, path: str) -> str:
        """`path` relative to `/api/v1/` (`"users"`), or absolute on the endpoint (`"/healthz"`)."""
        return self.endpoint + (path if path.startswith("/") else API_PREFIX + path)

    # --- the API -------------------------------------------------------------------------

    async def login(self) -> Token:
        """Trade the username and password for a token, keep it, and cache it if there is a cache.

        Returns the server's answer: `{token, expires_at, user, admin}`.
        """
        if not self.can_login:
            raise CredentialsMissing(f"no username and password to log in to {self.endpoint} with")
        body = await self.request(
            "POST", "auth/token", json={"username": self.username, "password": self._password}, auth=False
        )
        if not isinstance(body, dict) or not isinstance(body.get("token"), str):
            raise UnexpectedAnswer(f"{self.endpoint} answered the login without a token")
        self._token = body["token"]
        self._token_loaded = True
        expires_at = body.get("expires_at")
        self._expires_at = expires_at if isinstance(expires_at, str) else None
        if self._cache is not None:
            self._cache.store(body["token"], self._expires_at)
        return Token.from_dict(body)

    async def logout(self) -> bool:
        """Revoke the token on the server and forget it; False if there was no token to revoke."""
        token = self._current_token()
        if token is None:
            return False
        try:
            async with self.open("DELETE", "auth/token", login="never"):
                pass
        except ApiError as exc:
            # 401: the server no longer honours it anyway, which is what logging out wants.
            if exc.status != 401:
                raise
        self._forget(token)
        return True

    async def whoami(self) -> Whoami:
        """Who the token in use belongs to: user, admin, expires_at, datacenter, home."""
        return await self._answer(Whoami, "GET", "auth/whoami")

    async def version(self) -> Version:
        """The server's version and API version. Logs in only if the server insists (401)."""
        return await self._answer(Version, "GET", "version", login="lazy")

    async def users(self) -> list[User]:
        """Every user (admin only)."""
        return await self._list(User, "GET", "users", "users")

    async def create_user(self, name: str, password: str, admin: bool = False) -> User:
        """Create a user (admin only); returns the new `User`."""
        body = {"name": name, "password": password, "admin": admin}
        return await self._answer(User, "POST", "users", json=body)

    async def delete_user(self, name: str, *, remove_home: bool = False) -> None:
        """Delete a user (admin only): their tokens, their jobs, and their home, which is
        archived for an operator unless `remove_home` removes it."""
        params = {"home": "remove" if remove_home else "archive"}
        await self.request("DELETE", f"users/{quote(name, safe='')}", params=params)

    async def change_password(self, current: str, new: str) -> Token:
        """Change your own password. The server revokes every token of yours and hands this
        client a new one, which it keeps (and caches) and goes on with; it logs in with `new`
        from now on. Returns `{user, admin, expires_at, token}`."""
        body = await self._object(
            "PUT", "auth/password", json={"current_password": current, "new_password": new}
        )
        token = body.get("token")
        if not isinstance(token, str):
            raise UnexpectedAnswer(f"{self.endpoint} answered the password change without a token")
        self._password = new
        self._token = token
        self._token_loaded = True
        expires_at = body.get("expires_at")
        self._expires_at = expires_at if isinstance(expires_at, str) else None
        if self._cache is not None:
            self._cache.store(token, self._expires_at)
        return Token.from_dict(body)

    async def reset_password(self, name: str, password: str) -> User:
        """Set another user's password (admin only); every token of theirs is revoked."""
        return await self._answer(
            User, "PUT", f"users/{quote(name, safe='')}/password", json={"password": password}
        )

    async def set_quota(self, name: str, **quota: str | int | None) -> User:
        """Replace a user's quota (admin only): `cpu`, `memory`, `storage`, `disk` as Kubernetes quantities
        (`"4"`, `"500m"`, `"8Gi"`), `gpu` and `jobs` as integers; a key left out or None means
        unlimited. Returns the updated `User`."""
        unknown = sorted(set(quota) - set(QUOTA_KEYS))
        if unknown:
            raise ValueError(f"unknown quota keys {unknown}; known: {', '.join(QUOTA_KEYS)}")
        return await self._answer(User, "PUT", f"users/{quote(name, safe='')}/quota", json=quota)

    # --- PFS -----------------------------------------------------------------------------

    async def pfs_user(self) -> str:
        """Whose home relative PFS paths are in: `username`, else the token's user."""
        if not self.username:
            user = (await self.whoami()).user
            if not isinstance(user, str) or not user:
                raise UnexpectedAnswer(f"{self.endpoint} answered whoami without a user")
            self.username = user
        return self.username

    async def pfs_home(self) -> str:
        """Your PFS home as the server names it; relative PFS paths are beneath it.

        The server's own datacenter name wins over the one in the client config, which is
        only a label (two users of one platform need two entries with different names).
        """
        if self._home is None:
            home = (await self.whoami()).home
            if isinstance(home, str) and home.startswith("/pfs/") and home.count("/") == 4:
                self._home = home
            else:  # a server that does not say: fall back to the config's name
                self._home = pfspaths.home_of(self.datacenter or "", await self.pfs_user())
        return self._home

    async def pfs_path(self, path: str) -> str:
        """The absolute PFS path `path` names (see the class's note on relative paths)."""
        if pfspaths.needs_home(path):
            _, _, datacenter, _, user = (await self.pfs_home()).split("/")
            return pfspaths.resolve(path, datacenter, user)
        return pfspaths.resolve(path, None, None)

    async def pfs_ls(self, path: str = "", recursive: bool = False) -> Listing:
        """A directory's entries (all descendants with `recursive`), or a file's own."""
        params: dict[str, QueryValue] = {"path": await self.pfs_path(path), "recursive": recursive or None}
        return await self._answer(Listing, "GET", "pfs/ls", params=params)

    async def pfs_ls_pages(
        self, path: str = "", recursive: bool = False, *, first: int = LS_FIRST_PAGE, limit: int = LS_PAGE
    ) -> AsyncGenerator[Listing, None]:
        """A listing page by page (docs/pfs.md, "Listing a large directory"): `first` entries,
        then `limit` at a time, in tree order. The next page is asked for while the caller
        handles this one, so at most two pages are held. A server that does not page answers
        the whole listing as one page."""
        params: dict[str, QueryValue] = {
            "path": await self.pfs_path(path),
            "recursive": recursive or None,
            "limit": first,
        }
        fetch = asyncio.ensure_future(self._answer(Listing, "GET", "pfs/ls", params=dict(params)))
        try:
            while True:
                page = await fetch
                if page.next is None:
                    yield page
                    return
                params.update(limit=limit, after=page.next)
                fetch = asyncio.ensure_future(self._answer(Listing, "GET", "pfs/ls", params=dict(params)))
                yield page
        finally:
            if not fetch.done():
                fetch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await fetch

    async def pfs_stat(self, path: str, checksum: bool = False) -> Entry:
        """One entry (path, name, type, size, mtime, mode); with `checksum`, a file's `sha256` too."""
        resolved = await self.pfs_path(path)
        params: dict[str, QueryValue] = {"path": resolved, "checksum": "sha256" if checksum else None}
        return await self._answer(Entry, "GET", "pfs/stat", params=params)

    async def pfs_mkdir(self, path: str, parents: bool = True) -> Entry:
        """Make a directory (and its parents); returns its entry. Existing already is fine with `parents`."""
        body = {"path": await self.pfs_path(path), "parents": parents}
        return await self._answer(Entry, "POST", "pfs/mkdir", json=body)

    async def pfs_rm(self, path: str, recursive: bool = False) -> None:
        """Remove a file, or a directory (a non-empty one only with `recursive`)."""
        resolved = await self.pfs_path(path)
        await self.request("DELETE", "pfs/files", params={"path": resolved, "recursive": recursive or None})

    async def pfs_mv(self, src: str, dst: str, overwrite: bool = False) -> Entry:
        """Move or rename within PFS; returns the entry at `dst`. An existing `dst` needs `overwrite`."""
        body = {"src": await self.pfs_path(src), "dst": await self.pfs_path(dst), "overwrite": overwrite}
        return await self._answer(Entry, "POST", "pfs/mv", json=body)

    async def pfs_usage(self, user: str | None = None) -> Usage:
        """The bytes and files of your home, and its limit; or of `user`'s (admins only)."""
        return await self._answer(Usage, "GET", "pfs/usage", params={"user": user})

    async def upload(
        self,
        local: LocalPaths,
        remote: str,
        recursive: bool = False,
        *,
        jobs: int = DEFAULT_JOBS,
        overwrite: bool = False,
        verify: bool = True,
        progress: Progress | None = None,
        state_file: str | os.PathLike[str] | None = None,
    ) -> TransferReport:
        """Upload local files (directory trees with `recursive`) to the PFS path `remote`, like `cp`.

        Placed as `cp -r` places them: into `remote` when it is an existing directory or ends
        in `/`, else as `remote`; a directory given as a string ending in `/` puts what it
        holds into `remote` (rsync's rule, the way to copy into the same place again).

        Resumable: an interrupted upload of an unchanged file continues where the server's
        offset says, the next time. Files already identical at the destination are skipped; a
        different one there is an error unless `overwrite`. With `verify` (the default) the
        server checks the whole file's sha256 before it appears. Raises `TransferFailed`
        (with the report) if any file of several failed; a single file's failure as is.
        `state_file` defaults to `~/.paddle/uploads.json`.
        """
        # As given: a string's trailing slash asks for a directory's contents (see `placement`).
        sources = [local] if isinstance(local, str | os.PathLike) else list(local)
        transfers = await self._transfers(jobs, overwrite, verify, progress, state_file)
        report = await transfers.upload(sources, await self.pfs_path(remote), recursive=recursive)
        if report.failed:
            raise TransferFailed(report)
        return report

    async def download(
        self,
        remote: RemotePaths,
        local: str | os.PathLike[str],
        recursive: bool = False,
        *,
        jobs: int = DEFAULT_JOBS,
        overwrite: bool = False,
        verify: bool = True,
        progress: Progress | None = None,
        state_file: str | os.PathLike[str] | None = None,
        parents: bool = True,
    ) -> TransferReport:
        """Download PFS files (directory trees with `recursive`) to the local path `local`, like `cp`.

        Resumable through `<file>.paddlecloud-part`; each file's sha256 is compared with the
        server's before the part file is renamed into place (unless `verify` is off). Skips,
        conflicts and failures as for `upload`. With `parents` (the default here; the CLI's
        `-p`) missing parent directories of `local` are made; without, a missing one is refused.
        """
        sources = [await self.pfs_path(p) for p in ([remote] if isinstance(remote, str) else remote)]
        transfers = await self._transfers(jobs, overwrite, verify, progress, state_file)
        transfers.parents = parents
        report = await transfers.download(sources, os.fspath(local), recursive=recursive)
        if report.failed:
            raise TransferFailed(report)
        return report

    async def _transfers(
        self,
        jobs: int,
        overwrite: bool,
        verify: bool,
        progress: Progress | None,
        state_file: str | os.PathLike[str] | None,
    ) -> Transfers:
        state_path = Path(state_file) if state_file is not None else paddle_home(os.environ) / STATE_FILE
        return Transfers(
            self,
            user=await self.pfs_user(),
            state=ResumeState(state_path),
            progress=progress or Progress.quiet(),
            jobs=jobs,
            overwrite=overwrite,
            verify=verify,
            on_chunk=self._on_chunk,
        )

    # --- jobs ----------------------------------------------------------------------------

    @overload
    async def submit(self, spec: Mapping[str, Any], dry_run: Literal[False] = False) -> Job: ...

    @overload
    async def submit(self, spec: Mapping[str, Any], dry_run: Literal[True]) -> DryRun: ...

    @overload
    async def submit(self, spec: Mapping[str, Any], dry_run: bool) -> Job | DryRun: ...

    async def submit(self, spec: Mapping[str, Any], dry_run: bool = False) -> Job | DryRun:
        """Start a job from its spec (DESIGN §4); returns the new `Job`.

        Send only the fields you mean: the server fills in the defaults. With `dry_run` the
        server checks the spec, the quota and the package and starts nothing; the answer is
        then the plan, a `DryRun`. `submit_package` packs and uploads the package first.
        """
        params: dict[str, QueryValue] = {"dry_run": dry_run or None}
        body = await self._object("POST", "jobs", json=dict(spec), params=params)
        return DryRun.from_dict(body) if dry_run else Job.from_dict(body)

    async def submit_package(
        self,
        spec: Mapping[str, Any],
        package: str | os.PathLike[str],
        *,
        dry_run: bool = False,
        steps: SubmitSteps | None = None,
    ) -> Job | DryRun:
        """Pack and submit: place `package` on PFS (see `place_package`), then submit `spec` with it.

        Before an upload the server judges spec, name and quota (a dry run), so a mistake does
        not cost the upload. With `dry_run` nothing is uploaded or started and the plan is
        returned; a local package not on PFS yet is then reported missing, which is expected.
        """
        check = None if dry_run else spec
        remote = await self.place_package(package, upload=not dry_run, check=check, steps=steps)
        full = {**spec, "package": remote}
        if dry_run:
            return await self.submit(full, dry_run=True)
        return await self.submit(full)

    async def job(self, name: str) -> Job:
        """One job, with its `events` and `workers`."""
        path, params = _job_path(name)
        return await self._answer(Job, "GET", path, params=params)

    async def jobs(
        self,
        all: bool = False,
        state: str | Sequence[str] | None = None,
        limit: int | None = None,
        *,
        all_users: bool = False,
    ) -> list[Job]:
        """Your jobs, newest first: active ones, or with `all` finished ones too; `state` filters
        (one state or several). Follows the server's pages up to `limit` jobs (None: all).
        `all_users` (administrators only) lists every user's; each job says its `owner`."""
        states = state if isinstance(state, str) or state is None else ",".join(state)
        found: list[Job] = []
        cursor: str | None = None
        while True:
            page = JOBS_PAGE if limit is None else max(1, min(JOBS_PAGE, limit - len(found)))
            params: dict[str, QueryValue] = {
                "all": all or None,
                "all_users": all_users or None,
                "state": states,
                "limit": page,
                "cursor": cursor,
            }
            body = await self._object("GET", "jobs", params=params)
            batch = self._items(Job, body, "GET jobs", "jobs")
            found.extend(batch)
            next_cursor = body.get("next_cursor")
            if not isinstance(next_cursor, str) or not next_cursor or not batch:
                break
            if limit is not None and len(found) >= limit:
                break
            cursor = next_cursor
        return found if limit is None else found[:limit]

    async def workers(self, name: str) -> list[Worker]:
        """The job's parameter servers and trainers."""
        path, params = _job_path(name, "workers")
        body = await self._object("GET", path, params=params)
        return self._items(Worker, body, f"GET {path}", "workers")

    async def resources(self, name: str, since: float | None = None) -> dict[str, Any]:
        """The job's resource series per worker (docs/metrics.md §1.1): columns `t`,
        `cpu_cores`, `memory_bytes`, `gpu_utilization`, `gpu_memory_bytes`, each worker's
        `memory_limit_bytes`; with `since`, only the points after that Unix time."""
        path, params = _job_path(name, "resources")
        query: dict[str, QueryValue] = {**params, "since": since}
        return await self._object("GET", path, params=query)

    async def events(self, name: str) -> list[Event]:
        """The job's events, oldest first."""
        path, params = _job_path(name, "events")
        body = await self._object("GET", path, params=params)
        return self._items(Event, body, f"GET {path}", "events")

    async def metrics(self, name: str, tag: str | None = None) -> dict[str, Any]:
        """The job's training curves (docs/metrics.md §2.3): `series`, one per worker (or
        TensorBoard run) and tag, with columns `step`, `wall_time` and `value`, and `warnings`
        (what the server did not read, and why); only `tag` when given."""
        path, params = _job_path(name, "metrics")
        return await self._object("GET", path, params={**params, "tag": tag})

    async def quota(self) -> Quota:
        """Your usage against your limits (cpu, gpu, memory, jobs, storage), and the GPUs held."""
        return await self._answer(Quota, "GET", "quota")

    async def registries(self) -> list[dict[str, Any]]:
        """Your saved registry credentials, by name: `{name, server, username, created_at}`
        each (the password is never sent back)."""
        body = await self.request("GET", "registries")
        return list(body.get("registries") or []) if isinstance(body, dict) else []

    async def save_registry(self, name: str, server: str, username: str, password: str) -> dict[str, Any]:
        """Save credentials for a container registry under `name` (replacing any of that
        name); a job names them with `registry=name`."""
        body = {"name": name, "server": server, "username": username, "password": password}
        answer = await self.request("POST", "registries", json=body)
        return dict(answer) if isinstance(answer, dict) else {}

    async def delete_registry(self, name: str) -> None:
        """Forget the saved registry `name`."""
        await self.request("DELETE", f"registries/{quote(name, safe='')}")

    async def kill(self, name: str, rm: bool = False) -> Job | None:
        """Stop every process of the job (it ends KILLED if it was still active) and return it;
        with `rm` also remove it and its logs from history (returns None then)."""
        path, params = _job_path(name)
        body = await self.request("DELETE", path, params={**params, "rm": rm or None})
        return Job.from_dict(body) if isinstance(body, dict) else None

    async def wait(
        self,
        name: str,
        timeout: float | None = None,  # noqa: ASYNC109 - the blocking Client's twin takes the same
        *,
        interval: float = WAIT_INTERVAL,
    ) -> Job:
        """Poll the job until it is SUCCEEDED, FAILED or KILLED and return it (events and workers
        included); raise `JobWaitTimeout` when `timeout` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = interval
        while True:
            job = await self.job(name)
            if job.final:
                return job
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise JobWaitTimeout(name, timeout or 0.0, job)
                delay = min(delay, left)
            await asyncio.sleep(delay)
            delay = min(WAIT_MAX_INTERVAL, delay * 1.5)

    async def logs(
        self,
        name: str,
        *,
        tail: int | None = None,
        follow: bool = False,
        role: str | None = None,
        worker: str | Sequence[str] | None = None,
        cursor: str | None = None,
        reconnect_for: float = LOG_RECONNECT_SECONDS,
    ) -> AsyncGenerator[LogEntry, None]:
        """The job's log lines (`LogEntry`: worker, line, cursor), parameter servers' included.

        `tail` starts from the last N lines of each worker; `follow` goes on until the job
        has ended and every line was sent; `role` (`trainer` or `pserver`) and `worker`
        (one name or several) narrow it down; `cursor` starts after that line. When the
        connection drops midway it reconnects after the last line received, so no line is
        lost or repeated; after `reconnect_for` seconds of failed attempts it gives up with
        `LogStreamLost` (whose `cursor` lets a caller resume later).
        """
        workers = [worker] if isinstance(worker, str) else list(worker or [])
        last = cursor
        failing_since: float | None = None
        attempt = 0
        timeout = None
        if follow:
            # A quiet job sends nothing for hours: no read timeout, but connecting still has one.
            timeout = aiohttp.ClientTimeout(
                total=None, connect=self._timeout, sock_connect=self._timeout, sock_read=None
            )
        while True:
            path, owner = _job_path(name, "logs")
            query: list[tuple[str, str]] = list(owner.items())
            if last is not None:
                query.append(("cursor", last))
            elif tail is not None:
                query.append(("tail", str(tail)))
            if follow:
                query.append(("follow", "1"))
            if role:
                query.append(("role", role))
            query.extend(("worker", w) for w in workers)
            path += "?" + urlencode(query) if query else ""
            try:
                async with self.open(
                    "GET", path, headers={"Accept": NDJSON}, client_timeout=timeout
                ) as response:
                    buffer = b""
                    async for chunk in response.content.iter_any():
                        buffer += chunk
                        *complete, buffer = buffer.split(b"\n")
                        for raw in complete:
                            entry = self._log_entry(raw, name)
                            if entry is None:
                                continue
                            if entry.cursor is not None:
                                last = entry.cursor
                            failing_since, attempt = None, 0
                            yield entry
                    # A clean end of the body; a last line without its newline still counts.
                    entry = self._log_entry(buffer, name)
                    if entry is not None:
                        yield entry
                return
            except (ConnectionProblem, ApiError) as exc:
                if isinstance(exc, ApiError) and exc.status not in RECONNECT_STATUSES:
                    raise
                # A partial line in the buffer is dropped: it comes again after `last`.
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since >= reconnect_for:
                    reason = exc.reason if isinstance(exc, ConnectionProblem) else str(exc)
                    raise LogStreamLost(name, reconnect_for, reason, last) from exc
                attempt += 1
                if self._log is not None:
                    self._log(f"log stream of {name} broke ({exc}); reconnecting (attempt {attempt})")
                await asyncio.sleep(min(LOG_RETRY_MAX_DELAY, LOG_RETRY_BASE_DELAY * 2 ** (attempt - 1)))

    def _log_entry(self, raw: bytes, name: str) -> LogEntry | None:
        if not raw.strip():
            return None
        try:
            entry = jsonlib.loads(raw)
        except ValueError:
            raise UnexpectedAnswer(
                f"{self.endpoint} sent a log line of job {name} that is not JSON: "
                f"{summarize_body(raw, 'text/plain', 80)}"
            ) from None
        if not isinstance(entry, dict):
            raise UnexpectedAnswer(f"{self.endpoint} sent a log line of job {name} that is not an object")
        return LogEntry.from_dict(entry)

    # --- job packages ----------------------------------------------------------------------

    async def package_path(self, filename: str) -> str:
        """Where a package archive called `filename` (`<identity>.tar.gz`) lives on PFS."""
        return pfspaths.join(await self.pfs_home(), f"{PACKAGE_DIR}/{filename}")

    async def package_on_pfs(self, pkg: Package) -> str | None:
        """The PFS path of `pkg` if PFS already holds it, else None: one stat."""
        remote = await self.package_path(pkg.filename)
        try:
            entry = await self.pfs_stat(remote)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        # The name says the contents: pfs places a file under it only once it is complete and
        # it has recomputed that name from the bytes (the manifest of a directory's package,
        # the sha256 of a ready-made archive). A built archive's size is checked too.
        if entry.type != "file":
            return None
        return remote if pkg.archive is None or entry.size == pkg.size else None

    async def upload_package(self, pkg: Package, *, progress: Progress | None = None) -> str:
        """Upload `pkg`'s archive (built, or given) to its place on PFS, replacing a damaged
        copy; returns its PFS path."""
        if pkg.archive is None:
            raise ValueError("the package's archive is not built yet (paddlecloud.package.build)")
        remote = await self.package_path(pkg.filename)
        await self.upload(pkg.archive, remote, jobs=1, overwrite=True, progress=progress)
        return remote

    async def place_package(
        self,
        package: str | os.PathLike[str],
        *,
        upload: bool = True,
        check: Mapping[str, Any] | None = None,
        steps: SubmitSteps | None = None,
    ) -> str:
        """The PFS path of a job package, uploading it first (with `upload`) if PFS lacks it.

        `package` is a local directory (named by its manifest, packed reproducibly only if
        PFS lacks it: see `paddlecloud.package`), a
        local `.tar.gz`/`.zip`, or already a PFS path (`/pfs/...`, `pfs:x`), returned resolved.
        With `check`, a job spec, the server judges it (a dry run) before anything is uploaded.
        `steps` hears what happens, and gives the upload its progress.
        """
        steps = steps or SubmitSteps()
        text = os.fspath(package)
        if pfspaths.is_remote(text):
            remote = await self.pfs_path(text)
            steps.remote(remote)
            return remote
        pkg = await asyncio.to_thread(prepare, Path(text))
        steps.packed(pkg, text)
        existing = await self.package_on_pfs(pkg)
        if existing:
            steps.found(existing)
            return existing
        remote = await self.package_path(pkg.filename)
        if not upload:
            steps.would_upload(pkg, remote)
            return remote
        if check is not None:
            await self.submit({**check, "package": remote}, dry_run=True)
        # Only now, PFS lacking it, is the archive built: from the entries just hashed.
        workdir = await asyncio.to_thread(tempfile.mkdtemp, prefix="paddlecloud-package-")
        try:
            pkg = await asyncio.to_thread(build, pkg, Path(workdir))
            return await self.upload_package(pkg, progress=steps.uploading(pkg, remote))
        finally:
            await asyncio.to_thread(shutil.rmtree, workdir, True)

    async def package(self, path: str | os.PathLike[str], *, progress: Progress | None = None) -> str:
        """The PFS path of a job package, uploading it first if PFS does not hold it yet."""
        return await self.place_package(path, steps=SubmitSteps(progress))

    async def package_location(self, path: str | os.PathLike[str]) -> str:
        """The PFS path `package(path)` would return, without uploading anything."""
        return await self.place_package(path, upload=False)

    # --- the transport that later features reuse ---------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = _UNSET,
        params: Mapping[str, QueryValue] | None = None,
        headers: Mapping[str, str] | None = None,
        auth: bool = True,
        login: LoginPolicy = "eager",
    ) -> Any:
        """Send a request and return its JSON body (None for 204 or an empty body)."""
        async with self.open(
            method, path, json=json, params=params, headers=headers, auth=auth, login=login
        ) as response:
            return await self._read_json(response, method, path)

    @asynccontextmanager
    async def open(
        self,
        method: str,
        path: str,
        *,
        json: Any = _UNSET,
        data: Any = None,
        params: Mapping[str, QueryValue] | None = None,
        headers: Mapping[str, str] | None = None,
        auth: bool = True,
        login: LoginPolicy = "eager",
        client_timeout: aiohttp.ClientTimeout | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Send a request and yield its 2xx response unread, for bodies that must be streamed.

        `auth=False` sends no credentials at all. `data` may be bytes or a stream; a stream
        cannot be sent twice, so a 401 to it raises instead of logging in again and retrying.
        Errors while the caller reads the body become `ConnectionProblem`. `client_timeout`
        replaces the client's connect and read timeouts for this request.
        """
        session = self._ensure_session()
        url = self.url(path)
        query = _query(params)
        replayable = data is None or isinstance(data, bytes | bytearray | str)
        logged_in_now = False
        if auth and login == "eager" and self._current_token() is None and self.username:
            if not self.can_login:
                # A user with neither token nor password (after `logout`): said, rather than
                # the server's bare 401 for a request sent without credentials.
                raise CredentialsMissing(
                    f"not logged in to {self.endpoint} as {self.username}: log in first (paddlecloud login)"
                )
            await self._refresh(stale=None)
            logged_in_now = True
        retried = False
        while True:
            token = self._current_token() if auth else None
            sent_headers = {REQUEST_ID_HEADER: uuid.uuid4().hex, **(headers or {})}
            if token is not None:
                sent_headers["Authorization"] = f"Bearer {token}"
            kwargs: dict[str, Any] = {"params": query, "headers": sent_headers}
            if json is not _UNSET:
                kwargs["json"] = json
            if data is not None:
                sliced = isinstance(data, bytes) and len(data) > BODY_SLICE
                kwargs["data"] = _SlicedBody(data) if sliced else data
            if client_timeout is not None:
                # aiohttp's own timeouts, not asyncio.timeout: a log follow must lift the
                # per-read limit (sock_read) yet keep the connect one, which no deadline expresses.
                kwargs["timeout"] = client_timeout
            response = await self._send(session, method, url, kwargs)
            if response.status == 401 and auth:
                # One login per call at most: a token refused right after a login will not be
                # helped by another, and a stream body cannot be sent twice.
                if login != "never" and not retried and not logged_in_now and replayable and self.can_login:
                    response.release()
                    await self._refresh(stale=token)
                    retried = True
                    continue
                if token is not None:
                    self._forget(token)
            break
        if not 200 <= response.status < 300:
            raise await self._api_error(response, method, url, sent_headers[REQUEST_ID_HEADER])
        try:
            yield response
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self._connection_problem(exc) from exc
        finally:
            response.release()

    @asynccontextmanager
    async def forward(
        self, method: str, path_qs: str, *, headers: Mapping[str, str], data: Any = None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Send a request another program made (a browser's, to `paddlecloud tensorboard`) to
        `path_qs` on the endpoint with this client's token, and yield the answer whatever its
        status, unread and decoded (no Content-Encoding left), redirects not followed."""
        if self._current_token() is None and self.username and self.can_login:
            await self._refresh(stale=None)
        sent = {REQUEST_ID_HEADER: uuid.uuid4().hex, **headers}
        token = self._current_token()
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        session = self._ensure_session()
        try:
            response = await session.request(
                method, self.endpoint + path_qs, headers=sent, data=data, allow_redirects=False
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self._connection_problem(exc) from exc
        try:
            yield response
        finally:
            response.release()

    # --- internals ------------------------------------------------------------------------

    def _ensure_session(self) -> aiohttp.ClientSession:
        # Made on first use, inside the running loop that will own it.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                # No total limit: log follows and multi-GB transfers legitimately take hours;
                # what must not happen is a connect or a read that hangs forever.
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=self._timeout, sock_connect=self._timeout, sock_read=self._timeout
                ),
                headers={"User-Agent": USER_AGENT},
            )
        return self._session

    def _current_token(self) -> str | None:
        if not self._token_loaded:
            self._token_loaded = True
            if self._token is None and self._cache is not None:
                self._token = self._cache.load()
        return self._token

    def _forget(self, token: str) -> None:
        if self._token == token:
            self._token = None
            if self._cache is not None:
                self._cache.clear()

    async def _refresh(self, stale: str | None) -> None:
        async with self._login_lock:
            if self._token is not None and self._token != stale:
                return  # another call logged in while this one waited for the lock
            await self.login()

    async def _send(
        self, session: aiohttp.ClientSession, method: str, url: str, kwargs: dict[str, Any]
    ) -> aiohttp.ClientResponse:
        try:
            response = await session.request(method, url, **kwargs)
        except aiohttp.InvalidURL as exc:
            raise PaddleCloudError(f"invalid URL {str(exc.url)!r} (endpoint {self.endpoint!r})") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self._connection_problem(exc) from exc
        if self._log is not None:
            request_id = response.headers.get(REQUEST_ID_HEADER) or kwargs["headers"][REQUEST_ID_HEADER]
            self._log(f"{method} {url} -> {response.status} (request id {request_id})")
        return response

    async def _api_error(
        self, response: aiohttp.ClientResponse, method: str, url: str, sent_request_id: str
    ) -> ApiError:
        try:
            body = await response.content.read(MAX_ERROR_BODY)
        except (aiohttp.ClientError, TimeoutError):
            body = b""  # the status alone still says what happened
        finally:
            response.release()
        return ApiError.from_response(
            response.status,
            response.reason,
            response.headers.get("Content-Type", ""),
            body,
            request_id=response.headers.get(REQUEST_ID_HEADER) or sent_request_id,
            method=method,
            url=url,
        )

    async def _read_json(self, response: aiohttp.ClientResponse, method: str, path: str) -> Any:
        if response.status == 204:
            return None
        raw = await response.read()
        if not raw.strip():
            return None
        try:
            return jsonlib.loads(raw)
        except ValueError:
            content_type = response.headers.get("Content-Type") or "no content type"
            raise UnexpectedAnswer(
                f"{self.endpoint} answered {method} {path} with {content_type}, not JSON "
                f"({summarize_body(raw, content_type, 80)}); is it a PaddleCloud gateway?"
            ) from None

    async def _object(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        body = await self.request(method, path, **kwargs)
        if not isinstance(body, dict):
            raise UnexpectedAnswer(f"{self.endpoint} answered {method} {path} without a JSON object")
        return body

    async def _answer(self, kind: type[A], method: str, path: str, **kwargs: Any) -> A:
        return kind.from_dict(await self._object(method, path, **kwargs))

    async def _list(self, kind: type[A], method: str, path: str, key: str) -> list[A]:
        return self._items(kind, await self._object(method, path), f"{method} {path}", key)

    def _items(self, kind: type[A], body: Mapping[str, Any], call: str, key: str) -> list[A]:
        items = body.get(key)
        if not isinstance(items, list):
            raise UnexpectedAnswer(f"{self.endpoint} answered {call} without a `{key}` list")
        return [kind.from_dict(item) for item in items if isinstance(item, Mapping)]

    def _connection_problem(self, exc: BaseException) -> ConnectionProblem:
        reason: str
        if isinstance(exc, TimeoutError):
            reason = f"no answer within {self._timeout:g}s"
        elif isinstance(exc, aiohttp.ClientConnectorDNSError):
            reason = f"cannot resolve host {exc.host!r}"
        elif isinstance(exc, aiohttp.ClientSSLError):
            reason = f"TLS failed: {exc}"
        elif isinstance(exc, aiohttp.ClientConnectorError):
            os_error = exc.os_error
            if isinstance(os_error, ConnectionRefusedError):
                reason = "connection refused (is the server running?)"
            else:
                reason = (os_error.strerror or str(os_error) or type(os_error).__name__).lower()
        elif isinstance(exc, aiohttp.ServerDisconnectedError):
            reason = "the server closed the connection without answering"
        elif isinstance(exc, aiohttp.ClientPayloadError):
            reason = "the connection broke while the answer was being read"
        else:
            reason = str(exc) or type(exc).__name__
        return ConnectionProblem(self.endpoint, reason)


def _job_path(name: str, *rest: str) -> tuple[str, dict[str, str]]:
    """The API path of a job and its query: `NAME` is one of yours, `USER/NAME` one of that
    user's (which only an administrator may name)."""
    user, slash, job = name.rpartition("/")
    if slash and (not user or not job or "/" in user):
        raise PaddleCloudError(f"{name!r} is not a job: give NAME, or USER/NAME for another user's job")
    path = "/".join(["jobs", quote(job, safe=""), *rest])
    return path, ({"user": user} if slash else {})


def _query(params: Mapping[str, QueryValue] | None) -> dict[str, str] | None:
    """Query values as the API spells them: booleans as 1/0, None left out."""
    if params is None:
        return None
    out: dict[str, str] = {}
    for key, value in params.items():
        if value is None:
            continue
        out[key] = ("1" if value else "0") if isinstance(value, bool) else str(value)
    return out


def _blocking(
    method: Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[Client, P], T]:
    """`AsyncClient`'s coroutine method as a method of `Client` that runs it to completion."""

    @functools.wraps(method)
    def run(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(method(self.aio, *args, **kwargs))

    return run


def _blocking_iter(
    method: Callable[Concatenate[AsyncClient, P], AsyncGenerator[T, None]],
) -> Callable[Concatenate[Client, P], Iterator[T]]:
    """`AsyncClient`'s async generator method as a method of `Client` that gives a plain iterator."""

    @functools.wraps(method)
    def run(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        return self._iterate(method(self.aio, *args, **kwargs))

    return run


def _close_client(aio: AsyncClient, runner: asyncio.Runner) -> None:
    """Close a blocking `Client`'s session and its event loop (once: see `Client.close`)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        try:
            runner.run(aio.close())
        finally:
            runner.close()
    else:
        # Collected inside someone's running event loop, where no other loop can run: the
        # session's sockets go with the process, and only the private loop is closed.
        runner.close()


class Client:
    """The blocking client: `AsyncClient`'s methods, each run to completion on a private event loop.

    It takes the same arguments as `AsyncClient`, and its methods are `AsyncClient`'s, made
    blocking (their documentation is there). Use it as a context manager, or call `close()`.
    It cannot be used from inside a running event loop (use `AsyncClient` there), nor from
    several threads at once.
    """

    def __init__(
        self,
        endpoint: str,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        **options: Any,
    ) -> None:
        self.aio = AsyncClient(endpoint, username, password, token, **options)
        self._runner = asyncio.Runner()
        self._closed = False
        # A script that never calls close() (the docs' examples, `submit(Client.from_config())`)
        # still closes the HTTP session: when the client is collected, or at the latest at
        # exit, before aiohttp would complain of an "Unclosed client session".
        self._finalizer = weakref.finalize(self, _close_client, self.aio, self._runner)

    def __repr__(self) -> str:
        return f"Client({self.aio.endpoint!r}, username={self.aio.username!r})"

    @classmethod
    def from_config(
        cls,
        datacenter: str | None = None,
        *,
        config: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        **options: Any,
    ) -> Client:
        """A client for a datacenter of the client config, as the CLI makes one.

        The config is `config`, else `$PADDLE_CONFIG`, else `~/.paddle/config`; the datacenter
        `datacenter`, else `current-datacenter`. Tokens are shared with the CLI's cache
        (`~/.paddle/tokens.json`). `ConfigMissing`/`ConfigError` say what is wrong.
        """
        env = os.environ if env is None else env
        loaded = load_config(config_path(env, os.fspath(config) if config is not None else None))
        chosen = loaded.select(datacenter)
        slot = TokenCache(token_cache_path(env)).slot(chosen.name, chosen.username, chosen.endpoint)
        options.setdefault("datacenter", chosen.name)
        password = chosen.password or None  # none after `paddlecloud logout`
        return cls(chosen.endpoint, chosen.username, password, token_cache=slot, **options)

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._finalizer()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise PaddleCloudError("this Client is closed")
        return self._runner.run(coro)

    # who and what
    login = _blocking(AsyncClient.login)
    logout = _blocking(AsyncClient.logout)
    whoami = _blocking(AsyncClient.whoami)
    version = _blocking(AsyncClient.version)
    users = _blocking(AsyncClient.users)
    create_user = _blocking(AsyncClient.create_user)
    delete_user = _blocking(AsyncClient.delete_user)
    set_quota = _blocking(AsyncClient.set_quota)
    change_password = _blocking(AsyncClient.change_password)
    reset_password = _blocking(AsyncClient.reset_password)

    @overload
    def submit(self, spec: Mapping[str, Any], dry_run: Literal[False] = False) -> Job: ...

    @overload
    def submit(self, spec: Mapping[str, Any], dry_run: Literal[True]) -> DryRun: ...

    @overload
    def submit(self, spec: Mapping[str, Any], dry_run: bool) -> Job | DryRun: ...

    def submit(self, spec: Mapping[str, Any], dry_run: bool = False) -> Job | DryRun:
        return self._run(self.aio.submit(spec, dry_run))

    submit.__doc__ = AsyncClient.submit.__doc__

    logs = _blocking_iter(AsyncClient.logs)

    # jobs
    submit_package = _blocking(AsyncClient.submit_package)
    job = _blocking(AsyncClient.job)
    jobs = _blocking(AsyncClient.jobs)
    workers = _blocking(AsyncClient.workers)
    events = _blocking(AsyncClient.events)
    metrics = _blocking(AsyncClient.metrics)
    resources = _blocking(AsyncClient.resources)
    quota = _blocking(AsyncClient.quota)
    registries = _blocking(AsyncClient.registries)
    save_registry = _blocking(AsyncClient.save_registry)
    delete_registry = _blocking(AsyncClient.delete_registry)
    kill = _blocking(AsyncClient.kill)
    wait = _blocking(AsyncClient.wait)

    def _iterate(self, stream: AsyncGenerator[T, None]) -> Iterator[T]:
        """An async generator as a plain iterator; each item is fetched when asked for."""

        async def step() -> tuple[bool, T | None]:
            try:
                return True, await stream.__anext__()
            except StopAsyncIteration:
                return False, None

        try:
            while True:
                more, item = self._run(step())
                if not more or item is None:
                    return
                yield item
        finally:
            if not self._closed:
                self._run(stream.aclose())

    # PFS
    pfs_user = _blocking(AsyncClient.pfs_user)
    pfs_home = _blocking(AsyncClient.pfs_home)
    pfs_path = _blocking(AsyncClient.pfs_path)
    pfs_ls = _blocking(AsyncClient.pfs_ls)
    pfs_ls_pages = _blocking_iter(AsyncClient.pfs_ls_pages)
    pfs_stat = _blocking(AsyncClient.pfs_stat)
    pfs_mkdir = _blocking(AsyncClient.pfs_mkdir)
    pfs_rm = _blocking(AsyncClient.pfs_rm)
    pfs_mv = _blocking(AsyncClient.pfs_mv)
    pfs_usage = _blocking(AsyncClient.pfs_usage)
    upload = _blocking(AsyncClient.upload)
    download = _blocking(AsyncClient.download)

    @property
    def endpoint(self) -> str:
        return self.aio.endpoint

    @property
    def token(self) -> str | None:
        return self.aio.token

    # job packages
    package_path = _blocking(AsyncClient.package_path)
    package_on_pfs = _blocking(AsyncClient.package_on_pfs)
    upload_package = _blocking(AsyncClient.upload_package)
    place_package = _blocking(AsyncClient.place_package)
    package = _blocking(AsyncClient.package)
    package_location = _blocking(AsyncClient.package_location)

    # the transport
    request = _blocking(AsyncClient.request)
