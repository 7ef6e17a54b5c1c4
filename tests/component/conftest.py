"""Fixtures for component tests: each store on a fresh database, MongoDB on a real wire server."""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest
from pymongo import AsyncMongoClient

from paddlecloud.common.store import Store, open_store

MONGODB_URI_ENV = "PADDLECLOUD_TEST_MONGODB_URI"
_LISTENING = re.compile(r"Listening on \S+:(\d+)")
# Generous: the first start imports neosqlite and may create its data directory.
_START_TIMEOUT = 30.0


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


class _Nx27017:
    """nx-27017 on a loopback port the kernel picks, with its databases in `data_dir`."""

    def __init__(self, data_dir: Path) -> None:
        binary = Path(sys.executable).with_name("nx-27017")
        if not binary.exists():
            pytest.fail(f"{binary} is missing: install the dev extras (pip install -e '.[dev]')")
        # --data-dir gives every logical database its own SQLite file, so the
        # per-test database names really isolate tests from one another.
        self._proc = subprocess.Popen(
            [
                str(binary),
                "--data-dir", str(data_dir),
                "--host", "127.0.0.1",
                "-p", "0",
                "--log-file", str(data_dir / "nx-27017.log"),
                "--pid-file", str(data_dir / "nx-27017.pid"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        self._lines: collections.deque[str] = collections.deque(maxlen=200)
        self._port: int | None = None
        self._ready = threading.Event()
        # The server logs every connection to stderr; the pipe must be drained for
        # the whole session or the server blocks once it fills.
        self._reader = threading.Thread(target=self._drain, name="nx-27017-stderr", daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._lines.append(line)
            match = _LISTENING.search(line)
            if match and self._port is None:
                self._port = int(match[1])
                self._ready.set()
        self._ready.set()  # the server exited; wait_ready reports why

    def wait_ready(self) -> int:
        """The port once the server has bound it (it logs the port after listen())."""
        self._ready.wait(_START_TIMEOUT)
        if self._port is None:
            self.stop()
            output = "".join(self._lines) or "(no output)"
            pytest.fail(f"nx-27017 did not start listening within {_START_TIMEOUT} s:\n{output}")
        return self._port

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout=10)
        if self._proc.stderr is not None:
            self._proc.stderr.close()


@pytest.fixture(scope="session")
def mongo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MongoServer]:
    """A real MongoDB from $PADDLECLOUD_TEST_MONGODB_URI, else nx-27017 for the session."""
    uri = os.environ.get(MONGODB_URI_ENV)
    if uri:
        yield MongoServer(uri, emulated=False)
        return
    server = _Nx27017(tmp_path_factory.mktemp("nx-27017"))
    try:
        port = server.wait_ready()
        yield MongoServer(f"mongodb://127.0.0.1:{port}/", emulated=True)
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "mongo"])
def backend(request: pytest.FixtureRequest) -> str:
    """Which store implementation the test runs against."""
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
    server: MongoServer = request.getfixturevalue("mongo_server")
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
