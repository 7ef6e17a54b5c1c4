"""The kubernetes backend after the jobs service stopped at the worst moments: between
recording a job and creating its objects, and between creating them and recording that
it did; and with objects left of a job the store no longer has. A new service converges
with no orphaned objects and no phantom jobs. Against the real control plane
(tests/kube_real) with the rights the Helm chart gives the jobs service; the first test
counts the service's requests through the fault proxy (kube_real/faults.py)."""

from __future__ import annotations

import asyncio
import inspect
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from test_jobs_api import start_jobs

from kube_real import PodScript, Reply
from kube_real.chart import install_rights
from kube_real.faults import FaultProxy
from kube_real.fixtures import RealKube
from paddlecloud.common.keys import STORE
from paddlecloud.common.store import Job, open_store
from paddlecloud.common.store.models import PENDING
from paddlecloud.jobs.app import create_app as create_jobs
from paddlecloud.jobs.backend import Launch
from paddlecloud.jobs.kube.backend import KubernetesBackend
from paddlecloud.jobs.kube.names import LABEL_JOB_ID, job_labels, namespace_for
from paddlecloud.jobs.spec import JobSpec
from support import make_config


async def eventually(check: Callable[[], Any], what: str, timeout: float = 30) -> None:
    """Wait until `check()` (or what it returns, awaited) is true."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


@dataclass
class Kube:
    """The real control plane for one test: the jobs service's settings (a kubeconfig with
    the chart's rights for it, a namespace prefix of this test's own), alice's namespace,
    and the admin, whose blocking calls run in a thread so the service's loop runs on."""

    real: RealKube
    settings: dict[str, Any]
    namespace: str

    async def admin(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Reply:
        return await asyncio.to_thread(self.real.cluster.admin.request, method, path, body, **kwargs)

    async def exists(self, path: str) -> bool:
        reply = await self.admin("GET", path)
        assert reply.status in (200, 404), reply
        return reply.status == 200

    async def items(self, path: str, selector: str | None = None) -> list[dict[str, Any]]:
        reply = await self.admin("GET", path, query={"labelSelector": selector} if selector else None)
        assert reply.status == 200, reply
        return list(reply.body["items"])


@pytest.fixture
def kube(real_kube: RealKube, tmp_path: Path) -> Iterator[Kube]:
    token = secrets.token_hex(2)
    rights = install_rights(real_kube.cluster, tmp_path, f"pcjobs-{token}")
    prefix = f"t{token}-"
    settings = {
        "kubeconfig": str(rights.kubeconfig),
        "namespace_prefix": prefix,
        **rights.settings,  # who the chart says the service is
        # A pvc datacenter needs a claim in each user's namespace; hostPath needs none.
        "datacenters": {"dc1": {"kind": "hostpath", "host_path": "/srv/pfs"}},
        "watch_timeout_seconds": 5,
        "max_backoff_seconds": 0.5,
    }
    try:
        yield Kube(real_kube, settings, namespace_for("alice", prefix))
    finally:
        real_kube.cluster.admin.request("DELETE", f"/api/v1/namespaces/{namespace_for('alice', prefix)}")
        rights.remove()


async def test_a_new_service_adopts_starts_and_sweeps(
    tmp_path: Path, kube: Kube, aiohttp_server: Any, aiohttp_client: Any
) -> None:
    ns = kube.namespace
    with (
        FaultProxy(kube.real.cluster) as proxy,
        kube.real.scripted(lambda pod: PodScript(("ok",), run_seconds=2)),
    ):
        # Through the proxy, without faults: it counts the service's creates.
        settings = kube.settings | {"kubeconfig": str(proxy.kubeconfig(Path(kube.settings["kubeconfig"])))}
        jobs = await start_jobs(
            tmp_path, aiohttp_server, aiohttp_client, backend="kubernetes", kubernetes=settings
        )
        store = jobs.client.app[STORE]
        package = jobs.package({"train.py": "print('hi')\n"})
        await jobs.submit({"name": "adopted", "package": package})

        async def started() -> bool:  # the submit answers before the start is recorded
            job = await store.get_job("alice", "adopted")
            return job is not None and "namespace" in job.backend

        await eventually(started, "the job's start recorded")
        adopted = await store.get_job("alice", "adopted")
        assert adopted is not None and adopted.backend["namespace"] == ns
        await eventually(lambda: kube.items(f"/apis/batch/v1/namespaces/{ns}/jobs"), "the trainers' Job")
        owner = await kube.admin("GET", f"/api/v1/namespaces/{ns}/configmaps/adopted")
        owner_uid = owner.body["metadata"]["uid"]

        # The service stops; as if it had died before recording what it created...
        await jobs.server_app.shutdown()
        await jobs.server_app.cleanup()
        await store.update_job(adopted.id, backend={})
        # ... and before creating anything for a job it had recorded ...
        phantom = Job(
            id="f" * 32,
            owner="alice",
            name="recorded",
            state=PENDING,
            spec=adopted.spec | {"name": "recorded"},
        )
        await store.create_job(phantom)
        # ... and objects are left of a job the store no longer has.
        forgotten = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "forgotten",
                "labels": job_labels("alice", "forgotten", "0" * 32, settings["release"]),
            },
        }
        made = await kube.admin("POST", f"/api/v1/namespaces/{ns}/configmaps", forgotten)
        assert made.status == 201, made

        sections = {
            "pfs": {"datacenter": "dc1", "url": "http://127.0.0.1:1"},
            "jobs": {"poll_seconds": 0.05, "backend": "kubernetes", "kubernetes": settings},
        }
        await aiohttp_server(create_jobs(make_config(tmp_path, **sections)))

        async def ended(name: str) -> bool:
            job = await store.get_job("alice", name)
            return job is not None and job.state == "SUCCEEDED"

        await eventually(lambda: ended("adopted"), "the adopted job to succeed")
        await eventually(lambda: ended("recorded"), "the recorded job to be started and succeed")
        # The adopted job kept its objects (not made twice); the recorded one got its own.
        again = await store.get_job("alice", "adopted")
        assert again is not None and again.backend.get("owner_uid") == owner_uid
        creates = [
            r
            for r in proxy.requests
            if r.method == "POST" and r.path == f"/apis/batch/v1/namespaces/{ns}/jobs"
        ]
        assert len(creates) == 2, creates
        await eventually(
            lambda: not_any(kube.items(f"/api/v1/namespaces/{ns}/configmaps", f"{LABEL_JOB_ID}={'0' * 32}")),
            "the sweep",
        )
        assert not await kube.exists(f"/api/v1/namespaces/{ns}/configmaps/forgotten")


async def not_any(items: Awaitable[list[Any]]) -> bool:
    return not await items


async def test_a_job_the_watch_has_not_shown_yet_is_not_failed(tmp_path: Path, kube: Kube) -> None:
    """The owner just created may not be in the watch cache yet: observe asks the API
    server before it calls the job's objects deleted, and only then fails it."""
    config = make_config(
        tmp_path, pfs={"datacenter": "dc1"}, jobs={"backend": "kubernetes", "kubernetes": kube.settings}
    )
    store = open_store(config.store_url())
    await store.open()
    backend = KubernetesBackend(config, store)
    await backend.open()
    try:
        # No namespace is watched: the cache will not see the owner this test creates.
        configmaps = backend._informers["ConfigMap"]
        assert backend._fleet is not None
        backend._fleet.add = lambda namespace: None  # type: ignore[method-assign]
        spec = JobSpec.model_validate({"name": "fresh", "package": "/pfs/dc1/home/alice/pkg"})
        job = Job(id="a" * 32, owner="alice", name="fresh", state=PENDING, spec=spec.to_dict())
        launch = Launch(
            job=job,
            spec=spec,
            datacenter="dc1",
            pfs_home="/pfs/dc1/home/alice",
            output="/pfs/dc1/home/alice/jobs/fresh/output",
            package="/pfs/dc1/home/alice/pkg",
            package_kind="dir",
        )
        with kube.real.scripted(lambda pod: PodScript(run_forever=True)):
            started = replace(job, backend=await backend.start(launch))
        assert not configmaps.of_job(job.id)
        observed = await backend.observe(started, None)
        assert observed.state == PENDING, observed
        # Once the owner is really gone, the job fails, saying so.
        deleted = await kube.admin("DELETE", f"/api/v1/namespaces/{kube.namespace}/configmaps/fresh")
        assert deleted.status == 200, deleted
        observed = await backend.observe(started, None)
        assert observed.state == "FAILED" and "deleted outside PaddleCloud" in observed.reason
    finally:
        await backend.close()
        await store.close()


def _runs(task: asyncio.Task[Any], informer: object) -> bool:
    """Whether `task` is running `informer`'s list-and-watch loop."""
    coro = task.get_coro()
    frame = getattr(coro, "cr_frame", None)
    return (
        not task.done()
        and getattr(coro, "__qualname__", "") == "Informer.run"
        and frame is not None
        and frame.f_locals.get("self") is informer
    )


@pytest.fixture
async def backend(tmp_path: Path, kube: Kube) -> AsyncIterator[KubernetesBackend]:
    """The backend alone, open against the real API server, with its own SQLite store."""
    sections = {"pfs": {"datacenter": "dc1"}, "jobs": {"backend": "kubernetes", "kubernetes": kube.settings}}
    config = make_config(tmp_path, **sections)
    store = open_store(config.store_url())
    await store.open()
    opened = KubernetesBackend(config, store)
    await opened.open()
    yield opened
    await opened.close()
    await store.close()


async def test_a_killed_informer_is_started_again_and_sees_what_changed(
    kube: Kube, backend: KubernetesBackend
) -> None:
    """An informer's task that ends (killed here; a crash ends it the same way) is started
    again, listing first: what changed while it was down and what changes after both
    reach the cache, which is never left stale by a dead task."""

    async def owner(name: str, job_id: str) -> None:
        labels = job_labels("alice", name, job_id, kube.settings["release"])
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}}
        made = await kube.admin("POST", f"/api/v1/namespaces/{kube.namespace}/configmaps", body)
        assert made.status == 201, made

    await backend._ensure_tenancy("alice")  # alice's namespace, this release's, watched
    assert backend._fleet is not None
    configmaps = backend._fleet.informers[kube.namespace]["ConfigMap"]
    await eventually(lambda: any(_runs(t, configmaps) for t in asyncio.all_tasks()), "its informer")
    first = next(t for t in asyncio.all_tasks() if _runs(t, configmaps))
    first.cancel()
    await owner("while-down", "b" * 32)
    await eventually(
        lambda: any(_runs(t, configmaps) and t is not first for t in asyncio.all_tasks()),
        "the informer to be started again",
    )
    await eventually(lambda: configmaps.of_job("b" * 32), "what changed while it was down")
    await owner("after", "c" * 32)
    await eventually(lambda: configmaps.of_job("c" * 32), "what changed after")
