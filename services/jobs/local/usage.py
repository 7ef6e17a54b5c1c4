"""What a local job's running workers use now: their cgroups, and nvidia-smi for their GPUs.

A tick costs a handful of reads per worker (cgroups.Hierarchy.stats) and, only where some
running worker holds a GPU, one `nvidia-smi` for all of them. CPU cores are the CPU time
a worker's group used since the previous tick over the wall time between the two; a
worker seen for the first time (or restarted into a fresh group) has none yet.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterable, Mapping

import structlog

from ..backend import JobUsage, WorkerUsage
from .plan import Plan

log = structlog.get_logger(__name__)

NVIDIA_QUERY = ["--query-gpu=index,utilization.gpu,memory.used", "--format=csv,noheader,nounits"]
NVIDIA_TIMEOUT = 10.0


def parse_nvidia_smi(text: str) -> dict[str, tuple[float | None, int | None]]:
    """`nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader,nounits`
    as {index: (utilisation %, memory used in bytes)}; `[N/A]` (a GPU that does not say) is None."""
    gpus: dict[str, tuple[float | None, int | None]] = {}
    for line in text.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        gpus[parts[0]] = (_number(parts[1]), None if (mib := _number(parts[2])) is None else int(mib * 2**20))
    return gpus


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def gpu_figures(
    devices: Iterable[str], gpus: Mapping[str, tuple[float | None, int | None]]
) -> tuple[float | None, int | None]:
    """A worker's GPU utilisation (the mean over its devices) and memory (the sum)."""
    seen = [gpus[d] for d in devices if d in gpus]
    utils = [u for u, _ in seen if u is not None]
    memory = [m for _, m in seen if m is not None]
    return (sum(utils) / len(utils) if utils else None, sum(memory) if memory else None)


async def query_gpus() -> dict[str, tuple[float | None, int | None]]:
    """Every GPU's figures now, from one nvidia-smi; {} where it is missing or fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {}
    try:
        proc = await asyncio.create_subprocess_exec(
            smi, *NVIDIA_QUERY, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
        )
    except OSError as exc:
        log.warning("nvidia_smi_failed", error=str(exc))
        return {}
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), NVIDIA_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        log.warning("nvidia_smi_timed_out", seconds=NVIDIA_TIMEOUT)
        return {}
    if proc.returncode != 0:
        log.warning("nvidia_smi_failed", code=proc.returncode)
        return {}
    return parse_nvidia_smi(out.decode("utf-8", "replace"))


class UsageReader:
    """Reads running workers' cgroups, remembering each one's CPU time for the next tick."""

    def __init__(self) -> None:
        self._cpu: dict[tuple[str, str], tuple[int, float]] = {}  # (job id, worker): (ns, monotonic)

    async def read(self, jobs: Mapping[str, tuple[Plan, set[str]]]) -> dict[str, JobUsage]:
        """By job id: what the `running` workers of each job's plan use."""
        wants_gpus = any(
            w.devices for plan, running in jobs.values() for w in plan.workers if w.name in running
        )
        gpus = await query_gpus() if wants_gpus else {}
        now = time.monotonic()
        return {
            job_id: self._job(job_id, plan, running, gpus, now) for job_id, (plan, running) in jobs.items()
        }

    def _job(
        self,
        job_id: str,
        plan: Plan,
        running: set[str],
        gpus: Mapping[str, tuple[float | None, int | None]],
        now: float,
    ) -> JobUsage:
        if plan.cgroups is None:
            return JobUsage(available=False, reason=NO_CGROUPS)
        hierarchy = plan.cgroups.hierarchy()
        workers = []
        for worker in plan.workers:
            if worker.name not in running:
                continue
            stats = hierarchy.stats(plan.cgroups.group_of(worker.name))
            if stats is None:
                continue  # between runs: its group went with the last one
            key = (job_id, worker.name)
            cores = None
            before = self._cpu.get(key)
            if stats.cpu_ns is not None:
                if before is not None and stats.cpu_ns >= before[0] and now > before[1]:
                    cores = (stats.cpu_ns - before[0]) / 1e9 / (now - before[1])
                self._cpu[key] = (stats.cpu_ns, now)
            gpu_util, gpu_memory = gpu_figures(worker.devices, gpus) if worker.devices else (None, None)
            workers.append(
                WorkerUsage(
                    worker.name,
                    cpu_cores=cores,
                    memory_bytes=stats.memory_bytes,
                    memory_limit_bytes=stats.memory_limit_bytes or worker.memory_bytes,
                    gpu_utilization=gpu_util,
                    gpu_memory_bytes=gpu_memory,
                )
            )
        return JobUsage(tuple(workers))

    def forget(self, job_id: str) -> None:
        for key in [k for k in self._cpu if k[0] == job_id]:
            del self._cpu[key]


NO_CGROUPS = (
    "not available on this machine: the jobs service makes no cgroups here "
    "(jobs.limits is off, or it may not make groups)"
)
