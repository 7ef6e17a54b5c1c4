"""The error catalogue and its rendering as RFC 9457 problem+json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

PROBLEM_CONTENT_TYPE = "application/problem+json"


class ProblemError(Exception):
    """An error the client should see: a stable code, an HTTP status and a sentence that helps."""

    def __init__(
        self,
        kind: ErrorKind,
        detail: str,
        *,
        errors: list[dict[str, str]] | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.errors = errors
        self.headers = headers or {}
        self.extra = extra

    def body(self, request_id: str | None) -> dict[str, Any]:
        return problem_body(
            self.kind.code,
            self.kind.status,
            self.kind.title,
            self.detail,
            request_id,
            errors=self.errors,
            **self.extra,
        )


class DomainError(Exception):
    """A refusal by a service's domain, in words for the user; it knows no HTTP.

    Each service's `errors.py` maps its kinds onto problems in one table
    (`ProblemTable`), which the shared middleware consults: `field` names the request's
    field at fault, and `details` become extra members of the problem (the numbers of a
    quota refusal, say).
    """

    def __init__(self, message: str, *, field: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details


class Invalid(DomainError):
    """The request asks for something the domain cannot do as asked (a bad field)."""


class NotFound(DomainError):
    """What the request names does not exist (or is not the caller's to see)."""


class Exists(DomainError):
    """What the request would create exists already."""


class Forbidden(DomainError):
    """The caller may not do this."""


class BadCursor(DomainError):
    """A log cursor this service did not hand out."""

    def __init__(self, message: str) -> None:
        super().__init__(message, field="cursor")


ProblemTable = dict[type[DomainError], "ErrorKind"]


def problem_for_domain(exc: DomainError, table: ProblemTable) -> ProblemError:
    """The problem a domain error is shown as: the table's kind for its nearest class."""
    kind = next((table[cls] for cls in type(exc).__mro__ if cls in table), None)
    if kind is None:
        raise TypeError(f"no problem kind for {type(exc).__name__} in this service's table") from exc
    if exc.field is None:
        return kind(exc.message, **exc.details)
    detail = f"{exc.field}: {exc.message}"
    return kind(detail, errors=[{"field": exc.field, "message": exc.message}], **exc.details)


@dataclass(frozen=True)
class ErrorKind:
    """One entry of the catalogue; calling it makes the exception to raise."""

    code: str
    status: int
    title: str

    def __call__(self, detail: str, **kwargs: Any) -> ProblemError:
        return ProblemError(self, detail, **kwargs)


def problem_body(
    code: str,
    status: int,
    title: str,
    detail: str,
    request_id: str | None,
    *,
    errors: list[dict[str, str]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": f"urn:paddlecloud:error:{code}",
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
    }
    if errors:
        body["errors"] = errors
    if request_id:
        body["request_id"] = request_id
    body.update(extra)
    return body


def problem_response(body: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=body["status"],
        body=json.dumps(body).encode(),
        content_type=PROBLEM_CONTENT_TYPE,
        headers=headers,
    )


# The catalogue. Codes are stable: clients and tests match on them, never on wording.
BAD_REQUEST = ErrorKind("ERR_BAD_REQUEST", 400, "Bad request")
BAD_JSON = ErrorKind("ERR_BAD_JSON", 400, "Request body is not valid JSON")
VALIDATION = ErrorKind("ERR_VALIDATION", 422, "Request is not valid")
UNAUTHENTICATED = ErrorKind("ERR_UNAUTHENTICATED", 401, "Authentication required")
NOT_FROM_GATEWAY = ErrorKind("ERR_NOT_FROM_GATEWAY", 401, "Request did not come through the gateway")
FORBIDDEN = ErrorKind("ERR_FORBIDDEN", 403, "Not allowed")
NOT_FOUND = ErrorKind("ERR_NOT_FOUND", 404, "Not found")
METHOD_NOT_ALLOWED = ErrorKind("ERR_METHOD_NOT_ALLOWED", 405, "Method not allowed")
CONFLICT = ErrorKind("ERR_CONFLICT", 409, "Conflict")
ALREADY_EXISTS = ErrorKind("ERR_ALREADY_EXISTS", 409, "Already exists")
PAYLOAD_TOO_LARGE = ErrorKind("ERR_PAYLOAD_TOO_LARGE", 413, "Request body too large")
BODY_TIMEOUT = ErrorKind("ERR_BODY_TIMEOUT", 408, "Request body too slow")
TOO_MANY_REQUESTS = ErrorKind("ERR_TOO_MANY_REQUESTS", 429, "Too many requests")
UNSUPPORTED_MEDIA_TYPE = ErrorKind("ERR_UNSUPPORTED_MEDIA_TYPE", 415, "Unsupported media type")
QUOTA_EXCEEDED = ErrorKind("ERR_QUOTA_EXCEEDED", 403, "Quota exceeded")
INTERNAL = ErrorKind("ERR_INTERNAL", 500, "Internal server error")
NOT_IMPLEMENTED = ErrorKind("ERR_NOT_IMPLEMENTED", 501, "Not implemented yet")
UPSTREAM_UNREACHABLE = ErrorKind("ERR_UPSTREAM_UNREACHABLE", 502, "Service unreachable")
UPSTREAM_UNAVAILABLE = ErrorKind("ERR_UPSTREAM_UNAVAILABLE", 503, "Service unavailable")
UPSTREAM_TIMEOUT = ErrorKind("ERR_UPSTREAM_TIMEOUT", 504, "Service did not answer in time")
NOT_READY = ErrorKind("ERR_NOT_READY", 503, "Service not ready")
BAD_CURSOR = ErrorKind("ERR_BAD_CURSOR", 400, "Bad cursor")
STORAGE_FULL = ErrorKind("ERR_STORAGE_FULL", 507, "Insufficient storage")


# What every service's table starts from.
COMMON_PROBLEMS: ProblemTable = {
    Invalid: VALIDATION,
    NotFound: NOT_FOUND,
    Exists: ALREADY_EXISTS,
    Forbidden: FORBIDDEN,
    BadCursor: BAD_CURSOR,
}


# aiohttp's own HTTP exceptions (unknown route, wrong method, body over client_max_size)
# are rendered with these codes.
HTTP_STATUS_KINDS: dict[int, ErrorKind] = {
    400: BAD_REQUEST,
    401: UNAUTHENTICATED,
    403: FORBIDDEN,
    404: NOT_FOUND,
    405: METHOD_NOT_ALLOWED,
    409: CONFLICT,
    413: PAYLOAD_TOO_LARGE,
    415: UNSUPPORTED_MEDIA_TYPE,
}
