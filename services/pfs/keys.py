"""Typed application keys of the pfs service."""

from __future__ import annotations

from aiohttp import web

from paddlecloud.common.volume import Root

from .usage import Usage

ROOT = web.AppKey("pfs_root", Root)
USAGE = web.AppKey("pfs_usage", Usage)
DATACENTER = web.AppKey("pfs_datacenter", str)
