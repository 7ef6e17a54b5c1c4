"""Idle, slow and vanishing clients against services run as real processes.

A connection that sends nothing, half a request line, unfinished headers or a short body
is closed by the server after its (here short) timeout, while other clients are served;
a client that hangs up mid-body is logged as such, never as a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from support import ServiceProcess, signed, write_config

pytestmark = pytest.mark.slow

HELD = 500  # idle connections: more than a small descriptor limit, few enough for a test
# Generous: the test asserts what happened (closed, served), never how fast.
DEADLINE = 60.0
MKDIR = "/api/v1/pfs/mkdir"
TOKEN = "/api/v1/auth/token"


@pytest.fixture(params=["pfs", "gateway"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServiceProcess]:
    short = {"header_timeout": 2, "body_timeout": 2}
    config = write_config(
        tmp_path,
        pfs={"datacenter": "dc1", **short},
        gateway={**short},
    )
    process = ServiceProcess(request.param, config, tmp_path)
    process.start()
    try:
        yield process
    finally:
        process.stop()


def _address(service: ServiceProcess) -> tuple[str, int]:
    host, _, port = service.url.removeprefix("http://").rpartition(":")
    return host, int(port)


def _short_body(service: ServiceProcess) -> bytes:
    """A JSON request whose headers promise 100 bytes more than it sends."""
    body = b'{"path": "/pfs/dc1/home/alice/half'
    path = MKDIR if service.name == "pfs" else TOKEN
    headers = signed("POST", path) if service.name == "pfs" else {}
    lines = [f"POST {path} HTTP/1.1", "Host: x", "Content-Type: application/json"]
    lines += [f"Content-Length: {len(body) + 100}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sent until it closed the connection."""
    received = b""
    with contextlib.suppress(ConnectionError):
        while chunk := await reader.read(65536):
            received += chunk
    return received


async def test_idle_and_slow_connections_are_closed_while_others_are_served(service: ServiceProcess) -> None:
    host, port = _address(service)
    kinds = {
        "nothing": b"",
        "half a request line": b"GET /hea",
        "unfinished headers": b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ",
        "a short body": _short_body(service),
    }
    held: list[tuple[str, asyncio.StreamReader, asyncio.StreamWriter]] = []
    for i in range(HELD + 3 * 20):
        kind = "nothing" if i < HELD else list(kinds)[1 + (i - HELD) % 3]
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(kinds[kind])
        await writer.drain()
        held.append((kind, reader, writer))

    async def trickle(writer: asyncio.StreamWriter) -> None:
        # Headers a byte at a time: each byte is news, but the whole must come in time.
        with contextlib.suppress(ConnectionError):
            for byte in b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"x" * 10_000:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.2)

    trickler = await asyncio.open_connection(host, port)
    trickling = asyncio.create_task(trickle(trickler[1]))
    try:
        # Meanwhile the service serves everyone else.
        async with aiohttp.ClientSession() as session:
            for _ in range(20):
                async with session.get(f"{service.url}/healthz") as resp:
                    assert resp.status == 200
        endings = await asyncio.wait_for(
            asyncio.gather(*(_closed_by_server(r) for _, r, _ in held), _closed_by_server(trickler[0])),
            DEADLINE,
        )
    finally:
        trickling.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await trickling
        for _, _, writer in [*held, ("", trickler[0], trickler[1])]:
            writer.close()
    for (kind, _, _), received in zip(held, endings, strict=False):
        if kind == "a short body":
            # Answered, then closed: a 408 saying why.
            assert received.startswith(b"HTTP/1.1 408 "), received[:200]
            assert b"ERR_BODY_TIMEOUT" in received, received
        else:
            assert received == b"", (kind, received[:200])
    # Still serving after all of it.
    async with aiohttp.ClientSession() as session, session.get(f"{service.url}/healthz") as resp:
        assert resp.status == 200


async def test_a_client_that_hangs_up_mid_body_is_logged_as_such(service: ServiceProcess) -> None:
    host, port = _address(service)
    for _ in range(3):
        _, writer = await asyncio.open_connection(host, port)
        writer.write(_short_body(service))
        await writer.drain()
        await asyncio.sleep(0.2)  # let the handler start reading the body
        writer.close()
        await writer.wait_closed()

    def events() -> list[dict[str, object]]:
        found = []
        for line in service.log_path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                found.append(json.loads(line))
        return found

    def ended(logged: list[dict[str, object]]) -> bool:
        # Each hang-up is logged, then its request's end: wait for both, not the first.
        disconnects = sum(e.get("event") == "client_disconnected" for e in logged)
        finishes = sum(e.get("event") == "request_finished" and e.get("method") == "POST" for e in logged)
        return disconnects >= 3 and finishes >= 3

    for _ in range(int(DEADLINE / 0.1)):
        if ended(events()):
            break
        await asyncio.sleep(0.1)
    logged = events()
    assert sum(e.get("event") == "client_disconnected" for e in logged) == 3, logged
    assert not [e for e in logged if e.get("level") in ("error", "critical") or "exception" in e], logged
    finished = [e for e in logged if e.get("event") == "request_finished" and e.get("method") == "POST"]
    assert [e["status"] for e in finished] == [499] * 3, finished
    # Nothing was made from the half a request.
    assert not (Path(service.config_path).parent / "pfs" / "home" / "alice" / "half").exists()
