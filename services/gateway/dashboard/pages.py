"""The dashboard's pages: sign-in, and the shells that the scripts under static/ fill in.

Pages carry no user data but the signed-in user's name: everything else the scripts
fetch from /api/v1 with the session cookie, so a page shows exactly what the API lets
that user see, and nothing more.
"""

from __future__ import annotations

from html import escape
from urllib.parse import quote

import structlog
from aiohttp import web

from paddlecloud.common import errors
from paddlecloud.common.keys import CONFIG

from .. import session as browser
from ..accounts import LoginFailed, LoginLimited, Session
from ..errors import CSRF_REFUSED
from ..keys import ACCOUNTS

log = structlog.get_logger()

HTML = "text/html"


def _attrs(values: dict[str, str]) -> str:
    return " ".join(f'{name}="{escape(value, quote=True)}"' for name, value in values.items())


def _document(
    title: str,
    body_attrs: dict[str, str],
    header: str,
    main: str,
    scripts: list[str],
    styles: tuple[str, ...] = (),
) -> str:
    # Classic scripts (a vendored library) are deferred, so they run before the module.
    tags = "\n".join(f'<script src="{src}" defer></script>' for src in scripts)
    # A vendored library's stylesheet comes before ours, so that ours has the last word.
    links = "".join(f'<link rel="stylesheet" href="{href}">\n' for href in styles)
    if "data-page" in body_attrs and body_attrs["data-page"] != "login":
        tags += '\n<script type="module" src="/static/js/app.js"></script>'

    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)} · PaddleCloud</title>
{links}<link rel="stylesheet" href="/static/style.css">
<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">
{tags}
</head>
<body {_attrs(body_attrs)}>
{header}
<main id="main">
{main}
</main>
</body>
</html>
"""


def _header(request: web.Request, session: Session, current: str) -> str:
    identity = session.identity
    links = [("/", "Jobs", "jobs"), ("/files", "Files", "files"), ("/quota", "Quota", "quota")]
    if identity.admin:
        links[-1] = ("/quota", "Quota & users", "quota")
    links.append(("/account", "Password", "account"))
    current_attr = ' aria-current="page"'
    nav = "".join(
        f'<a href="{href}"{current_attr if key == current else ""}>{label}</a>' for href, label, key in links
    )
    csrf = browser.csrf_token(request, session.token_hash)
    role = " (admin)" if identity.admin else ""
    return f"""<header class="top">
<a class="brand" href="/">PaddleCloud</a>
<nav>{nav}</nav>
<form class="signout" method="post" action="/logout">
<span class="who">{escape(identity.user)}{role}</span>
<input type="hidden" name="{browser.CSRF_FIELD}" value="{csrf}">
<button type="submit" class="link">Sign out</button>
</form>
</header>"""


async def _session(request: web.Request) -> Session:
    """The signed-in session, or a redirect to the sign-in page that comes back here."""
    token = browser.session_token(request)
    session = await request.app[ACCOUNTS].authenticate(token) if token else None
    if session is None:
        raise web.HTTPSeeOther("/login?next=" + quote(request.path_qs, safe="/"))
    return session


def _page(
    request: web.Request,
    session: Session,
    *,
    page: str,
    title: str,
    main: str,
    extra: dict[str, str] | None = None,
    scripts: tuple[str, ...] = (),
    styles: tuple[str, ...] = (),
) -> web.Response:
    datacenter = request.app[CONFIG].pfs.datacenter
    attrs = {
        "data-page": page,
        "data-user": session.identity.user,
        "data-admin": "1" if session.identity.admin else "0",
        "data-home": f"/pfs/{datacenter}/home/{session.identity.user}",
        "data-public": f"/pfs/{datacenter}/public",
        "data-csrf": browser.csrf_token(request, session.token_hash),
        **(extra or {}),
    }
    text = _document(title, attrs, _header(request, session, page), main, list(scripts), styles)
    return web.Response(text=text, content_type=HTML)


_CONFIRM = """<dialog id="confirm" class="confirm">
<form method="dialog">
<p id="confirm-text"></p>
<label id="confirm-input-label" hidden><span id="confirm-input-caption"></span>
<input id="confirm-input" autocomplete="off"></label>
<div class="buttons"><button value="cancel" formnovalidate>Cancel</button>
<button value="ok" id="confirm-ok" class="danger">OK</button></div>
</form>
</dialog>"""


async def jobs_page(request: web.Request) -> web.Response:
    session = await _session(request)
    # Administrators may list every user's jobs, with whose each is (docs/dashboard.md).
    everyone = ""
    if session.identity.admin:
        everyone = '<label class="toggle"><input type="checkbox" id="jobs-all-users"> all users</label>\n'
    main = f"""<section>
<div class="bar"><h1>Jobs</h1>
<label class="toggle"><input type="checkbox" id="jobs-all"> finished jobs too</label>
{everyone}<span id="jobs-status" class="muted" role="status"></span></div>
<div class="table-wrap"><table class="jobs">
<thead><tr><th id="jobs-user" hidden>User</th><th>Name</th><th>State</th><th>Trainers</th>
<th>Parameter servers</th><th>Age</th><th>Reason</th></tr></thead>
<tbody id="jobs-body"></tbody>
</table></div>
<p id="jobs-empty" class="muted" hidden>No jobs yet. Submit one with
<code>paddlecloud submit -jobname NAME ./package</code>.</p>
</section>"""
    return _page(request, session, page="jobs", title="Jobs", main=main)


async def account_page(request: web.Request) -> web.Response:
    session = await _session(request)
    main = f"""<section class="account"><h1>Change your password</h1>
<p class="muted">Every other session of {escape(session.identity.user)} ends: other browsers and the
CLI's tokens (<code>paddlecloud passwd</code> does the same from a terminal).</p>
<form id="password-form">
<label>Current password
<input name="current" type="password" autocomplete="current-password" required></label>
<label>New password
<input name="new" type="password" autocomplete="new-password" minlength="8" required></label>
<label>New password again
<input name="again" type="password" autocomplete="new-password" required></label>
<p id="password-status" role="status"></p>
<button type="submit">Change password</button>
</form></section>"""
    return _page(request, session, page="account", title="Password", main=main)


async def job_page(request: web.Request) -> web.Response:
    session = await _session(request)
    name = request.match_info["name"]
    main = f"""<section id="job" hidden>
<div class="bar"><h1 id="job-name">{escape(name)}</h1>
<span id="job-state" class="state"></span>
<span class="spacer"></span>
<a href="#charts">Charts</a>
<button id="job-kill" class="danger" hidden>Kill</button>
<button id="job-remove" class="danger">Kill and remove</button></div>
<p id="job-reason" class="reason"></p>
<div class="columns">
<section><h2>Workers</h2><div class="table-wrap"><table>
<thead><tr><th>Worker</th><th>Role</th><th>Index</th><th>State</th><th>Restarts</th><th>Host</th><th>Exit</th></tr></thead>
<tbody id="job-workers"></tbody></table></div></section>
<section><h2>Events</h2><div class="table-wrap"><table>
<thead><tr><th>Time</th><th>State</th><th>Reason</th><th>Message</th></tr></thead>
<tbody id="job-events"></tbody></table></div></section>
</div>
<details class="spec"><summary>Spec</summary><dl id="job-spec"></dl></details>
<section class="logs"><div class="bar"><h2>Logs</h2>
<select id="log-worker" aria-label="Worker"><option value="">all workers</option>
<option value="role=trainer">trainers</option><option value="role=pserver">parameter servers</option></select>
<input id="log-search" type="search" placeholder="Search the logs" aria-label="Search the logs">
<span id="log-matches" class="muted"></span>
<a id="log-download" href="#" download>Download</a>
<span id="log-status" class="muted" role="status"></span></div>
<pre id="log-lines" class="log" tabindex="0"></pre></section>
<section id="charts" class="charts" aria-labelledby="charts-title"><div class="bar">
<h2 id="charts-title">Charts</h2><span class="spacer"></span>
<span id="job-boards" class="muted">Its TensorBoard or VisualDL:
<code id="job-tensorboard">paddlecloud tensorboard {escape(name)}</code> or
<code id="job-visualdl">paddlecloud visualdl {escape(name)}</code></span></div>
<h3>Training curves</h3>
<p id="scalars-note" class="muted" role="status" hidden></p>
<div id="scalar-charts" class="chart-grid"></div>
<h3>Resource use per worker</h3>
<p id="resources-note" class="muted" role="status" hidden></p>
<div id="resource-charts" class="chart-grid"></div>
</section>
</section>
<p id="job-missing" class="notice" hidden></p>
{_CONFIRM}"""
    return _page(
        request,
        session,
        page="job",
        title=name,
        main=main,
        extra={"data-job": name},
        scripts=("/static/vendor/uPlot.iife.min.js",),
        styles=("/static/vendor/uPlot.min.css",),
    )


async def files_page(request: web.Request) -> web.Response:
    session = await _session(request)
    main = f"""<section>
<div class="bar"><h1>Files</h1>
<nav class="roots"><a id="root-home" href="/files">Home</a>
<a id="root-public" href="#">Public</a></nav></div>
<nav id="crumbs" class="crumbs" aria-label="Folder"></nav>
<div id="files-tools" class="bar tools">
<button id="files-mkdir">New folder</button>
<label class="button">Upload files<input id="upload-files" type="file" multiple hidden></label>
<label class="button">Upload a folder<input id="upload-folder" type="file" webkitdirectory hidden></label>
<label class="toggle"><input type="checkbox" id="upload-overwrite"> replace existing files</label>
</div>
<div id="dropzone" class="dropzone">
<p id="files-message" class="notice" hidden></p>
<div id="files-table" class="table-wrap"><table class="files">
<thead><tr><th>Name</th><th>Size</th><th>Modified</th><th></th></tr></thead>
<tbody id="files-body"></tbody></table></div>
<p id="drop-hint" class="muted drop-hint">Drop files or folders here to upload them into this folder.</p>
</div>
<section id="uploads" hidden><h2>Uploads</h2><ul id="upload-list" class="uploads"></ul></section>
</section>
{_CONFIRM}"""
    return _page(
        request, session, page="files", title="Files", main=main, scripts=("/static/vendor/tus.min.js",)
    )


async def quota_page(request: web.Request) -> web.Response:
    session = await _session(request)
    users = ""
    if session.identity.admin:
        users = """<section id="users"><h2>Users and their quotas</h2>
<div class="table-wrap"><table>
<thead><tr><th>User</th><th>Admin</th><th>CPU</th><th>GPU</th><th>Memory</th><th>Jobs</th><th>Storage</th><th>Disk</th><th></th><th></th></tr></thead>
<tbody id="users-body"></tbody></table></div>
<dialog id="quota-dialog"><form method="dialog" id="quota-form">
<h3>Quota of <span id="quota-user"></span></h3>
<p class="muted">Kubernetes quantities (<code>4</code>, <code>500m</code>, <code>8Gi</code>);
empty means no limit.</p>
<label>CPU <input name="cpu"></label><label>GPU <input name="gpu" inputmode="numeric"></label>
<label>Memory <input name="memory"></label><label>Jobs <input name="jobs" inputmode="numeric"></label>
<label>Storage <input name="storage"></label><label>Disk <input name="disk"></label>
<p id="quota-error" class="error" role="alert"></p>
<div class="buttons"><button value="cancel" formnovalidate>Cancel</button>
<button value="ok">Save</button></div>
</form></dialog></section>"""
    if session.identity.admin:
        users += f"""<p id="password-notice" class="notice" role="status" hidden></p>
{_CONFIRM}"""
    main = f"""<section><h1>Quota</h1>
<p id="quota-status" class="muted" role="status"></p>
<dl id="quota-bars" class="bars"></dl>
<ul id="quota-notes" class="muted"></ul></section>
{users}"""
    return _page(request, session, page="quota", title="Quota", main=main)


def _safe_next(value: str) -> str:
    # Only a path on this site: never //host or a scheme, which would make the sign-in
    # page an open redirect.
    if value.startswith("/") and not value.startswith("//") and "\\" not in value:
        return value
    return "/"


def _login_document(
    request: web.Request, csrf: str, next_url: str, error: str = "", username: str = ""
) -> str:
    alert = f'<p class="error" role="alert">{escape(error)}</p>' if error else ""
    main = f"""<section class="login">
<h1>Sign in to PaddleCloud</h1>
{alert}
<form method="post" action="/login">
<input type="hidden" name="{browser.CSRF_FIELD}" value="{escape(csrf, quote=True)}">
<input type="hidden" name="next" value="{escape(next_url, quote=True)}">
<label>User name <input name="username" autocomplete="username" required autofocus
value="{escape(username, quote=True)}"></label>
<label>Password <input name="password" type="password" autocomplete="current-password" required></label>
<button type="submit">Sign in</button>
</form>
<p class="muted">The same accounts as <code>paddlecloud login</code>.</p>
</section>"""
    header = '<header class="top"><span class="brand">PaddleCloud</span></header>'
    return _document("Sign in", {"data-page": "login"}, header, main, [])


async def login_form(request: web.Request) -> web.Response:
    csrf, new = browser.login_csrf(request)
    text = _login_document(request, csrf, _safe_next(request.query.get("next", "/")))
    response = web.Response(text=text, content_type=HTML)
    if new:
        browser.set_login_csrf_cookie(response, request, csrf)
    return response


async def login(request: web.Request) -> web.Response:
    form = await request.post()
    sent_csrf = str(form.get(browser.CSRF_FIELD, ""))
    next_url = _safe_next(str(form.get("next", "/")))
    username = str(form.get("username", ""))
    csrf, new = browser.login_csrf(request)
    try:
        browser.check_login_csrf(request, sent_csrf)
        token, _record, _user = await request.app[ACCOUNTS].login(
            username, str(form.get("password", "")), request.remote or ""
        )
    except errors.ProblemError as exc:
        return _login_failed(request, csrf, new, next_url, exc.detail, 403, username)
    except LoginLimited as exc:
        wait = exc.refusal.retry_after
        message = f"Too many failed sign-ins {exc.refusal.reason}. Try again in {wait} seconds."
        page = _login_failed(request, csrf, new, next_url, message, 429, username)
        page.headers["Retry-After"] = str(wait)
        return page
    except LoginFailed:
        return _login_failed(
            request, csrf, new, next_url, "The user name or the password is wrong.", 401, username
        )
    response = web.HTTPSeeOther(next_url)
    browser.set_session_cookie(response, request, token, request.app[CONFIG].gateway.token_ttl_seconds)
    log.info("dashboard_signed_in")
    raise response


def _login_failed(
    request: web.Request, csrf: str, new: bool, next_url: str, message: str, status: int, username: str
) -> web.Response:
    text = _login_document(request, csrf, next_url, message, username)
    response = web.Response(text=text, content_type=HTML, status=status)
    if new:
        browser.set_login_csrf_cookie(response, request, csrf)
    return response


async def logout(request: web.Request) -> web.Response:
    form = await request.post()
    token = browser.session_token(request)
    accounts = request.app[ACCOUNTS]
    session = await accounts.authenticate(token) if token else None
    if session is not None:
        # The CSRF token must come along, or another site could sign a user out at will.
        request_csrf = str(form.get(browser.CSRF_FIELD, ""))
        if not browser.same_origin(request) or request_csrf != browser.csrf_token(
            request, session.token_hash
        ):
            raise CSRF_REFUSED("Sign out from the dashboard's own button.")
        await accounts.revoke(session.token_hash)
        log.info("dashboard_signed_out")
    response = web.HTTPSeeOther("/login")
    browser.clear_session_cookie(response)
    raise response
