"""The gateway's error catalogue: the codes of sign-in, sessions and the proxy, in one place.

Problems every service may answer (a bad body, an unknown route, a full disk) are the
common catalogue's (services/common/errors.py); these are the gateway's own. Codes are
stable: clients and tests match on them.
"""

from __future__ import annotations

from paddlecloud.common.errors import (
    COMMON_PROBLEMS,
    UNAUTHENTICATED,
    UPSTREAM_TIMEOUT,
    UPSTREAM_UNAVAILABLE,
    UPSTREAM_UNREACHABLE,
    ErrorKind,
    ProblemTable,
)

__all__ = [
    "BAD_CREDENTIALS",
    "CSRF_REFUSED",
    "PROBLEMS",
    "UNAUTHENTICATED",
    "UPSTREAM_TIMEOUT",
    "UPSTREAM_UNAVAILABLE",
    "UPSTREAM_UNREACHABLE",
    "WRONG_PASSWORD",
]

BAD_CREDENTIALS = ErrorKind("ERR_BAD_CREDENTIALS", 401, "Wrong username or password")
# A password change whose current password is wrong: a 403, not a 401, since the session
# that asked is valid (a client that saw 401 would log in again and resend the same guess).
WRONG_PASSWORD = ErrorKind("ERR_WRONG_PASSWORD", 403, "Wrong password")
# A cookie-authenticated (browser) request that changes state without its CSRF token.
CSRF_REFUSED = ErrorKind("ERR_CSRF", 403, "Cross-site request refused")

PROBLEMS: ProblemTable = dict(COMMON_PROBLEMS)
