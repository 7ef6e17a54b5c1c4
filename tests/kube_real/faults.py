"""A fault-injecting proxy in front of the real API server: the faults a real control
plane does not give on demand (an API server answering 500 for a minute, watches that
expire, calls that hang), for the tests of what the jobs service does meanwhile.

The proxy terminates TLS on loopback with a server certificate from the cluster's CA and
forwards every request (method, path and query, headers with the bearer token, body) to
the API server, streaming each answer back as it comes, so watches and `follow` logs
stream through it. A client reaches it with the same CA and the same token: `kubeconfig()`
writes a copy of a ServiceAccount's kubeconfig that points at the proxy. Client
certificates cannot be forwarded by a proxy that terminates TLS: identities that
authenticate with one (the admin, the kubelet) talk to the API server directly.

Faults, each until `heal()`:
- `fail(status, seconds, ...)`: matching requests are answered `status` with a Status
  body (as the API server words an internal error) for `seconds`; open watches and log
  streams that match end, as a failing server's would.
- `expire_watches()`: every open watch ends, and a watch resumed from any
  resourceVersion before now is answered as the real API server answers one from before
  its history (etcd compaction, or the watch cache's window): 200 and one ERROR event
  whose object is a Status with code 410, reason Expired, "too old resource version".
  A list and a watch from its resourceVersion work as before.
- `hang(...)`: matching calls are accepted and never answered (with `forward`, after the
  API server has done them: the answer is what gets lost); `heal()` drops their
  connections.

docs/testing.md ("Faults: a proxy in front of the real API server") says why a proxy
and not the fake.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import ssl
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
from aiohttp import web

from kube_real.cluster import Cluster

# Not forwarded either way: they describe one hop, not the message (RFC 9110 7.6.1), or
# are set again by aiohttp for the next hop.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"}
    | {"host", "content-length"}
)
REASONS = {500: "InternalError", 502: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}


def status_object(code: int, reason: str, message: str) -> dict[str, Any]:
    """A metav1.Status, as the API server sends for an error."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


@dataclass
class Seen:
    """One request that reached the proxy, and what became of it."""

    method: str
    path: str
    query: dict[str, str]
    # The status the client got (0: none yet, or never: hung, or the client left).
    status: int = 0
    # "" (forwarded), "failed", "hung" or "expired".
    fault: str = ""

    @property
    def watch(self) -> bool:
        return self.query.get("watch") in ("1", "true")


@dataclass
class _Rule:
    kind: Literal["fail", "hang"]
    method: str | None
    path: re.Pattern[str] | None
    watch: bool | None
    until: float | None = None  # monotonic time; None: until heal()
    times: int | None = None  # how many more requests it applies to; None: all
    status: int = 500
    forward: bool = False

    def matches(self, request: web.Request) -> bool:
        if self.until is not None and time.monotonic() >= self.until:
            return False
        if self.times is not None and self.times <= 0:
            return False
        if self.method is not None and request.method != self.method:
            return False
        if self.path is not None and not self.path.search(request.path):
            return False
        return self.watch is None or self.watch == _is_watch(request)


def _is_watch(request: web.Request) -> bool:
    return request.query.get("watch") in ("1", "true")


def _streams(request: web.Request) -> bool:
    return _is_watch(request) or request.query.get("follow") in ("1", "true")


@dataclass(eq=False)
class _Stream:
    """An answer being streamed (a watch or a followed log): `end()` ends it."""

    request: web.Request
    upstream: aiohttp.ClientResponse
    ended: bool = False

    def end(self) -> None:
        self.ended = True
        # Wakes the copy loop's read, which ends the answer to the client cleanly.
        self.upstream.close()


@dataclass
class FaultProxy:
    """The proxy for one test: `start()` (or `with`), faults on command, `stop()`."""

    cluster: Cluster
    url: str = ""
    _requests: list[Seen] = field(default_factory=list)
    _rules: list[_Rule] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # Watches resumed from a resourceVersion below this are answered 410 (0: none).
    _expired_below: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None
    _open: set[_Stream] = field(default_factory=set)
    _released: asyncio.Event | None = None

    # -- life --------------------------------------------------------------------------

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> None:
        """Listens on a free loopback port (its own event loop, in a thread of its own, so
        synchronous and asynchronous tests use it alike) and returns once it does."""
        name = f"fault-proxy-{secrets.token_hex(3)}"
        cert, key = self.cluster.pki.issue(name, f"/CN={name}", server=True)
        serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        serving.load_cert_chain(str(cert), str(key))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._call(self._start(serving))

    async def _start(self, serving: ssl.SSLContext) -> None:
        upstream = ssl.create_default_context(cafile=str(self.cluster.pki.ca_cert))
        # Answers pass through as they are (a gzip body stays gzip); no timeouts of its
        # own: the client's timeouts are the ones under test.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=upstream),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None),
        )
        self._released = asyncio.Event()
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=2.0, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=serving)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"https://{host}:{port}"

    def stop(self) -> None:
        """Releases what hangs, ends every stream, and stops listening."""
        if self._loop is None:
            return
        self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._loop.close()
        self._loop = None

    async def _stop(self) -> None:
        self._heal()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        assert self._loop is not None, "the proxy is not started"
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def kubeconfig(self, source: Path, dest: Path | None = None) -> Path:
        """A copy of the kubeconfig `source` (a ServiceAccount's, as chart.install_rights
        writes) whose clusters point at the proxy: same CA, same token."""
        config = json.loads(source.read_text())
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = self.url
        dest = dest or source.with_name(f"{source.stem}-via-proxy.kubeconfig")
        dest.write_text(json.dumps(config, indent=2))
        return dest

    # -- faults ------------------------------------------------------------------------

    def fail(
        self,
        status: int = 500,
        seconds: float = 60.0,
        *,
        method: str | None = None,
        path: str | None = None,
    ) -> None:
        """Answer every request (or those of `method` whose path `path`, a regular
        expression, matches) with `status` for `seconds` or until heal(); the matching
        watches and log streams that are open end now."""
        rule = _Rule("fail", method, re.compile(path) if path else None, None, time.monotonic() + seconds)
        rule.status = status
        with self._lock:
            self._rules.append(rule)
        self._call(self._end_streams(rule))

    def hang(
        self,
        *,
        method: str | None = None,
        path: str | None = None,
        watch: bool | None = None,
        times: int | None = None,
        forward: bool = False,
    ) -> None:
        """Accept the matching calls (the first `times` of them; all by default) and
        never answer them. `forward`: the API server does each first, and its answer is
        what is lost (a create happened; the client cannot know)."""
        rule = _Rule("hang", method, re.compile(path) if path else None, watch, times=times, forward=forward)
        with self._lock:
            self._rules.append(rule)

    def expire_watches(self) -> None:
        """End every open watch; resuming one from a resourceVersion before now answers
        410 Gone. Now is a write's resourceVersion (a ConfigMap made and deleted in
        `default`), so every list after this returns a newer one and its watch works:
        the real API server's resourceVersions are etcd revisions, which the tests may
        compare though clients must not."""
        admin = self.cluster.admin
        path = "/api/v1/namespaces/default/configmaps"
        made = admin.create(path, {"metadata": {"generateName": "fault-proxy-expiry-"}})
        admin.request("DELETE", f"{path}/{made['metadata']['name']}")
        with self._lock:
            self._expired_below = int(made["metadata"]["resourceVersion"])
        self._call(self._end_streams(None))

    def heal(self) -> None:
        """No more faults; hung calls lose their connections."""
        self._call(self._async_heal())

    async def _async_heal(self) -> None:
        self._heal()

    def _heal(self) -> None:
        with self._lock:
            self._rules.clear()
        if self._released is not None:
            self._released.set()
            self._released = asyncio.Event()

    async def _end_streams(self, rule: _Rule | None) -> None:
        """End the open streams `rule` matches (every open watch, for None)."""
        for stream in list(self._open):
            if rule.matches(stream.request) if rule is not None else _is_watch(stream.request):
                stream.end()

    @property
    def requests(self) -> list[Seen]:
        """Every request so far, in the order they came."""
        with self._lock:
            return list(self._requests)

    # -- serving -----------------------------------------------------------------------

    def _rule_for(self, request: web.Request) -> _Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.matches(request):
                    if rule.times is not None:
                        rule.times -= 1
                    return rule
            return None

    def _expired(self, request: web.Request) -> str | None:
        """The real API server's words for a watch from before its history, or None."""
        version = request.query.get("resourceVersion", "")
        with self._lock:
            below = self._expired_below
        if not _is_watch(request) or not version.isdigit() or int(version) == 0 or int(version) >= below:
            return None  # "" and "0" watch from now; a list's resourceVersion is never below
        return f"too old resource version: {version} ({below})"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        seen = Seen(request.method, request.path, dict(request.query))
        with self._lock:
            self._requests.append(seen)
        rule = self._rule_for(request)
        if rule is not None and rule.kind == "fail":
            seen.fault, seen.status = "failed", rule.status
            message = f"the fault proxy answers {rule.status} (an injected failure)"
            body = status_object(rule.status, REASONS.get(rule.status, "InternalError"), message)
            return web.json_response(body, status=rule.status)
        if rule is not None:
            seen.fault = "hung"
            return await self._hang(request, rule)
        if (words := self._expired(request)) is not None:
            # As the real API server answers: 200, then one ERROR event, then the end.
            seen.fault, seen.status = "expired", 200
            event = {"type": "ERROR", "object": status_object(410, "Expired", words)}
            return web.Response(text=json.dumps(event) + "\n", content_type="application/json")
        return await self._forward(request, seen)

    async def _hang(self, request: web.Request, rule: _Rule) -> web.StreamResponse:
        assert self._released is not None and self._session is not None
        released = self._released
        if rule.forward:
            body = await request.read()
            async with self._session.request(
                request.method, self._upstream(request), headers=_forwarded(request), data=body or None
            ) as upstream:
                await upstream.read()
        await released.wait()
        if request.transport is not None:
            request.transport.close()  # the connection is dropped, never answered
        return web.Response(status=502)  # not sent: nothing is left to send it on

    def _upstream(self, request: web.Request) -> str:
        return f"{self.cluster.server}{request.raw_path}"

    async def _forward(self, request: web.Request, seen: Seen) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        async with self._session.request(
            request.method, self._upstream(request), headers=_forwarded(request), data=body or None
        ) as upstream:
            answer = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in HOP_BY_HOP:
                    answer.headers.add(name, value)
            seen.status = upstream.status
            await answer.prepare(request)
            stream = _Stream(request, upstream)
            if _streams(request):
                self._open.add(stream)
            try:
                while True:
                    try:
                        chunk = await upstream.content.readany()
                    except (aiohttp.ClientError, OSError):
                        if stream.ended:
                            break  # ended on purpose: the client sees the stream end
                        raise
                    if not chunk:
                        break
                    await answer.write(chunk)
                await answer.write_eof()
            except ConnectionError:
                pass  # the client left (its own timeout, or it was stopped): nothing to tell it
            finally:
                self._open.discard(stream)
            return answer


def _forwarded(request: web.Request) -> dict[str, str]:
    """The request's headers for the API server: all but the hop-by-hop ones."""
    return {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}


__all__ = ["FaultProxy", "Seen", "status_object"]
