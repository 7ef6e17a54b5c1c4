"""The Python SDK: `AsyncClient` speaks the gateway's HTTP API, `Client` is its blocking twin."""

from __future__ import annotations

import asyncio
import json as jsonlib
import os
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol, TypeVar
from urllib.parse import quote

import aiohttp

from . import __version__, pfspaths
from .config import paddle_home
from .errors import (
    MAX_ERROR_BODY,
    ApiError,
    ConnectionProblem,
    CredentialsMissing,
    PaddleCloudError,
    UnexpectedAnswer,
    summarize_body,
)
from .progress import Progress
from .transfer import DEFAULT_JOBS, STATE_FILE, ResumeState, TransferFailed, TransferReport, Transfers

__all__ = [
    "ApiError",
    "AsyncClient",
    "Client",
    "ConnectionProblem",
    "PaddleCloudError",
    "TokenSlot",
    "TransferFailed",
    "TransferReport",
]

API_PREFIX = "/api/v1/"
DEFAULT_TIMEOUT = 30.0
REQUEST_ID_HEADER = "X-Request-ID"
QUOTA_KEYS = ("cpu", "gpu", "memory", "jobs", "storage")
USER_AGENT = f"paddlecloud/{__version__} aiohttp/{aiohttp.__version__}"

# How a request obtains a token: log in before sending when none is at hand ("eager"), only
# after the server answered 401 ("lazy"), or not at all ("never").
LoginPolicy = Literal["eager", "lazy", "never"]
QueryValue = str | int | float | bool | None

T = TypeVar("T")
_UNSET: Any = object()
LocalPaths = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
RemotePaths = str | Sequence[str]


class TokenSlot(Protocol):
    """Where a client keeps its token between runs (`config.TokenCache.slot` is one)."""

    def load(self) -> str | None: ...

    def store(self, token: str, expires_at: str | None) -> None: ...

    def clear(self) -> None: ...


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

    async def login(self) -> dict[str, Any]:
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
        return body

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

    async def whoami(self) -> dict[str, Any]:
        """`{user, admin, expires_at}` for the token in use."""
        return await self._object("GET", "auth/whoami")

    async def version(self) -> dict[str, Any]:
        """The server's `{version, api}`. Logs in only if the server insists (401)."""
        return await self._object("GET", "version", login="lazy")

    async def users(self) -> list[dict[str, Any]]:
        """Every user (admin only)."""
        body = await self._object("GET", "users")
        users = body.get("users")
        if not isinstance(users, list):
            raise UnexpectedAnswer(f"{self.endpoint} answered GET users without a `users` list")
        return users

    async def create_user(self, name: str, password: str, admin: bool = False) -> dict[str, Any]:
        """Create a user (admin only); returns the new `User`."""
        return await self._object("POST", "users", json={"name": name, "password": password, "admin": admin})

    async def delete_user(self, name: str) -> None:
        """Delete a user (admin only)."""
        await self.request("DELETE", f"users/{quote(name, safe='')}")

    async def set_quota(self, name: str, **quota: str | int | None) -> dict[str, Any]:
        """Replace a user's quota (admin only): `cpu`, `memory`, `storage` as Kubernetes quantities
        (`"4"`, `"500m"`, `"8Gi"`), `gpu` and `jobs` as integers; a key left out or None means
        unlimited. Returns the updated `User`."""
        unknown = sorted(set(quota) - set(QUOTA_KEYS))
        if unknown:
            raise ValueError(f"unknown quota keys {unknown}; known: {', '.join(QUOTA_KEYS)}")
        return await self._object("PUT", f"users/{quote(name, safe='')}/quota", json=quota)

    # --- PFS -----------------------------------------------------------------------------

    async def pfs_user(self) -> str:
        """Whose home relative PFS paths are in: `username`, else the token's user."""
        if not self.username:
            user = (await self.whoami()).get("user")
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
            home = (await self.whoami()).get("home")
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

    async def pfs_ls(self, path: str = "", recursive: bool = False) -> dict[str, Any]:
        """`{path, entries}`: a directory's entries (all descendants with `recursive`), or a file's own."""
        resolved = await self.pfs_path(path)
        return await self._object("GET", "pfs/ls", params={"path": resolved, "recursive": recursive or None})

    async def pfs_stat(self, path: str, checksum: bool = False) -> dict[str, Any]:
        """One entry `{path, name, type, size, mtime, mode}`; with `checksum`, a file's `sha256` too."""
        resolved = await self.pfs_path(path)
        params: dict[str, QueryValue] = {"path": resolved, "checksum": "sha256" if checksum else None}
        return await self._object("GET", "pfs/stat", params=params)

    async def pfs_mkdir(self, path: str, parents: bool = True) -> dict[str, Any]:
        """Make a directory (and its parents); returns its entry. Existing already is fine with `parents`."""
        resolved = await self.pfs_path(path)
        return await self._object("POST", "pfs/mkdir", json={"path": resolved, "parents": parents})

    async def pfs_rm(self, path: str, recursive: bool = False) -> None:
        """Remove a file, or a directory (a non-empty one only with `recursive`)."""
        resolved = await self.pfs_path(path)
        await self.request("DELETE", "pfs/files", params={"path": resolved, "recursive": recursive or None})

    async def pfs_mv(self, src: str, dst: str, overwrite: bool = False) -> dict[str, Any]:
        """Move or rename within PFS; returns the entry at `dst`. An existing `dst` needs `overwrite`."""
        body = {"src": await self.pfs_path(src), "dst": await self.pfs_path(dst), "overwrite": overwrite}
        return await self._object("POST", "pfs/mv", json=body)

    async def pfs_usage(self, user: str | None = None) -> dict[str, Any]:
        """`{user, bytes, files, limit}` of your home, or of `user`'s (admins only)."""
        return await self._object("GET", "pfs/usage", params={"user": user})

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

        Resumable: an interrupted upload of an unchanged file continues where the server's
        offset says, the next time. Files already identical at the destination are skipped; a
        different one there is an error unless `overwrite`. With `verify` (the default) the
        server checks the whole file's sha256 before it appears. Raises `TransferFailed`
        (with the report) if any file of several failed; a single file's failure as is.
        `state_file` defaults to `~/.paddle/uploads.json`.
        """
        sources = [Path(p) for p in ([local] if isinstance(local, str | os.PathLike) else local)]
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
    ) -> TransferReport:
        """Download PFS files (directory trees with `recursive`) to the local path `local`, like `cp`.

        Resumable through `<file>.paddlecloud-part`; each file's sha256 is compared with the
        server's before the part file is renamed into place (unless `verify` is off). Skips,
        conflicts and failures as for `upload`.
        """
        sources = [await self.pfs_path(p) for p in ([remote] if isinstance(remote, str) else remote)]
        transfers = await self._transfers(jobs, overwrite, verify, progress, state_file)
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
        )

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
        if auth and login == "eager" and self._current_token() is None and self.can_login:
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
                kwargs["data"] = data
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


class Client:
    """The blocking client: `AsyncClient`'s methods, each run to completion on a private event loop.

    Use it as a context manager, or call `close()`. It cannot be used from inside a running event
    loop (use `AsyncClient` there), nor from several threads at once.
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
    ) -> None:
        self.aio = AsyncClient(
            endpoint,
            username,
            password,
            token,
            token_cache=token_cache,
            timeout=timeout,
            log=log,
            datacenter=datacenter,
        )
        self._runner = asyncio.Runner()
        self._closed = False

    def __repr__(self) -> str:
        return f"Client({self.aio.endpoint!r}, username={self.aio.username!r})"

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
        try:
            self._runner.run(self.aio.close())
        finally:
            self._runner.close()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise PaddleCloudError("this Client is closed")
        return self._runner.run(coro)

    @property
    def endpoint(self) -> str:
        return self.aio.endpoint

    @property
    def token(self) -> str | None:
        return self.aio.token

    def login(self) -> dict[str, Any]:
        return self._run(self.aio.login())

    def logout(self) -> bool:
        return self._run(self.aio.logout())

    def whoami(self) -> dict[str, Any]:
        return self._run(self.aio.whoami())

    def version(self) -> dict[str, Any]:
        return self._run(self.aio.version())

    def users(self) -> list[dict[str, Any]]:
        return self._run(self.aio.users())

    def create_user(self, name: str, password: str, admin: bool = False) -> dict[str, Any]:
        return self._run(self.aio.create_user(name, password, admin))

    def delete_user(self, name: str) -> None:
        self._run(self.aio.delete_user(name))

    def set_quota(self, name: str, **quota: str | int | None) -> dict[str, Any]:
        return self._run(self.aio.set_quota(name, **quota))

    def pfs_path(self, path: str) -> str:
        return self._run(self.aio.pfs_path(path))

    def pfs_ls(self, path: str = "", recursive: bool = False) -> dict[str, Any]:
        return self._run(self.aio.pfs_ls(path, recursive))

    def pfs_stat(self, path: str, checksum: bool = False) -> dict[str, Any]:
        return self._run(self.aio.pfs_stat(path, checksum))

    def pfs_mkdir(self, path: str, parents: bool = True) -> dict[str, Any]:
        return self._run(self.aio.pfs_mkdir(path, parents))

    def pfs_rm(self, path: str, recursive: bool = False) -> None:
        self._run(self.aio.pfs_rm(path, recursive))

    def pfs_mv(self, src: str, dst: str, overwrite: bool = False) -> dict[str, Any]:
        return self._run(self.aio.pfs_mv(src, dst, overwrite))

    def pfs_usage(self, user: str | None = None) -> dict[str, Any]:
        return self._run(self.aio.pfs_usage(user))

    def upload(
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
        return self._run(
            self.aio.upload(
                local,
                remote,
                recursive,
                jobs=jobs,
                overwrite=overwrite,
                verify=verify,
                progress=progress,
                state_file=state_file,
            )
        )

    def download(
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
    ) -> TransferReport:
        return self._run(
            self.aio.download(
                remote,
                local,
                recursive,
                jobs=jobs,
                overwrite=overwrite,
                verify=verify,
                progress=progress,
                state_file=state_file,
            )
        )

    def request(
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
        return self._run(
            self.aio.request(method, path, json=json, params=params, headers=headers, auth=auth, login=login)
        )
