"""`paddlecloud server` on a data directory whose disk fills up, then is freed.

The data directory is a small tmpfs mounted for the test (root only). While it is full:
calls that need no disk answer as usual, calls that do answer 507 problem+json, never a
plain-text 500; `/readyz` says the disk is full; a job whose supervisor dies of ENOSPC does
not stay RUNNING. Once space is freed everything works again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs for a full disk needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=160m", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"this machine does not allow a tmpfs mount here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def call(
    endpoint: str, method: str, path: str, token: str | None = None, body: bytes | None = None
) -> tuple[int, str, Any]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(endpoint + path, data=body, method=method, headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 - http on loopback
            status, ctype, raw = answer.status, answer.headers.get("Content-Type", ""), answer.read()
    except urllib.error.HTTPError as exc:
        status, ctype, raw = exc.code, exc.headers.get("Content-Type", ""), exc.read()
    try:
        return status, ctype, json.loads(raw)
    except ValueError:
        return status, ctype, raw.decode(errors="replace")


def fill(disk: Path) -> Path:
    """Write one file until the filesystem refuses more."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError:
            pass
    assert os.statvfs(disk).f_bavail == 0
    return filler


def supervisors_of(data_dir: Path) -> list[int]:
    """Job supervisors: forked by the zygote, each runs in its job's directory."""
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        line = " ".join(proc.info["cmdline"] or [])
        where = f"{line} {proc.info['cwd'] or ''}"
        if "paddlecloud.jobs.local.supervisor" in line and str(data_dir) in where:
            found.append(proc.pid)
    return found


def wait_for(check: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return bool(check())


def login(endpoint: str, password: str) -> str:
    body = json.dumps({"username": "admin", "password": password}).encode()
    status, _, answer = call(endpoint, "POST", "/api/v1/auth/token", body=body)
    assert status == 201, answer
    return str(answer["token"])


def test_a_full_data_disk_gives_507s_and_readiness_and_everything_recovers_once_freed(
    server_factory: Any, small_disk: Path, tmp_path: Path
) -> None:
    server = server_factory(data_dir=small_disk / "data")
    assert server.admin_password
    token = login(server.endpoint, server.admin_password)
    # A job that writes a log line every 50 ms: once the disk is full its writes fail, the
    # worker ends, and its supervisor cannot record that (ENOSPC) and dies.
    package = tmp_path / "chatty"
    package.mkdir()
    (package / "train.py").write_text(
        "import time\n"
        "for i in range(100000):\n    print('line', i, 'x' * 200, flush=True)\n    time.sleep(0.05)\n"
    )
    server.cli("submit", "--jobname", "chatty", str(package))
    deadline = time.monotonic() + 60
    while call(server.endpoint, "GET", "/api/v1/jobs/chatty", token)[2]["state"] != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.1)

    filler = fill(small_disk)
    seen: list[tuple[str, int]] = []

    def check(method: str, path: str, body: bytes | None = None, *, token_: str | None = token) -> int:
        status, ctype, answer = call(server.endpoint, method, path, token_, body)
        seen.append((path, status))
        if status >= 500:
            assert ctype.startswith("application/problem+json"), (path, status, answer)
            assert status in (503, 507), (path, status, answer)
        return status

    assert check("GET", "/api/v1/version", token_=None) == 200
    assert check("GET", "/api/v1/auth/whoami") == 200
    assert check("GET", "/api/v1/jobs?all=1") == 200
    check("POST", "/api/v1/pfs/mkdir", json.dumps({"path": "/pfs/datacenter1/home/admin/new"}).encode())
    check(
        "POST",
        "/api/v1/auth/token",
        json.dumps({"username": "admin", "password": server.admin_password}).encode(),
        token_=None,
    )
    spec = {"name": "another", "package": "/pfs/datacenter1/home/admin/nowhere"}
    check("POST", "/api/v1/jobs?dry_run=1", json.dumps(spec).encode())
    # An upload needs new blocks: that one is 507 for sure.
    upload = {"Upload-Length": str(4 << 20), "Tus-Resumable": "1.0.0"}
    request = urllib.request.Request(  # noqa: S310 - http on loopback
        server.endpoint + "/api/v1/pfs/uploads",
        data=b"",
        method="POST",
        headers={
            **upload,
            "Authorization": f"Bearer {token}",
            "Upload-Metadata": "path L3Bmcy9kYXRhY2VudGVyMS9ob21lL2FkbWluL2JpZw==",
        },
    )
    try:
        urllib.request.urlopen(request, timeout=30)  # noqa: S310
        created = 201
    except urllib.error.HTTPError as exc:
        created = exc.code
        assert exc.headers.get("Content-Type", "").startswith("application/problem+json")
    assert created == 507, seen
    ready, _, answer = call(server.endpoint, "GET", "/readyz")
    assert ready == 503 and "disk is full" in answer["detail"], answer

    # The job's supervisor dies while the disk is full (the hostile run saw it die of
    # ENOSPC; the cause does not matter). Recording the job's end needs the disk too: the
    # reconcile loop must live through that and record it once space is back.
    for pid in supervisors_of(small_disk / "data"):
        os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not supervisors_of(small_disk / "data"), 30)
    time.sleep(1)  # not a wait for a result: reconcile rounds meet the full disk meanwhile
    filler.unlink()
    deadline = time.monotonic() + 60
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        job = call(server.endpoint, "GET", "/api/v1/jobs/chatty", token)[2]
        if job["state"] in ("FAILED", "SUCCEEDED", "KILLED"):
            break
        time.sleep(0.2)
    assert job["state"] == "FAILED", job
    assert all(w["state"] in ("FAILED", "KILLED", "SUCCEEDED") for w in job["workers"]), job["workers"]

    # Freed: everything works again.
    assert call(server.endpoint, "GET", "/readyz")[0] == 200
    assert (
        check("POST", "/api/v1/pfs/mkdir", json.dumps({"path": "/pfs/datacenter1/home/admin/after"}).encode())
        == 201
    )
    login(server.endpoint, server.admin_password)
    server.cli("submit", "--jobname", "after", str(tmp_path / "chatty"), "--env", "X=1")
    server.cli("kill", "after")
    assert not supervisors_of(small_disk / "data")
