"""The exceptions the SDK raises: one base class, API refusals, unreachable servers, local setup problems."""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from typing import Any

PROBLEM_CONTENT_TYPE = "application/problem+json"

# Error bodies are read only this far: a proxy's error page is not worth megabytes.
MAX_ERROR_BODY = 64 * 1024


class PaddleCloudError(Exception):
    """Anything the SDK or the CLI reports as a failure; `str()` is one line fit for a person."""


class ConnectionProblem(PaddleCloudError):
    """The server could not be reached or stopped answering (refused, DNS, TLS, timeout, reset)."""

    def __init__(self, endpoint: str, reason: str) -> None:
        super().__init__(f"cannot reach {endpoint}: {reason}")
        self.endpoint = endpoint
        self.reason = reason


class CredentialsMissing(PaddleCloudError):
    """A login was needed but no username and password were given."""


class UnexpectedAnswer(PaddleCloudError):
    """The server answered 2xx with something that is not the JSON the API promises."""


@dataclass(frozen=True)
class FieldError:
    """One entry of a validation problem's `errors` list."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class ApiError(PaddleCloudError):
    """The server answered with a non-2xx status; carries what its problem+json said."""

    def __init__(
        self,
        status: int,
        title: str,
        detail: str | None = None,
        *,
        code: str | None = None,
        request_id: str | None = None,
        errors: tuple[FieldError, ...] = (),
        problem_type: str | None = None,
        body: Any = None,
        method: str | None = None,
        url: str | None = None,
    ) -> None:
        self.status = status
        self.title = title
        self.detail = detail
        self.code = code
        self.request_id = request_id
        self.errors = errors
        self.type = problem_type  # RFC 9457 `type`, a URI naming the kind of problem
        self.body = body
        self.method = method
        self.url = url
        super().__init__(self.message())

    def message(self) -> str:
        """`<title>: <detail>; <field>: <message>... (request id <id>)`, always on one line."""
        parts = [self.title]
        if self.detail and self.detail != self.title:
            parts.append(f": {self.detail}")
        # Servers often sum the field errors up in the detail already; say each once.
        extra = [str(e) for e in self.errors if not (self.detail and e.message in self.detail)]
        if extra:
            parts.append(": " if len(parts) == 1 else "; ")
            parts.append("; ".join(extra))
        if self.request_id:
            parts.append(f" (request id {self.request_id})")
        return one_line("".join(parts))

    @classmethod
    def from_response(
        cls,
        status: int,
        reason: str | None,
        content_type: str,
        body: bytes,
        *,
        request_id: str | None = None,
        method: str | None = None,
        url: str | None = None,
    ) -> ApiError:
        """Parse problem+json when the body is that; otherwise describe what came back."""
        parsed: Any = None
        if body and ("json" in content_type or body.lstrip()[:1] == b"{"):
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = None
        if isinstance(parsed, dict) and ("title" in parsed or "detail" in parsed or "code" in parsed):
            return cls(
                status,
                _text(parsed.get("title")) or _status_title(status, reason),
                _text(parsed.get("detail")),
                code=_text(parsed.get("code")),
                request_id=_text(parsed.get("request_id")) or request_id,
                errors=_field_errors(parsed.get("errors")),
                problem_type=_text(parsed.get("type")),
                body=parsed,
                method=method,
                url=url,
            )
        # Not a PaddleCloud problem: a proxy's HTML page, a load balancer's plain text, nothing.
        detail = summarize_body(body, content_type) or "the answer had no body"
        return cls(
            status,
            _status_title(status, reason),
            detail,
            request_id=request_id,
            body=parsed if parsed is not None else body.decode("utf-8", "replace"),
            method=method,
            url=url,
        )


def one_line(text: str) -> str:
    """Collapse whitespace so that a message never spills onto a second line."""
    return " ".join(text.split())


def summarize_body(body: bytes, content_type: str, limit: int = 200) -> str:
    """A short, single-line gist of a body that is not problem+json (an HTML title, or its text)."""
    text = body[:MAX_ERROR_BODY].decode("utf-8", "replace")
    if "html" in content_type or text.lstrip()[:1] == "<":
        title = re.search(r"<title[^>]*>(.*?)</title>", text, re.IGNORECASE | re.DOTALL)
        if title and title.group(1).strip():
            text = title.group(1)
        else:
            text = re.sub(r"<(script|style)\b.*?</\1>", " ", text, flags=re.IGNORECASE | re.DOTALL)
            text = re.sub(r"<[^>]+>", " ", text)
        text = html.unescape(text)
    text = one_line(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _status_title(status: int, reason: str | None) -> str:
    return f"HTTP {status} {reason}" if reason else f"HTTP {status}"


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)


def _field_errors(value: Any) -> tuple[FieldError, ...]:
    if not isinstance(value, list):
        return ()
    found = []
    for item in value:
        if isinstance(item, dict):
            found.append(FieldError(_text(item.get("field")) or "", _text(item.get("message")) or ""))
        elif isinstance(item, str):
            found.append(FieldError("", item))
    return tuple(found)
