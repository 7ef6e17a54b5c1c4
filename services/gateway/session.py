"""Browser sessions: the cookie that carries a token, and the CSRF token bound to it.

A signed-in page holds an ordinary API token (issued, expired and revoked like the
CLI's) in an HttpOnly, SameSite=Strict cookie. Because a browser attaches that cookie by
itself, every state-changing request authenticated by it must also carry a CSRF token
the page can read and another site cannot: HMAC(internal secret, token hash), a
synchronizer token that needs no server-side state and dies with the session.
Bearer tokens need none of this: no browser adds an `Authorization` header on its own.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from aiohttp import web
from yarl import URL

from paddlecloud.common.keys import INTERNAL_SECRET

from .errors import CSRF_REFUSED

SESSION_COOKIE = "pc_session"
# Before sign-in there is no session to bind a token to: the sign-in form is protected by
# a double-submit cookie instead, so another site cannot sign a browser into its account.
LOGIN_CSRF_COOKIE = "pc_login_csrf"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_METHOD_OVERRIDE = "X-HTTP-Method-Override"


def session_token(request: web.Request) -> str | None:
    """The token in the session cookie, if the request carries one."""
    return request.cookies.get(SESSION_COOKIE) or None


def csrf_token(request: web.Request, token_hash: str) -> str:
    """The CSRF token of the session whose token hashes to `token_hash`."""
    key = request.app[INTERNAL_SECRET]
    return hmac.new(key, b"paddlecloud-csrf:" + token_hash.encode(), hashlib.sha256).hexdigest()


def is_unsafe(request: web.Request) -> bool:
    # pfs honours X-HTTP-Method-Override on any method (tus clients behind old proxies), so
    # a GET that asks to be a DELETE is as state-changing as the DELETE itself.
    return request.method not in SAFE_METHODS or _METHOD_OVERRIDE in request.headers


def same_origin(request: web.Request) -> bool:
    """False when the browser says the request comes from another origin.

    A request without `Origin` (a form navigation in an old browser, a non-browser client)
    is left to the token check; one with a foreign or opaque (`null`) origin is refused.
    """
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    url = URL(origin)
    return url.scheme == _scheme(request) and url.host is not None and url.raw_authority == request.host


def check_csrf(request: web.Request, token_hash: str) -> None:
    """Refuse a cookie-authenticated state-changing request without the session's CSRF token."""
    if not is_unsafe(request):
        return
    sent = request.headers.get(CSRF_HEADER, "")
    expected = csrf_token(request, token_hash)
    if not same_origin(request):
        raise CSRF_REFUSED("The request came from another site.")
    if not hmac.compare_digest(sent.encode(), expected.encode()):
        raise CSRF_REFUSED(
            f"A request authenticated by the session cookie must carry the {CSRF_HEADER} header."
        )


def _scheme(request: web.Request) -> str:
    # Behind a TLS-terminating proxy the gateway itself speaks plain HTTP; believing the
    # proxy's X-Forwarded-Proto here can only make a cookie stricter or an Origin check
    # demand https, never weaker.
    forwarded = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    if forwarded in ("http", "https"):
        return forwarded
    return request.scheme


def is_tls(request: web.Request) -> bool:
    return _scheme(request) == "https"


def set_session_cookie(response: web.StreamResponse, request: web.Request, token: str, max_age: int) -> None:
    response.set_cookie(
        SESSION_COOKIE,
        token,
        max_age=max_age,
        path="/",
        httponly=True,
        secure=is_tls(request),
        samesite="Strict",
    )


def clear_session_cookie(response: web.StreamResponse) -> None:
    response.del_cookie(SESSION_COOKIE, path="/")


def login_csrf(request: web.Request) -> tuple[str, bool]:
    """The sign-in form's double-submit token, and whether it must be set as a cookie."""
    existing = request.cookies.get(LOGIN_CSRF_COOKIE, "")
    if len(existing) == 43:
        return existing, False
    return secrets.token_urlsafe(32), True


def set_login_csrf_cookie(response: web.StreamResponse, request: web.Request, value: str) -> None:
    response.set_cookie(
        LOGIN_CSRF_COOKIE,
        value,
        path="/login",
        httponly=True,
        secure=is_tls(request),
        samesite="Strict",
    )


def check_login_csrf(request: web.Request, sent: str) -> None:
    cookie = request.cookies.get(LOGIN_CSRF_COOKIE, "")
    if not same_origin(request):
        raise CSRF_REFUSED("The sign-in came from another site.")
    if not cookie or not hmac.compare_digest(cookie.encode(), sent.encode()):
        raise CSRF_REFUSED("The sign-in form has expired; load it again.")
