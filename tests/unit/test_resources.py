"""Resource series: the cgroup readers on a directory laid out as cgroupfs (v1 and v2),
nvidia-smi's answer, and the downsampling that bounds what a job keeps."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

from paddlecloud.common.cgroups import Hierarchy, Limits
from paddlecloud.jobs.backend import PlannedWorker, WorkerUsage
from paddlecloud.jobs.kube.usage import cpu_cores, worker_usage
from paddlecloud.jobs.local.usage import gpu_figures, parse_nvidia_smi
from paddlecloud.jobs.resources import MAX_POINTS, POINT_BYTES, WorkerSeries, finite_since

MiB = 2**20


def v1(tmp_path: Path, *, separate_cpuacct: bool) -> Hierarchy:
    root = tmp_path / "cgroup"
    for controller in ("memory", "cpu", "pids"):
        (root / controller).mkdir(parents=True)
    if separate_cpuacct:  # as on these machines: cpuacct is a hierarchy of its own
        (root / "cpuacct").mkdir()
        (root / "cpuacct" / "cpuacct.usage").write_text("0\n")
    else:  # `cpu,cpuacct` mounted together, `cpuacct` a link to it
        (root / "cpuacct").symlink_to("cpu")
    return Hierarchy(1, root, "paddlecloud")


def test_v1_working_set_limit_and_cpu_time_from_a_separate_cpuacct(tmp_path: Path) -> None:
    h = v1(tmp_path, separate_cpuacct=True)
    groups = h.create("job1/trainer-0", Limits(memory_bytes=512 * MiB))
    assert [g.parent.parent.parent.name for g in groups] == ["memory", "cpu", "pids", "cpuacct"]
    memory, _, _, cpuacct = groups
    (memory / "memory.usage_in_bytes").write_text(f"{300 * MiB}\n")
    # The page cache the kernel may drop (inactive_file) is not what the worker holds.
    (memory / "memory.stat").write_text(
        f"cache {150 * MiB}\ninactive_file {90 * MiB}\ntotal_inactive_file {100 * MiB}\n"
    )
    (cpuacct / "cpuacct.usage").write_text("2500000000\n")
    stats = h.stats("job1/trainer-0")
    assert stats is not None
    assert (stats.cpu_ns, stats.memory_bytes, stats.memory_limit_bytes) == (
        2_500_000_000,
        200 * MiB,
        512 * MiB,
    )
    # No limit: v1 says PAGE_COUNTER_MAX pages.
    (memory / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert h.stats("job1/trainer-0").memory_limit_bytes is None  # type: ignore[union-attr]
    assert h.stats("job1/trainer-9") is None  # not running: no group


def test_v1_cpu_time_from_the_cpu_group_where_cpuacct_shares_its_mount(tmp_path: Path) -> None:
    h = v1(tmp_path, separate_cpuacct=False)
    memory, cpu, _ = h.create("job1/trainer-0", Limits())
    (memory / "memory.usage_in_bytes").write_text("4096\n")
    (cpu / "cpuacct.usage").write_text("7\n")
    assert h.stats("job1/trainer-0").cpu_ns == 7  # type: ignore[union-attr]


def test_v2_working_set_and_cpu_and_no_link_is_followed(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    h = Hierarchy(2, root, "paddlecloud")
    [group] = h.create("job1/trainer-0", Limits(memory_bytes=MiB))
    (group / "memory.current").write_text(f"{10 * MiB}\n")
    (group / "memory.stat").write_text(f"anon {6 * MiB}\nfile {4 * MiB}\ninactive_file {3 * MiB}\n")
    (group / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n")
    stats = h.stats("job1/trainer-0")
    assert stats is not None
    assert (stats.cpu_ns, stats.memory_bytes, stats.memory_limit_bytes) == (1_500_000_000, 7 * MiB, MiB)
    (group / "memory.max").write_text("max\n")
    assert h.stats("job1/trainer-0").memory_limit_bytes is None  # type: ignore[union-attr]
    # A link where a file should be is not read, nor is a linked group.
    secret = tmp_path / "secret"
    secret.write_text("123\n")
    (group / "memory.current").unlink()
    (group / "memory.current").symlink_to(secret)
    assert h.stats("job1/trainer-0").memory_bytes is None  # type: ignore[union-attr]
    os.symlink(group, root / "paddlecloud" / "job1" / "trainer-1")
    assert h.stats("job1/trainer-1") is None


NVIDIA_SMI = """\
0, 87, 30512
1, 0, 3
2, [N/A], [N/A]
"""


def test_nvidia_smi_figures_per_worker() -> None:
    gpus = parse_nvidia_smi(NVIDIA_SMI + "garbage line\n")
    assert gpus == {"0": (87.0, 30512 * MiB), "1": (0.0, 3 * MiB), "2": (None, None)}
    assert gpu_figures(["0", "1"], gpus) == (43.5, 30515 * MiB)  # mean utilisation, summed memory
    assert gpu_figures(["2"], gpus) == (None, None)
    assert gpu_figures(["7"], gpus) == (None, None)  # not listed: unknown, not zero


# Captured from a real H200 (driver's nvidia-smi, the same query) while torch held 4 GiB
# and multiplied matrices on it; and `nvidia-smi -L` there, whose numbering jobs.gpus uses.
H200_BUSY = "0, 100, 5491\n"
H200_LIST = "GPU 0: NVIDIA H200 (UUID: GPU-451d3400-b6da-2214-bbce-6ad2c54a2646)\n"


def test_a_real_nvidia_smi_answer_is_read_with_the_numbering_of_its_list() -> None:
    gpus = parse_nvidia_smi(H200_BUSY)
    assert gpus == {"0": (100.0, 5491 * MiB)}
    index = H200_LIST.split(":", 1)[0].removeprefix("GPU ")  # as gpus.discover numbers them
    assert gpu_figures([index], gpus) == (100.0, 5491 * MiB)


def sample(cpu: float | None, memory: int | None) -> WorkerUsage:
    return WorkerUsage("trainer-0", cpu_cores=cpu, memory_bytes=memory, memory_limit_bytes=2**30)


def test_a_long_series_is_halved_keeping_memory_peaks_and_cpu_means() -> None:
    series = WorkerSeries(interval=5.0)
    count = 5 * MAX_POINTS + 3
    for i in range(count):
        memory = 900 * MiB if i == 1234 else 100 * MiB  # one short spike
        series.add(1795000000.0 + 5 * i, sample(1.0 if i % 2 else 3.0, memory))
    assert 0 < len(series) <= MAX_POINTS and series.step == 8
    assert max(series.columns["memory_bytes"]) == 900 * MiB  # a peak is never averaged away
    assert set(series.columns["cpu_cores"]) == {2.0}  # utilisation is averaged
    times = series.columns["t"]
    assert times == sorted(times) and times[0] == 1795000000.0
    assert all(b - a == 5 * 8 for a, b in itertools.pairwise(times))
    assert series.columns["gpu_utilization"] == [None] * len(series)  # unknown stays unknown
    # The job's end settles what is pending.
    before = len(series)
    series.settle()
    assert len(series) == before + 1 and not series.pending
    assert series.peaks()["memory_bytes"] == 900 * MiB and series.peaks()["memory_limit_bytes"] == 2**30


def test_a_full_series_stays_within_its_stated_bound_in_bytes() -> None:
    # The widest values a worker can report: a TiB of memory, 80 GiB of GPU memory, 9999 cores.
    series = WorkerSeries(interval=5.0, memory_limit_bytes=2**40)
    for i in range(MAX_POINTS - 1):
        usage = WorkerUsage("trainer-0", 9999.123456, 2**40 - 1, 2**40, 99.97, 80 * 2**30 + 1)
        series.add(1795000000.123456 + i, usage)
    assert len(series) == MAX_POINTS - 1  # one more and it halves
    text = series.to_text()
    assert len(text.encode()) <= MAX_POINTS * POINT_BYTES, len(text) / MAX_POINTS
    again = WorkerSeries.from_text(text)
    assert again.columns == series.columns and again.step == 1
    assert json.loads(text)["memory_limit_bytes"] == 2**40


def test_since_answers_only_later_points() -> None:
    series = WorkerSeries(interval=1.0)
    for i in range(4):
        series.add(100.0 + i, sample(0.5, MiB))
    assert series.view(101.0)["t"] == [102.0, 103.0]
    assert series.view(None)["t"] == [100.0, 101.0, 102.0, 103.0]
    assert series.view(200.0)["memory_bytes"] == []
    assert finite_since("1795000000.5") == 1795000000.5 and finite_since(None) is None
    for bad in ("nan", "inf", "-1", "soon"):
        try:
            finite_since(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was taken")


def test_pod_metrics_are_each_workers_sum_over_its_containers() -> None:
    items = [
        {
            "metadata": {"name": "mnist-trainer-0-abcde"},
            "containers": [
                {"name": "trainer", "usage": {"cpu": "1500000000n", "memory": "200Mi"}},
                {"name": "sidecar", "usage": {"cpu": "250m", "memory": "1024Ki"}},
            ],
        },
        {"metadata": {"name": "mnist-pserver-0"}, "containers": [{"usage": {"cpu": "2", "memory": "bad"}}]},
        {"metadata": {"name": "someone-elses"}, "containers": [{"usage": {"cpu": "1", "memory": "1Gi"}}]},
    ]
    pods = {"mnist-trainer-0-abcde": "trainer-0", "mnist-pserver-0": "pserver-0"}
    planned = [
        PlannedWorker("trainer-0", "TRAINER", 0, "1", "2Gi", 0),
        PlannedWorker("pserver-0", "PSERVER", 0, "1", "1Gi", 0),
    ]
    trainer, pserver = worker_usage(items, pods, planned)
    assert trainer == WorkerUsage(
        "trainer-0", cpu_cores=1.75, memory_bytes=201 * MiB, memory_limit_bytes=2**30 * 2
    )
    assert pserver == WorkerUsage("pserver-0", cpu_cores=2.0, memory_bytes=None, memory_limit_bytes=2**30)
    assert [cpu_cores(q) for q in ("12u", "", "x")] == [0.000012, None, None]
