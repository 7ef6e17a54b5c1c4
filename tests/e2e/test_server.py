"""`paddlecloud server` end to end: first run, the CLI against it, supervision, clean stop."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from paddlecloud.common.runner import LISTEN_BACKLOG
from paddlecloud.config import TokenCache

pytestmark = pytest.mark.slow


def get(url: str, headers: dict[str, str]) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 - loopback test server
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def test_first_run_cli_supervision_and_clean_stop(server_factory, tmp_path) -> None:
    server = server_factory()
    assert server.admin_password, server.stdout_lines
    config = (tmp_path / "home" / ".paddle" / "config").read_text()
    assert server.endpoint in config and "current-datacenter: datacenter1" in config
    assert oct((tmp_path / "home" / ".paddle" / "config").stat().st_mode & 0o777) == "0o600"

    # The CLI, as its own process, against the platform.
    login = server.cli("login")
    assert "as admin" in login.stdout
    version = json.loads(server.cli("-o", "json", "version").stdout)
    assert version["client"]["version"] == version["server"]["version"]
    created = server.cli("users", "create", "alice", "--password-stdin", stdin="alice-password\n")
    assert "alice" in created.stdout
    users = json.loads(server.cli("-o", "json", "get", "users").stdout)
    assert [u["name"] for u in users["users"]] == ["admin", "alice"]
    server.add_datacenter("as-alice", "alice", "alice-password")
    whoami = json.loads(server.cli("--datacenter", "as-alice", "-o", "json", "whoami").stdout)
    assert (whoami["user"], whoami["admin"]) == ("alice", False)
    assert whoami["home"] == "/pfs/datacenter1/home/alice"
    # Relative PFS paths land in the home the server names, whatever the config entry is called.
    server.cli("--datacenter", "as-alice", "mkdir", "data")
    listing = json.loads(server.cli("--datacenter", "as-alice", "-o", "json", "ls").stdout)
    assert [e["path"] for e in listing["entries"]] == ["/pfs/datacenter1/home/alice/data"]
    refused = server.cli("--datacenter", "as-alice", "users", "list", check=False)
    assert refused.returncode == 1
    assert len(refused.stderr.strip().splitlines()) == 1 and "request id" in refused.stderr

    # One request id, in the gateway's log and in the service's it reached.
    cache = TokenCache(tmp_path / "home" / ".paddle" / "tokens.json")
    cached = cache.get("datacenter1", "admin", server.endpoint)
    assert cached is not None
    admin_token = cached.token
    status, body = get(
        f"{server.endpoint}/api/v1/jobs/no-such-endpoint",
        {"Authorization": f"Bearer {admin_token}", "X-Request-ID": "e2e-request-42"},
    )
    assert status == 404 and body["request_id"] == "e2e-request-42"
    logs = server.data_dir / "logs"
    for name in ("gateway", "jobs"):
        lines = [json.loads(x) for x in (logs / f"{name}.log").read_text().splitlines() if x.startswith("{")]
        assert any(x.get("request_id") == "e2e-request-42" for x in lines), name

    # A service killed outright is restarted, and the restart is logged.
    services = server.services()
    assert set(services) == {"gateway", "jobs", "pfs", "builder"}
    os.kill(services["jobs"].pid, signal.SIGKILL)
    server.wait_for_stderr("jobs exited with -9")
    server.wait_for_stderr("restarted jobs")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, body = get(f"{server.endpoint}/api/v1/jobs/again", {"Authorization": f"Bearer {admin_token}"})
        if status == 404:
            break
        assert status == 502, body  # down for a moment, never anything else
        time.sleep(0.1)
    assert status == 404 and body["code"] == "ERR_NOT_FOUND"

    # SIGTERM stops everything, and nothing is left behind.
    pids = [p.pid for p in server.services().values()]
    assert server.stop() == 0
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert not (server.data_dir / "run" / "server.json").exists()

    # A second start keeps the administrator and prints no new password; --init points
    # the client config at the new port, and the first password still logs in.
    again = server_factory("--init")
    assert again.admin_password is None
    assert not any("Created administrator" in line for line in again.stdout_lines)
    assert f"password: {server.admin_password}" in (tmp_path / "home" / ".paddle" / "config").read_text()
    assert "as admin" in again.cli("login").stdout
    assert again.stop() == 0


def test_busy_port_is_one_clear_line(server_factory, tmp_path) -> None:
    first = server_factory()
    port = first.endpoint.rsplit(":", 1)[1]
    second = subprocess.run(
        [sys.executable, "-m", "paddlecloud", "server", "--data-dir", str(tmp_path / "d2"), "--port", port],
        env={**os.environ, "HOME": str(tmp_path / "home2")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in second.stderr
    assert "Traceback" not in second.stderr
    failure = next(line for line in second.stderr.splitlines() if "cannot listen" in line)
    assert failure.startswith("paddlecloud server: cannot listen"), failure  # the prefix once


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2) to read listen backlogs")
def test_every_service_listens_with_the_backlog_it_asks_for(server_factory: Any) -> None:
    server = server_factory()
    config = yaml.safe_load((server.data_dir / "run" / "paddlecloud.yaml").read_text())
    urls = {name: config["gateway"][f"{name}_url"] for name in ("jobs", "pfs", "builder")}
    urls["gateway"] = server.endpoint
    ports = {name: int(url.rsplit(":", 1)[1]) for name, url in urls.items()}
    listing = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, check=True).stdout
    backlog = {}
    for line in listing.splitlines():
        fields = line.split()
        port = int(fields[3].rsplit(":", 1)[1])
        for name, wanted in ports.items():
            if port == wanted:
                backlog[name] = int(fields[2])  # Send-Q of a listening socket: its backlog
    assert backlog == dict.fromkeys(ports, LISTEN_BACKLOG), (backlog, ports)


def test_a_jobs_processes_hold_none_of_the_platforms_sockets(server_factory: Any, tmp_path: Path) -> None:
    server = server_factory()
    package = tmp_path / "sleeper"
    package.mkdir()
    (package / "train.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(300)\n")
    server.cli("submit", "--jobname", "sleeper", str(package))
    jobs = server.services()["jobs"]
    listening = {
        c.laddr
        for p in psutil.Process(server.process.pid).children()
        for c in p.net_connections("tcp")
        if c.status == psutil.CONN_LISTEN
    }
    deadline = time.monotonic() + 30
    supervisors: list[psutil.Process] = []
    while not supervisors and time.monotonic() < deadline:
        # The job's supervisor runs in its job's directory; the zygote that forked it is a
        # child of the jobs service. Neither may hold a listening socket of the services.
        # A supervisor is a fork of the zygote in its job's directory; the zygote itself
        # (same cmdline, its parent the jobs service) may not have gone to / yet.
        supervisors = [
            p
            for p in psutil.process_iter(["cmdline", "cwd", "ppid"])
            if "paddlecloud.jobs.local.supervisor" in " ".join(p.info["cmdline"] or [])
            and str(server.data_dir) in (p.info["cwd"] or "")
            and p.info["ppid"] != jobs.pid
        ]
        time.sleep(0.05)
    assert supervisors, "the job's supervisor never started"
    # Their cmdline is the zygote's (they are its forks); the zygote itself runs in /.
    zygote = {s.ppid() for s in supervisors} - {s.pid for s in supervisors}
    assert len(zygote) == 1 and "--zygote" in psutil.Process(*zygote).cmdline(), zygote
    supervisors.append(psutil.Process(*zygote))
    held = {c.laddr for p in supervisors for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    assert listening and not (held & listening), (held, listening)
    assert jobs.is_running()
    server.cli("kill", "sleeper")


def test_a_request_too_large_to_parse_gets_a_problem_that_echoes_nothing(server_factory: Any) -> None:
    server = server_factory()
    host, port = server.endpoint.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        big = "a" * 9000
        sock.sendall(f"GET /api/v1/version HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") or head.startswith(b"HTTP/1.0 400"), head
    assert b"application/problem+json" in head, head
    problem = json.loads(body)
    assert problem["code"] == "ERR_BAD_REQUEST" and "8190" in problem["detail"]
    assert b"aaaa" not in body


def test_a_second_server_on_the_same_data_directory_is_refused_naming_the_first(
    server_factory, tmp_path
) -> None:
    first = server_factory()
    port = first.endpoint.rsplit(":", 1)[1]
    second = subprocess.run(
        [sys.executable, "-m", "paddlecloud", "server", "--data-dir", str(first.data_dir), "--port", "0"],
        env={**os.environ, "HOME": str(tmp_path / "home2")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 1, second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr
    assert f"pid {first.process.pid}, port {port}" in lines[0], lines[0]
    assert str(first.data_dir) in lines[0] and "--data-dir" in lines[0]
    # The first one was left alone: its services are the same processes, and it answers.
    assert first.process.poll() is None
    assert "as admin" in first.cli("login").stdout
    assert first.stop() == 0
    # Its lock went with it: the directory can be served again.
    again = server_factory("--init", data_dir=first.data_dir)
    assert "as admin" in again.cli("login").stdout
