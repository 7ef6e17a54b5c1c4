"""The jobs service's app factory."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from paddlecloud.common.clients import BuilderClient, PfsClient
from paddlecloud.common.config import Config
from paddlecloud.common.figures import ScrapeCache
from paddlecloud.common.keys import METRICS_REFRESH, METRICS_REGISTRY, READINESS_CHECKS
from paddlecloud.common.storage import open_storage
from paddlecloud.common.store import Store
from paddlecloud.common.volume import open_volume
from paddlecloud.common.web import create_base_app, use_store

from .api import add_routes
from .backend import Backend
from .backends import create_backend, create_election
from .errors import PROBLEMS
from .figures import JobFigures
from .keys import FIGURES, MANAGER, VIEWERS
from .leadership import LEADERSHIP, Leadership, leader_gate, readiness
from .manager import JobManager
from .reconcile import reconciling
from .viewers import Viewers


def create_app(config: Config, *, store: Store | None = None) -> web.Application:
    """The jobs service. `store` is opened and closed by the caller when given."""
    app = create_base_app(config, "jobs", problems=PROBLEMS, extra_middlewares=[leader_gate])
    leadership = Leadership()
    app[LEADERSHIP] = leadership
    app[READINESS_CHECKS].append(readiness(leadership))
    app[FIGURES] = JobFigures(app[METRICS_REGISTRY], leadership)
    add_routes(app)
    app.cleanup_ctx.append(_resources(config, store))
    return app


def _resources(config: Config, given_store: Store | None) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        async with use_store(app, config, given_store) as store:
            # The jobs service reads PFS directly: packages to check, through the datacenter's
            # storage; the local backend launches from the POSIX root on this machine.
            volume = open_storage(config)
            root = open_volume(config)
            backend = create_backend(config, root, store)
            builder, pfs = BuilderClient(config), PfsClient(config)
            figures = app[FIGURES]
            manager = JobManager(config, store, backend, volume, builder, pfs, figures)
            app[MANAGER] = manager
            count = functools.partial(figures.count, store)
            seconds = config.jobs.metrics_cache_seconds
            app[METRICS_REFRESH].append(ScrapeCache("jobs_by_state", count, seconds))
            viewers = Viewers(config.jobs.viewers, backend)
            app[VIEWERS] = viewers
            leadership = app[LEADERSHIP]
            try:
                elect = create_election(config)
                if elect is not None:
                    # Serving at once (probes, 503s); acting once this replica is elected.
                    async with elect(leadership, functools.partial(_acting, backend, manager, viewers)):
                        yield
                else:
                    async with _acting(backend, manager, viewers):
                        leadership.acting = True
                        yield
            finally:
                await builder.close()
                await pfs.close()
                await volume.close()

    return ctx


@contextlib.asynccontextmanager
async def _acting(backend: Backend, manager: JobManager, viewers: Viewers) -> AsyncIterator[None]:
    """What the acting service does for the block's duration: the backend open (its
    watches), the jobs the store calls active re-attached, the reconcile loop running;
    the jobs' viewers stopped at its end, before the backend closes (none outlives it)."""
    await backend.open()
    try:
        async with reconciling(manager):
            try:
                yield
            finally:
                await viewers.close()
    finally:
        await backend.close()
