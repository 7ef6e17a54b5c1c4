"""ResourceQuota admission of pods, with Kubernetes quantities (`500m`, `2`, `1Gi`, `1e3`).

kubernetes_asyncio has no quantity parser (the sync client's `utils.quantity` was not
ported), and paddlecloud.common.quantity belongs to the code under test: a fake that
shared its parser would share its bugs. So a short, independent one lives here. Usage
counts the pods of the namespace that have not terminated, as the real evaluator does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation

from kube_fake.resources import KubeError, Obj

_SUFFIXES = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
    "P": Decimal("1e15"), "E": Decimal("1e18"),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}  # fmt: skip
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:([eE][+-]?[0-9]+)|([a-zA-Z]*))$")


def parse_quantity(text: str | int | float) -> Decimal:
    """The value of a Kubernetes quantity; ValueError for a malformed one."""
    m = _QUANTITY.match(str(text).strip())
    if not m or (m[3] is not None and m[3] not in _SUFFIXES):
        raise ValueError(f"quantities must match the regular expression of Kubernetes: {text!r}")
    try:
        number = Decimal(m[1])
    except InvalidOperation as e:
        raise ValueError(f"bad quantity {text!r}") from e
    return number * Decimal(10) ** int(m[2][1:]) if m[2] else number * _SUFFIXES[m[3] or ""]


def format_quantity(value: Decimal, resource: str) -> str:
    """A quantity as the quota messages print it: binary suffixes for memory, millis for cpu."""
    if "memory" in resource or "storage" in resource:
        for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
            if value >= _SUFFIXES[suffix] and value % _SUFFIXES[suffix] == 0:
                return f"{value // _SUFFIXES[suffix]}{suffix}"
    if value == value.to_integral_value():
        return str(int(value))
    return f"{int(value * 1000)}m"


# Quota names that count requests: the bare forms are the same as requests.*.
_ALIASES = {
    "cpu": "requests.cpu",
    "memory": "requests.memory",
    "ephemeral-storage": "requests.ephemeral-storage",
}
# For these a pod that does not say its own value is refused outright.
_MUST_SPECIFY = ("requests.cpu", "requests.memory", "limits.cpu", "limits.memory")


def canonical(name: str) -> str:
    return _ALIASES.get(name, name)


def pod_usage(pod: Obj) -> dict[str, Decimal]:
    """What a pod counts against quotas: the sum over its containers, or the largest init
    container where that is more, of every request and limit, and `pods` = 1."""
    usage: dict[str, Decimal] = {"pods": Decimal(1)}
    spec = pod.get("spec", {})
    totals: dict[str, Decimal] = {}
    for container in spec.get("containers") or ():
        for name, value in _container_amounts(container).items():
            totals[name] = totals.get(name, Decimal(0)) + value
    for container in spec.get("initContainers") or ():
        for name, value in _container_amounts(container).items():
            totals[name] = max(totals.get(name, Decimal(0)), value)
    usage.update(totals)
    return usage


def _container_amounts(container: Obj) -> dict[str, Decimal]:
    resources = container.get("resources") or {}
    amounts = {}
    for kind in ("requests", "limits"):
        for name, value in (resources.get(kind) or {}).items():
            amounts[f"{kind}.{name}"] = parse_quantity(value)
    return amounts


def is_terminated(pod: Obj) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed")


def quota_used(pods: Iterable[Obj], hard: Iterable[str]) -> dict[str, Decimal]:
    """A quota's `status.used`: the usage of the namespace's non-terminated pods."""
    used = {canonical(name): Decimal(0) for name in hard}
    for pod in pods:
        if is_terminated(pod):
            continue
        for name, value in pod_usage(pod).items():
            if name in used:
                used[name] += value
    return used


def admit(pod: Obj, quotas: Iterable[Obj], pods: Iterable[Obj]) -> None:
    """Refuse `pod` with a 403, worded as the real admission plugin words it, if it would
    take any quota of its namespace past its `spec.hard`."""
    name = pod["metadata"]["name"]
    usage = pod_usage(pod)
    pods = list(pods)
    for quota in sorted(quotas, key=lambda q: q["metadata"]["name"]):
        qname = quota["metadata"]["name"]
        hard = {canonical(k): parse_quantity(v) for k, v in (quota.get("spec", {}).get("hard") or {}).items()}
        missing = [r for r in _MUST_SPECIFY if r in hard and not _specifies(pod, r)]
        if missing:
            what = "; ".join(f"{r} for: {','.join(_unspecified(pod, r))}" for r in missing)
            raise KubeError(
                403, "Forbidden", f'pods "{name}" is forbidden: failed quota: {qname}: must specify {what}'
            )
        used = quota_used(pods, hard)
        over = sorted(r for r in hard if r in usage and used[r] + usage[r] > hard[r])
        if over:

            def listing(values: dict[str, Decimal], over: list[str] = over) -> str:
                return ",".join(f"{r}={format_quantity(values[r], r)}" for r in over)

            raise KubeError(
                403,
                "Forbidden",
                f'pods "{name}" is forbidden: exceeded quota: {qname}, requested: {listing(usage)}, '
                f"used: {listing(used)}, limited: {listing(hard)}",
            )


def _unspecified(pod: Obj, resource: str) -> list[str]:
    kind, _, name = resource.partition(".")
    return [
        c["name"]
        for c in pod["spec"].get("containers") or ()
        if name not in ((c.get("resources") or {}).get(kind) or {})
    ]


def _specifies(pod: Obj, resource: str) -> bool:
    return not _unspecified(pod, resource)
