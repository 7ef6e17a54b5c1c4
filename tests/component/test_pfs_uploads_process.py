"""tus uploads against pfs and the gateway run as real processes: kills, restarts, load, and size.

pfs here is served the way production serves it (handlers are not cancelled when a client
goes away), so a broken connection reaches the upload code as a read error, and a SIGKILL
is a real crash.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import secrets
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from paddlecloud.common import internal_auth
from paddlecloud.common.config import load_config
from paddlecloud.common.store import Token, User, open_store
from paddlecloud.common.store.models import utcnow
from paddlecloud.gateway.accounts import hash_token
from support import INTERNAL_SECRET, ServiceProcess, pattern_sha256, write_config

pytestmark = pytest.mark.slow

MIB = 2**20
GIB = 2**30
BLOCK = bytes(range(256)) * 4096  # 1 MiB; the same pattern as support.pattern_sha256
OCTET = "application/offset+octet-stream"
UPLOADS = "/api/v1/pfs/uploads"
MEMORY_BUDGET_MIB = 100


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def pattern(size: int, *, start: int = 0) -> AsyncIterator[bytes]:
    """`size` bytes of the repeating pattern from offset `start`, a block at a time."""
    sent = 0
    while sent < size:
        at = (start + sent) % len(BLOCK)
        piece = BLOCK[at : at + min(len(BLOCK) - at, size - sent)]
        yield piece
        sent += len(piece)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(4 * MIB):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class Platform:
    tmp_path: Path
    pfs: ServiceProcess
    gateway: ServiceProcess
    root: Path
    headers: dict[str, str]

    def start(self) -> None:
        """(Re)start pfs, then the gateway pointed at wherever pfs now listens."""
        write_config(self.tmp_path, pfs={"datacenter": "dc1"}, gateway={"admin_password": None})
        self.pfs.start()
        write_config(
            self.tmp_path,
            pfs={"datacenter": "dc1"},
            gateway={"admin_password": None, "pfs_url": self.pfs.url},
        )
        self.gateway.stop()
        self.gateway.start()

    def url(self, path: str = UPLOADS) -> str:
        return self.gateway.url + path

    async def create(self, session: aiohttp.ClientSession, path: str, length: int, **extra: str) -> str:
        headers = {**self.headers, "Upload-Length": str(length), "Upload-Metadata": f"path {b64(path)}"}
        async with session.post(self.url(), headers={**headers, **extra}) as resp:
            assert resp.status == 201, await resp.text()
            return str(resp.headers["Location"])

    async def offset(self, session: aiohttp.ClientSession, location: str) -> int:
        async with session.head(self.url(location), headers=self.headers) as resp:
            assert resp.status == 200, resp.status
            return int(resp.headers["Upload-Offset"])

    async def patch(
        self, session: aiohttp.ClientSession, location: str, offset: int, body: Any, length: int
    ) -> aiohttp.ClientResponse:
        headers = {
            **self.headers,
            "Content-Type": OCTET,
            "Upload-Offset": str(offset),
            "Content-Length": str(length),
        }
        async with session.patch(self.url(location), data=body, headers=headers) as resp:
            await resp.read()
            return resp


@pytest.fixture
async def platform(tmp_path: Path) -> AsyncIterator[Platform]:
    config = load_config(write_config(tmp_path, pfs={"datacenter": "dc1"}), env={})
    store = open_store(config.store_url())
    await store.open()
    try:
        token = "pc_process-test-token"
        await store.create_user(User("alice", "unused"))
        await store.add_token(Token(hash_token(token), "alice", expires_at=utcnow() + timedelta(hours=1)))
    finally:
        await store.close()
    pfs = ServiceProcess("pfs", tmp_path / "paddlecloud.yaml", tmp_path)
    gateway = ServiceProcess("gateway", tmp_path / "paddlecloud.yaml", tmp_path)
    headers = {"Authorization": f"Bearer {token}", "Tus-Resumable": "1.0.0"}
    platform = Platform(tmp_path, pfs, gateway, config.pfs.root, headers)
    try:
        platform.start()
        yield platform
    finally:
        gateway.stop()
        pfs.stop()


def wait_for(predicate: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.01)


async def test_kill_mid_upload_then_restart_and_resume(platform: Platform) -> None:
    size = 64 * MIB
    dest = platform.root / "home" / "alice" / "killed.bin"
    async with aiohttp.ClientSession() as session:
        location = await platform.create(session, "/pfs/dc1/home/alice/killed.bin", size)
        part = platform.root / ".uploads" / (location.rsplit("/", 1)[1] + ".part")
        release = asyncio.Event()

        async def first_half() -> AsyncIterator[bytes]:
            async for piece in pattern(size // 2):
                yield piece
            await release.wait()  # mid-body when pfs is killed

        sending = asyncio.create_task(platform.patch(session, location, 0, first_half(), size))
        try:
            await asyncio.to_thread(
                wait_for, lambda: part.exists() and part.stat().st_size >= size // 4, "the first bytes"
            )
            assert platform.pfs.process is not None
            platform.pfs.process.send_signal(signal.SIGKILL)
            platform.pfs.process.wait()
            resp = await sending
            assert resp.status in (500, 502, 503)  # the gateway lost pfs mid-request
        finally:
            release.set()
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                await sending
        kept = part.stat().st_size
        assert size // 4 <= kept <= size // 2

        await asyncio.to_thread(platform.start)
        offset = await platform.offset(session, location)
        assert offset == kept
        resp = await platform.patch(
            session, location, offset, pattern(size - offset, start=offset), size - offset
        )
        assert resp.status == 204
        assert resp.headers["PaddleCloud-Sha256"] == pattern_sha256(size)
    assert await asyncio.to_thread(file_sha256, dest) == pattern_sha256(size)


async def test_a_broken_connection_keeps_what_arrived(platform: Platform) -> None:
    size = 8 * MIB
    async with aiohttp.ClientSession() as session:
        location = await platform.create(session, "/pfs/dc1/home/alice/broken.bin", size)

        async def breaks() -> AsyncIterator[bytes]:
            async for piece in pattern(3 * MIB):
                yield piece
            raise ConnectionAbortedError("the client's connection broke")

        with contextlib.suppress(aiohttp.ClientError, ConnectionAbortedError):
            await platform.patch(session, location, 0, breaks(), size)
        offset = await platform.offset(session, location)
        assert 0 < offset <= 3 * MIB
        resp = await platform.patch(
            session, location, offset, pattern(size - offset, start=offset), size - offset
        )
        assert resp.status == 204
    final = platform.root / "home" / "alice" / "broken.bin"
    assert await asyncio.to_thread(file_sha256, final) == pattern_sha256(size)


async def test_a_zero_byte_file(platform: Platform) -> None:
    async with aiohttp.ClientSession() as session:
        location = await platform.create(session, "/pfs/dc1/home/alice/empty", 0)
        assert await platform.offset(session, location) == 0
    final = platform.root / "home" / "alice" / "empty"
    assert final.is_file() and final.stat().st_size == 0


async def test_32_concurrent_uploads_in_flat_memory(platform: Platform, report_figure) -> None:
    count, size = 32, 32 * MIB
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=count)) as session:
        # Warm up the upload path so that lazily made buffers and threads count in the baseline.
        for i in range(3):
            location = await platform.create(session, f"/pfs/dc1/home/alice/warm/{i}", MIB)
            assert (await platform.patch(session, location, 0, pattern(MIB), MIB)).status == 204
        platform.pfs.reset_peak_memory()
        before = platform.pfs.memory_kib()["VmRSS"]

        async def one(i: int) -> int:
            location = await platform.create(session, f"/pfs/dc1/home/alice/many/{i}.bin", size)
            return (await platform.patch(session, location, 0, pattern(size), size)).status

        started = time.perf_counter()
        statuses = await asyncio.gather(*(one(i) for i in range(count)))
        elapsed = time.perf_counter() - started
        peak = platform.pfs.memory_kib()["VmHWM"]
    assert statuses == [204] * count
    directory = platform.root / "home" / "alice" / "many"
    assert sorted(p.name for p in directory.iterdir()) == sorted(f"{i}.bin" for i in range(count))
    expected = pattern_sha256(size)
    for i in (0, count // 2, count - 1):
        assert await asyncio.to_thread(file_sha256, directory / f"{i}.bin") == expected
    assert all((directory / f"{i}.bin").stat().st_size == size for i in range(count))
    growth = (peak - before) / 1024
    report_figure(
        f"pfs uploads: {count} x {size // MIB} MiB at once through the gateway in {elapsed:.1f} s "
        f"({count * size / MIB / elapsed:.0f} MiB/s); pfs RSS before {before / 1024:.1f} MiB, "
        f"peak {peak / 1024:.1f} MiB, growth {growth:.1f} MiB (budget {MEMORY_BUDGET_MIB} MiB)"
    )
    assert growth < MEMORY_BUDGET_MIB


async def test_an_upload_over_4_gib_straight_to_pfs(platform: Platform, report_figure) -> None:
    size = 4 * GIB + MIB
    secret = INTERNAL_SECRET.encode()
    alice = internal_auth.Identity("alice")

    def signed(method: str, path: str) -> dict[str, str]:
        request_id = secrets.token_hex(8)
        return {
            "X-Request-ID": request_id,
            "Tus-Resumable": "1.0.0",
            **internal_auth.sign(secret, alice, request_id, method, path),
        }

    final = platform.root / "home" / "alice" / "big.bin"
    try:
        async with aiohttp.ClientSession(base_url=platform.pfs.url) as session:
            headers = signed("POST", UPLOADS)
            headers.update(
                {"Upload-Length": str(size), "Upload-Metadata": f"path {b64('/pfs/dc1/home/alice/big.bin')}"}
            )
            async with session.post(UPLOADS, headers=headers) as resp:
                assert resp.status == 201, await resp.text()
                location = resp.headers["Location"]
            headers = signed("PATCH", location)
            headers.update({"Content-Type": OCTET, "Upload-Offset": "0", "Content-Length": str(size)})
            sent = hashlib.sha256()

            async def body() -> AsyncIterator[bytes]:
                async for piece in pattern(size):
                    sent.update(piece)
                    yield piece

            started = time.perf_counter()
            async with session.patch(location, data=body(), headers=headers) as resp:
                assert resp.status == 204, await resp.text()
                assert resp.headers["Upload-Offset"] == str(size)
                reported = resp.headers["PaddleCloud-Sha256"]
            elapsed = time.perf_counter() - started
        assert final.stat().st_size == size
        actual = await asyncio.to_thread(file_sha256, final)
        assert actual == reported == sent.hexdigest()
        report_figure(
            f"pfs uploads: {size / GIB:.3f} GiB in one PATCH straight to pfs in {elapsed:.1f} s "
            f"({size / MIB / elapsed:.0f} MiB/s, fsynced)"
        )
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(final)
