"""The simulated kubelet's HTTPS endpoint for `pods/log`: the API server proxies
`GET .../pods/<name>/log` to `https://<node InternalIP>:<kubeletEndpoint>/containerLogs/
<namespace>/<pod>/<container>`, authenticating with its kubelet client certificate and
checking ours against the cluster's CA (`--kubelet-certificate-authority`), as with a
real node. Serves `follow`, `timestamps`, `sinceTime`, `sinceSeconds`, `tailLines` and
`limitBytes` as the kubelet's kuberuntime/logs does: `tailLines` picks the start, lines
stamped before the `since` time are skipped, `limitBytes` cuts the answer, `timestamps`
prefixes each line with its RFC3339Nano time. `LogStore.rotate` rotates a container's log
as `containerLogMaxSize` does: a read from then on serves only the new file, while a
follow already open goes on into it (the kubelet reopens the file it follows). The bytes
served are counted (`LogStore.served`) for the bench."""

from __future__ import annotations

import datetime
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class ContainerLog:
    """What one container printed, with the time of each line, and whether it ended."""

    lines: list[tuple[str, str]] = field(default_factory=list)  # (RFC3339Nano time, text)
    done: bool = False
    # The index in `lines` of the current log file's first line (0 until rotated).
    current: int = 0


class LogStore:
    """Every container's log on one node, keyed by (namespace, pod, container)."""

    def __init__(self) -> None:
        self._logs: dict[tuple[str, str, str], ContainerLog] = {}
        self.changed = threading.Condition()
        self.closed = False
        self.served = 0  # bytes of logs served, every request together
        self._served_lock = threading.Lock()

    def open(self, key: tuple[str, str, str]) -> None:
        with self.changed:
            self._logs[key] = ContainerLog()
            self.changed.notify_all()

    def print(self, key: tuple[str, str, str], text: str, stamp: str | None = None) -> None:
        """A line, stamped now (or `stamp`: lines may share one, as fast writers' do)."""
        with self.changed:
            self._logs.setdefault(key, ContainerLog()).lines.append((stamp or nano_stamp(), text))
            self.changed.notify_all()

    def rotate(self, key: tuple[str, str, str]) -> None:
        """The log file is rotated: what was written so far is in an older file, which
        `pods/log` no longer serves."""
        with self.changed:
            found = self._logs[key]
            found.current = len(found.lines)
            self.changed.notify_all()

    def count(self, sent: int) -> None:
        with self._served_lock:
            self.served += sent

    def finish(self, key: tuple[str, str, str]) -> None:
        with self.changed:
            if key in self._logs:
                self._logs[key].done = True
            self.changed.notify_all()

    def get(self, key: tuple[str, str, str]) -> ContainerLog | None:
        return self._logs.get(key)

    def close(self) -> None:
        with self.changed:
            self.closed = True
            self.changed.notify_all()


class _Handler(BaseHTTPRequestHandler):
    server: LogServer

    def log_message(self, format: str, *args: object) -> None:
        pass  # the API server's own log says who asked

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        if len(parts) != 4 or parts[0] != "containerLogs":
            self.send_error(404, "not a path this simulated kubelet serves")
            return
        key = (parts[1], parts[2], parts[3])
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        store = self.server.store
        found = store.get(key)
        if found is None:
            self.send_error(404, f'container "{key[2]}" in pod "{key[1]}" is not available')
            return
        follow = query.get("follow") == "true"
        timestamps = query.get("timestamps") == "true"
        try:
            limit = int(query["limitBytes"]) if "limitBytes" in query else None
            since = _since(query)
            tail = int(query["tailLines"]) if "tailLines" in query else None
        except ValueError as exc:
            self.send_error(400, str(exc))
            return
        with store.changed:
            start = found.current if tail is None else max(found.current, len(found.lines) - tail)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        sent = 0
        while True:
            with store.changed:
                while not (len(found.lines) > start or found.done or store.closed or not follow):
                    store.changed.wait()
                batch, start = found.lines[start:], len(found.lines)
                ended = found.done or store.closed or not follow
            for stamp, text in batch:
                if since is not None and _parse(stamp) < since:
                    continue  # the kubelet skips lines older than `since`
                data = (f"{stamp} {text}\n" if timestamps else f"{text}\n").encode()
                if limit is not None:
                    data = data[: max(0, limit - sent)]
                try:
                    self.wfile.write(data)
                    self.wfile.flush()
                except OSError:
                    return  # the reader went away
                sent += len(data)
                store.count(len(data))  # as written: a follow still open counts too
                if limit is not None and sent >= limit:
                    return
            if ended and not batch:
                return


def nano_stamp() -> str:
    """Now as the kubelet writes a line's time: RFC3339Nano, trailing zeros dropped."""
    ns = time.time_ns()
    whole = datetime.datetime.fromtimestamp(ns // 10**9, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f"{ns % 10**9:09d}".rstrip("0")
    return f"{whole}.{fraction}Z" if fraction else f"{whole}Z"


def _parse(stamp: str) -> tuple[datetime.datetime, int]:
    """A stamp as (its whole second, its nanoseconds), which order as the times do."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    second = datetime.datetime.fromisoformat(whole).replace(tzinfo=datetime.UTC)
    return second, int(fraction.ljust(9, "0")) if fraction else 0


def _since(query: dict[str, str]) -> tuple[datetime.datetime, int] | None:
    """The later of `sinceSeconds` and `sinceTime`, as the kubelet's NewLogOptions takes it."""
    since = None
    if "sinceSeconds" in query:
        when = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=int(query["sinceSeconds"]))
        since = (when.replace(microsecond=0), when.microsecond * 1000)
    if "sinceTime" in query:
        asked = _parse(query["sinceTime"])
        since = asked if since is None or asked > since else since
    return since


class LogServer(ThreadingHTTPServer):
    """HTTPS on 127.0.0.1, a free port; only clients with a certificate of the CA."""

    daemon_threads = True

    def __init__(self, store: LogStore, cert: Path, key: Path, ca: Path) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.store = store
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        context.load_verify_locations(str(ca))
        context.verify_mode = ssl.CERT_REQUIRED
        self.socket = context.wrap_socket(self.socket, server_side=True)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> None:
        threading.Thread(target=self.serve_forever, name="kubelet-logs", daemon=True).start()

    def stop(self) -> None:
        self.store.close()
        self.shutdown()
        self.server_close()
