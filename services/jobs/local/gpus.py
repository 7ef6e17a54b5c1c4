"""The machine's GPUs as a scheduled resource: each trainer gets devices of its own.

The inventory is `jobs.gpus` when configured (a list of device ids, for tests and for
machines where only some GPUs are the platform's), else what `nvidia-smi -L` lists,
else none. A job's trainers each take `gpu` devices, all at once or not at all; the
devices go back when the job is final. Two jobs never hold one device. The holdings are
recorded in each job's backend record, so a restarted service takes them up again.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence

import structlog

log = structlog.get_logger(__name__)

_NVIDIA_LINE = re.compile(r"^GPU (\d+):")


def discover(configured: Sequence[str] | None) -> list[str]:
    """The device ids the platform may hand out."""
    if configured is not None:
        return list(configured)
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("nvidia_smi_failed", error=str(exc))
        return []
    if done.returncode != 0:
        log.warning("nvidia_smi_failed", code=done.returncode, stderr=done.stderr.strip()[:200])
        return []
    return [m.group(1) for line in done.stdout.splitlines() if (m := _NVIDIA_LINE.match(line.strip()))]


class GpuPool:
    """Which job holds which devices."""

    def __init__(self, devices: Sequence[str]) -> None:
        self.devices = list(devices)
        self._held: dict[str, dict[str, list[str]]] = {}  # job id -> worker -> devices

    @property
    def total(self) -> int:
        return len(self.devices)

    def free(self) -> list[str]:
        taken = {d for workers in self._held.values() for ds in workers.values() for d in ds}
        return [d for d in self.devices if d not in taken]

    def refusal(self, per_trainer: int, trainers: int) -> str | None:
        """Why a job asking this can never run here, or None."""
        wanted = per_trainer * trainers
        if wanted == 0:
            return None
        if not self.devices:
            return f"this machine has no GPUs for jobs, and the job asks for {wanted}"
        if wanted > self.total:
            per = f" ({trainers} trainers x {per_trainer})" if trainers > 1 else ""
            return f"the job asks for {wanted} GPUs{per}, and this machine has {self.total}"
        return None

    def take(self, job_id: str, wanted: Mapping[str, int]) -> dict[str, list[str]] | None:
        """Give each worker its number of devices, or None (and nothing) if too few are free."""
        if job_id in self._held:
            return self._held[job_id]
        free = self.free()
        if sum(wanted.values()) > len(free):
            return None
        given: dict[str, list[str]] = {}
        for worker, count in wanted.items():
            if count:
                given[worker], free = free[:count], free[count:]
        self._held[job_id] = given
        return given

    def hold(self, job_id: str, given: Mapping[str, Sequence[str]]) -> None:
        """Record devices a job already holds (after a restart of the service)."""
        self._held[job_id] = {w: [d for d in ds if d in self.devices] for w, ds in given.items()}

    def release(self, job_id: str) -> None:
        self._held.pop(job_id, None)

    def held_by(self, job_id: str) -> dict[str, list[str]]:
        return dict(self._held.get(job_id, {}))
