"""What the fake API server knows about Kubernetes objects: the resources it serves, its
errors (as `Status` objects), names and labels it validates, selectors, and patches."""

from __future__ import annotations

import copy
import datetime
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class Resource:
    """One served resource, as discovery describes it."""

    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool
    subresources: tuple[str, ...] = ()
    # Field selectors the real server accepts besides metadata.name and metadata.namespace;
    # any other field is refused there, so it is refused here too.
    fields: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def has_status(self) -> bool:
        """Whether `status` is a subresource: a write to the object leaves it unchanged."""
        return "status" in self.subresources


_POD_FIELDS = (
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
)
_EVENT_FIELDS = (
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
)

RESOURCES = (
    Resource("", "v1", "namespaces", "Namespace", False, ("status",), ("status.phase",)),
    Resource("", "v1", "nodes", "Node", False, ("status",), ("spec.unschedulable",)),
    Resource("", "v1", "pods", "Pod", True, ("status", "log"), _POD_FIELDS),
    Resource("", "v1", "services", "Service", True, ("status",)),
    Resource("", "v1", "configmaps", "ConfigMap", True),
    Resource("", "v1", "secrets", "Secret", True, (), ("type",)),
    Resource("", "v1", "resourcequotas", "ResourceQuota", True, ("status",)),
    Resource("", "v1", "limitranges", "LimitRange", True),
    Resource("", "v1", "events", "Event", True, (), _EVENT_FIELDS),
    Resource("apps", "v1", "statefulsets", "StatefulSet", True, ("status",)),
    Resource("batch", "v1", "jobs", "Job", True, ("status",), ("status.successful",)),
    Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True),
    # Stored and served, nothing more (no controller acts on them): what the Helm chart
    # installs besides the kinds above (tests/unit/test_helm_chart.py).
    Resource("", "v1", "serviceaccounts", "ServiceAccount", True),
    Resource("apps", "v1", "deployments", "Deployment", True, ("status",)),
    Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ("status",)),
    Resource("networking.k8s.io", "v1", "ingresses", "Ingress", True, ("status",)),
    Resource("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    Resource("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
)
BY_PLURAL = {r.plural: r for r in RESOURCES}
BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCES}
GROUP_VERSIONS = sorted({(r.group, r.version) for r in RESOURCES})

NAMESPACES = BY_PLURAL["namespaces"]
NODES = BY_PLURAL["nodes"]
PODS = BY_PLURAL["pods"]
EVENTS = BY_PLURAL["events"]
QUOTAS = BY_PLURAL["resourcequotas"]
JOBS = BY_PLURAL["jobs"]
STATEFULSETS = BY_PLURAL["statefulsets"]


class KubeError(Exception):
    """A failure the API server answers with a `Status` object."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def status(self) -> Obj:
        return status_object(self.code, self.reason, self.message, self.details)


def status_object(code: int, reason: str, message: str, details: Obj | None = None) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details or {},
        "code": code,
    }


def not_found(resource: Resource, name: str) -> KubeError:
    return KubeError(
        404,
        "NotFound",
        f'{qualified(resource)} "{name}" not found',
        {"name": name, "group": resource.group, "kind": resource.plural},
    )


def qualified(resource: Resource) -> str:
    """How the real server names a resource in messages: `pods`, `jobs.batch`."""
    return f"{resource.plural}.{resource.group}" if resource.group else resource.plural


def invalid(resource: Resource, name: str, field: str, message: str) -> KubeError:
    return KubeError(
        422,
        "Invalid",
        f'{resource.kind} "{name}" is invalid: {field}: {message}',
        {
            "name": name,
            "group": resource.group,
            "kind": resource.kind,
            "causes": [{"reason": "FieldValueInvalid", "message": message, "field": field}],
        },
    )


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def timestamp(when: datetime.datetime | None = None) -> str:
    """metav1.Time: RFC 3339 to the second."""
    return (when or now()).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_timestamp(when: datetime.datetime | None = None) -> str:
    """metav1.MicroTime, as in an Event's eventTime."""
    return (when or now()).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def nano_timestamp(when: datetime.datetime) -> str:
    """RFC3339Nano, as the kubelet prefixes log lines with `timestamps=true`."""
    return when.strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


def parse_timestamp(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


# Names and labels, validated as the real server does: a backend that builds a bad name
# must fail here as it would there.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# Namespaces and services are DNS labels; the rest of what is served are subdomains.
_LABEL_NAMED = {"namespaces", "services"}


def validate_name(resource: Resource, name: str) -> None:
    if resource.plural in _LABEL_NAMED:
        if len(name) > 63 or not _DNS_LABEL.match(name):
            raise invalid(
                resource,
                name,
                "metadata.name",
                "a lowercase RFC 1123 label must consist of "
                "lower case alphanumeric characters or '-', at most 63 characters",
            )
    elif len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise invalid(
            resource,
            name,
            "metadata.name",
            "a lowercase RFC 1123 subdomain must consist of "
            "lower case alphanumeric characters, '-' or '.', at most 253 characters",
        )


def validate_labels(resource: Resource, name: str, labels: Obj, field: str = "metadata.labels") -> None:
    for key, value in labels.items():
        prefix, _, label = key.rpartition("/")
        if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
            raise invalid(resource, name, field, f"Invalid value: {key!r}: prefix must be a DNS subdomain")
        if len(label) > 63 or not _LABEL_NAME.match(label):
            raise invalid(
                resource,
                name,
                field,
                f"Invalid value: {key!r}: name part must be at most 63 "
                "alphanumeric characters, '-', '_' or '.', starting and ending alphanumeric",
            )
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            raise invalid(
                resource,
                name,
                field,
                f"Invalid value: {value!r}: a valid label must be at most "
                "63 alphanumeric characters, '-', '_' or '.', starting and ending alphanumeric",
            )


# Selectors.
Predicate = Callable[[Obj], bool]


def _split_terms(text: str) -> list[str]:
    """Comma-separated terms, where commas inside `in (a,b)` belong to the term."""
    terms, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return [t.strip() for t in terms if t.strip()]


_SET_TERM = re.compile(r"^(\S+)\s+(in|notin)\s+\(([^)]*)\)$")
_EQUALITY_TERM = re.compile(r"^([^!=\s]+)\s*(==|=|!=)\s*(\S*)$")


def label_selector(text: str | None) -> Predicate:
    """A predicate on objects for a `labelSelector`: `a=b`, `a==b`, `a!=b`, `a`, `!a`,
    `a in (x,y)`, `a notin (x)`, joined by commas. `!=` and `notin` match objects without
    the label, as in Kubernetes. A term that does not parse is a 400, as there."""
    # Each term as (key, present, values): with values, whether the label's value is among
    # them (a missing label is not); without, whether the label is there at all.
    terms: list[tuple[str, bool, frozenset[str] | None]] = []
    for term in _split_terms(text or ""):
        if m := _SET_TERM.match(term):
            values = frozenset(v.strip() for v in m[3].split(",") if v.strip())
            terms.append((m[1], m[2] == "in", values))
        elif m := _EQUALITY_TERM.match(term):
            terms.append((m[1], m[2] != "!=", frozenset([m[3]])))
        elif term.startswith("!") and _LABEL_NAME.match(term[1:].rpartition("/")[2]):
            terms.append((term[1:], False, None))
        elif _LABEL_NAME.match(term.rpartition("/")[2]):
            terms.append((term, True, None))
        else:
            raise KubeError(400, "BadRequest", f"unable to parse requirement: {term!r}")

    def matches(obj: Obj) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(
            (key in labels if values is None else labels.get(key) in values) == wanted
            for key, wanted, values in terms
        )

    return matches


def field_value(obj: Obj, path: str) -> str:
    """A field as a field selector compares it: a string, "" when absent."""
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if path == "source" and isinstance(value, dict):
        value = value.get("component")
    if isinstance(value, bool):
        return str(value).lower()
    return "" if value is None else str(value)


def field_selector(resource: Resource, text: str | None) -> Predicate:
    """A predicate for a `fieldSelector` of `=`, `==` and `!=` terms on the fields the real
    server supports for `resource`."""
    terms: list[tuple[str, bool, str]] = []  # (field, equal, value)
    for term in _split_terms(text or ""):
        m = _EQUALITY_TERM.match(term)
        if not m:
            raise KubeError(400, "BadRequest", f"invalid field selector: {term!r}")
        if m[1] not in ("metadata.name", "metadata.namespace", *resource.fields):
            raise KubeError(400, "BadRequest", f'field label not supported: "{m[1]}"')
        terms.append((m[1], m[2] != "!=", m[3]))

    def matches(obj: Obj) -> bool:
        return all((field_value(obj, path) == value) == equal for path, equal, value in terms)

    return matches


# Patches.
def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch. Strategic merge patches are applied this way too, so lists
    (containers, env, ownerReferences) are replaced whole rather than merged by key."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise KubeError(422, "Invalid", f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node, parts[-1]


def json_patch(doc: Obj, operations: list[Any]) -> Obj:
    """RFC 6902 JSON patch: add, remove, replace, move, copy and test."""
    doc = copy.deepcopy(doc)
    try:
        for op in operations:
            kind, parts = op["op"], _pointer(op["path"])
            if kind in ("move", "copy"):
                source, key = _parent(doc, _pointer(op["from"]))
                value = source[int(key)] if isinstance(source, list) else source[key]
                if kind == "move":
                    del source[int(key) if isinstance(source, list) else key]
                kind, op = "add", {"value": copy.deepcopy(value)}
            if not parts:
                raise KubeError(422, "Invalid", "a JSON patch may not replace the whole object")
            node, key = _parent(doc, parts)
            if kind == "add" and isinstance(node, list):
                node.insert(len(node) if key == "-" else int(key), op["value"])
            elif kind in ("add", "replace"):
                if kind == "replace" and (
                    key not in node if isinstance(node, dict) else int(key) >= len(node)
                ):
                    raise KubeError(422, "Invalid", f"replace operation does not apply: {key!r} is missing")
                node[int(key) if isinstance(node, list) else key] = op["value"]
            elif kind == "remove":
                del node[int(key) if isinstance(node, list) else key]
            elif kind == "test":
                if (node[int(key)] if isinstance(node, list) else node.get(key)) != op["value"]:
                    raise KubeError(422, "Invalid", f"test operation failed at {op['path']!r}")
            else:
                raise KubeError(422, "Invalid", f"unknown JSON patch operation {kind!r}")
    except (KeyError, IndexError, ValueError, TypeError) as e:
        raise KubeError(422, "Invalid", f"the JSON patch does not apply: {e!r}") from e
    return doc


def owner_reference(owner: Obj, resource: Resource) -> Obj:
    """The controller reference that a controller puts on what it creates."""
    return {
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def controller_uid(obj: Obj) -> str | None:
    for ref in obj["metadata"].get("ownerReferences") or ():
        if ref.get("controller"):
            return str(ref["uid"])
    return None


def condition(obj: Obj, kind: str) -> Obj | None:
    for cond in obj.get("status", {}).get("conditions") or ():
        if cond.get("type") == kind:
            return dict(cond)
    return None
