"""Application keys of the jobs service."""

from __future__ import annotations

from aiohttp import web

from .figures import JobFigures
from .manager import JobManager
from .viewers import Viewers

MANAGER = web.AppKey("job_manager", JobManager)
FIGURES = web.AppKey("job_figures", JobFigures)
VIEWERS = web.AppKey("job_viewers", Viewers)
