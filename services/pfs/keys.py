"""Typed application keys of the pfs service."""

from __future__ import annotations

from aiohttp import web

from paddlecloud.common.volume import Root

from .cephfs import CephQuotas
from .usage import Usage

ROOT = web.AppKey("pfs_root", Root)
USAGE = web.AppKey("pfs_usage", Usage)
QUOTAS = web.AppKey("pfs_ceph_quotas", CephQuotas)
DATACENTER = web.AppKey("pfs_datacenter", str)
