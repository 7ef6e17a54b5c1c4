"""What the builder service may do on the Kubernetes API (the kaniko backend), as data.

Like the jobs service's list (paddlecloud.jobs.kube.rbac), each entry says why; the Helm
chart renders the builder's Role in the build namespace from `policy_rules()`, and
`allowed` answers for one request, so a test checks every request the backend made.
All of it is namespaced, in `builder.kaniko.namespace` alone: a Role, never a
ClusterRole.

Least privilege: Secrets are created, patched (their owner reference) and deleted, never
read or listed; pods are read and their logs streamed, never created, exec'ed or
attached to (the Job controller creates them); Events are listed, never written;
nothing that grants rights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FORBIDDEN_VERBS = frozenset({"*", "escalate", "bind", "impersonate"})
FORBIDDEN_RESOURCES = frozenset(
    {"*", "pods/exec", "pods/attach", "pods/portforward", "serviceaccounts/token"}
)


@dataclass(frozen=True)
class Permission:
    group: str  # "" is the core group
    resource: str  # with its subresource: "pods/log"
    verbs: tuple[str, ...]
    why: str


PERMISSIONS: tuple[Permission, ...] = (
    Permission(
        "batch",
        "jobs",
        ("get", "list", "create", "delete"),
        "a Job per build; listed after a restart to remove what interrupted builds left",
    ),
    Permission(
        "",
        "configmaps",
        ("create", "patch", "delete"),
        "each build's context (its Dockerfile and requirements.txt), owned by its Job",
    ),
    Permission(
        "",
        "secrets",
        ("create", "patch", "delete"),
        "each build's registry credentials, written and never read back",
    ),
    Permission(
        "batch",
        "jobs/finalizers",
        ("update",),
        "the ConfigMap and Secret block their Job's deletion (OwnerReferencesPermissionEnforcement)",
    ),
    Permission("", "pods", ("get", "list"), "when the executor starts, and how it ended"),
    Permission("", "pods/log", ("get",), "the build log, streamed as it is written"),
    Permission(
        "",
        "events",
        ("list",),
        "the Warning Events of a build's Job: why admission refuses its pod (Pod Security, quota)",
    ),
)


def allowed(verb: str, group: str, resource: str, namespaced: bool) -> bool:
    """Whether a request the builder made is within its Role (in its own namespace)."""
    return namespaced and any(
        (p.group, p.resource) == (group, resource) and verb in p.verbs for p in PERMISSIONS
    )


def policy_rules() -> list[dict[str, Any]]:
    """The rules of the builder's Role, one per resource."""
    return [{"apiGroups": [p.group], "resources": [p.resource], "verbs": list(p.verbs)} for p in PERMISSIONS]


def role(name: str, namespace: str) -> dict[str, Any]:
    """The whole Role in the build namespace."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "paddlecloud"},
        },
        "rules": policy_rules(),
    }
