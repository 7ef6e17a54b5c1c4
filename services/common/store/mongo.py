"""The store on MongoDB through PyMongo's async API, for clusters and several replicas."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from pymongo import ASCENDING, DESCENDING, AsyncMongoClient, ReturnDocument
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import ConnectionFailure, DuplicateKeyError, PyMongoError

from .base import AlreadyExists, Store, StoreError
from .models import (
    BUILD_MUTABLE_FIELDS,
    JOB_MUTABLE_FIELDS,
    Build,
    Job,
    JobEvent,
    KeptLog,
    KeptSeries,
    Quota,
    Registry,
    Token,
    User,
    utcnow,
)

DEFAULT_DATABASE = "paddlecloud"
# PyMongo waits 30 s for a server by default; a missing MongoDB should fail a start-up
# or a /readyz probe in seconds, with the reason. A URL that sets these wins.
DEFAULT_TIMEOUTS_MS = {"serverSelectionTimeoutMS": 3000, "connectTimeoutMS": 3000}

Document = dict[str, Any]
# Records are looked up by their own keys; MongoDB's generated _id never leaves here.
_NO_ID = {"_id": False}
_NEWEST_FIRST = [("created_at", DESCENDING), ("id", DESCENDING)]
_TIME_FIELDS = frozenset({"started_at", "finished_at"})


class MongoStore(Store):
    """The store in one MongoDB database: the URL's path names it (default `paddlecloud`).

    Every compare-and-set is one `find_one_and_update`, which MongoDB applies atomically
    to the one document, so any number of service replicas can share the database.
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._client: AsyncMongoClient[Document] | None = None
        self._db: AsyncDatabase[Document] | None = None

    async def open(self) -> None:
        if self._client is None:
            try:
                given = {key.lower() for key, _ in parse_qsl(urlsplit(self._url).query)}
                options: dict[str, Any] = {
                    k: v for k, v in DEFAULT_TIMEOUTS_MS.items() if k.lower() not in given
                }
                # Constructing the client does no I/O; it connects on first use.
                client: AsyncMongoClient[Document] = AsyncMongoClient(
                    self._url, tz_aware=True, tzinfo=UTC, **options
                )
            except (PyMongoError, ValueError) as exc:
                raise StoreError(f"store.url: not a usable MongoDB URL: {exc}") from exc
            self._client = client
            try:
                self._db = client.get_default_database(DEFAULT_DATABASE)
            except PyMongoError as exc:
                await self.close()
                raise StoreError(f"store.url: not a usable database name: {exc}") from exc
        try:
            await self.ping()
            await self._create_indexes()
        except BaseException:
            await self.close()
            raise

    async def _create_indexes(self) -> None:
        db = self._database()
        # create_index is a no-op when the same index exists, so every start runs these.
        with _errors("indexes"):
            await db.users.create_index("name", unique=True)
            await db.tokens.create_index("token_hash", unique=True)
            await db.tokens.create_index("user")
            await db.tokens.create_index("expires_at")
            await db.jobs.create_index("id", unique=True)
            await db.jobs.create_index([("owner", ASCENDING), ("name", ASCENDING)], unique=True)
            await db.jobs.create_index([("owner", ASCENDING), *_NEWEST_FIRST])
            await db.jobs.create_index(_NEWEST_FIRST)
            # For the reconcilers, which list every owner's jobs in a few active states.
            await db.jobs.create_index([("state", ASCENDING), *_NEWEST_FIRST])
            # A user's active jobs (get jobs, the quota check) without reading their history.
            await db.jobs.create_index([("owner", ASCENDING), ("state", ASCENDING), *_NEWEST_FIRST])
            await db.job_events.create_index([("job_id", ASCENDING), ("seq", ASCENDING)])
            await db.leases.create_index("name", unique=True)
            await db.registries.create_index([("owner", ASCENDING), ("name", ASCENDING)], unique=True)
            await db.kept_logs.create_index(
                [("job_id", ASCENDING), ("worker", ASCENDING), ("attempt", ASCENDING)], unique=True
            )
            await db.job_series.create_index([("job_id", ASCENDING), ("worker", ASCENDING)], unique=True)
            await db.builds.create_index("id", unique=True)
            await db.builds.create_index([("key", ASCENDING), *_NEWEST_FIRST])
            await db.builds.create_index([("state", ASCENDING), *_NEWEST_FIRST])

    async def close(self) -> None:
        client, self._client, self._db = self._client, None, None
        if client is not None:
            await client.close()

    async def ping(self) -> None:
        with _errors():
            await self._database().command("ping")

    def _database(self) -> AsyncDatabase[Document]:
        if self._db is None:
            raise StoreError("mongodb: the store is not open (await open() first)")
        return self._db

    def _collection(self, name: str) -> AsyncCollection[Document]:
        return self._database()[name]

    async def _set_one(self, collection: str, query: Document, changes: Document) -> Document | None:
        """`$set` the changes on the one document matching `query`, atomically; it after, or None."""
        with _errors():
            # No projection: FerretDB v1 refuses findAndModify's `fields` (NotImplemented),
            # so _id is dropped here instead (docs/storage.md).
            doc = await self._collection(collection).find_one_and_update(
                query, {"$set": changes}, return_document=ReturnDocument.AFTER
            )
        if doc is not None:
            doc.pop("_id", None)
        return doc

    # Users

    async def create_user(self, user: User) -> None:
        doc = {
            "name": user.name,
            "password_hash": user.password_hash,
            "admin": user.admin,
            "quota": dataclasses.asdict(user.quota),
            "created_at": _aware(user.created_at),
        }
        with _errors(f"user {user.name!r}"):
            await self._collection("users").insert_one(doc)

    async def get_user(self, name: str) -> User | None:
        with _errors():
            doc = await self._collection("users").find_one({"name": name}, _NO_ID)
        return _user(doc) if doc else None

    async def list_users(self) -> list[User]:
        with _errors():
            docs = await self._collection("users").find({}, _NO_ID).sort("name").to_list()
        return [_user(doc) for doc in docs]

    async def count_users(self) -> int:
        with _errors():
            return await self._collection("users").count_documents({})

    async def update_user(
        self,
        name: str,
        *,
        password_hash: str | None = None,
        admin: bool | None = None,
        quota: Quota | None = None,
    ) -> User | None:
        changes: Document = {}
        if password_hash is not None:
            changes["password_hash"] = password_hash
        if admin is not None:
            changes["admin"] = admin
        if quota is not None:
            changes["quota"] = dataclasses.asdict(quota)
        if not changes:
            return await self.get_user(name)
        doc = await self._set_one("users", {"name": name}, changes)
        return _user(doc) if doc else None

    async def delete_user(self, name: str) -> bool:
        with _errors():
            result = await self._collection("users").delete_one({"name": name})
            # Always, not only when the user was there: a retry after a crash between
            # the two deletes still clears the tokens.
            await self._collection("tokens").delete_many({"user": name})
        return result.deleted_count > 0

    # Tokens

    async def add_token(self, token: Token) -> None:
        doc = {
            "token_hash": token.token_hash,
            "user": token.user,
            "expires_at": _aware(token.expires_at),
            "created_at": _aware(token.created_at),
        }
        with _errors(f"token for user {token.user!r}"):
            # MongoDB has no foreign keys; this keeps the SQLite store's refusal. A user
            # deleted between the check and the insert leaves a token whose user is gone,
            # which authentication refuses anyway.
            if await self._collection("users").find_one({"name": token.user}, {"_id": 1}) is None:
                raise StoreError(f"token for user {token.user!r}: there is no such user")
            await self._collection("tokens").insert_one(doc)

    async def get_token(self, token_hash: str) -> Token | None:
        with _errors():
            doc = await self._collection("tokens").find_one({"token_hash": token_hash}, _NO_ID)
        return _token(doc) if doc else None

    async def delete_tokens_of(self, user: str) -> int:
        with _errors(f"tokens of {user}"):
            result = await self._collection("tokens").delete_many({"user": user})
        return int(result.deleted_count)

    async def delete_token(self, token_hash: str) -> bool:
        with _errors():
            result = await self._collection("tokens").delete_one({"token_hash": token_hash})
        return result.deleted_count > 0

    async def purge_expired_tokens(self, now: datetime) -> int:
        with _errors():
            result = await self._collection("tokens").delete_many({"expires_at": {"$lt": _aware(now)}})
        return result.deleted_count

    # Jobs

    async def create_job(self, job: Job) -> None:
        doc = {
            "id": job.id,
            "owner": job.owner,
            "name": job.name,
            "state": job.state,
            "spec": job.spec,
            "created_at": _aware(job.created_at),
            "updated_at": _aware(job.updated_at),
            "started_at": _aware_or_none(job.started_at),
            "finished_at": _aware_or_none(job.finished_at),
            "reason": job.reason,
            "backend": job.backend,
            "build_id": job.build_id,
        }
        with _errors(f"job {job.owner}/{job.name} (id {job.id})"):
            await self._collection("jobs").insert_one(doc)

    async def get_job(self, owner: str, name: str) -> Job | None:
        with _errors():
            doc = await self._collection("jobs").find_one({"owner": owner, "name": name}, _NO_ID)
        return _job(doc) if doc else None

    async def get_job_by_id(self, job_id: str) -> Job | None:
        with _errors():
            doc = await self._collection("jobs").find_one({"id": job_id}, _NO_ID)
        return _job(doc) if doc else None

    async def list_jobs(
        self,
        owner: str | None,
        *,
        states: Collection[str] | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> tuple[list[Job], str | None]:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        clauses: list[Document] = []
        if owner is not None:
            clauses.append({"owner": owner})
        if states is not None:
            wanted = _state_list(states)
            if not wanted:
                return [], None
            clauses.append({"state": {"$in": wanted}})
        if cursor is not None:
            after_time, after_id = _decode_cursor(cursor)
            # Strictly after the last row in (created_at, id) order; the id breaks ties
            # between jobs created in the same millisecond.
            clauses.append(
                {
                    "$or": [
                        {"created_at": {"$lt": after_time}},
                        {"created_at": after_time, "id": {"$lt": after_id}},
                    ]
                }
            )
        # Clauses with distinct keys are merged into one flat filter (MongoDB plans both
        # forms alike; the nx-27017 wire server scans the whole collection for `$and` but
        # uses its indexes for the flat form, 5-11x faster at 10k jobs). There is at most
        # one `$or`, so no two clauses share a key.
        query: Document = {}
        for clause in clauses:
            query.update(clause)
        with _errors():
            # One document more than asked tells whether there is a next page.
            docs = (
                await self._collection("jobs")
                .find(query, _NO_ID)
                .sort(_NEWEST_FIRST)
                .limit(limit + 1)
                .to_list()
            )
        page = docs[:limit]
        next_cursor = None
        if len(docs) > limit:
            next_cursor = _encode_cursor(page[-1]["created_at"], page[-1]["id"])
        return [_job(doc) for doc in page], next_cursor

    async def transition_job(
        self, job_id: str, expected: Collection[str], state: str, **fields: Any
    ) -> Job | None:
        changes = _changes(fields, JOB_MUTABLE_FIELDS, "job")
        wanted = _state_list(expected)
        if not wanted:
            return None
        changes["state"] = state
        changes["updated_at"] = utcnow()
        doc = await self._set_one("jobs", {"id": job_id, "state": {"$in": wanted}}, changes)
        return _job(doc) if doc else None

    async def update_job(self, job_id: str, **fields: Any) -> Job | None:
        changes = _changes(fields, JOB_MUTABLE_FIELDS, "job")
        changes["updated_at"] = utcnow()
        doc = await self._set_one("jobs", {"id": job_id}, changes)
        return _job(doc) if doc else None

    async def acquire_lease(self, name: str, holder: str, seconds: float) -> bool:
        now = time.time()
        leases = self._collection("leases")
        with _errors(f"lease {name}"):
            try:
                await leases.insert_one({"name": name, "holder": holder, "expires_at": now + seconds})
                return True
            except DuplicateKeyError:
                pass
            # Two conditional updates rather than one $or (which not every server speaks):
            # renew our own, or take over an expired one; each is atomic on its document.
            for condition in ({"holder": holder}, {"expires_at": {"$lt": now}}):
                taken = await leases.find_one_and_update(
                    {"name": name, **condition}, {"$set": {"holder": holder, "expires_at": now + seconds}}
                )
                if taken is not None:
                    return True
        return False

    async def put_registry(self, registry: Registry) -> None:
        doc = {
            "owner": registry.owner,
            "name": registry.name,
            "server": registry.server,
            "username": registry.username,
            "password": registry.password,
            "created_at": registry.created_at,
        }
        with _errors(f"registry {registry.name}"):
            await self._collection("registries").replace_one(
                {"owner": registry.owner, "name": registry.name}, doc, upsert=True
            )

    async def get_registry(self, owner: str, name: str) -> Registry | None:
        with _errors():
            doc = await self._collection("registries").find_one({"owner": owner, "name": name})
        return _registry(doc) if doc else None

    async def list_registries(self, owner: str) -> list[Registry]:
        with _errors():
            cursor = self._collection("registries").find({"owner": owner}).sort("name", ASCENDING)
            return [_registry(doc) async for doc in cursor]

    async def delete_registry(self, owner: str, name: str) -> bool:
        with _errors():
            result = await self._collection("registries").delete_one({"owner": owner, "name": name})
        return result.deleted_count > 0

    async def release_lease(self, name: str, holder: str) -> None:
        with _errors(f"lease {name}"):
            await self._collection("leases").delete_one({"name": name, "holder": holder})

    async def keep_log(self, log: KeptLog) -> None:
        key = {"job_id": log.job_id, "worker": log.worker, "attempt": log.attempt}
        with _errors(f"log of {log.worker}"):
            await self._collection("kept_logs").replace_one(key, {**key, "text": log.text}, upsert=True)

    async def list_kept_logs(self, job_id: str) -> list[KeptLog]:
        with _errors():
            cursor = (
                self._collection("kept_logs")
                .find({"job_id": job_id})
                .sort([("worker", ASCENDING), ("attempt", ASCENDING)])
            )
            return [KeptLog(d["job_id"], d["worker"], d["attempt"], d["text"]) async for d in cursor]

    async def keep_series(self, series: KeptSeries) -> None:
        key = {"job_id": series.job_id, "worker": series.worker}
        with _errors(f"series of {series.worker}"):
            if await self._collection("jobs").count_documents({"id": series.job_id}, limit=1) == 0:
                return
            await self._collection("job_series").replace_one(key, {**key, "text": series.text}, upsert=True)
            # A delete_job between the check and the write: take back what it missed.
            if await self._collection("jobs").count_documents({"id": series.job_id}, limit=1) == 0:
                await self._collection("job_series").delete_many({"job_id": series.job_id})

    async def list_series(self, job_id: str) -> list[KeptSeries]:
        with _errors():
            cursor = self._collection("job_series").find({"job_id": job_id}).sort("worker", ASCENDING)
            return [KeptSeries(d["job_id"], d["worker"], d["text"]) async for d in cursor]

    async def delete_job(self, job_id: str) -> bool:
        with _errors():
            # The job first: add_event needs the job, so only an event that got its
            # number before this delete can still land after the delete_many. Events go
            # even when the job was not there, so a retry after a crash cleans up.
            result = await self._collection("jobs").delete_one({"id": job_id})
            await self._collection("job_events").delete_many({"job_id": job_id})
            await self._collection("kept_logs").delete_many({"job_id": job_id})
            await self._collection("job_series").delete_many({"job_id": job_id})
        return result.deleted_count > 0

    # Job events

    async def add_event(self, event: JobEvent) -> None:
        with _errors(f"event for job {event.job_id}"):
            # The job document counts its own events: one atomic $inc both hands out
            # the next sequence number (insertion order, whichever replica adds it) and
            # checks that the job exists, like the SQLite store's foreign key.
            job = await self._collection("jobs").find_one_and_update(
                {"id": event.job_id},
                {"$inc": {"event_seq": 1}},
                # The whole job comes back: FerretDB v1 refuses a projection here (_set_one).
                return_document=ReturnDocument.AFTER,
            )
            if job is None:
                raise StoreError(f"event for job {event.job_id}: there is no such job")
            await self._collection("job_events").insert_one(
                {
                    "job_id": event.job_id,
                    "seq": job["event_seq"],
                    "time": _aware(event.time),
                    "type": event.type,
                    "reason": event.reason,
                    "message": event.message,
                    "state": event.state,
                }
            )

    async def list_events(self, job_id: str) -> list[JobEvent]:
        with _errors():
            docs = (
                await self._collection("job_events")
                .find({"job_id": job_id}, _NO_ID)
                .sort("seq", ASCENDING)
                .to_list()
            )
        return [_event(doc) for doc in docs]

    # Builds

    async def create_build(self, build: Build) -> None:
        doc = {
            "id": build.id,
            "key": build.key,
            "owner": build.owner,
            "state": build.state,
            "spec": build.spec,
            "created_at": _aware(build.created_at),
            "updated_at": _aware(build.updated_at),
            "finished_at": _aware_or_none(build.finished_at),
            "reason": build.reason,
            "info": build.info,
        }
        with _errors(f"build {build.id}"):
            await self._collection("builds").insert_one(doc)

    async def get_build(self, build_id: str) -> Build | None:
        with _errors():
            doc = await self._collection("builds").find_one({"id": build_id}, _NO_ID)
        return _build(doc) if doc else None

    async def find_builds(self, key: str, states: Collection[str]) -> list[Build]:
        wanted = _state_list(states)
        if not wanted:
            return []
        with _errors():
            docs = (
                await self._collection("builds")
                .find({"key": key, "state": {"$in": wanted}}, _NO_ID)
                .sort(_NEWEST_FIRST)
                .to_list()
            )
        return [_build(doc) for doc in docs]

    async def list_builds(self, states: Collection[str]) -> list[Build]:
        wanted = _state_list(states)
        if not wanted:
            return []
        with _errors():
            docs = (
                await self._collection("builds")
                .find({"state": {"$in": wanted}}, _NO_ID)
                .sort(_NEWEST_FIRST)
                .to_list()
            )
        return [_build(doc) for doc in docs]

    async def transition_build(
        self, build_id: str, expected: Collection[str], state: str, **fields: Any
    ) -> Build | None:
        changes = _changes(fields, BUILD_MUTABLE_FIELDS, "build")
        wanted = _state_list(expected)
        if not wanted:
            return None
        changes["state"] = state
        changes["updated_at"] = utcnow()
        doc = await self._set_one("builds", {"id": build_id, "state": {"$in": wanted}}, changes)
        return _build(doc) if doc else None


@contextmanager
def _errors(what: str = "") -> Iterator[None]:
    """Turn PyMongo's exceptions into the store's."""
    try:
        yield
    except DuplicateKeyError as exc:
        raise AlreadyExists(f"{what or 'record'} already exists") from exc
    except ConnectionFailure as exc:
        raise StoreError(f"cannot reach MongoDB: {exc}") from exc
    except PyMongoError as exc:
        raise StoreError(f"mongodb: {what}: {exc}" if what else f"mongodb: {exc}") from exc


def _state_list(states: Collection[str]) -> list[str]:
    # A bare string is a Collection[str] too, and would silently mean its letters.
    if isinstance(states, str):
        raise TypeError(f"states must be a collection of states, not the string {states!r}")
    return list(states)


def _changes(fields: Mapping[str, Any], allowed: frozenset[str], kind: str) -> Document:
    """The $set document for `fields`; ValueError for any field not in `allowed`."""
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise ValueError(f"{kind} fields {unknown} cannot be changed (only {sorted(allowed)})")
    return {
        field: _aware_or_none(value) if field in _TIME_FIELDS else value for field, value in fields.items()
    }


def _aware(value: datetime) -> datetime:
    # PyMongo would take a naive datetime as UTC; refuse it, as the SQLite store does,
    # so a local time cannot be stored hours off without anyone noticing.
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"naive datetime {value!r}: the store keeps timezone-aware times only")
    return value


def _aware_or_none(value: datetime | None) -> datetime | None:
    return None if value is None else _aware(value)


def _encode_cursor(created_at: datetime, job_id: str) -> str:
    stamp = created_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    raw = json.dumps([stamp, job_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The (created_at, id) a cursor points after; StoreError if it is not one of ours."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        stamp, job_id = json.loads(raw)
        if not isinstance(stamp, str) or not isinstance(job_id, str):
            raise ValueError("not two strings")
        created_at = datetime.fromisoformat(stamp)
        if created_at.tzinfo is None:
            raise ValueError("no timezone")
        return created_at.astimezone(UTC), job_id
    except (binascii.Error, UnicodeDecodeError, ValueError, TypeError) as exc:
        raise StoreError(f"invalid cursor {cursor[:40]!r}: pass back the one a page returned") from exc


def _user(doc: Document) -> User:
    known = {field.name for field in dataclasses.fields(Quota)}
    return User(
        name=doc["name"],
        password_hash=doc["password_hash"],
        admin=bool(doc["admin"]),
        # Keys a newer version added are dropped rather than refused.
        quota=Quota(**{k: v for k, v in (doc.get("quota") or {}).items() if k in known}),
        created_at=doc["created_at"],
    )


def _token(doc: Document) -> Token:
    return Token(
        token_hash=doc["token_hash"],
        user=doc["user"],
        expires_at=doc["expires_at"],
        created_at=doc["created_at"],
    )


def _job(doc: Document) -> Job:
    return Job(
        id=doc["id"],
        owner=doc["owner"],
        name=doc["name"],
        state=doc["state"],
        spec=doc["spec"],
        created_at=doc["created_at"],
        updated_at=doc["updated_at"],
        started_at=doc.get("started_at"),
        finished_at=doc.get("finished_at"),
        reason=doc.get("reason", ""),
        backend=doc.get("backend") or {},
        build_id=doc.get("build_id"),
    )


def _event(doc: Document) -> JobEvent:
    return JobEvent(
        job_id=doc["job_id"],
        time=doc["time"],
        type=doc["type"],
        reason=doc["reason"],
        message=doc.get("message", ""),
        state=doc.get("state"),
    )


def _build(doc: Document) -> Build:
    return Build(
        id=doc["id"],
        key=doc["key"],
        owner=doc["owner"],
        state=doc["state"],
        spec=doc["spec"],
        created_at=doc["created_at"],
        updated_at=doc["updated_at"],
        finished_at=doc.get("finished_at"),
        reason=doc.get("reason", ""),
        info=doc.get("info") or {},
    )


def _registry(doc: Document) -> Registry:
    return Registry(
        owner=doc["owner"],
        name=doc["name"],
        server=doc["server"],
        username=doc["username"],
        password=doc["password"],
        created_at=_aware(doc["created_at"]),
    )
