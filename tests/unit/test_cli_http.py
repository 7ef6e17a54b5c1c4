"""The SDK client and the CLI commands against a small fake gateway served on loopback.

The fake implements the calls of docs/api.md that the CLI uses, in memory, with problem+json
errors. It runs on its own event loop in a thread, so that the blocking `Client` and `main()`
can be called directly from a test, exactly as a user's script or shell calls them.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import secrets
import socket
import stat
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO, cast

import pytest
import yaml
from aiohttp import web

import paddlecloud
from paddlecloud.client import AsyncClient, Client
from paddlecloud.config import TokenCache
from paddlecloud.errors import ApiError, ConnectionProblem, UnexpectedAnswer
from paddlecloud.main import EXIT_AUTH, EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_UNREACHABLE, EXIT_USAGE, main

QUANTITY = re.compile(r"^\d+(\.\d+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?$")
PROBLEM = "application/problem+json"
ADMIN_PASSWORD = "admin-pw"


# --- the fake gateway -----------------------------------------------------------------------------


@dataclass
class FakeUser:
    name: str
    password: str
    admin: bool = False
    quota: dict[str, Any] = field(
        default_factory=lambda: dict.fromkeys(("cpu", "gpu", "memory", "jobs", "storage", "disk"))
    )
    created_at: str = "2026-11-22T12:00:00+00:00"

    def public(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "admin": self.admin,
            "created_at": self.created_at,
            "quota": dict(self.quota),
        }


class Problem(Exception):
    def __init__(
        self, status: int, code: str, title: str, detail: str, errors: list[dict[str, str]] | None = None
    ):
        super().__init__(detail)
        self.status, self.code, self.title, self.detail, self.errors = status, code, title, detail, errors


class FakeGateway:
    """The gateway's users/auth/version endpoints, in memory; counters let tests see what happened."""

    def __init__(self) -> None:
        self.users = {
            "admin": FakeUser("admin", "admin-pw", admin=True),
            "alice": FakeUser("alice", "alice-pw"),
        }
        self.tokens: dict[str, str] = {}
        self.logins = 0
        self.calls: list[tuple[str, str, int]] = []
        self.request_ids: list[str] = []
        self.quota_bodies: list[dict[str, Any]] = []
        self.reject_every_token = False
        self.version_requires_login = False
        self.release: asyncio.Event | None = None
        self.url = ""

    def revoke_all_tokens(self) -> None:
        self.tokens.clear()

    def calls_to(self, method: str, path: str) -> list[int]:
        return [status for m, p, status in self.calls if (m, p) == (method, path)]

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.middleware])
        app.router.add_post("/api/v1/auth/token", self.issue_token)
        app.router.add_delete("/api/v1/auth/token", self.revoke_token)
        app.router.add_get("/api/v1/auth/whoami", self.whoami)
        app.router.add_get("/api/v1/users", self.list_users)
        app.router.add_post("/api/v1/users", self.create_user)
        app.router.add_delete("/api/v1/users/{name}", self.delete_user)
        app.router.add_put("/api/v1/users/{name}/quota", self.set_quota)
        app.router.add_get("/api/v1/version", self.version)
        app.router.add_get("/api/v1/proxy-error", self.proxy_error)
        app.router.add_get("/api/v1/not-json", self.not_json)
        app.router.add_get("/api/v1/hang", self.hang)
        return app

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        request_id = request.headers.get("X-Request-ID") or secrets.token_hex(8)
        self.request_ids.append(request_id)
        try:
            response = await handler(request)
        except Problem as problem:
            body: dict[str, Any] = {
                "type": f"urn:paddlecloud:error:{problem.code}",
                "title": problem.title,
                "status": problem.status,
                "detail": problem.detail,
                "code": problem.code,
                "request_id": request_id,
            }
            if problem.errors:
                body["errors"] = problem.errors
            response = web.Response(status=problem.status, text=json.dumps(body), content_type=PROBLEM)
        response.headers["X-Request-ID"] = request_id
        self.calls.append((request.method, request.path, response.status))
        return response

    def identity(self, request: web.Request) -> FakeUser:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        name = self.tokens.get(token) if scheme in ("Bearer", "Token") else None
        if name is None or self.reject_every_token:
            raise Problem(
                401, "ERR_UNAUTHENTICATED", "Authentication required", "the token is missing or unknown"
            )
        return self.users[name]

    def admin(self, request: web.Request) -> FakeUser:
        user = self.identity(request)
        if not user.admin:
            raise Problem(403, "ERR_FORBIDDEN", "Not allowed", "only admins may manage users")
        return user

    async def issue_token(self, request: web.Request) -> web.Response:
        body = await request.json()
        user = self.users.get(body.get("username", ""))
        if user is None or user.password != body.get("password"):
            raise Problem(401, "ERR_BAD_CREDENTIALS", "Wrong username or password", "the login was refused")
        token = secrets.token_hex(16)
        self.tokens[token] = user.name
        self.logins += 1
        expires_at = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
        return web.json_response(
            {"token": token, "expires_at": expires_at, "user": user.name, "admin": user.admin}, status=201
        )

    async def revoke_token(self, request: web.Request) -> web.Response:
        self.identity(request)
        self.tokens.pop(request.headers["Authorization"].partition(" ")[2], None)
        return web.Response(status=204)

    async def whoami(self, request: web.Request) -> web.Response:
        user = self.identity(request)
        return web.json_response(
            {"user": user.name, "admin": user.admin, "expires_at": "2026-11-22T13:00:00+00:00"}
        )

    async def list_users(self, request: web.Request) -> web.Response:
        self.admin(request)
        return web.json_response({"users": [u.public() for u in self.users.values()]})

    async def create_user(self, request: web.Request) -> web.Response:
        self.admin(request)
        body = await request.json()
        errors = [
            {"field": key, "message": "is required"} for key in ("name", "password") if not body.get(key)
        ]
        if errors:
            raise Problem(422, "ERR_VALIDATION", "Request is not valid", "the user is not valid", errors)
        if body["name"] in self.users:
            raise Problem(409, "ERR_ALREADY_EXISTS", "Already exists", f"user {body['name']} exists")
        user = FakeUser(body["name"], body["password"], admin=bool(body.get("admin")))
        self.users[user.name] = user
        return web.json_response(user.public(), status=201)

    async def delete_user(self, request: web.Request) -> web.Response:
        self.admin(request)
        if self.users.pop(request.match_info["name"], None) is None:
            raise Problem(404, "ERR_NOT_FOUND", "Not found", f"no user {request.match_info['name']}")
        return web.Response(status=204)

    async def set_quota(self, request: web.Request) -> web.Response:
        self.admin(request)
        user = self.users.get(request.match_info["name"])
        if user is None:
            raise Problem(404, "ERR_NOT_FOUND", "Not found", f"no user {request.match_info['name']}")
        body = await request.json()
        self.quota_bodies.append(body)
        errors = []
        for key, value in body.items():
            if key in ("cpu", "memory", "storage", "disk"):
                if value is not None and not (isinstance(value, str) and QUANTITY.match(value)):
                    errors.append({"field": key, "message": f"{value!r} is not a quantity"})
            elif key in ("gpu", "jobs"):
                if value is not None and not (isinstance(value, int) and value >= 0):
                    errors.append({"field": key, "message": "must be a whole number, at least 0"})
            else:
                errors.append({"field": key, "message": "unknown field"})
        if errors:
            raise Problem(422, "ERR_VALIDATION", "Request is not valid", "the quota is not valid", errors)
        # As docs/api.md says: absent or null means unlimited.
        user.quota = {key: body.get(key) for key in user.quota}
        return web.json_response(user.public())

    async def version(self, request: web.Request) -> web.Response:
        if self.version_requires_login:
            self.identity(request)
        return web.json_response({"version": "9.8.7", "api": "v1"})

    async def proxy_error(self, request: web.Request) -> web.Response:
        page = "<html><head><title>502 Bad Gateway</title></head><body><h1>502</h1>nginx</body></html>"
        return web.Response(status=502, text=page, content_type="text/html")

    async def not_json(self, request: web.Request) -> web.Response:
        return web.Response(text="<html><body>Welcome to nginx!</body></html>", content_type="text/html")

    async def hang(self, request: web.Request) -> web.Response:
        assert self.release is not None
        await self.release.wait()
        return web.json_response({})


class ServerThread:
    """Serves an app on 127.0.0.1, port 0, from an event loop of its own in a thread."""

    def __init__(self, gateway: FakeGateway) -> None:
        self.gateway = gateway
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._serve, name="fake-gateway", daemon=True)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._start())
        except BaseException as exc:
            self._error = exc
            return
        finally:
            self._started.set()
        self._loop.run_forever()
        assert self._runner is not None
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    async def _start(self) -> None:
        self.gateway.release = asyncio.Event()
        self._runner = web.AppRunner(self.gateway.app())
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    def __enter__(self) -> ServerThread:
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc_info: object) -> None:
        # Let a handler that is still waiting finish, then stop the loop and clean up.
        release = self.gateway.release
        assert release is not None
        self._loop.call_soon_threadsafe(release.set)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()


@pytest.fixture
def gateway() -> Iterator[FakeGateway]:
    fake = FakeGateway()
    with ServerThread(fake) as server:
        fake.url = server.url
        yield fake


@pytest.fixture
def dead_endpoint() -> Iterator[str]:
    """A loopback port that is bound but not listening: connecting to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


# --- the SDK ----------------------------------------------------------------------------------------


def cache_for(tmp_path: Path) -> TokenCache:
    return TokenCache(tmp_path / ".paddle" / "tokens.json")


def test_the_package_exports_the_client() -> None:
    assert paddlecloud.Client is Client
    assert paddlecloud.AsyncClient is AsyncClient
    assert paddlecloud.ApiError is ApiError
    assert isinstance(paddlecloud.__version__, str)


def test_login_caches_the_token_and_the_next_client_reuses_it(gateway: FakeGateway, tmp_path: Path) -> None:
    cache = cache_for(tmp_path)
    slot = cache.slot("dc1", "alice", gateway.url)
    with Client(gateway.url, "alice", "alice-pw", token_cache=slot) as client:
        assert client.whoami()["user"] == "alice"
        token = client.token
    assert gateway.logins == 1
    assert stat.S_IMODE(cache.path.stat().st_mode) == 0o600
    assert cache.get("dc1", "alice").token == token  # type: ignore[union-attr]

    with Client(gateway.url, "alice", "alice-pw", token_cache=slot) as again:
        assert again.whoami()["user"] == "alice"
    assert gateway.logins == 1  # no second login: the cached token was used


def test_a_stale_token_is_replaced_by_one_login_and_the_call_retried(
    gateway: FakeGateway, tmp_path: Path
) -> None:
    slot = cache_for(tmp_path).slot("dc1", "alice", gateway.url)
    with Client(gateway.url, "alice", "alice-pw", token_cache=slot) as client:
        client.login()
        old = client.token
        gateway.revoke_all_tokens()  # as a restarted server or an admin would
        assert client.whoami()["user"] == "alice"
        assert client.token != old
    assert gateway.logins == 2
    assert gateway.calls_to("GET", "/api/v1/auth/whoami") == [401, 200]
    assert slot.load() == client.token


def test_the_login_is_retried_once_only(gateway: FakeGateway, tmp_path: Path) -> None:
    slot = cache_for(tmp_path).slot("dc1", "alice", gateway.url)
    with Client(gateway.url, "alice", "alice-pw", token_cache=slot) as client:
        client.login()
        gateway.reject_every_token = True
        with pytest.raises(ApiError) as caught:
            client.whoami()
    assert caught.value.status == 401
    assert gateway.logins == 2
    assert gateway.calls_to("GET", "/api/v1/auth/whoami") == [401, 401]
    assert slot.load() is None  # a refused token is not kept


async def test_concurrent_calls_meeting_a_stale_token_log_in_once(
    gateway: FakeGateway, tmp_path: Path
) -> None:
    slot = cache_for(tmp_path).slot("dc1", "alice", gateway.url)
    async with AsyncClient(gateway.url, "alice", "alice-pw", token_cache=slot) as client:
        await client.login()
        gateway.revoke_all_tokens()
        answers = await asyncio.gather(*(client.whoami() for _ in range(5)))
    assert [a["user"] for a in answers] == ["alice"] * 5
    assert gateway.logins == 2


def test_version_logs_in_only_when_the_server_insists(gateway: FakeGateway) -> None:
    with Client(gateway.url, "alice", "alice-pw") as client:
        assert client.version() == {"version": "9.8.7", "api": "v1"}
        assert gateway.logins == 0
        gateway.version_requires_login = True
        assert client.version()["version"] == "9.8.7"
    assert gateway.logins == 1
    assert gateway.calls_to("GET", "/api/v1/version") == [200, 401, 200]


def test_without_a_password_a_refused_token_is_an_api_error(gateway: FakeGateway) -> None:
    with Client(gateway.url, token="not-a-token") as client, pytest.raises(ApiError) as caught:
        client.whoami()
    error = caught.value
    assert (error.status, error.code, error.title) == (401, "ERR_UNAUTHENTICATED", "Authentication required")
    assert error.request_id == gateway.request_ids[-1]
    assert str(error) == (
        f"Authentication required: the token is missing or unknown (request id {gateway.request_ids[-1]})"
    )


def test_a_wrong_password_is_bad_credentials(gateway: FakeGateway) -> None:
    with Client(gateway.url, "alice", "wrong") as client, pytest.raises(ApiError) as caught:
        client.whoami()
    assert (caught.value.status, caught.value.code) == (401, "ERR_BAD_CREDENTIALS")
    assert gateway.calls_to("GET", "/api/v1/auth/whoami") == []  # it never got that far


def test_validation_errors_carry_their_fields(gateway: FakeGateway) -> None:
    with Client(gateway.url, "admin", "admin-pw") as client, pytest.raises(ApiError) as caught:
        client.set_quota("alice", cpu="lots", gpu=-1)
    error = caught.value
    assert error.status == 422
    assert [(e.field, e.message) for e in error.errors] == [
        ("cpu", "'lots' is not a quantity"),
        ("gpu", "must be a whole number, at least 0"),
    ]
    assert "the quota is not valid; cpu: 'lots' is not a quantity; gpu: must be a whole number" in str(error)


def test_an_error_page_that_is_not_problem_json_is_summarized(gateway: FakeGateway) -> None:
    with Client(gateway.url, "alice", "alice-pw") as client, pytest.raises(ApiError) as caught:
        client.request("GET", "proxy-error")
    error = caught.value
    assert (error.status, error.code, error.title) == (502, None, "HTTP 502 Bad Gateway")
    assert error.detail == "502 Bad Gateway"
    assert "<" not in str(error)


def test_a_2xx_answer_that_is_not_json_is_reported(gateway: FakeGateway) -> None:
    with Client(gateway.url, "alice", "alice-pw") as client, pytest.raises(UnexpectedAnswer) as caught:
        client.request("GET", "not-json")
    assert "text/html" in str(caught.value)
    assert "is it a PaddleCloud gateway?" in str(caught.value)


def test_an_unreachable_server_is_a_connection_problem_naming_it(dead_endpoint: str) -> None:
    with Client(dead_endpoint, "alice", "alice-pw") as client, pytest.raises(ConnectionProblem) as caught:
        client.whoami()
    assert str(caught.value) == f"cannot reach {dead_endpoint}: connection refused (is the server running?)"
    assert isinstance(caught.value, paddlecloud.PaddleCloudError)


async def test_a_server_that_does_not_answer_times_out(gateway: FakeGateway) -> None:
    async with AsyncClient(gateway.url, timeout=0.2) as client:
        with pytest.raises(ConnectionProblem) as caught:
            await client.request("GET", "hang", auth=False)
    assert str(caught.value) == f"cannot reach {gateway.url}: no answer within 0.2s"


def test_admins_manage_users_and_others_may_not(gateway: FakeGateway) -> None:
    with Client(gateway.url, "admin", "admin-pw") as admin:
        created = admin.create_user("bob", "bob-pw", admin=False)
        assert created["name"] == "bob"
        assert "bob" in [u["name"] for u in admin.users()]
        assert admin.set_quota("bob", cpu="4", memory="8Gi")["quota"]["memory"] == "8Gi"
        with pytest.raises(ValueError, match="unknown quota keys"):
            admin.set_quota("bob", disks="1Gi")
        admin.delete_user("bob")
        assert "bob" not in gateway.users
    with Client(gateway.url, "alice", "alice-pw") as alice, pytest.raises(ApiError) as caught:
        alice.users()
    assert (caught.value.status, caught.value.code) == (403, "ERR_FORBIDDEN")


def test_logout_revokes_the_token_and_forgets_it(gateway: FakeGateway, tmp_path: Path) -> None:
    slot = cache_for(tmp_path).slot("dc1", "alice", gateway.url)
    with Client(gateway.url, "alice", "alice-pw", token_cache=slot) as client:
        client.login()
        assert client.logout() is True
        assert gateway.tokens == {}
        assert slot.load() is None
        assert client.logout() is False
    assert gateway.logins == 1  # logging out never logs in


# --- the commands -------------------------------------------------------------------------------------


@dataclass
class Run:
    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return self.err.splitlines()


class Cli:
    """`main()` with a temporary HOME holding a config for the fake gateway."""

    def __init__(
        self, home: Path, endpoint: str, username: str = "admin", password: str = ADMIN_PASSWORD
    ) -> None:
        self.home = home
        self.write_config(endpoint, username, password)

    @property
    def config_path(self) -> Path:
        return self.home / ".paddle" / "config"

    @property
    def cache(self) -> TokenCache:
        return TokenCache(self.home / ".paddle" / "tokens.json")

    def write_config(self, endpoint: str, username: str, password: str) -> None:
        self.config_path.parent.mkdir(parents=True, exist_ok=True)
        config = {
            "datacenters": [
                {"name": "dc1", "username": username, "password": password, "endpoint": endpoint}
            ],
            "current-datacenter": "dc1",
        }
        self.config_path.write_text(yaml.safe_dump(config))
        self.config_path.chmod(0o600)

    def __call__(self, *argv: str, stdin: str = "", env: dict[str, str] | None = None) -> Run:
        stdout, stderr = io.StringIO(), io.StringIO()
        code = main(
            list(argv),
            env={"HOME": str(self.home), **(env or {})},
            stdout=stdout,
            stderr=stderr,
            stdin=io.StringIO(stdin),
        )
        return Run(code, stdout.getvalue(), stderr.getvalue())


@pytest.fixture
def cli(gateway: FakeGateway, tmp_path: Path) -> Cli:
    return Cli(tmp_path, gateway.url)


def assert_one_error_line(run: Run, *parts: str) -> None:
    assert len(run.err_lines) == 1, run.err
    assert run.err_lines[0].startswith("paddlecloud: error: ")
    assert "Traceback" not in run.err
    for part in parts:
        assert part in run.err_lines[0]


def test_login_says_who_you_are_and_caches_the_token(cli: Cli, gateway: FakeGateway) -> None:
    run = cli("login")
    assert (run.code, run.err) == (0, "")
    assert run.out.startswith(f"Logged in to dc1 ({gateway.url}) as admin (admin); the token expires at ")
    cached = cli.cache.get("dc1", "admin", gateway.url)
    assert cached is not None and cached.token in gateway.tokens
    assert stat.S_IMODE(cli.cache.path.stat().st_mode) == 0o600

    assert cli("whoami").code == 0
    assert gateway.logins == 1  # whoami used the cached token


def test_login_as_json_parses_and_leaves_the_token_out(cli: Cli, gateway: FakeGateway) -> None:
    run = cli("login", "-o", "json")
    data = json.loads(run.out)
    assert (data["user"], data["admin"], data["datacenter"]) == ("admin", True, "dc1")
    assert "token" not in data
    assert not any(token in run.out for token in gateway.tokens)


def test_a_wrong_password_exits_4_with_one_line(cli: Cli, gateway: FakeGateway) -> None:
    cli.write_config(gateway.url, "alice", "wrong")
    run = cli("login")
    assert run.code == EXIT_AUTH == 4
    assert run.out == ""
    assert_one_error_line(
        run,
        "paddlecloud: error: Wrong username or password: the login was refused",
        f"(request id {gateway.request_ids[-1]})",
    )


def test_an_unreachable_server_exits_3_with_one_line_naming_it(cli: Cli, dead_endpoint: str) -> None:
    cli.write_config(dead_endpoint, "admin", "admin-pw")
    run = cli("whoami")
    assert run.code == EXIT_UNREACHABLE == 3
    assert_one_error_line(run, f"paddlecloud: error: cannot reach {dead_endpoint}: connection refused")


def test_a_stale_cached_token_is_replaced_transparently(cli: Cli, gateway: FakeGateway) -> None:
    assert cli("login").code == 0
    gateway.revoke_all_tokens()
    run = cli("whoami", "-o", "json")
    assert run.code == 0, run.err
    assert json.loads(run.out)["user"] == "admin"
    assert gateway.logins == 2
    assert gateway.calls_to("GET", "/api/v1/auth/whoami") == [401, 200]
    cached = cli.cache.get("dc1", "admin")
    assert cached is not None and cached.token in gateway.tokens


def test_users_as_json_is_the_servers_answer(cli: Cli, gateway: FakeGateway) -> None:
    run = cli("users", "list", "-o", "json")
    assert run.code == 0, run.err
    assert json.loads(run.out) == {"users": [u.public() for u in gateway.users.values()]}
    # `get users` is the same command, and global options may come first.
    assert cli("-o", "json", "get", "users").out == run.out
    assert yaml.safe_load(cli("get", "users", "-o", "yaml").out) == json.loads(run.out)


def test_users_as_a_table(cli: Cli, gateway: FakeGateway) -> None:
    gateway.users["alice"].quota["memory"] = "8Gi"
    lines = cli("users", "list").out.splitlines()
    assert lines[0].split() == ["NAME", "ADMIN", "CPU", "GPU", "MEMORY", "JOBS", "STORAGE", "DISK", "CREATED"]
    assert lines[2].split() == [
        "alice",
        "no",
        "unlimited",
        "unlimited",
        "8Gi",
        "unlimited",
        "unlimited",
        "unlimited",
        "2026-11-22T12:00:00+00:00",
    ]


def test_creating_a_user_without_a_password_generates_one_and_prints_it_once(
    cli: Cli, gateway: FakeGateway
) -> None:
    run = cli("users", "create", "bob", "--admin")
    assert run.code == 0, run.err
    password = gateway.users["bob"].password
    assert len(password) >= 20
    assert run.out == (
        f"Created user bob (admin).\nPassword (shown only this once): {password}\n"
        "Quota: unlimited; set one with `paddlecloud users quota bob`, or one for every new user "
        "with gateway.default_quota.\n"
    )
    with Client(gateway.url, "bob", password) as bob:
        assert bob.whoami() == {"user": "bob", "admin": True, "expires_at": "2026-11-22T13:00:00+00:00"}

    as_json = json.loads(cli("users", "create", "carol", "-o", "json").out)
    assert as_json["password"] == gateway.users["carol"].password


def test_creating_a_user_with_a_password_from_stdin(cli: Cli, gateway: FakeGateway) -> None:
    run = cli("users", "create", "dave", "--password-stdin", stdin="from stdin\n")
    assert run.code == 0 and run.out.startswith("Created user dave.\nQuota: unlimited;"), run.out
    assert gateway.users["dave"].password == "from stdin"

    empty = cli("users", "create", "erin", "--password-stdin", stdin="")
    assert empty.code == EXIT_USAGE
    assert_one_error_line(empty, "--password-stdin: stdin gave an empty password")
    assert "erin" not in gateway.users

    both = cli("users", "create", "erin", "--password", "x", "--password-stdin")
    assert both.code == EXIT_USAGE
    assert "not allowed with argument" in both.err


def test_deleting_a_user(cli: Cli, gateway: FakeGateway) -> None:
    assert cli("users", "delete", "alice").out == (
        "Deleted user alice: their jobs are stopped and forgotten, their home archived on the server.\n"
    )
    assert "alice" not in gateway.users
    missing = cli("users", "delete", "alice")
    assert missing.code == EXIT_FAILURE
    assert_one_error_line(missing, "Not found: no user alice (request id ")


@pytest.mark.parametrize("spelling", ["-cpu", "--cpu"])
def test_quota_flags_work_go_and_gnu_style(cli: Cli, gateway: FakeGateway, spelling: str) -> None:
    run = cli("users", "quota", "alice", spelling, "2")
    assert run.code == 0, run.err
    assert gateway.quota_bodies[-1]["cpu"] == "2"
    assert "CPU:     2" in run.out


def test_quota_changes_only_the_limits_given(cli: Cli, gateway: FakeGateway) -> None:
    assert cli("users", "quota", "alice", "-memory", "8Gi", "-jobs", "3").code == 0
    assert cli("users", "quota", "alice", "--gpu", "1").code == 0
    assert cli("users", "quota", "alice", "-disk", "200Gi").code == 0
    assert gateway.users["alice"].quota == {
        "cpu": None,
        "gpu": 1,
        "memory": "8Gi",
        "jobs": 3,
        "storage": None,
        "disk": "200Gi",
    }
    assert cli("users", "quota", "alice", "--jobs", "unlimited").code == 0
    assert gateway.users["alice"].quota["jobs"] is None

    shown = cli("users", "quota", "alice", "-o", "json")
    assert json.loads(shown.out)["quota"]["memory"] == "8Gi"
    assert len(gateway.quota_bodies) == 4  # showing changes nothing


def test_a_validation_error_is_one_line_with_every_field(cli: Cli, gateway: FakeGateway) -> None:
    run = cli("users", "quota", "alice", "-cpu", "lots", "-storage", "huge")
    assert run.code == EXIT_FAILURE
    assert_one_error_line(
        run,
        "paddlecloud: error: Request is not valid: the quota is not valid; "
        "cpu: 'lots' is not a quantity; storage: 'huge' is not a quantity "
        f"(request id {gateway.request_ids[-1]})",
    )


def test_a_refusal_exits_1_with_the_request_id(cli: Cli, gateway: FakeGateway) -> None:
    cli.write_config(gateway.url, "alice", "alice-pw")
    run = cli("users", "list")
    assert run.code == EXIT_FAILURE
    assert_one_error_line(
        run,
        "paddlecloud: error: Not allowed: only admins may manage users "
        f"(request id {gateway.request_ids[-1]})",
    )


def test_debug_shows_the_traceback_and_the_http_calls(cli: Cli, gateway: FakeGateway) -> None:
    cli.write_config(gateway.url, "alice", "alice-pw")
    run = cli("--debug", "users", "list")
    assert run.code == EXIT_FAILURE
    assert "Traceback (most recent call last)" in run.err
    assert f"paddlecloud: debug: GET {gateway.url}/api/v1/users -> 403" in run.err
    assert run.err_lines[-1].startswith("paddlecloud: error: Not allowed")


def test_version_shows_both_versions(cli: Cli, gateway: FakeGateway) -> None:
    run = cli("version")
    assert run.code == 0, run.err
    assert run.out == f"Client: {paddlecloud.__version__}\nServer: 9.8.7 (API v1) at dc1 ({gateway.url})\n"
    data = json.loads(cli("version", "-o", "json").out)
    assert data["client"] == {"version": paddlecloud.__version__}
    assert data["server"] == {"version": "9.8.7", "api": "v1"}


def test_version_without_a_server_still_shows_the_client(cli: Cli, dead_endpoint: str) -> None:
    cli.write_config(dead_endpoint, "admin", "admin-pw")
    run = cli("version")
    assert run.code == EXIT_UNREACHABLE
    assert run.out == f"Client: {paddlecloud.__version__}\n"
    assert_one_error_line(run, f"cannot reach {dead_endpoint}")


def test_version_needs_no_config_with_an_endpoint(gateway: FakeGateway, tmp_path: Path) -> None:
    cli = Cli(tmp_path, gateway.url)
    cli.config_path.unlink()
    run = cli("--endpoint", gateway.url, "version")
    assert run.code == 0, run.err
    assert "Server: 9.8.7" in run.out
    assert gateway.logins == 0


def test_no_config_exits_4_and_says_how_to_make_one(gateway: FakeGateway, tmp_path: Path) -> None:
    cli = Cli(tmp_path, gateway.url)
    cli.config_path.unlink()
    run = cli("whoami")
    assert run.code == EXIT_AUTH
    assert_one_error_line(run, f"no client config at {cli.config_path}", "paddlecloud config add")


def test_config_add_then_use_then_log_in(gateway: FakeGateway, tmp_path: Path) -> None:
    cli = Cli(tmp_path, gateway.url)
    cli.config_path.unlink()
    run = cli(
        "config",
        "add",
        "dc2",
        "--endpoint",
        gateway.url,
        "-username",
        "alice",
        "--password-stdin",
        stdin="alice-pw\n",
    )
    assert run.code == 0, run.err
    assert stat.S_IMODE(cli.config_path.stat().st_mode) == 0o600
    assert (
        cli("whoami", "-o", "json").out
        == json.dumps({"user": "alice", "admin": False, "expires_at": "2026-11-22T13:00:00+00:00"}, indent=2)
        + "\n"
    )

    assert (
        cli(
            "config", "add", "dc3", "--endpoint", gateway.url, "--username", "admin", "--password", "admin-pw"
        ).code
        == 0
    )
    assert cli("whoami", "-o", "json", "--datacenter", "dc3").out.count('"admin": true') == 1
    assert cli("config", "use", "dc3").code == 0
    assert json.loads(cli("whoami", "-o", "json").out)["user"] == "admin"
    shown = cli("config", "show")
    assert "alice-pw" not in shown.out and "admin-pw" not in shown.out
    unknown = cli("config", "use", "nowhere")
    assert unknown.code == EXIT_FAILURE
    assert_one_error_line(unknown, "there is no datacenter 'nowhere'")


def test_logout_removes_the_cached_token(cli: Cli, gateway: FakeGateway) -> None:
    assert cli("login").code == 0
    assert cli("logout").out.startswith("Logged out of dc1; the password is removed from ")
    assert gateway.tokens == {}
    assert cli.cache.get("dc1", "admin") is None
    assert cli("logout").out == "Not logged in to dc1.\n"
    # The password went with the token: no silent login behind the next command.
    refused = cli("whoami")
    assert refused.code == 4 and "not logged in" in refused.err
    assert gateway.logins == 1


def test_usage_errors_exit_2(cli: Cli) -> None:
    run = cli("users", "quota", "alice", "-gpu", "two")
    assert run.code == EXIT_USAGE
    assert "argument -gpu/--gpu: expected a whole number or 'unlimited', got 'two'" in run.err
    assert cli("no-such-command").code == EXIT_USAGE
    bare = cli()  # a bare `paddlectl` prints help, as the original did
    assert bare.code == 0 and "commands:" in bare.out


def test_help_documents_the_exit_codes_and_examples(cli: Cli) -> None:
    run = cli("--help")
    assert run.code == 0
    for line in (
        "0    success",
        "2    usage error",
        "3    cannot reach the server",
        "4    not logged in",
        "130  interrupted",
    ):
        assert line in run.out
    quota_help = cli("users", "quota", "--help").out
    assert "paddlecloud users quota bob -cpu 8 -gpu 1" in quota_help
    assert "-cpu, --cpu Q" in quota_help


def test_an_interrupt_exits_130(cli: Cli) -> None:
    class Interrupting:
        """A terminal whose user presses Ctrl-C while asked for a password."""

        def readline(self) -> str:
            raise KeyboardInterrupt

    stderr = io.StringIO()
    code = main(
        ["users", "create", "bob", "--password-stdin"],
        env={"HOME": str(cli.home)},
        stdout=io.StringIO(),
        stderr=stderr,
        stdin=cast(TextIO, Interrupting()),
    )
    assert code == EXIT_INTERRUPTED == 130
    assert stderr.getvalue() == "paddlecloud: interrupted\n"


def test_main_without_arguments_reads_the_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/paddlectl", "--version"])
    with pytest.raises(SystemExit) as caught:
        sys.exit(main())
    assert caught.value.code == 0
    assert capsys.readouterr().out == f"paddlectl {paddlecloud.__version__}\n"
