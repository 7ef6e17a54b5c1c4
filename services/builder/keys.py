"""Application keys of the builder service."""

from __future__ import annotations

from aiohttp import web

from .service import Builder

BUILDER = web.AppKey("builder", Builder)
