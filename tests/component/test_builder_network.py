"""A build's network: pip reaches its package index on the host's loopback, and no other port there."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

# The builder's fixtures, shared with its main tests.
from test_builder import Builds, builder_settings, builds, wheelhouse  # noqa: F401

from paddlecloud.common import netns

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or netns.no_outbound_reason() is not None,
    reason="network namespaces per build need root, bubblewrap, pasta (make system-deps) and a default route",
)


class Counting:
    """An HTTP server on the host's loopback that counts the requests it gets (404 each)."""

    def __init__(self) -> None:
        self.hits = 0

    def app(self) -> web.Application:
        async def anything(request: web.Request) -> web.Response:
            self.hits += 1
            raise web.HTTPNotFound()

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", anything)
        return app


# Asked for before `builds`, which reads the settings: the wheelhouse served over HTTP on
# the host's loopback, as a lab's own package index would be, instead of as a directory.
@pytest.fixture
async def loopback_index(builder_settings: dict[str, Any], wheelhouse: Path, aiohttp_server: Any) -> str:  # noqa: F811
    app = web.Application()
    app.router.add_static("/wheels/", wheelhouse, show_index=True)
    server = await aiohttp_server(app)
    url = str(server.make_url("/wheels/"))
    builder_settings.update(find_links=[url])
    return url


@pytest.fixture
async def other_service(aiohttp_server: Any) -> tuple[Counting, str]:
    counting = Counting()
    server = await aiohttp_server(counting.app())
    return counting, f"http://127.0.0.1:{server.port}"


async def test_pip_reaches_the_index_on_the_loopback_but_no_other_loopback_port(
    loopback_index: str,
    other_service: tuple[Counting, str],
    builds: Builds,  # noqa: F811
) -> None:
    good = await builds.wait((await builds.post("tinypkg==1.0\n"))["id"])
    assert good["state"] == "SUCCEEDED", (good, await builds.logs(good["id"]))
    counting, url = other_service
    # A requirement that names a URL on another port of the host's loopback: pip tries it.
    bad = await builds.wait((await builds.post(f"otherpkg @ {url}/otherpkg-1.0-py3-none-any.whl\n"))["id"])
    logs = await builds.logs(bad["id"])
    assert bad["state"] == "FAILED", logs
    assert counting.hits == 0, logs
    assert "Connection refused" in logs, logs
