"""The pfs service's app factory."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from paddlecloud.common.config import Config
from paddlecloud.common.keys import CONFIG, READINESS_CHECKS
from paddlecloud.common.web import create_base_app

PFS_ROOT = web.AppKey("pfs_root", Path)


def create_app(config: Config) -> web.Application:
    """The pfs service, serving the datacenter root `pfs.root` as /pfs/<datacenter>."""
    app = create_base_app(config, "pfs")
    app.cleanup_ctx.append(_root)
    return app


async def _root(app: web.Application) -> AsyncIterator[None]:
    root = app[CONFIG].pfs.root.expanduser().resolve()
    for part in ("home", "public"):
        (root / part).mkdir(parents=True, exist_ok=True)
    app[PFS_ROOT] = root

    async def root_writable() -> None:
        if not os.access(root, os.W_OK | os.X_OK):
            raise OSError(f"{root} is not a writable directory")

    app[READINESS_CHECKS].append(root_writable)
    yield
