"""The gateway's signature on forwarded identities, and its check in every service.

The gateway authenticates the caller, then forwards who they are in headers with an
HMAC over the identity, the request id, the method, the path and a timestamp. A service
accepts a request only with a fresh, valid signature, so nothing that skipped the
gateway (or replayed a signature onto another path) gets through.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass

USER_HEADER = "X-PaddleCloud-User"
ADMIN_HEADER = "X-PaddleCloud-Admin"
TIME_HEADER = "X-PaddleCloud-Auth-Time"
SIGNATURE_HEADER = "X-PaddleCloud-Signature"
HEADERS = (USER_HEADER, ADMIN_HEADER, TIME_HEADER, SIGNATURE_HEADER)

# How old a signature may be. Clocks are shared on one machine and NTP-synced in a
# cluster; the window only has to cover the hop from gateway to service.
MAX_AGE_SECONDS = 300


@dataclass(frozen=True)
class Identity:
    """Who a request acts for, as the gateway established it."""

    user: str
    admin: bool = False


def _mac(secret: bytes, identity: Identity, stamp: str, request_id: str, method: str, path: str) -> str:
    message = "\n".join(
        (identity.user, "1" if identity.admin else "0", stamp, request_id, method.upper(), path)
    )
    return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()


def sign(secret: bytes, identity: Identity, request_id: str, method: str, path_qs: str) -> dict[str, str]:
    """Headers that carry `identity` for one request to `method path_qs`."""
    stamp = str(int(time.time()))
    return {
        USER_HEADER: identity.user,
        ADMIN_HEADER: "1" if identity.admin else "0",
        TIME_HEADER: stamp,
        SIGNATURE_HEADER: _mac(secret, identity, stamp, request_id, method, path_qs),
    }


def verify(
    secret: bytes,
    headers: Mapping[str, str],
    request_id: str,
    method: str,
    path_qs: str,
    *,
    now: float | None = None,
) -> Identity | None:
    """The identity the headers carry, or None if they are missing, stale or forged."""
    user, admin, stamp, signature = (headers.get(h) for h in HEADERS)
    if not (user and admin in ("0", "1") and stamp and signature):
        return None
    try:
        age = (time.time() if now is None else now) - int(stamp)
    except ValueError:
        return None
    if abs(age) > MAX_AGE_SECONDS:
        return None
    identity = Identity(user=user, admin=admin == "1")
    expected = _mac(secret, identity, stamp, request_id, method, path_qs)
    return identity if hmac.compare_digest(expected, signature) else None
