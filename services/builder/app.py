"""The builder service's app factory."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from aiohttp import web

from paddlecloud.common.config import Config
from paddlecloud.common.store import Store
from paddlecloud.common.web import create_base_app, use_store


def create_app(config: Config, *, store: Store | None = None) -> web.Application:
    """The builder service. `store` is opened and closed by the caller when given."""
    app = create_base_app(config, "builder")
    app.cleanup_ctx.append(_resources(config, store))
    return app


def _resources(config: Config, given_store: Store | None) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        async with use_store(app, config, given_store):
            yield

    return ctx
