"""The processes a benchmark measures: finding a server's services, and their CPU time."""

from __future__ import annotations

import os
import resource
from pathlib import Path


def child_pid(parent: int, argument: str, what: str) -> int:
    """The pid of the child of `parent` that has `argument` among its command line's."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if ppid == parent and argument.encode() in cmdline:
            return int(entry.name)
    raise RuntimeError(f"no {what} under pid {parent}")


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) the process has spent itself."""
    fields = [int(f) for f in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:13]]
    return (fields[0] + fields[1]) / os.sysconf("SC_CLK_TCK")


def machine_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot, over all its CPUs."""
    with open("/proc/stat", encoding="ascii") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    """CPU seconds of the children this process has reaped so far."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return children.ru_utime + children.ru_stime
