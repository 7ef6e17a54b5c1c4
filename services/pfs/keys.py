"""Typed application keys of the pfs service."""

from __future__ import annotations

import asyncio

from aiohttp import web

from paddlecloud.common.volume import Root

from .cephfs import CephQuotas
from .uploads import Uploads
from .usage import Usage

ROOT = web.AppKey("pfs_root", Root)
USAGE = web.AppKey("pfs_usage", Usage)
QUOTAS = web.AppKey("pfs_ceph_quotas", CephQuotas)
DATACENTER = web.AppKey("pfs_datacenter", str)
UPLOADS = web.AppKey("pfs_uploads", Uploads)
# Downloads hash a file on request at most this many at a time (api.py).
HASH_SLOTS = web.AppKey("pfs_hash_slots", asyncio.Semaphore)
