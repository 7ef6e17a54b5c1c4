"""What an admin and a user do about passwords and other users' jobs, through the real CLI
against a real `paddlecloud server`: `passwd` (prompted and scripted), `users passwd`,
`get jobs -A`, and `get job|logs|kill USER/NAME`, and the refusals of each."""

from __future__ import annotations

import json
import os
import pty
import select
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import clean_env

from paddlecloud.config import TokenCache

pytestmark = pytest.mark.slow

# Prints a line, then stays RUNNING until it is killed; a job's supervisor outlives its
# server (by design), so a failed test's sleeper gives up by itself after 5 minutes.
TRAIN_PY = """\
import time
print("hello from the sleeper", flush=True)
time.sleep(300)
"""


def api(server: Any, method: str, path: str, token: str | None = None, body: Any = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    url = server.endpoint + "/api/v1/" + path
    request = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310 - loopback
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def login(server: Any, user: str, password: str) -> int:
    return api(server, "POST", "auth/token", body={"username": user, "password": password})[0]


def cached_token(server: Any, datacenter: str, user: str) -> str:
    cached = TokenCache(server.home / ".paddle" / "tokens.json").get(datacenter, user, server.endpoint)
    assert cached is not None
    return cached.token


def refused(result: Any) -> str:
    """The one error line of a command that failed, and no traceback."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("paddlecloud: error: "), result.stderr
    return lines[0]


@pytest.fixture
def platform(server_factory: Any) -> Any:
    server = server_factory()
    for user in ("alice", "bob"):
        server.cli("users", "create", user, "--password-stdin", stdin=f"{user}-password\n")
        server.add_datacenter(f"as-{user}", user, f"{user}-password")
    return server


def test_passwd_changes_your_own_and_an_admin_resets_a_forgotten_one(platform: Any) -> None:
    server = platform
    alice = ("--datacenter", "as-alice")
    server.cli(*alice, "login")
    old_token = cached_token(server, "as-alice", "alice")

    wrong = server.cli(*alice, "passwd", stdin="not-her-password\nalice-new-password\n", check=False)
    assert "current password is wrong" in refused(wrong)
    short = server.cli(*alice, "passwd", stdin="alice-password\nshort\n", check=False)
    assert "new_password" in refused(short)

    changed = server.cli(*alice, "passwd", stdin="alice-password\nalice-new-password\n")
    assert "Changed the password of alice" in changed.stdout
    assert "alice-new-password" not in changed.stdout + changed.stderr
    # The token from before the change opens nothing; the old password logs in no more.
    assert api(server, "GET", "auth/whoami", old_token)[0] == 401
    assert login(server, "alice", "alice-password") == 401
    # The CLI goes on: its config has the new password, its cache the new token.
    config = yaml.safe_load((server.home / ".paddle" / "config").read_text())
    [entry] = [dc for dc in config["datacenters"] if dc["name"] == "as-alice"]
    assert entry["password"] == "alice-new-password"
    assert "alice on" in server.cli(*alice, "whoami").stdout

    assert "Only administrators" in refused(server.cli(*alice, "users", "passwd", "bob", check=False))
    # A forgotten password: the admin sets a new one, shown once; alice's sessions end.
    token = cached_token(server, "as-alice", "alice")
    reset = server.cli("users", "passwd", "alice")
    password = reset.stdout.split("Password (shown only this once): ")[1].strip()
    assert api(server, "GET", "auth/whoami", token)[0] == 401
    assert login(server, "alice", "alice-new-password") == 401
    assert login(server, "alice", password) == 201
    scripted = server.cli(
        "-o", "json", "users", "passwd", "bob", "--password-stdin", stdin="bob-new-password\n"
    )
    assert json.loads(scripted.stdout) == {"name": "bob"}
    assert login(server, "bob", "bob-new-password") == 201

    # Only admins reset, and not their own (that needs the current password).
    assert "paddlecloud passwd" in refused(server.cli("users", "passwd", "admin", check=False))
    assert "no user named 'carol'" in refused(server.cli("users", "passwd", "carol", check=False))

    # The current password is checked under the login limits: guessing it is refused with a
    # 429 after as many failures as a login would be, whatever the password then.
    status, answer = api(
        server, "POST", "auth/token", body={"username": "bob", "password": "bob-new-password"}
    )
    bob_token = answer["token"]
    guess = {"current_password": "guess", "new_password": "whatever-1"}
    for _ in range(10):  # login_failures_per_user
        assert api(server, "PUT", "auth/password", bob_token, guess)[0] == 403
    right = {"current_password": "bob-new-password", "new_password": "whatever-1"}
    status, answer = api(server, "PUT", "auth/password", bob_token, right)
    assert status == 429 and "Too many failed" in answer["detail"], answer


def test_passwd_asks_at_the_terminal_without_echo(platform: Any) -> None:
    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI with the pty as its terminal
        args = [sys.executable, "-m", "paddlecloud", "--datacenter", "as-bob", "passwd"]
        os.execve(sys.executable, args, clean_env(platform.home))  # noqa: S606 - our own CLI
    said = b""

    def until(prompt: bytes) -> None:
        nonlocal said
        deadline = time.monotonic() + 60
        while prompt not in said:
            assert time.monotonic() < deadline, said
            ready, _, _ = select.select([fd], [], [], 1)
            if ready:
                said += os.read(fd, 4096)

    answers = [(b"Current password: ", b"bob-password"), (b"New password: ", b"bob-typed-pass")]
    answers.append((b"New password again: ", b"bob-typed-pass"))
    for prompt, typed in answers:
        until(prompt)
        said = said.replace(prompt, b"", 1)
        os.write(fd, typed + b"\n")
    try:
        while chunk := os.read(fd, 4096):
            said += chunk
    except OSError:  # EIO: the child closed the terminal
        pass
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, said
    assert b"Changed the password of bob" in said
    assert b"bob-password" not in said and b"bob-typed-pass" not in said  # nothing echoed
    assert login(platform, "bob", "bob-typed-pass") == 201


def test_an_admin_sees_reads_and_kills_another_users_job_and_others_are_refused(
    platform: Any, tmp_path: Path
) -> None:
    server = platform
    package = tmp_path / "sleeper"
    package.mkdir()
    (package / "train.py").write_text(TRAIN_PY)
    server.cli("--datacenter", "as-alice", "submit", "--jobname", "sleeper", str(package))

    listing = server.cli("get", "jobs", "-A").stdout
    header, row = listing.splitlines()[:2]
    assert header.split()[:2] == ["USER", "NAME"] and row.split()[:2] == ["alice", "sleeper"], listing
    assert "sleeper" not in server.cli("get", "jobs").stdout  # without -A: the admin's own
    every = json.loads(server.cli("-o", "json", "get", "jobs", "--all-users").stdout)["jobs"]
    assert [(j["owner"], j["name"]) for j in every] == [("alice", "sleeper")]
    job = json.loads(server.cli("-o", "json", "get", "job", "alice/sleeper").stdout)
    assert job["owner"] == "alice" and job["name"] == "sleeper"

    deadline = time.monotonic() + 60
    while "hello from the sleeper" not in (logs := server.cli("logs", "alice/sleeper").stdout):
        assert time.monotonic() < deadline, logs
        time.sleep(0.5)

    # Not an admin: each is refused, naming the problem.
    bob = ("--datacenter", "as-bob")
    assert "only administrators may list every user's jobs" in refused(
        server.cli(*bob, "get", "jobs", "-A", check=False)
    )
    for command in (("get", "job"), ("logs",), ("kill",)):
        line = refused(server.cli(*bob, *command, "alice/sleeper", check=False))
        assert "only administrators may see or stop another user's jobs" in line, line
    assert "not a job" in refused(server.cli("get", "job", "a/b/c", check=False))
    assert "no job named 'nope'" in refused(server.cli("get", "job", "alice/nope", check=False))

    assert "job alice/sleeper killed" in server.cli("kill", "alice/sleeper").stdout
    mine = json.loads(server.cli("--datacenter", "as-alice", "-o", "json", "get", "job", "sleeper").stdout)
    assert mine["state"] == "KILLED", mine
    assert mine["reason"].startswith("killed by admin at "), mine  # the owner learns who
