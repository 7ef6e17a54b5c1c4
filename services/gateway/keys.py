"""Typed application keys of the gateway."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from paddlecloud.common.clients import JobsClient, PfsClient

from .accounts import Accounts

ACCOUNTS = web.AppKey("accounts", Accounts)
# What deleting a user asks of the services behind the gateway.
JOBS_CLIENT = web.AppKey("jobs_client", JobsClient)
PFS_CLIENT = web.AppKey("pfs_client", PfsClient)
UPSTREAM_SESSION = web.AppKey("upstream_session", aiohttp.ClientSession)
