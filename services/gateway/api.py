"""HTTP handlers the gateway answers itself: tokens, users, version, the OpenAPI document."""

from __future__ import annotations

import re
from typing import Annotated, Any

import structlog
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationInfo, field_validator

from paddlecloud import __version__
from paddlecloud.common import errors
from paddlecloud.common.clients import ServiceError
from paddlecloud.common.config import (
    MAX_QUOTA_BYTES,
    MAX_QUOTA_CPU_MILLI,
    MAX_QUOTA_GPU,
    MAX_QUOTA_JOBS,
    DefaultQuota,
)
from paddlecloud.common.internal_auth import Identity
from paddlecloud.common.keys import CONFIG, IDENTITY, STORE
from paddlecloud.common.quantity import (
    QuantityError,
    format_bytes,
    format_cpu_milli,
    parse_bytes,
    parse_cpu_milli,
)
from paddlecloud.common.store import AlreadyExists, Quota, User
from paddlecloud.common.store.models import USER_NAME, USER_NAME_RULE, user_name_problem
from paddlecloud.common.web import json_response, parse_body, query_problem

from . import session as browser
from .accounts import MIN_PASSWORD_LENGTH, LoginFailed, LoginLimited, Session
from .errors import BAD_CREDENTIALS, WRONG_PASSWORD
from .keys import ACCOUNTS, JOBS_CLIENT, PFS_CLIENT
from .openapi import openapi_document

log = structlog.get_logger()

SESSION = web.RequestKey("session", Session)
# The /api/v1 calls that need no token: logging in, and the version (a departure from
# DESIGN §3, as Kubernetes' /version: it says nothing but version strings, and lets
# `paddlecloud version` check a server before any login).
PUBLIC_ROUTES = frozenset({("POST", "/api/v1/auth/token"), ("GET", "/api/v1/version")})
_AUTH_HEADER = re.compile(r"^\s*(bearer|token)\s+(\S+)\s*$", re.IGNORECASE)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class TokenRequest(_Body):
    username: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    password: Annotated[str, StringConstraints(min_length=1, max_length=1024)]


class UserCreate(_Body):
    name: str = Field(description=USER_NAME_RULE, json_schema_extra={"pattern": USER_NAME.pattern})
    password: Annotated[str, StringConstraints(min_length=MIN_PASSWORD_LENGTH, max_length=1024)]
    admin: bool = False

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        # In words, not pydantic's "String should match pattern ...": an e-mail address
        # (an SSO login) is the likely mistake, and the answer names what to use instead.
        problem = user_name_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


class PasswordChange(_Body):
    current_password: Annotated[str, StringConstraints(min_length=1, max_length=1024)]
    new_password: Annotated[str, StringConstraints(min_length=MIN_PASSWORD_LENGTH, max_length=1024)]


class PasswordReset(_Body):
    password: Annotated[str, StringConstraints(min_length=MIN_PASSWORD_LENGTH, max_length=1024)]


class QuotaUpdate(_Body):
    # Each field is checked whole by its own validator (`before`): pydantic's lax mode
    # would read a JSON `true` as 1 and `false` as 0, which is no quota anyone meant.
    cpu: str | int | float | None = None
    gpu: int | None = None
    memory: str | int | None = None
    jobs: int | None = None
    storage: str | int | None = None
    disk: str | int | None = None

    @field_validator("cpu", mode="before")
    @classmethod
    def _cpu(cls, value: Any) -> Any:
        if value is not None:
            _check(parse_cpu_milli, value, MAX_QUOTA_CPU_MILLI, "a million CPUs")
        return value

    @field_validator("memory", "storage", "disk", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        if value is not None:
            if isinstance(value, float):
                raise ValueError(f"{value!r}: give a whole number of bytes or a string such as '1Gi'")
            _check(parse_bytes, value, MAX_QUOTA_BYTES, "1Ei")
        return value

    @field_validator("gpu", "jobs", mode="before")
    @classmethod
    def _count(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected a whole number, not {type(value).__name__} {str(value)[:40]}")
        high = MAX_QUOTA_GPU if info.field_name == "gpu" else MAX_QUOTA_JOBS
        if not 0 <= value <= high:
            raise ValueError(f"must be a whole number from 0 to {high}, not {str(value)[:40]}")
        return value

    def to_quota(self) -> Quota:
        return Quota(
            cpu_milli=None if self.cpu is None else parse_cpu_milli(self.cpu),
            gpu=self.gpu,
            memory_bytes=None if self.memory is None else parse_bytes(self.memory),
            jobs=self.jobs,
            storage_bytes=None if self.storage is None else parse_bytes(self.storage),
            disk_bytes=None if self.disk is None else parse_bytes(self.disk),
        )


def _check(parse: Any, value: Any, high: int, spelled: str) -> None:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError("expected a quantity such as 2, 500m or 1Gi, as a string or a number")
    try:
        amount = parse(value)
    except QuantityError as exc:
        raise ValueError(str(exc)) from exc
    if amount > high:
        raise ValueError(f"{str(value)[:40]!r} is more than a quota may be (at most {spelled})")


def render_quota(quota: Quota) -> dict[str, Any]:
    return {
        "cpu": None if quota.cpu_milli is None else format_cpu_milli(quota.cpu_milli),
        "gpu": quota.gpu,
        "memory": None if quota.memory_bytes is None else format_bytes(quota.memory_bytes),
        "jobs": quota.jobs,
        "storage": None if quota.storage_bytes is None else format_bytes(quota.storage_bytes),
        "disk": None if quota.disk_bytes is None else format_bytes(quota.disk_bytes),
    }


def render_user(user: User) -> dict[str, Any]:
    return {
        "name": user.name,
        "admin": user.admin,
        "created_at": user.created_at.isoformat(),
        "quota": render_quota(user.quota),
    }


@web.middleware
async def authenticate(request: web.Request, handler: Any) -> web.StreamResponse:
    """Demand a valid token on every /api call but the login itself.

    The token comes in the `Authorization` header (the CLI, the SDK, any client) or, for
    the dashboard's pages, in the session cookie; a cookie alone never changes state
    without the session's CSRF token (session.py).
    """
    if not request.path.startswith("/api/") or (request.method, request.path) in PUBLIC_ROUTES:
        return await handler(request)
    match = _AUTH_HEADER.match(request.headers.get("Authorization", ""))
    challenge = {"WWW-Authenticate": 'Bearer realm="paddlecloud"'}
    cookie = browser.session_token(request) if "Authorization" not in request.headers else None
    if match is None and cookie is None:
        raise errors.UNAUTHENTICATED(
            "Send 'Authorization: Bearer <token>'. Get a token with POST /api/v1/auth/token "
            "or `paddlecloud login`.",
            headers=challenge,
        )
    session = await request.app[ACCOUNTS].authenticate(match.group(2) if match else cookie or "")
    if session is None:
        raise errors.UNAUTHENTICATED(
            "The token is unknown, expired or revoked. Log in again.", headers=challenge
        )
    if match is None:
        browser.check_csrf(request, session.token_hash)
    request[SESSION] = session
    request[IDENTITY] = session.identity
    structlog.contextvars.bind_contextvars(user=session.identity.user)
    return await handler(request)


def limited_problem(exc: LoginLimited) -> errors.ProblemError:
    """429 with Retry-After: too many failed logins for the name or from the address."""
    wait = exc.refusal.retry_after
    return errors.TOO_MANY_REQUESTS(
        f"Too many failed logins {exc.refusal.reason}; no login is tried for {wait} seconds "
        "(Retry-After), whatever the password.",
        headers={"Retry-After": str(wait)},
        retry_after=wait,
    )


def require_admin(request: web.Request) -> Identity:
    identity = request[IDENTITY]
    if not identity.admin:
        raise errors.FORBIDDEN("Only administrators manage users.")
    return identity


async def create_token(request: web.Request) -> web.Response:
    body = await parse_body(request, TokenRequest)
    try:
        token, record, user = await request.app[ACCOUNTS].login(
            body.username, body.password, request.remote or ""
        )
    except LoginFailed:
        raise BAD_CREDENTIALS("The user name or the password is wrong.") from None
    except LoginLimited as exc:
        raise limited_problem(exc) from None
    return json_response(
        {
            "token": token,
            "expires_at": record.expires_at.isoformat(),
            "user": user.name,
            "admin": user.admin,
        },
        status=201,
    )


async def delete_token(request: web.Request) -> web.Response:
    await request.app[ACCOUNTS].revoke(request[SESSION].token_hash)
    log.info("token_revoked")
    return web.Response(status=204)


async def whoami(request: web.Request) -> web.Response:
    session = request[SESSION]
    datacenter = request.app[CONFIG].pfs.datacenter
    return json_response(
        {
            "user": session.identity.user,
            "admin": session.identity.admin,
            "expires_at": session.expires_at.isoformat(),
            # Clients resolve paths relative to the home with these, whatever they
            # named this datacenter in their own config.
            "datacenter": datacenter,
            "home": f"/pfs/{datacenter}/home/{session.identity.user}",
        }
    )


async def change_password(request: web.Request) -> web.Response:
    """The caller's own password: the current one is checked (under the login limits), every
    session of theirs ends, and the caller gets a new one in its place — in the body for a
    token client, as a new session cookie for the dashboard (whose page never sees tokens)."""
    body = await parse_body(request, PasswordChange)
    if body.new_password == body.current_password:
        raise errors.Invalid("is the same as the current password", field="new_password")
    session = request[SESSION]
    try:
        token, record, user = await request.app[ACCOUNTS].change_password(
            session.identity.user, body.current_password, body.new_password, request.remote or ""
        )
    except LoginFailed:
        # Not a 401: the caller's session is fine, and a client would log in again and retry.
        message = "the current password is wrong"
        raise WRONG_PASSWORD(
            f"current_password: {message}.", errors=[{"field": "current_password", "message": message}]
        ) from None
    except LoginLimited as exc:
        raise limited_problem(exc) from None
    answer: dict[str, Any] = {
        "user": user.name,
        "admin": user.admin,
        "expires_at": record.expires_at.isoformat(),
    }
    from_browser = "Authorization" not in request.headers
    if not from_browser:
        answer["token"] = token
    response = json_response(answer)
    if from_browser:
        ttl = request.app[CONFIG].gateway.token_ttl_seconds
        browser.set_session_cookie(response, request, token, ttl)
    log.info("password_changed")
    return response


async def reset_password(request: web.Request) -> web.Response:
    """An administrator sets another user's password (a forgotten one): every session of
    theirs ends. Their own password an administrator changes with the current one."""
    admin = require_admin(request)
    name = request.match_info["name"]
    body = await parse_body(request, PasswordReset)
    if name == admin.user:
        raise errors.CONFLICT(
            "Change your own password with PUT /api/v1/auth/password (`paddlecloud passwd`), "
            "which asks for the current one."
        )
    user = await request.app[ACCOUNTS].set_password(name, body.password)
    if user is None:
        raise errors.NOT_FOUND(f"There is no user named {name!r}.")
    log.info("password_reset", name=name)
    return json_response(render_user(user))


async def list_users(request: web.Request) -> web.Response:
    require_admin(request)
    users = await request.app[STORE].list_users()
    return json_response({"users": [render_user(u) for u in users]})


def default_quota(section: DefaultQuota) -> Quota:
    """The quota a new user starts with (`gateway.default_quota`, checked when the config was)."""
    return QuotaUpdate.model_validate(section.model_dump()).to_quota()


async def create_user(request: web.Request) -> web.Response:
    require_admin(request)
    body = await parse_body(request, UserCreate)
    quota = default_quota(request.app[CONFIG].gateway.default_quota)
    try:
        user = await request.app[ACCOUNTS].create_user(
            body.name, body.password, admin=body.admin, quota=quota
        )
    except AlreadyExists:
        raise errors.ALREADY_EXISTS(f"A user named {body.name!r} already exists.") from None
    return json_response(render_user(user), status=201)


async def delete_user(request: web.Request) -> web.Response:
    """Delete a user so that nothing of theirs stays reachable: their sessions end, their
    jobs are stopped and forgotten, their home is archived (`home=archive`, the default)
    or removed (`home=remove`), and then the account goes. A later account of the same
    name starts with no files, no jobs and no quota use. Each step is idempotent: if a
    service cannot be reached the account stays, and the admin deletes again."""
    admin = require_admin(request)
    name = request.match_info["name"]
    home = request.query.get("home", "archive")
    if home not in ("archive", "remove"):
        raise query_problem("home", f"must be archive or remove, not {home[:40]!r}")
    if name == admin.user:
        raise errors.CONFLICT("You cannot delete yourself; ask another administrator.")
    accounts = request.app[ACCOUNTS]
    if await accounts.get_user(name) is None:
        raise errors.NOT_FOUND(f"There is no user named {name!r}.")
    await accounts.revoke_user(name)
    try:
        jobs = await request.app[JOBS_CLIENT].forget_user(admin, name)
        retired = await request.app[PFS_CLIENT].retire_home(admin, name, archive=home == "archive")
    except ServiceError as exc:
        raise errors.UPSTREAM_UNAVAILABLE(
            f"{name!r} is not deleted: {exc.detail or exc.code}. Their sessions are ended; delete again."
        ) from None
    await accounts.delete_user(name)
    log.info("user_deleted_whole", name=name, jobs=jobs.get("jobs_removed"), home=retired.get("archived_to"))
    return web.Response(status=204)


async def set_quota(request: web.Request) -> web.Response:
    require_admin(request)
    name = request.match_info["name"]
    body = await parse_body(request, QuotaUpdate)
    user = await request.app[ACCOUNTS].set_quota(name, body.to_quota())
    if user is None:
        raise errors.NOT_FOUND(f"There is no user named {name!r}.")
    log.info("quota_set", name=name)
    return json_response(render_user(user))


async def version(_request: web.Request) -> web.Response:
    return json_response({"version": __version__, "api": "v1"})


async def openapi(_request: web.Request) -> web.Response:
    return json_response(openapi_document())


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_post("/api/v1/auth/token", create_token)
    r.add_delete("/api/v1/auth/token", delete_token)
    r.add_get("/api/v1/auth/whoami", whoami)
    r.add_put("/api/v1/auth/password", change_password)
    r.add_get("/api/v1/users", list_users)
    r.add_post("/api/v1/users", create_user)
    r.add_delete("/api/v1/users/{name}", delete_user)
    r.add_put("/api/v1/users/{name}/quota", set_quota)
    r.add_put("/api/v1/users/{name}/password", reset_password)
    r.add_get("/api/v1/version", version)
    r.add_get("/api/v1/openapi.json", openapi)
