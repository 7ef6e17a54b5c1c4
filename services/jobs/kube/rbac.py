"""What the jobs service may do on the Kubernetes API, written once, as data.

`PERMISSIONS` is the whole list for per-user mode, each entry saying why it is needed;
`permissions("shared")` keeps only what a namespace's Role can grant. `policy_rules`
renders them as the rules of a ClusterRole or Role (the Helm chart renders from it),
`role` as the whole object, and `allowed` answers for one request, so a test can check
every request the backend made against the list.

Least privilege, and what it rules out: no wildcard anywhere; Secrets may be written
but never read or listed (the registry credentials go one way); pods are only watched
and their logs read, never created, exec'ed or attached to (their controllers create
them); nothing that grants rights (`escalate`, `bind`, `impersonate`, RBAC objects).
Children are deleted by the garbage collector when their owner ConfigMap goes, so most
kinds need no `delete`.

Per-user mode needs a ClusterRole bound cluster-wide: the service makes namespaces as
users appear, and granting rights in each one (a RoleBinding) would need `bind`. The
namespaced rights then hold in every namespace; the shared mode confines them to one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from . import names

Mode = Literal["per-user", "shared"]
Scope = Literal["cluster", "namespaced"]

# Verbs that never appear, whatever the entries below say (tests check it).
FORBIDDEN_VERBS = frozenset({"*", "escalate", "bind", "impersonate"})
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


PERMISSIONS: tuple[Permission, ...] = (
    Permission(
        "",
        "namespaces",
        ("get", "create", "patch", "delete"),
        "cluster",
        "a namespace per user, made on first use and deleted with the user",
    ),
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
    Permission("", "services", ("get", "create", "patch"), "namespaced", "the workers' headless Services"),
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
    Permission("", "pods", ("get", "list", "watch"), "namespaced", "per-worker state, hosts, exit codes"),
    Permission("", "pods/log", ("get",), "namespaced", "job logs"),
    Permission(
        "", "events", ("list", "watch"), "namespaced", "why a pod cannot start (scheduling, image pulls)"
    ),
)


def permissions(mode: Mode) -> tuple[Permission, ...]:
    """What the service needs in `mode`: all of PERMISSIONS per user; in shared mode the
    namespaced ones, in the one namespace (an operator made it)."""
    if mode == "per-user":
        return PERMISSIONS
    return tuple(p for p in PERMISSIONS if p.scope == "namespaced")


def allowed(verb: str, group: str, resource: str, namespaced: bool, mode: Mode) -> bool:
    """Whether a request the service made is within its rights in `mode`.

    `namespaced` says whether the request named a namespace (`/namespaces/<ns>/pods`)
    or not (`/namespaces`, or `/pods` across every namespace). Per user, the rights are
    bound cluster-wide, so a namespaced resource may also be listed and watched across
    all namespaces; in shared mode only within the namespace."""
    for permission in permissions(mode):
        if (permission.group, permission.resource) != (group, resource) or verb not in permission.verbs:
            continue
        if permission.scope == "cluster":
            return not namespaced
        return namespaced or (mode == "per-user" and verb in ("list", "watch"))
    return False


def policy_rules(mode: Mode) -> list[dict[str, Any]]:
    """The rules of the service's ClusterRole (per-user) or Role (shared), one per
    resource, in the order of PERMISSIONS."""
    return [
        {"apiGroups": [p.group], "resources": [p.resource], "verbs": list(p.verbs)} for p in permissions(mode)
    ]


def role(mode: Mode, name: str, namespace: str | None = None) -> dict[str, Any]:
    """The whole ClusterRole (per-user mode) or Role in `namespace` (shared mode)."""
    if mode == "per-user":
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name, "labels": {names.MANAGED_BY: names.MANAGER}},
            "rules": policy_rules(mode),
        }
    if namespace is None:
        raise ValueError("a shared mode Role needs the namespace")
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": namespace, "labels": {names.MANAGED_BY: names.MANAGER}},
        "rules": policy_rules(mode),
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
