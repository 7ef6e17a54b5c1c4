"""The gateway's browser sessions through its real app: the session cookie opens the API,
state changes demand the CSRF token, and bearer tokens work exactly as before."""

from __future__ import annotations

import re
from typing import Any

from test_gateway import Gateway, gateway, problem  # noqa: F401 - the fixture, reused
from yarl import URL

from support import ADMIN_PASSWORD

CSRF = re.compile(r'data-csrf="([0-9a-f]{64})"')


async def sign_in(gw: Gateway) -> str:
    """Sign in through the form as the admin; the page's CSRF token."""
    client = gw.client
    form = await client.get("/login")
    assert form.status == 200
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', await form.text())
    assert csrf is not None
    resp = await client.post(
        "/login",
        data={"csrf_token": csrf.group(1), "next": "/files", "username": "admin", "password": ADMIN_PASSWORD},
        allow_redirects=False,
    )
    assert resp.status == 303 and resp.headers["Location"] == "/files"
    cookie = resp.cookies["pc_session"]
    assert cookie["httponly"] and cookie["samesite"] == "Strict" and not cookie["secure"]
    page = await client.get("/files")
    assert page.status == 200
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    token = CSRF.search(await page.text())
    assert token is not None
    return token.group(1)


async def test_a_page_without_a_session_sends_you_to_sign_in(gateway: Gateway) -> None:  # noqa: F811
    resp = await gateway.client.get("/jobs/x?y=1", allow_redirects=False)
    assert resp.status == 303
    location = URL(resp.headers["Location"])
    assert location.path == "/login" and location.query["next"] == "/jobs/x?y=1"


async def test_a_sign_in_form_from_elsewhere_is_refused(gateway: Gateway) -> None:  # noqa: F811
    resp = await gateway.client.post(
        "/login", data={"csrf_token": "forged", "username": "admin", "password": ADMIN_PASSWORD}
    )
    assert resp.status == 403 and "pc_session" not in resp.cookies


async def test_the_cookie_reads_and_with_its_csrf_token_writes(gateway: Gateway) -> None:  # noqa: F811
    csrf = await sign_in(gateway)
    client = gateway.client
    who = await client.get("/api/v1/auth/whoami")
    assert who.status == 200 and (await who.json())["user"] == "admin"

    no_token = await client.post("/api/v1/users", json={"name": "carol", "password": "carol-password"})
    await problem(no_token, 403, "ERR_CSRF")
    wrong = await client.post(
        "/api/v1/users",
        json={"name": "carol", "password": "carol-password"},
        headers={"X-CSRF-Token": "0" * 64},
    )
    await problem(wrong, 403, "ERR_CSRF")
    foreign = await client.post(
        "/api/v1/users",
        json={"name": "carol", "password": "carol-password"},
        headers={"X-CSRF-Token": csrf, "Origin": "http://evil.example"},
    )
    await problem(foreign, 403, "ERR_CSRF")
    # A GET that asks pfs to treat it as a DELETE is a state change too.
    override = await client.get("/api/v1/pfs/echo", headers={"X-HTTP-Method-Override": "DELETE"})
    await problem(override, 403, "ERR_CSRF")

    made = await client.post(
        "/api/v1/users", json={"name": "carol", "password": "carol-password"}, headers={"X-CSRF-Token": csrf}
    )
    assert made.status == 201, await made.text()

    # Neither the cookie nor the CSRF token reaches a service.
    seen = await (await client.post("/api/v1/pfs/echo", headers={"X-CSRF-Token": csrf})).json()
    assert seen["user"] == "admin"
    assert not {"cookie", "x-csrf-token", "authorization"} & {k.lower() for k in seen["headers"]}


async def test_bearer_tokens_need_no_csrf_token_and_win_over_the_cookie(gateway: Gateway) -> None:  # noqa: F811
    await sign_in(gateway)
    await gateway.add_user("dave")
    headers: dict[str, Any] = await gateway.auth("dave", "password-of-user")
    who = await gateway.client.get("/api/v1/auth/whoami", headers=headers)
    assert (await who.json())["user"] == "dave"
    bad = await gateway.client.get("/api/v1/auth/whoami", headers={"Authorization": "Bearer pc_nope"})
    await problem(bad, 401, "ERR_UNAUTHENTICATED")


async def test_signing_out_revokes_the_session(gateway: Gateway) -> None:  # noqa: F811
    csrf = await sign_in(gateway)
    client = gateway.client
    forged = await client.post("/logout", data={"csrf_token": "x"}, allow_redirects=False)
    assert forged.status == 403
    cookie = client.session.cookie_jar.filter_cookies(client.make_url("/"))["pc_session"].value
    out = await client.post("/logout", data={"csrf_token": csrf}, allow_redirects=False)
    assert out.status == 303 and out.headers["Location"] == "/login"
    client.session.cookie_jar.update_cookies({"pc_session": cookie})
    await problem(await client.get("/api/v1/auth/whoami"), 401, "ERR_UNAUTHENTICATED")


async def test_a_jobs_viewer_gets_no_exemption_from_the_csrf_token(gateway: Gateway) -> None:  # noqa: F811
    """A job's TensorBoard or VisualDL never runs on the gateway's origin (its answers carry
    the inert API policy; docs/metrics.md §4.3): a cookie-authenticated POST below a viewer's
    prefix needs the session's CSRF token like any other, even from this very origin."""
    await sign_in(gateway)
    client = gateway.client
    origin = str(client.make_url("/")).rstrip("/")
    viewer = "/api/v1/jobs/mnist/tensorboard/experiment/defaultExperimentId/data/plugin/timeseries/timeSeries"
    for headers in ({"Origin": origin}, {}, {"Origin": "http://evil.example"}):
        refused = await client.post(viewer, data=b"requests=[]", headers=headers)
        await problem(refused, 403, "ERR_CSRF")
