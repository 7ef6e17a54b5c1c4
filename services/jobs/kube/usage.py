"""What a job's pods use now, from the metrics API (`metrics.k8s.io/v1beta1` PodMetrics).

metrics-server serves the group through the API server's aggregation layer; a cluster
without it answers 404 for the whole group, and the series then says so in words. The
figures are the kubelet's (cAdvisor's): CPU in cores over its own window, memory as the
working set, the same figure the local backend reads from cgroups. It has no GPU figures.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from paddlecloud.common.quantity import QuantityError, parse_bytes

from ..backend import PlannedWorker, WorkerUsage

NOT_SERVED = "not available on this cluster (no metrics.k8s.io: install metrics-server)"
NOT_ALLOWED = (
    "not available: the jobs service may not read metrics.k8s.io pods "
    "(its ClusterRole needs get and list on them: the chart's has)"
)

_CPU_SUFFIXES = {"n": 1e-9, "u": 1e-6, "m": 1e-3}


def cpu_cores(quantity: Any) -> float | None:
    """A CPU quantity as metrics-server writes it (`12345678n`, `250m`, `2`) in cores."""
    text = str(quantity or "").strip()
    if not text:
        return None
    factor = _CPU_SUFFIXES.get(text[-1], 1.0)
    try:
        return float(text[:-1] if text[-1] in _CPU_SUFFIXES else text) * factor
    except ValueError:
        return None


def memory_bytes(quantity: Any) -> int | None:
    try:
        return parse_bytes(str(quantity)) if quantity is not None else None
    except QuantityError:
        return None


def worker_usage(
    items: Iterable[Mapping[str, Any]], workers_of_pods: Mapping[str, str], planned: Iterable[PlannedWorker]
) -> list[WorkerUsage]:
    """PodMetrics `items` as each worker's usage (the sum over its containers), for the pods
    `workers_of_pods` names (pod name → worker); the limit is the worker's `memory`."""
    limits = {w.name: memory_bytes(w.memory) for w in planned}
    found = []
    for item in items:
        worker = workers_of_pods.get(str((item.get("metadata") or {}).get("name") or ""))
        if worker is not None:
            cpu, memory = _summed(item.get("containers") or ())
            found.append(
                WorkerUsage(worker, cpu_cores=cpu, memory_bytes=memory, memory_limit_bytes=limits.get(worker))
            )
    return found


def _summed(containers: Iterable[Any]) -> tuple[float | None, int | None]:
    """CPU cores and memory over a pod's containers; None where none says."""
    usage = [c.get("usage") or {} for c in containers if isinstance(c, Mapping)]
    cpus = [c for c in (cpu_cores(u.get("cpu")) for u in usage) if c is not None]
    memory = [m for m in (memory_bytes(u.get("memory")) for u in usage) if m is not None]
    return (round(sum(cpus), 3) if cpus else None, sum(memory) if memory else None)
