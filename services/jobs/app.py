"""The jobs service's app factory."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from aiohttp import web

from paddlecloud.common.clients import BuilderClient, PfsClient
from paddlecloud.common.config import Config
from paddlecloud.common.store import Store
from paddlecloud.common.volume import open_volume
from paddlecloud.common.web import create_base_app, use_store

from .api import add_routes
from .backends import create_backend
from .errors import PROBLEMS
from .keys import MANAGER
from .manager import JobManager
from .reconcile import reconciling


def create_app(config: Config, *, store: Store | None = None) -> web.Application:
    """The jobs service. `store` is opened and closed by the caller when given."""
    app = create_base_app(config, "jobs", problems=PROBLEMS)
    add_routes(app)
    app.cleanup_ctx.append(_resources(config, store))
    return app


def _resources(config: Config, given_store: Store | None) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        async with use_store(app, config, given_store) as store:
            # The jobs service reads PFS directly: packages to check and run, usage for quota.
            root = open_volume(config)
            backend = create_backend(config, root, store)
            await backend.open()
            builder, pfs = BuilderClient(config), PfsClient(config)
            manager = JobManager(config, store, backend, root, builder, pfs)
            app[MANAGER] = manager
            try:
                async with reconciling(manager):
                    yield
            finally:
                await builder.close()
                await pfs.close()
                await backend.close()

    return ctx
