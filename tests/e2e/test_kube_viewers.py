"""A job's TensorBoard and VisualDL on the kubernetes backend (docs/metrics.md §4.5), on the
real control plane with the chart's rights (kube_backend_support.py): the viewer's pod,
Service and NetworkPolicy made in the owner's namespace by the real API server, a pod
that is not Ready answered with the reason Kubernetes gave, and the objects gone when
idle and with `kill -rm`.

The simulated kubelet has no container runtime: it marks the viewer's pod Running and
Ready at 127.0.0.1 but runs nothing there, so nothing serves what the service relays.
What a real TensorBoard and VisualDL serve is tested on one machine (test_viewers.py),
with the same launcher the pod runs; the pod's own command line, its `--port` mode, is
run here with the real TensorBoard, outside any pod."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kube_backend_support as kb
import pytest
from kube_backend_support import KubeBackend, wait
from test_jobs_cli import ok, run_cli
from test_viewers import LOSSES, PYTHONS, TORCH_WRITER, token_of

import kube_real
from kube_real.fixtures import RealKube
from paddlecloud.common.config import DatacenterVolume, KubernetesSection
from paddlecloud.jobs.kube import manifests
from paddlecloud.jobs.kube.names import LABEL_JOB_ID, LABEL_VIEWER_OF

pytestmark = pytest.mark.slow

IMAGE = "paddlecloud-viewers:test"


@pytest.fixture
def backend(real_kube: RealKube, server_factory: Any, tmp_path: Path) -> Iterator[KubeBackend]:
    viewers = {"image": IMAGE, "idle_seconds": 3, "start_timeout_seconds": 3}
    with kb.kube_backend(real_kube, server_factory, tmp_path, jobs={"viewers": viewers}) as started:
        yield started


def http(url: str, token: str) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310 - loopback
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def viewer_objects(k: KubeBackend, job: str) -> list[str]:
    viewers = ("-tensorboard", "-visualdl")
    return sorted(o for o in k.objects_of(job, "alice") if o.split("/")[1].endswith(viewers))


def test_a_jobs_viewer_is_a_pod_in_its_owners_namespace_gone_when_idle_and_with_the_job(
    backend: KubeBackend,
) -> None:
    k, admin, server = backend, backend.kube.cluster.admin, backend.server
    for user in ("alice", "bob"):
        server.cli("users", "create", user, "--password-stdin", stdin=f"{user}-password\n")
        server.add_datacenter(f"as-{user}", user, f"{user}-password")
    alice, bob = token_of(server, "alice"), token_of(server, "bob")
    ok(run_cli(server, "--datacenter", "as-alice", "submit", "--name", "seen", str(k.package())))
    done = k.wait_for_state("seen", ("SUCCEEDED", "FAILED"), "--datacenter", "as-alice")
    assert done["state"] == "SUCCEEDED", done
    # A finished job's objects go; its viewer is wanted most then.
    wait(lambda: not k.objects_of("seen", "alice"), "the job's objects to be deleted")
    namespace = k.namespace("alice")
    url = f"{server.endpoint}/api/v1/jobs/seen"

    # An image that cannot be pulled: a 504 in the words the kubelet gave, and nothing left.
    pull_fails = kube_real.PodScript(image_pull_error=True)
    with k.kube.scripted(lambda pod: pull_fails):
        status, problem = http(f"{url}/tensorboard/", alice)
    assert status == 504, problem
    assert "ERR_VIEWER_NOT_READY" in json.dumps(problem), problem
    assert "ImagePullBackOff" in problem["detail"] or "ErrImagePull" in problem["detail"], problem
    assert "jobs.viewers.start_timeout_seconds" in problem["detail"], problem
    wait(lambda: not viewer_objects(k, "seen"), "the refused viewer's objects to be deleted")

    # Ready: the service relays to the pod's address, where (no container runtime)
    # nothing listens: a 502 that says so. Its objects are in alice's namespace.
    status, problem = http(f"{url}/tensorboard/", alice)
    assert status == 502 and "did not answer" in problem["detail"], problem
    assert viewer_objects(k, "seen") == [
        f"{plural}/seen-tensorboard" for plural in ("configmaps", "networkpolicies", "pods", "services")
    ]
    pod = admin.get(f"/api/v1/namespaces/{namespace}/pods/seen-tensorboard")
    spec = pod["spec"]
    # Tied to the job by its id, but not as its worker (the job's policy selects those).
    assert pod["metadata"]["labels"][LABEL_VIEWER_OF] and LABEL_JOB_ID not in pod["metadata"]["labels"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    [container] = spec["containers"]
    assert container["image"] == IMAGE
    port, kind, logdir, prefix = container["command"][-4:]
    assert (port, kind, prefix) == ("6006", "tensorboard", "/api/v1/jobs/seen/tensorboard")
    assert logdir.startswith(f"/pfs/{kb.DC}/home/alice/"), logdir  # the job's output
    [home] = [m for m in container["volumeMounts"] if m["mountPath"] == f"/pfs/{kb.DC}/home/alice"]
    assert home["readOnly"] is True and home["subPath"] == "home/alice"
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    # Another user: refused the owner's viewer (403), and has no job of that name (404).
    status, problem = http(f"{url}/tensorboard/?user=alice", bob)
    assert status == 403, problem
    status, problem = http(f"{url}/tensorboard/", bob)
    assert status == 404, problem
    assert viewer_objects(k, "seen")  # bob's requests started nothing and stopped nothing

    # Idle for jobs.viewers.idle_seconds: deleted.
    wait(lambda: not viewer_objects(k, "seen"), "the idle viewer's objects to be deleted", timeout=60)

    # Asked for again, then the job removed: its viewer goes with it, before kill answers.
    status, problem = http(f"{url}/visualdl/", alice)
    assert status == 502, problem
    assert viewer_objects(k, "seen")[0] == "configmaps/seen-visualdl"
    ok(run_cli(server, "--datacenter", "as-alice", "kill", "-rm", "seen"))
    assert admin.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/seen-visualdl").status == 404
    wait(lambda: not viewer_objects(k, "seen"), "the removed job's viewer to be deleted")


def test_the_viewer_pods_command_serves_the_real_tensorboard_on_its_port(tmp_path: Path) -> None:
    """The pod's command line as manifests.viewer_objects writes it, run with the real
    TensorBoard's Python and the launcher where the ConfigMap would put it, on a free port
    rather than 6006: the scalars a real writer wrote come back under the prefix."""
    python = PYTHONS["tensorboard"]
    if not python.exists():
        pytest.skip(f"the real TensorBoard is not installed ({python}): run `make viewers`")
    logs = tmp_path / "output"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    subprocess.run([sys.executable, "-c", TORCH_WRITER, str(logs / "tb-run"), site], check=True)
    settings = KubernetesSection(datacenters={kb.DC: DatacenterVolume(kind="hostpath", host_path="/srv/pfs")})
    plan = manifests.ViewerPlan(
        job_name="j1", job_id="id1", owner="alice", datacenter=kb.DC, kind="tensorboard",
        output=str(logs), prefix="/api/v1/jobs/j1/tensorboard", image=IMAGE, settings=settings,
        namespace="paddle-alice",
    )  # fmt: skip
    [command] = [
        o["spec"]["containers"][0]["command"] for o in manifests.viewer_objects(plan) if o["kind"] == "Pod"
    ]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    launcher = f"{manifests.VIEWER_DIR}/{manifests.VIEWER_SERVE_KEY}"
    argv = [str(manifests.VIEWER_SERVE) if word == launcher else word for word in command]
    argv[0], argv[argv.index("--port") + 1] = str(python), str(port)
    server = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        url = f"http://127.0.0.1:{port}{plan.prefix}/data/plugin/scalars/scalars?run=tb-run&tag=loss"

        def scalars() -> Any:
            assert server.poll() is None, "the launcher ended"
            try:
                with urllib.request.urlopen(url, timeout=30) as answer:
                    body = json.loads(answer.read())
            except (urllib.error.URLError, ConnectionError):
                return None  # not listening yet: it loads TensorBoard first
            return body if len(body) == len(LOSSES) else None

        points = wait(scalars, "the launcher's TensorBoard to serve the scalars", timeout=120)
        assert [round(point[2], 6) for point in points] == LOSSES
    finally:
        server.terminate()
        server.wait(timeout=30)
