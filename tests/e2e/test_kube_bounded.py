"""Bounded job pods on the real control plane (issue 31, findings 5, 8 and 9): `paddlecloud
server` with `jobs.backend: kubernetes` and the chart's rights (kube_backend_support.py),
read back from the real API server as its admission (LimitRanger, ResourceQuota) and
controllers (Job, StatefulSet) left them.

- a job's `-disk` is the ephemeral-storage request and limit of every container of the
  pods the real controllers made, init containers too, and the sizeLimit of every
  emptyDir; an image pulled with a user's registry Secret is pulled Always;
- the user's namespace holds the bound: its LimitRange gives a pod that asks for nothing
  the default disk and refuses one past the largest; its ResourceQuota counts a disk
  quota, which the service applies at submit and the real API server to the pods;
- the namespace's DNS egress goes to the DNS pods the settings select, on any port.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kube_backend_support as kb
import pytest
from test_jobs_cli import ok, run_cli

import kube_real
from kube_real.fixtures import RealKube
from paddlecloud.jobs.kube.names import DNS_STORAGE_POLICY, LABEL_JOB, LIMIT_RANGE_NAME, QUOTA_NAME

pytestmark = pytest.mark.slow

Obj = dict[str, Any]
IMAGE = "registry.example.com/team/paddle:1"
OPENSHIFT_DNS = {
    "namespace_labels": {"kubernetes.io/metadata.name": "openshift-dns"},
    "pod_labels": {"dns.operator.openshift.io/daemonset-dns": "default"},
}


@pytest.fixture
def start(real_kube: RealKube, server_factory: Any, tmp_path: Path) -> Iterator[Any]:
    """Starts `paddlecloud server` on the real control plane with `jobs.kubernetes`
    overrides; all it made is deleted after the test."""
    with kb.kube_backends(real_kube, server_factory, tmp_path) as started:
        yield started


def pod(name: str, resources: Obj | None = None) -> Obj:
    """A pod PaddleCloud did not make, with one container asking for `resources`."""
    container: Obj = {"name": "main", "image": "busybox:1.36"}
    if resources is not None:
        container["resources"] = resources
    return {"metadata": {"name": name}, "spec": {"containers": [container]}}


def dns_egress(k: kb.KubeBackend, user: str = "admin") -> list[Obj]:
    """The egress rules of the namespace's DNS policy, as the real API server holds it."""
    admin = k.kube.cluster.admin
    policy = admin.get(
        f"/apis/networking.k8s.io/v1/namespaces/{k.namespace(user)}/networkpolicies/{DNS_STORAGE_POLICY}"
    )
    egress: list[Obj] = policy["spec"]["egress"]
    return egress


def dns_rule(selector: dict[str, dict[str, str]]) -> Obj:
    # No `ports`: every port of those pods (what the Service translates 53 to).
    return {
        "to": [
            {
                "namespaceSelector": {"matchLabels": selector["namespace_labels"]},
                "podSelector": {"matchLabels": selector["pod_labels"]},
            }
        ]
    }


def test_disk_bounds_every_container_and_emptydir_and_a_registry_pulls_always(start: Any) -> None:
    k = start()
    admin = k.kube.cluster.admin
    k.server.cli(
        "registry", "-username", "u", "-password", "pw", "-server", "registry.example.com", "-name", "myreg"
    )
    release = threading.Event()
    trainer = kb.script(trainer=lambda pod: kube_real.PodScript(lines=("trained",), until=release))
    try:
        with k.kube.scripted(trainer):
            k.submit(
                "bounded",
                *("-disk", "3Gi", "--pservers", "1", "--trainers", "2"),
                *("-registry", "myreg", "-image", IMAGE),
            )
            query = {"labelSelector": f"{LABEL_JOB}=bounded"}
            pods = kb.wait(
                lambda: (
                    len(items := admin.get(f"/api/v1/namespaces/{k.namespace()}/pods", query=query)["items"])
                    == 3
                    and items
                ),
                "the parameter server's pod and both trainers'",
            )
            release.set()
            done = k.wait_for_state("bounded", ("SUCCEEDED", "FAILED"))
    finally:
        release.set()
    assert done["state"] == "SUCCEEDED", done
    for pod in pods:
        spec = pod["spec"]
        containers = [*spec["initContainers"], *spec["containers"]]
        assert len(containers) >= 2, spec  # unpack (and wait-pservers) besides the worker
        assert spec["containers"][0]["image"] == IMAGE, spec
        for container in containers:
            for kind in ("requests", "limits"):
                assert container["resources"][kind]["ephemeral-storage"] == "3Gi", (
                    pod["metadata"]["name"],
                    container,
                )
            # The job's image, from the registry its credentials are for, is pulled Always;
            # the init containers' busybox (Docker Hub's) as the settings say.
            pulled_with_them = container["image"] == IMAGE
            assert container["imagePullPolicy"] == ("Always" if pulled_with_them else "IfNotPresent"), (
                container
            )
        empty = [v for v in spec["volumes"] if "emptyDir" in v]
        assert empty and all(v["emptyDir"] == {"sizeLimit": "3Gi"} for v in empty), spec["volumes"]
    # The namespace's DNS egress: the cluster's DNS pods by selector, on any port.
    assert dns_egress(k) == [
        dns_rule(
            {
                "namespace_labels": {"kubernetes.io/metadata.name": "kube-system"},
                "pod_labels": {"k8s-app": "kube-dns"},
            }
        )
    ]


def test_a_disk_quota_and_the_limitrange_bound_the_namespace(start: Any) -> None:
    # OpenShift's DNS pods, with a port list, as an operator there would set them.
    k = start(max_container_disk="100Gi", dns=OPENSHIFT_DNS)
    admin, server = k.kube.cluster.admin, k.server
    server.cli("users", "create", "bob", "--password-stdin", stdin="bob-password\n")
    server.cli("users", "quota", "bob", "-disk", "2Gi")
    server.add_datacenter("as-bob", "bob", "bob-password")
    as_bob = ("--datacenter", "as-bob")
    package = str(k.package())

    # The service's own check, at submit, in words.
    refused = run_cli(server, *as_bob, "submit", "--name", "huge", "-disk", "4Gi", package)
    assert refused.returncode != 0
    assert "disk: asked 4Gi, in use 0, allowed 2Gi" in refused.stderr, refused.stderr
    # More than a pod may have here (the admin has no quota): refused before anything is
    # made, naming the setting.
    refused = run_cli(server, "submit", "--name", "huger", "-disk", "200Gi", package)  # no quota
    assert refused.returncode != 0
    assert "100Gi at most (jobs.kubernetes.max_container_disk)" in refused.stderr, refused.stderr

    with k.kube.scripted(kb.script()):
        ok(run_cli(server, *as_bob, "submit", "--name", "first", package))
        done = k.wait_for_state("first", ("SUCCEEDED", "FAILED"), *as_bob)
    assert done["state"] == "SUCCEEDED", done
    namespace = k.namespace("bob")
    assert dns_egress(k, "bob") == [dns_rule(OPENSHIFT_DNS)]
    quota = admin.get(f"/api/v1/namespaces/{namespace}/resourcequotas/{QUOTA_NAME}")
    assert quota["spec"]["hard"]["requests.ephemeral-storage"] == "2Gi", quota["spec"]
    assert quota["spec"]["hard"]["limits.ephemeral-storage"] == "2Gi", quota["spec"]
    [limits] = admin.get(f"/api/v1/namespaces/{namespace}/limitranges/{LIMIT_RANGE_NAME}")["spec"]["limits"]
    assert limits["max"]["ephemeral-storage"] == "100Gi", limits
    assert limits["default"]["ephemeral-storage"] == limits["defaultRequest"]["ephemeral-storage"] == "1Gi"

    # The real LimitRanger: a pod that asks for nothing gets the default disk, and one past
    # the largest is refused.
    made = admin.create(f"/api/v1/namespaces/{namespace}/pods", pod("bare"))
    resources = made["spec"]["containers"][0]["resources"]
    assert resources["requests"]["ephemeral-storage"] == resources["limits"]["ephemeral-storage"] == "1Gi"
    big = pod("big", {"limits": {"ephemeral-storage": "200Gi"}})
    answer = admin.request("POST", f"/api/v1/namespaces/{namespace}/pods", big)
    assert answer.status == 403 and "ephemeral-storage" in answer.message, (answer.status, answer.message)

    # The bare pod holds 1Gi of bob's 2Gi (the service counts only its own jobs, so it
    # accepts a job of 2Gi): the real ResourceQuota refuses the job's pods and the job waits,
    # saying so, as it does for cpu and memory.
    ok(run_cli(server, *as_bob, "submit", "--name", "over", "-disk", "2Gi", package))
    job = k.refused_by_quota("over", *as_bob)
    assert "requests.ephemeral-storage=2Gi" in job["reason"], job
    ok(run_cli(server, *as_bob, "kill", "over"))
