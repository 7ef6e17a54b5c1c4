"""The contract every store keeps, run against SQLite, MongoDB (or nx-27017) and FerretDB."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from paddlecloud.common.store import (
    AlreadyExists,
    Build,
    Job,
    JobEvent,
    KeptLog,
    KeptSeries,
    Quota,
    Store,
    StoreError,
    Token,
    User,
    open_store,
)
from paddlecloud.common.store.models import (
    BUILDING,
    FAILED,
    KILLED,
    PENDING,
    RUNNING,
    SUCCEEDED,
    utcnow,
)

# Where the emulator parts from MongoDB. Each is asserted by one test, marked as an
# expected failure on nx-27017 only (strictly, so a fixed emulator shows up as XPASS).
NX_ID_FIELD = (
    "nx-27017 gives a top-level field named `id` a meaning of its own: "
    "create_index('id', unique=True) silently creates nothing, and a filter {'id': s} is "
    "rewritten (to _id when s looks like an ObjectId, to an integer when s is digits). "
    "To MongoDB `id` is an ordinary field."
)
NX_SET_DATE = (
    "nx-27017 stores a date given to $set at the top level of a document as a string "
    "(str() of the naive UTC datetime); dates in inserted documents, and dates nested "
    "in a $set value, stay dates. MongoDB keeps a BSON date either way."
)
NX_SECOND_PRECISION = (
    "nx-27017 compares dates in query filters to the whole second, although it stores "
    "and sorts them to the millisecond; MongoDB compares BSON dates to the millisecond."
)

# Where FerretDB v1 (SQLite backend) parts from MongoDB so that a case cannot hold there.
FERRET_NOT_ATOMIC = (
    "FerretDB v1's SQLite handler runs findAndModify as a read, then a write of the whole "
    "document by _id, not in one transaction (FerretDB issue #3040), so concurrent "
    "compare-and-sets on one document can each win. MongoDB applies findAndModify to the one "
    "document atomically. Skipped, not xfailed: the race is lost only in some runs (measured: 1 "
    "in 40 for 8 job writers, 26 in 40 for 6 build writers), so a non-strict xfail would check "
    "nothing and a strict one would flake."
)

# A fixed, whole-second origin: times the tests compare in filters differ by whole
# seconds (see NX_SECOND_PRECISION) unless a test is about milliseconds.
T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def expect_nx_deviation(request: pytest.FixtureRequest, emulated: bool, reason: str) -> None:
    if emulated:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))


def cannot_hold_on_ferretdb(backend: str, reason: str) -> None:
    if backend == "ferretdb":
        pytest.skip(reason)


def new_id() -> str:
    return f"j-{uuid.uuid4().hex}"


def make_user(name: str = "alice", **overrides: Any) -> User:
    return User(name=name, password_hash=f"argon2-hash-of-{name}", **overrides)


def make_job(owner: str = "alice", name: str | None = None, **overrides: Any) -> Job:
    fields: dict[str, Any] = {
        "id": new_id(),
        "owner": owner,
        "name": name or f"job-{uuid.uuid4().hex[:8]}",
        "state": PENDING,
        "spec": {"entry": "python train.py", "trainers": 2, "env": {"A": "1"}},
    }
    fields.update(overrides)
    return Job(**fields)


def make_build(key: str = "key-1", **overrides: Any) -> Build:
    fields: dict[str, Any] = {
        "id": f"b-{uuid.uuid4().hex}",
        "key": key,
        "owner": "alice",
        "state": PENDING,
        "spec": {"base": "python:3.11", "requirements": ["numpy"]},
    }
    fields.update(overrides)
    return Build(**fields)


def assert_utc(value: datetime | None) -> None:
    assert value is not None
    assert value.tzinfo is not None and value.utcoffset() == timedelta(0)


async def all_pages(store: Store, owner: str | None, limit: int, **kwargs: Any) -> list[Job]:
    jobs: list[Job] = []
    cursor: str | None = None
    while True:
        page, cursor = await store.list_jobs(owner, limit=limit, cursor=cursor, **kwargs)
        assert len(page) <= limit
        jobs.extend(page)
        if cursor is None:
            return jobs
        assert len(page) == limit, "a page short of the limit must be the last"


def newest_first(jobs: list[Job]) -> list[str]:
    return [job.id for job in sorted(jobs, key=lambda j: (j.created_at, j.id), reverse=True)]


# Opening


async def test_open_again_is_harmless(store: Store) -> None:
    await store.create_user(make_user("before"))
    await store.open()
    await store.ping()
    await store.create_user(make_user("after"))
    assert [u.name for u in await store.list_users()] == ["after", "before"]


async def test_unsupported_scheme_is_named() -> None:
    with pytest.raises(StoreError, match="'foo'"):
        open_store("foo://x")


async def test_sqlite_url_must_name_an_absolute_path() -> None:
    with pytest.raises(StoreError, match="absolute path"):
        open_store("sqlite://relative/store.db")


async def test_sqlite_creates_the_directory(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "store.db"
    store = open_store(f"sqlite:///{path}")
    await store.open()
    try:
        await store.ping()
    finally:
        await store.close()
    assert path.exists()


async def test_sqlite_in_memory() -> None:
    store = open_store("sqlite:///:memory:")
    await store.open()
    try:
        await store.create_user(make_user())
        assert await store.count_users() == 1
    finally:
        await store.close()


async def test_unreachable_mongodb_fails_fast_with_a_store_error() -> None:
    # Port 1 on loopback refuses connections; the URL's timeout keeps the wait short.
    store = open_store("mongodb://127.0.0.1:1/paddlecloud?serverSelectionTimeoutMS=300")
    with pytest.raises(StoreError, match="cannot reach MongoDB"):
        await store.open()
    await store.close()


# Users


async def test_users_round_trip(store: Store) -> None:
    user = make_user(
        "alice",
        admin=True,
        quota=Quota(
            cpu_milli=4000, gpu=1, memory_bytes=16 << 30, jobs=3, storage_bytes=1 << 40, disk_bytes=200 << 30
        ),
    )
    await store.create_user(user)
    got = await store.get_user("alice")
    assert got == user
    assert got is not None
    assert got.password_hash == user.password_hash  # not part of repr, but of equality
    assert_utc(got.created_at)
    assert await store.get_user("nobody") is None


async def test_user_name_is_unique(store: Store) -> None:
    user = make_user("alice")
    await store.create_user(user)
    with pytest.raises(AlreadyExists):
        await store.create_user(make_user("alice", admin=True))
    assert await store.get_user("alice") == user


async def test_list_and_count_users(store: Store) -> None:
    assert await store.list_users() == []
    assert await store.count_users() == 0
    for name in ["carol", "alice", "bob"]:
        await store.create_user(make_user(name))
    assert [u.name for u in await store.list_users()] == ["alice", "bob", "carol"]
    assert await store.count_users() == 3


async def test_update_user(store: Store) -> None:
    user = make_user("alice")
    await store.create_user(user)
    assert await store.update_user("alice") == user
    quota = Quota(cpu_milli=500, jobs=2)
    updated = await store.update_user("alice", password_hash="new-hash", admin=True, quota=quota)
    assert updated == User(
        name="alice", password_hash="new-hash", admin=True, quota=quota, created_at=user.created_at
    )
    assert await store.get_user("alice") == updated
    # Only the fields given change.
    again = await store.update_user("alice", admin=False)
    assert again is not None
    assert (again.admin, again.password_hash, again.quota) == (False, "new-hash", quota)
    assert await store.update_user("nobody", admin=True) is None
    assert await store.get_user("nobody") is None


async def test_delete_user_removes_their_tokens(store: Store) -> None:
    await store.create_user(make_user("alice"))
    await store.create_user(make_user("bob"))
    later = utcnow() + timedelta(hours=1)
    await store.add_token(Token(token_hash="a1", user="alice", expires_at=later))
    await store.add_token(Token(token_hash="a2", user="alice", expires_at=later))
    await store.add_token(Token(token_hash="b1", user="bob", expires_at=later))
    assert await store.delete_user("alice") is True
    assert await store.get_user("alice") is None
    assert await store.get_token("a1") is None
    assert await store.get_token("a2") is None
    assert await store.get_token("b1") is not None
    assert await store.delete_user("alice") is False


# Tokens


async def test_tokens(store: Store) -> None:
    await store.create_user(make_user("alice"))
    token = Token(token_hash="h" * 64, user="alice", expires_at=utcnow() + timedelta(days=7))
    await store.add_token(token)
    got = await store.get_token(token.token_hash)
    assert got == token
    assert got is not None
    assert_utc(got.expires_at)
    assert_utc(got.created_at)
    with pytest.raises(AlreadyExists):
        await store.add_token(token)
    assert await store.get_token("unknown") is None
    assert await store.delete_token(token.token_hash) is True
    assert await store.get_token(token.token_hash) is None
    assert await store.delete_token(token.token_hash) is False


async def test_token_for_an_unknown_user_is_refused(store: Store) -> None:
    with pytest.raises(StoreError):
        await store.add_token(Token(token_hash="x", user="ghost", expires_at=utcnow()))
    assert await store.get_token("x") is None


async def test_purge_expired_tokens(store: Store) -> None:
    await store.create_user(make_user("alice"))
    for token_hash, expires_at in [
        ("long-gone", T0 - timedelta(days=1)),
        ("just-gone", T0 - timedelta(seconds=1)),
        ("expiring-now", T0),
        ("valid", T0 + timedelta(hours=1)),
    ]:
        await store.add_token(Token(token_hash=token_hash, user="alice", expires_at=expires_at))
    assert await store.purge_expired_tokens(T0) == 2
    # "Expired before now": a token expiring at exactly `now` stays for this purge.
    for token_hash, kept in [
        ("long-gone", False),
        ("just-gone", False),
        ("expiring-now", True),
        ("valid", True),
    ]:
        assert (await store.get_token(token_hash) is not None) is kept, token_hash
    assert await store.purge_expired_tokens(T0) == 0


# Jobs


async def test_job_round_trip(store: Store) -> None:
    job = make_job(
        spec={
            "entry": "python train.py --lr 0.1",
            "trainers": 4,
            "ratio": 0.5,
            "flags": [True, None, "x", 3],
            "volumes": [{"name": "data", "path": "/pfs/data"}],
            "resources": {"cpu_milli": 2000, "memory_bytes": 8 << 30},
        },
        started_at=T0 + timedelta(milliseconds=999),
        reason="queued",
        backend={"namespace": "pc-alice", "labels": {"app": "x"}},
        build_id="b-1",
    )
    await store.create_job(job)
    assert await store.get_job("alice", job.name) == job
    assert await store.get_job_by_id(job.id) == job
    assert await store.get_job("bob", job.name) is None
    assert await store.get_job("alice", "nope") is None
    assert await store.get_job_by_id("nope") is None


async def test_job_name_is_unique_per_owner(store: Store) -> None:
    job = make_job("alice", "train")
    await store.create_job(job)
    with pytest.raises(AlreadyExists):
        await store.create_job(make_job("alice", "train"))
    other = make_job("bob", "train")
    await store.create_job(other)
    assert await store.get_job("alice", "train") == job
    assert await store.get_job("bob", "train") == other


async def test_job_id_is_unique(store: Store, request: pytest.FixtureRequest, emulated_mongo: bool) -> None:
    expect_nx_deviation(request, emulated_mongo, NX_ID_FIELD)
    job = make_job("alice", "one")
    await store.create_job(job)
    with pytest.raises(AlreadyExists):
        await store.create_job(make_job("bob", "two", id=job.id))


async def test_ids_of_any_shape(store: Store, request: pytest.FixtureRequest, emulated_mongo: bool) -> None:
    expect_nx_deviation(request, emulated_mongo, NX_ID_FIELD)
    # Digits and 24 hex digits, the shapes the emulator reinterprets.
    for job_id in ["1234", "65f0c0ffee0123456789abcd"]:
        job = make_job(id=job_id)
        await store.create_job(job)
        assert await store.get_job_by_id(job_id) == job
        assert await store.transition_job(job_id, [PENDING], RUNNING) is not None


async def test_times_round_trip_exactly_and_come_back_in_utc(store: Store) -> None:
    india = timezone(timedelta(hours=5, minutes=30))
    job = make_job(
        created_at=utcnow(),
        updated_at=datetime(2024, 2, 29, 23, 59, 59, 999000, tzinfo=UTC),
        started_at=datetime(2026, 1, 1, 5, 30, 0, 1000, tzinfo=india),
        finished_at=datetime(1999, 12, 31, 23, 59, 59, tzinfo=UTC),
    )
    await store.create_job(job)
    got = await store.get_job_by_id(job.id)
    assert got == job
    assert got is not None
    for value in (got.created_at, got.updated_at, got.started_at, got.finished_at):
        assert_utc(value)
    assert got.started_at == datetime(2026, 1, 1, 0, 0, 0, 1000, tzinfo=UTC)


async def test_naive_times_are_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="naive"):
        await store.create_job(make_job(created_at=datetime(2026, 1, 1)))


async def test_list_jobs_pages_newest_first(store: Store) -> None:
    # Three jobs to a second, so the id has to break ties inside a page and across
    # page boundaries (50 is not a multiple of 3).
    jobs = [make_job("alice", f"job-{i:03d}", created_at=T0 + timedelta(seconds=i // 3)) for i in range(120)]
    others = [make_job("bob", f"job-{i}", created_at=T0 + timedelta(seconds=i)) for i in range(5)]
    for job in jobs + others:
        await store.create_job(job)

    first, cursor = await store.list_jobs("alice", limit=50)
    assert len(first) == 50 and cursor is not None
    listed = await all_pages(store, "alice", limit=50)
    assert [j.id for j in listed] == newest_first(jobs)
    assert listed == sorted(jobs, key=lambda j: (j.created_at, j.id), reverse=True)
    assert listed[:50] == first

    # Everyone's jobs when no owner is given, in the same order.
    everyone = await all_pages(store, None, limit=50)
    assert [j.id for j in everyone] == newest_first(jobs + others)

    # Exactly a page's worth: no empty page after it.
    page, cursor = await store.list_jobs("bob", limit=5)
    assert len(page) == 5 and cursor is None
    assert await store.list_jobs("nobody") == ([], None)


async def test_list_jobs_filters_by_state(store: Store) -> None:
    states = [PENDING, RUNNING, SUCCEEDED]
    jobs = [
        make_job("alice", f"job-{i:02d}", state=states[i % 3], created_at=T0 + timedelta(seconds=i // 2))
        for i in range(40)
    ]
    bobs = make_job("bob", "running", state=RUNNING, created_at=T0)
    for job in [*jobs, bobs]:
        await store.create_job(job)
    active = [j for j in jobs if j.state in (PENDING, RUNNING)]
    assert [j.id for j in await all_pages(store, "alice", 4, states=[PENDING, RUNNING])] == (
        newest_first(active)
    )
    running = [j for j in jobs if j.state == RUNNING] + [bobs]
    assert [j.id for j in await all_pages(store, None, 3, states={RUNNING})] == newest_first(running)
    assert await store.list_jobs("alice", states=[KILLED]) == ([], None)
    assert await store.list_jobs("alice", states=[]) == ([], None)


async def test_states_must_not_be_a_bare_string(store: Store) -> None:
    with pytest.raises(TypeError):
        await store.list_jobs("alice", states=RUNNING)
    with pytest.raises(TypeError):
        await store.transition_job("no-such-job", RUNNING, KILLED)


async def test_time_comparisons_keep_milliseconds(
    store: Store, request: pytest.FixtureRequest, emulated_mongo: bool
) -> None:
    expect_nx_deviation(request, emulated_mongo, NX_SECOND_PRECISION)
    jobs = [make_job(created_at=T0 + timedelta(milliseconds=i)) for i in range(7)]
    for job in jobs:
        await store.create_job(job)
    assert [j.id for j in await all_pages(store, "alice", limit=2)] == newest_first(jobs)
    await store.create_user(make_user("alice"))
    await store.add_token(Token("gone", "alice", expires_at=T0 + timedelta(milliseconds=1)))
    await store.add_token(Token("kept", "alice", expires_at=T0 + timedelta(milliseconds=3)))
    assert await store.purge_expired_tokens(T0 + timedelta(milliseconds=2)) == 1
    assert await store.get_token("kept") is not None


@pytest.mark.parametrize(
    "cursor",
    ["not a cursor!", "", "bm90IGpzb24", "WzEsMl0", "WyJ5ZXN0ZXJkYXkiLCJqIl0", "W10"],
    ids=["garbage", "empty", "not-json", "numbers", "not-a-time", "empty-list"],
)
async def test_bad_cursor_is_a_store_error(store: Store, cursor: str) -> None:
    await store.create_job(make_job())
    with pytest.raises(StoreError, match="cursor"):
        await store.list_jobs("alice", cursor=cursor)


async def test_transition_job_compare_and_set(store: Store) -> None:
    job = make_job()
    await store.create_job(job)
    moved = await store.transition_job(
        job.id, [PENDING, BUILDING], RUNNING, backend={"pid": 42}, reason="scheduled"
    )
    assert moved is not None
    # Times set by a change are checked in test_changes_set_times.
    assert moved == dataclasses.replace(
        job, state=RUNNING, backend={"pid": 42}, reason="scheduled", updated_at=moved.updated_at
    )
    assert await store.get_job_by_id(job.id) == moved

    # Not in an expected state any more: nothing changes.
    assert await store.transition_job(job.id, [PENDING], KILLED, reason="late") is None
    assert await store.get_job_by_id(job.id) == moved
    assert await store.transition_job(job.id, [], KILLED) is None
    assert await store.transition_job("no-such-job", [PENDING, RUNNING], KILLED) is None

    done = await store.transition_job(job.id, [RUNNING], SUCCEEDED, reason="exit 0")
    assert done is not None
    assert (done.state, done.reason, done.backend) == (SUCCEEDED, "exit 0", {"pid": 42})
    assert await store.get_job_by_id(job.id) == done


async def test_changes_set_times(store: Store, request: pytest.FixtureRequest, emulated_mongo: bool) -> None:
    expect_nx_deviation(request, emulated_mongo, NX_SET_DATE)
    job = make_job(created_at=T0, updated_at=T0)
    await store.create_job(job)
    started = utcnow()
    moved = await store.transition_job(job.id, [PENDING], RUNNING, started_at=started)
    assert moved is not None
    assert moved.started_at == started
    assert moved.created_at == T0
    # Every change sets updated_at; callers cannot.
    assert moved.updated_at > T0
    assert_utc(moved.started_at)
    assert_utc(moved.updated_at)
    assert await store.get_job_by_id(job.id) == moved

    finished = datetime(2026, 3, 1, 18, 0, 0, 1000, tzinfo=timezone(timedelta(hours=6)))
    updated = await store.update_job(job.id, finished_at=finished)
    assert updated is not None
    assert updated.finished_at == finished
    assert_utc(updated.finished_at)
    assert updated.updated_at >= moved.updated_at
    cleared = await store.update_job(job.id, finished_at=None)
    assert cleared is not None and cleared.finished_at is None

    build = make_build(updated_at=T0)
    await store.create_build(build)
    done = await store.transition_build(build.id, [PENDING], SUCCEEDED, finished_at=started)
    assert done is not None
    assert done.finished_at == started
    assert done.updated_at > T0
    assert_utc(done.updated_at)
    assert await store.get_build(build.id) == done


async def test_concurrent_transitions_only_one_wins(store: Store, backend: str) -> None:
    cannot_hold_on_ferretdb(backend, FERRET_NOT_ATOMIC)
    job = make_job()
    await store.create_job(job)
    targets = [RUNNING, KILLED, FAILED, BUILDING, SUCCEEDED, RUNNING, KILLED, FAILED]
    results = await asyncio.gather(
        *(
            store.transition_job(job.id, [PENDING], target, reason=f"writer-{i}")
            for i, target in enumerate(targets)
        )
    )
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    (winner,) = winners
    assert await store.get_job_by_id(job.id) == winner
    assert winner.state == targets[int(winner.reason.removeprefix("writer-"))]


async def test_transition_rejects_unknown_fields(store: Store) -> None:
    job = make_job()
    await store.create_job(job)
    for field in ["owner", "updated_at", "spec", "id", "info"]:
        with pytest.raises(ValueError, match=field):
            await store.transition_job(job.id, [PENDING], RUNNING, **{field: "x"})
        with pytest.raises(ValueError, match=field):
            await store.update_job(job.id, **{field: "x"})
    assert await store.get_job_by_id(job.id) == job


async def test_update_job(store: Store) -> None:
    job = make_job(state=RUNNING, build_id="b-1")
    await store.create_job(job)
    updated = await store.update_job(job.id, backend={"namespace": "pc-alice"}, reason="resized")
    assert updated is not None
    assert updated == dataclasses.replace(
        job, backend={"namespace": "pc-alice"}, reason="resized", updated_at=updated.updated_at
    )
    assert await store.get_job_by_id(job.id) == updated
    cleared = await store.update_job(job.id, build_id=None)
    assert cleared is not None and cleared.build_id is None and cleared.state == RUNNING
    assert await store.update_job("no-such-job", reason="x") is None


async def test_delete_job_removes_its_events(store: Store) -> None:
    job = make_job()
    keep = make_job(name="keep")
    await store.create_job(job)
    await store.create_job(keep)
    await store.add_event(JobEvent(job.id, utcnow(), "state", "created", state=PENDING))
    await store.add_event(JobEvent(keep.id, utcnow(), "state", "created", state=PENDING))
    assert await store.delete_job(job.id) is True
    assert await store.get_job_by_id(job.id) is None
    assert await store.get_job("alice", job.name) is None
    assert await store.list_events(job.id) == []
    assert await store.delete_job(job.id) is False
    assert len(await store.list_events(keep.id)) == 1
    # A new job under the same id and name starts with no history.
    await store.create_job(job)
    assert await store.list_events(job.id) == []


# Job events


async def test_events_come_back_in_insertion_order(store: Store) -> None:
    job = make_job()
    other = make_job(name="other")
    await store.create_job(job)
    await store.create_job(other)
    # One timestamp for all of them: only the insertion order can order them.
    when = utcnow()
    events = [
        JobEvent(
            job.id,
            when,
            "state" if i % 10 == 0 else "log_rotated",
            f"reason-{i}",
            message=f"message {i}",
            state=RUNNING if i % 10 == 0 else None,
        )
        for i in range(50)
    ]
    for i, event in enumerate(events):
        await store.add_event(event)
        if i % 7 == 0:
            await store.add_event(JobEvent(other.id, when, "noise", f"noise-{i}"))
    got = await store.list_events(job.id)
    assert got == events
    for event in got:
        assert_utc(event.time)
    assert await store.list_events("no-such-job") == []


async def test_event_for_an_unknown_job_is_refused(store: Store) -> None:
    with pytest.raises(StoreError):
        await store.add_event(JobEvent("no-such-job", utcnow(), "state", "created"))
    assert await store.list_events("no-such-job") == []


# Builds


async def test_build_round_trip(store: Store) -> None:
    build = make_build(info={"image": "registry/x:1", "layers": [1, 2]}, reason="queued")
    await store.create_build(build)
    got = await store.get_build(build.id)
    assert got == build
    assert got is not None
    assert_utc(got.created_at)
    assert await store.get_build("no-such-build") is None


async def test_build_id_is_unique(store: Store, request: pytest.FixtureRequest, emulated_mongo: bool) -> None:
    expect_nx_deviation(request, emulated_mongo, NX_ID_FIELD)
    build = make_build()
    await store.create_build(build)
    with pytest.raises(AlreadyExists):
        await store.create_build(make_build(key="other", id=build.id))


async def test_find_builds_by_key_and_state_newest_first(store: Store) -> None:
    builds = [
        make_build("k", state=SUCCEEDED, created_at=T0),
        make_build("k", state=RUNNING, created_at=T0 + timedelta(seconds=2)),
        make_build("k", state=SUCCEEDED, created_at=T0 + timedelta(seconds=3)),
        make_build("k", state=FAILED, created_at=T0 + timedelta(seconds=4)),
        make_build("other", state=SUCCEEDED, created_at=T0 + timedelta(seconds=5)),
    ]
    for build in builds:
        await store.create_build(build)
    found = await store.find_builds("k", [SUCCEEDED, RUNNING])
    assert found == [builds[2], builds[1], builds[0]]
    assert await store.find_builds("k", {FAILED}) == [builds[3]]
    assert await store.find_builds("k", []) == []
    assert await store.find_builds("missing", [SUCCEEDED]) == []


async def test_list_builds_by_state_across_keys_newest_first(store: Store) -> None:
    builds = [
        make_build("k", state=PENDING, created_at=T0),
        make_build("other", state=RUNNING, created_at=T0 + timedelta(seconds=1), owner="bob"),
        make_build("k", state=SUCCEEDED, created_at=T0 + timedelta(seconds=2)),
        make_build("third", state=PENDING, created_at=T0 + timedelta(seconds=3)),
        make_build("k", state=FAILED, created_at=T0 + timedelta(seconds=4)),
    ]
    for build in builds:
        await store.create_build(build)
    assert await store.list_builds([PENDING, RUNNING]) == [builds[3], builds[1], builds[0]]
    assert await store.list_builds({SUCCEEDED, FAILED}) == [builds[4], builds[2]]
    assert await store.list_builds([]) == []
    assert await store.list_builds([KILLED]) == []


async def test_transition_build_compare_and_set(store: Store) -> None:
    build = make_build()
    await store.create_build(build)
    running = await store.transition_build(build.id, [PENDING], RUNNING, reason="started")
    assert running is not None
    assert running == dataclasses.replace(
        build, state=RUNNING, reason="started", updated_at=running.updated_at
    )
    assert await store.transition_build(build.id, [PENDING], FAILED) is None
    assert await store.get_build(build.id) == running
    done = await store.transition_build(build.id, [RUNNING, PENDING], SUCCEEDED, info={"image": "x@sha256:1"})
    assert done is not None
    assert (done.state, done.info, done.reason) == (SUCCEEDED, {"image": "x@sha256:1"}, "started")
    assert await store.get_build(build.id) == done
    assert await store.transition_build("no-such-build", [RUNNING], FAILED) is None
    with pytest.raises(ValueError, match="backend"):
        await store.transition_build(build.id, [SUCCEEDED], FAILED, backend={})


async def test_concurrent_build_transitions_only_one_wins(store: Store, backend: str) -> None:
    cannot_hold_on_ferretdb(backend, FERRET_NOT_ATOMIC)
    build = make_build()
    await store.create_build(build)
    results = await asyncio.gather(
        *(store.transition_build(build.id, [PENDING], RUNNING, reason=str(i)) for i in range(6))
    )
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert await store.get_build(build.id) == winners[0]


# Leases


async def test_a_lease_has_one_holder_until_released_or_expired(store: Store) -> None:
    assert await store.acquire_lease("quota:alice", "replica-a", 30)
    assert not await store.acquire_lease("quota:alice", "replica-b", 30)
    assert await store.acquire_lease("quota:alice", "replica-a", 30)  # renewing one's own
    assert await store.acquire_lease("quota:bob", "replica-b", 30)  # another name is another lease
    await store.release_lease("quota:alice", "replica-b")  # not b's to give back: nothing happens
    assert not await store.acquire_lease("quota:alice", "replica-b", 30)
    await store.release_lease("quota:alice", "replica-a")
    assert await store.acquire_lease("quota:alice", "replica-b", 0.05)
    await asyncio.sleep(0.1)  # the lease's own expiry, not a wait for something to happen
    assert await store.acquire_lease("quota:alice", "replica-c", 30)  # b's expired


async def test_concurrent_lease_takers_only_one_wins(store: Store) -> None:
    results = await asyncio.gather(*(store.acquire_lease("race", f"holder-{i}", 30) for i in range(8)))
    assert results.count(True) == 1


async def test_revoking_every_token_of_a_user_leaves_others(store: Store) -> None:
    for name in ("gone", "stays"):
        await store.create_user(User(name, "!x"))
    later = datetime.now(UTC) + timedelta(hours=1)
    for i, user in enumerate(("gone", "gone", "stays")):
        await store.add_token(Token(f"hash-{i}", user, expires_at=later))
    assert await store.delete_tokens_of("gone") == 2
    assert await store.get_token("hash-0") is None and await store.get_token("hash-1") is None
    assert await store.get_token("hash-2") is not None


async def test_registries_are_per_owner_by_name_and_saving_again_replaces(store: Store) -> None:
    from paddlecloud.common.store import Registry

    first = Registry("alice", "myreg", "registry.example.com", "alice", "s3cret")
    await store.put_registry(first)
    await store.put_registry(Registry("alice", "another", "r.example.org:5000", "al", "pw2"))
    await store.put_registry(Registry("bob", "myreg", "bob.example.com", "bob", "bobs"))
    assert await store.get_registry("alice", "myreg") == first
    assert await store.get_registry("alice", "none") is None
    assert [r.name for r in await store.list_registries("alice")] == ["another", "myreg"]
    assert [r.server for r in await store.list_registries("bob")] == ["bob.example.com"]
    assert "s3cret" not in repr(first)

    replaced = Registry("alice", "myreg", "registry.example.com", "alice2", "new")
    await store.put_registry(replaced)
    assert await store.get_registry("alice", "myreg") == replaced
    assert len(await store.list_registries("alice")) == 2

    assert await store.delete_registry("alice", "myreg") is True
    assert await store.delete_registry("alice", "myreg") is False
    assert await store.get_registry("alice", "myreg") is None
    assert await store.get_registry("bob", "myreg") is not None


async def test_kept_logs_are_per_attempt_replaced_whole_and_go_with_their_job(store: Store) -> None:
    job, other = make_job(), make_job()
    await store.create_job(job)
    await store.create_job(other)
    await store.keep_log(KeptLog(job.id, "trainer-1", "b", "second attempt\n"))
    await store.keep_log(KeptLog(job.id, "trainer-1", "a", "first\n"))
    await store.keep_log(KeptLog(job.id, "pserver-0", "a", "ps\n" * 1000))
    await store.keep_log(KeptLog(job.id, "trainer-1", "a", "first, kept again longer\n"))
    await store.keep_log(KeptLog(other.id, "trainer-0", "a", "other job\n"))
    kept = await store.list_kept_logs(job.id)
    assert [(k.worker, k.attempt) for k in kept] == [
        ("pserver-0", "a"),
        ("trainer-1", "a"),
        ("trainer-1", "b"),
    ]
    assert kept[0].text == "ps\n" * 1000
    assert kept[1].text == "first, kept again longer\n"
    assert await store.delete_job(job.id)
    assert await store.list_kept_logs(job.id) == []
    assert [k.text for k in await store.list_kept_logs(other.id)] == ["other job\n"]


async def test_series_are_per_worker_replaced_whole_and_go_with_their_job(store: Store) -> None:
    job, other = make_job(), make_job()
    await store.create_job(job)
    await store.create_job(other)
    await store.keep_series(KeptSeries(job.id, "trainer-1", '{"t":[1]}'))
    await store.keep_series(KeptSeries(job.id, "pserver-0", '{"t":[]}'))
    await store.keep_series(KeptSeries(job.id, "trainer-1", '{"t":[1,2]}'))
    await store.keep_series(KeptSeries(other.id, "trainer-0", "other"))
    kept = await store.list_series(job.id)
    assert [(k.worker, k.text) for k in kept] == [("pserver-0", '{"t":[]}'), ("trainer-1", '{"t":[1,2]}')]
    assert await store.delete_job(job.id)
    assert await store.list_series(job.id) == []
    # A sampler's write after the job was removed leaves nothing behind.
    await store.keep_series(KeptSeries(job.id, "trainer-1", '{"t":[3]}'))
    assert await store.list_series(job.id) == []
    assert [k.text for k in await store.list_series(other.id)] == ["other"]
