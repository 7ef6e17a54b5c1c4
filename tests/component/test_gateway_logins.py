"""Login guessing is refused with a 429, and password hashes are bounded, through the real gateway."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Literal

import aiohttp
from argon2 import PasswordHasher

from paddlecloud.gateway.app import create_app
from paddlecloud.gateway.keys import ACCOUNTS
from paddlecloud.gateway.session import CSRF_FIELD
from support import ADMIN_PASSWORD, make_config

TOKEN = "/api/v1/auth/token"


async def _gateway(tmp_path: Any, aiohttp_server: Any, **gateway: Any) -> Any:
    server = await aiohttp_server(create_app(make_config(tmp_path, gateway=gateway)), host="127.0.0.1")
    return server


async def _login(
    server: Any, username: str, password: str, source: str = "127.0.0.1"
) -> aiohttp.ClientResponse:
    """A login from the loopback address `source` (Linux answers any 127/8 address)."""
    connector = aiohttp.TCPConnector(local_addr=(source, 0))
    async with aiohttp.ClientSession(connector=connector) as session:
        resp = await session.post(server.make_url(TOKEN), json={"username": username, "password": password})
        await resp.read()
        return resp


async def _limited(resp: aiohttp.ClientResponse) -> int:
    assert resp.status == 429, await resp.text()
    assert resp.content_type == "application/problem+json"
    body = await resp.json()
    assert body["code"] == "ERR_TOO_MANY_REQUESTS" and "Retry-After" in body["detail"], body
    wait = int(resp.headers["Retry-After"])
    assert wait >= 1 and body["retry_after"] == wait
    return wait


async def test_a_guessed_user_name_is_refused_with_429_even_with_the_right_password(
    tmp_path: Any, aiohttp_server: Any
) -> None:
    server = await _gateway(tmp_path, aiohttp_server, login_failures_per_user=5)
    for _ in range(5):
        assert (await _login(server, "admin", "a-wrong-guess")).status == 401
    await _limited(await _login(server, "admin", "another-guess"))
    # While limited, the right password is refused too: guessing learns nothing.
    await _limited(await _login(server, "admin", ADMIN_PASSWORD))
    # Unknown names are limited alike, so the limit tells no one which names exist.
    for _ in range(5):
        assert (await _login(server, "nobody", "a-wrong-guess")).status == 401
    await _limited(await _login(server, "nobody", "a-wrong-guess"))
    # Another user logs in as ever.
    accounts = server.app[ACCOUNTS]
    await accounts.create_user("alice", "alice-password")
    assert (await _login(server, "alice", "alice-password")).status == 201


async def test_an_address_that_guesses_is_refused_and_others_are_not(
    tmp_path: Any, aiohttp_server: Any
) -> None:
    server = await _gateway(tmp_path, aiohttp_server, login_failures_per_user=0, login_failures_per_address=4)
    for name in ("a1", "a2", "a3", "a4"):  # a password spray: one guess per name
        assert (await _login(server, name, "a-wrong-guess")).status == 401
    await _limited(await _login(server, "admin", ADMIN_PASSWORD))
    assert (await _login(server, "admin", ADMIN_PASSWORD, source="127.0.0.2")).status == 201


async def test_the_default_limits_protect(tmp_path: Any, aiohttp_server: Any) -> None:
    server = await _gateway(tmp_path, aiohttp_server)
    for _ in range(50):
        resp = await _login(server, "admin", "a-wrong-guess")
        if resp.status == 429:
            break
        assert resp.status == 401
    await _limited(resp)


async def test_the_dashboard_sign_in_is_limited_too(tmp_path: Any, aiohttp_server: Any) -> None:
    server = await _gateway(tmp_path, aiohttp_server, login_failures_per_user=2)
    # unsafe: keep the cookies of an IP address (the sign-in form's CSRF cookie).
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
        statuses = []
        for _ in range(3):
            async with session.get(server.make_url("/login")) as page:
                text = await page.text()
            csrf = text.split(f'name="{CSRF_FIELD}" value="', 1)[1].split('"', 1)[0]
            form = {CSRF_FIELD: csrf, "next": "/", "username": "admin", "password": "a-wrong-guess"}
            async with session.post(server.make_url("/login"), data=form, allow_redirects=False) as resp:
                statuses.append(resp.status)
                last = (resp.headers.get("Retry-After"), await resp.text())
    assert statuses == [401, 401, 429], statuses
    assert last[0] is not None and int(last[0]) >= 1
    assert "Too many failed sign-ins" in last[1]


class _CountingHasher(PasswordHasher):
    """The real argon2 hasher, counting how many of its hashes run at once."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.running = 0
        self.peak = 0

    def _counted(self, work: Any, *args: Any) -> Any:
        with self._lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        try:
            return work(*args)
        finally:
            with self._lock:
                self.running -= 1

    def hash(self, password: str | bytes, *, salt: bytes | None = None) -> str:
        return str(self._counted(super().hash, password))

    def verify(self, hash: str | bytes, password: str | bytes) -> Literal[True]:
        self._counted(super().verify, hash, password)  # raises unless it verified
        return True


async def test_concurrent_logins_never_run_more_hashes_than_the_bound(
    tmp_path: Any, aiohttp_server: Any
) -> None:
    server = await _gateway(
        tmp_path, aiohttp_server, login_max_concurrent_hashes=2, login_failures_per_address=1000
    )
    hasher = _CountingHasher()
    server.app[ACCOUNTS]._hasher = hasher
    # Logins at once, of unknown users and of a known one with a wrong password: more
    # than the threads asyncio.to_thread has on a small machine (cores + 4).
    names = [f"ghost-{i}" for i in range(12)] + ["admin"] * 4
    answers = await asyncio.gather(*(_login(server, name, "a-wrong-guess") for name in names))
    assert [r.status for r in answers] == [401] * len(names)
    assert hasher.peak <= 2, hasher.peak
    assert hasher.running == 0
