"""A job with a requirements.txt on the kubernetes backend, built by the kaniko builder:
`paddlecloud server` and the real CLI against the real control plane (tests/kube_real),
each service with its own ServiceAccount token and exactly the rights the Helm chart
renders for it (the jobs service's ClusterRole; the builder's Role in a builds namespace
labelled Pod Security `baseline`, `builder.kaniko.kubeconfig`), and a real registry
(Debian's docker-registry, tests/real_registry.py).

The simulated kubelet runs no container: the build pod's script plays Kaniko and pushes
the key's tag through the Registry API, as Kaniko's push does; the trainer's script prints
a line. A request outside either service's rights is a 403 that fails the build or the job.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from real_registry import PASSWORD, USER, has_tag, put_image, registry_missing, start_registry
from test_jobs_cli import as_json, make_package, ok, run_cli, wait_for_state

from kube_real import KubeClient, PodScript
from kube_real.builds import Builds, builds_namespace
from kube_real.chart import ChartRights, install_rights
from kube_real.fixtures import RealKube
from kube_real.kubelet import default_script
from paddlecloud.builder import kaniko_manifests
from paddlecloud.common.dockerconfig import Credentials, dockerconfigjson
from paddlecloud.jobs.kube.names import LABEL_ROLE, namespace_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(registry_missing() is not None, reason=str(registry_missing())),
]

Obj = dict[str, Any]
DC = "datacenter1"
REPO = "paddlecloud/runtime"


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    """A registry of the test's own holding the base image; its host:port."""
    where = tmp_path / "registry"
    where.mkdir()
    host, process = start_registry(where)
    try:
        put_image(host, "base/python", "3.11", "base")
        yield host
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def jobs_rights(real_kube: RealKube, tmp_path: Path) -> Iterator[ChartRights]:
    """The chart's jobs ServiceAccount and its ClusterRole, in a namespace of the test's own."""
    rights = install_rights(real_kube.cluster, tmp_path, f"pcjobs-{secrets.token_hex(3)}")
    yield rights
    rights.remove()


@pytest.fixture
def builds(real_kube: RealKube, tmp_path: Path) -> Iterator[Builds]:
    with builds_namespace(real_kube, tmp_path) as made:
        yield made


def server_config(
    tmp_path: Path, prefix: str, registry: str, jobs_rights: ChartRights, builds: Builds
) -> Path:
    """jobs.kubernetes with the jobs service's kubeconfig and short timings; the kaniko
    builder with its own."""
    auth = tmp_path / "push.json"
    auth.write_text(dockerconfigjson({registry: Credentials(USER, PASSWORD)}))
    (tmp_path / "pfs-on-nodes").mkdir()
    config = {
        "jobs": {
            "backend": "kubernetes",
            "kubernetes": {
                "kubeconfig": str(jobs_rights.kubeconfig),
                **jobs_rights.settings,
                "namespace_prefix": prefix,
                # A pvc datacenter needs a claim in each user's namespace, which no one
                # makes here: hostpath needs nothing (the node mounts nothing anyway).
                "datacenters": {DC: {"kind": "hostpath", "host_path": str(tmp_path / "pfs-on-nodes")}},
                "default_image": f"{registry}/base/python:3.11",
                "watch_timeout_seconds": 5,
                "max_backoff_seconds": 1,
                "quota_sync_seconds": 0.5,
                "image_pull_timeout_seconds": 3,
            },
        },
        "builder": {
            "backend": "kaniko",
            "poll_seconds": 0.05,
            "kaniko": {
                "registry": registry,
                "repository": REPO,
                "insecure_registries": [registry],
                "auth_file": str(auth),
                "namespace": builds.namespace,
                "kubeconfig": str(builds.rights.kubeconfig),
                "poll_seconds": 0.05,
            },
        },
    }
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def gone(admin: KubeClient, namespace: str) -> None:
    """Waits until nothing of any build is left in the builds namespace: the builder
    deletes the Job, the real garbage collector then its pod, ConfigMap and Secret."""
    selector = {"labelSelector": kaniko_manifests.build_selector()}
    for path in (
        f"/apis/batch/v1/namespaces/{namespace}/jobs",
        *(f"/api/v1/namespaces/{namespace}/{p}" for p in ("pods", "configmaps", "secrets")),
    ):
        for obj in admin.get(path, query=selector)["items"]:
            admin.wait_gone(path, obj["metadata"]["name"])


def test_a_job_with_requirements_is_built_by_kaniko_and_runs_on_the_image(
    real_kube: RealKube,
    server_factory: Any,
    registry: str,
    jobs_rights: ChartRights,
    builds: Builds,
    tmp_path: Path,
) -> None:
    """PENDING → BUILDING → RUNNING on the built image, then SUCCEEDED; the build's log
    stays readable and a second dry run is a cache hit."""
    prefix = f"t{secrets.token_hex(2)}-"
    namespace = namespace_for("admin", prefix)
    admin = real_kube.cluster.admin
    server = server_factory(
        "--server-config", str(server_config(tmp_path, prefix, registry, jobs_rights, builds))
    )
    trainer_images: list[str] = []
    errors: list[BaseException] = []

    def decide(pod: Obj) -> PodScript:
        key = (pod["metadata"].get("annotations") or {}).get(kaniko_manifests.ANNOTATION_KEY)
        try:
            if key:
                # The executor builds (an init container); the pusher pushes to the user's path.
                put_image(registry, f"{REPO}/admin", key, f"runtime {key}")
                built = ("Successfully installed tinypkg-1.0", "INFO Built the tarball")
                executor = (kaniko_manifests.EXECUTOR, built, 0)
                return PodScript(init=(executor,), lines=("pushed the image",), run_seconds=1)
            if pod["metadata"]["labels"].get(LABEL_ROLE) == "trainer":
                trainer_images.append(pod["spec"]["containers"][0]["image"])
                return PodScript(lines=("on the built image",), run_seconds=3)
        except Exception as exc:  # raising here would stop the simulated kubelet
            errors.append(exc)
        return default_script(pod)

    package = tmp_path / "with-reqs"
    make_package(package)
    (package / "requirements.txt").write_text("tinypkg==1.0\n")
    try:
        with real_kube.scripted(decide):
            ok(run_cli(server, "submit", "--name", "built", str(package)))
            seen: set[str] = set()
            deadline = time.monotonic() + 60
            while (job := as_json(run_cli(server, "-o", "json", "get", "job", "built")))["state"] not in (
                "RUNNING",
                "SUCCEEDED",
                "FAILED",
            ):
                seen.add(job["state"])
                assert time.monotonic() < deadline, f"the job is still {job['state']}: {job['reason']}"
                time.sleep(0.2)
            assert job["state"] == "RUNNING", job
            assert "BUILDING" in seen or "BUILDING" in ok(run_cli(server, "get", "job", "built"))
            done = wait_for_state(server, "built", ("SUCCEEDED", "FAILED"))
        assert not errors, errors
        assert done["state"] == "SUCCEEDED", done
        # The trainer's pod, made by the real Job controller, ran the built image.
        [image] = trainer_images
        assert image.startswith(f"{registry}/{REPO}/admin:"), image
        assert has_tag(registry, f"{REPO}/admin", image.rsplit(":", 1)[1])
        # The build's own log stays readable, and a second dry run is a cache hit.
        assert "Successfully installed tinypkg-1.0" in ok(run_cli(server, "logs", "built"))
        dry = ok(run_cli(server, "submit", "--dry-run", "--name", "again", str(package)))
        assert "a cache hit" in dry, dry
        # Nothing of the build is left in the builds namespace.
        gone(admin, builds.namespace)
    finally:
        admin.request("DELETE", f"/api/v1/namespaces/{namespace}")
