"""Typed application keys of the pfs service."""

from __future__ import annotations

from aiohttp import web

from paddlecloud.common.storage.base import AbstractVolume, Quotas

from .figures import PfsFigures
from .files import Files
from .uploads import Uploads

VOLUME = web.AppKey("pfs_volume", AbstractVolume)
QUOTAS = web.AppKey("pfs_quotas", Quotas)
DATACENTER = web.AppKey("pfs_datacenter", str)
UPLOADS = web.AppKey("pfs_uploads", Uploads)
FILES = web.AppKey("pfs_files", Files)
FIGURES = web.AppKey("pfs_figures", PfsFigures)
