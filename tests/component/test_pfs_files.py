"""PFS's file endpoints through the real gateway onto a real filesystem: every call, every refusal."""

from __future__ import annotations

import asyncio
import base64
import errno
import hashlib
import json
import os
import secrets
from dataclasses import dataclass
from datetime import timedelta
from email.utils import formatdate
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from paddlecloud.common.keys import STORE
from paddlecloud.common.store import Token, User
from paddlecloud.common.store.models import Quota, utcnow
from paddlecloud.common.volume import PfsPath
from paddlecloud.gateway.accounts import hash_token
from paddlecloud.gateway.app import create_app as create_gateway
from paddlecloud.pfs.api import STORAGE_ADVISORY
from paddlecloud.pfs.app import create_app as create_pfs
from paddlecloud.pfs.listing import make_cursor
from support import make_config

PROBLEM = "application/problem+json"
API = "/api/v1/pfs"
HOME = "/pfs/dc1/home"
PUBLIC = "/pfs/dc1/public"
GIB = 2**30
# A fixed mtime, so expected entries are written down rather than recomputed.
MTIME_NS = 1_700_000_000_123_456_789
MTIME_ISO = "2023-11-14T22:13:20.123456+00:00"


@dataclass
class Pfs:
    """The gateway in front of a real pfs service, with tokens for admin, alice and bob."""

    client: TestClient[Any, Any]
    root: Path
    headers: dict[str, dict[str, str]]

    def home(self, user: str) -> Path:
        return self.root / "home" / user

    async def call(self, method: str, endpoint: str, who: str = "alice", **kwargs: Any) -> ClientResponse:
        headers = {**self.headers[who], **kwargs.pop("headers", {})}
        return await self.client.request(method, f"{API}/{endpoint}", headers=headers, **kwargs)

    async def get(self, endpoint: str, who: str = "alice", **params: str) -> ClientResponse:
        return await self.call("GET", endpoint, who, params=params)

    async def ok_json(self, endpoint: str, who: str = "alice", **params: str) -> Any:
        resp = await self.get(endpoint, who, **params)
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def start_pfs(
    tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any, settings: dict[str, Any] | None = None
) -> Pfs:
    """A pfs service for datacenter dc1 behind a gateway; users and tokens go straight into the store."""
    sections: dict[str, dict[str, Any]] = {"pfs": {"datacenter": "dc1", **(settings or {})}}
    server = await aiohttp_server(create_pfs(make_config(tmp_path, **sections)))
    # No admin password: the bootstrap's argon2 hash would cost every test a fraction of a second.
    config = make_config(
        tmp_path, **sections, gateway={"pfs_url": str(server.make_url("")), "admin_password": None}
    )
    client = await aiohttp_client(create_gateway(config))
    store = client.app[STORE]
    headers = {}
    for name, admin, quota in (("admin", True, None), ("alice", False, 10_000), ("bob", False, None)):
        await store.create_user(User(name, "!unused", admin=admin, quota=Quota(storage_bytes=quota)))
        token = f"pc_{secrets.token_urlsafe(32)}"
        await store.add_token(Token(hash_token(token), name, expires_at=utcnow() + timedelta(hours=1)))
        headers[name] = {"Authorization": f"Bearer {token}"}
    return Pfs(client, tmp_path / "pfs", headers)


@pytest.fixture
async def pfs(tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any, pfs_settings: dict[str, Any]) -> Pfs:
    return await start_pfs(tmp_path, aiohttp_server, aiohttp_client, pfs_settings)


async def problem(resp: ClientResponse, status: int, code: str | None = None) -> dict[str, Any]:
    text = await resp.text()
    assert resp.status == status, text
    assert resp.content_type == PROBLEM, text
    body: dict[str, Any] = json.loads(text)
    assert body["status"] == status and body["detail"]
    if code is not None:
        assert body["code"] == code, body
    assert "Traceback" not in text
    return body


def write(path: Path, data: bytes = b"", mtime_ns: int | None = MTIME_NS) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


def etag_of(path: Path) -> str:
    st = os.stat(path)
    return f'"{st.st_size:x}-{st.st_mtime_ns:x}-{st.st_ino:x}"'


def snapshot(top: Path) -> dict[str, tuple[str, int, int, bytes | str]]:
    """Everything beneath `top` without following symlinks: kind, size, mtime, content or target."""
    seen: dict[str, tuple[str, int, int, bytes | str]] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = path.lstat()
            if path.is_symlink():
                seen[str(path)] = ("link", st.st_size, st.st_mtime_ns, os.readlink(path))
            elif path.is_file():
                seen[str(path)] = ("file", st.st_size, st.st_mtime_ns, path.read_bytes())
            else:
                seen[str(path)] = ("dir", 0, st.st_mtime_ns, "")
    return seen


# Downloads ------------------------------------------------------------------------

CONTENT = b"0123456789abcdefghij"


@dataclass
class Sending:
    """How pfs sends a download in this test, and what each `loop.sendfile` call sent."""

    native: bool
    sent: list[int]

    def expect(self, *counts: int) -> None:
        assert self.sent == (list(counts) if self.native else [])


@pytest.fixture(params=["sendfile", "pread"])
async def sending(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Sending:
    """Downloads both ways pfs sends them: with `loop.sendfile` (asyncio's loop, which the pfs
    service runs on) and with pread and writes (a loop without sendfile, as uvloop)."""
    loop = asyncio.get_running_loop()
    how = Sending(native=request.param == "sendfile", sent=[])
    sendfile = loop.sendfile

    async def counted(*args: Any, **kwargs: Any) -> int:
        if not how.native:
            raise NotImplementedError  # what uvloop's loop does
        how.sent.append(await sendfile(*args, **kwargs))
        return how.sent[-1]

    monkeypatch.setattr(loop, "sendfile", counted)
    return how


async def test_download_a_file_with_its_validators(pfs: Pfs, sending: Sending) -> None:
    path = write(pfs.home("alice") / "data" / "f.bin", CONTENT)
    resp = await pfs.get("files", path=f"{HOME}/alice/data/f.bin")
    assert resp.status == 200
    assert await resp.read() == CONTENT
    sending.expect(len(CONTENT))
    assert resp.headers["Content-Length"] == str(len(CONTENT))
    assert resp.headers["ETag"] == etag_of(path)
    assert resp.headers["Last-Modified"] == formatdate(MTIME_NS // 10**9, usegmt=True)
    assert resp.headers["Accept-Ranges"] == "bytes"
    assert resp.content_type == "application/octet-stream"
    assert resp.headers["Content-Disposition"] == "attachment; filename*=UTF-8''f.bin"
    assert resp.headers["X-Content-Type-Options"] == "nosniff"


async def test_head_has_the_headers_and_no_body(pfs: Pfs) -> None:
    path = write(pfs.home("alice") / "f.bin", CONTENT)
    resp = await pfs.call("HEAD", "files", params={"path": f"{HOME}/alice/f.bin"})
    assert resp.status == 200
    assert resp.headers["Content-Length"] == str(len(CONTENT))
    assert resp.headers["ETag"] == etag_of(path)
    assert await resp.read() == b""


# Cases are loops rather than parameters: each test starts a gateway, whose startup
# costs an argon2 hash, and the suite should stay fast.
RANGES = [
    ("bytes=2-5", 2, 5),
    ("bytes=15-", 15, 19),
    ("bytes=-3", 17, 19),
    ("bytes=10-999", 10, 19),
    ("bytes=-100", 0, 19),
    ("bytes=0-0", 0, 0),
    ("BYTES = 19-19", 19, 19),
]


async def test_one_range_is_206(pfs: Pfs, sending: Sending) -> None:
    write(pfs.home("alice") / "f.bin", CONTENT)
    for header, first, last in RANGES:
        for method in ("GET", "HEAD"):
            resp = await pfs.call(
                method, "files", params={"path": f"{HOME}/alice/f.bin"}, headers={"Range": header}
            )
            assert resp.status == 206, (header, await resp.text())
            assert await resp.read() == (CONTENT[first : last + 1] if method == "GET" else b"")
            assert resp.headers["Content-Range"] == f"bytes {first}-{last}/{len(CONTENT)}"
            assert resp.headers["Content-Length"] == str(last - first + 1)
    sending.expect(*(last - first + 1 for _, first, last in RANGES))


async def test_unsatisfiable_or_invalid_ranges_are_416(pfs: Pfs) -> None:
    write(pfs.home("alice") / "f.bin", CONTENT)
    bad = [
        "bytes=20-",
        "bytes=25-30",
        "bytes=5-2",
        "bytes=-0",
        "bytes=0-1,4-5",
        "bytes=x-y",
        "bytes=" + "1" * 30,
    ]
    for header in bad:
        resp = await pfs.call(
            "GET", "files", params={"path": f"{HOME}/alice/f.bin"}, headers={"Range": header}
        )
        await problem(resp, 416, "ERR_RANGE_NOT_SATISFIABLE")
        assert resp.headers["Content-Range"] == f"bytes */{len(CONTENT)}", header


async def test_an_unknown_range_unit_is_ignored(pfs: Pfs) -> None:
    write(pfs.home("alice") / "f.bin", CONTENT)
    resp = await pfs.call(
        "GET", "files", params={"path": f"{HOME}/alice/f.bin"}, headers={"Range": "lines=1-2"}
    )
    assert resp.status == 200
    assert await resp.read() == CONTENT


async def test_if_range_applies_the_range_only_to_the_same_version(pfs: Pfs) -> None:
    path = write(pfs.home("alice") / "f.bin", CONTENT)
    params = {"path": f"{HOME}/alice/f.bin"}
    date = formatdate(MTIME_NS // 10**9, usegmt=True)
    for validator in (etag_of(path), date):
        resp = await pfs.call(
            "GET", "files", params=params, headers={"Range": "bytes=0-3", "If-Range": validator}
        )
        assert resp.status == 206, validator
        assert await resp.read() == CONTENT[:4]
    stale = ('"14-0-0"', f"W/{etag_of(path)}", "Mon, 01 Jan 2001 00:00:00 GMT", "not a date")
    for validator in stale:
        resp = await pfs.call(
            "GET", "files", params=params, headers={"Range": "bytes=0-3", "If-Range": validator}
        )
        assert resp.status == 200, validator
        assert await resp.read() == CONTENT


async def test_if_none_match_and_if_modified_since_give_304(pfs: Pfs) -> None:
    path = write(pfs.home("alice") / "f.bin", CONTENT)
    params = {"path": f"{HOME}/alice/f.bin"}
    etag = etag_of(path)
    matching = [
        {"If-None-Match": etag},
        {"If-None-Match": f'"other", W/{etag}'},
        {"If-None-Match": "*"},
        {"If-Modified-Since": formatdate(MTIME_NS // 10**9, usegmt=True)},
    ]
    for headers in matching:
        for method in ("GET", "HEAD"):
            resp = await pfs.call(method, "files", params=params, headers=headers)
            assert resp.status == 304, headers
            assert resp.headers["ETag"] == etag
            assert await resp.read() == b""
    changed = [
        {"If-None-Match": '"something-else"'},
        # If-None-Match wins over If-Modified-Since (RFC 9110 §13.2.2).
        {"If-None-Match": '"something-else"', "If-Modified-Since": formatdate(usegmt=True)},
        {"If-Modified-Since": "Mon, 01 Jan 2001 00:00:00 GMT"},
    ]
    for headers in changed:
        resp = await pfs.call("GET", "files", params=params, headers=headers)
        assert resp.status == 200, headers
        assert await resp.read() == CONTENT
    # After a change the old tag no longer matches.
    write(path, CONTENT + b"!", MTIME_NS + 1)
    resp = await pfs.call("GET", "files", params=params, headers={"If-None-Match": etag})
    assert resp.status == 200
    assert await resp.read() == CONTENT + b"!"


async def test_empty_file(pfs: Pfs) -> None:
    write(pfs.home("alice") / "empty", b"")
    params = {"path": f"{HOME}/alice/empty"}
    resp = await pfs.call("GET", "files", params=params)
    assert resp.status == 200
    assert resp.headers["Content-Length"] == "0"
    assert resp.headers["ETag"].startswith('"0-')
    assert await resp.read() == b""
    await problem(await pfs.call("GET", "files", params=params, headers={"Range": "bytes=0-"}), 416)
    # "The last 5 bytes" of nothing is the whole of nothing.
    resp = await pfs.call("GET", "files", params=params, headers={"Range": "bytes=-5"})
    assert resp.status == 200
    assert await resp.read() == b""


async def test_a_file_cut_short_while_it_is_sent_cuts_the_download(pfs: Pfs, sending: Sending) -> None:
    """The length is promised in the headers: a body that ends early must look broken, never complete."""
    path = pfs.home("alice") / "shrinks.bin"
    path.parent.mkdir(parents=True)
    size = 256 * 2**20  # far more than the sockets and the gateway buffer between
    with open(path, "wb") as f:
        os.truncate(f.fileno(), size)  # sparse: quick to send, nothing on disk
    resp = await pfs.get("files", path=f"{HOME}/alice/shrinks.bin")
    assert resp.status == 200
    assert resp.headers["Content-Length"] == str(size)
    received = len(await resp.content.readexactly(2**16))
    os.truncate(path, 2**20)
    # Left open, the connection would wait for the promised rest until a read timeout.
    async with asyncio.timeout(30):
        with pytest.raises(aiohttp.ClientPayloadError):
            while block := await resp.content.read(2**20):
                received += len(block)
    assert received < size
    assert len(sending.sent) == sending.native and all(0 < n < size for n in sending.sent)


async def test_ranges_past_four_gibibytes(pfs: Pfs, sending: Sending) -> None:
    path = pfs.home("alice") / "big.bin"
    path.parent.mkdir(parents=True)
    size = 4 * GIB + 10
    marker = b"ABCDEFGHIJKLMNOP"
    with open(path, "wb") as f:
        os.truncate(f.fileno(), size)  # sparse: no disk blocks behind the hole
        f.seek(4 * GIB - 6)
        f.write(marker)  # the last 16 bytes, across the 2**32 boundary
    params = {"path": f"{HOME}/alice/big.bin"}
    resp = await pfs.call("HEAD", "files", params=params)
    assert resp.headers["Content-Length"] == str(size)
    first, last = 4 * GIB - 6, 4 * GIB + 9
    resp = await pfs.call("GET", "files", params=params, headers={"Range": f"bytes={first}-{last}"})
    assert resp.status == 206
    assert resp.headers["Content-Range"] == f"bytes {first}-{last}/{size}"
    assert await resp.read() == marker
    resp = await pfs.call(
        "GET", "files", params=params, headers={"Range": f"bytes={4 * GIB - 8}-{4 * GIB + 1}"}
    )
    assert await resp.read() == b"\0\0ABCDEFGH"
    resp = await pfs.call("GET", "files", params=params, headers={"Range": "bytes=-4"})
    assert await resp.read() == b"MNOP"
    sending.expect(16, 10, 4)


async def test_a_directory_is_listed_not_archived(pfs: Pfs) -> None:
    write(pfs.home("alice") / "d" / "x", b"xx")
    body = await pfs.ok_json("files", path=f"{HOME}/alice/d")
    assert body["path"] == f"{HOME}/alice/d"
    assert [(e["name"], e["size"]) for e in body["entries"]] == [("x", 2)]


async def test_downloading_what_is_not_a_file(pfs: Pfs) -> None:
    home = pfs.home("alice")
    home.mkdir(parents=True)
    os.mkfifo(home / "fifo")  # opening it must not wait for a writer
    await problem(await pfs.get("files", path=f"{HOME}/alice/fifo"), 409, "ERR_CONFLICT")
    await problem(await pfs.get("files", path=f"{HOME}/alice/missing"), 404, "ERR_PATH_NOT_FOUND")
    await problem(await pfs.get("files", path="/pfs/dc2/home/alice/x"), 404, "ERR_PATH_NOT_FOUND")


async def test_your_own_home_is_empty_before_your_first_write(pfs: Pfs) -> None:
    assert (await pfs.ok_json("ls", path=f"{HOME}/alice")) == {"path": f"{HOME}/alice", "entries": []}
    assert not pfs.home("alice").exists()  # reading created nothing
    await problem(await pfs.get("ls", "admin", path=f"{HOME}/nobody"), 404, "ERR_PATH_NOT_FOUND")


# ls and stat ----------------------------------------------------------------------


@pytest.fixture
def tree(pfs: Pfs) -> Path:
    data = pfs.home("alice") / "data"
    write(data / "a.txt", b"hello")
    write(data / "sub" / "b.txt", b"abc")
    (data / "empty").mkdir()
    os.symlink("sub", data / "link-to-sub")
    os.symlink("../../bob", data / "link-to-bob")
    write(pfs.home("bob") / "secret", b"bob's")
    for path in (data / "sub", data / "empty", data):
        os.utime(path, ns=(MTIME_NS, MTIME_NS))
    for link in ("link-to-sub", "link-to-bob"):
        os.utime(data / link, ns=(MTIME_NS, MTIME_NS), follow_symlinks=False)
    os.chmod(data / "a.txt", 0o640)
    return data


def entry(path: str, type_: str, size: int = 0, mode: str = "0755", **extra: str) -> dict[str, Any]:
    return {
        "path": f"{HOME}/alice/{path}",
        "name": path.rsplit("/", 1)[-1],
        "type": type_,
        "size": size,
        "mtime": MTIME_ISO,
        "mode": mode,
        **extra,
    }


def link_entry(path: str, target: str) -> dict[str, Any]:
    return entry(path, "symlink", mode="0777", target=target)


async def test_ls_lists_a_directory_without_following_symlinks(pfs: Pfs, tree: Path) -> None:
    body = await pfs.ok_json("ls", path=f"{HOME}/alice/data")
    assert body == {
        "path": f"{HOME}/alice/data",
        "entries": [
            entry("data/a.txt", "file", 5, "0640"),
            entry("data/empty", "dir"),
            link_entry("data/link-to-bob", "../../bob"),
            link_entry("data/link-to-sub", "sub"),
            entry("data/sub", "dir"),
        ],
    }


async def test_ls_recursive_includes_every_descendant_but_never_enters_symlinks(pfs: Pfs, tree: Path) -> None:
    for flag in ("1", "true"):
        body = await pfs.ok_json("ls", path=f"{HOME}/alice/data", recursive=flag)
        assert body["entries"] == [
            entry("data/a.txt", "file", 5, "0640"),
            entry("data/empty", "dir"),
            link_entry("data/link-to-bob", "../../bob"),
            link_entry("data/link-to-sub", "sub"),
            entry("data/sub", "dir"),
            entry("data/sub/b.txt", "file", 3, "0644"),
        ]
    shallow = await pfs.ok_json("ls", path=f"{HOME}/alice/data", recursive="0")
    assert len(shallow["entries"]) == 5
    top = await pfs.ok_json("ls", path=f"{HOME}/alice/", recursive="1")
    assert [e["path"] for e in top["entries"]][:2] == [f"{HOME}/alice/data", f"{HOME}/alice/data/a.txt"]
    assert not any("secret" in e["path"] for e in top["entries"])


async def test_ls_of_a_file_or_symlink_is_that_entry(pfs: Pfs, tree: Path) -> None:
    body = await pfs.ok_json("ls", path=f"{HOME}/alice/data/a.txt")
    assert body["entries"] == [entry("data/a.txt", "file", 5, "0640")]
    body = await pfs.ok_json("ls", path=f"{HOME}/alice/data/link-to-bob", recursive="1")
    assert body["entries"] == [link_entry("data/link-to-bob", "../../bob")]


@pytest.mark.usefixtures("remove_tmp_path_after")
async def test_a_tree_deeper_than_pythons_recursion_limit(pfs: Pfs) -> None:
    # A PFS path may be 4 KiB, so `mkdir -p` alone makes trees 2,000 levels deep.
    depth = 1500
    deep = f"{HOME}/alice/" + "/".join(["d"] * depth)
    resp = await pfs.call("POST", "mkdir", json={"path": deep, "parents": True})
    assert resp.status == 201
    write(pfs.home("alice").joinpath(*["d"] * depth) / "leaf", b"x")
    body = await pfs.ok_json("ls", path=f"{HOME}/alice", recursive="1")
    assert len(body["entries"]) == depth + 1
    assert max(body["entries"], key=lambda e: len(e["path"]))["path"] == f"{deep}/leaf"
    resp = await pfs.call("DELETE", "files", params={"path": f"{HOME}/alice/d", "recursive": "1"})
    assert resp.status == 204, await resp.text()
    assert list(pfs.home("alice").iterdir()) == []


async def test_stat(pfs: Pfs, tree: Path) -> None:
    assert await pfs.ok_json("stat", path=f"{HOME}/alice/data/a.txt") == entry(
        "data/a.txt", "file", 5, "0640"
    )
    assert await pfs.ok_json("stat", path=f"{HOME}/alice/data/sub") == entry("data/sub", "dir")
    link = await pfs.ok_json("stat", path=f"{HOME}/alice/data/link-to-bob")
    assert link == link_entry("data/link-to-bob", "../../bob")
    home = await pfs.ok_json("stat", path=f"{HOME}/alice")
    assert (home["path"], home["name"], home["type"]) == (f"{HOME}/alice", "alice", "dir")
    await problem(await pfs.get("stat", path=f"{HOME}/alice/data/nope"), 404, "ERR_PATH_NOT_FOUND")
    await problem(await pfs.get("stat", path=f"{HOME}/alice/data/a.txt/x"), 404, "ERR_PATH_NOT_FOUND")


async def test_stat_sha256_is_computed_or_remembered(pfs: Pfs, tree: Path) -> None:
    path = tree / "a.txt"
    params = {"path": f"{HOME}/alice/data/a.txt", "checksum": "sha256"}
    body = await pfs.ok_json("stat", **params)
    assert body == {**entry("data/a.txt", "file", 5, "0640"), "sha256": hashlib.sha256(b"hello").hexdigest()}
    # A record that matches size and mtime is believed (this is how uploads hand it over).
    forged = "ab" * 32
    record = {"sha256": forged, "size": 5, "mtime_ns": MTIME_NS}
    try:
        os.setxattr(path, "user.paddlecloud.sha256", json.dumps(record).encode())
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            pytest.skip("this filesystem keeps no user xattrs")
        raise
    assert (await pfs.ok_json("stat", **params))["sha256"] == forged
    # One that no longer matches the file is not.
    write(path, b"hello world", MTIME_NS + 1000)
    body = await pfs.ok_json("stat", **params)
    assert body["sha256"] == hashlib.sha256(b"hello world").hexdigest()
    assert body["size"] == 11
    # The computed value is remembered for the next time, against this size and mtime.
    remembered = json.loads(os.getxattr(path, "user.paddlecloud.sha256"))
    assert remembered == {"sha256": body["sha256"], "size": 11, "mtime_ns": MTIME_NS + 1000}
    # Garbage in the record is ignored, not trusted and not a 500.
    os.setxattr(path, "user.paddlecloud.sha256", b"\xff not json")
    assert (await pfs.ok_json("stat", **params))["sha256"] == body["sha256"]


async def test_stat_sha256_of_a_directory_or_link_has_none(pfs: Pfs, tree: Path) -> None:
    for name in ("sub", "link-to-sub"):
        body = await pfs.ok_json("stat", path=f"{HOME}/alice/data/{name}", checksum="sha256")
        assert "sha256" not in body and body["name"] == name


# Query and body parsing -----------------------------------------------------------


async def test_a_missing_path_is_400_naming_it(pfs: Pfs) -> None:
    for method, endpoint in (("GET", "files"), ("DELETE", "files"), ("GET", "ls"), ("GET", "stat")):
        body = await problem(await pfs.call(method, endpoint), 400, "ERR_BAD_REQUEST")
        assert body["errors"] == [{"field": "path", "message": "required"}], endpoint
    assert (await pfs.call("HEAD", "files")).status == 400


BAD_QUERIES = [
    ("GET", "ls", "path=/pfs/dc1/home/alice&recursive=yes", "recursive"),
    ("GET", "ls", "path=/pfs/dc1/home/alice&recursive=", "recursive"),
    ("GET", "ls", "path=/pfs/dc1/home/alice&recursive=True", "recursive"),
    ("GET", "ls", "path=/pfs/dc1/home/alice&depth=2", "depth"),
    ("GET", "ls", "path=/pfs/dc1/home/alice&path=/pfs/dc1/home/alice/x", "path"),
    ("GET", "files", "path=/pfs/dc1/home/alice&recursive=1", "recursive"),
    ("GET", "stat", "path=/pfs/dc1/home/alice&checksum=md5", "checksum"),
    ("GET", "usage", "user=alice&user=bob", "user"),
    ("GET", "usage", "path=/pfs/dc1/home/alice", "path"),
    ("DELETE", "files", "path=/pfs/dc1/home/alice/x&recursive=2", "recursive"),
    ("POST", "mkdir", "path=/pfs/dc1/home/alice/x", "path"),
    ("POST", "mv", "overwrite=1", "overwrite"),
]


async def test_queries_are_parsed_strictly(pfs: Pfs) -> None:
    for method, endpoint, query, field in BAD_QUERIES:
        body = await problem(await pfs.call(method, f"{endpoint}?{query}"), 400, "ERR_BAD_REQUEST")
        assert [e["field"] for e in body["errors"]] == [field], query


BAD_BODIES = [
    ("mkdir", {}, "path"),
    ("mkdir", {"path": 5}, "path"),
    ("mkdir", {"path": f"{HOME}/alice/d", "parents": "true"}, "parents"),
    ("mkdir", {"path": f"{HOME}/alice/d", "mode": "0700"}, "mode"),
    ("mv", {"src": f"{HOME}/alice/a"}, "dst"),
    ("mv", {"src": f"{HOME}/alice/a", "dst": f"{HOME}/alice/b", "overwrite": 1}, "overwrite"),
    ("mv", {"src": f"{HOME}/alice/a", "dst": f"{HOME}/alice/b", "force": True}, "force"),
    ("mv", ["src", "dst"], "(body)"),
]


async def test_bodies_are_validated_strictly(pfs: Pfs) -> None:
    for endpoint, payload, field in BAD_BODIES:
        body = await problem(await pfs.call("POST", endpoint, json=payload), 422, "ERR_VALIDATION")
        assert field in [e["field"] for e in body["errors"]], payload
    assert not pfs.home("alice").exists()  # nothing was done on the way


async def test_bad_json_is_400(pfs: Pfs) -> None:
    resp = await pfs.call("POST", "mkdir", data=b"{not json", headers={"Content-Type": "application/json"})
    await problem(resp, 400, "ERR_BAD_JSON")


# mkdir ----------------------------------------------------------------------------


async def test_mkdir_creates_the_home_on_first_write(pfs: Pfs) -> None:
    assert not pfs.home("alice").exists()
    resp = await pfs.call("POST", "mkdir", json={"path": f"{HOME}/alice/data"})
    assert resp.status == 201, await resp.text()
    body = await resp.json()
    assert (body["path"], body["name"], body["type"], body["size"]) == (
        f"{HOME}/alice/data",
        "data",
        "dir",
        0,
    )
    assert (pfs.home("alice") / "data").is_dir()


async def test_mkdir_parents_and_existing(pfs: Pfs) -> None:
    deep = f"{HOME}/alice/a/b/c"
    await problem(await pfs.call("POST", "mkdir", json={"path": deep}), 404, "ERR_PATH_NOT_FOUND")
    assert not (pfs.home("alice") / "a").exists()
    resp = await pfs.call("POST", "mkdir", json={"path": deep, "parents": True})
    assert resp.status == 201
    assert (pfs.home("alice") / "a" / "b" / "c").is_dir()
    resp = await pfs.call("POST", "mkdir", json={"path": deep, "parents": True})
    assert resp.status == 200
    assert (await resp.json())["path"] == deep
    await problem(await pfs.call("POST", "mkdir", json={"path": deep}), 409, "ERR_ALREADY_EXISTS")
    resp = await pfs.call("POST", "mkdir", json={"path": f"{HOME}/alice", "parents": True})
    assert resp.status == 200


async def test_mkdir_with_a_file_or_symlink_in_the_way(pfs: Pfs) -> None:
    write(pfs.home("alice") / "f", b"x")
    os.symlink("f", pfs.home("alice") / "link")
    for path, parents in (("f", True), ("f", False), ("f/sub", True), ("link/sub", True), ("link", True)):
        resp = await pfs.call("POST", "mkdir", json={"path": f"{HOME}/alice/{path}", "parents": parents})
        await problem(resp, 409)
    assert (pfs.home("alice") / "f").read_bytes() == b"x"


# rm -------------------------------------------------------------------------------


async def test_rm_file_and_empty_directory(pfs: Pfs) -> None:
    write(pfs.home("alice") / "f", b"x")
    (pfs.home("alice") / "empty").mkdir()
    for name in ("f", "empty"):
        resp = await pfs.call("DELETE", "files", params={"path": f"{HOME}/alice/{name}"})
        assert resp.status == 204
        assert not (pfs.home("alice") / name).exists()
    resp = await pfs.call("DELETE", "files", params={"path": f"{HOME}/alice/f"})
    await problem(resp, 404, "ERR_PATH_NOT_FOUND")


async def test_rm_r(pfs: Pfs, tree: Path) -> None:
    params = {"path": f"{HOME}/alice/data"}
    write(pfs.home("alice") / "keep" / "kept.txt", b"kept")
    os.symlink("../../keep", tree / "sub" / "to-keep")
    bob_before = snapshot(pfs.home("bob"))
    resp = await pfs.call("DELETE", "files", params=params)
    body = await problem(resp, 409, "ERR_CONFLICT")
    assert "recursive" in body["detail"]
    assert (tree / "a.txt").exists()
    resp = await pfs.call("DELETE", "files", params={**params, "recursive": "1"})
    assert resp.status == 204
    assert not tree.exists()
    assert (pfs.home("alice") / "keep" / "kept.txt").read_bytes() == b"kept"
    assert snapshot(pfs.home("bob")) == bob_before  # link-to-bob went, not what it pointed to


async def test_roots_cannot_be_removed(pfs: Pfs) -> None:
    write(pfs.home("alice") / "f", b"x")
    for user, path in (("alice", f"{HOME}/alice"), ("admin", f"{HOME}/alice/"), ("admin", PUBLIC)):
        resp = await pfs.call("DELETE", "files", user, params={"path": path, "recursive": "1"})
        await problem(resp, 403, "ERR_PATH_FORBIDDEN")
    assert (pfs.home("alice") / "f").exists()
    assert (pfs.root / "public").is_dir()


# mv -------------------------------------------------------------------------------


async def mv(pfs: Pfs, src: str, dst: str, user: str = "alice", **extra: Any) -> ClientResponse:
    return await pfs.call("POST", "mv", user, json={"src": f"{HOME}/{src}", "dst": f"{HOME}/{dst}", **extra})


async def test_mv_a_file_and_a_directory(pfs: Pfs) -> None:
    home = pfs.home("alice")
    write(home / "a", b"A")
    write(home / "dir" / "inner", b"I")
    resp = await mv(pfs, "alice/a", "alice/dir/b")
    assert resp.status == 200
    body = await resp.json()
    assert (body["path"], body["type"], body["size"]) == (f"{HOME}/alice/dir/b", "file", 1)
    assert not (home / "a").exists() and (home / "dir" / "b").read_bytes() == b"A"
    resp = await mv(pfs, "alice/dir", "alice/moved")
    assert resp.status == 200
    assert (await resp.json())["type"] == "dir"
    assert sorted(p.name for p in (home / "moved").iterdir()) == ["b", "inner"]


async def test_mv_never_replaces_without_overwrite_and_never_a_directory(pfs: Pfs) -> None:
    home = pfs.home("alice")
    write(home / "a", b"A")
    write(home / "b", b"B")
    write(home / "d" / "keep", b"K")
    (home / "d2").mkdir()
    await problem(await mv(pfs, "alice/a", "alice/b"), 409, "ERR_ALREADY_EXISTS")
    assert (home / "a").read_bytes() == b"A" and (home / "b").read_bytes() == b"B"
    # A directory is never replaced, not even an empty one, overwrite or not.
    for dst in ("alice/d", "alice/d2"):
        for overwrite in (False, True):
            await problem(await mv(pfs, "alice/a", dst, overwrite=overwrite), 409, "ERR_ALREADY_EXISTS")
    await problem(await mv(pfs, "alice/d", "alice/d2", overwrite=True), 409)
    # A directory does not replace a file either.
    await problem(await mv(pfs, "alice/d", "alice/b", overwrite=True), 409, "ERR_CONFLICT")
    assert (home / "d" / "keep").read_bytes() == b"K" and (home / "d2").is_dir()
    resp = await mv(pfs, "alice/a", "alice/b", overwrite=True)
    assert resp.status == 200
    assert not (home / "a").exists() and (home / "b").read_bytes() == b"A"


async def test_mv_into_itself_and_missing_ends(pfs: Pfs) -> None:
    write(pfs.home("alice") / "d" / "x", b"x")
    await problem(await mv(pfs, "alice/d", "alice/d/sub"), 400)
    await problem(await mv(pfs, "alice/d", "alice/d/x/y"), 400)
    await problem(await mv(pfs, "alice/nope", "alice/y"), 404, "ERR_PATH_NOT_FOUND")
    await problem(await mv(pfs, "alice/d", "alice/no/such/dir"), 404, "ERR_PATH_NOT_FOUND")
    for src, dst in (("alice", "alice/x"), ("alice/d", "alice")):
        await problem(await mv(pfs, src, dst, "admin"), 403, "ERR_PATH_FORBIDDEN")
    assert (pfs.home("alice") / "d" / "x").read_bytes() == b"x"


async def test_admin_moves_between_homes_and_creates_the_destination_home(pfs: Pfs) -> None:
    write(pfs.home("alice") / "gift", b"G")
    resp = await mv(pfs, "alice/gift", "bob/gift", "admin")
    assert resp.status == 200
    assert (pfs.home("bob") / "gift").read_bytes() == b"G"


# usage ----------------------------------------------------------------------------


async def test_usage(pfs: Pfs) -> None:
    write(pfs.home("alice") / "a", b"x" * 10)
    write(pfs.home("alice") / "d" / "b", b"y" * 20)
    os.symlink("a", pfs.home("alice") / "link")
    # What the files take on the disk: whole blocks (st_blocks), as du and quotas count.
    a, b = (os.stat(pfs.home("alice") / p).st_blocks * 512 for p in ("a", "d/b"))
    assert a >= 10 and b >= 20
    advisory = {"enforced": False, "enforcement": STORAGE_ADVISORY}
    expected = {"user": "alice", "bytes": a + b, "files": 2, "limit": 10_000, **advisory}
    assert await pfs.ok_json("usage") == expected
    assert await pfs.ok_json("usage", user="alice") == expected
    assert await pfs.ok_json("usage", "admin", user="alice") == expected
    bob = {"user": "bob", "bytes": 0, "files": 0, "limit": None, **advisory}
    assert await pfs.ok_json("usage", "bob") == bob
    # Changes made here are seen at once, not after the cache expires.
    resp = await pfs.call("DELETE", "files", params={"path": f"{HOME}/alice/d", "recursive": "1"})
    assert resp.status == 204
    assert (await pfs.ok_json("usage"))["bytes"] == a
    assert (await mv(pfs, "alice/a", "bob/a", "admin")).status == 200
    assert (await pfs.ok_json("usage"))["bytes"] == 0
    assert (await pfs.ok_json("usage", "bob"))["bytes"] == a


async def test_usage_of_others_is_for_admins(pfs: Pfs) -> None:
    await problem(await pfs.get("usage", user="bob"), 403, "ERR_FORBIDDEN")
    await problem(await pfs.get("usage", "admin", user="nobody"), 404, "ERR_NOT_FOUND")
    await problem(await pfs.get("usage", "admin", user="../bob"), 400, "ERR_BAD_PATH")


@pytest.mark.parametrize("name", ["..;", "a;b", "Alice", "-bob", "x" * 40, "bob.", "al ice"])
async def test_retiring_a_home_no_user_could_have_is_400_naming_it(pfs: Pfs, name: str) -> None:
    pfs.home("alice").mkdir(parents=True, exist_ok=True)
    (pfs.home("alice") / "keep").write_text("x")
    resp = await pfs.client.request(
        "DELETE", f"{API}/homes/{quote(name, safe=';')}", headers=pfs.headers["admin"]
    )
    body = await problem(resp, 400)
    assert "user name" in body["detail"] or "not allowed" in body["detail"], body
    assert (pfs.home("alice") / "keep").exists()


# Who may do what ------------------------------------------------------------------


async def test_alice_cannot_touch_bobs_files(pfs: Pfs) -> None:
    bob = pfs.home("bob")
    write(bob / "secret.txt", b"bob's")
    write(bob / "dir" / "inner", b"inner")
    write(pfs.home("alice") / "mine", b"mine")
    before = snapshot(bob)
    b = f"{HOME}/bob"
    attempts = [
        pfs.get("files", path=f"{b}/secret.txt"),
        pfs.call("HEAD", "files", params={"path": f"{b}/secret.txt"}),
        pfs.get("files", path=b),
        pfs.get("ls", path=b, recursive="1"),
        pfs.get("ls", path=f"{b}/dir"),
        pfs.get("stat", path=f"{b}/secret.txt", checksum="sha256"),
        pfs.get("stat", path=f"{b}/missing"),  # not even whether it exists
        pfs.call("DELETE", "files", params={"path": f"{b}/secret.txt"}),
        pfs.call("DELETE", "files", params={"path": f"{b}/dir", "recursive": "1"}),
        pfs.call("POST", "mkdir", json={"path": f"{b}/new", "parents": True}),
        mv(pfs, "bob/secret.txt", "alice/stolen"),
        mv(pfs, "alice/mine", "bob/planted"),
        mv(pfs, "alice/mine", "bob/secret.txt", overwrite=True),
    ]
    for attempt in attempts:
        resp = await attempt
        assert resp.status == 403, (resp.method, resp.url)
        if resp.method != "HEAD":
            await problem(resp, 403, "ERR_PATH_FORBIDDEN")
    assert snapshot(bob) == before
    assert (pfs.home("alice") / "mine").read_bytes() == b"mine"
    assert not (pfs.home("alice") / "stolen").exists()


async def test_everyone_reads_public_only_admins_write_it(pfs: Pfs) -> None:
    write(pfs.root / "public" / "data" / "shared.txt", b"shared")
    public = pfs.root / "public"
    write(pfs.home("alice") / "mine", b"mine")
    before = snapshot(public)
    for user in ("alice", "bob"):
        resp = await pfs.get("files", user, path=f"{PUBLIC}/data/shared.txt")
        assert await resp.read() == b"shared"
        listing = await pfs.ok_json("ls", user, path=PUBLIC, recursive="1")
        assert [e["name"] for e in listing["entries"]] == ["data", "shared.txt"]
        assert (await pfs.ok_json("stat", user, path=f"{PUBLIC}/data"))["type"] == "dir"
    refusals = [
        pfs.call("POST", "mkdir", json={"path": f"{PUBLIC}/new"}),
        pfs.call("DELETE", "files", params={"path": f"{PUBLIC}/data/shared.txt"}),
        pfs.call("DELETE", "files", params={"path": f"{PUBLIC}/data", "recursive": "1"}),
        pfs.call("POST", "mv", json={"src": f"{PUBLIC}/data/shared.txt", "dst": f"{HOME}/alice/taken"}),
        pfs.call("POST", "mv", json={"src": f"{HOME}/alice/mine", "dst": f"{PUBLIC}/mine"}),
    ]
    for attempt in refusals:
        await problem(await attempt, 403, "ERR_PATH_FORBIDDEN")
    assert snapshot(public) == before
    resp = await pfs.call("POST", "mkdir", "admin", json={"path": f"{PUBLIC}/datasets/v1", "parents": True})
    assert resp.status == 201
    resp = await pfs.call("POST", "mv", "admin", json={"src": f"{HOME}/alice/mine", "dst": f"{PUBLIC}/mine"})
    assert resp.status == 200
    assert (public / "mine").read_bytes() == b"mine"
    resp = await pfs.call("DELETE", "files", "admin", params={"path": f"{PUBLIC}/data", "recursive": "1"})
    assert resp.status == 204
    assert sorted(p.name for p in public.iterdir()) == ["datasets", "mine"]


NFC_NAME = "caf\u00e9"  # é as one code point
NFD_NAME = "cafe\u0301"  # e and a combining acute accent: looks the same


async def test_names_are_taken_in_composed_form_so_look_alikes_are_one_file(pfs: Pfs) -> None:
    resp = await pfs.call("POST", "mkdir", json={"path": f"{HOME}/alice/{NFD_NAME}"})
    assert resp.status == 201, await resp.text()
    assert (await resp.json())["name"] == NFC_NAME
    assert [p.name for p in pfs.home("alice").iterdir()] == [NFC_NAME]
    # The other spelling names the same directory on every endpoint.
    again = await pfs.call("POST", "mkdir", json={"path": f"{HOME}/alice/{NFC_NAME}"})
    await problem(again, 409, "ERR_ALREADY_EXISTS")
    write(pfs.home("alice") / NFC_NAME / "x.txt", b"X")
    stat = await pfs.ok_json("stat", path=f"{HOME}/alice/{NFD_NAME}/x.txt")
    assert stat["path"] == f"{HOME}/alice/{NFC_NAME}/x.txt"
    download = await pfs.get("files", path=f"{HOME}/alice/{NFD_NAME}/x.txt")
    assert await download.read() == b"X"
    resp = await mv(pfs, f"alice/{NFD_NAME}/x.txt", f"alice/{NFD_NAME}/y.txt")
    assert resp.status == 200, await resp.text()
    resp = await pfs.call("DELETE", "files", params={"path": f"{HOME}/alice/{NFD_NAME}", "recursive": "1"})
    assert resp.status in (200, 204), await resp.text()
    assert list(pfs.home("alice").iterdir()) == []


@pytest.mark.parametrize("control", ["\u202e", "\u202d", "\u200f", "\u2066", "\u061c"])
async def test_bidirectional_controls_are_refused_in_every_name(pfs: Pfs, control: str) -> None:
    name = f"report{control}fdp.exe"
    made = await pfs.call("POST", "mkdir", json={"path": f"{HOME}/alice/{name}"})
    body = await problem(made, 400, "ERR_BAD_PATH")
    assert "bidirectional control" in body["detail"]
    write(pfs.home("alice") / "a.txt", b"A")
    await problem(await mv(pfs, "alice/a.txt", f"alice/{name}"), 400, "ERR_BAD_PATH")
    await problem(await pfs.get("stat", path=f"{HOME}/alice/{name}"), 400, "ERR_BAD_PATH")
    assert [p.name for p in pfs.home("alice").iterdir()] == ["a.txt"]


# Paged listings -------------------------------------------------------------------

# Names chosen so that path-string order and tree order differ ("a-b" sorts between "a" and
# "a/x" as strings) and several pages cross directory boundaries.
PAGED_DIRS = ("a/x/deep", "a-b", "b/c/d", "b/c/e", *(f"n{i:02d}" for i in range(12)))


async def _pages(pfs: Pfs, path: str, limit: int, recursive: bool, who: str = "alice") -> list[list[str]]:
    """Every page of a paged listing, followed by its cursors to the end."""
    pages: list[list[str]] = []
    params = {"path": path, "limit": str(limit), "recursive": "1" if recursive else "0"}
    while True:
        body = await pfs.ok_json("ls", who, **params)
        assert set(body) == {"path", "entries", "next"} and body["path"] == path
        assert len(body["entries"]) <= limit
        pages.append([e["path"] for e in body["entries"]])
        if body["next"] is None:
            return pages
        assert len(body["entries"]) == limit  # a page short of its limit is the last
        params["after"] = body["next"]


async def test_paging_returns_every_entry_once_in_tree_order(pfs: Pfs) -> None:
    top = f"{HOME}/alice/paged"
    for rel in PAGED_DIRS:
        resp = await pfs.call("POST", "mkdir", json={"path": f"{top}/{rel}", "parents": True})
        assert resp.status == 201, await resp.text()
    for recursive in (False, True):
        whole = await pfs.ok_json("ls", path=top, recursive="1" if recursive else "0")
        expected = [e["path"] for e in whole["entries"]]
        assert expected == sorted(expected, key=lambda p: p.split("/"))
        if recursive:
            assert expected[:4] == [f"{top}/a", f"{top}/a/x", f"{top}/a/x/deep", f"{top}/a-b"]
        for limit in (1, 2, 3, 7, len(expected), 10_000):
            pages = await _pages(pfs, top, limit, recursive)
            assert [p for page in pages for p in page] == expected, (recursive, limit)
    assert await pfs.ok_json("ls", path=f"{top}/a-b", limit="5") == {
        "path": f"{top}/a-b",
        "entries": [],
        "next": None,
    }
    own = await pfs.ok_json("ls", path=f"{HOME}/bob", who="bob", limit="5")
    assert own == {"path": f"{HOME}/bob", "entries": [], "next": None}


async def test_a_directory_changing_between_pages_breaks_nothing(pfs: Pfs) -> None:
    top = pfs.home("alice") / "moving"
    for name in ("a", "c", "e", "g"):
        write(top / name)
    first = await pfs.ok_json("ls", path=f"{HOME}/alice/moving", limit="2")
    assert [e["name"] for e in first["entries"]] == ["a", "c"]
    (top / "c").unlink()  # the entry the cursor names is gone
    write(top / "b")  # sorts before the cursor: not seen on this pass
    write(top / "d")  # sorts after it: seen
    rest = await pfs.ok_json("ls", path=f"{HOME}/alice/moving", limit="10", after=first["next"])
    assert [e["name"] for e in rest["entries"]] == ["d", "e", "g"] and rest["next"] is None


async def test_a_cursor_never_leaves_its_listing(pfs: Pfs, tree: Path) -> None:
    # A file's paged listing is the file itself, like its unpaged one.
    body = await pfs.ok_json("ls", path=f"{HOME}/alice/data/a.txt", limit="1")
    assert body["entries"] == [entry("data/a.txt", "file", 5, "0640")] and body["next"] is None
    first = await pfs.ok_json("ls", path=f"{HOME}/alice/data", limit="1", recursive="1")
    cursor = first["next"]
    # Another directory, another user's home, or another kind of listing: refused, not served.
    for who, path, recursive in (
        ("alice", f"{HOME}/alice", "1"),
        ("bob", f"{HOME}/bob", "1"),
        ("alice", f"{HOME}/alice/data", "0"),
    ):
        params = {"path": path, "limit": "5", "recursive": recursive, "after": cursor}
        body = await problem(await pfs.get("ls", who, **params), 400, "ERR_BAD_REQUEST")
        assert body["errors"][0]["field"] == "after" and "another listing" in body["detail"]
    # A hand-made cursor that climbs out with `..` or names a path: refused.
    path = PfsPath.parse(f"{HOME}/alice/data", "dc1")
    for last in (["..", "bob"], ["sub/../../bob"], ["."], [""], []):
        # The digest a forger would copy from a real cursor, with names of their own.
        digest = json.loads(base64.urlsafe_b64decode(make_cursor(path, True, ("x",)) + "=="))[0]
        forged = base64.urlsafe_b64encode(json.dumps([digest, last]).encode()).decode()
        params = {"path": f"{HOME}/alice/data", "limit": "5", "recursive": "1", "after": forged}
        body = await problem(await pfs.get("ls", **params), 400, "ERR_BAD_REQUEST")
        assert body["errors"][0]["field"] == "after", last
    # Bob's home stays closed to alice, cursor or not.
    await problem(await pfs.get("ls", path=f"{HOME}/bob", limit="5", after=cursor), 403)


BAD_PAGES = [
    ("limit=0", "limit"),
    ("limit=10001", "limit"),
    ("limit=-1", "limit"),
    ("limit=ten", "limit"),
    ("limit=" + "9" * 5000, "limit"),
    ("limit=", "limit"),
    ("after=abc", "after"),
    ("limit=5&after=%%%", "after"),
    ("limit=5&after=bm90IGpzb24", "after"),
    ("limit=5&after=" + "A" * 7000, "after"),
    ("limit=5&limit=6", "limit"),
]


async def test_bad_limits_and_cursors_are_400_naming_them(pfs: Pfs) -> None:
    for query, field in BAD_PAGES:
        body = await problem(
            await pfs.call("GET", f"ls?path=/pfs/dc1/home/alice&{query}"), 400, "ERR_BAD_REQUEST"
        )
        assert [e["field"] for e in body["errors"]] == [field], query
