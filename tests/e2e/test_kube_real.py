"""Smoke tests of the real control plane (tests/kube_real): each checks something that
only a real API server, its admission chain, RBAC and controllers do, and that
a fake API server (the deleted tests/kube_fake) accepted or could not show."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from kube_real import KubeClient, PodScript
from kube_real.fixtures import RealKube

Obj = dict[str, Any]

BUSYBOX = "busybox:1.36"


def create_namespace(admin: KubeClient, prefix: str, labels: dict[str, str] | None = None) -> str:
    """A fresh namespace, once its `default` ServiceAccount exists: until the real
    ServiceAccount controller has made it, the ServiceAccount admission plugin refuses
    every pod there (before PodSecurity even looks)."""
    name = f"{prefix}-{secrets.token_hex(4)}"
    admin.create("/api/v1/namespaces", {"metadata": {"name": name, "labels": labels or {}}})
    admin.wait_for(f"/api/v1/namespaces/{name}/serviceaccounts", lambda _: True, name="default")
    return name


@pytest.fixture
def namespace(real_kube: RealKube) -> Iterator[str]:
    """A fresh namespace, deleted after the test (the namespace controller empties it)."""
    name = create_namespace(real_kube.cluster.admin, "smoke")
    yield name
    real_kube.cluster.admin.request("DELETE", f"/api/v1/namespaces/{name}")


def job(name: str, **spec: Any) -> Obj:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": BUSYBOX, "command": ["true"]}],
                }
            },
            **spec,
        },
    }


def test_the_cluster_comes_up_at_the_pinned_version(real_kube: RealKube) -> None:
    admin = real_kube.cluster.admin
    version = admin.get("/version")
    assert version["gitVersion"] == real_kube.cluster.version
    # The controller manager made the default ServiceAccount; the API server serves RBAC.
    assert admin.get("/api/v1/namespaces/default/serviceaccounts/default")["metadata"]["name"] == "default"
    # The simulated node registered itself with GPUs, as a device plugin would advertise them.
    node = admin.get(f"/api/v1/nodes/{real_kube.kubelet.node}")
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert any(
        r["metadata"]["name"] == "cluster-admin"
        for r in admin.get("/apis/rbac.authorization.k8s.io/v1/clusterroles")["items"]
    )


def test_podsecurity_restricted_refuses_a_hostpath_pod(real_kube: RealKube) -> None:
    admin = real_kube.cluster.admin
    name = create_namespace(admin, "restricted", {"pod-security.kubernetes.io/enforce": "restricted"})
    try:
        pod = {
            "metadata": {"name": "escape"},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": BUSYBOX,
                        "volumeMounts": [{"name": "host", "mountPath": "/host"}],
                    }
                ],
                "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
            },
        }
        reply = admin.request("POST", f"/api/v1/namespaces/{name}/pods", pod)
        assert reply.status == 403, reply
        assert 'violates PodSecurity "restricted:latest"' in reply.message
        assert '"hostPath"' in reply.message
    finally:
        admin.request("DELETE", f"/api/v1/namespaces/{name}")


def test_an_invalid_job_spec_is_refused_naming_the_field(real_kube: RealKube, namespace: str) -> None:
    invalid = job(
        "invalid",
        podReplacementPolicy="TerminatingOrFailed",
        podFailurePolicy={
            "rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]
        },
    )
    reply = real_kube.cluster.admin.request("POST", f"/apis/batch/v1/namespaces/{namespace}/jobs", invalid)
    assert reply.status == 422, reply
    assert 'spec.podReplacementPolicy: Unsupported value: "TerminatingOrFailed"' in reply.message


def test_an_immutable_configmap_cannot_change(real_kube: RealKube, namespace: str) -> None:
    admin = real_kube.cluster.admin
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    admin.create(path, {"metadata": {"name": "frozen"}, "data": {"a": "1"}, "immutable": True})
    reply = admin.request(
        "PATCH", f"{path}/frozen", {"data": {"a": "2"}}, content_type="application/merge-patch+json"
    )
    assert reply.status == 422, reply
    assert "field is immutable when `immutable` is set" in reply.message
    assert admin.get(f"{path}/frozen")["data"] == {"a": "1"}


def test_a_terminating_namespace_refuses_creates(real_kube: RealKube) -> None:
    admin = real_kube.cluster.admin
    name = f"terminating-{secrets.token_hex(4)}"
    admin.create("/api/v1/namespaces", {"metadata": {"name": name}})
    # A finalizer nothing removes keeps the namespace Terminating until the test lets go.
    held = f"/api/v1/namespaces/{name}/configmaps/held"
    admin.create(
        f"/api/v1/namespaces/{name}/configmaps",
        {"metadata": {"name": "held", "finalizers": ["paddlecloud.test/hold"]}},
    )
    try:
        admin.call("DELETE", f"/api/v1/namespaces/{name}")
        assert admin.get(f"/api/v1/namespaces/{name}")["status"]["phase"] == "Terminating"
        reply = admin.request("POST", f"/api/v1/namespaces/{name}/configmaps", {"metadata": {"name": "late"}})
        assert reply.status == 403, reply
        assert "because it is being terminated" in reply.message
    finally:
        admin.merge_patch(held, {"metadata": {"finalizers": None}})


def test_a_user_without_rbac_is_refused(real_kube: RealKube, namespace: str) -> None:
    nobody = real_kube.cluster.user("nobody")
    reply = nobody.request("GET", f"/api/v1/namespaces/{namespace}/pods")
    assert reply.status == 403, reply
    assert 'User "nobody" cannot list resource "pods"' in reply.message
    reply = nobody.request("POST", f"/apis/batch/v1/namespaces/{namespace}/jobs", job("sneaky"))
    assert reply.status == 403, reply


def test_a_service_account_token_has_exactly_its_role(real_kube: RealKube, namespace: str) -> None:
    """Tokens signed with the cluster's service-account key authenticate; RBAC then
    grants the Role bound to the ServiceAccount and nothing more."""
    admin = real_kube.cluster.admin
    admin.create(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "reader"}})
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}
    admin.create(f"{rbac}/roles", {"metadata": {"name": "pod-reader"}, "rules": [rule]})
    binding = {
        "metadata": {"name": "reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
    }
    admin.create(f"{rbac}/rolebindings", binding)
    reader = real_kube.cluster.service_account(namespace, "reader")
    assert reader.request("GET", f"/api/v1/namespaces/{namespace}/pods").status == 200
    reply = reader.request("GET", f"/api/v1/namespaces/{namespace}/secrets")
    assert reply.status == 403, reply
    assert f'User "system:serviceaccount:{namespace}:reader" cannot list resource "secrets"' in reply.message


def test_a_job_runs_through_the_real_controllers_and_scheduler(real_kube: RealKube, namespace: str) -> None:
    admin = real_kube.cluster.admin
    with real_kube.scripted(lambda pod: PodScript(lines=("hello", "from the job"), run_seconds=1)):
        admin.create(f"/apis/batch/v1/namespaces/{namespace}/jobs", job("hello"))
        # Made by the real Job controller, bound by the real scheduler, run by the simulated
        # kubelet: Running for its second, then Succeeded.
        for phase in ("Running", "Succeeded"):
            pod = admin.wait_for(
                f"/api/v1/namespaces/{namespace}/pods",
                lambda p, phase=phase: p.get("status", {}).get("phase") == phase,
                query={"labelSelector": "job-name=hello"},
            )
    assert pod["spec"]["nodeName"] == real_kube.kubelet.node
    owner = pod["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("Job", "hello", True)
    done = admin.wait_for(
        f"/apis/batch/v1/namespaces/{namespace}/jobs",
        lambda j: any(
            c["type"] == "Complete" and c["status"] == "True"
            for c in j.get("status", {}).get("conditions", ())
        ),
        name="hello",
    )
    assert done["status"]["succeeded"] == 1
    # pods/log, proxied by the API server to the simulated kubelet's HTTPS endpoint.
    log = f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}/log"
    assert admin.get(log, query={"container": "main"}) == "hello\nfrom the job\n"
    assert admin.get(log, query={"follow": "true", "tailLines": "1"}) == "from the job\n"


def test_deleting_a_statefulset_stops_its_running_pod(real_kube: RealKube, namespace: str) -> None:
    """The real StatefulSet controller, the garbage collector and a graceful delete that
    only the node's kubelet may finish."""
    admin = real_kube.cluster.admin
    labels = {"app": "ps"}
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "ps"},
        "spec": {
            "replicas": 1,
            "serviceName": "ps",
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "main", "image": BUSYBOX, "command": ["sleep", "inf"]}]},
            },
        },
    }
    apps = f"/apis/apps/v1/namespaces/{namespace}/statefulsets"
    admin.create(apps, sts)
    admin.wait_for(apps, lambda s: s.get("status", {}).get("readyReplicas") == 1, name="ps")
    pod = admin.get(f"/api/v1/namespaces/{namespace}/pods/ps-0")
    assert pod["status"]["phase"] == "Running"
    admin.call(
        "DELETE",
        f"{apps}/ps",
        {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"},
    )
    admin.wait_gone(f"/api/v1/namespaces/{namespace}/pods", "ps-0")
