"""What the jobs service may do on the Kubernetes API, written once, as data.

Three parts, each rendered into the Helm chart (scripts/chart_rbac.py) and each entry
saying why it is needed:
- `CLUSTER_PERMISSIONS` (per-user mode, a ClusterRole bound cluster-wide): only what
  cannot be namespaced. Namespaces (made as users appear, deleted with them), each
  user's PersistentVolumes (kind cephfs), and making
  RoleBindings, with `bind` on ONE ClusterRole, the tenant role, by `resourceNames`: the
  service grants itself its rights in each namespace it makes, and nothing else. The
  chart's ValidatingAdmissionPolicy then confines these to this release's namespaces:
  the API server refuses a change to any namespace that lacks the release's label, and a
  RoleBinding anywhere but there or to any other role.
- `TENANT_PERMISSIONS` (per-user mode, the tenant ClusterRole, bound by that RoleBinding
  in each of its namespaces only): everything a job needs, namespaced.
- shared mode: the tenant rights as a Role in the one namespace; nothing cluster-wide.

`policy_rules(part)` renders a part as rules (the cluster part with TENANT_ROLE where the
tenant ClusterRole's name goes; the chart puts the release's there), `role` the whole
object, and `allowed` answers for one request, so a test can check every request the
backend made against the list.

Least privilege, and what it rules out: no wildcard anywhere; Secrets may be written
but never read or listed (the registry credentials go one way); pods are only watched
and their logs read, never created, exec'ed or attached to (their controllers create
them); nothing that grants rights (`escalate`, `impersonate`), and `bind` only on the
tenant ClusterRole by name; nothing namespaced is listed or watched across the cluster.
Children are deleted by the garbage collector when their owner ConfigMap goes, so most
kinds need no `delete`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from . import names

Mode = Literal["per-user", "shared"]
Part = Literal["cluster", "tenant", "shared"]
Scope = Literal["cluster", "namespaced"]

# Where the tenant ClusterRole's name goes in the cluster part's rules (the chart
# replaces it with the release's: `<release namespace>-<fullname>-jobs-tenant`).
TENANT_ROLE = "PADDLECLOUD_TENANT_ROLE"

# Verbs that never appear, whatever the entries below say (tests check it); `bind` only
# with resourceNames.
FORBIDDEN_VERBS = frozenset({"*", "escalate", "impersonate"})
FORBIDDEN_RESOURCES = frozenset(
    {"*", "pods/exec", "pods/attach", "pods/portforward", "serviceaccounts/token"}
)


@dataclass(frozen=True)
class Permission:
    """Verbs on one resource. `scope` is the resource's: `cluster` for cluster-scoped
    ones (namespaces), `namespaced` for the rest."""

    group: str  # "" is the core group
    resource: str  # with its subresource: "pods/log"
    verbs: tuple[str, ...]
    scope: Scope
    why: str
    names: tuple[str, ...] = ()  # resourceNames: only these objects


CLUSTER_PERMISSIONS: tuple[Permission, ...] = (
    Permission(
        "",
        "namespaces",
        ("get", "list", "watch", "create", "patch", "delete"),
        "cluster",
        "a namespace per user, made on first use and deleted with the user; watched for the "
        "release's label, to follow jobs in each (the chart's admission policy refuses any "
        "change to a namespace without it)",
    ),
    Permission(
        "rbac.authorization.k8s.io",
        "rolebindings",
        ("create",),
        "namespaced",
        "the service's own RoleBinding to the tenant role, in each namespace it made (the "
        "admission policy refuses any other)",
    ),
    Permission(
        "rbac.authorization.k8s.io",
        "clusterroles",
        ("bind",),
        "cluster",
        "binding the tenant role, and only it, without holding its rights cluster-wide",
        names=(TENANT_ROLE,),
    ),
    Permission(
        "",
        "persistentvolumes",
        ("get", "create", "patch", "delete"),
        "cluster",
        "each user's static ceph-csi volumes over their PFS home and public, made with their "
        "namespace and deleted with the user, never their data (the admission policy admits "
        "only the release's, of the ceph-csi driver, Retain, claimed in the release's namespaces)",
    ),
)

TENANT_PERMISSIONS: tuple[Permission, ...] = (
    Permission(
        "",
        "resourcequotas",
        ("get", "create", "update", "patch", "delete"),
        "namespaced",
        "the user's quota, replaced when an admin changes it, removed when it becomes unlimited",
    ),
    Permission(
        "", "limitranges", ("get", "create", "update", "patch"), "namespaced", "a namespace's defaults"
    ),
    Permission(
        "networking.k8s.io",
        "networkpolicies",
        ("get", "create", "update", "patch"),
        "namespaced",
        "the namespace's default deny, and each job's own policy",
    ),
    Permission(
        "",
        "configmaps",
        ("get", "list", "watch", "create", "patch", "delete"),
        "namespaced",
        "each job's owner, holding its spec; deleting it removes the job's objects",
    ),
    Permission(
        "",
        "configmaps/finalizers",
        ("update",),
        "namespaced",
        "children block their owner's deletion (OwnerReferencesPermissionEnforcement asks for this)",
    ),
    Permission(
        "", "services", ("get", "create", "patch"), "namespaced", "the workers' headless Services, a viewer's"
    ),
    Permission(
        "",
        "persistentvolumeclaims",
        ("get", "create", "patch"),
        "namespaced",
        "the user's claims of their PFS volumes (kind cephfs), deleted with the namespace",
    ),
    Permission(
        "",
        "secrets",
        ("create", "update", "patch", "delete"),
        "namespaced",
        "registry credentials, written and never read back",
    ),
    Permission(
        "apps",
        "statefulsets",
        ("get", "list", "watch", "create", "patch", "delete"),
        "namespaced",
        "parameter servers; stopped by deletion once the trainers are done",
    ),
    Permission(
        "batch",
        "jobs",
        ("get", "list", "watch", "create", "patch", "delete"),
        "namespaced",
        "trainers, followed to their end",
    ),
    Permission(
        "",
        "pods",
        ("get", "list", "watch", "create", "delete"),
        "namespaced",
        "per-worker state, hosts, exit codes; a job's viewer (TensorBoard, VisualDL) started and stopped",
    ),
    Permission("", "pods/log", ("get",), "namespaced", "job logs"),
    Permission(
        "metrics.k8s.io",
        "pods",
        ("get", "list"),
        "namespaced",
        "what each worker uses (PodMetrics, where metrics-server runs): the job's resource series",
    ),
    Permission(
        "", "events", ("list", "watch"), "namespaced", "why a pod cannot start (scheduling, image pulls)"
    ),
)


# Every right, for the docs and the tests.
PERMISSIONS = CLUSTER_PERMISSIONS + TENANT_PERMISSIONS


def permissions(part: Part) -> tuple[Permission, ...]:
    """The rights of one part: the cluster-wide ones, the tenant ones (per user, bound
    in each namespace the service made), or the shared namespace's Role (the same)."""
    return CLUSTER_PERMISSIONS if part == "cluster" else TENANT_PERMISSIONS


def allowed(
    verb: str,
    group: str,
    resource: str,
    namespaced: bool,
    mode: Mode,
    name: str | None = None,
    tenant_role: str = TENANT_ROLE,
) -> bool:
    """Whether a request the service made is within its rights in `mode`.

    `namespaced` says whether the request named a namespace (`/namespaces/<ns>/pods`)
    or not (`/namespaces`, or `/pods` across every namespace); `name` the object, for a
    right limited to some (`bind` on the tenant role). Nothing namespaced is listed or
    watched across namespaces, in either mode: the tenant rights hold only in a namespace
    (a RoleBinding there, or the shared namespace's Role)."""
    parts: tuple[Part, ...] = ("cluster", "tenant") if mode == "per-user" else ("shared",)
    for part in parts:
        for permission in permissions(part):
            if (permission.group, permission.resource) != (group, resource) or verb not in permission.verbs:
                continue
            if permission.names:
                wanted = {tenant_role if n == TENANT_ROLE else n for n in permission.names}
                if name not in wanted:
                    continue
            if permission.scope == "cluster":
                return not namespaced
            return namespaced
    return False


def policy_rules(part: Part, tenant_role: str = TENANT_ROLE) -> list[dict[str, Any]]:
    """The rules of one part, one per resource, in the order of its list."""
    rules = []
    for p in permissions(part):
        rule: dict[str, Any] = {"apiGroups": [p.group], "resources": [p.resource]}
        if p.names:
            rule["resourceNames"] = [tenant_role if n == TENANT_ROLE else n for n in p.names]
        rule["verbs"] = list(p.verbs)
        rules.append(rule)
    return rules


def role(
    part: Part, name: str, namespace: str | None = None, tenant_role: str = TENANT_ROLE
) -> dict[str, Any]:
    """The whole ClusterRole (the cluster and tenant parts) or Role in `namespace` (shared)."""
    labels = {names.MANAGED_BY: names.MANAGER}
    if part != "shared":
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name, "labels": labels},
            "rules": policy_rules(part, tenant_role),
        }
    if namespace is None:
        raise ValueError("a shared mode Role needs the namespace")
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "rules": policy_rules(part),
    }


# -- One leader (docs/kubernetes.md): the Lease the jobs replicas elect the acting one by,
# in the release's namespace. A Role of its own there (files/rbac/jobs-leader.yaml), in
# both modes; the chart puts the Lease's name where LEASE_NAME stands.

LEASE_NAME = "LEASE_NAME"


@dataclass(frozen=True)
class LeasePermission:
    """Verbs on leases; `named`: only on the one Lease (RBAC's resourceNames)."""

    verbs: tuple[str, ...]
    named: bool
    why: str


LEADER_PERMISSIONS: tuple[LeasePermission, ...] = (
    LeasePermission(
        ("create",),
        False,
        "the Lease, made by the first replica that starts (RBAC cannot limit create by name)",
    ),
    LeasePermission(
        ("get", "update", "patch"),
        True,
        "the Lease alone: read by every replica, renewed by its holder, taken over by a follower",
    ),
)


def leader_rules(lease: str = LEASE_NAME) -> list[dict[str, Any]]:
    """The rules of the jobs service's Role for its Lease named `lease`."""
    rules: list[dict[str, Any]] = []
    for p in LEADER_PERMISSIONS:
        rule: dict[str, Any] = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"]}
        if p.named:
            rule["resourceNames"] = [lease]
        rules.append({**rule, "verbs": list(p.verbs)})
    return rules
