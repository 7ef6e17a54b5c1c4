"""Typed application keys of the pfs service."""

from __future__ import annotations

from aiohttp import web

from paddlecloud.common.volume import Volume

from .cephfs import CephQuotas
from .files import Files
from .uploads import Uploads
from .usage import Usage

ROOT = web.AppKey("pfs_root", Volume)
USAGE = web.AppKey("pfs_usage", Usage)
QUOTAS = web.AppKey("pfs_ceph_quotas", CephQuotas)
DATACENTER = web.AppKey("pfs_datacenter", str)
UPLOADS = web.AppKey("pfs_uploads", Uploads)
FILES = web.AppKey("pfs_files", Files)
