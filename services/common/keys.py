"""Typed application and request keys shared by every service."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CollectorRegistry

from .config import Config
from .errors import ProblemTable
from .internal_auth import Identity
from .store import Store

CONFIG = web.AppKey("config", Config)
SERVICE_NAME = web.AppKey("service_name", str)
METRICS_REGISTRY = web.AppKey("metrics_registry", CollectorRegistry)
READINESS_CHECKS = web.AppKey("readiness_checks", list[Callable[[], Awaitable[None]]])
# Counts a scrape of /metrics awaits first (figures read from the store or the storage).
METRICS_REFRESH = web.AppKey("metrics_refresh", list[Callable[[], Awaitable[None]]])
INTERNAL_SECRET = web.AppKey("internal_secret", bytes)
STORE = web.AppKey("store", Store)
# The service's table of domain errors and the problems they are shown as.
PROBLEMS = web.AppKey("problems", ProblemTable)

REQUEST_ID = web.RequestKey("request_id", str)
IDENTITY = web.RequestKey("identity", Identity)
