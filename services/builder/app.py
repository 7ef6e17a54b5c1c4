"""The builder service's app factory."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from aiohttp import web

from paddlecloud.common.config import Config
from paddlecloud.common.keys import METRICS_REGISTRY
from paddlecloud.common.store import Store
from paddlecloud.common.web import create_base_app, use_store

from .api import add_routes
from .backend import BuildBackend
from .backends import create_build_backend
from .errors import PROBLEMS
from .figures import BuildFigures
from .keys import BUILDER, FIGURES
from .service import Builder


def create_app(
    config: Config, *, store: Store | None = None, backend: BuildBackend | None = None
) -> web.Application:
    """The builder service. `store` is opened and closed by the caller when given;
    `backend` (default: the local one) is opened and closed here."""
    app = create_base_app(config, "builder", problems=PROBLEMS)
    app[FIGURES] = BuildFigures(app[METRICS_REGISTRY])
    add_routes(app)
    app.cleanup_ctx.append(_resources(config, store, backend))
    return app


def _resources(
    config: Config, given_store: Store | None, given_backend: BuildBackend | None
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        async with use_store(app, config, given_store) as store:
            backend = given_backend or create_build_backend(config)
            await backend.open()
            builder = Builder(config, store, backend, app[FIGURES])
            app[BUILDER] = builder
            try:
                await builder.start()
                yield
            finally:
                await builder.stop()
                await backend.close()

    return ctx
