"""Typed application keys of the gateway."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from .accounts import Accounts

ACCOUNTS = web.AppKey("accounts", Accounts)
UPSTREAM_SESSION = web.AppKey("upstream_session", aiohttp.ClientSession)
