"""`paddlecloud tensorboard|visualdl` against a real `paddlecloud server` running the real
TensorBoard 2.21 and VisualDL 2.5 (`make viewers`) on scalars their real writers wrote:
served to the job's owner, refused to anyone else, and no viewer left once the server stops."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import clean_env
from test_dashboard import browser, context, no_leaked_tasks

from support import VIEWER_PYTHONS

pytestmark = pytest.mark.slow
__all__ = ["browser", "context", "no_leaked_tasks"]  # fixtures, as test_dashboard.py has them

PYTHONS = VIEWER_PYTHONS
LOSSES = [1.0, 0.5, 0.25, 0.125, 0.0625]
WAIT_SECONDS = 120.0

# Written by torch's own SummaryWriter, which imports the `tensorboard` package: the test's
# Python has torch, the viewer's environment has tensorboard.
TORCH_WRITER = """\
import sys
sys.path.append(sys.argv[2])
from torch.utils.tensorboard import SummaryWriter
writer = SummaryWriter(sys.argv[1])
for step, loss in enumerate(LOSSES):
    writer.add_scalar("loss", loss, step)
writer.close()
""".replace("LOSSES", repr(LOSSES))
VISUALDL_WRITER = """\
import sys
from visualdl import LogWriter
with LogWriter(logdir=sys.argv[1]) as writer:
    for step, loss in enumerate(LOSSES):
        writer.add_scalar(tag="loss", step=step, value=loss)
""".replace("LOSSES", repr(LOSSES))


def http(url: str, token: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 - loopback
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def token_of(server: Any, user: str) -> str:
    request = urllib.request.Request(  # noqa: S310 - loopback
        server.endpoint + "/api/v1/auth/token",
        data=json.dumps({"username": user, "password": f"{user}-password"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
        return str(json.loads(answer.read())["token"])


def poll(url: str, done: Any) -> Any:
    """The first answer at `url` that `done` accepts: a viewer loads its files after it starts."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        status, body = http(url)
        if status == 200 and done(body):
            return body
        assert time.monotonic() < deadline, f"{url} never answered as wanted: {status} {body}"
        time.sleep(0.5)


def viewer_processes(job: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        if "viewer_serve.py" in line and f"/jobs/{job}/" in line:
            found.append(process)
    return found


def forward(server: Any, kind: str, job: str) -> tuple[subprocess.Popen[str], str]:
    """`paddlecloud KIND JOB --port 0` as alice, and the URL it prints."""
    process = subprocess.Popen(
        [sys.executable, "-m", "paddlecloud", "--datacenter", "as-alice", kind, job, "--port", "0"],
        env=clean_env(server.home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    line = process.stdout.readline()
    assert "http://127.0.0.1:" in line, (line, process.stderr.read() if process.poll() is not None else "")
    return process, line.split()[-4]


def start_platform(server_factory: Any, tmp_path: Path, **settings: Any) -> Any:
    """A server offering both viewers (with `settings` besides), and users alice and bob."""
    missing = [str(p) for p in PYTHONS.values() if not p.exists()]
    if missing:
        pytest.skip(f"the real viewers are not installed ({', '.join(missing)}): run `make viewers`")
    path = tmp_path / "paddlecloud.yaml"
    viewers = {"tensorboard": str(PYTHONS["tensorboard"]), "visualdl": str(PYTHONS["visualdl"]), **settings}
    path.write_text(json.dumps({"jobs": {"viewers": viewers}}))
    server = server_factory("--server-config", str(path))
    for user in ("alice", "bob"):
        server.cli("users", "create", user, "--password-stdin", stdin=f"{user}-password\n")
        server.add_datacenter(f"as-{user}", user, f"{user}-password")
    return server


@pytest.fixture
def platform(server_factory: Any, tmp_path: Path) -> Any:
    return start_platform(server_factory, tmp_path)


def submit(server: Any, tmp_path: Path, job: str) -> None:
    package = tmp_path / "package"
    package.mkdir(exist_ok=True)
    (package / "train.py").write_text("print('trained')\n")
    server.cli("--datacenter", "as-alice", "submit", "-f", "--name", job, str(package))


def write_logs(server: Any, tmp_path: Path, job: str) -> None:
    """Scalars written by the real writers (tb-run, vdl-run), copied into the job's output on PFS."""
    logs = tmp_path / "logs"
    tb_site = subprocess.run(
        [str(PYTHONS["tensorboard"]), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    subprocess.run([sys.executable, "-c", TORCH_WRITER, str(logs / "tb-run"), tb_site], check=True)
    subprocess.run([str(PYTHONS["visualdl"]), "-c", VISUALDL_WRITER, str(logs / "vdl-run")], check=True)
    output = f"/pfs/datacenter1/home/alice/jobs/{job}/output"
    server.cli(
        "--datacenter", "as-alice", "cp", "-r", str(logs / "tb-run"), str(logs / "vdl-run"), output + "/"
    )


def wait_until_gone(job: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while viewer_processes(job):
        assert time.monotonic() < deadline, "the viewer was never stopped"
        time.sleep(0.2)


def test_tensorboard_and_visualdl_serve_the_owners_scalars_and_refuse_everyone_else(
    platform: Any, tmp_path: Path
) -> None:
    server = platform
    alice = ("--datacenter", "as-alice")
    job = f"viewed-{os.getpid()}"
    submit(server, tmp_path, job)

    write_logs(server, tmp_path, job)

    # Unknown jobs, and another user's, are one line and a non-zero exit.
    unknown = server.cli(*alice, "tensorboard", "no-such-job", check=False)
    assert unknown.returncode == 1 and len(unknown.stderr.strip().splitlines()) == 1, unknown.stderr
    assert "no-such-job" in unknown.stderr and "Traceback" not in unknown.stderr

    tensorboard, url = forward(server, "tensorboard", job)
    try:
        scalars = poll(url + "data/plugin/scalars/scalars?run=tb-run&tag=loss", lambda body: len(body) == 5)
        assert [round(point[2], 6) for point in scalars] == LOSSES
        assert [point[1] for point in scalars] == [0, 1, 2, 3, 4]
        # The server itself runs as alice's uid, not root, in a network namespace of its own.
        [server_process] = [p for p in viewer_processes(job) if p.name().startswith("python")]
        assert server_process.uids().real != 0
        assert os.readlink(f"/proc/{server_process.pid}/ns/net") != os.readlink("/proc/self/ns/net")
        # Through the gateway: bob, and the administrator too, are refused the owner's files.
        gateway = f"{server.endpoint}/api/v1/jobs/{job}"
        base = f"{gateway}/tensorboard/data/plugin/scalars/scalars?run=tb-run&tag=loss"
        for user, token in (("bob", token_of(server, "bob")), ("admin", server_token(server))):
            status, problem = http(base + "&user=alice", token)
            assert status == 403, (user, status, problem)
            assert problem["status"] == 403 and "owner" in problem["detail"]
        status, problem = http(base, token_of(server, "bob"))
        assert status == 404, (status, problem)  # bob has no such job
        status, owner_view = http(base, token_of(server, "alice"))
        assert status == 200 and len(owner_view) == 5
    finally:
        tensorboard.terminate()
        tensorboard.wait(timeout=30)

    visualdl, url = forward(server, "visualdl", job)
    try:
        tags = poll(url + "api/scalar/tags", lambda body: body.get("data", {}).get("runs"))["data"]
        [run] = [r for r in tags["runs"] if r.endswith("vdl-run")]
        listed = poll(url + f"api/scalar/list?run={run}&tag=loss", lambda body: body.get("data"))["data"]
        assert [round(point[2], 6) for point in listed] == LOSSES
        tags_url = f"{server.endpoint}/api/v1/jobs/{job}/visualdl/api/scalar/tags?user=alice"
        status, problem = http(tags_url, token_of(server, "bob"))
        assert status == 403, problem
    finally:
        visualdl.terminate()
        visualdl.wait(timeout=30)

    # Both still run (idle for less than jobs.viewers.idle_seconds): bwrap, its init and the server each.
    running = viewer_processes(job)
    kinds = {kind for p in running for kind in PYTHONS if kind in (p.info["cmdline"] or [])}
    assert kinds == set(PYTHONS), [p.info["cmdline"] for p in running]
    # Removing the job stops its viewers at once.
    server.cli(*alice, "kill", "-rm", job)
    assert not viewer_processes(job)

    # A viewer running when the server stops goes with it.
    submit(server, tmp_path, job)
    assert (
        http(f"{server.endpoint}/api/v1/jobs/{job}/tensorboard/data/runs", token_of(server, "alice"))[0]
        == 200
    )
    running = viewer_processes(job)
    assert running
    server.stop()
    _, alive = psutil.wait_procs(running, timeout=30)
    assert not alive, f"viewers outlived the server: {[p.pid for p in alive]}"
    assert not viewer_processes(job)


def server_token(server: Any) -> str:
    request = urllib.request.Request(  # noqa: S310 - loopback
        server.endpoint + "/api/v1/auth/token",
        data=json.dumps({"username": "admin", "password": server.admin_password}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
        return str(json.loads(answer.read())["token"])


def test_an_idle_viewer_is_stopped_and_started_again_on_request_and_one_not_offered_is_refused(
    server_factory: Any, tmp_path: Path
) -> None:
    server = start_platform(server_factory, tmp_path, idle_seconds=1, visualdl=None)
    job = f"idle-{os.getpid()}"
    submit(server, tmp_path, job)
    # A viewer the operator did not set up is one line naming the setting, and exit 1.
    refused = server.cli("--datacenter", "as-alice", "visualdl", job, check=False)
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "jobs.viewers.visualdl" in refused.stderr and "Traceback" not in refused.stderr
    url = f"{server.endpoint}/api/v1/jobs/{job}/tensorboard/data/runs"
    alice = token_of(server, "alice")
    assert http(url, alice) == (200, [])
    assert viewer_processes(job)
    wait_until_gone(job)  # nobody asked for a second
    assert http(url, alice) == (200, [])  # started again
    assert viewer_processes(job)


def test_the_viewers_pages_run_in_a_browser_on_the_forward_and_never_on_the_gateways_origin(
    platform: Any, tmp_path: Path, context: Any
) -> None:
    server = platform
    job = f"browsed-{os.getpid()}"
    submit(server, tmp_path, job)
    write_logs(server, tmp_path, job)
    alice = token_of(server, "alice")

    # On the gateway's origin, where the session cookie is, the viewer's page is inert,
    # whatever policy of its own the viewer sent (TensorBoard sends one).
    for kind in PYTHONS:
        request = urllib.request.Request(  # noqa: S310 - loopback
            f"{server.endpoint}/api/v1/jobs/{job}/{kind}/", headers={"Authorization": f"Bearer {alice}"}
        )
        with urllib.request.urlopen(request, timeout=120) as answer:  # noqa: S310
            assert answer.status == 200
            assert answer.headers.get_all("Content-Security-Policy") == [
                "default-src 'none'; frame-ancestors 'none'; sandbox"
            ], kind

    # On the forward's own loopback origin the real pages run and draw the job's tags, once
    # the viewer has read them (each loads its log directory in the background).
    # VisualDL's index opens the first of its component tabs, which its server lists from a
    # set (an order that changes with each process's hash seed: sometimes the graph tab), so
    # the page asked for is its scalars page; TensorBoard's index is its scalars.
    loaded = {
        "tensorboard": ("data/plugin/scalars/tags", lambda body: "loss" in body.get("tb-run", {}), ""),
        "visualdl": ("api/scalar/tags", lambda body: body.get("data", {}).get("runs"), "scalar"),
    }
    for kind in PYTHONS:
        process, url = forward(server, kind, job)
        try:
            data, done, scalars = loaded[kind]
            poll(url + data, done)
            page = context.new_page()
            page.goto(url + scalars)
            try:
                page.get_by_text("loss", exact=True).first.wait_for(
                    state="visible", timeout=WAIT_SECONDS * 1000
                )
            except Exception as exc:
                raise AssertionError(
                    f"{kind}'s page never showed loss: {page.inner_text('body')[:500]!r}"
                ) from exc
            page.close()
        finally:
            process.terminate()
            process.wait(timeout=30)
