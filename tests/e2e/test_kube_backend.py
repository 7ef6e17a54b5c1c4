"""The kubernetes jobs backend end to end: `paddlecloud server` with `jobs.backend:
kubernetes` and the real CLI against the real control plane (tests/kube_real: the API
server with RBAC and admission, the Job, StatefulSet, namespace, quota and garbage
collector controllers, the scheduler, a simulated kubelet for node sim-0), the jobs
service authenticating with the token of the ServiceAccount the Helm chart renders, with
exactly the chart's RBAC (kube_backend_support.py): a request outside the chart's rights
is refused by the real API server, and the job that made it says so.

The API server's faults are in test_kube_faults.py (through a fault-injecting proxy), the
refusals that reach a job in test_kube_refusals.py and the Kaniko build in
test_kube_kaniko.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kube_backend_support as kb
import pytest
import yaml
from kube_backend_support import KubeBackend, wait
from test_jobs_cli import as_json, ok, run_cli, wait_for_state

import kube_real
from kube_real.fixtures import RealKube
from paddlecloud.jobs.kube.names import LABEL_JOB

pytestmark = pytest.mark.slow

DC = "datacenter1"


@pytest.fixture
def backend(real_kube: RealKube, server_factory: Any, tmp_path: Path) -> Iterator[KubeBackend]:
    with kb.kube_backend(real_kube, server_factory, tmp_path) as started:
        yield started


def test_two_pservers_three_trainers_succeed_and_logs_outlive_the_pods(backend: KubeBackend) -> None:
    k, admin = backend, backend.kube.cluster.admin
    ns = k.namespace()
    # Parameter servers print the environment the kubelet gave them (the downward API's
    # index from the real StatefulSet controller's label, $(TRAINER_ID) expanded).
    pserver = kube_real.PodScript(print_env=True, run_forever=True)
    trainer = kb.script(
        pserver=lambda pod: pserver,
        trainer=lambda pod: kube_real.PodScript(
            lines=(f"trainer {kb.index_of(pod)} trained",), run_seconds=0.5
        ),
    )
    with k.kube.scripted(trainer):
        k.submit("dist", "--pservers", "2", "--trainers", "3")
        # While it runs: the namespace was made for the user, with its limits and policies
        # (the admin's quota is unlimited: no ResourceQuota; the two-user test has them).
        # A hostPath datacenter's pods are admitted only by PodSecurity `privileged`.
        namespace = admin.get(f"/api/v1/namespaces/{ns}")
        assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
        assert not admin.get(f"/api/v1/namespaces/{ns}/resourcequotas")["items"]
        assert admin.get(f"/api/v1/namespaces/{ns}/limitranges")["items"]
        assert admin.get(f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies")["items"]
        done = wait_for_state(k.server, "dist", ("SUCCEEDED", "FAILED"))
    assert done["state"] == "SUCCEEDED", done
    assert done["reason"] == "every trainer exited 0"
    # The parameter servers, and every other object of the job, are gone: deleted by the
    # backend and the real garbage collector.
    wait(lambda: not k.objects_of("dist"), "the job's objects to be deleted")

    lines = ok(run_cli(k.server, "logs", "dist")).splitlines()
    for i in range(3):
        assert f"[trainer-{i}] trainer {i} trained" in lines
    for i in range(2):
        assert any(line.startswith(f"[pserver-{i}] ") for line in lines), lines
    # The runtime contract reached the pods, as the kubelet resolves it.
    assert "[pserver-1] TRAINER_ID=1" in lines, lines
    assert f"[pserver-1] POD_IP=dist-pserver-1.dist-pserver.{ns}.svc.cluster.local" in lines
    tail = ok(run_cli(k.server, "logs", "-n", "1", "--worker", "trainer-2", "dist")).splitlines()
    assert tail == ["[trainer-2] trainer 2 trained"]
    events = k.job("dist")
    assert events["state"] == "SUCCEEDED"
    # The servers were stopped by the platform, and say so (as on the local backend).
    workers = {w["name"]: w["state"] for w in events["workers"]}
    assert workers == {"pserver-0": "STOPPED", "pserver-1": "STOPPED"} | {
        f"trainer-{i}": "SUCCEEDED" for i in range(3)
    }
    stopped = sorted(e["message"] for e in events["events"] if e["reason"] == "WorkerStopped")
    assert stopped == [f"pserver-{i} stopped by the platform: every trainer exited 0" for i in range(2)]


def test_an_oom_killed_trainer_past_its_restarts_fails_the_job_in_words(backend: KubeBackend) -> None:
    k = backend

    def trainer(pod: dict[str, Any]) -> kube_real.PodScript:
        if kb.index_of(pod) == 1:
            return kube_real.PodScript(lines=("allocating",), exit_code=137, reason="OOMKilled")
        return kube_real.PodScript(lines=("fine",))

    # One restart: the real Job controller recreates the failed index's pod after its 10 s
    # backoff, and fails the job (backoffLimitPerIndex) when that one is OOMKilled too.
    with k.kube.scripted(kb.script(trainer=trainer)):
        k.submit("oom", "--trainers", "2", "--memory", "2Gi", "--max-restarts", "1")
        job = wait_for_state(k.server, "oom", ("SUCCEEDED", "FAILED"), timeout=90)
    assert job["state"] == "FAILED"
    assert job["reason"].startswith("trainer-1 exited with 137 (OOMKilled: it used more than its 2Gi"), job
    assert "raise -memory" in job["reason"] and job["reason"].endswith("after 1 restart")
    # Both attempts' logs are kept, once the pods are gone.
    wait(lambda: not k.objects_of("oom"), "the job's objects to be deleted")
    lines = ok(run_cli(k.server, "logs", "--worker", "trainer-1", "oom")).splitlines()
    assert lines == ["[trainer-1] allocating", "[trainer-1] allocating"]


def test_an_unschedulable_job_waits_with_the_schedulers_message_and_kill_leaves_nothing(
    backend: KubeBackend,
) -> None:
    k, admin = backend, backend.kube.cluster.admin
    # Node sim-0 has 4 GPUs: no node fits a trainer that asks for 8.
    k.submit("big", "--trainers", "2", "--gpu", "8")
    pod = admin.wait_for(
        f"/api/v1/namespaces/{k.namespace()}/pods",
        lambda p: any(
            c["type"] == "PodScheduled" and c["status"] == "False" and c.get("message")
            for c in p.get("status", {}).get("conditions", ())
        ),
        query={"labelSelector": f"{LABEL_JOB}=big"},
    )
    [message] = [c["message"] for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert "Insufficient nvidia.com/gpu" in message, message  # the real scheduler's words
    job = wait(
        lambda: "cannot be scheduled" in (j := k.job("big"))["reason"] and j, "the scheduler's message"
    )
    assert job["state"] == "PENDING", job
    assert "0/1 nodes are available" in job["reason"] and "Insufficient nvidia.com/gpu" in job["reason"], job
    assert f"cannot be scheduled: {message} (pod " in job["reason"], (message, job)
    workers = as_json(run_cli(k.server, "-o", "json", "get", "workers", "big"))
    assert {w["state"] for w in workers["workers"]} == {"PENDING"}

    out = ok(run_cli(k.server, "kill", "big"))
    assert "big" in out
    ended = k.job("big")
    assert ended["state"] == "KILLED"
    assert re.fullmatch(r"killed by admin at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", ended["reason"]), ended
    wait(lambda: not k.objects_of("big"), "no objects left")


def test_a_jobs_service_killed_mid_job_records_the_right_end(backend: KubeBackend) -> None:
    k = backend
    release = threading.Event()
    trainer = kb.script(trainer=lambda pod: kube_real.PodScript(lines=("working",), until=release))
    try:
        with k.kube.scripted(trainer):
            k.submit("survivor", "--pservers", "1", "--trainers", "2")
            wait_for_state(k.server, "survivor", ("RUNNING",))
            workers = {
                w["name"]: w
                for w in as_json(run_cli(k.server, "-o", "json", "get", "workers", "survivor"))["workers"]
            }
        assert set(workers) == {"pserver-0", "trainer-0", "trainer-1"}
        for name, worker in workers.items():
            assert worker["role"] == name.split("-")[0].upper() and worker["index"] == int(name[-1])
            assert worker["state"] == "RUNNING" and worker["host"] == "sim-0" and worker["started_at"]
        jobs = k.server.services()["jobs"]
        jobs.send_signal(signal.SIGKILL)
        jobs.wait(timeout=10)
        # The trainers end while the jobs service restarts; the new one finds how they ended.
        release.set()
        done = wait_for_state(k.server, "survivor", ("SUCCEEDED", "FAILED"), timeout=90)
    finally:
        release.set()
    assert done["state"] == "SUCCEEDED", done
    wait(lambda: not k.objects_of("survivor"), "no objects left")
    assert "[trainer-1] working" in ok(run_cli(k.server, "logs", "survivor")).splitlines()


def test_two_users_land_in_two_namespaces_with_their_quotas(backend: KubeBackend) -> None:
    k, admin = backend, backend.kube.cluster.admin
    server = k.server
    for user, cpu in (("alice", "8"), ("bob", "4")):
        server.cli("users", "create", user, "--password-stdin", stdin=f"{user}-password\n")
        server.cli("users", "quota", user, "-cpu", cpu, "-memory", "16Gi", "-jobs", "3")
        server.add_datacenter(f"as-{user}", user, f"{user}-password")
    alice, bob = k.namespace("alice"), k.namespace("bob")
    assert (alice, bob) == (f"{k.prefix}alice", f"{k.prefix}bob")
    with k.kube.scripted(kb.script(trainer=lambda pod: kube_real.PodScript(lines=("mine",)))):
        for user in ("alice", "bob"):
            ok(
                run_cli(
                    server, "--datacenter", f"as-{user}", "submit", "--name", "same-name", str(k.package())
                )
            )
        for namespace, cpu in ((alice, "8"), (bob, "4")):
            [quota] = admin.get(f"/api/v1/namespaces/{namespace}/resourcequotas")["items"]
            assert quota["spec"]["hard"]["requests.cpu"] in (cpu, f"{int(cpu) * 1000}m"), quota["spec"]
        for user in ("alice", "bob"):
            done = k.wait_for_state("same-name", ("SUCCEEDED", "FAILED"), "--datacenter", f"as-{user}")
            assert done["state"] == "SUCCEEDED", done

    # The real API server enforces the namespace's quota: with bob's 4 cpu taken by a pod
    # PaddleCloud did not make (the service counts only its jobs, so it accepts the job),
    # the Job controller's pods are refused, and the job says so while it waits.
    squatter = {
        "metadata": {"name": "squatter"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1.36",
                    "resources": {
                        "requests": {"cpu": "4", "memory": "1Gi"},
                        "limits": {"cpu": "4", "memory": "1Gi"},
                    },
                }
            ]
        },
    }
    admin.create(f"/api/v1/namespaces/{bob}/pods", squatter)
    as_bob = ("--datacenter", "as-bob")
    ok(run_cli(server, *as_bob, "submit", "--name", "over", "--cpu", "1", str(k.package())))
    job = wait(
        lambda: "quota" in (j := k.job("over", *as_bob))["reason"] and j, "the quota's refusal", timeout=90
    )
    assert job["state"] == "PENDING", job
    assert job["reason"].startswith("the namespace's quota refuses its pods: "), job
    assert "exceeded quota: paddlecloud-quota" in job["reason"] and "requests.cpu=1" in job["reason"], job
    ok(run_cli(server, *as_bob, "kill", "over"))

    # An admin's change reaches the namespace's ResourceQuota.
    server.cli("users", "quota", "alice", "-cpu", "2")
    admin.wait_for(
        f"/api/v1/namespaces/{alice}/resourcequotas",
        lambda q: q["spec"]["hard"]["requests.cpu"] in ("2", "2000m"),
        name="paddlecloud-quota",
    )
    # A deleted user's namespace goes, with everything in it: the real namespace
    # controller holds it Terminating while it empties it (the squatter's graceful end).
    seen = admin.get("/api/v1/namespaces", query={"fieldSelector": f"metadata.name={bob}"})
    server.cli("users", "delete", "bob")
    phases = []
    for event in admin.watch(
        "/api/v1/namespaces",
        resource_version=seen["metadata"]["resourceVersion"],
        query={"fieldSelector": f"metadata.name={bob}"},
        timeout=60,
    ):
        phases.append("Gone" if event["type"] == "DELETED" else event["object"]["status"].get("phase"))
        if phases[-1] == "Gone":
            break
    assert phases[0] == "Terminating" and phases[-1] == "Gone", phases
    assert admin.request("GET", f"/api/v1/namespaces/{alice}").status == 200


def test_dry_run_prints_every_object_as_yaml_and_nothing_is_created(backend: KubeBackend) -> None:
    k, admin = backend, backend.kube.cluster.admin
    server = k.server
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
    flags = ("--name", "preview", "--pservers", "2", "-registry", "myreg", str(k.package()))
    out = ok(run_cli(server, "-o", "yaml", "submit", "--dry-run", *flags))
    documents = [d for d in yaml.safe_load_all(out) if d]
    kinds = [d["kind"] for d in documents]
    for kind in ("Namespace", "LimitRange", "ConfigMap", "StatefulSet", "Service", "Job", "Secret"):
        assert kind in kinds, kinds
    assert "s3cret-pw" not in out
    job = next(d for d in documents if d["kind"] == "Job")
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "preview-registry"}]
    # Nothing was created: not even the user's namespace.
    assert admin.request("GET", f"/api/v1/namespaces/{k.namespace()}").status == 404
    as_json_out = json.loads(
        ok(run_cli(server, "-o", "json", "submit", "--dry-run", "--name", "p2", str(k.package())))
    )
    assert {o["kind"] for o in as_json_out["objects"]} >= {"ConfigMap", "Job"}
    assert admin.request("GET", f"/api/v1/namespaces/{k.namespace()}").status == 404


def test_submit_follow_streams_live_logs_then_kept_ones_to_the_end(backend: KubeBackend) -> None:
    k = backend
    release = threading.Event()
    trainer = kube_real.PodScript(
        lines=tuple(f"step {i}" for i in range(3)), until=release, final_lines=("step 3", "step 4")
    )
    command = [sys.executable, "-m", "paddlecloud", "submit", "-f", "--name", "followed", "--trainers", "2"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLECLOUD_", "PADDLE_"))}
    try:
        with k.kube.scripted(kb.script(trainer=lambda pod: trainer)):
            follower = subprocess.Popen(
                [*command, str(k.package())],
                env=env | {"HOME": str(k.server.home)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            lines = kb.lines_of(follower)
            out: list[str] = []
            # Live: both trainers' first lines arrive while their pods still run.
            while not all(f"[trainer-{t}] step 2" in out for t in (0, 1)):
                line = lines.get(timeout=60)
                assert line is not None, (out, follower.stderr.read() if follower.stderr else "")
                out.append(line)
            assert k.job("followed")["state"] == "RUNNING"
            release.set()
            # Then to the end: the lines printed as they exit, once each, and the verdict.
            while (line := lines.get(timeout=60)) is not None:
                out.append(line)
            assert follower.wait(timeout=30) == 0, out
    finally:
        release.set()
    for t in (0, 1):
        assert [line for line in out if line.startswith(f"[trainer-{t}]")] == [
            f"[trainer-{t}] step {i}" for i in range(5)
        ], out
    assert "Job followed SUCCEEDED" in "\n".join(out)


def test_image_pull_failures_and_evictions_are_said_in_words(
    real_kube: RealKube, server_factory: Any, tmp_path: Path
) -> None:
    # A pull timeout long enough for the CLI to see the job wait first on these loaded
    # machines (10 s was not, on a slow one: the job had failed before the first look); one
    # eviction allowed, as each replacement waits out the real Job
    # controller's backoff (10 s, then 20 s, ...).
    settings = {"image_pull_timeout_seconds": 30, "max_evictions": 1}
    with kb.kube_backend(real_kube, server_factory, tmp_path, **settings) as k:
        with k.kube.scripted(lambda pod: kube_real.PodScript(image_pull_error=True)):
            k.submit("noimage", "--image", "registry.example.com/missing:1")
            job = wait(
                lambda: "cannot pull image" in (j := k.job("noimage"))["reason"] and j, "the pull failure"
            )
            assert job["state"] == "PENDING" and "registry.example.com/missing:1" in job["reason"], job
            # Past jobs.kubernetes.image_pull_timeout_seconds it fails, saying so.
            job = wait_for_state(k.server, "noimage", ("FAILED",))
        assert job["reason"].startswith("cannot pull image registry.example.com/missing:1: ") and job[
            "reason"
        ].endswith("(for more than 30 s)"), job
        ok(run_cli(k.server, "kill", "-rm", "noimage"))

        # The real Job controller replaces an evicted trainer without counting it a failure
        # (podFailurePolicy Ignore on DisruptionTarget); the backend bounds evictions itself.
        with k.kube.scripted(lambda pod: kube_real.PodScript(evict=True)):
            k.submit("evicted")
            job = wait_for_state(k.server, "evicted", ("FAILED", "SUCCEEDED"), timeout=90)
        assert job["state"] == "FAILED" and job["reason"] == "its pods were evicted 2 times (more than 1)", (
            job
        )


def test_kill_rm_removes_the_history_the_kept_logs_and_every_object(backend: KubeBackend) -> None:
    k = backend
    with k.kube.scripted(kb.script(trainer=lambda pod: kube_real.PodScript(lines=("short",)))):
        k.submit("gone", "--pservers", "1")
        wait_for_state(k.server, "gone", ("SUCCEEDED",))
    assert ok(run_cli(k.server, "logs", "gone")).splitlines()
    ok(run_cli(k.server, "kill", "-rm", "gone"))
    assert run_cli(k.server, "get", "job", "gone").returncode != 0
    wait(lambda: not k.objects_of("gone"), "no objects left")
    # The name is free again, and the new job shows none of the old one's logs.
    with k.kube.scripted(kb.script(trainer=lambda pod: kube_real.PodScript(lines=("second life",)))):
        k.submit("gone")
        wait_for_state(k.server, "gone", ("SUCCEEDED",))
    assert ok(run_cli(k.server, "logs", "--role", "trainer", "gone")).splitlines() == [
        "[trainer-0] second life"
    ]


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"kubeconfig": "/nonexistent/kubeconfig"}, "no kubeconfig file at /nonexistent/kubeconfig"),
        ({"kubeconfig": "BAD"}, "jobs.kubernetes.kubeconfig: cannot use"),
        ({"datacenters": {}}, "jobs.kubernetes.datacenters has no volume for datacenter 'datacenter1'"),
        (
            {"datacenters": {DC: {"kind": "cephfs"}}},
            "a cephfs volume needs cluster_id and fs_name and node_stage_secret",
        ),
        # The in-tree volume of old (gone from the kubelet since Kubernetes 1.31): refused
        # at start, naming the CSI way.
        (
            {"datacenters": {DC: {"kind": "cephfs", "monitors": ["m:6789"], "secret_name": "k"}}},
            "kind cephfs now means the ceph-csi driver (cephfs.csi.ceph.com); the in-tree cephfs "
            "volume was removed in Kubernetes 1.31: give cluster_id, fs_name, root_path and "
            "node_stage_secret",
        ),
        ({"namespace_mode": "per-team"}, "jobs.kubernetes.namespace_mode"),
    ],
)
def test_bad_kubernetes_settings_stop_the_server_with_one_clear_line(
    tmp_path: Path, real_kube: RealKube, settings: dict[str, Any], expected: str
) -> None:
    if settings.get("kubeconfig") == "BAD":
        (tmp_path / "bad").write_text("clusters: [\n")
        settings = {"kubeconfig": str(tmp_path / "bad")}
    # Beside the one bad setting, a working kubeconfig of the real cluster: the server
    # stops before it asks the API server anything.
    good = kb.kube_settings(real_kube.cluster.admin_kubeconfig, "bad-")
    path = kb.write_server_config(tmp_path / "server.yaml", good | settings)
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


def test_resources_say_not_available_on_a_cluster_without_metrics_server(
    real_kube: RealKube, server_factory: Any, tmp_path: Path
) -> None:
    """The real API server serves no metrics.k8s.io (no metrics-server): with the chart's
    rights the list is authorised and answered 404, and the series says so in words."""
    with kb.kube_backend(real_kube, server_factory, tmp_path, jobs={"metrics": {"interval": 0.2}}) as k:
        running = kb.script(trainer=lambda pod: kube_real.PodScript(run_forever=True))
        with k.kube.scripted(running):
            k.submit("watched")
            k.wait_for_state("watched", ("RUNNING",))
            answer = wait(
                lambda: (
                    (a := as_json(run_cli(k.server, "-o", "json", "top", "job", "watched")))["available"]
                    is False
                    and a
                ),
                "the sampler's first look at the job's pods",
            )
            assert (
                answer["reason"]
                == "not available on this cluster (no metrics.k8s.io: install metrics-server)"
            )
            assert answer["workers"] == []
            table = ok(run_cli(k.server, "top", "job", "watched"))
            assert table.strip() == f"Resource use of watched is not available: {answer['reason']}"
            assert k.job("watched")["resources"] is None
            ok(run_cli(k.server, "kill", "-rm", "watched"))
