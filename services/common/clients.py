"""Small async clients one service uses to call another directly: the builder, and pfs.

Services never import each other; they talk over HTTP through these. Each call goes to
the service's internal URL (`builder.url`, `pfs.url`), signed for the identity it acts
for with the internal secret exactly as the gateway signs, and forwards the current
request id (the one bound in structlog's context by the service's middleware), so the
callee's log lines carry the same id as the caller's.

    async with BuilderClient(config) as builder:
        build = await builder.request_build(identity, requirements=text, base=None, package=path)
        build = await builder.get_build(identity, build["id"])   # until state is final

    async with PfsClient(config) as pfs:
        used = await pfs.usage(identity)          # {user, bytes, files, limit}

A problem answer raises `ServiceError` (`BuilderError` for the builder) with the status
and problem document (`.code`, `.detail`, `.problem["errors"]`); a service that cannot be
reached or does not answer in time raises `ServiceUnavailable` (`BuilderUnavailable`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Self
from urllib.parse import quote

import aiohttp
import structlog
from yarl import URL

from paddlecloud.common import internal_auth
from paddlecloud.common.config import Config
from paddlecloud.common.internal_auth import Identity
from paddlecloud.common.web import REQUEST_ID_HEADER, new_request_id

NDJSON = "application/x-ndjson"


class ServiceError(Exception):
    """The service answered with a problem."""

    def __init__(self, status: int, problem: dict[str, Any], service: str = "service") -> None:
        self.status = status
        self.problem = problem
        self.code = str(problem.get("code", f"ERR_HTTP_{status}"))
        self.detail = str(problem.get("detail", ""))
        super().__init__(f"{service}: {status} {self.code}: {self.detail}")


class ServiceUnavailable(ServiceError):
    """The service could not be reached, or did not answer in time."""


class BuilderError(ServiceError):
    """The builder answered with a problem."""


class BuilderUnavailable(BuilderError, ServiceUnavailable):
    """The builder could not be reached, or did not answer in time."""


class ServiceClient:
    """Signed JSON calls to one service; subclasses name the service and add its calls."""

    name = "service"
    error: type[ServiceError] = ServiceError
    unavailable: type[ServiceError] = ServiceUnavailable

    def __init__(
        self,
        config: Config,
        *,
        session: aiohttp.ClientSession | None = None,
        connect_timeout: float = 2.0,
        timeout: float = 30.0,
        url: str | None = None,
    ) -> None:
        """`session` is used as given and left open; without one the client makes its own,
        closed by `close()`. `url` overrides where the config says the service is."""
        self._url = (url or self.url_of(config)).rstrip("/")
        self._secret = config.internal_secret()
        self._session = session
        self._own_session = session is None
        self._timeout = aiohttp.ClientTimeout(total=timeout, connect=connect_timeout)
        self._stream_timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_read=timeout)
        # A follow is silent as long as what it follows is (pip unpacking a large wheel says
        # nothing for minutes); it ends when that ends, or when the connection does.
        self._follow_timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout)

    @staticmethod
    def url_of(config: Config) -> str:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
        self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    def _headers(self, identity: Identity, method: str, path_qs: str) -> dict[str, str]:
        request_id = structlog.contextvars.get_contextvars().get("request_id") or new_request_id()
        return {
            REQUEST_ID_HEADER: str(request_id),
            **internal_auth.sign(self._secret, identity, str(request_id), method, path_qs),
        }

    async def _call(self, identity: Identity, method: str, path_qs: str, body: Any = None) -> dict[str, Any]:
        url = URL(self._url + path_qs, encoded=True)
        headers = self._headers(identity, method, path_qs)
        try:
            async with self._http().request(
                method, url, json=body, headers=headers, timeout=self._timeout
            ) as resp:
                try:
                    answer = await resp.json(content_type=None)
                except ValueError:
                    answer = None
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self._unreachable(exc) from exc
        if not isinstance(answer, dict):
            answer = {
                "code": f"ERR_HTTP_{status}",
                "detail": f"the {self.name}'s answer is not a JSON object",
            }
            raise self.error(status if status >= 400 else 502, answer, self.name)
        if status >= 400:
            raise self.error(status, answer, self.name)
        return answer

    def _unreachable(self, exc: BaseException) -> ServiceError:
        detail = f"the {self.name} at {self._url}: {exc!r}"
        return self.unavailable(503, {"code": "ERR_UPSTREAM_UNAVAILABLE", "detail": detail}, self.name)


class PfsClient(ServiceClient):
    """The pfs service, for what other services ask of it: a home's storage usage."""

    name = "pfs"

    @staticmethod
    def url_of(config: Config) -> str:
        return config.pfs.url

    async def usage(self, identity: Identity) -> dict[str, Any]:
        """`GET /api/v1/pfs/usage`: the identity's own `{user, bytes, files, limit}`."""
        return await self._call(identity, "GET", "/api/v1/pfs/usage")

    async def retire_home(self, admin: Identity, user: str, *, archive: bool) -> dict[str, Any]:
        """`DELETE /api/v1/pfs/homes/{user}`: a deleted user's home, archived or removed."""
        path = f"/api/v1/pfs/homes/{quote(user, safe='')}?archive={int(archive)}"
        return await self._call(admin, "DELETE", path)


class JobsClient(ServiceClient):
    """The jobs service, for the gateway: what a user's deletion asks of it."""

    name = "jobs"

    @staticmethod
    def url_of(config: Config) -> str:
        return config.gateway.jobs_url

    async def forget_user(self, admin: Identity, user: str) -> dict[str, Any]:
        """`DELETE /api/v1/users/{user}/jobs`: stop every job of the user and forget them all."""
        return await self._call(admin, "DELETE", f"/api/v1/users/{quote(user, safe='')}/jobs")


class BuilderClient(ServiceClient):
    """The builder service: requests builds, reads and follows them (the jobs service)."""

    name = "builder"
    error = BuilderError
    unavailable = BuilderUnavailable

    @staticmethod
    def url_of(config: Config) -> str:
        return config.builder.url

    async def request_build(
        self,
        identity: Identity,
        *,
        requirements: str,
        base: str | None,
        package: str | None,
        registry: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """`POST /api/v1/builds`: the build (`id`, `key`, `state`, `cached`, `python` or
        `image`, ...) or, for a dry run, `{key, cached}`. `registry` names the caller's saved
        credentials for a private base image."""
        path = "/api/v1/builds" + ("?dry_run=1" if dry_run else "")
        body: dict[str, Any] = {"requirements": requirements, "base": base, "package": package}
        if registry is not None:
            body["registry"] = registry
        return await self._call(identity, "POST", path, body)

    async def get_build(self, identity: Identity, build_id: str) -> dict[str, Any]:
        """`GET /api/v1/builds/{id}`."""
        return await self._call(identity, "GET", f"/api/v1/builds/{quote(build_id, safe='')}")

    async def logs(
        self,
        identity: Identity,
        build_id: str,
        *,
        follow: bool = False,
        cursor: str | None = None,
        tail: int | None = None,
    ) -> AsyncIterator[dict[str, str]]:
        """`GET /api/v1/builds/{id}/logs` as NDJSON: `{line, cursor}` per line; `tail`: the last N only."""
        path = f"/api/v1/builds/{quote(build_id, safe='')}/logs?follow={int(follow)}"
        if tail is not None:
            path += f"&tail={tail}"
        if cursor is not None:
            path += f"&cursor={quote(cursor, safe='')}"
        headers = {"Accept": NDJSON, **self._headers(identity, "GET", path)}
        url = URL(self._url + path, encoded=True)
        timeout = self._follow_timeout if follow else self._stream_timeout
        try:
            async with self._http().get(url, headers=headers, timeout=timeout) as resp:
                if resp.status >= 400:
                    try:
                        problem = await resp.json(content_type=None)
                    except ValueError:
                        problem = {}
                    raise BuilderError(resp.status, problem if isinstance(problem, dict) else {}, self.name)
                pending = b""
                async for chunk in resp.content.iter_any():
                    *lines, pending = (pending + chunk).split(b"\n")
                    for raw in lines:
                        if raw.strip():
                            item = json.loads(raw)
                            yield {"line": str(item["line"]), "cursor": str(item["cursor"])}
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self._unreachable(exc) from exc
