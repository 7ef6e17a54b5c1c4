"""The simulated kubelet's HTTPS endpoint for `pods/log`: the API server proxies
`GET .../pods/<name>/log` to `https://<node InternalIP>:<kubeletEndpoint>/containerLogs/
<namespace>/<pod>/<container>`, authenticating with its kubelet client certificate and
checking ours against the cluster's CA (`--kubelet-certificate-authority`), as with a
real node. Serves `follow`, `timestamps`, `tailLines` and `limitBytes`."""

from __future__ import annotations

import datetime
import ssl
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class ContainerLog:
    """What one container printed, with the time of each line, and whether it ended."""

    lines: list[tuple[str, str]] = field(default_factory=list)  # (RFC 3339 time, text)
    done: bool = False


class LogStore:
    """Every container's log on one node, keyed by (namespace, pod, container)."""

    def __init__(self) -> None:
        self._logs: dict[tuple[str, str, str], ContainerLog] = {}
        self.changed = threading.Condition()
        self.closed = False

    def open(self, key: tuple[str, str, str]) -> None:
        with self.changed:
            self._logs[key] = ContainerLog()
            self.changed.notify_all()

    def print(self, key: tuple[str, str, str], text: str) -> None:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        with self.changed:
            self._logs.setdefault(key, ContainerLog()).lines.append((stamp, text))
            self.changed.notify_all()

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
        limit = int(query["limitBytes"]) if "limitBytes" in query else None
        start = max(0, len(found.lines) - int(query["tailLines"])) if "tailLines" in query else 0
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
                data = (f"{stamp} {text}\n" if timestamps else f"{text}\n").encode()
                if limit is not None:
                    data = data[: max(0, limit - sent)]
                try:
                    self.wfile.write(data)
                    self.wfile.flush()
                except OSError:
                    return  # the reader went away
                sent += len(data)
                if limit is not None and sent >= limit:
                    return
            if ended and not batch:
                return


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
