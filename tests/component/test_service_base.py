"""What every service gets from the shared app conventions."""

from __future__ import annotations

import pytest
from aiohttp import web

from paddlecloud.common import internal_auth
from paddlecloud.common.web import create_base_app
from support import make_config


@pytest.fixture
async def client(tmp_path, aiohttp_client):
    config = make_config(tmp_path)
    app = create_base_app(config, "jobs")

    async def broken(_request: web.Request) -> web.Response:
        raise RuntimeError("secret internal detail")

    app.router.add_get("/api/v1/jobs/broken", broken)
    client = await aiohttp_client(app)
    client.secret = config.internal_secret()  # type: ignore[attr-defined]
    return client


async def test_unhandled_exception_is_a_bare_500_with_the_request_id(client) -> None:
    path = "/api/v1/jobs/broken"
    headers = internal_auth.sign(client.secret, internal_auth.Identity("alice"), "rid-500", "GET", path)
    resp = await client.get(path, headers={**headers, "X-Request-ID": "rid-500"})
    assert resp.status == 500
    assert resp.content_type == "application/problem+json"
    text = await resp.text()
    assert "secret internal detail" not in text and "Traceback" not in text
    body = await resp.json()
    assert body["code"] == "ERR_INTERNAL" and body["request_id"] == "rid-500"
    assert "rid-500" in body["detail"]


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
async def test_probes_answer_without_credentials(client, path: str) -> None:
    assert (await client.get(path)).status == 200
