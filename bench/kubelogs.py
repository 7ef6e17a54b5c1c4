"""`logs -f` of a many-worker job on a cluster: the API bytes one follower reads per second.

On the real control plane of the tests (tests/kube_real: etcd, kube-apiserver, the
controllers, the scheduler, a simulated kubelet serving `pods/log`), TRAINERS running
pods with LOG_MIB MiB of log each, every one printing LINES_PER_SECOND more lines while
it is measured. Two followers, one after the other, each for SECONDS, through the same API
client (services/common/kube.py) against the same kubelet, which counts the bytes it served:

- before: the strategy of the jobs service until issue 31, kept here as the baseline: every
  0.5 s, each worker's whole log read again (its cursor was a line number);
- after: the service's (services/jobs/kube/logs.py): one `follow=true` stream per worker
  from the reader's position, as `logs -f` runs it.

The figure is the steady state: bytes served per second for SECONDS, from one second
after the follower first read every log whole (the same for both) on. The old strategy
asks for every log every 0.5 s (TRAINERS x LOG_MIB / 0.5 MiB/s); the simulated kubelet, a
Python HTTPS server, serves what it can of that, so its figure is a floor of what a real
kubelet would be asked for.
Run it with `python -m bench kubelogs` (the control plane must be built: `make
kube-control-plane`).
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import kube_real
import kube_real.cluster
import kube_real.logs
from kube_real.kubelet import PodScript
from paddlecloud.common.config import KubernetesSection
from paddlecloud.common.kube import Kube
from paddlecloud.jobs.kube import logs as kubelogs
from paddlecloud.jobs.kube.names import COMPLETION_INDEX, LABEL_ROLE
from paddlecloud.jobs.kube.pods import attempts_of

from . import aim

TRAINERS = 64
LOG_MIB = 2
LINE = 200  # characters a line, its newline included
LINES_PER_SECOND = 10  # each worker's, while measured
SECONDS = 5.0
WARM = 1.0
POLL = 0.5  # the jobs service's LOG_POLL_SECONDS
NAMESPACE = "bench-logs"
AIM_OVERHEAD = 1.25  # a follower reads at most this much of what the workers write (stamps)


def _pod(index: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"bench-trainer-{index}",
            "labels": {LABEL_ROLE: "trainer"},
            "annotations": {COMPLETION_INDEX: str(index)},
        },
        "spec": {"containers": [{"name": "trainer", "image": "bench"}], "restartPolicy": "Never"},
    }


def _writer(store: kube_real.logs.LogStore, keys: list[tuple[str, str, str]], stop: threading.Event) -> None:
    """Every worker prints LINES_PER_SECOND lines a second until `stop`."""
    n = 0
    while not stop.wait(1 / LINES_PER_SECOND):
        for key in keys:
            store.print(key, f"live {n} ".ljust(LINE - 1, "y"))
        n += 1


async def _before(kube: Kube, attempts: list[Any], ready: asyncio.Event, stop: asyncio.Event) -> None:
    while not stop.is_set():
        for a in attempts:
            await kube.log(a.namespace, a.pod, a.container)
        ready.set()  # after its first read of every log
        await asyncio.sleep(POLL)


async def _after(kube: Kube, live: dict[str, list[Any]], ready: asyncio.Event, stop: asyncio.Event) -> None:
    """The jobs service's follower (services/jobs/kube/logs.py), as `logs -f` runs it."""
    sources = kubelogs.Sources(False, {}, live)
    readers = [kubelogs.WorkerLog(kube, worker, None) for worker in live]
    for reader in readers:
        await reader.read(sources, to_stream=True)

    async def look() -> kubelogs.Sources:
        return sources

    caught_up: set[str] = set()

    async def emit(worker: str, batch: list[Any]) -> None:
        # A worker's first line of the writer's: its stream has sent the whole log before.
        if any(text.startswith("live ") for text, _ in batch):
            caught_up.add(worker)
            if len(caught_up) == len(readers):
                ready.set()

    tasks = [asyncio.create_task(kubelogs.follow_worker(r, look, emit, POLL)) for r in readers]
    await stop.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _measure(store: Any, follow: Any) -> float:
    """Bytes served per second to `follow` for SECONDS, from WARM seconds after it read
    every log once (`ready`): what following costs after the first read."""
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(follow(ready, stop))
    await ready.wait()
    await asyncio.sleep(WARM)
    served = store.served
    await asyncio.sleep(SECONDS)
    rate = (store.served - served) / SECONDS
    stop.set()
    await task
    return rate


async def _run(cluster: kube_real.Cluster, kubelet: kube_real.SimulatedKubelet) -> tuple[float, float]:
    admin = cluster.admin
    admin.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    admin.wait_for(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", lambda _: True, name="default")
    lines = tuple(f"step {i} ".ljust(LINE - 1, "x") for i in range(LOG_MIB * 2**20 // LINE))
    kubelet.script = lambda pod: PodScript(lines=lines, run_forever=True)
    for i in range(TRAINERS):
        admin.create(f"/api/v1/namespaces/{NAMESPACE}/pods", _pod(i))
    pods: list[dict[str, Any]] = []
    deadline = time.monotonic() + 120
    while len(pods) < TRAINERS:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(pods)} of {TRAINERS} pods run after 120 s")
        time.sleep(0.5)
        listing = admin.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
        pods = [p for p in listing if (p.get("status") or {}).get("phase") == "Running"]
    live = attempts_of(pods)
    keys = [(NAMESPACE, p["metadata"]["name"], "trainer") for p in pods]
    stop = threading.Event()
    threading.Thread(target=_writer, args=(kubelet.logs, keys, stop), daemon=True).start()
    kube = await Kube.connect(KubernetesSection(kubeconfig=str(cluster.admin_kubeconfig)))
    try:
        attempts = [a for items in live.values() for a in items]
        before = await _measure(kubelet.logs, lambda r, s: _before(kube, attempts, r, s))
        after = await _measure(kubelet.logs, lambda r, s: _after(kube, live, r, s))
    finally:
        stop.set()
        await kube.close()
    return before, after


def main() -> None:
    bins = kube_real.cluster.bin_dir()
    if not (bins / "kube-apiserver").exists():
        print(f"  skipped: the control plane is not built in {bins} (make kube-control-plane)")
        return
    with tempfile.TemporaryDirectory(prefix="bench-kubelogs-") as root:
        cluster = kube_real.start(Path(root), bins)
        kubelet = cluster.kubelet("sim-0")
        try:
            kubelet.start()
            before, after = asyncio.run(_run(cluster, kubelet))
        finally:
            kubelet.stop()
            cluster.stop()
    written = TRAINERS * LINES_PER_SECOND * LINE
    asked = TRAINERS * LOG_MIB * 2**20 / POLL
    print(
        f"one follower of {TRAINERS} trainers with {LOG_MIB} MiB of log each, "
        f"writing {written / 1024:.0f} KiB/s together; API bytes read per second:"
    )
    print(f"  {'before (whole logs every 0.5 s), asked':44}{asked / 2**20:>10.1f} MiB/s")
    print(f"  {'before, served (what the kubelet managed)':44}{before / 2**20:>10.1f} MiB/s")
    print(f"  {'after (a stream per worker)':44}{after / 2**20:>10.3f} MiB/s")
    print(f"  {'before served / after':44}{before / max(after, 1.0):>10.0f}x")
    print(f"  {'before asked / after':44}{asked / max(after, 1.0):>10.0f}x")
    overhead = after / written
    aim(
        f"a follower reads <= {AIM_OVERHEAD:g}x what the workers write",
        f"{overhead:.2f}x",
        overhead <= AIM_OVERHEAD,
    )
