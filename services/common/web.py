"""The conventions every service's app follows: middlewares, health, readiness, metrics, bodies."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from pydantic import BaseModel, ValidationError

from . import errors, internal_auth
from .config import Config
from .keys import (
    CONFIG,
    IDENTITY,
    INTERNAL_SECRET,
    METRICS_REFRESH,
    METRICS_REGISTRY,
    PROBLEMS,
    READINESS_CHECKS,
    REQUEST_ID,
    SERVICE_NAME,
    STORE,
)
from .store import Store, open_store

log = structlog.get_logger()

REQUEST_ID_HEADER = "X-Request-ID"
_REQUEST_ID_OK = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# Paths any caller may reach: probes and scrapes, never user data.
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Model = TypeVar("Model", bound=BaseModel)


def new_request_id() -> str:
    return secrets.token_hex(16)


@web.middleware
async def request_id_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Keep the caller's request id if it is sane, make one otherwise, and bind it to logs."""
    incoming = request.headers.get(REQUEST_ID_HEADER, "")
    request_id = incoming if _REQUEST_ID_OK.match(incoming) else new_request_id()
    request[REQUEST_ID] = request_id
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(request_id=request_id, method=request.method, path=request.path)
    start = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        if not response.prepared:
            response.headers[REQUEST_ID_HEADER] = request_id
        return response
    except ConnectionError:
        if not client_gone(request):
            raise
        # Nothing failed on our side and there is no one to answer: an answer aiohttp
        # cannot send is dropped quietly (an exception would be logged as a 500).
        # 499 is nginx's "client closed request", for the access line and metrics.
        status = CLIENT_CLOSED_REQUEST
        log.info("client_disconnected")
        gone = web.Response(status=status)
        gone.force_close()
        return gone
    finally:
        elapsed = time.perf_counter() - start
        _observe(request, status, elapsed)
        if request.path not in PUBLIC_PATHS:
            log.info("request_finished", status=status, duration_ms=round(elapsed * 1000, 2))


def _observe(request: web.Request, status: int, elapsed: float) -> None:
    metrics: _Metrics | None = request.app.get(_METRICS)
    if metrics is None:
        return
    info = request.match_info.route.resource
    route = info.canonical if info is not None else "unmatched"
    metrics.observe(request.method, route, status, elapsed)


@web.middleware
async def problem_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Render every failure as problem+json; unknown exceptions become a 500 with the request id."""
    request_id = request.get(REQUEST_ID)
    try:
        try:
            return await handler(request)
        except errors.DomainError as exc:
            raise errors.problem_for_domain(exc, request.app[PROBLEMS]) from exc
    except errors.ProblemError as exc:
        if exc.kind.status >= 500:
            log.warning("request_failed", code=exc.kind.code, detail=exc.detail)
        response = errors.problem_response(exc.body(request_id), exc.headers)
        if exc.kind is errors.BODY_TIMEOUT:
            response.force_close()  # the rest of a stalled body is not waited for
        return response
    except ConnectionError:
        if client_gone(request):
            raise  # the client hung up mid-request: request_id_middleware says so
        log.exception("unhandled_exception")
        return errors.problem_response(_internal(request_id))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kind = errors.HTTP_STATUS_KINDS.get(exc.status)
        code = kind.code if kind else f"ERR_HTTP_{exc.status}"
        detail = _http_detail(request, exc)
        body = errors.problem_body(code, exc.status, exc.reason, detail, request_id)
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return errors.problem_response(body, headers)
    except Exception as exc:
        if _out_of_space(exc):
            # Whatever needed the disk (the store, a job's directory, a log), it is full:
            # the caller learns that, and may try again once an operator freed space.
            log.warning("storage_full", error=str(exc))
            detail = "The server's disk is full; nothing was changed. Try again once space is freed."
            return errors.problem_response(errors.STORAGE_FULL(detail).body(request_id))
        log.exception("unhandled_exception")
        return errors.problem_response(_internal(request_id))


def _internal(request_id: str | None) -> dict[str, Any]:
    return errors.INTERNAL(
        f"Something went wrong on our side. Quote request id {request_id} to the operator."
    ).body(request_id)


# The status an access line records for a request whose client hung up before it was
# answered (nginx's convention); never sent, there is no one to send it to.
CLIENT_CLOSED_REQUEST = 499


def client_gone(request: web.BaseRequest) -> bool:
    """Whether the client's connection is closed (it hung up, or reset it)."""
    transport = request.transport
    return transport is None or transport.is_closing()


def _out_of_space(exc: BaseException | None) -> bool:
    """Whether `exc`, or what caused it, is the disk being full (ENOSPC, EDQUOT, SQLite's FULL)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:  # a chain may loop back on itself
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if getattr(exc, "sqlite_errorname", None) == "SQLITE_FULL":
            return True
        exc = exc.__cause__ or exc.__context__
    return False


# Below this much free space a service says it is not ready: it can serve reads, but the
# next write may fail. (A full disk must not look healthy to a load balancer.)
MIN_FREE_BYTES = 4 * 2**20


def disk_check(paths: list[Path]) -> Callable[[], Awaitable[None]]:
    """A readiness check that fails while a filesystem under `paths` is (nearly) full."""

    async def disk_space() -> None:
        for path in paths:
            try:
                st = os.statvfs(path)
            except OSError:
                continue  # not made yet: nothing is written there
            free = st.f_bavail * st.f_frsize
            if free < MIN_FREE_BYTES:
                raise OSError(errno.ENOSPC, f"{path} has {free} bytes free")

    return disk_space


def _data_paths(config: Config, service: str) -> list[Path]:
    """Where a service writes: its own directory and a SQLite store's."""
    own = {"pfs": config.pfs.root, "jobs": config.jobs.work_dir, "builder": config.builder.work_dir}
    paths = [own[service].expanduser()] if service in own else []
    try:
        url = config.store_url()
    except Exception:
        url = ""
    if url.startswith("sqlite:///"):
        paths.append(Path(url.removeprefix("sqlite://")).expanduser().parent)
    return paths


def _http_detail(request: web.Request, exc: web.HTTPException) -> str:
    if exc.status == 404:
        return f"No such endpoint: {request.method} {request.path}"
    if exc.status == 405:
        return f"{request.method} is not allowed on {request.path}"
    if exc.status == 413:
        return f"The request body is larger than this endpoint accepts ({exc.text})"
    return exc.text or exc.reason


@web.middleware
async def internal_auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse any request to a service that does not carry the gateway's signature."""
    if request.path in PUBLIC_PATHS:
        return await handler(request)
    identity = internal_auth.verify(
        request.app[INTERNAL_SECRET],
        request.headers,
        request[REQUEST_ID],
        request.method,
        request.raw_path,
    )
    if identity is None:
        raise errors.NOT_FROM_GATEWAY(
            "This service only answers requests forwarded by the PaddleCloud gateway."
        )
    request[IDENTITY] = identity
    structlog.contextvars.bind_contextvars(user=identity.user)
    return await handler(request)


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "paddlecloud_http_requests",
            "HTTP requests served",
            ["method", "route", "status"],
            registry=registry,
        )
        self.duration = Histogram(
            "paddlecloud_http_request_duration_seconds",
            "Time to the handler's return (for streams: to the end of the stream)",
            ["method", "route"],
            registry=registry,
        )
        # labels() takes a lock and builds a key per call; a request's pair of children is
        # looked up once per (method, route, status) instead. As many entries as the
        # registry's own label sets.
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    def observe(self, method: str, route: str, status: int, elapsed: float) -> None:
        key = (method, route, status)
        children = self._children.get(key)
        if children is None:
            children = (self.requests.labels(method, route, str(status)), self.duration.labels(method, route))
            self._children[key] = children
        children[0].inc()
        children[1].observe(elapsed)


_METRICS = web.AppKey("http_metrics", _Metrics)
JSON_LIMIT = web.AppKey("json_limit", int)
BODY_TIMEOUT = web.AppKey("body_timeout", float)


async def healthz(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    for check in request.app[READINESS_CHECKS]:
        try:
            await check()
        except Exception as exc:
            name = getattr(check, "__name__", "a check")
            log.warning("readiness_check_failed", check=name, error=str(exc))
            # Probes are public on the gateway: say what failed, never where.
            why = ": the disk is full" if _out_of_space(exc) else ""
            raise errors.NOT_READY(f"{name} failed{why}") from exc
    return web.json_response({"status": "ready"})


async def metrics(request: web.Request) -> web.Response:
    for refresh in request.app[METRICS_REFRESH]:
        await refresh()
    body = generate_latest(request.app[METRICS_REGISTRY])
    response = web.Response(body=body)
    response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    return response


def create_base_app(
    config: Config,
    service: str,
    *,
    internal: bool = True,
    client_max_size: int | None = None,
    extra_middlewares: list[Any] | None = None,
    problems: errors.ProblemTable | None = None,
) -> web.Application:
    """An application with the shared middlewares and probes; the service adds its routes.

    `internal` services demand the gateway's signature on every non-probe request.
    `problems` is the service's table of domain errors (its errors.py).
    """
    middlewares: list[Any] = [request_id_middleware, problem_middleware]
    if internal:
        middlewares.append(internal_auth_middleware)
    middlewares.extend(extra_middlewares or [])
    section = getattr(config, service)
    app = web.Application(
        middlewares=middlewares,
        client_max_size=client_max_size or section.max_json_body,
        handler_args={"access_log": None},
    )
    app[CONFIG] = config
    app[SERVICE_NAME] = service
    app[PROBLEMS] = problems or errors.COMMON_PROBLEMS
    registry = CollectorRegistry()
    app[METRICS_REGISTRY] = registry
    app[_METRICS] = _Metrics(registry)
    app[JSON_LIMIT] = section.max_json_body
    app[BODY_TIMEOUT] = section.body_timeout
    app[READINESS_CHECKS] = [disk_check(_data_paths(config, service))]
    app[METRICS_REFRESH] = []
    # Services check the gateway's signature with it; the gateway signs with it.
    app[INTERNAL_SECRET] = config.internal_secret()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def read_json(request: web.Request) -> Any:
    """The request body as JSON, refusing a wrong content type, bad JSON or an oversized body."""
    ctype = request.content_type
    if ctype not in ("application/json", "") and not ctype.endswith("+json"):
        raise errors.UNSUPPORTED_MEDIA_TYPE(f"Send JSON (Content-Type: application/json), not {ctype}.")
    limit = request.app[JSON_LIMIT]
    if request.content_length is not None and request.content_length > limit:
        raise errors.PAYLOAD_TOO_LARGE(f"The JSON body may be at most {limit} bytes.")
    # read(n) answers with what has arrived so far, which for a slow client is a prefix
    # of the body: read until the end, and stop as soon as the body passes the limit.
    chunks: list[bytes] = []
    size = 0
    seconds = request.app[BODY_TIMEOUT]
    try:
        # One deadline for the whole body: a client that trickles a byte a second holds
        # a connection and a handler no longer than this.
        async with asyncio.timeout(seconds):
            while chunk := await request.content.read(limit + 1 - size):
                chunks.append(chunk)
                size += len(chunk)
                if size > limit:
                    raise errors.PAYLOAD_TOO_LARGE(f"The JSON body may be at most {limit} bytes.")
    except TimeoutError:
        raise errors.BODY_TIMEOUT(
            f"The body did not arrive within {seconds:g} seconds ({size} bytes came); send it whole."
        ) from None
    raw = b"".join(chunks)
    try:
        return json.loads(raw)
    except RecursionError:
        raise errors.BAD_JSON("The body nests JSON arrays or objects too deeply.") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise errors.BAD_JSON(f"The body is not valid JSON: {exc}") from exc
    except ValueError as exc:  # an integer of more digits than Python converts (4300)
        raise errors.BAD_JSON(f"The body is not JSON this service reads: {exc}") from exc


async def parse_body(request: web.Request, model: type[Model]) -> Model:
    """The JSON body validated into `model`; every problem is reported with its field."""
    data = await read_json(request)
    return validate(model, data)


def validate(model: type[Model], data: Any) -> Model:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_problem(exc) from exc


def validation_problem(exc: ValidationError) -> errors.ProblemError:
    fields = []
    for error in exc.errors(include_url=False):
        field = ".".join(str(p) for p in error["loc"]) or "(body)"
        if error["type"] == "extra_forbidden":
            message = "unknown field"
        elif error["type"] in ("model_type", "model_attributes_type", "dict_type") and not error["loc"]:
            message = "the body must be a JSON object"
        elif error["type"] == "value_error":
            # A validator's own ValueError: its message is the sentence, without pydantic's
            # "Value error, " in front of it.
            message = str(error.get("ctx", {}).get("error") or error["msg"].removeprefix("Value error, "))
        else:
            message = error["msg"]
        fields.append({"field": field, "message": message})
    summary = "; ".join(f"{f['field']}: {f['message']}" for f in fields)
    return errors.VALIDATION(summary, errors=fields)


def query_problem(name: str, message: str) -> errors.ProblemError:
    """A 400 naming the query parameter that is wrong and why."""
    return errors.BAD_REQUEST(f"{name}: {message}", errors=[{"field": name, "message": message}])


def query_flag(request: web.Request, name: str) -> bool:
    """A yes/no query parameter: 1, true, yes or present without a value; 0, false or no."""
    value = request.query.get(name, "0").lower()
    if value in ("1", "true", "yes", ""):
        return value != "" or name in request.query
    if value in ("0", "false", "no"):
        return False
    raise query_problem(name, f"must be 1, 0, true or false, not {value[:40]!r}")


def query_int(request: web.Request, name: str, low: int, high: int, default: int | None = None) -> int | None:
    """A whole-number query parameter within [low, high]; `default` when absent."""
    text = request.query.get(name)
    if text is None:
        return default
    if not text.isdigit() or not low <= int(text) <= high:
        raise query_problem(name, f"must be a whole number from {low} to {high}, not {text[:40]!r}")
    return int(text)


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=lambda obj: json.dumps(obj, default=str))


@contextlib.asynccontextmanager
async def use_store(app: web.Application, config: Config, given: Store | None = None) -> AsyncIterator[Store]:
    """Open the configured store for the app's lifetime (or use `given`, owned by the caller)."""
    if given is not None:
        store = given
    else:
        store = open_store(config.store_url())
        await store.open()
    app[STORE] = store
    app[READINESS_CHECKS].append(store.ping)
    try:
        yield store
    finally:
        if given is None:
            await store.close()
