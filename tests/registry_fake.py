"""A small Registry HTTP API v2 on loopback that authenticates the way Docker Hub does: a
401 with `WWW-Authenticate: Bearer realm=...,service=...,scope=...`, a token server that
checks basic credentials, then the request again with the token. It holds manifests by
repository and tag (what a HEAD asks), and counts the requests, for the test of the
builder's registry client that the real registry cannot serve: Debian's docker-registry
(tests/real_registry.py, which the Kaniko backend's other tests use) is set up with
htpasswd, basic auth.

It runs in a thread of its own, so an async test can use it without blocking its loop.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import secrets
import threading
from dataclasses import dataclass

from aiohttp import web


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    authorization: str  # "", "Basic", or "Bearer"


class FakeRegistry:
    def __init__(self, users: dict[str, str], *, service: str = "fake-registry") -> None:
        self.users = dict(users)
        self.service = service
        self.manifests: dict[tuple[str, str], bytes] = {}
        self.requests: list[Seen] = []
        self.tokens: dict[str, str] = {}  # token → scope
        self.url = ""
        self.host = ""
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    # -- contents --------------------------------------------------------------------

    def put(self, repository: str, tag: str, content: str = "") -> str:
        """Store a manifest under `tag` (and its digest); the digest."""
        body = json.dumps({"schemaVersion": 2, "content": content or secrets.token_hex(8)}).encode()
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        with self._lock:
            self.manifests[(repository, tag)] = body
            self.manifests[(repository, digest)] = body
        return digest

    def has(self, repository: str, tag: str) -> bool:
        with self._lock:
            return (repository, tag) in self.manifests

    # -- the API ---------------------------------------------------------------------

    async def _token(self, request: web.Request) -> web.Response:
        header = request.headers.get("Authorization", "")
        scope = request.query.get("scope", "")
        if header.startswith("Basic "):
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
            if self.users.get(user) != password:
                return web.json_response({"details": "incorrect username or password"}, status=401)
        elif self.users:
            return web.json_response({"details": "authentication required"}, status=401)
        token = secrets.token_hex(16)
        self.tokens[token] = scope
        return web.json_response({"token": token, "expires_in": 300})

    async def _manifest(self, request: web.Request) -> web.Response:
        repository, reference = request.match_info["repo"], request.match_info["ref"]
        header = request.headers.get("Authorization", "")
        self.requests.append(Seen(request.method, request.path, header.split(" ", 1)[0]))
        scope = f"repository:{repository}:pull"
        if not header.startswith("Bearer ") or self.tokens.get(header[7:]) != scope:
            challenge = f'Bearer realm="{self.url}/token",service="{self.service}",scope="{scope}"'
            return web.json_response(
                {"errors": [{"code": "UNAUTHORIZED"}]}, status=401, headers={"WWW-Authenticate": challenge}
            )
        with self._lock:
            body = self.manifests.get((repository, reference))
        if body is None:
            return web.json_response({"errors": [{"code": "MANIFEST_UNKNOWN"}]}, status=404)
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        headers = {
            "Docker-Content-Digest": digest,
            "Content-Type": "application/vnd.oci.image.manifest.v1+json",
        }
        return web.Response(body=body, headers=headers)

    # -- running ---------------------------------------------------------------------

    def __enter__(self) -> FakeRegistry:
        self._thread = threading.Thread(target=self._serve, name="registry-fake", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fake registry did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def _serve(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        app = web.Application()
        app.router.add_get("/token", self._token)
        app.router.add_route("*", r"/v2/{repo:.+}/manifests/{ref}", self._manifest)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        self.host = f"{host}:{port}"
        self.url = f"http://{self.host}"
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()
