"""The kaniko builder's place on the real control plane, for its tests of every tier: a
builds namespace made as the chart makes it (its Namespace, labelled Pod Security
`baseline`, and its default-deny NetworkPolicy, both accepted by the real API server), and
the chart's builder rights in it."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kube_real.chart import ChartRights, collection, install_rights, render
from kube_real.fixtures import RealKube

# docs/builder.md: Kaniko's executor runs as root with a few capabilities, which
# `restricted` refuses; the builds namespace needs `baseline`.
POD_SECURITY = "baseline"


@dataclass
class Builds:
    """One test's builds namespace and the chart's builder rights for it."""

    namespace: str
    rights: ChartRights


@contextmanager
def builds_namespace(real_kube: RealKube, home: Path, pod_security: str = POD_SECURITY) -> Iterator[Builds]:
    """A builds namespace of its own, its Namespace and NetworkPolicy exactly as
    charts/paddlecloud renders them for ci/kaniko-values.yaml with that namespace (Pod
    Security `baseline` enforced unless a test asks for another level: `restricted`
    refuses the executor), and the builder's ServiceAccount, Role and RoleBinding as the
    chart renders them, the account in a namespace of its own; all deleted afterwards.
    The kubeconfig with the account's token is under `home`."""
    admin = real_kube.cluster.admin
    token = secrets.token_hex(3)
    namespace = f"pcbuilds-{token}"
    sets = (f"builder.kaniko.namespace={namespace}",)
    objects = render(
        real_kube.cluster.admin_kubeconfig, home, "kaniko-values.yaml", f"pcbuilder-{token}", *sets
    )
    made = next(o for o in objects if o["kind"] == "Namespace" and o["metadata"]["name"] == namespace)
    made["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] = pod_security
    admin.create("/api/v1/namespaces", made)
    try:
        for policy in (
            o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"].get("namespace") == namespace
        ):
            admin.create(collection(policy), policy)
        # Until the ServiceAccount controller made `default`, admission refuses every pod.
        admin.wait_for(f"/api/v1/namespaces/{namespace}/serviceaccounts", lambda _: True, name="default")
        rights = install_rights(
            real_kube.cluster,
            home,
            f"pcbuilder-{token}",
            service="builder",
            values="kaniko-values.yaml",
            sets=sets,
        )
        try:
            yield Builds(namespace, rights)
        finally:
            rights.remove()
    finally:
        admin.request("DELETE", f"/api/v1/namespaces/{namespace}")
