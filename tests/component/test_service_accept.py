"""A service takes every queued connection at once, on uvloop as on asyncio's own loop."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest
from aiohttp import web

from paddlecloud.common.runner import EagerAcceptSite, listen_socket

QUEUED = 64
# Turns of the event loop allowed: one to accept, a few to run the adoptions and
# connection_made. Accepting one connection per turn (libuv's way) leaves most queued.
TURNS = 5


def _loop_factories() -> list[object]:
    factories: list[object] = [pytest.param(None, id="asyncio")]
    try:
        import uvloop
    except ImportError:
        return factories
    return [*factories, pytest.param(uvloop.new_event_loop, id="uvloop")]


async def _accepted_after_a_burst() -> int:
    runner = web.AppRunner(web.Application())
    await runner.setup()
    assert runner.server is not None
    site = EagerAcceptSite(runner, listen_socket("127.0.0.1", 0))
    await site.start()
    port = runner.addresses[0][1]
    clients = []
    try:
        # The kernel completes each handshake itself and queues the connection: the
        # service has all of them waiting when its loop next looks.
        for _ in range(QUEUED):
            clients.append(socket.create_connection(("127.0.0.1", port)))
        for _ in range(TURNS):
            await asyncio.sleep(0)
        return len(runner.server.connections)
    finally:
        for client in clients:
            client.close()
        await runner.cleanup()


@pytest.mark.parametrize("loop_factory", _loop_factories())
def test_a_burst_of_connections_is_accepted_in_one_turn(
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None,
) -> None:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        assert runner.run(_accepted_after_a_burst()) == QUEUED


def test_the_site_reports_its_address_and_stops_listening_when_closed() -> None:
    async def run() -> None:
        runner = web.AppRunner(web.Application())
        await runner.setup()
        site = EagerAcceptSite(runner, listen_socket("127.0.0.1", 0))
        await site.start()
        host, port = runner.addresses[0][:2]
        assert host == "127.0.0.1" and port > 0
        await runner.cleanup()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()

    asyncio.run(run())
