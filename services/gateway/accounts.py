"""Users, passwords and tokens: the gateway's domain logic, independent of HTTP."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

import structlog
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from paddlecloud.common.internal_auth import Identity
from paddlecloud.common.store import AlreadyExists, Quota, Store, Token, User
from paddlecloud.common.store.models import utcnow

from .logins import LoginLimiter, Refusal

log = structlog.get_logger()
_T = TypeVar("_T")

TOKEN_PREFIX = "pc_"  # noqa: S105 - a marker that makes leaked tokens greppable, not a secret
MIN_PASSWORD_LENGTH = 8
# Verified sessions are remembered this long, so a busy client costs no store round trip
# per request. A revocation or user deletion on this gateway takes effect at once; other
# gateway replicas notice it within this many seconds.
SESSION_CACHE_SECONDS = 10.0
SESSION_CACHE_SIZE = 10_000


class LoginFailed(Exception):
    """Wrong user name or password; deliberately does not say which."""


class LoginLimited(Exception):
    """Too many failed logins lately for the name or from the address; nothing was tried."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.reason)
        self.refusal = refusal


@dataclass(frozen=True)
class Session:
    identity: Identity
    token_hash: str
    expires_at: datetime


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Accounts:
    """Authenticates users and issues, checks and revokes their tokens."""

    def __init__(
        self,
        store: Store,
        token_ttl: timedelta,
        *,
        max_concurrent_hashes: int = 4,
        limiter: LoginLimiter | None = None,
    ) -> None:
        self._store = store
        self._ttl = token_ttl
        self._limiter = limiter
        self._hasher = PasswordHasher()
        # argon2 takes 64 MiB per hash: 40 logins at once took the gateway from 61 to
        # 445 MB. Past this many, hashes wait their turn, known user or not, so a missing
        # user and a wrong password still take the same time.
        self._hash_slots = asyncio.Semaphore(max_concurrent_hashes)
        self.hashes_running = 0
        self.hashes_peak = 0
        # Verified against when the user does not exist, so that a missing user and a
        # wrong password take the same time; made on first need, off the event loop.
        self._dummy_hash: str | None = None
        # token hash -> (fresh until, on the monotonic clock; expiry, as a POSIX time; session)
        self._sessions: OrderedDict[str, tuple[float, float, Session]] = OrderedDict()
        # token hash -> the store lookup under way for it, which every request that missed
        # the cache meanwhile awaits: when a busy token's entry goes stale, one lookup
        # refreshes it, not one per request in flight (200 of them stalled for seconds).
        self._lookups: dict[str, asyncio.Future[Session | None]] = {}
        # Counts revocations: a lookup that overlapped one does not cache what it found.
        self._revocations = 0

    async def hash_password(self, password: str) -> str:
        return await self._hashing(self._hasher.hash, password)

    async def _verify(self, password_hash: str, password: str) -> bool:
        def check(password: str) -> bool:
            try:
                return self._hasher.verify(password_hash, password)
            except (VerificationError, InvalidHashError):
                return False

        return await self._hashing(check, password)

    async def _hashing(self, work: Callable[[str], _T], password: str) -> _T:
        """`work` on a thread (argon2 is deliberately slow), once a hash slot is free."""
        async with self._hash_slots:
            self.hashes_running += 1
            self.hashes_peak = max(self.hashes_peak, self.hashes_running)
            try:
                return await asyncio.to_thread(work, password)
            finally:
                self.hashes_running -= 1

    async def login(self, username: str, password: str, address: str = "") -> tuple[str, Token, User]:
        """A new token for the user; LoginFailed, or LoginLimited if `username` or
        `address` (the client's) failed too often lately."""
        if self._limiter is not None:
            refusal = self._limiter.check(username, address)
            if refusal is not None:
                log.info("login_limited", username=username, address=address, reason=refusal.reason)
                raise LoginLimited(refusal)
        try:
            return await self._login(username, password)
        except LoginFailed:
            if self._limiter is not None:
                self._limiter.failed(username, address)
            raise

    async def _login(self, username: str, password: str) -> tuple[str, Token, User]:
        user = await self._store.get_user(username)
        if user is None and self._dummy_hash is None:
            self._dummy_hash = await self.hash_password(secrets.token_hex(16))
        ok = await self._verify(user.password_hash if user else self._dummy_hash or "", password)
        if user is None or not ok:
            log.info("login_failed", username=username)
            raise LoginFailed
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        record = Token(token_hash=hash_token(token), user=user.name, expires_at=utcnow() + self._ttl)
        await self._store.add_token(record)
        if self._limiter is not None:
            self._limiter.succeeded(user.name)
        log.info("login_succeeded", username=user.name)
        return token, record, user

    async def authenticate(self, token: str) -> Session | None:
        """The session a token opens, or None if it is unknown, expired or its user is gone."""
        if not token.startswith(TOKEN_PREFIX):
            return None
        token_hash = hash_token(token)
        cached = self._sessions.get(token_hash)
        if cached is not None:
            fresh_until, expires, session = cached
            if time.monotonic() < fresh_until and time.time() < expires:
                self._sessions.move_to_end(token_hash)
                return session
            del self._sessions[token_hash]
        lookup = self._lookups.get(token_hash)
        if lookup is None:
            lookup = asyncio.ensure_future(self._look_up(token_hash))
            self._lookups[token_hash] = lookup
            lookup.add_done_callback(lambda done: self._looked_up(token_hash, done))
        # Shielded: one caller going away (its client hung up) must not cancel the others'.
        return await asyncio.shield(lookup)

    def _looked_up(self, token_hash: str, done: asyncio.Future[Session | None]) -> None:
        self._lookups.pop(token_hash, None)
        if not done.cancelled():
            done.exception()  # retrieved: each waiter got it; none left may mean none is logged

    async def _look_up(self, token_hash: str) -> Session | None:
        revocations = self._revocations
        record = await self._store.get_token(token_hash)
        if record is None or record.expires_at <= utcnow():
            return None
        user = await self._store.get_user(record.user)
        if user is None:
            return None
        session = Session(Identity(user.name, user.admin), token_hash, record.expires_at)
        if revocations != self._revocations:
            return session  # it may be one of those revoked: this request only, not cached
        fresh_until = time.monotonic() + SESSION_CACHE_SECONDS
        self._sessions[token_hash] = (fresh_until, record.expires_at.timestamp(), session)
        if len(self._sessions) > SESSION_CACHE_SIZE:
            self._sessions.popitem(last=False)
        return session

    async def revoke(self, token_hash: str) -> None:
        self._revocations += 1
        self._sessions.pop(token_hash, None)
        await self._store.delete_token(token_hash)

    async def get_user(self, name: str) -> User | None:
        return await self._store.get_user(name)

    async def revoke_user(self, name: str) -> None:
        """End every session of the user: cached ones here, and their tokens in the store."""
        self._revocations += 1
        for token_hash, (_, _, session) in list(self._sessions.items()):
            if session.identity.user == name:
                del self._sessions[token_hash]
        await self._store.delete_tokens_of(name)

    async def delete_user(self, name: str) -> bool:
        """Remove a user and end their sessions; False if there was no such user."""
        self._revocations += 1
        for token_hash, (_, _, session) in list(self._sessions.items()):
            if session.identity.user == name:
                del self._sessions[token_hash]
        deleted = await self._store.delete_user(name)
        if deleted:
            log.info("user_deleted", name=name)
        return deleted

    async def create_user(
        self, name: str, password: str, *, admin: bool = False, quota: Quota | None = None
    ) -> User:
        """Add a user with `quota` (unlimited unless given); AlreadyExists if the name is taken."""
        user = User(
            name=name,
            password_hash=await self.hash_password(password),
            admin=admin,
            quota=quota or Quota(),
        )
        await self._store.create_user(user)
        log.info("user_created", name=name, admin=admin)
        return user

    async def change_password(
        self, name: str, current: str, new: str, address: str = ""
    ) -> tuple[str, Token, User]:
        """Replace the user's password after checking the current one, end every session of
        theirs, and open a new one for the caller: (token, record, user). The check counts
        against the login limits as a login would (a stolen session must not become a way to
        guess the password); LoginFailed, LoginLimited."""
        if self._limiter is not None:
            refusal = self._limiter.check(name, address)
            if refusal is not None:
                log.info("password_change_limited", username=name, reason=refusal.reason)
                raise LoginLimited(refusal)
        user = await self._store.get_user(name)
        if user is None or not await self._verify(user.password_hash, current):
            if self._limiter is not None:
                self._limiter.failed(name, address)
            log.info("password_change_refused", username=name)
            raise LoginFailed
        await self.set_password(name, new)
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        record = Token(token_hash=hash_token(token), user=name, expires_at=utcnow() + self._ttl)
        await self._store.add_token(record)
        if self._limiter is not None:
            self._limiter.succeeded(name)
        return token, record, user

    async def set_password(self, name: str, password: str) -> User | None:
        """Store a new password for the user and end every session of theirs (the tokens
        issued with the old one); None if there is no such user."""
        user = await self._store.update_user(name, password_hash=await self.hash_password(password))
        if user is not None:
            await self.revoke_user(name)
            log.info("password_set", name=name)
        return user

    async def set_quota(self, name: str, quota: Quota) -> User | None:
        return await self._store.update_user(name, quota=quota)

    async def ensure_admin(self, name: str, password: str) -> bool:
        """Create the first admin if the store has no users at all; True if it did."""
        if await self._store.count_users() > 0:
            return False
        try:
            await self.create_user(name, password, admin=True)
        except AlreadyExists:
            return False  # another gateway replica bootstrapped it first
        return True
