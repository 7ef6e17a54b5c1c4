"""The gateway's app factory: authentication, the gateway's own endpoints and the proxies."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import timedelta

import aiohttp
import structlog
from aiohttp import web

from paddlecloud.common.clients import JobsClient, PfsClient
from paddlecloud.common.config import Config
from paddlecloud.common.store import Store
from paddlecloud.common.store.models import utcnow
from paddlecloud.common.tasks import background, run_periodically
from paddlecloud.common.web import create_base_app, use_store

from . import api, dashboard
from .accounts import Accounts
from .errors import PROBLEMS
from .keys import ACCOUNTS, JOBS_CLIENT, PFS_CLIENT, UPSTREAM_SESSION
from .logins import LoginLimiter
from .proxy import Upstream

log = structlog.get_logger()

TOKEN_GC_INTERVAL = 3600.0

# Which service answers which part of the API (DESIGN §3).
ROUTES = (
    ("/api/v1/jobs", "jobs"),
    ("/api/v1/quota", "jobs"),
    ("/api/v1/registries", "jobs"),
    ("/api/v1/pfs", "pfs"),
    ("/api/v1/builds", "builder"),
)


def create_app(config: Config, *, store: Store | None = None) -> web.Application:
    """The gateway. `store` is opened and closed by the caller when given."""
    app = create_base_app(
        config, "gateway", internal=False, extra_middlewares=[api.authenticate], problems=PROBLEMS
    )
    app.cleanup_ctx.append(_resources(config, store))
    api.add_routes(app)
    dashboard.add_routes(app)
    gw = config.gateway
    urls = {"jobs": gw.jobs_url, "pfs": gw.pfs_url, "builder": gw.builder_url}
    for prefix, service in ROUTES:
        upstream = Upstream(
            service, urls[service], connect_timeout=gw.connect_timeout, read_timeout=gw.read_timeout
        )
        # `{tail}` is empty or starts with '/', so /api/v1/jobsx is not the jobs service's.
        app.router.add_route("*", prefix + "{tail:(/.*)?}", upstream.handle)
    return app


def _resources(config: Config, given_store: Store | None) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            store = await stack.enter_async_context(use_store(app, config, given_store))
            gw = config.gateway
            limiter = LoginLimiter(
                per_user=gw.login_failures_per_user,
                per_address=gw.login_failures_per_address,
                window_seconds=gw.login_window_seconds,
            )
            accounts = Accounts(
                store,
                timedelta(seconds=gw.token_ttl_seconds),
                max_concurrent_hashes=gw.login_max_concurrent_hashes,
                limiter=limiter,
            )
            app[ACCOUNTS] = accounts
            await _bootstrap_admin(config, accounts)
            # An idle pooled connection is let go well before a service would close it
            # (its header_timeout), so a request never starts on one being closed.
            services = (config.jobs, config.pfs, config.builder)
            keepalive = min(30.0, *(section.header_timeout / 2 for section in services))
            connector = aiohttp.TCPConnector(limit=config.gateway.pool_size, keepalive_timeout=keepalive)
            session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                # The gateway speaks for many users: a cookie one service set for one
                # caller must never ride along on another caller's request.
                cookie_jar=aiohttp.DummyCookieJar(),
                # Forward the caller's own headers only; invent none of ours.
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            )
            stack.push_async_callback(session.close)
            app[UPSTREAM_SESSION] = session
            app[JOBS_CLIENT] = JobsClient(config, session=session, url=gw.jobs_url, timeout=120.0)
            app[PFS_CLIENT] = PfsClient(config, session=session, url=gw.pfs_url, timeout=120.0)

            async def purge_tokens() -> None:
                purged = await store.purge_expired_tokens(utcnow())
                if purged:
                    log.info("expired_tokens_purged", count=purged)

            gc = run_periodically("gateway-token-gc", purge_tokens, TOKEN_GC_INTERVAL)
            await stack.enter_async_context(background("gateway-token-gc", gc))
            yield

    return ctx


async def _bootstrap_admin(config: Config, accounts: Accounts) -> None:
    password = config.admin_password()
    if password is None:
        return
    if await accounts.ensure_admin(config.gateway.admin_username, password):
        log.info("admin_bootstrapped", name=config.gateway.admin_username)
