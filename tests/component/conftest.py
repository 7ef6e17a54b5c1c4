"""Fixtures for component tests: each store on a fresh database, MongoDB on real wire servers."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest
from pymongo import AsyncMongoClient

from mongo_emulator import EmulatorError, FerretDB, Nx27017
from paddlecloud.common.store import Store, open_store

MONGODB_URI_ENV = "PADDLECLOUD_TEST_MONGODB_URI"


@dataclass(frozen=True)
class MongoServer:
    """Where the Mongo store's tests connect, and whether that is the nx-27017 emulator."""

    uri: str
    emulated: bool

    def database_uri(self, database: str) -> str:
        """`uri` with its path replaced by `database`, keeping the options."""
        parts = urlsplit(self.uri)
        query = dict(parse_qsl(parts.query))
        original = parts.path.strip("/")
        # A database in the URL is also where MongoDB authenticates unless authSource
        # says otherwise; keep authenticating there when the test database replaces it.
        if original and "authSource" not in query:
            query["authSource"] = original
        return urlunsplit((parts.scheme, parts.netloc, "/" + database, urlencode(query), ""))


@contextmanager
def _wire_server(kind: type[Nx27017 | FerretDB], data_dir: Path) -> Iterator[int]:
    """The port of a `kind` server on `data_dir`, stopped after; a test fails saying why it did not start."""
    try:
        server = kind(data_dir)
        port = server.wait_ready()
    except EmulatorError as exc:
        pytest.fail(str(exc))
    try:
        yield port
    finally:
        server.stop()


@pytest.fixture(scope="session")
def mongo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MongoServer]:
    """A real MongoDB from $PADDLECLOUD_TEST_MONGODB_URI, else nx-27017 for the session."""
    uri = os.environ.get(MONGODB_URI_ENV)
    if uri:
        yield MongoServer(uri, emulated=False)
        return
    with _wire_server(Nx27017, tmp_path_factory.mktemp("nx-27017")) as port:
        yield MongoServer(f"mongodb://127.0.0.1:{port}/", emulated=True)


@pytest.fixture(scope="session")
def ferretdb_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MongoServer]:
    """FerretDB v1 on its SQLite backend for the session: a second MongoDB wire server."""
    with _wire_server(FerretDB, tmp_path_factory.mktemp("ferretdb")) as port:
        yield MongoServer(f"mongodb://127.0.0.1:{port}/", emulated=False)


# "mongo" is MongoDB itself when $PADDLECLOUD_TEST_MONGODB_URI names one, else nx-27017;
# "ferretdb" is the same MongoStore on FerretDB (docs/storage.md).
@pytest.fixture(params=["sqlite", "mongo", "ferretdb"])
def backend(request: pytest.FixtureRequest) -> str:
    """Which store implementation (and, for MongoDB, which server) the test runs against."""
    return str(request.param)


@pytest.fixture
async def store(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """An open store on a database of its own, closed (and dropped, for MongoDB) after."""
    if backend == "sqlite":
        sqlite_store = open_store(f"sqlite:///{tmp_path}/store/paddlecloud.db")
        await sqlite_store.open()
        yield sqlite_store
        await sqlite_store.close()
        return
    # Looked up lazily so that running only the SQLite cases starts no server.
    fixture = "ferretdb_server" if backend == "ferretdb" else "mongo_server"
    server: MongoServer = request.getfixturevalue(fixture)
    database = f"paddlecloud_test_{uuid.uuid4().hex[:16]}"
    url = server.database_uri(database)
    mongo_store = open_store(url)
    await mongo_store.open()
    try:
        yield mongo_store
    finally:
        await mongo_store.close()
        admin: AsyncMongoClient[dict[str, object]] = AsyncMongoClient(url)
        try:
            await admin.drop_database(database)
        finally:
            await admin.close()


@pytest.fixture
def emulated_mongo(backend: str, request: pytest.FixtureRequest) -> bool:
    """True when this case runs on nx-27017 rather than on MongoDB itself."""
    if backend != "mongo":
        return False
    server: MongoServer = request.getfixturevalue("mongo_server")
    return server.emulated


@pytest.fixture
def pfs_settings() -> dict[str, Any]:
    """More `pfs` settings for the pfs suites' services: a module that runs them again on
    other storage (test_pfs_hdfs.py) overrides it."""
    return {}
