"""The kubernetes jobs backend end to end: `paddlecloud server` with `jobs.backend:
kubernetes`, the real CLI, and a stateful fake Kubernetes API server with controllers and
a fake kubelet (tests/kube_fake) on loopback.

Every test's server checks, when it stops, that each request the backend made is in the
least-privilege list the code declares (services/jobs/kube/rbac.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_jobs_cli import as_json, make_package, ok, run_cli, wait_for_state

from kube_fake import FakeKube, PodScript
from paddlecloud.jobs.kube import rbac
from paddlecloud.jobs.kube.names import LABEL_JOB, LABEL_ROLE, namespace_for

pytestmark = pytest.mark.slow

NS = namespace_for("admin", "paddle-")
DC = "datacenter1"


def role_of(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["labels"].get(LABEL_ROLE))


def script(**by_role: Callable[[dict[str, Any]], PodScript]) -> Callable[[dict[str, Any]], PodScript]:
    """A kubelet script by role (pserver, trainer); parameter servers serve until deleted."""

    def decide(pod: dict[str, Any]) -> PodScript:
        role = role_of(pod)
        if role in by_role:
            return by_role[role](pod)
        return PodScript(run_seconds=None) if role == "pserver" else PodScript(lines=[f"{role} done"])

    return decide


def index_of(pod: dict[str, Any]) -> int:
    labels = pod["metadata"]["labels"]
    return int(
        labels.get("batch.kubernetes.io/job-completion-index", labels.get("apps.kubernetes.io/pod-index", -1))
    )


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    with FakeKube() as fake:
        yield fake


def kube_config(tmp_path: Path, kube: FakeKube, **overrides: Any) -> Path:
    settings: dict[str, Any] = {
        "kubeconfig": str(kube.write_kubeconfig(tmp_path / "kubeconfig")),
        "datacenters": {DC: {"kind": "pvc", "claim_name": "pfs"}},
        "watch_timeout_seconds": 5,
        "max_backoff_seconds": 1,
        "quota_sync_seconds": 0.5,
        "image_pull_timeout_seconds": 3,
        **overrides,
    }
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump({"jobs": {"backend": "kubernetes", "kubernetes": settings}}))
    return path


@pytest.fixture
def server(server_factory: Any, kube: FakeKube, tmp_path: Path) -> Iterator[Any]:
    started = server_factory("--server-config", str(kube_config(tmp_path, kube)))
    yield started
    refused = [
        r
        for r in kube.requests
        if not rbac.allowed(r.verb, r.group, r.resource, r.namespace is not None, "per-user")
    ]
    assert not refused, f"requests outside the declared rights: {refused}"


def submit(server: Any, tmp_path: Path, name: str, *flags: str) -> dict[str, Any]:
    package = tmp_path / f"pkg-{name}"
    if not package.exists():
        make_package(package)
    ok(run_cli(server, "submit", "--name", name, *flags, str(package)))
    return as_json(run_cli(server, "-o", "json", "get", "job", name))


def wait(condition: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def objects_of(kube: FakeKube, job: str) -> list[str]:
    found = []
    for plural in ("configmaps", "statefulsets", "jobs", "services", "pods", "secrets", "networkpolicies"):
        for obj in kube.list(plural, NS, selector=f"{LABEL_JOB}={job}"):
            found.append(f"{plural}/{obj['metadata']['name']}")
    return found


def test_two_pservers_three_trainers_succeed_and_logs_outlive_the_pods(
    server: Any, kube: FakeKube, tmp_path: Path
) -> None:
    kube.script = script(
        trainer=lambda pod: PodScript(lines=[f"trainer {index_of(pod)} trained"], run_seconds=0.5)
    )
    submit(server, tmp_path, "dist", "--pservers", "2", "--trainers", "3")
    # While it runs: the namespace was made for the user, with its limits and policies (the
    # admin's quota is unlimited: no ResourceQuota; the two-user test below has them).
    namespace = kube.get("namespaces", None, NS)
    assert namespace is not None
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] in ("restricted", "baseline")
    assert (
        not kube.list("resourcequotas", NS)
        and kube.list("limitranges", NS)
        and kube.list("networkpolicies", NS)
    )

    done = wait_for_state(server, "dist", ("SUCCEEDED", "FAILED"))
    assert done["state"] == "SUCCEEDED", done
    assert done["reason"] == "every trainer exited 0"
    # The parameter servers, and every other object of the job, are gone.
    wait(lambda: not objects_of(kube, "dist"), "the job's objects to be deleted")

    lines = ok(run_cli(server, "logs", "dist")).splitlines()
    for i in range(3):
        assert f"[trainer-{i}] trainer {i} trained" in lines
    for i in range(2):
        assert any(line.startswith(f"[pserver-{i}] ") for line in lines), lines
    # The runtime contract reached the pods (the fake kubelet prints the environment; a
    # parameter server's log was kept while it ran, so it may end part-way).
    assert "[pserver-1] TRAINER_ID=1" in lines
    assert f"[pserver-1] POD_IP=dist-pserver-1.dist-pserver.{NS}.svc.cluster.local" in lines
    tail = ok(run_cli(server, "logs", "-n", "1", "--worker", "trainer-2", "dist")).splitlines()
    assert tail == ["[trainer-2] trainer 2 trained"]
    events = as_json(run_cli(server, "-o", "json", "get", "job", "dist"))
    assert events["state"] == "SUCCEEDED"
    # The servers were stopped by the platform, and say so (as on the local backend).
    workers = {w["name"]: w["state"] for w in events["workers"]}
    assert workers == {"pserver-0": "STOPPED", "pserver-1": "STOPPED"} | {
        f"trainer-{i}": "SUCCEEDED" for i in range(3)
    }
    stopped = sorted(e["message"] for e in events["events"] if e["reason"] == "WorkerStopped")
    assert stopped == [f"pserver-{i} stopped by the platform: every trainer exited 0" for i in range(2)]


def test_an_oom_killed_trainer_past_its_restarts_fails_the_job_in_words(
    server: Any, kube: FakeKube, tmp_path: Path
) -> None:
    def trainer(pod: dict[str, Any]) -> PodScript:
        if index_of(pod) == 1:
            return PodScript(lines=["allocating"], exit_code=137, reason="OOMKilled", run_seconds=0.1)
        return PodScript(lines=["fine"], run_seconds=0.1)

    kube.script = script(trainer=trainer)
    submit(server, tmp_path, "oom", "--trainers", "2", "--memory", "2Gi", "--max-restarts", "1")
    job = wait_for_state(server, "oom", ("SUCCEEDED", "FAILED"))
    assert job["state"] == "FAILED"
    assert job["reason"].startswith("trainer-1 exited with 137 (OOMKilled: it used more than its 2Gi"), job
    assert "raise -memory" in job["reason"] and job["reason"].endswith("after 1 restart")
    # Both attempts' logs are kept.
    lines = ok(run_cli(server, "logs", "--worker", "trainer-1", "oom")).splitlines()
    assert lines == ["[trainer-1] allocating", "[trainer-1] allocating"]


def test_an_unschedulable_job_waits_with_the_schedulers_message_and_kill_leaves_nothing(
    server: Any, kube: FakeKube, tmp_path: Path
) -> None:
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    kube.script = lambda pod: PodScript(unschedulable=message)
    submit(server, tmp_path, "big", "--trainers", "2")
    job = wait(
        lambda: (
            (j := as_json(run_cli(server, "-o", "json", "get", "job", "big")))["reason"] != "submitted" and j
        ),
        "a reason",
    )
    job = wait(
        lambda: message in (j := as_json(run_cli(server, "-o", "json", "get", "job", "big")))["reason"] and j,
        "the scheduler's message",
    )
    assert job["state"] == "PENDING" and "cannot be scheduled" in job["reason"]
    workers = as_json(run_cli(server, "-o", "json", "get", "workers", "big"))
    assert {w["state"] for w in workers["workers"]} == {"PENDING"}

    out = ok(run_cli(server, "kill", "big"))
    assert "big" in out
    ended = as_json(run_cli(server, "-o", "json", "get", "job", "big"))
    assert ended["state"] == "KILLED"
    assert re.fullmatch(r"killed by admin at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", ended["reason"]), ended
    wait(lambda: not objects_of(kube, "big"), "no objects left")


def test_a_jobs_service_killed_mid_job_records_the_right_end(
    server: Any, kube: FakeKube, tmp_path: Path
) -> None:
    kube.script = script(trainer=lambda pod: PodScript(lines=["working"], run_seconds=4))
    submit(server, tmp_path, "survivor", "--pservers", "1", "--trainers", "2")
    wait_for_state(server, "survivor", ("RUNNING",))
    workers = {
        w["name"]: w for w in as_json(run_cli(server, "-o", "json", "get", "workers", "survivor"))["workers"]
    }
    assert set(workers) == {"pserver-0", "trainer-0", "trainer-1"}
    for name, worker in workers.items():
        assert worker["role"] == name.split("-")[0].upper() and worker["index"] == int(name[-1])
        assert worker["state"] == "RUNNING" and worker["host"].startswith("node-") and worker["started_at"]
    jobs = server.services()["jobs"]
    jobs.send_signal(signal.SIGKILL)
    jobs.wait(timeout=10)
    done = wait_for_state(server, "survivor", ("SUCCEEDED", "FAILED"), timeout=90)
    assert done["state"] == "SUCCEEDED", done
    wait(lambda: not objects_of(kube, "survivor"), "no objects left")
    assert "[trainer-1] working" in ok(run_cli(server, "logs", "survivor")).splitlines()


def test_two_users_land_in_two_namespaces_with_their_quotas(
    server: Any, kube: FakeKube, tmp_path: Path
) -> None:
    for user, cpu in (("alice", "8"), ("bob", "4")):
        server.cli("users", "create", user, "--password-stdin", stdin=f"{user}-password\n")
        server.cli("users", "quota", user, "-cpu", cpu, "-memory", "16Gi", "-jobs", "3")
        server.add_datacenter(f"as-{user}", user, f"{user}-password")
    kube.script = script(trainer=lambda pod: PodScript(lines=["mine"], run_seconds=0.2))
    package = tmp_path / "pkg"
    make_package(package)
    for user in ("alice", "bob"):
        ok(run_cli(server, "--datacenter", f"as-{user}", "submit", "--name", "same-name", str(package)))
    alice, bob = namespace_for("alice", "paddle-"), namespace_for("bob", "paddle-")
    assert (alice, bob) == ("paddle-alice", "paddle-bob")
    for namespace, cpu in ((alice, "8"), (bob, "4")):
        [quota] = kube.list("resourcequotas", namespace)
        assert quota["spec"]["hard"]["requests.cpu"] in (cpu, f"{int(cpu) * 1000}m"), quota["spec"]
        assert wait(lambda ns=namespace: kube.list("jobs", ns) or not kube.list("configmaps", ns), "a job")
    for user in ("alice", "bob"):
        as_user = ("--datacenter", f"as-{user}")
        done = wait(
            lambda a=as_user: (
                (j := as_json(run_cli(server, *a, "-o", "json", "get", "job", "same-name")))["state"]
                in ("SUCCEEDED", "FAILED")
                and j
            ),
            f"{user}'s job to end",
        )
        assert done["state"] == "SUCCEEDED", done
    # An admin's change reaches the namespace's ResourceQuota.
    server.cli("users", "quota", "alice", "-cpu", "2")
    wait(
        lambda: kube.list("resourcequotas", alice)[0]["spec"]["hard"]["requests.cpu"] in ("2", "2000m"),
        "the new quota in alice's namespace",
    )
    # A deleted user's namespace goes, with everything in it.
    server.cli("users", "delete", "bob")
    wait(lambda: kube.get("namespaces", None, bob) is None, "bob's namespace to be deleted")
    assert kube.get("namespaces", None, alice) is not None


def test_dry_run_prints_every_object_as_yaml_and_nothing_is_created(
    server: Any, kube: FakeKube, tmp_path: Path
) -> None:
    server.cli(
        "registry",
        "-username",
        "u",
        "-password",
        "s3cret-pw",
        "-server",
        "registry.example.com",
        "-name",
        "myreg",
    )
    package = tmp_path / "pkg"
    make_package(package)
    out = ok(
        run_cli(
            server,
            "-o",
            "yaml",
            "submit",
            "--dry-run",
            "--name",
            "preview",
            "--pservers",
            "2",
            "-registry",
            "myreg",
            str(package),
        )
    )
    documents = [d for d in yaml.safe_load_all(out) if d]
    kinds = [d["kind"] for d in documents]
    for kind in ("Namespace", "LimitRange", "ConfigMap", "StatefulSet", "Service", "Job", "Secret"):
        assert kind in kinds, kinds
    assert "s3cret-pw" not in out
    job = next(d for d in documents if d["kind"] == "Job")
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "preview-registry"}]
    assert not kube.list("configmaps", NS) and kube.get("namespaces", None, NS) is None
    as_json_out = json.loads(
        ok(run_cli(server, "-o", "json", "submit", "--dry-run", "--name", "p2", str(package)))
    )
    assert {o["kind"] for o in as_json_out["objects"]} >= {"ConfigMap", "Job"}


def test_submit_follow_streams_live_logs_then_kept_ones_to_the_end(
    server: Any, kube: FakeKube, tmp_path: Path
) -> None:
    kube.script = script(trainer=lambda pod: PodScript(lines=[f"step {i}" for i in range(5)], run_seconds=2))
    package = tmp_path / "pkg"
    make_package(package)
    out = ok(run_cli(server, "submit", "-f", "--name", "followed", "--trainers", "2", str(package)))
    lines = out.splitlines()
    for trainer in (0, 1):
        assert [line for line in lines if line.startswith(f"[trainer-{trainer}]")] == [
            f"[trainer-{trainer}] step {i}" for i in range(5)
        ]
    assert "Job followed SUCCEEDED" in out


def test_image_pull_failures_and_evictions_are_said_in_words(
    server: Any, kube: FakeKube, tmp_path: Path
) -> None:
    kube.script = lambda pod: PodScript(image_pull_error=True)
    submit(server, tmp_path, "noimage", "--image", "registry.example.com/missing:1")
    job = wait(
        lambda: (
            "cannot pull image"
            in (j := as_json(run_cli(server, "-o", "json", "get", "job", "noimage")))["reason"]
            and j
        ),
        "the image pull failure",
    )
    assert job["state"] == "PENDING" and "registry.example.com/missing:1" in job["reason"]
    # Past jobs.kubernetes.image_pull_timeout_seconds (3 s here) it fails, saying so.
    job = wait_for_state(server, "noimage", ("FAILED",))
    assert job["reason"].startswith("cannot pull image registry.example.com/missing:1: ") and job[
        "reason"
    ].endswith("(for more than 3 s)"), job
    ok(run_cli(server, "kill", "-rm", "noimage"))

    kube.script = lambda pod: PodScript(evict=True)
    submit(server, tmp_path, "evicted")
    job = wait_for_state(server, "evicted", ("FAILED", "SUCCEEDED"))
    assert job["state"] == "FAILED" and job["reason"].startswith("its pods were evicted 4 times"), job


def test_kill_rm_removes_the_history_the_kept_logs_and_every_object(
    server: Any, kube: FakeKube, tmp_path: Path
) -> None:
    kube.script = script(trainer=lambda pod: PodScript(lines=["short"], run_seconds=0.2))
    submit(server, tmp_path, "gone", "--pservers", "1")
    wait_for_state(server, "gone", ("SUCCEEDED",))
    assert ok(run_cli(server, "logs", "gone")).splitlines()
    ok(run_cli(server, "kill", "-rm", "gone"))
    assert run_cli(server, "get", "job", "gone").returncode != 0
    assert not objects_of(kube, "gone")
    # The name is free again, and the new job shows none of the old one's logs.
    kube.script = script(trainer=lambda pod: PodScript(lines=["second life"], run_seconds=0.2))
    submit(server, tmp_path, "gone")
    wait_for_state(server, "gone", ("SUCCEEDED",))
    assert ok(run_cli(server, "logs", "--role", "trainer", "gone")).splitlines() == [
        "[trainer-0] second life"
    ]


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"kubeconfig": "/nonexistent/kubeconfig"}, "no kubeconfig file at /nonexistent/kubeconfig"),
        ({"kubeconfig": "BAD"}, "jobs.kubernetes.kubeconfig: cannot use"),
        ({"datacenters": {}}, "jobs.kubernetes.datacenters has no volume for datacenter 'datacenter1'"),
        ({"datacenters": {DC: {"kind": "cephfs"}}}, "a cephfs volume needs monitors and secret_name"),
        ({"namespace_mode": "per-team"}, "jobs.kubernetes.namespace_mode"),
    ],
)
def test_bad_kubernetes_settings_stop_the_server_with_one_clear_line(
    tmp_path: Path, kube: FakeKube, settings: dict[str, Any], expected: str
) -> None:
    if settings.get("kubeconfig") == "BAD":
        (tmp_path / "bad").write_text("clusters: [\n")
        settings = {"kubeconfig": str(tmp_path / "bad")}
    path = kube_config(tmp_path, kube, **settings)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "paddlecloud",
            "server",
            "--data-dir",
            str(tmp_path / "data"),
            "--port",
            "0",
            "--server-config",
            str(path),
        ],
        env={k: v for k, v in os.environ.items() if not k.startswith("PADDLE")} | {"HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
