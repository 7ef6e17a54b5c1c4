"""The pfs service's app factory."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from paddlecloud.common.config import Config
from paddlecloud.common.figures import ScrapeCache
from paddlecloud.common.keys import METRICS_REFRESH, METRICS_REGISTRY, READINESS_CHECKS
from paddlecloud.common.storage import open_storage
from paddlecloud.common.storage.base import AbstractVolume
from paddlecloud.common.storage.cephfs import QUOTA_SYNC_SECONDS
from paddlecloud.common.store import Store
from paddlecloud.common.tasks import background, run_periodically
from paddlecloud.common.web import create_base_app, use_store

from . import api, upload_api
from .errors import PROBLEMS
from .figures import PfsFigures
from .files import Files
from .keys import DATACENTER, FIGURES, FILES, QUOTAS, UPLOADS, VOLUME
from .uploads import GC_INTERVAL, GC_TASK, Uploads

QUOTA_TASK = "pfs-quotas"


def create_app(
    config: Config, *, store: Store | None = None, volume: AbstractVolume | None = None
) -> web.Application:
    """The pfs service, serving the datacenter's storage (`open_storage`: the root `pfs.root`,
    or HDFS with `pfs.hdfs`; `volume` instead, given) as /pfs/<datacenter>.

    Uploads can be as large as the quota allows: handlers stream bodies and enforce their
    own limits, so `client_max_size` only guards the JSON endpoints.
    """
    app = create_base_app(config, "pfs", problems=PROBLEMS)
    app[DATACENTER] = config.pfs.datacenter
    app[FIGURES] = PfsFigures(app[METRICS_REGISTRY], config.pfs.datacenter)
    app.cleanup_ctx.append(_resources(config, store, volume))
    api.add_routes(app)
    upload_api.add_routes(app)
    return app


def _resources(
    config: Config, given_store: Store | None, given_volume: AbstractVolume | None
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            volume = given_volume if given_volume is not None else open_storage(config)
            if given_volume is None:
                stack.push_async_callback(volume.close)
            app[VOLUME] = volume
            quotas = app[QUOTAS] = volume.quotas
            app[READINESS_CHECKS].append(volume.check_writable)
            # The store holds users' storage quotas.
            store = await stack.enter_async_context(use_store(app, config, given_store))
            section = config.pfs
            uploads = Uploads(
                volume,
                store,
                datacenter=section.datacenter,
                max_size=section.max_upload_size,
                expiry_seconds=section.upload_expiry_seconds,
                read_timeout=section.upload_read_timeout,
                figures=app[FIGURES],
            )
            await uploads.load()
            app[UPLOADS] = uploads
            figures = app[FIGURES]
            figures.count_in_flight(uploads.in_flight)
            stored = functools.partial(figures.count_stored, store, volume)
            seconds = section.metrics_cache_seconds
            app[METRICS_REFRESH].append(ScrapeCache("pfs_stored_bytes", stored, seconds))
            app[FILES] = Files(volume, store, datacenter=section.datacenter)

            async def collect() -> None:
                await uploads.collect()

            await stack.enter_async_context(
                background(GC_TASK, run_periodically(GC_TASK, collect, GC_INTERVAL))
            )
            if quotas.enabled:

                async def sync_quotas() -> None:
                    await quotas.sync_all(store)

                # On CephFS and HDFS, homes carry their users' storage quotas (common/storage).
                await stack.enter_async_context(
                    background(QUOTA_TASK, run_periodically(QUOTA_TASK, sync_quotas, QUOTA_SYNC_SECONDS))
                )
            yield

    return ctx
