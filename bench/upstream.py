"""A minimal internal service for measuring the gateway alone: `python -m bench.upstream`."""

from __future__ import annotations

import sys

from aiohttp import web

from paddlecloud.common.config import Config
from paddlecloud.common.keys import IDENTITY
from paddlecloud.common.runner import service_main
from paddlecloud.common.web import create_base_app

PING = "/api/v1/jobs/ping"


async def ping(request: web.Request) -> web.Response:
    return web.json_response({"ok": True, "user": request[IDENTITY].user})


def create_app(config: Config) -> web.Application:
    """A service with the real middlewares (request id, problems, gateway signature check)."""
    app = create_base_app(config, "jobs")
    app.router.add_get(PING, ping)
    return app


if __name__ == "__main__":
    sys.exit(service_main("jobs", create_app))
