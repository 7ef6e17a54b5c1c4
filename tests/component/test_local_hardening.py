"""A sandboxed local job's hardening, from inside a real job: no nested user namespace, the
seccomp filter's EPERM, a PID 1 that names no host path, no set-id bit on anything it writes."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from test_jobs_api import Jobs, start_jobs

from paddlecloud.jobs.keys import MANAGER

# Each probe prints one JSON line; the test reads them from the logs.
PROBES = """\
import ctypes, json, os, platform, subprocess, threading

def say(**fields):
    print(json.dumps(fields), flush=True)

# First, before anything else made a namespace: util-linux's unshare as a user would type it.
nested = subprocess.run(["unshare", "-Ur", "true"], capture_output=True, text=True)
say(probe="unshare", code=nested.returncode, stderr=nested.stderr.strip())

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
KEYCTL = {"x86_64": 250, "aarch64": 219}[platform.machine()]
# keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, create=0): any process may, unfiltered.
result = libc.syscall(KEYCTL, 0, -3, 0)
say(probe="keyctl", result=result, errno=ctypes.get_errno())

with open("/proc/1/cmdline", "rb") as f:
    say(probe="pid1", cmdline=f.read().decode(errors="replace").split("\\0"))

# Ordinary work still runs: a thread, a child process, a shell pipeline.
box = []
thread = threading.Thread(target=box.append, args=(1,))
thread.start()
thread.join()
piped = subprocess.run("echo hello | tr a-z A-Z", shell=True, capture_output=True, text=True).stdout.strip()
say(probe="ordinary", thread=box, piped=piped)

home = os.environ["PADDLE_CLOUD_PFS_HOME"]
tool = os.path.join(home, "tool")
with open(tool, "w") as f:
    f.write("#!/bin/sh\\n")
refused = []
for bits in (0o4755, 0o2755):
    try:
        os.chmod(tool, bits)
    except PermissionError:
        refused.append(oct(bits))
try:
    os.close(os.open(os.path.join(home, "made-set-uid"), os.O_WRONLY | os.O_CREAT, 0o4755))
except PermissionError:
    refused.append("open")
paths = {name: os.path.join(home, name) for name in ("tool", "made-set-uid")}
modes = {name: oct(os.stat(path).st_mode & 0o7777) for name, path in paths.items() if os.path.exists(path)}
say(probe="home", nosuid=bool(os.statvfs(home).f_flag & os.ST_NOSUID), refused=refused, modes=modes)
"""


@pytest.fixture
async def jobs(tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any) -> Jobs:
    jobs = await start_jobs(tmp_path, aiohttp_server, aiohttp_client)
    if not jobs.server_app[MANAGER].backend.sandboxed:  # type: ignore[attr-defined]
        pytest.skip("no sandbox here (bubblewrap is not installed)")
    return jobs


async def probes(jobs: Jobs, name: str) -> dict[str, dict[str, Any]]:
    package = jobs.package({"train.py": PROBES})
    await jobs.submit({"name": name, "package": package})
    job = await jobs.wait(name, ("SUCCEEDED", "FAILED"))
    text = await jobs.logs(name)
    assert job["state"] == "SUCCEEDED", (job["reason"], text)
    found = {}
    for line in text.splitlines():
        _, _, body = line.partition("] ")
        if body.startswith("{"):
            fields = json.loads(body)
            found[fields.pop("probe")] = fields
    return found


async def test_a_job_makes_no_user_namespace_and_the_filter_answers_eperm(jobs: Jobs) -> None:
    seen = await probes(jobs, "hardening")
    assert seen["unshare"]["code"] != 0, seen["unshare"]
    assert "Operation not permitted" in seen["unshare"]["stderr"]
    assert seen["keyctl"] == {"result": -1, "errno": 1}  # EPERM
    assert seen["ordinary"] == {"thread": [1], "piped": "HELLO"}


async def test_the_sandboxs_pid_1_names_no_host_path(jobs: Jobs) -> None:
    cmdline = (await probes(jobs, "pid-one"))["pid1"]["cmdline"]
    assert cmdline[0].endswith("bwrap"), cmdline  # bwrap's reaper, which never runs user code
    # Neither the data directory, nor the platform's Python, nor the binds' targets.
    host_paths = (str(jobs.root.parent), sys.prefix, os.path.realpath(sys.base_prefix), "/pfs/")
    assert not [arg for arg in cmdline for path in host_paths if path in arg], cmdline


async def test_a_job_cannot_put_set_id_bits_on_what_it_writes_into_its_home(jobs: Jobs) -> None:
    home = (await probes(jobs, "setid"))["home"]
    assert home["refused"] == ["0o4755", "0o2755", "open"], home
    assert home["modes"] == {"tool": "0o644"}, home  # as written; the set-uid one never made
    on_host = [p for p in jobs.home().rglob("*") if p.lstat().st_mode & 0o6000]
    assert on_host == []
    assert home["nosuid"] is True, home  # and inside, the kernel would ignore them anyway
