"""A small, blocking Kubernetes API client on the standard library, for the tests' own
requests and the simulated kubelet: the service under test keeps its own client
(kubernetes-asyncio); this one only has to say what the real API server answered."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class Reply:
    """One answer of the API server: the status and the decoded body (a Status object on
    errors, whose `message` is the words the API server chose)."""

    status: int
    body: Any

    @property
    def message(self) -> str:
        return str(self.body.get("message", "")) if isinstance(self.body, dict) else str(self.body)


class ApiError(Exception):
    """A request that the test expected to succeed was refused."""

    def __init__(self, method: str, path: str, reply: Reply) -> None:
        super().__init__(f"{method} {path} -> {reply.status}: {reply.message}")
        self.reply = reply


class KubeClient:
    """Requests to one API server as one identity: a client certificate the cluster's CA
    signed, or a bearer token (a ServiceAccount's). Thread-safe: every request has its own
    connection."""

    def __init__(self, server: str, ca: Path, *, cert: tuple[Path, Path] | None = None, token: str = ""):
        """`cert`: a client certificate and its key; `token`: a bearer token."""
        parsed = urllib.parse.urlsplit(server)
        self.server = server
        self.host = parsed.hostname or "127.0.0.1"
        self.port = parsed.port or 443
        self._context = ssl.create_default_context(cafile=str(ca))
        if cert is not None:
            self._context.load_cert_chain(str(cert[0]), str(cert[1]))
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._lock = threading.Lock()
        self._open: set[http.client.HTTPSConnection] = set()

    def _connection(self, timeout: float) -> http.client.HTTPSConnection:
        conn = http.client.HTTPSConnection(self.host, self.port, context=self._context, timeout=timeout)
        with self._lock:
            self._open.add(conn)
        return conn

    def _forget(self, conn: http.client.HTTPSConnection) -> None:
        with self._lock:
            self._open.discard(conn)
        conn.close()

    def close(self) -> None:
        """Ends every request in flight (a watch blocked in a read returns)."""
        with self._lock:
            conns = list(self._open)
        for conn in conns:
            if conn.sock is not None:
                try:
                    conn.sock.shutdown(2)
                except OSError:
                    pass

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> Reply:
        """Any answer, errors included, as a Reply."""
        if query:
            path = f"{path}?{urllib.parse.urlencode(query)}"
        data = None if body is None else json.dumps(body).encode()
        headers = dict(self._headers)
        if data is not None:
            headers["Content-Type"] = content_type
        conn = self._connection(timeout)
        try:
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        finally:
            self._forget(conn)
        decoded: Any = raw.decode(errors="replace")
        if raw and "json" in (response.getheader("Content-Type") or ""):
            decoded = json.loads(raw)
        return Reply(response.status, decoded)

    def call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        """The body of a 2xx answer; ApiError for anything else."""
        reply = self.request(method, path, body, **kwargs)
        if not 200 <= reply.status < 300:
            raise ApiError(method, path, reply)
        return reply.body

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.call("GET", path, **kwargs)

    def create(self, path: str, obj: Obj) -> Obj:
        return self.call("POST", path, obj)

    def merge_patch(self, path: str, patch: Obj) -> Obj:
        return self.call("PATCH", path, patch, content_type="application/merge-patch+json")

    def watch(
        self, path: str, *, resource_version: str, query: dict[str, str] | None = None, timeout: int = 60
    ) -> Iterator[Obj]:
        """The watch events after `resource_version` until the server closes the stream
        (after `timeout` seconds) or `close()` is called."""
        params = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout),
            **(query or {}),
        }
        conn = self._connection(timeout + 10.0)
        try:
            conn.request("GET", f"{path}?{urllib.parse.urlencode(params)}", headers=self._headers)
            response = conn.getresponse()
            if response.status != 200:
                raise ApiError("WATCH", path, Reply(response.status, json.loads(response.read() or b"{}")))
            while line := response.readline():
                yield json.loads(line)
        except OSError:
            return
        finally:
            self._forget(conn)

    def wait_for(
        self,
        path: str,
        predicate: Callable[[Obj], bool],
        *,
        name: str | None = None,
        query: dict[str, str] | None = None,
        timeout: float = 60.0,
    ) -> Obj:
        """The first object of the collection at `path` (one named `name`, or any that
        `query`'s selectors give) for which `predicate` holds: listed first, then watched,
        so nothing that happens in between is missed. TimeoutError naming what it waited
        for, with the last state seen."""
        params = dict(query or {})
        if name is not None:
            params["fieldSelector"] = f"metadata.name={name}"
        deadline = time.monotonic() + timeout
        last: Obj | None = None
        while (left := deadline - time.monotonic()) > 0:
            listing = self.get(path, query=params)
            for item in listing["items"]:
                last = item
                if predicate(item):
                    return item
            rv = listing["metadata"]["resourceVersion"]
            for event in self.watch(path, resource_version=rv, query=params, timeout=max(1, int(left))):
                if event["type"] in ("ADDED", "MODIFIED"):
                    last = event["object"]
                    if predicate(event["object"]):
                        return event["object"]
                elif event["type"] == "ERROR":
                    break  # 410 Gone: list again from now
        raise TimeoutError(f"{path} {params}: condition not met in {timeout:.0f} s; last seen: {last}")

    def wait_gone(self, path: str, name: str, *, timeout: float = 60.0) -> None:
        """Returns once the object `name` of the collection at `path` no longer exists."""
        params = {"fieldSelector": f"metadata.name={name}"}
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            listing = self.get(path, query=params)
            if not listing["items"]:
                return
            rv = listing["metadata"]["resourceVersion"]
            for event in self.watch(path, resource_version=rv, query=params, timeout=max(1, int(left))):
                if event["type"] == "DELETED":
                    return
                if event["type"] == "ERROR":
                    break
        raise TimeoutError(f"{path}/{name} still there after {timeout:.0f} s")
