"""Application keys of the jobs service."""

from __future__ import annotations

from aiohttp import web

from .manager import JobManager
from .viewers import Viewers

MANAGER = web.AppKey("job_manager", JobManager)
VIEWERS = web.AppKey("job_viewers", Viewers)
