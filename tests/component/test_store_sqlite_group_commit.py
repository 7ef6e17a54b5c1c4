"""The SQLite store's group commit: concurrent single-statement writes share a transaction
(one sync of the WAL), each is committed when its caller gets its answer, and one that
fails fails alone. The contract every store keeps is in test_store_contract.py."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from paddlecloud.common.store import AlreadyExists, StoreError, User, open_store
from paddlecloud.common.store.sqlite import SQLiteStore

WRITERS = 40


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@pytest.fixture
async def store(path: Path) -> AsyncIterator[SQLiteStore]:
    opened = open_store(f"sqlite:///{path}")
    assert isinstance(opened, SQLiteStore)
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()


def user(name: str) -> User:
    return User(name=name, password_hash=f"argon2-hash-of-{name}")


def names_seen_by_another_connection(path: Path) -> list[str]:
    """What a reader that is not the store's own connection finds committed."""
    conn = sqlite3.connect(path)
    try:
        return [row[0] for row in conn.execute("SELECT name FROM users ORDER BY name")]
    finally:
        conn.close()


async def statements(store: SQLiteStore) -> list[str]:
    """Every statement the store's connection runs from now on, in order."""
    seen: list[str] = []
    await store._connection().set_trace_callback(seen.append)
    return seen


async def test_concurrent_writes_share_one_commit(store: SQLiteStore, path: Path) -> None:
    seen = await statements(store)
    names = [f"user-{i:02}" for i in range(WRITERS)]
    # Every writer queues before the committer first runs: one group, one transaction.
    await asyncio.gather(*(store.create_user(user(name)) for name in names))
    assert seen.count("COMMIT") == 1
    assert seen.count("BEGIN IMMEDIATE") == 1
    assert names_seen_by_another_connection(path) == names


async def test_a_write_alone_is_its_own_transaction(store: SQLiteStore, path: Path) -> None:
    seen = await statements(store)
    await store.create_user(user("alone"))
    # Committed before the answer: another connection sees it at once.
    assert names_seen_by_another_connection(path) == ["alone"]
    assert "BEGIN IMMEDIATE" not in seen and "COMMIT" not in seen


async def test_a_duplicate_in_a_group_fails_alone(store: SQLiteStore, path: Path) -> None:
    await store.create_user(user("taken"))
    outcomes = await asyncio.gather(
        store.create_user(user("before")),
        store.create_user(user("taken")),
        store.create_user(user("after")),
        return_exceptions=True,
    )
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], AlreadyExists)
    assert names_seen_by_another_connection(path) == ["after", "before", "taken"]


async def test_a_write_that_may_end_the_transaction_fails_alone(store: SQLiteStore, path: Path) -> None:
    # Not a constraint: the group is rolled back, this write fails, the others are
    # queued again and committed.
    seen = await statements(store)
    outcomes = await asyncio.gather(
        store.create_user(user("before")),
        store._write("INSERT INTO no_such_table VALUES (1)", what="a bad write"),
        store.create_user(user("after")),
        return_exceptions=True,
    )
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], StoreError)
    assert "no such table" in str(outcomes[1])
    assert "ROLLBACK" in seen
    assert names_seen_by_another_connection(path) == ["after", "before"]


async def test_returning_writes_are_grouped_too(store: SQLiteStore) -> None:
    seen = await statements(store)
    # Leases are taken with INSERT ... RETURNING: of many takers of one lease exactly one
    # wins, in a group as when each had a transaction of its own.
    taken = await asyncio.gather(*(store.acquire_lease("one", f"holder-{i}", 60) for i in range(WRITERS)))
    assert taken.count(True) == 1
    assert seen.count("COMMIT") == 1


async def test_closing_commits_what_is_queued(path: Path) -> None:
    store = open_store(f"sqlite:///{path}")
    await store.open()
    writes = [asyncio.ensure_future(store.create_user(user(f"late-{i}"))) for i in range(3)]
    await asyncio.sleep(0)  # queued, not yet committed
    await store.close()
    await asyncio.gather(*writes)
    assert names_seen_by_another_connection(path) == ["late-0", "late-1", "late-2"]


async def test_a_write_to_a_closed_store_is_refused(store: SQLiteStore) -> None:
    await store.close()
    with pytest.raises(StoreError, match="not open"):
        await store.create_user(user("nobody"))
