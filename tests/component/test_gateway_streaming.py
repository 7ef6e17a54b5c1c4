"""Streaming through a gateway process: a gigabyte each way in flat memory, and a caller that hangs up."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from support import (
    ADMIN_PASSWORD,
    TRICKLE_ASKED,
    TRICKLE_RELEASE,
    ServiceProcess,
    create_upstream_app,
    make_config,
    pattern_sha256,
    write_config,
)

GIB = 2**30
BLOCK = bytes(range(256)) * 4096  # 1 MiB
MEMORY_BUDGET_MIB = 64

pytestmark = pytest.mark.slow


@pytest.fixture
def gateway_process(tmp_path, request) -> Iterator[ServiceProcess]:
    process = ServiceProcess("gateway", tmp_path / "unused.yaml", tmp_path)
    yield process
    process.stop()


async def body(size: int) -> AsyncIterator[bytes]:
    sent = 0
    while sent < size:
        piece = BLOCK[: min(len(BLOCK), size - sent)]
        yield piece
        sent += len(piece)


async def start_in_front_of_pfs(
    gateway: ServiceProcess, tmp_path: Path, aiohttp_server: Any, app: Any = None
) -> str:
    """Start the gateway process with a test upstream as its pfs service; its URL."""
    upstream = await aiohttp_server(app or create_upstream_app(make_config(tmp_path), "pfs"))
    gateway.config_path = write_config(tmp_path, gateway={"pfs_url": str(upstream.make_url(""))})
    gateway.start()
    return gateway.url


async def logged(gateway: ServiceProcess, event: str, timeout: float = 10.0) -> str:
    """The gateway's log once it holds `event` (its JSON log lines name events)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        text = gateway.log_path.read_text(errors="replace")
        if f'"{event}"' in text or asyncio.get_running_loop().time() > deadline:
            return text
        await asyncio.sleep(0.05)


async def admin_headers(session: aiohttp.ClientSession, url: str) -> dict[str, str]:
    async with session.post(
        f"{url}/api/v1/auth/token", json={"username": "admin", "password": ADMIN_PASSWORD}
    ) as resp:
        return {"Authorization": f"Bearer {(await resp.json())['token']}"}


async def test_gigabyte_streams_both_ways_in_flat_memory(
    tmp_path, aiohttp_server, gateway_process: ServiceProcess, report_figure
) -> None:
    url = await start_in_front_of_pfs(gateway_process, tmp_path, aiohttp_server)
    async with aiohttp.ClientSession() as session:
        headers = await admin_headers(session, url)
        # Warm up the proxy path so that lazily created buffers count in the baseline.
        for _ in range(3):
            async with session.put(f"{url}/api/v1/pfs/sink", data=b"x" * 65536, headers=headers) as resp:
                assert resp.status == 200
        # Startup and login peak far higher (argon2 hashes with 64 MiB), so measure
        # the transfers' own peak from here.
        gateway_process.reset_peak_memory()
        before = gateway_process.memory_kib()["VmRSS"]

        async with session.put(
            f"{url}/api/v1/pfs/sink",
            data=body(GIB),
            headers={**headers, "Content-Length": str(GIB)},
        ) as resp:
            assert resp.status == 200, await resp.text()
            received = await resp.json()
        assert received == {"size": GIB, "sha256": pattern_sha256(GIB)}

        digest, size = hashlib.sha256(), 0
        async with session.get(f"{url}/api/v1/pfs/source?size={GIB}", headers=headers) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Length"] == str(GIB)
            async for chunk in resp.content.iter_any():
                digest.update(chunk)
                size += len(chunk)
        assert (size, digest.hexdigest()) == (GIB, pattern_sha256(GIB))

    peak = gateway_process.memory_kib()["VmHWM"]
    growth_mib = (peak - before) / 1024
    report_figure(
        f"gateway streaming: 1 GiB up and 1 GiB down; RSS before {before / 1024:.1f} MiB, "
        f"peak {peak / 1024:.1f} MiB, growth {growth_mib:.1f} MiB (budget {MEMORY_BUDGET_MIB} MiB)"
    )
    assert growth_mib < MEMORY_BUDGET_MIB


async def test_a_caller_hanging_up_mid_download_is_not_a_failure(
    tmp_path, aiohttp_server, gateway_process: ServiceProcess
) -> None:
    """A caller that stops reading and hangs up mid-body is routine: the relay ends quietly with
    the status it sent, never as an unhandled error (a 500 in the metrics, an error in the log).

    A gateway process, because that is where it happens: the server there does not cancel the
    handler of a caller that went away, so the relay sees the failed write itself."""
    url = await start_in_front_of_pfs(gateway_process, tmp_path, aiohttp_server)
    async with aiohttp.ClientSession() as session:
        headers = await admin_headers(session, url)
        resp = await session.get(f"{url}/api/v1/pfs/source?size={GIB}", headers=headers)
        assert resp.status == 200
        await resp.content.readexactly(2**16)
        await asyncio.sleep(0.2)  # time for the sockets and the gateway's buffer to fill
        resp.close()  # hang up while the gateway waits to write more

        route = 'method="GET",route="/api/v1/pfs{tail}"'
        for _ in range(200):  # until the gateway has counted the request, at most 10 s
            async with session.get(f"{url}/metrics") as metrics:
                text = await metrics.text()
            if f"paddlecloud_http_requests_total{{{route}" in text:
                break
            await asyncio.sleep(0.05)
    assert f'paddlecloud_http_requests_total{{{route},status="200"}} 1.0' in text
    assert f'{route},status="500"' not in text


async def test_a_caller_hanging_up_before_a_quiet_stream_began_is_logged_as_a_hang_up(
    tmp_path, aiohttp_server, gateway_process: ServiceProcess
) -> None:
    """`logs -f` of a job whose service answers late: the caller gives up before the status line."""
    app = create_upstream_app(make_config(tmp_path), "pfs")
    url = await start_in_front_of_pfs(gateway_process, tmp_path, aiohttp_server, app)
    async with aiohttp.ClientSession() as session:
        headers = await admin_headers(session, url)
        request = asyncio.ensure_future(session.get(f"{url}/api/v1/pfs/trickle?quiet=1", headers=headers))
        await asyncio.wait_for(app[TRICKLE_ASKED].wait(), 10)  # the gateway passed the request on
        request.cancel()  # hang up while the upstream has not answered
        with contextlib.suppress(asyncio.CancelledError):
            await request
    app[TRICKLE_RELEASE].set()
    text = await logged(gateway_process, "client_disconnected")
    assert '"client_disconnected"' in text, text[-3000:]
    assert "unhandled_exception" not in text, text[-3000:]


async def test_a_caller_hanging_up_on_a_followed_stream_is_logged_as_a_hang_up(
    tmp_path, aiohttp_server, gateway_process: ServiceProcess
) -> None:
    """`logs -f` through the gateway: the caller hangs up while the upstream is quiet; when the
    upstream speaks again (or ends), the gateway finds the caller gone. That is routine: logged
    `client_disconnected`, never `unhandled_exception`."""
    app = create_upstream_app(make_config(tmp_path), "pfs")
    url = await start_in_front_of_pfs(gateway_process, tmp_path, aiohttp_server, app)
    async with aiohttp.ClientSession() as session:
        headers = await admin_headers(session, url)
        resp = await session.get(f"{url}/api/v1/pfs/trickle", headers=headers)
        assert resp.status == 200
        assert await resp.content.readline() == b"first line\n"
        resp.close()  # hang up while the upstream says nothing
        await asyncio.sleep(0)
    app[TRICKLE_RELEASE].set()
    text = await logged(gateway_process, "client_disconnected")
    assert '"client_disconnected"' in text, text[-3000:]
    assert "unhandled_exception" not in text, text[-3000:]


async def test_a_caller_hanging_up_mid_upload_is_logged_as_a_hang_up(
    tmp_path, aiohttp_server, gateway_process: ServiceProcess
) -> None:
    """An upload's body (a tus PATCH) that stops halfway because the caller went away."""
    url = await start_in_front_of_pfs(gateway_process, tmp_path, aiohttp_server)
    async with aiohttp.ClientSession() as session:
        headers = await admin_headers(session, url)
    host, port = url.removeprefix("http://").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        (
            "PATCH /api/v1/pfs/sink HTTP/1.1\r\n"
            f"Host: {host}\r\nAuthorization: {headers['Authorization']}\r\n"
            "Content-Type: application/offset+octet-stream\r\nContent-Length: 10000000\r\n\r\n"
        ).encode()
        + BLOCK
    )
    await writer.drain()
    writer.transport.abort()  # hang up with 9 MB still to send
    text = await logged(gateway_process, "client_disconnected")
    assert '"client_disconnected"' in text, text[-3000:]
    assert "unhandled_exception" not in text, text[-3000:]
