"""A local job that tries to escape: each attempt on `paddlecloud server` is refused.

The job is submitted by alice with the CLI. It tries to read the platform's secrets,
forge the gateway's signature to call pfs as bob, read bob's home, hard-link
bob's file into its own home (then alice asks for it through the API), list `/root`, see
the host's processes and write at the host's `/`. The same program on a server started
with `jobs.sandbox: off` succeeds at the first two, so this test fails if the sandbox
is taken away.
"""

from __future__ import annotations

import json
import secrets
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from paddlecloud.common import cgroups

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("bwrap") is None, reason="bubblewrap is not installed (make system-deps)"
    ),
]

DC = "datacenter1"

ATTACK = """\
import glob, json, os, urllib.request
import uuid

from paddlecloud.common.internal_auth import Identity, sign

data, home = os.environ["DATA_DIR"], os.environ["PADDLE_CLOUD_PFS_HOME"]
outcome = {}


def attempt(name, action):
    try:
        outcome[name] = "succeeded: " + repr(action())[:80]
    except Exception as exc:
        outcome[name] = "refused: " + type(exc).__name__


def read(path):
    with open(path, "rb") as f:
        return f.read()


attempt("read_internal_secret", lambda: read(f"{data}/internal.secret"))
attempt("read_admin_password", lambda: read(f"{data}/admin.password"))
attempt("read_server_config", lambda: read(f"{data}/run/paddlecloud.yaml"))
attempt("read_store", lambda: read(f"{data}/paddlecloud.db")[:16])


def forge():
    # With whatever secret could be read (a guess otherwise), call pfs as bob.
    try:
        secret = read(f"{data}/internal.secret").strip()
    except OSError:
        secret = b"guess"
    path = f"/api/v1/pfs/ls?path=/pfs/{os.environ['DC']}/home/bob"
    request_id = uuid.uuid4().hex
    headers = sign(secret, Identity("bob"), request_id, "GET", path)
    headers["X-Request-ID"] = request_id
    request = urllib.request.Request(os.environ["PFS_URL"] + path, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.status, answer.read()[:60]


attempt("forge_internal_signature", forge)
attempt("read_bob_home_host", lambda: read(f"{data}/pfs/home/bob/private.txt"))
attempt("read_bob_home_pfs", lambda: read(f"/pfs/{os.environ['DC']}/home/bob/private.txt"))
attempt("list_bob_home_pfs", lambda: os.listdir(f"/pfs/{os.environ['DC']}/home/bob"))
attempt("hard_link_bob_file", lambda: os.link(f"{data}/pfs/home/bob/private.txt", f"{home}/stolen.txt"))
attempt("list_root", lambda: os.listdir("/root"))
attempt("read_root_client_config", lambda: read("/root/.paddle/config"))
attempt("see_jobs_service", lambda: read(f"/proc/{os.environ['JOBS_PID']}/cmdline"))
attempt("see_host_processes", lambda: len([p for p in os.listdir("/proc") if p.isdigit()]) > 5 or 1 / 0)
attempt("write_host_root", lambda: open(os.environ["PWN"], "w").write("x"))
attempt("run_as_root", lambda: os.getuid() == 0 or 1 / 0)
attempt("write_public", lambda: open(f"/pfs/{os.environ['DC']}/public/pwned.txt", "w").write("x"))
# What it may do: its own home, its own /tmp.
attempt("write_own_home", lambda: open(f"{home}/mine.txt", "w").write("ok"))
attempt("write_tmp", lambda: open("/tmp/scratch", "w").write("ok"))
print("RESULTS " + json.dumps(outcome), flush=True)
"""

SHOULD_FAIL = [
    "read_internal_secret",
    "read_admin_password",
    "read_server_config",
    "read_store",
    "forge_internal_signature",
    "read_bob_home_host",
    "read_bob_home_pfs",
    "list_bob_home_pfs",
    "hard_link_bob_file",
    "list_root",
    "read_root_client_config",
    "see_jobs_service",
    "see_host_processes",
    "write_host_root",
    "run_as_root",
    "write_public",
]


def run_attack(server: Any, tmp_path: Path, label: str) -> dict[str, str]:
    """Users alice and bob; bob keeps a private file; alice's job attacks. Its results."""
    for user in ("alice", "bob"):
        server.cli("users", "create", user, "--password-stdin", stdin=f"{user}-password\n")
        server.add_datacenter(f"as-{user}", user, f"{user}-password")
    private = tmp_path / f"private-{label}.txt"
    private.write_text("bob's secret")
    server.cli("--datacenter", "as-bob", "cp", str(private), "pfs:private.txt")
    package = tmp_path / f"attack-{label}"
    package.mkdir()
    (package / "train.py").write_text(ATTACK)
    config = yaml.safe_load((server.data_dir / "run" / "paddlecloud.yaml").read_text())
    pwn = Path(f"/pwned-by-a-job-{secrets.token_hex(4)}")
    env = {
        "DATA_DIR": str(server.data_dir),
        "DC": DC,
        "PFS_URL": config["gateway"]["pfs_url"],
        "JOBS_PID": str(server.services()["jobs"].pid),
        "PWN": str(pwn),
    }
    flags = [f"--env={k}={v}" for k, v in env.items()]
    submitted = server.cli(
        "--datacenter", "as-alice", "submit", "--jobname", "attack", *flags, "-f", str(package), check=False
    )
    assert submitted.returncode == 0, submitted.stderr + submitted.stdout
    line = next(x for x in submitted.stdout.splitlines() if "RESULTS " in x)
    results: dict[str, str] = json.loads(line.split("RESULTS ", 1)[1])
    try:
        assert not pwn.exists() or label == "unsandboxed", "the job wrote at the host's /"
    finally:
        pwn.unlink(missing_ok=True)
    # Whatever the job managed, alice's own API cannot hand her bob's file.
    stolen = server.cli(
        "--datacenter", "as-alice", "cp", "pfs:stolen.txt", str(tmp_path / "got"), check=False
    )
    results["download_stolen"] = (
        "succeeded" if stolen.returncode == 0 else "refused: " + stolen.stderr.strip()
    )
    mine = server.cli("--datacenter", "as-alice", "cp", "pfs:mine.txt", str(tmp_path / f"mine-{label}"))
    assert mine.returncode == 0 and (tmp_path / f"mine-{label}").read_text() == "ok"
    return results


def test_a_job_cannot_escape_its_sandbox(server_factory: Any, tmp_path: Path) -> None:
    server = server_factory()
    results = run_attack(server, tmp_path, "sandboxed")
    escaped = {name: results[name] for name in SHOULD_FAIL if not results[name].startswith("refused")}
    assert escaped == {}, results
    assert results["download_stolen"].startswith("refused"), results
    assert results["write_own_home"].startswith("succeeded"), results
    assert results["write_tmp"].startswith("succeeded"), results

    # alice's home now belongs to her jobs' uid: what she uploads and makes afterwards
    # through the API must stay hers to change from a job.
    as_alice = ("--datacenter", "as-alice")
    later = tmp_path / "later.txt"
    later.write_text("uploaded\n")
    server.cli(*as_alice, "cp", str(later), "pfs:later.txt")
    server.cli(*as_alice, "mkdir", "pfs:later-dir")
    changes = tmp_path / "changes"
    changes.mkdir()
    (changes / "train.py").write_text(
        "import os\n"
        "home = os.environ['PADDLE_CLOUD_PFS_HOME']\n"
        "open(os.path.join(home, 'later.txt'), 'a').write('appended by a job\\n')\n"
        "open(os.path.join(home, 'later-dir', 'new.txt'), 'w').write('made by a job')\n"
    )
    done = server.cli(*as_alice, "submit", "--jobname", "changes", "-f", str(changes), check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    server.cli(*as_alice, "cp", "pfs:later.txt", str(tmp_path / "later-back.txt"))
    assert (tmp_path / "later-back.txt").read_text() == "uploaded\nappended by a job\n"
    quota = server.cli(*as_alice, "get", "quota").stdout
    assert ("Limits are advisory here" in quota) == (cgroups.detect() is None), quota


def test_without_the_sandbox_the_same_job_reads_and_forges(server_factory: Any, tmp_path: Path) -> None:
    """The control: the attempts above are real ones, which succeed when nothing stops them."""
    settings = tmp_path / "unsandboxed.yaml"
    settings.write_text(yaml.safe_dump({"jobs": {"sandbox": "off"}}))
    server = server_factory("--server-config", str(settings))
    results = run_attack(server, tmp_path, "unsandboxed")
    for name in ("read_internal_secret", "forge_internal_signature", "read_bob_home_host", "list_root"):
        assert results[name].startswith("succeeded"), (name, results)
