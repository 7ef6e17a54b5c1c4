"""The dashboard: pages and static assets served by the gateway at `/` (docs/dashboard.md)."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from aiohttp import web

from . import pages

# No inline script or style anywhere: every script and stylesheet is a file from /static.
PAGE_CSP = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
# An API answer opened as a document (a user's uploaded .html fetched by URL, say) runs
# nothing and can do nothing on this origin.
API_CSP = "default-src 'none'; frame-ancestors 'none'; sandbox"
# A job's TensorBoard or VisualDL (docs/metrics.md §4): their pages render what a job
# wrote, so whatever their answer says, none of it runs on this origin, where the user's
# session is. `paddlecloud tensorboard|visualdl` serve them on a loopback origin of their own.
VIEWER_PATH = re.compile(r"^/api/v1/jobs/[^/]+/(tensorboard|visualdl)(/|$)")


def static_dir() -> Path:
    return Path(str(resources.files(__package__).joinpath("static")))


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    headers = response.headers
    headers.setdefault("X-Content-Type-Options", "nosniff")
    if VIEWER_PATH.match(request.path):
        headers["Content-Security-Policy"] = API_CSP
        return
    if request.path.startswith("/api/"):
        headers.setdefault("Content-Security-Policy", API_CSP)
        return
    headers["Content-Security-Policy"] = PAGE_CSP
    headers["X-Frame-Options"] = "DENY"
    headers["Referrer-Policy"] = "same-origin"
    if request.path.startswith("/static/"):
        # Revalidated on every load (ETag / Last-Modified): an upgraded server's scripts
        # are never mixed with an old page's.
        headers["Cache-Control"] = "no-cache"
    else:
        headers["Cache-Control"] = "no-store"


def add_routes(app: web.Application) -> None:
    """Register the dashboard's pages, its sign-in and its assets on the gateway."""
    r = app.router
    r.add_get("/", pages.jobs_page)
    r.add_get("/jobs/{name}", pages.job_page)
    r.add_get("/files", pages.files_page)
    r.add_get("/quota", pages.quota_page)
    r.add_get("/account", pages.account_page)
    r.add_get("/login", pages.login_form)
    r.add_post("/login", pages.login)
    r.add_post("/logout", pages.logout)
    r.add_static("/static/", static_dir(), follow_symlinks=False, append_version=False)
    app.on_response_prepare.append(_security_headers)
