"""Application keys of the builder service."""

from __future__ import annotations

from aiohttp import web

from .figures import BuildFigures
from .service import Builder

BUILDER = web.AppKey("builder", Builder)
FIGURES = web.AppKey("build_figures", BuildFigures)
