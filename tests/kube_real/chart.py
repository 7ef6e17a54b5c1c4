"""charts/paddlecloud as the tests use it on the real control plane: rendered by Helm 4,
and the jobs service's (or the builder's) rights installed from what it renders, so a
service under test authenticates with a ServiceAccount token that has exactly the RBAC
the chart gives it, never a copy of services/jobs/kube/rbac.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kube_real.client import KubeClient
from kube_real.cluster import Cluster

Obj = dict[str, Any]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "paddlecloud"
HELM = Path(sys.executable).parent / "helm"
RELEASE = "pc"
FULLNAME = f"{RELEASE}-paddlecloud"
CLUSTER_SCOPED = frozenset(
    {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume", "StorageClass", "IngressClass"}
    | {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
)
RBAC_KINDS = (
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
)
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


class HelmMissing(Exception):
    """No Helm where make install-dev puts it."""


def values_args(values: str) -> list[str]:
    """Helm's flags for a values set: "default", or a file name in charts/paddlecloud/ci."""
    return [] if values == "default" else ["-f", str(CHART / "ci" / values)]


def collection(obj: Obj, namespace: str | None = None) -> str:
    """The API path of the collection `obj` belongs to."""
    api_version, kind = obj["apiVersion"], obj["kind"]
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    lower = kind.lower()
    plural = (
        f"{lower[:-1]}ies" if lower.endswith("y") else f"{lower}es" if lower.endswith("s") else f"{lower}s"
    )
    if kind in CLUSTER_SCOPED:
        return f"{base}/{plural}"
    return f"{base}/namespaces/{obj['metadata'].get('namespace') or namespace}/{plural}"


def helm(kubeconfig: Path, home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Helm 4 with the admin's kubeconfig: server-side apply (Helm 4's default), its
    OpenAPI validation against the real server's schemas."""
    if not HELM.is_file():
        raise HelmMissing(f"no Helm at {HELM}: run make install-dev (scripts/install_helm.py)")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("HELM_", "KUBECONFIG"))},
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    return subprocess.run(
        [str(HELM), *args, "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def render(kubeconfig: Path, home: Path, values: str, namespace: str, *sets: str) -> list[Obj]:
    """`helm template` of the chart for a values set, `--set` each of `sets`."""
    flags = [arg for s in sets for arg in ("--set", s)]
    out = helm(
        kubeconfig, home, "template", RELEASE, str(CHART), "-n", namespace, *values_args(values), *flags
    )
    if out.returncode != 0:
        raise AssertionError(f"helm template {values}: {out.stderr}")
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def rights_of(objects: list[Obj], account: str, namespace: str) -> list[Obj]:
    """The ServiceAccount `account`, the roles and bindings that give it rights, the
    ClusterRoles it may bind (the jobs service's tenant role), and the admission policies
    that bound what it does (their matchConditions name its user)."""
    roles: set[tuple[str, str]] = set()
    made: list[Obj] = []
    for obj in objects:
        if obj["kind"] == "ServiceAccount" and obj["metadata"]["name"] == account:
            made.append(obj)
        if obj["kind"] in ("ClusterRoleBinding", "RoleBinding") and any(
            s.get("kind") == "ServiceAccount" and s.get("name") == account for s in obj.get("subjects", ())
        ):
            made.append(obj)
            roles.add((obj["roleRef"]["kind"], obj["roleRef"]["name"]))
    made += [o for o in objects if (o["kind"], o["metadata"]["name"]) in roles]
    bindable = {
        name
        for role in made
        if role["kind"] == "ClusterRole"
        for rule in role.get("rules", ())
        if "bind" in rule["verbs"]
        for name in rule.get("resourceNames", ())
    }
    made += [o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] in bindable]
    user = f"system:serviceaccount:{namespace}:{account}"
    policies = {
        o["metadata"]["name"]
        for o in objects
        if o["kind"] == "ValidatingAdmissionPolicy"
        and any(user in c["expression"] for c in o["spec"].get("matchConditions", ()))
    }
    made += [
        o for o in objects if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"] in policies
    ]
    made += [
        o
        for o in objects
        if o["kind"] == "ValidatingAdmissionPolicyBinding" and o["spec"]["policyName"] in policies
    ]
    assert any(o["kind"] == "ServiceAccount" for o in made), f"the chart renders no ServiceAccount {account}"
    return made


@dataclass
class ChartRights:
    """A service's rights as the chart renders them, installed for one test: the objects
    (namespaced ones in `namespace` unless the chart names another, such as the builds'
    namespace, which the test makes) and a kubeconfig with a token of
    the ServiceAccount; `settings`, what the chart's paddlecloud.yaml sets in
    `jobs.kubernetes` about who the service is (release, tenant_role, service_account).
    `remove()` deletes what it made."""

    cluster: Cluster
    namespace: str
    account: str
    objects: list[Obj]
    kubeconfig: Path
    settings: dict[str, Any]
    token: str = ""

    def client(self) -> KubeClient:
        """A client with the service's token: what the service may do, the API server says."""
        return KubeClient(self.cluster.server, self.cluster.pki.ca_cert, token=self.token)

    def remove(self) -> None:
        admin = self.cluster.admin
        for obj in self.objects:
            if obj["kind"] in ("ClusterRole", "ClusterRoleBinding", *POLICY_KINDS):
                admin.request("DELETE", f"{collection(obj)}/{obj['metadata']['name']}")
        admin.request("DELETE", f"/api/v1/namespaces/{self.namespace}")


def install_rights(
    cluster: Cluster,
    home: Path,
    namespace: str,
    *,
    service: str = "jobs",
    values: str = "default",
    sets: tuple[str, ...] = (),
    mutate: Callable[[list[Obj]], None] | None = None,
) -> ChartRights:
    """Renders the chart into `namespace` (made here), installs the rights of its `service`
    account (`<release>-paddlecloud-<service>`; the chart names its cluster-wide roles by
    the release's namespace, so tests do not share them), `mutate` applied first (a mutation
    test drops a rule), and writes a kubeconfig at home/<namespace>.kubeconfig with a token
    of that account."""
    objects = render(cluster.admin_kubeconfig, home, values, namespace, *sets)
    account = f"{FULLNAME}-{service}"
    rights = rights_of(objects, account, namespace)
    if mutate is not None:
        mutate(rights)
    admin = cluster.admin
    admin.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    for obj in sorted(rights, key=lambda o: RBAC_KINDS.index(o["kind"])):
        admin.create(collection(obj, namespace), obj)
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token"
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    token = admin.create(path, request)["status"]["token"]
    kubeconfig = cluster.write_kubeconfig(
        home / f"{namespace}.kubeconfig", account, {"token": token}, namespace
    )
    made = ChartRights(cluster, namespace, account, rights, kubeconfig, service_settings(objects), token)
    if any(o["kind"] == "ValidatingAdmissionPolicyBinding" for o in rights):
        _wait_for_policy(made)
    return made


def service_settings(objects: list[Obj]) -> dict[str, Any]:
    """What the chart's paddlecloud.yaml says of who the jobs service is."""
    (config,) = (o for o in objects if o["kind"] == "ConfigMap" and "paddlecloud.yaml" in o.get("data", {}))
    kubernetes = yaml.safe_load(config["data"]["paddlecloud.yaml"])["jobs"]["kubernetes"]
    return {k: kubernetes[k] for k in ("release", "tenant_role", "service_account") if k in kubernetes}


def _wait_for_policy(rights: ChartRights) -> None:
    """Returns once the API server enforces the chart's admission policy for this account
    (it loads policies from a watch, a moment after they are made): a dry-run create of a
    namespace without the release's label is refused."""
    client = rights.client()
    probe = {"metadata": {"name": f"{rights.namespace}-probe"}}
    deadline = time.monotonic() + 60
    while True:
        reply = client.request("POST", "/api/v1/namespaces", probe, query={"dryRun": "All"})
        if reply.status == 403 and "release" in reply.message:
            return
        assert time.monotonic() < deadline, f"the admission policy is not enforced: {reply}"
        time.sleep(0.1)
