"""The gateway through its real app: tokens, users, the proxy, and every refusal it owes."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from paddlecloud.common import internal_auth
from paddlecloud.common.config import Config
from paddlecloud.common.keys import STORE
from paddlecloud.common.store import Token
from paddlecloud.common.store.models import utcnow
from paddlecloud.gateway.accounts import hash_token
from paddlecloud.gateway.app import create_app
from support import ADMIN_PASSWORD, create_upstream_app, free_port, make_config

PROBLEM = "application/problem+json"


@dataclass
class Gateway:
    client: TestClient[Any, Any]
    config: Config
    pfs_url: str

    async def token(self, user: str = "admin", password: str = ADMIN_PASSWORD) -> str:
        resp = await self.client.post("/api/v1/auth/token", json={"username": user, "password": password})
        assert resp.status == 201, await resp.text()
        return str((await resp.json())["token"])

    async def auth(self, user: str = "admin", password: str = ADMIN_PASSWORD) -> dict[str, str]:
        return {"Authorization": f"Bearer {await self.token(user, password)}"}

    async def add_user(self, name: str, password: str = "password-of-" + "user", admin: bool = False) -> None:
        resp = await self.client.post(
            "/api/v1/users",
            json={"name": name, "password": password, "admin": admin},
            headers=await self.auth(),
        )
        assert resp.status == 201, await resp.text()


@pytest.fixture
async def gateway(tmp_path, aiohttp_server, aiohttp_client) -> Gateway:
    base = make_config(tmp_path)
    pfs = await aiohttp_server(create_upstream_app(base, "pfs"))
    jobs = await aiohttp_server(create_upstream_app(base, "jobs"))
    config = make_config(
        tmp_path,
        gateway={
            "pfs_url": str(pfs.make_url("")),
            "jobs_url": str(jobs.make_url("")),
            # Nobody listens here: the builder service is "down".
            "builder_url": f"http://127.0.0.1:{free_port()}",
        },
    )
    client = await aiohttp_client(create_app(config))
    return Gateway(client, config, str(pfs.make_url("")))


async def problem(resp: Any, status: int, code: str) -> dict[str, Any]:
    assert resp.status == status, await resp.text()
    assert resp.content_type == PROBLEM
    body: dict[str, Any] = await resp.json()
    assert body["code"] == code
    assert body["status"] == status
    assert body["title"] and body["detail"] and body["type"].endswith(code)
    assert "Traceback" not in await resp.text()
    return body


async def test_no_token_is_401_with_a_challenge(gateway: Gateway) -> None:
    resp = await gateway.client.get("/api/v1/auth/whoami")
    body = await problem(resp, 401, "ERR_UNAUTHENTICATED")
    assert "Bearer" in resp.headers["WWW-Authenticate"]
    assert "login" in body["detail"]


@pytest.mark.parametrize("header", ["Bearer", "Basic dXNlcjpwYXNz", "Bearer pc_not-a-real-token", "pc_x"])
async def test_malformed_or_unknown_token_is_401(gateway: Gateway, header: str) -> None:
    resp = await gateway.client.get("/api/v1/jobs/echo", headers={"Authorization": header})
    await problem(resp, 401, "ERR_UNAUTHENTICATED")


async def test_login_then_both_schemes_work(gateway: Gateway) -> None:
    token = await gateway.token()
    for scheme in ("Bearer", "Token", "bearer"):
        resp = await gateway.client.get("/api/v1/auth/whoami", headers={"Authorization": f"{scheme} {token}"})
        assert resp.status == 200
        body = await resp.json()
        assert body["user"] == "admin" and body["admin"] is True


async def test_wrong_password_and_unknown_user_look_the_same(gateway: Gateway) -> None:
    await gateway.add_user("alice", "alice-password")
    bodies = []
    for user, password in (("alice", "not-her-password"), ("nobody", "alice-password")):
        resp = await gateway.client.post("/api/v1/auth/token", json={"username": user, "password": password})
        body = await problem(resp, 401, "ERR_BAD_CREDENTIALS")
        bodies.append((body["title"], body["detail"]))
    assert bodies[0] == bodies[1]
    assert "user name or the password" in bodies[0][1]


async def test_expired_token_is_401(gateway: Gateway) -> None:
    store = gateway.client.app[STORE]  # type: ignore[index]
    token = "pc_expired-token-for-the-test"
    await store.add_token(Token(hash_token(token), "admin", expires_at=utcnow() - timedelta(seconds=1)))
    resp = await gateway.client.get("/api/v1/auth/whoami", headers={"Authorization": f"Bearer {token}"})
    await problem(resp, 401, "ERR_UNAUTHENTICATED")


async def test_revoked_token_is_401(gateway: Gateway) -> None:
    headers = await gateway.auth()
    assert (await gateway.client.delete("/api/v1/auth/token", headers=headers)).status == 204
    resp = await gateway.client.get("/api/v1/auth/whoami", headers=headers)
    await problem(resp, 401, "ERR_UNAUTHENTICATED")


async def test_deleting_a_user_revokes_their_tokens(gateway: Gateway) -> None:
    await gateway.add_user("bob", "bob-password")
    bob = await gateway.auth("bob", "bob-password")
    resp = await gateway.client.delete("/api/v1/users/bob", headers=await gateway.auth())
    assert resp.status == 204
    await problem(await gateway.client.get("/api/v1/auth/whoami", headers=bob), 401, "ERR_UNAUTHENTICATED")


async def test_non_admin_cannot_manage_users(gateway: Gateway) -> None:
    await gateway.add_user("carol", "carol-password")
    carol = await gateway.auth("carol", "carol-password")
    calls = [
        gateway.client.get("/api/v1/users", headers=carol),
        gateway.client.post("/api/v1/users", json={"name": "eve", "password": "eve-password"}, headers=carol),
        gateway.client.delete("/api/v1/users/admin", headers=carol),
        gateway.client.put("/api/v1/users/carol/quota", json={"cpu": "64"}, headers=carol),
    ]
    for call in calls:
        await problem(await call, 403, "ERR_FORBIDDEN")
    # and nothing happened
    users = await (await gateway.client.get("/api/v1/users", headers=await gateway.auth())).json()
    assert sorted(u["name"] for u in users["users"]) == ["admin", "carol"]
    assert users["users"][1]["quota"]["cpu"] is None


async def test_user_admin_round_trip(gateway: Gateway) -> None:
    admin = await gateway.auth()
    await gateway.add_user("dave", "dave-password")
    resp = await gateway.client.post(
        "/api/v1/users", json={"name": "dave", "password": "another-password"}, headers=admin
    )
    await problem(resp, 409, "ERR_ALREADY_EXISTS")
    resp = await gateway.client.put(
        "/api/v1/users/dave/quota",
        json={"cpu": "500m", "gpu": 1, "memory": "8Gi", "jobs": 3, "storage": 10 * 2**30, "disk": "20Gi"},
        headers=admin,
    )
    assert resp.status == 200
    assert (await resp.json())["quota"] == {
        "cpu": "500m",
        "gpu": 1,
        "memory": "8Gi",
        "jobs": 3,
        "storage": "10Gi",
        "disk": "20Gi",
    }
    await problem(
        await gateway.client.put("/api/v1/users/nobody/quota", json={}, headers=admin), 404, "ERR_NOT_FOUND"
    )
    await problem(await gateway.client.delete("/api/v1/users/nobody", headers=admin), 404, "ERR_NOT_FOUND")
    await problem(await gateway.client.delete("/api/v1/users/admin", headers=admin), 409, "ERR_CONFLICT")


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        (
            {"name": "Alice_1", "password": "long-enough"},
            "name",
            "is not a user name: a user name is 1 to 32 lowercase letters",
        ),
        ({"name": "alice", "password": "short"}, "password", "at least 8"),
        ({"name": 42, "password": "long-enough"}, "name", "string"),
        ({"name": "alice", "password": "long-enough", "admin": "yes"}, "admin", "boolean"),
        ({"name": "alice", "password": "long-enough", "colour": "red"}, "colour", "unknown field"),
        ({"password": "long-enough"}, "name", "required"),
        ([1, 2, 3], "(body)", "object"),
    ],
)
async def test_invalid_user_bodies_name_the_field(
    gateway: Gateway, body: Any, field: str, words: str
) -> None:
    resp = await gateway.client.post("/api/v1/users", json=body, headers=await gateway.auth())
    problem_body = await problem(resp, 422, "ERR_VALIDATION")
    fields = {e["field"]: e["message"] for e in problem_body["errors"]}
    assert field in fields, fields
    assert words in fields[field].lower() or words in problem_body["detail"].lower()


async def test_a_new_password_equal_to_the_current_one_is_refused_naming_the_field(gateway: Gateway) -> None:
    await gateway.add_user("frank", "frank-password")
    same = {"current_password": "frank-password", "new_password": "frank-password"}
    resp = await gateway.client.put(
        "/api/v1/auth/password", json=same, headers=await gateway.auth("frank", "frank-password")
    )
    body = await problem(resp, 422, "ERR_VALIDATION")
    assert body["detail"] == "new_password: is the same as the current password"
    assert body["errors"] == [{"field": "new_password", "message": "is the same as the current password"}]
    # Refused before the password was checked or changed: it still logs in.
    await gateway.token("frank", "frank-password")


async def test_quota_quantities_are_checked(gateway: Gateway) -> None:
    await gateway.add_user("erin", "erin-password")
    resp = await gateway.client.put(
        "/api/v1/users/erin/quota", json={"memory": "1GB", "cpu": "lots"}, headers=await gateway.auth()
    )
    body = await problem(resp, 422, "ERR_VALIDATION")
    fields = {e["field"]: e["message"] for e in body["errors"]}
    assert "Gi" in fields["memory"] and "GB" in fields["memory"]
    assert "cpu" in fields
    # The validator's sentence, without pydantic's wording in front of it.
    assert fields["memory"].startswith("'1GB'"), fields["memory"]
    assert "Value error" not in body["detail"], body["detail"]


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        (b'{"cpu": NaN}', "cpu", "finite"),
        (b'{"cpu": Infinity}', "cpu", "finite"),
        (b'{"cpu": -Infinity}', "cpu", "finite"),
        (b'{"cpu": 1e400}', "cpu", "finite"),
        (b'{"storage": false}', "storage", "expected a quantity"),
        (b'{"storage": true}', "storage", "expected a quantity"),
        (b'{"memory": true}', "memory", "expected a quantity"),
        (b'{"cpu": true}', "cpu", "expected a quantity"),
        (b'{"gpu": true}', "gpu", "whole number"),
        (b'{"jobs": false}', "jobs", "whole number"),
        (b'{"gpu": 1000000000000000000000000000000}', "gpu", "from 0 to 1000000"),
        (b'{"jobs": 10000000}', "jobs", "from 0 to 1000000"),
        (b'{"storage": "2Ei"}', "storage", "at most 1Ei"),
        (b'{"cpu": "2000000"}', "cpu", "at most a million CPUs"),
    ],
)
async def test_quota_values_nobody_means_are_422_naming_the_field(
    gateway: Gateway, body: bytes, field: str, words: str
) -> None:
    await gateway.add_user("erin", "erin-password")
    admin = await gateway.auth()
    resp = await gateway.client.put(
        "/api/v1/users/erin/quota", data=body, headers={**admin, "Content-Type": "application/json"}
    )
    answer = await problem(resp, 422, "ERR_VALIDATION")
    assert answer["errors"][0]["field"] == field, answer
    assert words in answer["errors"][0]["message"], answer
    users = await (await gateway.client.get("/api/v1/users", headers=admin)).json()
    erin = next(u for u in users["users"] if u["name"] == "erin")
    assert erin["quota"][field] is None  # nothing was stored


async def test_malformed_json_is_400(gateway: Gateway) -> None:
    resp = await gateway.client.post(
        "/api/v1/auth/token", data=b'{"username": "admin", ', headers={"Content-Type": "application/json"}
    )
    await problem(resp, 400, "ERR_BAD_JSON")


async def test_wrong_content_type_is_415(gateway: Gateway) -> None:
    resp = await gateway.client.post(
        "/api/v1/auth/token",
        data=b"username=admin",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    await problem(resp, 415, "ERR_UNSUPPORTED_MEDIA_TYPE")


async def test_oversized_json_is_413_without_reading_it_all(gateway: Gateway) -> None:
    limit = gateway.config.gateway.max_json_body
    body = b'{"username": "' + b"a" * (limit + 10) + b'", "password": "x"}'
    resp = await gateway.client.post(
        "/api/v1/auth/token", data=body, headers={"Content-Type": "application/json"}
    )
    body_json = await problem(resp, 413, "ERR_PAYLOAD_TOO_LARGE")
    assert str(limit) in body_json["detail"]


async def test_unknown_routes_are_404_problems(gateway: Gateway) -> None:
    headers = await gateway.auth()
    body = await problem(
        await gateway.client.get("/api/v1/nothing-here", headers=headers), 404, "ERR_NOT_FOUND"
    )
    assert "/api/v1/nothing-here" in body["detail"]
    await problem(await gateway.client.get("/not-api", headers=headers), 404, "ERR_NOT_FOUND")
    # A prefix that only looks like a service's is not routed to it.
    await problem(await gateway.client.get("/api/v1/jobsx", headers=headers), 404, "ERR_NOT_FOUND")


async def test_wrong_method_is_405_problem(gateway: Gateway) -> None:
    resp = await gateway.client.put("/api/v1/auth/whoami", headers=await gateway.auth())
    await problem(resp, 405, "ERR_METHOD_NOT_ALLOWED")
    assert "GET" in resp.headers["Allow"]


async def test_proxy_forwards_signed_identity_and_request_id(gateway: Gateway) -> None:
    await gateway.add_user("frank", "frank-password")
    headers = await gateway.auth("frank", "frank-password")
    headers.update(
        {
            "X-Request-ID": "req-from-the-client-1",
            # Spoofing attempts: the gateway must replace these, never pass them on.
            "X-PaddleCloud-User": "admin",
            "X-PaddleCloud-Admin": "1",
            "Connection": "keep-alive, X-Hop",
            "X-Hop": "must-not-pass",
            "X-Custom": "passes",
        }
    )
    resp = await gateway.client.get("/api/v1/pfs/echo?path=/pfs/a%20b", headers=headers)
    assert resp.status == 200
    assert resp.headers["X-Request-ID"] == "req-from-the-client-1"
    seen = await resp.json()
    assert (seen["user"], seen["admin"]) == ("frank", False)
    assert seen["request_id"] == "req-from-the-client-1"
    assert seen["raw_path"] == "/api/v1/pfs/echo?path=/pfs/a%20b"
    lowered = {k.lower(): v for k, v in seen["headers"].items()}
    assert "authorization" not in lowered
    assert "x-hop" not in lowered
    assert lowered["x-custom"] == "passes"
    assert lowered["x-forwarded-for"] == "127.0.0.1"


async def test_request_id_is_made_when_missing_or_unsafe(gateway: Gateway) -> None:
    headers = await gateway.auth()
    for sent in (None, "bad id with spaces", "id;injected=1", "x" * 300):
        extra = {} if sent is None else {"X-Request-ID": sent}
        resp = await gateway.client.get("/api/v1/jobs/echo", headers={**headers, **extra})
        seen = await resp.json()
        assert seen["request_id"] == resp.headers["X-Request-ID"]
        assert seen["request_id"] != sent and len(seen["request_id"]) == 32


async def test_service_down_is_502_at_once_and_gateway_stays_healthy(
    gateway: Gateway, report_figure: Any
) -> None:
    headers = await gateway.auth()
    start = time.monotonic()
    resp = await gateway.client.get("/api/v1/builds/anything", headers=headers)
    elapsed = time.monotonic() - start
    body = await problem(resp, 502, "ERR_UPSTREAM_UNREACHABLE")
    assert "builder" in body["detail"]
    assert body["request_id"] == resp.headers["X-Request-ID"]
    # Refused at once, not waited out: unreachable, never ERR_UPSTREAM_TIMEOUT.
    report_figure(f"gateway: 502 for a service that is down in {elapsed * 1000:.1f} ms")
    assert (await gateway.client.get("/healthz")).status == 200


async def test_slow_service_is_504(tmp_path, aiohttp_server, aiohttp_client) -> None:
    base = make_config(tmp_path)
    app = create_upstream_app(base, "jobs")

    async def stall(_request: web.Request) -> web.Response:
        import asyncio

        await asyncio.sleep(5)
        return web.Response()

    app.router.add_get("/api/v1/jobs/stall", stall)
    jobs = await aiohttp_server(app)
    config = make_config(tmp_path, gateway={"jobs_url": str(jobs.make_url("")), "read_timeout": 0.2})
    client = await aiohttp_client(create_app(config))
    login = await client.post("/api/v1/auth/token", json={"username": "admin", "password": ADMIN_PASSWORD})
    token = (await login.json())["token"]
    resp = await client.get("/api/v1/jobs/stall", headers={"Authorization": f"Bearer {token}"})
    await problem(resp, 504, "ERR_UPSTREAM_TIMEOUT")


async def test_services_refuse_requests_that_skipped_the_gateway(gateway: Gateway, aiohttp_client) -> None:
    direct = await aiohttp_client(create_upstream_app(gateway.config, "pfs"))
    path = "/api/v1/pfs/echo"
    # No credential at all.
    await problem(await direct.get(path), 401, "ERR_NOT_FROM_GATEWAY")
    # A user's bearer token is not the gateway's credential either.
    token = await gateway.token()
    await problem(
        await direct.get(path, headers={"Authorization": f"Bearer {token}"}), 401, "ERR_NOT_FROM_GATEWAY"
    )
    identity = internal_auth.Identity("admin", admin=True)
    # Signed with the wrong secret.
    forged = internal_auth.sign(b"not-the-secret", identity, "rid-1", "GET", path)
    await problem(
        await direct.get(path, headers={**forged, "X-Request-ID": "rid-1"}), 401, "ERR_NOT_FROM_GATEWAY"
    )
    # A valid signature replayed onto another path or another request id.
    secret = gateway.config.internal_secret()
    signed = internal_auth.sign(secret, identity, "rid-2", "GET", "/api/v1/pfs/other")
    await problem(
        await direct.get(path, headers={**signed, "X-Request-ID": "rid-2"}), 401, "ERR_NOT_FROM_GATEWAY"
    )
    signed = internal_auth.sign(secret, identity, "rid-3", "GET", path)
    await problem(
        await direct.get(path, headers={**signed, "X-Request-ID": "rid-4"}), 401, "ERR_NOT_FROM_GATEWAY"
    )
    # The same signature with the right request id is accepted: the check is not vacuous.
    resp = await direct.get(path, headers={**signed, "X-Request-ID": "rid-3"})
    assert resp.status == 200
    # Probes stay open for orchestrators.
    assert (await direct.get("/healthz")).status == 200


def test_stale_signatures_are_refused() -> None:
    secret = b"s" * 32
    identity = internal_auth.Identity("alice")
    headers = internal_auth.sign(secret, identity, "r", "GET", "/p")
    now = time.time()
    assert internal_auth.verify(secret, headers, "r", "GET", "/p", now=now) == identity
    late = now + internal_auth.MAX_AGE_SECONDS + 5
    assert internal_auth.verify(secret, headers, "r", "GET", "/p", now=late) is None


async def test_admin_is_bootstrapped_once(tmp_path, aiohttp_client) -> None:
    config = make_config(tmp_path)
    first = await aiohttp_client(create_app(config))
    login = await first.post("/api/v1/auth/token", json={"username": "admin", "password": ADMIN_PASSWORD})
    assert login.status == 201
    await first.close()
    # A second start with another bootstrap password does not reset the admin.
    again = make_config(tmp_path, gateway={"admin_password": "a-different-password"})
    second = await aiohttp_client(create_app(again))
    login = await second.post(
        "/api/v1/auth/token", json={"username": "admin", "password": "a-different-password"}
    )
    assert login.status == 401


async def test_metrics_and_readiness(gateway: Gateway) -> None:
    await gateway.client.get("/api/v1/auth/whoami")
    assert (await gateway.client.get("/readyz")).status == 200
    text = await (await gateway.client.get("/metrics")).text()
    assert (
        'paddlecloud_http_requests_total{method="GET",route="/api/v1/auth/whoami",status="401"} 1.0' in text
    )


async def test_cookies_from_a_service_are_not_shared_between_callers(
    tmp_path, aiohttp_server, aiohttp_client
) -> None:
    base = make_config(tmp_path)
    app = create_upstream_app(base, "jobs")

    async def set_cookie(_request: web.Request) -> web.Response:
        response = web.Response(text="set")
        response.set_cookie("session", "belongs-to-the-first-caller")
        return response

    app.router.add_get("/api/v1/jobs/set-cookie", set_cookie)
    jobs = await aiohttp_server(app)
    config = make_config(tmp_path, gateway={"jobs_url": str(jobs.make_url(""))})
    client = await aiohttp_client(create_app(config))
    login = await client.post("/api/v1/auth/token", json={"username": "admin", "password": ADMIN_PASSWORD})
    headers = {"Authorization": f"Bearer {(await login.json())['token']}"}
    resp = await client.get("/api/v1/jobs/set-cookie", headers=headers)
    assert "belongs-to-the-first-caller" in resp.headers["Set-Cookie"]  # relayed to its caller
    client.session.cookie_jar.clear()
    seen = await (await client.get("/api/v1/jobs/echo", headers=headers)).json()
    assert "cookie" not in {k.lower() for k in seen["headers"]}


async def test_small_and_empty_answers_are_relayed_exactly(tmp_path, aiohttp_server, aiohttp_client) -> None:
    base = make_config(tmp_path)
    app = create_upstream_app(base, "jobs")

    async def created(_request: web.Request) -> web.Response:
        return web.Response(
            status=201, body=b"\x00raw\xff", headers={"X-Thing": "kept", "Content-Type": "x/y"}
        )

    async def empty(_request: web.Request) -> web.Response:
        return web.Response(status=204, headers={"X-Thing": "also-kept"})

    app.router.add_get("/api/v1/jobs/created", created)
    app.router.add_get("/api/v1/jobs/empty", empty)
    jobs = await aiohttp_server(app)
    config = make_config(tmp_path, gateway={"jobs_url": str(jobs.make_url(""))})
    client = await aiohttp_client(create_app(config))
    login = await client.post("/api/v1/auth/token", json={"username": "admin", "password": ADMIN_PASSWORD})
    headers = {"Authorization": f"Bearer {(await login.json())['token']}"}
    resp = await client.get("/api/v1/jobs/created", headers=headers)
    assert (resp.status, await resp.read()) == (201, b"\x00raw\xff")
    assert (resp.headers["X-Thing"], resp.headers["Content-Type"], resp.headers["Content-Length"]) == (
        "kept",
        "x/y",
        "5",
    )
    resp = await client.get("/api/v1/jobs/empty", headers=headers)
    assert (resp.status, await resp.read(), resp.headers["X-Thing"]) == (204, b"", "also-kept")
