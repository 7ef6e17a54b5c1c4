"""`paddlecloud submit|get|logs|kill` against a real `paddlecloud server`: jobs from a package
directory to their end, the package uploaded once, both flag styles, and mistakes in one line."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from paddlecloud import Client, PaddleJob

pytestmark = pytest.mark.slow

DC = "datacenter1"
HOME = f"/pfs/{DC}/home/admin"
PACKAGES = f"{HOME}/.paddlecloud/packages"
CLI_TIMEOUT = 180

# One program for both roles: a parameter server listens on its port until it is stopped
# (trainers start once every server accepts connections); a trainer says hello and exits.
TRAIN_PY = """\
import os, socket, sys, time

if os.environ["TRAINING_ROLE"] == "PSERVER":
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", int(os.environ["PADDLE_PORT"])))
    server.listen()
    print("pserver", os.environ["PADDLE_PORT"], "listening", flush=True)
    while True:
        time.sleep(1)

greeting = os.environ.get("GREETING", "hello")
print(f"{greeting} from trainer {os.environ['TRAINER_ID']} of {os.environ['TRAINERS']}", flush=True)
print("passes:", os.environ.get("PADDLE_INIT_NUM_PASSES"), flush=True)
if os.path.exists("data"):
    sys.exit("data/ should have been left out of the package")
seconds = float(os.environ.get("SLEEP", "0"))
if seconds:
    print("sleeping", seconds, flush=True)
    time.sleep(seconds)
"""


def run_cli(
    server: Any, *args: str, prog: str = "paddlecloud", cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI as its own process with the server's HOME (and so its admin config)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLECLOUD_", "PADDLE_"))}
    clean["HOME"] = str(server.home)
    command = (
        [sys.executable, "-m", "paddlecloud"]
        if prog == "paddlecloud"
        else [str(Path(sys.executable).parent / prog)]
    )
    return subprocess.run(
        [*command, *args],
        env=clean,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        cwd=cwd or server.home.parent,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stdout}\n{result.stderr}"
    return result.stdout


def one_error_line(result: subprocess.CompletedProcess[str], code: int = 1, prog: str = "paddlecloud") -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    assert "Traceback" not in result.stderr
    return lines[0]


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(result))


def make_package(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "train.py").write_text(TRAIN_PY)
    (root / "README.md").write_text("a tiny package\n")
    (root / ".paddlecloudignore").write_text("data/\n")
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(os.urandom(64 * 1024))
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    return root


def packages_on_pfs(server: Any) -> list[str]:
    result = run_cli(server, "-o", "json", "ls", PACKAGES)
    if result.returncode != 0:
        return []
    return sorted(e["path"] for e in json.loads(result.stdout)["entries"] if e["type"] == "file")


def wait_for_state(server: Any, name: str, states: tuple[str, ...], timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = as_json(run_cli(server, "-o", "json", "get", "job", name))
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, f"{name} is still {job['state']}: {job.get('reason')}"
        time.sleep(0.5)


@pytest.fixture
def server(server_factory: Any) -> Any:
    return server_factory()


def test_submit_follow_runs_the_package_and_an_unchanged_package_is_not_uploaded_again(
    server: Any, tmp_path: Path
) -> None:
    package = make_package(tmp_path / "hello")
    first = run_cli(server, "submit", "-f", "--name", "hello-1", "--env", "GREETING=hi", str(package))
    out = ok(first)
    assert f"Collecting package {package} (3 files, " in out  # README.md, train.py, .paddlecloudignore
    assert "Uploading package (" in out and f" as {PACKAGES}/" in out
    assert "Started job hello-1 (1 trainer)" in out
    assert "[trainer-0] hi from trainer 0 of 1" in out.splitlines()
    assert out.rstrip().endswith("Job hello-1 SUCCEEDED") or "Job hello-1 SUCCEEDED" in out
    [uploaded] = packages_on_pfs(server)
    assert uploaded in out

    # Same content again (touched, even): packed to the same name, not uploaded again.
    os.utime(package / "train.py", (1, 1))
    second = ok(run_cli(server, "submit", "--follow", "--name", "hello-2", str(package)))
    assert f"Package already on PFS: {uploaded}" in second
    assert "Uploading" not in second
    assert "[trainer-0] hello from trainer 0 of 1" in second
    assert packages_on_pfs(server) == [uploaded]

    # A changed package is a new one.
    (package / "train.py").write_text(TRAIN_PY + "\nprint('changed')\n")
    third = ok(run_cli(server, "submit", "-f", "--name", "hello-3", str(package)))
    assert "Uploading package" in third and "[trainer-0] changed" in third
    assert len(packages_on_pfs(server)) == 2

    # Resubmitting by the PFS path, as `get job` shows it.
    job = as_json(run_cli(server, "-o", "json", "get", "job", "hello-1"))
    assert job["state"] == "SUCCEEDED" and job["spec"]["package"] == uploaded
    assert job["spec"]["env"] == {"GREETING": "hi"}
    again = ok(
        run_cli(server, "submit", "-f", "--name", "hello-4", "pfs:" + uploaded.removeprefix(HOME + "/"))
    )
    assert f"Using package {uploaded}" in again and "[trainer-0] hi" not in again

    # Without -f: the name and what to run next.
    started = ok(run_cli(server, "submit", "--name", "hello-5", str(package)))
    assert "Job hello-5 is " in started
    assert "paddlecloud logs -f hello-5" in started and "paddlecloud get job hello-5" in started
    wait_for_state(server, "hello-5", ("SUCCEEDED",))
    logs = ok(run_cli(server, "logs", "hello-5")).splitlines()
    assert "[trainer-0] hello from trainer 0 of 1" in logs
    assert ok(run_cli(server, "logs", "-n", "1", "hello-5")).splitlines() == logs[-1:]
    entries = [json.loads(line) for line in ok(run_cli(server, "-o", "json", "logs", "hello-5")).splitlines()]
    assert [e["worker"] for e in entries] == ["trainer-0"] * len(logs)
    assert all(isinstance(e["cursor"], str) for e in entries)


def test_a_ready_archive_is_named_by_its_bytes_as_every_package_was_before_manifests(
    server: Any, tmp_path: Path
) -> None:
    package = make_package(tmp_path / "hello")
    archive = tmp_path / "hello.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(package / "train.py", "train.py")
    named = f"{PACKAGES}/{hashlib.sha256(archive.read_bytes()).hexdigest()}.tar.gz"
    out = ok(run_cli(server, "submit", "-f", "--name", "ready-1", str(archive)))
    assert "Uploading package (" in out and named in out and "Job ready-1 SUCCEEDED" in out
    assert packages_on_pfs(server) == [named]
    again = ok(run_cli(server, "submit", "-f", "--name", "ready-2", str(archive)))
    assert f"Package already on PFS: {named}" in again and "Uploading" not in again
    # An archive under a name its bytes do not have is refused in one line; nothing is placed.
    forged = f"{PACKAGES}/{'0' * 64}.tar.gz"
    refused = one_error_line(run_cli(server, "cp", str(archive), "pfs:" + forged.removeprefix(HOME + "/")))
    assert "Package does not match its name" in refused or "not the one it is named by" in refused
    assert packages_on_pfs(server) == [named]


@pytest.mark.parametrize("prog", ["paddlecloud", "paddlectl"])
def test_the_original_go_style_command_line_runs_pservers_and_trainers(
    server: Any, tmp_path: Path, prog: str
) -> None:
    make_package(tmp_path / "fit_a_line")
    result = run_cli(
        server,
        "submit",
        *"-jobname fit-a-line -cpu 1 -gpu 0 -memory 1Gi -parallelism 2 -pscpu 1 -pservers 2".split(),
        *"-psmemory 1Gi -passes 1 -entry".split(),
        "python train.py",
        "-f",
        "./fit_a_line",
        prog=prog,
        cwd=tmp_path,
    )
    out = ok(result)
    assert "Collecting package ./fit_a_line (3 files, " in out
    assert "Started job fit-a-line (2 trainers, 2 parameter servers)" in out
    lines = out.splitlines()
    for trainer in (0, 1):
        assert f"[trainer-{trainer}] hello from trainer {trainer} of 2" in lines
        assert f"[trainer-{trainer}] passes: 1" in lines
    assert sum(1 for line in lines if line.startswith("[pserver-") and "listening" in line) == 2

    job = as_json(run_cli(server, "-o", "json", "get", "job", "fit-a-line", prog=prog))
    spec = job["spec"]
    assert (spec["trainers"], spec["pservers"], spec["cpu"], spec["memory"], spec["passes"]) == (
        2,
        2,
        "1",
        "1Gi",
        1,
    )
    assert job["state"] == "SUCCEEDED"
    workers = as_json(run_cli(server, "-o", "json", "get", "workers", "fit-a-line", prog=prog))["workers"]
    assert sorted((w["role"], w["index"]) for w in workers) == [
        ("PSERVER", 0),
        ("PSERVER", 1),
        ("TRAINER", 0),
        ("TRAINER", 1),
    ]
    table = ok(run_cli(server, "get", "workers", "fit-a-line", prog=prog)).splitlines()
    assert table[0].split() == ["NAME", "ROLE", "INDEX", "STATE", "RESTARTS", "STARTED", "HOST", "EXIT"]
    assert any(line.startswith("trainer-1") and "TRAINER" in line for line in table)
    pservers = ok(run_cli(server, "logs", "--role", "pserver", "fit-a-line", prog=prog)).splitlines()
    assert pservers and all(line.startswith("[pserver-") for line in pservers)
    one = ok(run_cli(server, "logs", "-w", "trainer-1", "fit-a-line", prog=prog)).splitlines()
    assert one and all(line.startswith("[trainer-1] ") for line in one)


def test_listing_jobs_showing_one_and_the_quota(server: Any, tmp_path: Path) -> None:
    package = make_package(tmp_path / "pkg")
    ok(run_cli(server, "submit", "-f", "--name", "done-1", str(package)))
    ok(run_cli(server, "submit", "--name", "sleeper", "--env", "SLEEP=60", str(package)))
    wait_for_state(server, "sleeper", ("RUNNING",))

    active = ok(run_cli(server, "get", "jobs")).splitlines()
    assert active[0].split() == ["NAME", "STATE", "TRAINERS", "PSERVERS", "AGE", "REASON"]
    assert [line.split()[0] for line in active[1:]] == ["sleeper"]
    everything = [line.split()[0] for line in ok(run_cli(server, "get", "jobs", "-a")).splitlines()[1:]]
    assert everything == ["sleeper", "done-1"]  # newest first
    assert [
        line.split()[0] for line in ok(run_cli(server, "get", "-a", "jobs")).splitlines()[1:]
    ] == everything
    listed = as_json(run_cli(server, "-o", "json", "get", "jobs", "-a"))["jobs"]
    assert [(j["name"], j["state"]) for j in listed] == [("sleeper", "RUNNING"), ("done-1", "SUCCEEDED")]
    assert [
        j["name"]
        for j in as_json(run_cli(server, "get", "jobs", "--state", "succeeded", "-o", "json"))["jobs"]
    ] == ["done-1"]

    shown = ok(run_cli(server, "get", "job", "done-1"))
    record = {
        k.strip(): v.strip()
        for k, _, v in (line.partition(":") for line in shown.split("\n\n")[0].splitlines())
    }
    assert record["State"] == "SUCCEEDED"
    assert record["Trainers"] == "1 (each cpu 1, memory 1Gi, gpu 0, disk 1Gi)"
    assert "\nWorkers:\n" in shown and "\nEvents:\n" in shown
    assert "trainer-0" in shown
    events = as_json(run_cli(server, "-o", "json", "get", "job", "done-1"))["events"]
    assert [e["state"] for e in events if e["type"] == "state"][-1] == "SUCCEEDED"
    assert "name: done-1" in ok(run_cli(server, "-o", "yaml", "get", "job", "done-1"))

    quota = ok(run_cli(server, "get", "quota")).splitlines()
    assert quota[0].split() == ["RESOURCE", "USED", "LIMIT"]
    # The table, then notes on the machine (its GPUs, advisory limits) where it has them.
    notes = ("GPU", "Limits are advisory", "Storage quota")
    table = [line for line in quota[1:] if not line.startswith(notes)]
    # A local PFS root has no filesystem quota: the storage limit says it is advisory here.
    assert "Storage quota: advisory here" in "\n".join(quota), quota
    rows = {line.split()[0]: line.split()[1:] for line in table}
    assert set(rows) == {"cpu", "gpu", "memory", "jobs", "storage", "disk"}
    assert rows["jobs"] == ["1", "unlimited"]  # the sleeper; the admin has no limits
    assert as_json(run_cli(server, "-o", "json", "get", "quota"))["cpu"]["used"] == "1"

    # Kill the running one: it ends KILLED, and the follow of a killed job says so.
    killed = ok(run_cli(server, "kill", "sleeper"))
    assert killed.strip() == "job sleeper killed"
    ended = wait_for_state(server, "sleeper", ("KILLED",))
    # Who killed it and when (it used to say "the supervisor was told to stop").
    assert re.fullmatch(r"killed by admin at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", ended["reason"]), ended
    assert "had already ended: SUCCEEDED" in ok(run_cli(server, "kill", "done-1"))
    assert ok(run_cli(server, "get", "jobs")).strip().startswith("No active jobs")

    # kill -rm forgets it: gone from the list, and the name is free again.
    assert ok(run_cli(server, "kill", "-rm", "sleeper")).strip() == "job sleeper removed"
    assert "sleeper" not in ok(run_cli(server, "get", "jobs", "-a"))
    gone = one_error_line(run_cli(server, "get", "job", "sleeper"))
    assert "sleeper" in gone
    ok(run_cli(server, "submit", "-f", "--name", "sleeper", str(package)))


def test_a_failing_job_followed_exits_non_zero_with_its_state_and_reason(server: Any, tmp_path: Path) -> None:
    package = make_package(tmp_path / "pkg")
    result = run_cli(
        server,
        "submit",
        "-f",
        "--name",
        "broken",
        "--entry",
        "python -c 'import sys; print(1); sys.exit(3)'",
        str(package),
    )
    line = one_error_line(result)
    assert "job broken FAILED" in line and "3" in line
    assert "[trainer-0] 1" in result.stdout.splitlines()


def test_mistakes_get_one_line_and_a_non_zero_exit(server: Any, tmp_path: Path) -> None:
    package = make_package(tmp_path / "pkg")
    ok(run_cli(server, "submit", "-f", "--name", "taken", str(package)))

    duplicate = one_error_line(run_cli(server, "submit", "--name", "taken", str(package)))
    assert "'taken' already exists (SUCCEEDED)" in duplicate and "kill -rm taken" in duplicate

    (package / "new.txt").write_text("a new package, so that an upload would be needed\n")
    before = packages_on_pfs(server)
    memory = run_cli(server, "submit", "--name", "bad-memory", "-memory", "1GB", str(package))
    line = one_error_line(memory)
    assert "memory" in line and "'1GB'" in line and "Ki, Mi, Gi" in line
    assert "Uploading" not in memory.stdout and packages_on_pfs(server) == before  # refused before the upload

    name = one_error_line(run_cli(server, "submit", "--name", "Bad_Name", str(package)))
    assert "name" in name and "lowercase" in name
    env = one_error_line(run_cli(server, "submit", "--env", "NOPE", str(package)), code=2)
    assert "--env 'NOPE': expected KEY=VALUE" in env

    for args in (("get", "job", "nope"), ("get", "workers", "nope"), ("logs", "nope"), ("kill", "nope")):
        line = one_error_line(run_cli(server, *args))
        assert "nope" in line, args

    missing = one_error_line(run_cli(server, "submit", "--name", "x", str(tmp_path / "missing")))
    assert "no such directory" in missing
    not_there = one_error_line(run_cli(server, "submit", "--name", "x", "pfs:nothing/here.tar.gz"))
    assert "not found" in not_there and f"{HOME}/nothing/here.tar.gz" in not_there


def test_dry_run_packs_and_checks_but_uploads_and_starts_nothing(server: Any, tmp_path: Path) -> None:
    package = make_package(tmp_path / "pkg")
    dry = ok(
        run_cli(
            server,
            "submit",
            "--dry-run",
            "-jobname",
            "planned",
            "-pservers",
            "1",
            "-parallelism",
            "2",
            str(package),
        )
    )
    assert "Collecting package" in dry and "Would upload package" in dry
    assert "The package is not on PFS yet: submit would upload it." in dry
    assert "NAME       ROLE     CPU  MEMORY  GPU" in dry
    assert "pserver-0  PSERVER" in dry and "trainer-1  TRAINER" in dry
    assert "Nothing was uploaded or started." in dry
    assert packages_on_pfs(server) == []
    assert "planned" not in ok(run_cli(server, "get", "jobs", "-a"))

    # Once the package is on PFS the server makes the plan itself.
    ok(run_cli(server, "submit", "-f", "--name", "real", str(package)))
    plan = as_json(
        run_cli(
            server, "-o", "json", "submit", "--dry-run", "--name", "planned", "--trainers", "3", str(package)
        )
    )
    assert plan["dry_run"] is True and plan["package"]["kind"] == "tar"
    assert [w["name"] for w in plan["workers"]] == ["trainer-0", "trainer-1", "trainer-2"]
    assert "planned" not in ok(run_cli(server, "get", "jobs", "-a"))
    assert len(packages_on_pfs(server)) == 1


def test_the_python_sdk_submits_follows_and_waits(server: Any, tmp_path: Path) -> None:
    package = make_package(tmp_path / "sdk")
    with Client(server.endpoint, "admin", server.admin_password) as client:
        job = PaddleJob("from-python", package=str(package), trainers=2, env={"GREETING": "hey"})
        started = job.submit(client)
        assert started["name"] == "from-python" and started["spec"]["package"].startswith(PACKAGES)
        lines = sorted(f"[{e['worker']}] {e['line']}" for e in job.logs(follow=True))
        assert (
            "[trainer-0] hey from trainer 0 of 2" in lines and "[trainer-1] hey from trainer 1 of 2" in lines
        )
        assert job.wait(timeout=60)["state"] == "SUCCEEDED"
        assert any(j["name"] == "from-python" for j in client.jobs(all=True))
        assert client.package(str(package)) == started["spec"]["package"]  # already there: no upload
        assert job.kill(rm=True) is None
        assert all(j["name"] != "from-python" for j in client.jobs(all=True))


@pytest.fixture
def hdfs_settings(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """`pfs.hdfs` for a server: the session's minicluster (tests/hdfs_cluster.py) where this
    checkout has it, since pfs reads its staging there when it starts; else a NameNode
    address where nothing listens (a pfs that does not use HDFS yet never asks it)."""
    try:
        hdfs = request.getfixturevalue("real_hdfs")
    except pytest.FixtureLookupError:
        return {"namenode": "http://127.0.0.1:9"}
    return {"namenode": hdfs.url, "root_path": hdfs.fresh_root(), "user": hdfs.platform_user}


@pytest.mark.xdist_group("hdfs")
def test_a_job_of_an_hdfs_datacenter_on_one_machine_is_refused_in_one_line(
    server_factory: Any, hdfs_settings: dict[str, Any], tmp_path: Path
) -> None:
    """With `pfs.hdfs` set the local backend could not show a job its files: `submit` says
    so, and where such jobs run, in one line; nothing is recorded. The package is a PFS
    path, so the refusal is the jobs service's alone."""
    config = tmp_path / "hdfs.yaml"
    config.write_text(yaml.safe_dump({"pfs": {"hdfs": hdfs_settings}}))
    server = server_factory("--server-config", str(config))
    forms = (("submit", "--name", "on-hdfs", "pfs:pkg"), ("submit", "-jobname", "on-hdfs", f"{HOME}/pkg"))
    for form in forms:
        line = one_error_line(run_cli(server, *form))
        assert f"datacenter: datacenter {DC!r} keeps its files in HDFS" in line, line
        assert "run the jobs of an HDFS datacenter on Kubernetes" in line, line
    assert as_json(run_cli(server, "-o", "json", "get", "jobs"))["jobs"] == []
