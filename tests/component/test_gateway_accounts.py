"""The gateway's session cache over a real store: what a busy token costs it."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from paddlecloud.common.store import Store
from paddlecloud.gateway import accounts as accounts_module
from paddlecloud.gateway.accounts import Accounts


class Counting:
    """Counts the store's token lookups; each reads the token, then waits to be released."""

    def __init__(self, store: Store) -> None:
        self.calls = 0
        self.release = asyncio.Event()
        self._get_token = store.get_token

    async def get_token(self, token_hash: str) -> Any:
        self.calls += 1
        record = await self._get_token(token_hash)
        await self.release.wait()
        return record


@pytest.fixture
def backend() -> str:
    return "sqlite"


async def test_a_stale_busy_session_is_looked_up_once_not_once_per_request(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every entry is stale at once, as a busy token's is every SESSION_CACHE_SECONDS.
    monkeypatch.setattr(accounts_module, "SESSION_CACHE_SECONDS", 0.0)
    accounts = Accounts(store, timedelta(hours=1))
    await accounts.create_user("alice", "alice-password")
    token, _, _ = await accounts.login("alice", "alice-password")
    counting = Counting(store)
    monkeypatch.setattr(store, "get_token", counting.get_token)
    # 200 requests in flight when the entry goes stale (200 clients stalled for seconds
    # behind 200 store lookups each): one lookup serves them all.
    waiting = [asyncio.ensure_future(accounts.authenticate(token)) for _ in range(200)]
    await asyncio.sleep(0.05)
    counting.release.set()
    sessions = await asyncio.gather(*waiting)
    assert counting.calls == 1
    assert {s.identity.user for s in sessions if s is not None} == {"alice"} and all(sessions)


async def test_a_lookup_that_overlaps_a_revocation_is_not_cached(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    accounts = Accounts(store, timedelta(hours=1))
    await accounts.create_user("alice", "alice-password")
    token, record, _ = await accounts.login("alice", "alice-password")
    counting = Counting(store)
    monkeypatch.setattr(store, "get_token", counting.get_token)
    looking = asyncio.ensure_future(accounts.authenticate(token))
    await asyncio.sleep(0.05)  # the lookup has read the token, and not yet answered
    await accounts.revoke(record.token_hash)
    counting.release.set()
    # It began before the revocation: what it found is for that request alone, not cached.
    assert (await looking) is not None
    assert await accounts.authenticate(token) is None
