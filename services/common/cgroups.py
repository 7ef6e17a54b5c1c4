"""Per-worker resource limits with cgroups, on either hierarchy.

Each worker gets its own group, `<parent>/<job id>/<worker>`, made by the supervisor
before the worker starts and removed after it ends; the worker's launcher joins it in
the child between fork and exec, so everything the worker runs is charged to it from
its first instruction and nothing else is.

- **v2** (the unified hierarchy, with controllers; most current hosts): `memory.max`
  (and `memory.swap.max` 0, so a limit cannot be dodged into swap), `cpu.max`
  (`quota period`), `pids.max`; out-of-memory kills are counted in `memory.events`,
  the peak in `memory.peak`. The controllers are enabled down the path through
  `cgroup.subtree_control`.
- **v1** (one hierarchy per controller, as on these machines): `memory.limit_in_bytes`
  (and `memory.memsw.limit_in_bytes` where swap is accounted), `cpu.cfs_quota_us` over
  `cpu.cfs_period_us`, `pids.max`; kills are counted by `oom_kill` in
  `memory.oom_control`, the peak in `memory.max_usage_in_bytes`.

`detect` tells which one this machine offers to this process (root, or a delegated
subtree) and None where neither can be used: limits are then advisory.

`Hierarchy.stats` reads what a running worker's group uses now, for the jobs service's
resource series (docs/metrics.md, §1): CPU time (v2 `cpu.stat` usage_usec; v1
`cpuacct.usage`, from a cpuacct group made beside the others where that controller has
a mount of its own, as on these machines), the working set (usage less
`inactive_file`, what `docker stats` and the kubelet show: the page cache the kernel
may drop is not counted against the limit the user sees) and the memory limit.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog

log = structlog.get_logger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
V1_CONTROLLERS = ("memory", "cpu", "pids")
# Where v1 mounts cpuacct apart from cpu, a worker gets a group there too: it is what
# counts the CPU time a worker used (v1's cpu controller only throttles).
V1_CPUACCT = "cpuacct"
# What v1 reports as the limit of a group without one (PAGE_COUNTER_MAX pages).
V1_NO_LIMIT = 2**62


@dataclass(frozen=True)
class Limits:
    """What one worker may use. None: no limit on that resource."""

    memory_bytes: int | None = None
    cpu_milli: int | None = None
    pids: int | None = None


@dataclass(frozen=True)
class Usage:
    """What a worker's group recorded about its memory, read after it ended."""

    oom_kills: int
    peak_bytes: int | None
    limit_bytes: int | None


@dataclass(frozen=True)
class Stats:
    """What a running worker's group uses now; None where the kernel does not say."""

    cpu_ns: int | None  # CPU time used since the group was made, in nanoseconds
    memory_bytes: int | None  # the working set: usage less inactive_file
    memory_limit_bytes: int | None


@dataclass(frozen=True)
class Hierarchy:
    """Where this machine's cgroups are and which version; `parent` is our subtree's name."""

    version: Literal[1, 2]
    root: Path = CGROUP_ROOT
    parent: str = "paddlecloud"

    def describe(self) -> str:
        return f"cgroup v{self.version} under {self.root}"

    def groups(self, relative: str) -> list[Path]:
        """The directories of one group: one per controller on v1, one on v2."""
        if self.version == 2:
            return [self.root / self.parent / relative]
        groups = [self.root / controller / self.parent / relative for controller in V1_CONTROLLERS]
        if _separate_cpuacct(self.root):
            groups.append(self.root / V1_CPUACCT / self.parent / relative)
        return groups

    def create(self, relative: str, limits: Limits) -> list[Path]:
        """Make the group `<parent>/<relative>` with `limits`; its directories, for the
        launcher to join. OSError if the kernel refuses."""
        if self.version == 2:
            group = self.root / self.parent / relative
            # Controllers must be enabled in every ancestor's subtree_control, from the top.
            top = self.root / self.parent
            chain = [self.root, top, *(top / p for p in _prefixes(relative))]
            for ancestor in chain[:-1]:
                ancestor.mkdir(exist_ok=True)
                _enable_controllers(ancestor)
            group.mkdir(parents=True, exist_ok=True)
            if limits.memory_bytes is not None:
                _write(group / "memory.max", str(limits.memory_bytes))
                with contextlib.suppress(FileNotFoundError):
                    _write(group / "memory.swap.max", "0")
            if limits.cpu_milli is not None:
                _write(group / "cpu.max", f"{limits.cpu_milli * CPU_PERIOD_US // 1000} {CPU_PERIOD_US}")
            if limits.pids is not None:
                _write(group / "pids.max", str(limits.pids))
            return [group]
        groups = self.groups(relative)
        memory, cpu, pids = groups[:3]
        for group in groups:
            group.mkdir(parents=True, exist_ok=True)
        if limits.memory_bytes is not None:
            _write(memory / "memory.limit_in_bytes", str(limits.memory_bytes))
            with contextlib.suppress(FileNotFoundError, PermissionError):
                _write(memory / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
        if limits.cpu_milli is not None:
            _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(cpu / "cpu.cfs_quota_us", str(max(limits.cpu_milli * CPU_PERIOD_US // 1000, 1000)))
        if limits.pids is not None:
            _write(pids / "pids.max", str(limits.pids))
        return groups

    def stats(self, relative: str) -> Stats | None:
        """What the group uses now; None where it is gone (its worker is not running).

        The group's directories and files are the kernel's, made by root and writable only
        by root (a worker is never given its group), so a user cannot put a link in their
        place; each is still opened beneath a directory descriptor with O_NOFOLLOW, so the
        reads stay a handful of small syscalls and never leave the group.
        """
        groups = self.groups(relative)
        if self.version == 2:
            with _Group.open(groups[0]) as group:
                if group is None:
                    return None
                current = group.number("memory.current")
                inactive = group.keyed("memory.stat").get("inactive_file", 0)
                usec = group.keyed("cpu.stat").get("usage_usec")
                return Stats(
                    None if usec is None else usec * 1000,
                    None if current is None else max(current - inactive, 0),
                    group.number("memory.max"),
                )
        with _Group.open(groups[0]) as memory:
            if memory is None:
                return None
            usage = memory.number("memory.usage_in_bytes")
            stat = memory.keyed("memory.stat")
            inactive = stat.get("total_inactive_file", stat.get("inactive_file", 0))
            limit = memory.number("memory.limit_in_bytes")
        # cpuacct's own group where it has a mount of its own, else the cpu group (`cpu,cpuacct`).
        with _Group.open(groups[3] if len(groups) > 3 else groups[1]) as cpuacct:
            cpu_ns = None if cpuacct is None else cpuacct.number("cpuacct.usage")
        return Stats(
            cpu_ns,
            None if usage is None else max(usage - inactive, 0),
            None if limit is None or limit >= V1_NO_LIMIT else limit,
        )

    def usage(self, relative: str) -> Usage:
        """The group's out-of-memory kills and memory peak (0 and None where unreadable)."""
        group = self.groups(relative)[0]
        if self.version == 2:
            events = _keyed(group / "memory.events")
            return Usage(events.get("oom_kill", 0), _int(group / "memory.peak"), _int(group / "memory.max"))
        control = _keyed(group / "memory.oom_control")
        return Usage(
            control.get("oom_kill", 0),
            _int(group / "memory.max_usage_in_bytes"),
            _int(group / "memory.limit_in_bytes"),
        )

    def remove(self, relative: str, *, timeout: float = 2.0) -> None:
        """Remove the group once its processes are gone (the kernel refuses before: EBUSY)."""
        deadline = time.monotonic() + timeout
        for group in self.groups(relative):
            while True:
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        log.warning("cgroup_not_removed", group=str(group), error=exc.strerror)
                        break
                    time.sleep(0.02)
            # The job's own level goes with its last worker.
            with contextlib.suppress(OSError):
                group.parent.rmdir()


def detect(root: Path = CGROUP_ROOT, parent: str = "paddlecloud") -> Hierarchy | None:
    """The hierarchy this process may make limited groups in, or None.

    v2 where the unified hierarchy has the memory, cpu and pids controllers; else v1
    where each of them has its own mount. Either way a test group is made and removed,
    so a read-only or undelegated hierarchy counts as none.
    """
    controllers = _read(root / "cgroup.controllers")
    if controllers is not None and {"memory", "cpu", "pids"} <= set(controllers.split()):
        candidate = Hierarchy(2, root, parent)
    elif all((root / c / "cgroup.procs").exists() for c in V1_CONTROLLERS):
        candidate = Hierarchy(1, root, parent)
    else:
        return None
    probe = f"probe-{os.getpid()}"
    try:
        candidate.create(probe, Limits())
    except OSError as exc:
        log.debug("cgroups_unusable", hierarchy=candidate.describe(), error=exc.strerror)
        return None
    finally:
        with contextlib.suppress(OSError):
            for group in candidate.groups(probe):
                group.rmdir()
    return candidate


def join(groups: list[str]) -> None:
    """Move the calling process into each of `groups` (directories)."""
    for group in groups:
        _write(Path(group) / "cgroup.procs", "0")


@functools.cache
def _separate_cpuacct(root: Path) -> bool:
    """Whether v1 mounts cpuacct on its own (not as `cpu,cpuacct`, where the cpu group has it)."""
    cpuacct, cpu = root / V1_CPUACCT, root / "cpu"
    try:
        return (cpuacct / "cpuacct.usage").exists() and not os.path.samefile(cpuacct, cpu)
    except OSError:
        return False


class _Group:
    """One group's directory, held open: its files are read beneath it with O_NOFOLLOW."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    @contextlib.contextmanager
    def open(cls, path: Path) -> Iterator[_Group | None]:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            yield None
            return
        try:
            yield cls(fd)
        finally:
            os.close(fd)

    def read(self, name: str) -> str | None:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._fd)
        except OSError:
            return None
        try:
            return os.read(fd, 65536).decode("ascii", "replace")
        except OSError:
            return None
        finally:
            os.close(fd)

    def number(self, name: str) -> int | None:
        text = self.read(name)
        try:
            return None if text is None or text.strip() == "max" else int(text.strip())
        except ValueError:
            return None

    def keyed(self, name: str) -> dict[str, int]:
        return _keyed_text(self.read(name) or "")


def _prefixes(relative: str) -> list[str]:
    parts = Path(relative).parts
    return [str(Path(*parts[: n + 1])) for n in range(len(parts))]


def _enable_controllers(group: Path) -> None:
    wanted = {"memory", "cpu", "pids"}
    enabled = set((_read(group / "cgroup.subtree_control") or "").split())
    missing = wanted - enabled
    if missing:
        _write(group / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(missing)))


def _write(path: Path, value: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(value)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii")
    except OSError:
        return None


def _int(path: Path) -> int | None:
    text = _read(path)
    try:
        return None if text is None or text.strip() == "max" else int(text.strip())
    except ValueError:
        return None


def _keyed(path: Path) -> dict[str, int]:
    return _keyed_text(_read(path) or "")


def _keyed_text(text: str) -> dict[str, int]:
    result = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            result[key] = int(value)
    return result
