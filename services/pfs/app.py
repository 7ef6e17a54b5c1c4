"""The pfs service's app factory."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from paddlecloud.common.config import Config
from paddlecloud.common.keys import READINESS_CHECKS
from paddlecloud.common.store import Store
from paddlecloud.common.tasks import background, run_periodically
from paddlecloud.common.volume import Volume, open_volume
from paddlecloud.common.web import create_base_app, use_store

from . import api, upload_api
from .cephfs import QUOTA_SYNC_SECONDS, CephQuotas
from .errors import PROBLEMS
from .files import Files
from .keys import DATACENTER, FILES, QUOTAS, ROOT, UPLOADS, USAGE
from .uploads import GC_INTERVAL, GC_TASK, Uploads
from .usage import Usage

QUOTA_TASK = "pfs-ceph-quotas"


def create_app(config: Config, *, store: Store | None = None) -> web.Application:
    """The pfs service, serving the datacenter root `pfs.root` as /pfs/<datacenter>.

    Uploads can be as large as the quota allows: handlers stream bodies and enforce their
    own limits, so `client_max_size` only guards the JSON endpoints.
    """
    app = create_base_app(config, "pfs", problems=PROBLEMS)
    app[DATACENTER] = config.pfs.datacenter
    app.cleanup_ctx.append(_resources(config, store))
    api.add_routes(app)
    upload_api.add_routes(app)
    return app


def _resources(config: Config, given_store: Store | None) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        root = open_volume(config, Volume)
        app[ROOT] = root
        app[USAGE] = Usage(root)
        quotas = app[QUOTAS] = CephQuotas(root.root)

        async def root_writable() -> None:
            if not os.access(root.root, os.W_OK | os.X_OK):
                raise OSError(f"{root.root} is not a writable directory")

        app[READINESS_CHECKS].append(root_writable)
        async with contextlib.AsyncExitStack() as stack:
            # The store holds users' storage quotas.
            store = await stack.enter_async_context(use_store(app, config, given_store))
            section = config.pfs
            uploads = Uploads(
                root,
                app[USAGE],
                store,
                datacenter=section.datacenter,
                max_size=section.max_upload_size,
                expiry_seconds=section.upload_expiry_seconds,
                read_timeout=section.upload_read_timeout,
                quotas=quotas,
            )
            await uploads.load()
            stack.callback(uploads.close)
            app[UPLOADS] = uploads
            app[FILES] = Files(root, app[USAGE], quotas, store, datacenter=section.datacenter)

            async def collect() -> None:
                await uploads.collect()

            await stack.enter_async_context(
                background(GC_TASK, run_periodically(GC_TASK, collect, GC_INTERVAL))
            )
            if quotas.enabled:

                async def sync_quotas() -> None:
                    await quotas.sync_all(store)

                # On CephFS, homes carry their users' storage quotas (cephfs.py).
                await stack.enter_async_context(
                    background(QUOTA_TASK, run_periodically(QUOTA_TASK, sync_quotas, QUOTA_SYNC_SECONDS))
                )
            yield

    return ctx
