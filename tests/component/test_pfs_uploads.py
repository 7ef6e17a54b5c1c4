"""tus uploads through the real gateway in front of the real pfs service.

Every test speaks HTTP to the gateway with a user's bearer token, as a client would, and
looks at the datacenter root only to check what did (or did not) reach the disk.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import random
import subprocess
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from paddlecloud.common.quantity import readable_bytes
from paddlecloud.common.storage.fsops import SHA256_XATTR
from paddlecloud.common.storage.posix import PosixStaging
from paddlecloud.common.store import Quota, Store, Token, User, open_store
from paddlecloud.common.store.models import utcnow
from paddlecloud.gateway.accounts import hash_token
from paddlecloud.gateway.app import create_app as create_gateway
from paddlecloud.pfs.app import create_app as create_pfs
from paddlecloud.pfs.keys import UPLOADS
from paddlecloud.pfs.uploads import Uploads
from support import free_port, make_config, scrape

try:
    from support import PFS_TRAVERSALS as TRAVERSALS
except ImportError:  # before the list moved to support.py
    from unit.test_pfs_paths import TRAVERSALS  # type: ignore[no-redef]

PROBLEM = "application/problem+json"
OCTET = "application/offset+octet-stream"
UPLOADS_URL = "/api/v1/pfs/uploads"
TUS = {"Tus-Resumable": "1.0.0"}
EXPIRY = 3600


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def metadata(**values: str) -> str:
    return ",".join(f"{k} {b64(v)}" for k, v in values.items())


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def checksum(algorithm: str, data: bytes) -> str:
    if algorithm == "crc32":
        digest = zlib.crc32(data).to_bytes(4, "big")
    else:
        digest = hashlib.new(algorithm, data).digest()
    return f"{algorithm} {base64.b64encode(digest).decode()}"


@dataclass
class Platform:
    """The gateway (as a test client) in front of pfs, both on one store, with users made on demand."""

    client: TestClient[Any, Any]
    store: Store
    root: Path
    config: Any
    restart_pfs: Callable[[], Awaitable[None]]
    pfs_server: list[TestServer] = field(default_factory=list)
    _auth: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def uploads(self) -> Uploads:
        return self.pfs_server[0].app[UPLOADS]

    async def user(self, name: str, *, admin: bool = False, storage: int | None = None) -> dict[str, str]:
        """Headers for `name` (created on first use) with its bearer token and tus version."""
        if name not in self._auth:
            await self.store.create_user(
                User(name, "unused", admin=admin, quota=Quota(storage_bytes=storage))
            )
            token = f"pc_test-token-of-{name}"
            await self.store.add_token(
                Token(hash_token(token), name, expires_at=utcnow() + timedelta(hours=1))
            )
            self._auth[name] = {"Authorization": f"Bearer {token}", **TUS}
        return dict(self._auth[name])

    async def create(
        self, who: dict[str, str], length: int | None, meta: str, **headers: str
    ) -> aiohttp.ClientResponse:
        extra = {"Upload-Length": str(length)} if length is not None else {"Upload-Defer-Length": "1"}
        return await self.client.post(
            UPLOADS_URL, headers={**who, **extra, "Upload-Metadata": meta, **headers}
        )

    async def new_upload(self, who: dict[str, str], path: str, length: int | None, **meta: str) -> str:
        resp = await self.create(who, length, metadata(path=path, **meta))
        assert resp.status == 201, await resp.text()
        return str(resp.headers["Location"])

    async def patch(
        self, who: dict[str, str], url: str, offset: int, data: Any, **headers: str
    ) -> aiohttp.ClientResponse:
        return await self.client.patch(
            url,
            data=data,
            headers={**who, "Content-Type": OCTET, "Upload-Offset": str(offset), **headers},
        )

    async def offset(self, who: dict[str, str], url: str) -> int:
        resp = await self.client.head(url, headers=who)
        assert resp.status == 200, resp.status
        assert resp.headers["Cache-Control"] == "no-store"
        return int(resp.headers["Upload-Offset"])

    def home(self, user: str) -> Path:
        return self.root / "home" / user

    def staged(self) -> list[str]:
        return sorted(os.listdir(self.root / ".uploads"))


async def problem(resp: aiohttp.ClientResponse, status: int, code: str) -> dict[str, Any]:
    """Check a refusal; a HEAD's has no body, so only its status and headers are checked."""
    text = await resp.text()
    assert resp.status == status, text
    assert resp.content_type == PROBLEM, text
    assert resp.headers["Tus-Resumable"] == "1.0.0"
    assert "Upload-Offset" not in resp.headers
    if resp.method == "HEAD":
        return {}
    body: dict[str, Any] = await resp.json()
    assert body["code"] == code, body
    assert "Traceback" not in text
    return body


@pytest.fixture
async def make_platform(
    tmp_path, aiohttp_server, aiohttp_client, request: pytest.FixtureRequest, pfs_settings: dict[str, Any]
) -> AsyncIterator[Callable[..., Any]]:
    stores: list[Store] = []
    # A module that runs these tests again on another volume names its class (PFS_VOLUME): a
    # new one per start of pfs, as a process of its own would open.
    volume_kind = getattr(request.module, "PFS_VOLUME", None)
    volumes: list[Any] = []

    async def make(root: Path | None = None, **pfs: Any) -> Platform:
        pfs_section = {"datacenter": "dc1", "upload_expiry_seconds": EXPIRY, **pfs_settings, **pfs}
        if root is not None:
            pfs_section["root"] = str(root)
        base = make_config(tmp_path, pfs=pfs_section, gateway={"admin_password": None})
        store = open_store(base.store_url())
        await store.open()
        stores.append(store)
        servers: list[TestServer] = []
        port = free_port()

        async def start_pfs() -> None:
            volume = None if volume_kind is None else volume_kind(base.pfs.root.expanduser().resolve())
            if volume is not None:
                volumes.append(volume)
            servers[:] = [await aiohttp_server(create_pfs(base, store=store, volume=volume), port=port)]

        async def restart_pfs() -> None:
            await servers[0].close()
            await start_pfs()

        await start_pfs()
        config = make_config(
            tmp_path,
            pfs=pfs_section,
            gateway={
                "admin_password": None,
                "pfs_url": f"http://127.0.0.1:{port}",
                "jobs_url": f"http://127.0.0.1:{free_port()}",
                "builder_url": f"http://127.0.0.1:{free_port()}",
            },
        )
        client = await aiohttp_client(create_gateway(config, store=store))
        return Platform(client, store, config.pfs.root, config, restart_pfs, servers)

    yield make
    for store in stores:
        await store.close()
    for volume in volumes:
        await volume.close()


@pytest.fixture
async def platform(make_platform) -> Platform:
    return await make_platform()


async def test_metrics_count_uploads_in_flight_bytes_uploaded_and_bytes_stored(make_platform) -> None:
    """The operators' figures (docs/metrics.md, section 5) follow one tus upload."""
    platform = await make_platform(metrics_cache_seconds=0)
    url = f"http://127.0.0.1:{platform.pfs_server[0].port}"
    alice = await platform.user("alice")
    data = os.urandom(3 * 4096 + 100)
    before = await scrape(url)
    assert before.value("paddlecloud_uploads_in_flight") == 0
    assert before.value("paddlecloud_uploaded_bytes_total") == 0
    stored = before.value("paddlecloud_pfs_stored_bytes", datacenter="dc1")
    assert stored is not None

    upload = await platform.new_upload(alice, "/pfs/dc1/home/alice/counted.bin", len(data))
    assert (await platform.patch(alice, upload, 0, data[:4096])).status == 204
    during = await scrape(url)
    assert during.value("paddlecloud_uploads_in_flight") == 1
    assert during.value("paddlecloud_uploaded_bytes_total") == 4096

    assert (await platform.patch(alice, upload, 4096, data[4096:])).status == 204
    assert (platform.home("alice") / "counted.bin").read_bytes() == data
    after = await scrape(url)
    assert after.value("paddlecloud_uploads_in_flight") == 0
    assert after.value("paddlecloud_uploaded_bytes_total") == len(data)
    # What the home takes on the disk (allocated blocks, as quotas count it): the file at least.
    assert (after.value("paddlecloud_pfs_stored_bytes", datacenter="dc1") or 0) >= stored + len(data)


# The protocol's frame -----------------------------------------------------------


async def test_options_advertises_the_protocol(platform: Platform) -> None:
    alice = await platform.user("alice")
    del alice["Tus-Resumable"]  # clients should not send it on OPTIONS; it is not needed
    for url in (UPLOADS_URL, UPLOADS_URL + "/some-upload"):
        resp = await platform.client.options(url, headers=alice)
        assert resp.status == 204
        assert resp.headers["Tus-Version"] == "1.0.0"
        extensions = set(resp.headers["Tus-Extension"].split(","))
        assert extensions == {
            "creation",
            "creation-with-upload",
            "creation-defer-length",
            "checksum",
            "termination",
            "expiration",
        }
        assert int(resp.headers["Tus-Max-Size"]) == platform.config.pfs.max_upload_size
        assert resp.headers["Tus-Checksum-Algorithm"].split(",") == ["sha1", "sha256", "crc32"]


@pytest.mark.parametrize("version", [None, "0.2.2", "1.0.0, 0.2.2", ""])
async def test_other_tus_versions_are_412_and_not_processed(platform: Platform, version: str | None) -> None:
    alice = await platform.user("alice")
    del alice["Tus-Resumable"]
    if version is not None:
        alice["Tus-Resumable"] = version
    resp = await platform.create(alice, 10, metadata(path="/pfs/dc1/home/alice/x"))
    await problem(resp, 412, "ERR_TUS_VERSION")
    assert resp.headers["Tus-Version"] == "1.0.0"
    assert platform.staged() == []


async def test_method_override_is_honoured(platform: Platform) -> None:
    alice = await platform.user("alice")
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/o.bin", 4)
    resp = await platform.client.post(
        url,
        data=b"abcd",
        headers={**alice, "X-HTTP-Method-Override": "PATCH", "Content-Type": OCTET, "Upload-Offset": "0"},
    )
    assert resp.status == 204, await resp.text()
    resp = await platform.client.post(url, headers={**alice, "X-HTTP-Method-Override": "HEAD"})
    assert resp.status == 200 and resp.headers["Upload-Offset"] == "4"
    assert (platform.home("alice") / "o.bin").read_bytes() == b"abcd"
    resp = await platform.client.get(url, headers=alice)
    await problem(resp, 405, "ERR_METHOD_NOT_ALLOWED")


# Creation -----------------------------------------------------------------------


async def test_zero_length_upload_is_complete_at_creation(platform: Platform) -> None:
    alice = await platform.user("alice")
    resp = await platform.create(
        alice, 0, metadata(path="/pfs/dc1/home/alice/empty/e.txt", sha256=sha256(b""))
    )
    assert resp.status == 201, await resp.text()
    assert resp.headers["Location"].startswith(UPLOADS_URL + "/")
    assert resp.headers["PaddleCloud-Path"] == "/pfs/dc1/home/alice/empty/e.txt"
    assert resp.headers["PaddleCloud-Sha256"] == sha256(b"")
    final = platform.home("alice") / "empty" / "e.txt"
    assert final.is_file() and final.stat().st_size == 0
    head = await platform.client.head(resp.headers["Location"], headers=alice)
    assert head.headers["Upload-Offset"] == "0" and head.headers["Upload-Length"] == "0"


async def test_an_upload_to_a_decomposed_name_lands_at_the_composed_one(platform: Platform) -> None:
    alice = await platform.user("alice")
    data = b"menu"
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/cafe\u0301.txt", len(data))
    resp = await platform.patch(alice, url, 0, data)
    assert resp.status == 204, await resp.text()
    assert [p.name for p in platform.home("alice").iterdir()] == ["caf\u00e9.txt"]
    # The other spelling is the same file: without overwrite, it exists.
    again = await platform.create(alice, len(data), metadata(path="/pfs/dc1/home/alice/caf\u00e9.txt"))
    assert again.status == 409, await again.text()


async def test_creation_answers_location_expiry_and_echoes_metadata(platform: Platform) -> None:
    alice = await platform.user("alice")
    meta = metadata(path="/pfs/dc1/home/alice/a.bin", filename="a.bin", filetype="application/x") + ",flag"
    resp = await platform.create(alice, 10, meta)
    assert resp.status == 201, await resp.text()
    location = resp.headers["Location"]
    upload_id = location.rsplit("/", 1)[1]
    assert len(upload_id) >= 32
    expires = resp.headers["Upload-Expires"]
    assert expires.endswith(" GMT")
    head = await platform.client.head(location, headers=alice)
    assert head.status == 200
    assert head.headers["Upload-Offset"] == "0"
    assert head.headers["Upload-Length"] == "10"
    assert head.headers["Upload-Metadata"] == meta
    assert head.headers["Tus-Resumable"] == "1.0.0"
    assert "Upload-Expires" in head.headers
    # Staged outside the home: nothing shows up in it before completion.
    assert not (platform.home("alice") / "a.bin").exists()
    assert sorted(platform.staged()) == sorted([f"{upload_id}.info", f"{upload_id}.part"])


async def test_creation_with_upload(platform: Platform) -> None:
    alice = await platform.user("alice")
    data = os.urandom(100_000)
    resp = await platform.client.post(
        UPLOADS_URL,
        data=data[:60_000],
        headers={
            **alice,
            "Upload-Length": str(len(data)),
            "Upload-Metadata": metadata(path="/pfs/dc1/home/alice/cwu.bin"),
            "Content-Type": OCTET,
        },
    )
    assert resp.status == 201, await resp.text()
    assert resp.headers["Upload-Offset"] == "60000"
    url = resp.headers["Location"]
    resp = await platform.patch(alice, url, 60_000, data[60_000:])
    assert resp.status == 204
    assert resp.headers["PaddleCloud-Sha256"] == sha256(data)
    assert (platform.home("alice") / "cwu.bin").read_bytes() == data


async def test_deferred_length(platform: Platform) -> None:
    alice = await platform.user("alice")
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/deferred.bin", None)
    head = await platform.client.head(url, headers=alice)
    assert head.headers["Upload-Defer-Length"] == "1" and "Upload-Length" not in head.headers
    assert (await platform.patch(alice, url, 0, b"hello ")).status == 204
    resp = await platform.patch(alice, url, 6, b"world", **{"Upload-Length": "11"})
    assert resp.status == 204, await resp.text()
    assert (platform.home("alice") / "deferred.bin").read_bytes() == b"hello world"
    # Once set, the length never changes.
    resp = await platform.patch(alice, url, 11, b"", **{"Upload-Length": "12"})
    await problem(resp, 400, "ERR_BAD_UPLOAD_HEADER")


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({}, "ERR_BAD_UPLOAD_HEADER"),
        ({"Upload-Length": "-1"}, "ERR_BAD_UPLOAD_HEADER"),
        ({"Upload-Length": "1e3"}, "ERR_BAD_UPLOAD_HEADER"),
        ({"Upload-Length": "10", "Upload-Defer-Length": "1"}, "ERR_BAD_UPLOAD_HEADER"),
        ({"Upload-Defer-Length": "2"}, "ERR_BAD_UPLOAD_HEADER"),
    ],
)
async def test_bad_creation_headers_are_400(platform: Platform, headers: dict[str, str], code: str) -> None:
    alice = await platform.user("alice")
    resp = await platform.client.post(
        UPLOADS_URL,
        headers={**alice, **headers, "Upload-Metadata": metadata(path="/pfs/dc1/home/alice/x")},
    )
    await problem(resp, 400, code)
    assert platform.staged() == []


@pytest.mark.parametrize(
    "meta",
    [
        "",  # no path
        "path",  # a path without a value
        f"path {b64('/pfs/dc1/home/alice/x')},path {b64('/pfs/dc1/home/alice/y')}",  # twice
        "path not-base64!",
        "path L3Bmcy9kYzEvaG9tZS9hbGljZS94eQ",  # unpadded
        f"path {b64('/pfs/dc1/home/alice/x')},name {b64('a' + chr(13) + chr(10) + 'X-Evil: 1')}",  # CRLF
        f"path {b64('/pfs/dc1/home/alice/x')},name {base64.b64encode(bytes([0xFF, 0xFE])).decode()}",
        f"path {b64('/pfs/dc1/home/alice/x')},sha256 {b64('abc')}",
        f"path {b64('/pfs/dc1/home/alice/x')},overwrite {b64('yes')}",
        f"path {b64('/pfs/dc1/home/alice/x')},a b c",
    ],
)
async def test_bad_metadata_is_refused_at_creation(platform: Platform, meta: str) -> None:
    alice = await platform.user("alice")
    resp = await platform.create(alice, 10, meta)
    await problem(resp, 400, "ERR_BAD_METADATA")
    assert "X-Evil" not in resp.headers
    assert platform.staged() == []


async def test_tus_max_size_is_413_at_creation(make_platform) -> None:
    platform = await make_platform(max_upload_size=1000)
    alice = await platform.user("alice")
    resp = await platform.client.options(UPLOADS_URL, headers=alice)
    assert resp.headers["Tus-Max-Size"] == "1000"
    resp = await platform.create(alice, 1001, metadata(path="/pfs/dc1/home/alice/big"))
    await problem(resp, 413, "ERR_UPLOAD_TOO_LARGE")
    assert platform.staged() == []
    # A deferred upload meets the limit when it declares its length.
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/big", None)
    resp = await platform.patch(alice, url, 0, b"x", **{"Upload-Length": "1001"})
    await problem(resp, 413, "ERR_UPLOAD_TOO_LARGE")
    assert await platform.offset(alice, url) == 0


async def test_quota_counts_the_home_and_unfinished_uploads(platform: Platform) -> None:
    # Whole 4 KiB blocks: a home's use is what its files take on the disk (allocated blocks).
    block = 4096
    alice = await platform.user("alice", storage=10 * block)
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/a", 3 * block)
    assert (await platform.patch(alice, url, 0, b"a" * 3 * block)).status == 204
    # 3 blocks, and one more where the filesystem keeps the remembered sha256 out of the inode.
    used = os.stat(platform.root / "home" / "alice" / "a").st_blocks * 512
    assert 3 * block <= used <= 4 * block
    await platform.new_upload(alice, "/pfs/dc1/home/alice/b", 5 * block)  # 5 reserved
    left = 10 * block - used - 5 * block
    resp = await platform.create(alice, left + 1, metadata(path="/pfs/dc1/home/alice/c"))
    body = await problem(resp, 403, "ERR_QUOTA_EXCEEDED")
    figures = (body["requested"], body["used"], body["reserved"], body["limit"])
    assert figures == (left + 1, used, 5 * block, 10 * block)
    # The figures as a person reads them (the exact bytes are in the fields above).
    assert body["detail"] == (
        f"Uploading {readable_bytes(left + 1)} would take alice's storage over its quota of 40.0 KiB: "
        f"{readable_bytes(used)} in use, 20.0 KiB held by unfinished uploads."
    )
    # Exactly what is left still fits.
    await platform.new_upload(alice, "/pfs/dc1/home/alice/c", left)
    # Another user's quota is their own.
    bob = await platform.user("bob", storage=10)
    resp = await platform.create(bob, 11, metadata(path="/pfs/dc1/home/bob/x"))
    assert (await problem(resp, 403, "ERR_QUOTA_EXCEEDED"))["used"] == 0


async def test_quota_applies_when_a_deferred_length_is_declared(platform: Platform) -> None:
    alice = await platform.user("alice", storage=100)
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/d", None)
    resp = await platform.patch(alice, url, 0, b"x" * 10, **{"Upload-Length": "101"})
    body = await problem(resp, 403, "ERR_QUOTA_EXCEEDED")
    assert (body["requested"], body["limit"]) == (101, 100)
    assert await platform.offset(alice, url) == 0


# Resuming -----------------------------------------------------------------------


async def _cut_body(data: bytes, cut: int, pieces: int = 7) -> AsyncIterator[bytes]:
    """Yield `data` up to `cut` in a few pieces, then break the connection."""
    step = max(1, cut // pieces)
    for i in range(0, cut, step):
        yield data[i : min(i + step, cut)]
        await asyncio.sleep(0)
    raise ConnectionAbortedError("the client's connection broke")


async def test_upload_cut_at_random_points_then_resumed_is_byte_identical(platform: Platform) -> None:
    alice = await platform.user("alice")
    rng = random.Random(20261122)  # noqa: S311 - reproducible cut points, not secrets
    data = rng.randbytes(3 * 1024 * 1024 + 17)
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/cut/data.bin", len(data), sha256=sha256(data))
    offset = 0
    offsets = []
    for attempt in range(4):
        cut = rng.randrange(offset + 1, len(data))
        # Alternate between a declared length (the break is a short body) and chunked.
        headers = {"Content-Length": str(len(data) - offset)} if attempt % 2 else {}
        with contextlib.suppress(aiohttp.ClientError, ConnectionAbortedError):
            resp = await platform.patch(alice, url, offset, _cut_body(data[offset:], cut - offset), **headers)
            resp.release()
        # The HEAD also asks the broken PATCH to let go, should it not have noticed yet.
        new_offset = await platform.offset(alice, url)
        assert offset <= new_offset <= cut
        offset = new_offset
        offsets.append(offset)
    resp = await platform.patch(alice, url, offset, data[offset:])
    assert resp.status == 204, await resp.text()
    assert int(resp.headers["Upload-Offset"]) == len(data)
    assert resp.headers["PaddleCloud-Sha256"] == sha256(data)
    final = platform.home("alice") / "cut" / "data.bin"
    assert sha256(final.read_bytes()) == sha256(data)
    assert offsets == sorted(offsets) and offsets[-1] > 0
    # Complete and remembered: a client that lost the last answer learns it from HEAD.
    head = await platform.client.head(url, headers=alice)
    assert head.headers["Upload-Offset"] == str(len(data))
    assert head.headers["PaddleCloud-Sha256"] == sha256(data)
    assert [n for n in platform.staged() if not n.endswith(".info")] == []


async def test_replayed_patch_at_an_old_offset_is_409_and_changes_nothing(platform: Platform) -> None:
    alice = await platform.user("alice")
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/r.bin", 100)
    resp = await platform.patch(alice, url, 0, b"a" * 40)
    assert resp.status == 204 and resp.headers["Upload-Offset"] == "40"
    assert resp.headers["Upload-Expires"].endswith(" GMT")
    part = platform.root / ".uploads" / (url.rsplit("/", 1)[1] + ".part")
    for offset in (0, 39, 41, 100):
        resp = await platform.patch(alice, url, offset, b"b" * 10)
        body = await problem(resp, 409, "ERR_MISMATCHED_OFFSET")
        assert body["offset"] == 40
        assert part.stat().st_size == 40
    assert part.read_bytes() == b"a" * 40
    resp = await platform.patch(alice, url, 40, b"", **{"Upload-Offset": "-5"})
    await problem(resp, 400, "ERR_BAD_UPLOAD_HEADER")


async def test_a_completed_upload_answers_a_retried_last_patch(platform: Platform) -> None:
    alice = await platform.user("alice")
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/done.bin", 3)
    assert (await platform.patch(alice, url, 0, b"abc")).status == 204
    resp = await platform.patch(alice, url, 3, b"")
    assert resp.status == 204 and resp.headers["Upload-Offset"] == "3"
    await problem(await platform.patch(alice, url, 0, b"abc"), 409, "ERR_MISMATCHED_OFFSET")


async def test_bytes_sent_to_a_completed_upload_are_refused_not_dropped(platform: Platform) -> None:
    alice = await platform.user("alice")
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/full.bin", 3)
    assert (await platform.patch(alice, url, 0, b"abc")).status == 204

    async def chunked() -> AsyncIterator[bytes]:
        yield b"more"

    for body in (b"def", chunked()):
        resp = await platform.patch(alice, url, 3, body)
        answer = await problem(resp, 413, "ERR_UPLOAD_TOO_LARGE")
        assert "complete at 3 bytes" in answer["detail"], answer
        assert resp.headers["Tus-Resumable"] == "1.0.0"
    assert (platform.home("alice") / "full.bin").read_bytes() == b"abc"
    # An empty retry of the last PATCH is still answered as before.
    assert (await platform.patch(alice, url, 3, b"")).status == 204


# Checksums and limits -----------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["sha1", "sha256", "crc32"])
async def test_chunk_checksums(platform: Platform, algorithm: str) -> None:
    alice = await platform.user("alice")
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/c.bin", 20)
    good, bad = b"0123456789", b"9876543210"
    resp = await platform.patch(alice, url, 0, good, **{"Upload-Checksum": checksum(algorithm, good)})
    assert resp.status == 204 and resp.headers["Upload-Offset"] == "10"
    resp = await platform.patch(alice, url, 10, bad, **{"Upload-Checksum": checksum(algorithm, good)})
    await problem(resp, 460, "ERR_CHECKSUM_MISMATCH")
    assert resp.reason == "Checksum Mismatch"
    assert await platform.offset(alice, url) == 10
    part = platform.root / ".uploads" / (url.rsplit("/", 1)[1] + ".part")
    assert part.read_bytes() == good
    resp = await platform.patch(alice, url, 10, bad, **{"Upload-Checksum": checksum(algorithm, bad)})
    assert resp.status == 204
    assert (platform.home("alice") / "c.bin").read_bytes() == good + bad
    # The running whole-file hash was rolled back with the chunk.
    assert resp.headers["PaddleCloud-Sha256"] == sha256(good + bad)


async def test_chunks_longer_than_a_hash_batch(platform: Platform, monkeypatch: pytest.MonkeyPatch) -> None:
    # Bodies are hashed back from the staging file a batch at a time, the last batch while
    # the chunk is synced; a chunk spanning several batches must verify like a short one.
    monkeypatch.setattr("paddlecloud.pfs.uploads.HASH_BATCH", 4096)
    monkeypatch.setattr("paddlecloud.pfs.uploads.HASH_READ_BLOCK", 1000)
    alice = await platform.user("alice")
    first, second = os.urandom(50_000), os.urandom(30_001)
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/batches.bin", len(first) + len(second))

    def pieces(data: bytes) -> Callable[[], AsyncIterator[bytes]]:
        async def body() -> AsyncIterator[bytes]:
            for at in range(0, len(data), 3_000):
                yield data[at : at + 3_000]

        return body

    resp = await platform.patch(
        alice, url, 0, pieces(first)(), **{"Upload-Checksum": checksum("sha256", first)}
    )
    assert resp.status == 204 and resp.headers["Upload-Offset"] == str(len(first))
    damaged = second[:-1] + bytes([second[-1] ^ 1])
    resp = await platform.patch(
        alice, url, len(first), pieces(damaged)(), **{"Upload-Checksum": checksum("sha256", second)}
    )
    await problem(resp, 460, "ERR_CHECKSUM_MISMATCH")
    assert await platform.offset(alice, url) == len(first)
    resp = await platform.patch(
        alice, url, len(first), pieces(second)(), **{"Upload-Checksum": checksum("sha1", second)}
    )
    assert resp.status == 204
    assert resp.headers["PaddleCloud-Sha256"] == sha256(first + second)
    assert (platform.home("alice") / "batches.bin").read_bytes() == first + second


@pytest.mark.parametrize(
    ("value", "status", "code"),
    [
        ("md5 " + base64.b64encode(bytes(16)).decode(), 400, "ERR_CHECKSUM_ALGORITHM"),
        ("SHA1 " + base64.b64encode(bytes(20)).decode(), 400, "ERR_CHECKSUM_ALGORITHM"),
        ("sha1 not-base64", 400, "ERR_BAD_UPLOAD_HEADER"),
        ("sha256 " + base64.b64encode(b"short").decode(), 400, "ERR_BAD_UPLOAD_HEADER"),
        ("crc32 " + base64.b64encode(bytes(8)).decode(), 400, "ERR_BAD_UPLOAD_HEADER"),
        ("CRC32 " + base64.b64encode(bytes(4)).decode(), 400, "ERR_CHECKSUM_ALGORITHM"),
    ],
)
async def test_bad_checksum_headers_are_400(platform: Platform, value: str, status: int, code: str) -> None:
    alice = await platform.user("alice")
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/c.bin", 20)
    resp = await platform.patch(alice, url, 0, b"x", **{"Upload-Checksum": value})
    body = await problem(resp, status, code)
    if code == "ERR_CHECKSUM_ALGORITHM":
        assert resp.headers["Tus-Checksum-Algorithm"] == "sha1,sha256,crc32"
    assert body["detail"]
    assert await platform.offset(alice, url) == 0


async def test_wrong_content_type_is_415(platform: Platform) -> None:
    alice = await platform.user("alice")
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/t.bin", 4)
    for content_type in ("application/octet-stream", "text/plain"):
        resp = await platform.client.patch(
            url, data=b"abcd", headers={**alice, "Content-Type": content_type, "Upload-Offset": "0"}
        )
        await problem(resp, 415, "ERR_UNSUPPORTED_MEDIA_TYPE")
    assert await platform.offset(alice, url) == 0


async def test_body_past_the_upload_length_is_never_written(platform: Platform) -> None:
    alice = await platform.user("alice")
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/l.bin", 10)
    # A declared body that does not fit is refused before a byte is written.
    resp = await platform.patch(alice, url, 0, b"x" * 11)
    await problem(resp, 413, "ERR_UPLOAD_TOO_LARGE")
    assert await platform.offset(alice, url) == 0

    # A chunked body is read up to the upload's end and no further.
    async def chunks() -> AsyncIterator[bytes]:
        yield b"0123456"
        yield b"789abcdef"

    resp = await platform.patch(alice, url, 0, chunks())
    assert resp.status == 204, await resp.text()
    assert resp.headers["Upload-Offset"] == "10"
    assert (platform.home("alice") / "l.bin").read_bytes() == b"0123456789"


async def test_whole_file_sha256_mismatch_is_460_and_nothing_appears(platform: Platform) -> None:
    alice = await platform.user("alice")
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/s.bin", 6, sha256=sha256(b"abcdef"))
    assert (await platform.patch(alice, url, 0, b"abc")).status == 204
    resp = await platform.patch(alice, url, 3, b"xyz")
    body = await problem(resp, 460, "ERR_CHECKSUM_MISMATCH")
    assert body["expected"] == sha256(b"abcdef") and body["received"] == sha256(b"abcxyz")
    assert not (platform.home("alice") / "s.bin").exists()
    assert [n for n in platform.staged() if not n.endswith(".info")] == []
    # The upload failed for good; a client has to start over.
    resp = await platform.client.head(url, headers=alice)
    assert resp.status == 410 and "Upload-Offset" not in resp.headers
    await problem(await platform.patch(alice, url, 3, b"def"), 410, "ERR_UPLOAD_FAILED")


# Destinations -------------------------------------------------------------------


async def test_existing_destination_without_overwrite_is_409(platform: Platform) -> None:
    alice = await platform.user("alice")
    home = platform.home("alice")
    home.mkdir(parents=True)
    (home / "exists.txt").write_bytes(b"old")
    (home / "adir").mkdir()
    for path in (
        "/pfs/dc1/home/alice/exists.txt",
        "/pfs/dc1/home/alice/adir",
        "/pfs/dc1/home/alice/exists.txt/x",
    ):
        resp = await platform.create(alice, 3, metadata(path=path))
        await problem(resp, 409, "ERR_ALREADY_EXISTS" if path.endswith("exists.txt") else "ERR_CONFLICT")
    assert platform.staged() == []
    assert (home / "exists.txt").read_bytes() == b"old"


async def test_destination_taken_during_the_upload_is_409_at_completion(platform: Platform) -> None:
    alice = await platform.user("alice")
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/race.txt", 3)
    assert (await platform.patch(alice, url, 0, b"ne")).status == 204
    (platform.home("alice")).mkdir(parents=True, exist_ok=True)
    (platform.home("alice") / "race.txt").write_bytes(b"theirs")
    resp = await platform.patch(alice, url, 2, b"w")
    await problem(resp, 409, "ERR_ALREADY_EXISTS")
    assert (platform.home("alice") / "race.txt").read_bytes() == b"theirs"
    assert (await platform.client.head(url, headers=alice)).status == 410


async def test_overwrite_replaces_the_destination_atomically(platform: Platform) -> None:
    alice = await platform.user("alice")
    home = platform.home("alice")
    home.mkdir(parents=True)
    (home / "f.txt").write_bytes(b"old contents")
    before = (home / "f.txt").stat().st_ino
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/f.txt", 3, overwrite="1")
    assert (await platform.patch(alice, url, 0, b"new")).status == 204
    after = home / "f.txt"
    assert after.read_bytes() == b"new"
    # Renamed into place, never rewritten in place: readers saw the old or the new file.
    assert after.stat().st_ino != before
    remembered = os.getxattr(after, SHA256_XATTR)
    assert sha256(b"new").encode() in remembered


async def test_parents_are_created_and_public_is_for_admins(platform: Platform) -> None:
    alice = await platform.user("alice")
    admin = await platform.user("root", admin=True)
    resp = await platform.create(alice, 1, metadata(path="/pfs/dc1/public/p.txt"))
    await problem(resp, 403, "ERR_PATH_FORBIDDEN")
    resp = await platform.create(alice, 1, metadata(path="/pfs/dc1/home/bob/p.txt"))
    await problem(resp, 403, "ERR_PATH_FORBIDDEN")
    assert platform.staged() == []
    url = await platform.new_upload(admin, "/pfs/dc1/public/a/b/p.txt", 1)
    assert (await platform.patch(admin, url, 0, b"p")).status == 204
    assert (platform.root / "public" / "a" / "b" / "p.txt").read_bytes() == b"p"
    # Admins may write into a user's home (made on the way).
    url = await platform.new_upload(admin, "/pfs/dc1/home/carol/deep/er/x.txt", 1)
    assert (await platform.patch(admin, url, 0, b"x")).status == 204
    assert (platform.home("carol") / "deep" / "er" / "x.txt").read_bytes() == b"x"


@pytest.mark.parametrize("text", TRAVERSALS)
async def test_traversal_in_the_path_metadata_is_refused(platform: Platform, text: str) -> None:
    alice = await platform.user("alice")
    before = sorted(p for p in platform.root.rglob("*"))
    resp = await platform.create(alice, 1, metadata(path=text))
    assert resp.status in (400, 403, 404), await resp.text()
    assert resp.content_type == PROBLEM
    assert platform.staged() == []
    assert sorted(p for p in platform.root.rglob("*")) == before


async def test_a_symlink_out_of_the_home_is_not_followed(platform: Platform, tmp_path: Path) -> None:
    alice = await platform.user("alice")
    outside = tmp_path / "outside"
    outside.mkdir()
    platform.home("alice").mkdir(parents=True)
    (platform.home("alice") / "escape").symlink_to(outside)
    resp = await platform.create(alice, 1, metadata(path="/pfs/dc1/home/alice/escape/x"))
    await problem(resp, 403, "ERR_PATH_FORBIDDEN")
    assert list(outside.iterdir()) == []


# Ownership, termination, expiry -------------------------------------------------


async def test_uploads_belong_to_their_creator(platform: Platform) -> None:
    alice = await platform.user("alice")
    bob = await platform.user("bob")
    admin = await platform.user("root", admin=True)
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/mine", 4)
    assert (await platform.patch(alice, url, 0, b"ab")).status == 204
    for other in (bob, admin):
        await problem(await platform.client.head(url, headers=other), 404, "ERR_UPLOAD_NOT_FOUND")
        await problem(await platform.patch(other, url, 2, b"cd"), 404, "ERR_UPLOAD_NOT_FOUND")
        await problem(await platform.client.delete(url, headers=other), 404, "ERR_UPLOAD_NOT_FOUND")
    assert await platform.offset(alice, url) == 2
    for bogus in ("x", "../../etc", "A" * 32):
        resp = await platform.client.head(f"{UPLOADS_URL}/{bogus}", headers=alice)
        assert resp.status == 404


async def test_termination(platform: Platform) -> None:
    alice = await platform.user("alice")
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/t", 10)
    assert (await platform.patch(alice, url, 0, b"abc")).status == 204
    assert platform.staged() != []
    resp = await platform.client.delete(url, headers=alice)
    assert resp.status == 204 and resp.headers["Tus-Resumable"] == "1.0.0"
    assert platform.staged() == []
    await problem(await platform.client.head(url, headers=alice), 404, "ERR_UPLOAD_NOT_FOUND")
    await problem(await platform.patch(alice, url, 3, b"d"), 404, "ERR_UPLOAD_NOT_FOUND")
    await problem(await platform.client.delete(url, headers=alice), 404, "ERR_UPLOAD_NOT_FOUND")
    # Terminating a finished upload forgets it; the file it made stays.
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/kept", 1)
    assert (await platform.patch(alice, url, 0, b"k")).status == 204
    assert (await platform.client.delete(url, headers=alice)).status == 204
    assert (platform.home("alice") / "kept").read_bytes() == b"k"
    assert platform.staged() == []


async def test_expired_uploads_are_collected(platform: Platform) -> None:
    alice = await platform.user("alice")
    stale = await platform.new_upload(alice, "/pfs/dc1/home/alice/stale", 10)
    assert (await platform.patch(alice, stale, 0, b"abc")).status == 204
    done = await platform.new_upload(alice, "/pfs/dc1/home/alice/done", 1)
    assert (await platform.patch(alice, done, 0, b"d")).status == 204
    stale_id = stale.rsplit("/", 1)[1]
    # Not yet: nothing is touched.
    assert await platform.uploads.collect(now=time.time() + EXPIRY / 2) == 0
    assert f"{stale_id}.part" in platform.staged()
    # Past its expiry an upload is refused even before the collector gets to it.
    platform.uploads.clock = lambda: time.time() + EXPIRY + 60
    await problem(await platform.patch(alice, stale, 3, b"d"), 410, "ERR_UPLOAD_EXPIRED")
    platform.uploads.clock = time.time
    # Past the expiry, the stale upload's data goes and it answers 410 while it is
    # remembered; the finished one is forgotten (its file stays).
    assert await platform.uploads.collect(now=time.time() + EXPIRY + 60) == 2
    assert f"{stale_id}.part" not in platform.staged()
    await problem(await platform.client.head(stale, headers=alice), 410, "ERR_UPLOAD_EXPIRED")
    await problem(await platform.patch(alice, stale, 3, b"d"), 410, "ERR_UPLOAD_EXPIRED")
    await problem(await platform.client.head(done, headers=alice), 404, "ERR_UPLOAD_NOT_FOUND")
    assert (platform.home("alice") / "done").read_bytes() == b"d"
    # Later still, the expired one is forgotten too: 404, and the directory is empty.
    assert await platform.uploads.collect(now=time.time() + 3 * EXPIRY) == 1
    assert platform.staged() == []
    await problem(await platform.client.head(stale, headers=alice), 404, "ERR_UPLOAD_NOT_FOUND")


async def test_orphaned_staging_files_are_collected(platform: Platform) -> None:
    orphan = platform.root / ".uploads" / "orphan-from-a-crash.part"
    orphan.write_bytes(b"x")
    assert await platform.uploads.collect(now=time.time() + EXPIRY / 2) == 0
    assert await platform.uploads.collect(now=time.time() + EXPIRY + 60) == 1
    assert not orphan.exists()


# Interruptions, restarts, full disks --------------------------------------------


async def test_a_stale_patch_does_not_block_the_client_that_comes_back(platform: Platform) -> None:
    alice = await platform.user("alice")
    data = os.urandom(256 * 1024)
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/stale.bin", len(data))
    sent = asyncio.Event()
    never = asyncio.Event()

    async def stalls() -> AsyncIterator[bytes]:
        yield data[:100_000]
        sent.set()
        await never.wait()  # the connection stays open and silent
        yield data[100_000:]

    async def stale_patch() -> int:
        resp = await platform.patch(alice, url, 0, stalls(), **{"Content-Length": str(len(data))})
        return resp.status

    stale = asyncio.create_task(stale_patch())
    part = platform.root / ".uploads" / (url.rsplit("/", 1)[1] + ".part")
    try:
        await sent.wait()
        deadline = time.monotonic() + 20
        while part.stat().st_size < 100_000:  # still on its way through the gateway
            assert time.monotonic() < deadline, "the first bytes never arrived"
            await asyncio.sleep(0.01)
        # The HEAD makes the stale PATCH let go (the read timeout is a minute away): it
        # reports the durable offset instead of waiting behind the dead connection.
        async with asyncio.timeout(20):
            offset = await platform.offset(alice, url)
        assert offset == 100_000
        # The stale PATCH was told why it stopped, had anyone still been listening.
        assert await stale == 400
        resp = await platform.patch(alice, url, offset, data[offset:])
        assert resp.status == 204, await resp.text()
        assert (platform.home("alice") / "stale.bin").read_bytes() == data
    finally:
        never.set()
        stale.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
            await stale


async def test_a_body_that_stalls_times_out_and_keeps_what_arrived(make_platform) -> None:
    platform = await make_platform(upload_read_timeout=0.3)
    alice = await platform.user("alice")
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/slow.bin", 100)
    never = asyncio.Event()

    async def stalls() -> AsyncIterator[bytes]:
        yield b"x" * 30
        await never.wait()
        yield b"x" * 70

    try:
        resp = await platform.patch(alice, url, 0, stalls(), **{"Content-Length": "100"})
        await problem(resp, 408, "ERR_READ_TIMEOUT")
    finally:
        never.set()
    assert await platform.offset(alice, url) == 30
    assert (await platform.patch(alice, url, 30, b"y" * 70)).status == 204
    assert (platform.home("alice") / "slow.bin").read_bytes() == b"x" * 30 + b"y" * 70


async def test_an_upload_resumes_across_a_restart(platform: Platform) -> None:
    alice = await platform.user("alice")
    data = os.urandom(300_000)
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/restart.bin", len(data), sha256=sha256(data))
    assert (await platform.patch(alice, url, 0, data[:123_456])).status == 204
    await platform.restart_pfs()
    assert await platform.offset(alice, url) == 123_456
    resp = await platform.patch(alice, url, 123_456, data[123_456:])
    assert resp.status == 204, await resp.text()
    # The running hash died with the process: the file was hashed again from disk.
    assert resp.headers["PaddleCloud-Sha256"] == sha256(data)
    assert (platform.home("alice") / "restart.bin").read_bytes() == data


async def test_a_crash_after_the_rename_is_finished_by_the_next_head(platform: Platform) -> None:
    alice = await platform.user("alice")
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/moved.bin", 5)
    upload_id = url.rsplit("/", 1)[1]
    assert (await platform.patch(alice, url, 0, b"abcd")).status == 204
    # What a crash between the final rename and the record's update leaves behind:
    part = platform.root / ".uploads" / f"{upload_id}.part"
    with part.open("ab") as f:
        f.write(b"e")
    platform.home("alice").mkdir(parents=True)
    part.rename(platform.home("alice") / "moved.bin")
    await platform.restart_pfs()
    head = await platform.client.head(url, headers=alice)
    assert head.status == 200, await head.text()
    assert head.headers["Upload-Offset"] == "5"
    assert head.headers["PaddleCloud-Sha256"] == sha256(b"abcde")


async def test_a_full_disk_is_507_and_what_was_stored_stays_resumable(make_platform, tmp_path: Path) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {result.stderr.strip() or result.returncode}")
    try:
        platform = await make_platform(root=mount)
        alice = await platform.user("alice")
        data = os.urandom(3 * 1024 * 1024)
        url = await platform.new_upload(alice, "/pfs/dc1/home/alice/big.bin", len(data))
        resp = await platform.patch(alice, url, 0, data)
        await problem(resp, 507, "ERR_STORAGE_FULL")
        offset = await platform.offset(alice, url)
        assert 0 < offset <= 2 * 1024 * 1024
        part = mount / ".uploads" / (url.rsplit("/", 1)[1] + ".part")
        assert part.read_bytes() == data[:offset]
        assert not (platform.home("alice") / "big.bin").exists()
        # A checksummed chunk that cannot be stored whole is not stored at all.
        resp = await platform.patch(
            alice, url, offset, data[offset:], **{"Upload-Checksum": checksum("sha256", data[offset:])}
        )
        await problem(resp, 507, "ERR_STORAGE_FULL")
        assert await platform.offset(alice, url) == offset
        # Once there is room again, the upload goes on from there.
        assert (await platform.client.delete(url, headers=alice)).status == 204
        url = await platform.new_upload(alice, "/pfs/dc1/home/alice/fits.bin", 1024 * 1024)
        assert (await platform.patch(alice, url, 0, data[: 1024 * 1024])).status == 204
        assert (platform.home("alice") / "fits.bin").read_bytes() == data[: 1024 * 1024]
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


# The append-only staging that a mount without truncate (HDFS) uses ---------------


async def test_staged_chunks_are_appended_only_once_verified(tmp_path: Path) -> None:
    staging = PosixStaging(tmp_path, can_truncate=False)
    try:
        await staging.create_part("u")
        fd = staging.open_part("u")
        try:
            writer = staging.writer("u", fd, 0, verify=True)
            writer.write(b"good")
            assert await staging.part_size("u") == 0  # not before it verified
            writer.commit()
            assert await staging.part_size("u") == 4
            writer = staging.writer("u", fd, 4, verify=True)
            writer.write(b"bad")
            writer.discard()
            assert await staging.part_size("u") == 4
            assert sorted(os.listdir(tmp_path)) == ["u.part"]
            # Unverified chunks go straight on, as everywhere.
            staging.writer("u", fd, 4, verify=False).write(b"more")
        finally:
            os.close(fd)
        assert (tmp_path / "u.part").read_bytes() == b"goodmore"
    finally:
        staging.close()


# An independent client ------------------------------------------------------------


async def test_tuspy_uploads_and_resumes_through_the_gateway(platform: Platform, tmp_path: Path) -> None:
    tusclient = pytest.importorskip("tusclient.client")
    storage = pytest.importorskip("tusclient.storage.filestorage")
    alice = await platform.user("alice")
    token = alice["Authorization"]
    endpoint = str(platform.client.make_url(UPLOADS_URL))
    data = os.urandom(1024 * 1024 + 3)
    source = tmp_path / "source.bin"
    source.write_bytes(data)
    urls = storage.FileStorage(str(tmp_path / "urls.json"))

    def upload(stop_at: int | None, path: str) -> str:
        client = tusclient.TusClient(endpoint, headers={"Authorization": token})
        uploader = client.uploader(
            str(source),
            chunk_size=200_000,
            metadata={"path": path, "filename": "source.bin"},
            store_url=True,
            url_storage=urls,
            upload_checksum=True,
        )
        uploader.upload(stop_at=stop_at)
        return str(uploader.url)

    # Interrupted after the first chunks, then resumed by a new uploader from the stored URL.
    first = await asyncio.to_thread(upload, 400_000, "/pfs/dc1/home/alice/tus/source.bin")
    assert await platform.offset(alice, URL(first).path) == 400_000
    assert not (platform.home("alice") / "tus" / "source.bin").exists()
    second = await asyncio.to_thread(upload, None, "/pfs/dc1/home/alice/tus/source.bin")
    assert second == first
    assert sha256((platform.home("alice") / "tus" / "source.bin").read_bytes()) == sha256(data)
