"""The cost of sampling resource use (docs/metrics.md §1.5): issue 34 asks for no more than
1% CPU on a job of 10 workers.

A real `paddlecloud server` (local backend, real cgroups) runs a job of 10 trainers that
sleep. This process then runs the jobs service's own sampler (`ResourceSampler` over a
`LocalBackend` with the server's config, reading the same job directory and cgroups) for
TICKS ticks back to back, and times its CPU with `time.process_time`: the CPU a tick costs
over the default interval, plus a store write of the 10 series (what the service does every
30 s) over those 30 s, as a percentage of one core. For scale it prints the jobs service
process's own CPU over WINDOW seconds of the same job (its reconcile loop included).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path

from bench import aim
from bench.platform import Platform
from bench.procs import child_pid, cpu_seconds
from paddlecloud import Client, PaddleJob
from paddlecloud.common.config import load_config
from paddlecloud.common.store import open_store
from paddlecloud.common.volume import open_volume
from paddlecloud.jobs.local.backend import LocalBackend
from paddlecloud.jobs.records import JobRecord
from paddlecloud.jobs.resources import FLUSH_SECONDS, ResourceSampler

WORKERS = 10
TICKS = 200
WINDOW = 20.0  # seconds of the jobs service's own CPU, for scale
AIM_PERCENT = 1.0  # of one core, on a job of 10 workers, at the default interval
NAME = "bench-metrics"
SLEEPER = "import time\nprint('up', flush=True)\ntime.sleep(900)\n"


def start_job(platform: Platform, package: Path) -> None:
    with Client(platform.url, "admin", platform.admin_password()) as client:
        PaddleJob(NAME, package=str(package), trainers=WORKERS, cpu="100m", memory="128Mi").submit(client)
        deadline = time.monotonic() + 120
        while True:
            workers = client.workers(NAME)
            if sum(w["state"] == "RUNNING" for w in workers) == WORKERS:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {WORKERS} workers did not all run: {workers}")
            time.sleep(0.2)


async def sampler_cost(data: Path, scratch: Path) -> tuple[float, float, float, int]:
    """(CPU s per tick, CPU s per store write, the interval, points sampled), measured here."""
    config = load_config(data / "run" / "paddlecloud.yaml")
    served = open_store(config.store_url())
    await served.open()
    try:
        stored = await served.get_job("admin", NAME)
    finally:
        await served.close()
    assert stored is not None
    store = open_store(f"sqlite:///{scratch / 'bench.db'}")
    await store.open()
    try:
        await store.create_job(stored)
        job = JobRecord.read(stored)
        backend = LocalBackend(config, open_volume(config))
        sampler = ResourceSampler(config, store, backend, lambda: [job])
        await sampler.tick()  # the first look: the plan read, CPU counters primed
        began = time.process_time()
        for _ in range(TICKS):
            await sampler.tick()
        per_tick = (time.process_time() - began) / TICKS
        began = time.process_time()
        await sampler.flush(everything=True)
        per_write = time.process_time() - began
        view = await sampler.view(job, None)
        points = sum(len(w["t"]) for w in view["workers"])
        if len(view["workers"]) != WORKERS or any(
            m is None for w in view["workers"] for m in w["memory_bytes"]
        ):
            raise RuntimeError(f"the sampler did not see every worker: {view}")
        return per_tick, per_write, sampler.interval, points
    finally:
        await store.close()


def main() -> None:
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start", flush=True)
    with tempfile.TemporaryDirectory(dir=os.environ.get("PADDLECLOUD_BENCH_DIR")) as tmp:
        root = Path(tmp)
        package = root / "sleeper"
        package.mkdir()
        (package / "train.py").write_text(SLEEPER)
        with Platform(root / "platform", {}).running() as platform:
            start_job(platform, package)
            assert platform.process is not None
            jobs_pid = child_pid(platform.process.pid, "paddlecloud.jobs", "jobs service")
            per_tick, per_write, interval, points = asyncio.run(sampler_cost(platform.data, root))
            before, began = cpu_seconds(jobs_pid), time.monotonic()
            time.sleep(WINDOW)
            service = (cpu_seconds(jobs_pid) - before) / (time.monotonic() - began)
    percent = 100 * (per_tick / interval + per_write / FLUSH_SECONDS)
    print(f"  a job of {WORKERS} trainers, sampled every {interval:g} s (jobs.metrics.interval's default)")
    print(f"  one tick: {per_tick * 1e3:.2f} ms of CPU ({TICKS} ticks, {points} points kept)")
    print(
        f"  one store write of the {WORKERS} series: {per_write * 1e3:.2f} ms of CPU,"
        f" every {FLUSH_SECONDS:g} s"
    )
    print(
        f"  the jobs service process, all it does for this job: {100 * service:.2f}% of one core"
        f" over {WINDOW:g} s"
    )
    aim(
        f"sampling a job of {WORKERS} workers <= {AIM_PERCENT:g}% of one core",
        f"{percent:.3f}%",
        percent <= AIM_PERCENT,
    )


if __name__ == "__main__":
    main()
