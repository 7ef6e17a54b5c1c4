"""The jobs service through the real gateway, running real jobs under the local backend."""

from __future__ import annotations

import asyncio
import io
import json
import os
import secrets
import tarfile
import time
import zipfile
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from paddlecloud.common import volume
from paddlecloud.common.keys import STORE
from paddlecloud.common.quantity import parse_bytes
from paddlecloud.common.store import Token, User
from paddlecloud.common.store.models import Quota, utcnow
from paddlecloud.gateway.accounts import hash_token
from paddlecloud.gateway.app import create_app as create_gateway
from paddlecloud.jobs.app import create_app as create_jobs
from paddlecloud.jobs.keys import MANAGER
from paddlecloud.jobs.local import backend as local_backend
from paddlecloud.pfs.app import create_app as create_pfs
from support import make_config, wait_until

API = "/api/v1"
PROBLEM = "application/problem+json"
NDJSON = "application/x-ndjson"


@dataclass
class Jobs:
    """A jobs service behind a gateway, with tokens for alice and bob."""

    client: TestClient[Any, Any]
    root: Path  # the datacenter's PFS root
    work_dir: Path
    headers: dict[str, dict[str, str]]

    def home(self, user: str = "alice") -> Path:
        return self.root / "home" / user

    def package(self, files: dict[str, str], name: str = "pkg", user: str = "alice") -> str:
        """A package directory in the user's home; its PFS path."""
        target = self.home(user) / name
        target.mkdir(parents=True, exist_ok=True)
        for rel, text in files.items():
            (target / rel).write_text(text)
        return f"/pfs/dc1/home/{user}/{name}"

    async def call(self, method: str, endpoint: str, who: str = "alice", **kwargs: Any) -> ClientResponse:
        headers = {**self.headers[who], **kwargs.pop("headers", {})}
        return await self.client.request(method, f"{API}/{endpoint}", headers=headers, **kwargs)

    async def submit(self, spec: dict[str, Any], who: str = "alice", status: int = 201) -> dict[str, Any]:
        resp = await self.call("POST", "jobs", who, json=spec)
        body = await resp.json(content_type=None)
        assert resp.status == status, body
        return body  # type: ignore[no-any-return]

    async def job(self, name: str, who: str = "alice") -> dict[str, Any]:
        resp = await self.call("GET", f"jobs/{name}", who)
        assert resp.status == 200, await resp.text()
        return await resp.json()  # type: ignore[no-any-return]

    async def wait(self, name: str, states: tuple[str, ...], timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            job = await self.job(name)
            if job["state"] in states:
                return job
            assert time.monotonic() < deadline, f"{name} still {job['state']}: {job}"
            await asyncio.sleep(0.05)

    async def logs(self, name: str, **params: str) -> str:
        resp = await self.call("GET", f"jobs/{name}/logs", params=params)
        assert resp.status == 200, await resp.text()
        return await resp.text()


async def start_jobs(
    tmp_path: Path,
    aiohttp_server: Any,
    aiohttp_client: Any,
    builder_url: str | None = None,
    **jobs_settings: Any,
) -> Jobs:
    """A jobs service (with `jobs_settings` over the test defaults) behind a gateway; its
    builder at `builder_url` (none: the default address, where nothing may answer)."""
    sections: dict[str, dict[str, Any]] = {
        "pfs": {"datacenter": "dc1"},
        "jobs": {"grace_seconds": 3.0, "poll_seconds": 0.05, **jobs_settings},
    }
    if builder_url is not None:
        sections["builder"] = {"url": builder_url}
    # pfs counts the storage that quotas check; the jobs service asks it.
    pfs = await aiohttp_server(create_pfs(make_config(tmp_path, **sections)))
    sections["pfs"]["url"] = str(pfs.make_url(""))
    server = await aiohttp_server(create_jobs(make_config(tmp_path, **sections)))
    config = make_config(
        tmp_path,
        **sections,
        gateway={
            "jobs_url": str(server.make_url("")),
            "pfs_url": str(pfs.make_url("")),
            "admin_password": None,
        },
    )
    client = await aiohttp_client(create_gateway(config))
    store = client.app[STORE]
    headers = {}
    quotas = {"alice": Quota(cpu_milli=8000, memory_bytes=16 * 2**30, jobs=6), "bob": Quota()}
    for name, quota in quotas.items():
        await store.create_user(User(name, "!unused", quota=quota))
        token = f"pc_{secrets.token_urlsafe(32)}"
        await store.add_token(Token(hash_token(token), name, expires_at=utcnow() + timedelta(hours=1)))
        headers[name] = {"Authorization": f"Bearer {token}"}
    jobs = Jobs(client, tmp_path / "pfs", tmp_path / "jobs", headers)
    jobs.server_app = server.app  # type: ignore[attr-defined]
    return jobs


@pytest.fixture
async def jobs(tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any) -> Jobs:
    return await start_jobs(tmp_path, aiohttp_server, aiohttp_client)


def job_processes(work_dir: Path) -> list[psutil.Process]:
    """Every live process whose command line or working directory is in `work_dir`."""
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            text = " ".join(proc.info["cmdline"] or []) + " " + (proc.info["cwd"] or "")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if str(work_dir) in text:
            found.append(proc)
    return found


PSERVER_AND_TRAINER = """\
import os, socket, sys, time
if os.environ["TRAINING_ROLE"] == "PSERVER":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(os.environ["PADDLE_PORT"]))); s.listen()
    print("pserver", os.environ["TRAINER_ID"], "listening", flush=True)
    time.sleep(600)
else:
    print("trainer", os.environ["TRAINER_ID"], "of", os.environ["TRAINERS"],
          "sees", os.environ["PADDLE_PSERVERS_IP_PORT_LIST"], flush=True)
    print("id file", open("trainer_id").read().strip(), flush=True)
    sys.exit(int(os.environ.get("EXIT_CODE", "0")))
"""


async def test_a_job_runs_to_success_with_events_workers_and_logs(jobs: Jobs) -> None:
    package = jobs.package({"train.py": PSERVER_AND_TRAINER})
    created = await jobs.submit({"name": "ok", "package": package, "trainers": 2, "pservers": 2})
    assert created["state"] in ("PENDING", "RUNNING")
    assert created["spec"]["memory"] == "1Gi" and created["spec"]["entry"] == "python train.py"
    job = await jobs.wait("ok", ("SUCCEEDED", "FAILED"))
    assert job["state"] == "SUCCEEDED", job
    assert job["reason"] == "every trainer exited 0"
    states = [e["state"] for e in job["events"] if e["type"] == "state"]
    assert states == ["PENDING", "RUNNING", "SUCCEEDED"]
    assert {"PserversReady", "WorkerStarted"} <= {e["reason"] for e in job["events"]}
    workers = {w["name"]: w for w in job["workers"]}
    assert sorted(workers) == ["pserver-0", "pserver-1", "trainer-0", "trainer-1"]
    assert workers["trainer-1"]["state"] == "SUCCEEDED" and workers["trainer-1"]["exit_code"] == 0
    assert workers["pserver-0"]["role"] == "PSERVER" and workers["pserver-0"]["index"] == 0
    text = await jobs.logs("ok")
    assert "[pserver-1] pserver 1 listening" in text
    assert "[trainer-1] trainer 1 of 2 sees 127.0.0.1:" in text
    assert "[trainer-1] id file 1" in text
    trainers_only = await jobs.logs("ok", role="trainer")
    assert not [line for line in trainers_only.splitlines() if not line.startswith("[trainer-")]
    assert "[trainer-0]" in trainers_only and "[trainer-1]" in trainers_only
    one = (await jobs.logs("ok", worker="trainer-0")).splitlines()
    assert len(one) == 2 and one[0].startswith("[trainer-0] trainer 0 of 2 sees 127.0.0.1:")
    assert one[1] == "[trainer-0] id file 0"
    assert await wait_until(lambda: not job_processes(jobs.work_dir), 5), job_processes(jobs.work_dir)
    listed = await (await jobs.call("GET", "jobs")).json()
    assert listed["jobs"] == []  # only active jobs without all=1
    listed = await (await jobs.call("GET", "jobs", params={"all": "1"})).json()
    assert [j["name"] for j in listed["jobs"]] == ["ok"]


async def test_a_failing_trainer_fails_the_job_and_stops_its_parameter_servers(jobs: Jobs) -> None:
    package = jobs.package({"train.py": PSERVER_AND_TRAINER})
    spec = {"name": "bad", "package": package, "pservers": 2, "env": {"EXIT_CODE": "1"}}
    await jobs.submit(spec)
    job = await jobs.wait("bad", ("SUCCEEDED", "FAILED"))
    assert job["state"] == "FAILED"
    assert "trainer-0 exited with 1" in job["reason"], job["reason"]
    assert await wait_until(lambda: not job_processes(jobs.work_dir), 5), job_processes(jobs.work_dir)
    workers = {w["name"]: w["state"] for w in job["workers"]}
    assert workers["trainer-0"] == "FAILED"
    assert workers["pserver-0"] in ("KILLED", "SUCCEEDED", "FAILED") and workers["pserver-0"] != "RUNNING"


async def test_exit_137_is_explained(jobs: Jobs) -> None:
    package = jobs.package({"train.py": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"})
    await jobs.submit({"name": "oom", "package": package})
    job = await jobs.wait("oom", ("SUCCEEDED", "FAILED"))
    assert job["state"] == "FAILED"
    assert "killed, often out of memory" in job["reason"] and "-memory" in job["reason"], job["reason"]


async def test_kill_mid_run_records_killed_and_leaves_no_process(jobs: Jobs, report_figure: Any) -> None:
    package = jobs.package({"train.py": "import time\nprint('up', flush=True)\ntime.sleep(600)\n"})
    await jobs.submit({"name": "sleepy", "package": package, "trainers": 2, "pservers": 0})
    await jobs.wait("sleepy", ("RUNNING",))
    assert await wait_until(lambda: (jobs.work_dir).exists() and "up" in _all_logs(jobs.work_dir), 10)
    started = time.monotonic()
    resp = await jobs.call("DELETE", "jobs/sleepy")
    body = await resp.json()
    elapsed = time.monotonic() - started
    assert resp.status == 200, body
    assert body["state"] == "KILLED", body
    assert not job_processes(jobs.work_dir), job_processes(jobs.work_dir)
    report_figure(f"jobs: DELETE of a running 2-trainer job answered, its processes gone, in {elapsed:.2f} s")
    job = await jobs.job("sleepy")
    assert job["state"] == "KILLED" and job["finished_at"]
    # Killing a finished job changes nothing; -rm removes it and its logs.
    again = await jobs.call("DELETE", "jobs/sleepy")
    assert (await again.json())["state"] == "KILLED"
    gone = await jobs.call("DELETE", "jobs/sleepy", params={"rm": "1"})
    assert gone.status == 204
    assert (await jobs.call("GET", "jobs/sleepy")).status == 404
    assert not list((jobs.work_dir / "alice").iterdir())


def _all_logs(work_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in work_dir.rglob("logs/*.log"))


async def test_a_duplicate_name_is_a_clear_409(jobs: Jobs) -> None:
    package = jobs.package({"train.py": "print('x')\n"})
    await jobs.submit({"name": "twice", "package": package})
    await jobs.wait("twice", ("SUCCEEDED",))
    body = await jobs.submit({"name": "twice", "package": package}, status=409)
    assert body["code"] == "ERR_ALREADY_EXISTS"
    assert "'twice' already exists (SUCCEEDED)" in body["detail"] and "kill -rm twice" in body["detail"]
    # Bob may use the same name: names are unique per user.
    bob_package = jobs.package({"train.py": "print('x')\n"}, user="bob")
    await jobs.submit({"name": "twice", "package": bob_package}, who="bob")


async def test_an_over_quota_submit_is_refused_with_the_numbers(jobs: Jobs) -> None:
    package = jobs.package({"train.py": "import time\ntime.sleep(600)\n"})
    await jobs.submit({"name": "big", "package": package, "trainers": 3, "cpu": 2, "pservers": 0})
    body = await jobs.submit({"name": "more", "package": package, "trainers": 2, "cpu": "1500m"}, status=403)
    assert body["code"] == "ERR_QUOTA_EXCEEDED"
    assert "cpu: asked 3, in use 6, allowed 8" in body["detail"], body["detail"]
    assert body["quota"] == [{"resource": "cpu", "requested": "3", "used": "6", "limit": "8"}]
    quota = await (await jobs.call("GET", "quota")).json()
    assert quota["cpu"] == {"used": "6", "limit": "8"}
    assert quota["memory"] == {"used": "3Gi", "limit": "16Gi"}
    assert quota["jobs"] == {"used": 1, "limit": 6} and quota["gpu"] == {"used": 0, "limit": None}
    # Whole blocks now (allocated, not apparent sizes): `4Ki` and the like.
    assert quota["storage"]["limit"] is None and parse_bytes(quota["storage"]["used"]) > 0
    assert (await jobs.call("GET", "jobs/more")).status == 404  # nothing was recorded
    await jobs.call("DELETE", "jobs/big")
    await jobs.submit({"name": "more", "package": package, "trainers": 2, "cpu": "1500m"})
    await jobs.call("DELETE", "jobs/more")


async def test_a_log_follow_cut_mid_stream_resumes_without_loss_or_repeats(jobs: Jobs) -> None:
    program = "import time\nfor i in range(400):\n    print(f'line {i}', flush=True)\n    time.sleep(0.002)\n"
    package = jobs.package({"train.py": program})
    await jobs.submit({"name": "chatty", "package": package, "trainers": 2})
    seen: list[tuple[str, str]] = []
    cursor = None
    connections = 0
    while connections < 100:
        connections += 1
        params = {"follow": "1"} | ({"cursor": cursor} if cursor else {})
        resp = await jobs.call("GET", "jobs/chatty/logs", params=params, headers={"Accept": NDJSON})
        assert resp.status == 200, await resp.text()
        assert resp.content_type == NDJSON
        ended = True
        count = 0
        async for raw in resp.content:
            item = json.loads(raw)
            seen.append((item["worker"], item["line"]))
            cursor = item["cursor"]
            count += 1
            if count == 37:  # drop the connection mid-stream
                resp.close()
                ended = False
                break
        if ended:
            break
    assert connections > 3  # the stream really was cut and resumed several times
    for worker in ("trainer-0", "trainer-1"):
        assert [line for w, line in seen if w == worker] == [f"line {i}" for i in range(400)]
    assert (await jobs.wait("chatty", ("SUCCEEDED", "FAILED")))["state"] == "SUCCEEDED"


async def test_tail_and_a_bad_cursor_and_unknown_worker(jobs: Jobs) -> None:
    package = jobs.package({"train.py": "for i in range(10):\n    print(i)\n"})
    await jobs.submit({"name": "tail", "package": package})
    await jobs.wait("tail", ("SUCCEEDED",))
    assert (await jobs.logs("tail", tail="3")).splitlines() == [
        "[trainer-0] 7",
        "[trainer-0] 8",
        "[trainer-0] 9",
    ]
    assert await jobs.logs("tail", tail="0") == ""
    for params, status, field in (
        ({"cursor": "nonsense"}, 400, "ERR_BAD_CURSOR"),
        ({"cursor": "l1.1.2.3"}, 400, "ERR_BAD_CURSOR"),
        ({"worker": "trainer-9"}, 404, "ERR_NOT_FOUND"),
        ({"role": "chef"}, 400, "ERR_BAD_REQUEST"),
        ({"tail": "-1"}, 400, "ERR_BAD_REQUEST"),
    ):
        resp = await jobs.call("GET", "jobs/tail/logs", params=params)
        body = await resp.json(content_type=None)
        assert (resp.status, resp.content_type, body["code"]) == (status, PROBLEM, field), body
        assert "Traceback" not in json.dumps(body)


async def test_users_cannot_see_follow_or_kill_each_others_jobs(jobs: Jobs) -> None:
    package = jobs.package({"train.py": "import time\ntime.sleep(600)\n"})
    await jobs.submit({"name": "secret", "package": package})
    for method, endpoint in (
        ("GET", "jobs/secret"),
        ("GET", "jobs/secret/workers"),
        ("GET", "jobs/secret/events"),
        ("GET", "jobs/secret/logs?follow=1"),
        ("DELETE", "jobs/secret"),
        ("DELETE", "jobs/secret?rm=1"),
    ):
        resp = await jobs.call(method, endpoint, who="bob")
        body = await resp.json(content_type=None)
        assert resp.status == 404 and body["code"] == "ERR_NOT_FOUND", (endpoint, body)
    listed = await (await jobs.call("GET", "jobs", who="bob", params={"all": "1"})).json()
    assert listed["jobs"] == []
    # Nor run a package from another's home.
    body = await jobs.submit({"name": "steal", "package": package}, who="bob", status=422)
    assert body["errors"][0]["field"] == "package" and "your own home" in body["detail"]
    assert (await jobs.wait("secret", ("RUNNING", "FAILED")))["state"] == "RUNNING"
    await jobs.call("DELETE", "jobs/secret")


async def test_bad_submissions_name_the_problem(jobs: Jobs) -> None:
    package = jobs.package({"train.py": "print(1)\n"})
    cases: list[tuple[Any, int, str, str]] = [
        ({"name": "fit_a_line", "package": package}, 422, "name", "'_' is not allowed"),
        ({"name": "m", "package": package, "memory": "1GB"}, 422, "memory", "Mi, Gi"),
        ({"name": "u", "package": package, "colour": "red"}, 422, "colour", "unknown field"),
        ({"name": "p", "package": "/pfs/dc1/home/alice/nope"}, 422, "package", "not found"),
        ({"name": "d", "package": package, "datacenter": "dc9"}, 422, "datacenter", "unknown datacenter"),
        ({"name": "o", "package": package, "output": "/pfs/dc1/public/out"}, 422, "output", "read-only"),
        ({"name": "t", "package": "/pfs/dc1/home/alice/../bob"}, 422, "package", ""),
    ]
    for spec, status, field, words in cases:
        body = await jobs.submit(spec, status=status)
        assert body["errors"][0]["field"] == field, body
        assert words in body["detail"], body
        assert "Traceback" not in json.dumps(body)
    missing = await jobs.submit({"name": "p", "package": "/pfs/dc1/home/alice/nope"}, status=422)
    assert missing["code"] == "ERR_PACKAGE_NOT_FOUND"
    assert "/pfs/dc1/home/alice/nope" in missing["detail"] and "quota" in missing["detail"]
    assert len(missing["detail"]) <= 200, missing["detail"]  # a line a person reads, not a page
    resp = await jobs.call("POST", "jobs", data=b"{not json", headers={"Content-Type": "application/json"})
    assert resp.status == 400
    listed = await (await jobs.call("GET", "jobs", params={"all": "1"})).json()
    assert listed["jobs"] == []  # nothing half-recorded
    resp = await jobs.call("GET", "jobs", params={"state": "DANCING"})
    assert resp.status == 400


async def test_original_body_and_dry_run(jobs: Jobs) -> None:
    package = jobs.package({"train.py": "print(1)\n"})
    resp = await jobs.call(
        "POST",
        "jobs",
        params={"dry_run": "1"},
        json={"name": "orig", "job_package": package, "parallelism": 2, "pservers": 1, "topology": "conf.py"},
    )
    body = await resp.json()
    assert resp.status == 200, body
    assert body["dry_run"] is True and body["job"]["spec"]["trainers"] == 2
    assert body["job"]["spec"]["entry"] == "python conf.py"  # the topology is what runs
    assert [w["name"] for w in body["workers"]] == ["pserver-0", "trainer-0", "trainer-1"]
    assert body["package"] == {"path": package, "kind": "dir", "found": True}
    assert (await jobs.call("GET", "jobs/orig")).status == 404  # nothing started or recorded
    # A package not uploaded yet: the dry run still checks the rest, and says so.
    missing = {"name": "later", "package": "pkgs/abc.tar.gz"}
    resp = await jobs.call("POST", "jobs", params={"dry_run": "1"}, json=missing)
    body = await resp.json()
    assert resp.status == 200, body
    assert body["package"] == {"path": "/pfs/dc1/home/alice/pkgs/abc.tar.gz", "kind": None, "found": False}
    resp = await jobs.call("POST", "jobs", params={"dry_run": "1"}, json=missing | {"cpu": 100})
    assert (await resp.json())["code"] == "ERR_QUOTA_EXCEEDED"
    assert not jobs.work_dir.exists() or not any(jobs.work_dir.rglob("plan.json"))


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
async def test_archived_packages_run_and_unsafe_archives_fail_the_job(jobs: Jobs, kind: str) -> None:
    def archive(files: dict[str, str]) -> bytes:
        buffer = io.BytesIO()
        if kind == "zip":
            with zipfile.ZipFile(buffer, "w") as z:
                for name, text in files.items():
                    z.writestr(name, text)
        else:
            with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
                for name, text in files.items():
                    data = text.encode()
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        return buffer.getvalue()

    jobs.home().mkdir(parents=True, exist_ok=True)
    (jobs.home() / f"good.{kind}").write_bytes(archive({"train.py": "print('from the archive')\n"}))
    await jobs.submit({"name": "good", "package": f"/pfs/dc1/home/alice/good.{kind}"})
    assert (await jobs.wait("good", ("SUCCEEDED", "FAILED")))["state"] == "SUCCEEDED"
    assert "[trainer-0] from the archive" in await jobs.logs("good")
    (jobs.home() / f"evil.{kind}").write_bytes(archive({"../../escape.py": "x"}))
    await jobs.submit({"name": "evil", "package": f"/pfs/dc1/home/alice/evil.{kind}"})
    job = await jobs.wait("evil", ("SUCCEEDED", "FAILED"))
    assert job["state"] == "FAILED" and "cannot prepare the job" in job["reason"], job["reason"]
    assert not list(jobs.root.parent.rglob("escape.py"))


async def test_output_and_the_runtime_paths(jobs: Jobs) -> None:
    program = """\
import os
out = os.environ["PADDLE_CLOUD_OUTPUT"]
open(os.path.join(out, "model.txt"), "w").write("weights")
print("home", os.environ["PADDLE_CLOUD_PFS_HOME"])
print("output", out)
"""
    package = jobs.package({"train.py": program})
    await jobs.submit({"name": "writes", "package": package})
    job = await jobs.wait("writes", ("SUCCEEDED", "FAILED"))
    assert job["state"] == "SUCCEEDED", job["reason"]
    assert (jobs.home() / "jobs" / "writes" / "output" / "model.txt").read_text() == "weights"
    text = await jobs.logs("writes")
    backend = jobs.server_app[MANAGER].backend  # type: ignore[attr-defined]
    if backend.sandboxed:
        assert "[trainer-0] home /pfs/dc1/home/alice" in text
        assert "[trainer-0] output /pfs/dc1/home/alice/jobs/writes/output" in text
    else:
        assert f"[trainer-0] home {jobs.home()}" in text


async def test_a_submit_resolves_each_of_its_paths_once(jobs: Jobs, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's package, output and input are parsed once, at its submit, and the backend
    runs the launch with those paths (issue 29): counted at the path grammar's parser."""
    parsed: Counter[str] = Counter()
    real = volume.parse_path

    def counting(text: str, datacenter: str) -> volume.PfsPath:
        parsed[text] += 1
        return real(text, datacenter)

    # resolve_for calls it through the module; a backend that imported it by name, too.
    monkeypatch.setattr(volume, "parse_path", counting)
    monkeypatch.setattr(local_backend, "parse_path", counting, raising=False)
    package = jobs.package({"train.py": "print('ran')"})
    (jobs.home() / "data").mkdir()
    output = "/pfs/dc1/home/alice/jobs/counted/output"
    await jobs.submit({"name": "counted", "package": package, "input": "/pfs/dc1/home/alice/data"})
    job = await jobs.wait("counted", ("SUCCEEDED", "FAILED"))
    assert job["state"] == "SUCCEEDED", job["reason"]
    counts = {path: parsed[path] for path in (package, output, "/pfs/dc1/home/alice/data")}
    assert counts == dict.fromkeys(counts, 1), counts


async def test_pfs_paths_inside_a_job_show_only_the_users_own_home(jobs: Jobs) -> None:
    backend = jobs.server_app[MANAGER].backend  # type: ignore[attr-defined]
    if not backend.sandboxed:
        pytest.skip("no sandbox here (bubblewrap is not installed)")
    (jobs.home("bob")).mkdir(parents=True)
    (jobs.home("bob") / "private.txt").write_text("bob's")
    (jobs.root / "public" / "shared.txt").write_text("for all")
    program = """\
import os
print("data", open("/pfs/dc1/home/alice/data.txt").read())
print("public", open("/pfs/dc1/public/shared.txt").read())
print("bob visible", os.path.exists("/pfs/dc1/home/bob"))
try:
    open("/pfs/dc1/public/new.txt", "w")
except OSError as exc:
    print("public write", type(exc).__name__)
"""
    package = jobs.package({"train.py": program})
    (jobs.home() / "data.txt").write_text("alice's data")
    await jobs.submit({"name": "reads", "package": package})
    job = await jobs.wait("reads", ("SUCCEEDED", "FAILED"))
    text = await jobs.logs("reads")
    assert job["state"] == "SUCCEEDED", (job["reason"], text)
    assert "[trainer-0] data alice's data" in text
    assert "[trainer-0] public for all" in text
    assert "[trainer-0] bob visible False" in text
    assert "[trainer-0] public write OSError" in text or "public write PermissionError" in text
    assert not (jobs.root / "public" / "new.txt").exists()
    assert not os.path.ismount("/pfs")  # nothing leaked into the host's mount table


async def test_a_sandboxed_workers_own_host_name_resolves_to_loopback(jobs: Jobs) -> None:
    # Paddle's collective mode (gloo) looks the host name up; the sandbox's name is not in
    # the host's /etc/hosts, so it failed with "cannot be obtained" or a SIGSEGV (issue 27).
    backend = jobs.server_app[MANAGER].backend  # type: ignore[attr-defined]
    if not backend.sandboxed:
        pytest.skip("no sandbox here (bubblewrap is not installed)")
    program = """\
import socket
name = socket.gethostname()
print("name", name, socket.gethostbyname(name))
print("v6", sorted({a[4][0] for a in socket.getaddrinfo(name, None, socket.AF_INET6)}))
print("localhost", socket.gethostbyname("localhost"))
"""
    await jobs.submit({"name": "named", "package": jobs.package({"train.py": program})})
    job = await jobs.wait("named", ("SUCCEEDED", "FAILED"))
    text = await jobs.logs("named")
    assert job["state"] == "SUCCEEDED", (job["reason"], text)
    assert "[trainer-0] name paddlecloud 127.0.0.1" in text
    assert "[trainer-0] v6 ['::1']" in text
    assert "[trainer-0] localhost 127.0.0.1" in text  # the host's own lines are kept


async def test_reading_a_list_pages_with_cursors(jobs: Jobs) -> None:
    package = jobs.package({"train.py": "print(1)\n"})
    for i in range(5):
        await jobs.submit({"name": f"j{i}", "package": package})
    for i in range(5):
        await jobs.wait(f"j{i}", ("SUCCEEDED",))
    names: list[str] = []
    cursor = None
    while True:
        params = {"all": "1", "limit": "2"} | ({"cursor": cursor} if cursor else {})
        page = await (await jobs.call("GET", "jobs", params=params)).json()
        names += [j["name"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert names == ["j4", "j3", "j2", "j1", "j0"]
    bad = await jobs.call("GET", "jobs", params={"all": "1", "cursor": "garbage"})
    assert bad.status == 400


async def test_an_image_is_said_to_be_ignored_by_the_backend_that_ignores_it(jobs: Jobs) -> None:
    package = jobs.package({"train.py": "print('ran')\n"})
    await jobs.submit({"name": "imaged", "package": package, "image": "python:3.11"})
    job = await jobs.wait("imaged", ("SUCCEEDED", "FAILED"))
    assert job["state"] == "SUCCEEDED", job["reason"]
    ignored = [e for e in job["events"] if e["reason"] == "ImageIgnored"]
    assert len(ignored) == 1 and "python:3.11" in ignored[0]["message"], job["events"]


async def test_registry_credentials_are_saved_listed_without_the_password_and_deleted(jobs: Jobs) -> None:
    body = {"name": "myreg", "server": "registry.example.com:5000", "username": "al", "password": "s3cret"}
    resp = await jobs.call("POST", "registries", json=body)
    saved = await resp.json()
    assert resp.status == 201, saved
    assert saved["name"] == "myreg" and "password" not in saved
    assert resp.headers["Location"] == "/api/v1/registries/myreg"

    resp = await jobs.call("GET", "registries")
    listed = await resp.json()
    assert [r["name"] for r in listed["registries"]] == ["myreg"]
    assert "s3cret" not in await resp.text()
    assert (await (await jobs.call("GET", "registries", who="bob")).json())["registries"] == []

    bad = await jobs.call("POST", "registries", json={**body, "name": "9reg", "extra": 1})
    problem = await bad.json()
    assert bad.status == 422 and {e["field"] for e in problem["errors"]} == {"name", "extra"}
    assert "s3cret" not in await bad.text()

    # A job that names a registry: refused at submit (and at a dry run) unless it is saved.
    package = jobs.package({"train.py": "print('ran')\n"})
    refused = await jobs.submit({"name": "r1", "package": package, "registry": "nope"}, status=422)
    assert refused["errors"][0]["field"] == "registry" and "nope" in refused["detail"]
    resp = await jobs.call(
        "POST", "jobs", params={"dry_run": "1"}, json={"name": "r1", "package": package, "registry": "nope"}
    )
    assert resp.status == 422
    await jobs.submit({"name": "r2", "package": package, "registry": "myreg"})
    assert (await jobs.wait("r2", ("SUCCEEDED", "FAILED")))["state"] == "SUCCEEDED"
    # Another user's registry of that name is not theirs.
    bob_package = jobs.package({"train.py": "print('x')\n"}, user="bob")
    await jobs.submit({"name": "b1", "package": bob_package, "registry": "myreg"}, who="bob", status=422)

    assert (await jobs.call("DELETE", "registries/myreg")).status == 204
    missing = await jobs.call("DELETE", "registries/myreg")
    assert missing.status == 404
    assert (await (await jobs.call("GET", "registries")).json())["registries"] == []


async def test_parameter_servers_run_their_own_entry_and_one_that_quits_early_is_explained(
    jobs: Jobs,
) -> None:
    serve = (
        "import os, socket, time\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('127.0.0.1', int(os.environ['PADDLE_PORT']))); s.listen()\n"
        "print('serving as', os.environ['TRAINING_ROLE'], flush=True)\n"
        "time.sleep(600)\n"
    )
    package = jobs.package({"train.py": "print('training')\n", "serve.py": serve})
    spec = {"name": "split", "package": package, "pservers": 1, "psentry": "python serve.py"}
    await jobs.submit(spec)
    job = await jobs.wait("split", ("SUCCEEDED", "FAILED"))
    assert job["state"] == "SUCCEEDED", job["reason"]
    text = await jobs.logs("split")
    assert "[pserver-0] serving as PSERVER" in text and "[trainer-0] training" in text

    # One entry for both roles that ignores TRAINING_ROLE: the server "finishes" at once.
    await jobs.submit({"name": "naive", "package": package, "pservers": 1})
    naive = await jobs.wait("naive", ("SUCCEEDED", "FAILED"))
    assert naive["state"] == "FAILED"
    assert naive["reason"] == (
        "pserver-0 exited before the trainers started: does your entry handle "
        "TRAINING_ROLE=PSERVER, or should you set --pserver-entry?"
    )
    bad = await jobs.submit({"name": "bad", "package": package, "psentry": " "}, status=422)
    assert bad["errors"][0]["field"] == "psentry"


async def test_resources_are_sampled_refused_for_a_bad_since_and_removed_with_the_job(
    tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any
) -> None:
    jobs = await start_jobs(tmp_path, aiohttp_server, aiohttp_client, metrics={"interval": 0.1})
    package = jobs.package({"train.py": "import time\nprint('up', flush=True)\ntime.sleep(60)\n"})
    await jobs.submit({"name": "sampled", "package": package})

    async def sampled() -> dict[str, Any]:
        """The series once it has two points of trainer-0 (a first point has no CPU yet)."""
        deadline = time.monotonic() + 30
        while True:
            body = await (await jobs.call("GET", "jobs/sampled/resources")).json()
            if body["workers"] and len(body["workers"][0]["t"]) >= 2:
                return body  # type: ignore[no-any-return]
            assert time.monotonic() < deadline, body
            await asyncio.sleep(0.05)

    body = await sampled()
    assert body["available"] is True and body["interval_seconds"] == 0.1
    worker = body["workers"][0]
    assert worker["worker"] == "trainer-0" and worker["memory_limit_bytes"] == 2**30
    assert all(isinstance(m, int) for m in worker["memory_bytes"])  # 0 until its program ran
    peaks = (await jobs.job("sampled"))["resources"]
    assert peaks["trainer-0"]["memory_bytes"] == max(worker["memory_bytes"])

    for bad in ("yesterday", "nan", "-1", "inf"):
        resp = await jobs.call("GET", "jobs/sampled/resources", params={"since": bad})
        problem = await resp.json(content_type=None)
        assert (resp.status, resp.content_type) == (400, PROBLEM), problem
        assert [e["field"] for e in problem["errors"]] == ["since"], problem
    assert (await jobs.call("GET", "jobs/sampled/resources", "bob")).status == 404

    # Written to the store when the job ends; `kill -rm` takes the series with the job.
    store = jobs.server_app[STORE]  # type: ignore[attr-defined]
    stored = await store.get_job("alice", "sampled")
    assert (await jobs.call("DELETE", "jobs/sampled")).status == 200
    deadline = time.monotonic() + 30
    while not await store.list_series(stored.id):
        assert time.monotonic() < deadline, "the series was not kept when the job ended"
        await asyncio.sleep(0.05)
    [kept] = await store.list_series(stored.id)
    assert kept.worker == "trainer-0" and '"memory_bytes":[' in kept.text
    assert (await jobs.call("DELETE", "jobs/sampled", params={"rm": "1"})).status == 204
    assert await store.list_series(stored.id) == []
