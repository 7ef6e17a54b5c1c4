"""Helpers the tests share: configs on temporary directories and a real upstream service."""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import io
import json
import secrets
import signal
import socket
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from paddlecloud.common import internal_auth
from paddlecloud.common.config import Config, load_config
from paddlecloud.common.keys import IDENTITY, REQUEST_ID
from paddlecloud.common.store import Job
from paddlecloud.common.web import create_base_app
from paddlecloud.jobs.backend import Launch
from paddlecloud.jobs.spec import JobSpec

INTERNAL_SECRET = "test-internal-secret-0123456789abcdef"


def signed(method: str, path_qs: str, user: str = "alice") -> dict[str, str]:
    """Headers that let a test call a service directly, as the gateway would for `user`."""
    request_id = secrets.token_hex(8)
    return {
        "X-Request-ID": request_id,
        **internal_auth.sign(
            INTERNAL_SECRET.encode(), internal_auth.Identity(user), request_id, method, path_qs
        ),
    }


async def wait_until(check: Callable[[], bool], timeout: float) -> bool:
    """Whether `check` holds within `timeout` seconds, asking every 50 ms."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        await asyncio.sleep(0.05)
    return check()


ADMIN_PASSWORD = "admin-password-for-tests"

# Every spelling of leaving /pfs/dc1/home/alice that PFS must refuse as a bad path (400),
# shared by the path parser's unit tests and the endpoints' traversal suite.
PFS_TRAVERSALS = [
    "/pfs/dc1/home/alice/../bob/x",
    "/pfs/dc1/home/alice/./x",
    "/pfs/dc1/home/alice//x",
    "/pfs/dc1/home/alice/%2e%2e/bob",
    "/pfs/dc1/home/alice/%2E%2E%2Fbob",
    "/pfs/dc1/home/alice/%252e%252e/bob",
    "/pfs/dc1/home/alice/..%2fbob",
    "/pfs/dc1/home/alice/..\\bob",
    "/pfs/dc1/home/alice/\u2025",  # two dot leader
    "/pfs/dc1/home/alice/\uff0e\uff0e/bob",  # fullwidth full stops
    "/pfs/dc1/home/alice/a\u2215..",  # division slash
    "/pfs/dc1/home/alice/a\uff0fb",  # fullwidth solidus
    "/pfs/dc1/home/alice/\ufffd\ufffd",  # what overlong UTF-8 (%c0%ae) decodes to
    "/pfs/dc1/home/alice/x\x00y",
    "/pfs/dc1/home/alice/x\ny",
    "/pfs/dc1/home/alice/" + "a" * 256,
    "/pfs/dc1/home/alice/" + "/".join(["abcdefgh"] * 600),
    "pfs/dc1/home/alice/x",
    "/etc/passwd",
    "",
]


# The series a family of each type exposes (prometheus_client's exposition).
_SERIES_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
}


class Scrape:
    """One answer of a service's /metrics, read with prometheus_client's own text parser."""

    def __init__(self, text: str) -> None:
        self.families = list(text_string_to_metric_families(text))
        self.samples: list[Sample] = [s for f in self.families for s in f.samples]

    def value(self, name: str, **labels: str) -> float | None:
        """The sample `name` with exactly these labels; None if the scrape has none."""
        found = [s.value for s in self.samples if s.name == name and s.labels == labels]
        assert len(found) <= 1, (name, labels, found)
        return found[0] if found else None

    def names(self) -> set[str]:
        """Every series name the scrape's HELP and TYPE lines declare, samples or none."""
        return {f.name + suffix for f in self.families for suffix in _SERIES_SUFFIXES.get(f.type, ("",))}


async def scrape(url: str) -> Scrape:
    """GET `url`/metrics (a service's own address: probes and scrapes need no signature)."""
    async with aiohttp.ClientSession() as session, session.get(f"{url.rstrip('/')}/metrics") as resp:
        assert resp.status == 200, await resp.text()
        return Scrape(await resp.text())


def config_dict(tmp_path: Path, **sections: dict[str, Any]) -> dict[str, Any]:
    """A server config whose state all lives under `tmp_path`."""
    raw: dict[str, Any] = {
        "store": {"url": f"sqlite:///{tmp_path}/store.db"},
        "internal": {"secret": INTERNAL_SECRET},
        "pfs": {"root": str(tmp_path / "pfs")},
        "gateway": {"admin_password": ADMIN_PASSWORD, "port": 0},
        "jobs": {"port": 0, "work_dir": str(tmp_path / "jobs")},
        "builder": {"port": 0},
        "log": {"format": "json", "level": "info"},
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return raw


def make_config(tmp_path: Path, **sections: dict[str, Any]) -> Config:
    path = write_config(tmp_path, **sections)
    return load_config(path, env={})


def write_config(tmp_path: Path, **sections: dict[str, Any]) -> Path:
    path = tmp_path / "paddlecloud.yaml"
    path.write_text(yaml.safe_dump(config_dict(tmp_path, **sections)))
    return path


def free_port() -> int:
    """A port nobody listens on (bound, then released): for 'service is down' tests."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def echo(request: web.Request) -> web.Response:
    """What the service saw: identity, request id, headers, path."""
    identity = request[IDENTITY]
    return web.json_response(
        {
            "user": identity.user,
            "admin": identity.admin,
            "request_id": request[REQUEST_ID],
            "headers": dict(request.headers),
            "raw_path": request.raw_path,
            "method": request.method,
        }
    )


async def sink(request: web.Request) -> web.Response:
    """Read the body as a stream, keeping only its length and sha256."""
    digest = hashlib.sha256()
    size = 0
    async for chunk in request.content.iter_any():
        digest.update(chunk)
        size += len(chunk)
    return web.json_response({"size": size, "sha256": digest.hexdigest()})


async def source(request: web.Request) -> web.StreamResponse:
    """Stream `size` bytes of a repeating pattern without ever holding them."""
    size = int(request.query["size"])
    block = bytes(range(256)) * 4096  # 1 MiB
    response = web.StreamResponse()
    response.content_length = size
    await response.prepare(request)
    sent = 0
    while sent < size:
        piece = block[: min(len(block), size - sent)]
        await response.write(piece)
        sent += len(piece)
    await response.write_eof()
    return response


TRICKLE_RELEASE: web.AppKey[asyncio.Event] = web.AppKey("trickle_release", asyncio.Event)
TRICKLE_ASKED: web.AppKey[asyncio.Event] = web.AppKey("trickle_asked", asyncio.Event)


async def trickle(request: web.Request) -> web.StreamResponse:
    """A line now, the rest once the test sets the app's `TRICKLE_RELEASE` (like `logs -f`);
    with `?quiet=1`, nothing at all until then, not even the status line."""
    request.app[TRICKLE_ASKED].set()
    if request.query.get("quiet"):
        await request.app[TRICKLE_RELEASE].wait()
    response = web.StreamResponse()
    await response.prepare(request)
    await response.write(b"first line\n")
    await request.app[TRICKLE_RELEASE].wait()
    for _ in range(64):
        await response.write(b"x" * 65536 + b"\n")
    await response.write_eof()
    return response


def pattern_sha256(size: int) -> str:
    block = bytes(range(256)) * 4096
    digest = hashlib.sha256()
    sent = 0
    while sent < size:
        piece = block[: min(len(block), size - sent)]
        digest.update(piece)
        sent += len(piece)
    return digest.hexdigest()


def create_upstream_app(config: Config, service: str = "pfs") -> web.Application:
    """A real internal service (gateway signature required) with echo, sink and source routes."""
    app = create_base_app(config, service)
    prefix = {"pfs": "/api/v1/pfs", "jobs": "/api/v1/jobs", "builder": "/api/v1/builds"}[service]
    app.router.add_route("*", f"{prefix}/echo", echo)
    app.router.add_post(f"{prefix}/sink", sink)
    app.router.add_put(f"{prefix}/sink", sink)
    app.router.add_patch(f"{prefix}/sink", sink)
    app.router.add_get(f"{prefix}/source", source)
    # What the gateway asks of jobs and pfs when an admin deletes a user.
    internal = {"pfs": "/api/v1/pfs/homes/{name}", "jobs": "/api/v1/users/{name}/jobs"}.get(service)
    if internal is not None:
        app.router.add_delete(internal, echo)
    app.router.add_get(f"{prefix}/trickle", trickle)
    app[TRICKLE_RELEASE] = asyncio.Event()
    app[TRICKLE_ASKED] = asyncio.Event()
    return app


class ServiceProcess:
    """One service run as `python -m paddlecloud.<name>` on a free loopback port."""

    def __init__(self, name: str, config_path: Path, workdir: Path) -> None:
        self.name = name
        self.config_path = config_path
        self.ready_file = workdir / f"{name}.ready"
        self.log_path = workdir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.module = f"paddlecloud.{name}"

    def start(self, timeout: float = 30.0) -> None:
        self.ready_file.unlink(missing_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    self.module,
                    "--config",
                    str(self.config_path),
                    "--port",
                    "0",
                    "--ready-file",
                    str(self.ready_file),
                ],
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + timeout
        while not self.ready_file.exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log_path.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} did not start: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.02)
        address = json.loads(self.ready_file.read_text())
        self.url = f"http://{address['host']}:{address['port']}"

    def stop(self) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def reset_peak_memory(self) -> None:
        """Reset VmHWM to the current RSS (Linux's clear_refs 5), to measure one phase alone."""
        assert self.process is not None
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")

    def memory_kib(self) -> dict[str, int]:
        """VmRSS and VmHWM (the kernel's peak RSS) of the process, in KiB."""
        assert self.process is not None
        fields = {}
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0])
        return fields


def make_wheel(
    directory: Path, name: str, version: str = "1.0", *, module: str | None = None, body: str = ""
) -> Path:
    """A pure-Python wheel written by hand: the module, METADATA, WHEEL and a RECORD with
    every file's sha256 (what pip checks), no build tool needed."""
    module = module or name.replace("-", "_")
    files = {f"{module}/__init__.py": (body or f"VALUE = {version!r}\n").encode()}
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: paddlecloud-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    target = directory / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(target, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return target


def make_wheelhouse(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    make_wheel(directory, "tinypkg", "1.0")
    make_wheel(directory, "tinypkg", "2.0")
    make_wheel(directory, "otherpkg", "1.0")
    # A package that brings its own `yaml`: the platform has PyYAML, the user's must win.
    make_wheel(directory, "shadow-yaml", "1.0", module="yaml", body="SHADOW = True\n")
    return directory


def tar_of(files: dict[str, bytes], mode: str = "w") -> bytes:
    """A tar archive of `files` (name: bytes), in memory; `mode` "w:gz" gzips it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as tar:  # type: ignore[call-overload]
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def zeros_tar_gz(size: int, name: str = "big.bin", piece: int = 64 * 2**20) -> bytes:
    """A tar.gz of one member of `size` zero bytes, made without holding or writing them:
    gzip members of `piece` zeros, compressed once and repeated (a gzip stream may be
    several members back to back)."""
    info = tarfile.TarInfo(name)
    info.size = size
    parts = [gzip.compress(info.tobuf(format=tarfile.GNU_FORMAT))]
    full, rest = divmod(size, piece)
    parts += [gzip.compress(bytes(piece), compresslevel=9)] * full
    padding = -size % tarfile.BLOCKSIZE + 2 * tarfile.BLOCKSIZE  # the member's padding, the end
    parts.append(gzip.compress(bytes(rest + padding)))
    return b"".join(parts)


def plan_launch(owner: str = "alice", datacenter: str = "dc1", **spec_fields: Any) -> Launch:
    """The launch of a job with `spec_fields` (validated; a name and a package are given),
    for the local backend's `build_plan`, which takes the job from it and the paths its
    workers see from the host plan."""
    home = f"/pfs/{datacenter}/home/{owner}"
    spec = JobSpec.model_validate({"name": "test-job", "package": f"{home}/package"} | spec_fields)
    job = Job(id="job1", owner=owner, name=spec.name, state="PENDING", spec=spec.to_dict())
    return Launch(
        job=job,
        spec=spec,
        datacenter=datacenter,
        pfs_home=home,
        output=f"{home}/jobs/{spec.name}",
        package=spec.package,
        package_kind="dir",
    )


# The real TensorBoard and VisualDL of `make viewers` (scripts/viewers.sh), each in its own
# environment: jobs' viewers run them, and tests write logs with their real writers.
VIEWER_PYTHONS = {
    "tensorboard": Path.home() / ".cache" / "paddlecloud" / "viewer-tensorboard-2.21.0" / "bin" / "python",
    "visualdl": Path.home() / ".cache" / "paddlecloud" / "viewer-visualdl-2.5.3" / "bin" / "python",
}
