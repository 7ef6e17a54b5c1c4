"""Two jobs services over one store on the real control plane, with the chart's rights and
a short Lease: one leader acts, the follower refuses and creates nothing, a SIGKILLed
leader is replaced within the lease, its running job ends right and the job it had only
recorded is made, with no object made twice, and a leader that cannot renew exits,
saying so (docs/kubernetes.md, "One leader")."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from test_jobs_process import add_alice, call, wait_for

from kube_real import PodScript
from kube_real.chart import ChartRights, install_rights
from kube_real.faults import FaultProxy
from kube_real.fixtures import RealKube
from paddlecloud.common.store import Job, open_store
from paddlecloud.common.store.models import PENDING
from paddlecloud.jobs.kube.names import LABEL_JOB, LABEL_ROLE, namespace_for
from support import ServiceProcess, signed, write_config

Obj = dict[str, Any]
# What a job is made of that a second leader could make again.
WATCHED = {
    "ConfigMap": "/api/v1/configmaps",
    "Job": "/apis/batch/v1/jobs",
    "StatefulSet": "/apis/apps/v1/statefulsets",
}


def lease_of(rights: ChartRights) -> str:
    """The Lease the chart's Role lets the jobs service renew (its resourceNames)."""
    for obj in rights.objects:
        for rule in obj.get("rules", ()) if obj["kind"] == "Role" else ():
            if "leases" in rule["resources"] and rule.get("resourceNames"):
                return str(rule["resourceNames"][0])
    raise AssertionError("the chart gives the jobs service no Lease")


class Added:
    """Every ADDED event of the objects of `jobs` in one namespace, from now on, as an admin
    watches them on the real API server (a thread per kind): (kind, job) pairs."""

    def __init__(self, real_kube: RealKube, namespace: str, jobs: tuple[str, ...]) -> None:
        cluster = real_kube.cluster
        # A client of its own, whose close() ends these watches and nothing else.
        self._client = cluster.user("leader-test-watcher", ["system:masters"])
        self.seen: list[tuple[str, str]] = []
        self._threads = []
        query = {"labelSelector": f"{LABEL_JOB} in ({','.join(jobs)})"}
        for kind, path in WATCHED.items():
            version = cluster.admin.get(path)["metadata"]["resourceVersion"]
            thread = threading.Thread(
                target=self._watch, args=(kind, path, version, namespace, query), daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def _watch(self, kind: str, path: str, version: str, namespace: str, query: dict[str, str]) -> None:
        for event in self._client.watch(path, resource_version=version, query=query, timeout=300):
            meta = event["object"]["metadata"]
            if event["type"] == "ADDED" and meta.get("namespace") == namespace:
                self.seen.append((kind, meta["labels"][LABEL_JOB]))

    def close(self) -> None:
        self._client.close()
        for thread in self._threads:
            thread.join(timeout=10)


async def record_unstarted(tmp_path: Path, like: str, name: str) -> None:
    """A job recorded PENDING and never created, as a leader that died between its submit's
    answer and its start leaves one (the spec of `like`, renamed)."""
    store = open_store(f"sqlite:///{tmp_path}/store.db")
    await store.open()
    try:
        model = await store.get_job("alice", like)
        assert model is not None
        spec = model.spec | {"name": name}
        await store.create_job(
            Job(id=secrets.token_hex(16), owner="alice", name=name, state=PENDING, spec=spec)
        )
    finally:
        await store.close()


async def ready(service: ServiceProcess) -> int:
    async with aiohttp.ClientSession() as session, session.get(f"{service.url}/readyz") as resp:
        return resp.status


async def until_ready(service: ServiceProcess, what: str, timeout: float = 30) -> None:
    """Wait until `service` says it is ready: it leads."""
    deadline = time.monotonic() + timeout
    while await ready(service) != 200:
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@pytest.fixture
def rights(real_kube: RealKube, tmp_path: Path) -> Iterator[ChartRights]:
    installed = install_rights(
        real_kube.cluster, tmp_path, f"pcjobs-{secrets.token_hex(2)}", sets=("jobs.replicas=2",)
    )
    try:
        yield installed
    finally:
        installed.remove()


async def test_one_leader_acts_and_a_follower_takes_over_a_running_job_without_making_anything_twice(
    real_kube: RealKube, rights: ChartRights, tmp_path: Path
) -> None:
    prefix = f"t{secrets.token_hex(2)}-"
    namespace = namespace_for("alice", prefix)
    lease = lease_of(rights)
    with FaultProxy(real_kube.cluster) as first_proxy, FaultProxy(real_kube.cluster) as second_proxy:
        services = []
        for name, proxy in (("first", first_proxy), ("second", second_proxy)):
            settings = {
                **rights.settings,  # who the service is, as the chart says: release, tenant role
                # Each through a proxy of its own: what it asks of the API server is seen.
                "kubeconfig": str(proxy.kubeconfig(rights.kubeconfig, tmp_path / f"{name}.kubeconfig")),
                "namespace_prefix": prefix,
                "datacenters": {"dc1": {"kind": "hostpath", "host_path": "/srv/pfs"}},
                "watch_timeout_seconds": 5,
                "max_backoff_seconds": 0.5,
                "leader_election": {
                    "enabled": True,
                    "namespace": rights.namespace,
                    "lease_name": lease,
                    "lease_seconds": 3,
                    "renew_seconds": 2,
                    "retry_seconds": 0.5,
                },
            }
            (tmp_path / name).mkdir()
            # One store (SQLite under tmp_path) and one PFS root for both, as on a cluster.
            config = write_config(
                tmp_path,
                pfs={"datacenter": "dc1"},
                jobs={"poll_seconds": 0.05, "backend": "kubernetes", "kubernetes": settings},
            )
            config = config.rename(tmp_path / name / "paddlecloud.yaml")
            services.append(ServiceProcess("jobs", config, tmp_path / name))
        first, second = services
        await add_alice(tmp_path)
        (tmp_path / "pfs" / "home" / "alice" / "pkg").mkdir(parents=True)
        (tmp_path / "pfs" / "home" / "alice" / "pkg" / "train.py").write_text("print('hi')\n")
        release = threading.Event()
        script = lambda pod: PodScript(  # noqa: E731
            run_forever=pod["metadata"]["labels"].get(LABEL_ROLE) == "pserver",
            until=release,
            final_lines=("done",),
        )
        added = None
        try:
            first.start()
            await until_ready(first, "the first service to lead")
            second.start()

            # The follower: not ready, and an API request is refused before it changes anything.
            assert await ready(second) == 503
            spec = {"name": "handover", "package": "/pfs/dc1/home/alice/pkg", "pservers": 1, "trainers": 1}
            async with aiohttp.ClientSession() as session:
                path = "/api/v1/jobs"
                headers = signed("POST", path)
                async with session.post(f"{second.url}{path}", json=spec, headers=headers) as resp:
                    refused = await resp.json(content_type=None)
                    assert resp.status == 503, refused
                    assert resp.content_type == "application/problem+json"
                    assert int(resp.headers["Retry-After"]) >= 1
            assert refused["code"] == "ERR_NOT_LEADER" and "not the leader" in refused["detail"], refused
            status, _ = await call(first, "GET", "/api/v1/jobs/handover")
            assert status == 404  # the refused submit recorded nothing

            added = Added(real_kube, namespace, ("handover", "recorded"))
            with real_kube.scripted(script):
                status, body = await call(first, "POST", "/api/v1/jobs", json=spec)
                assert status == 201, body
                await wait_for(first, "handover", {"RUNNING"})
                # Until now the follower asked the API server about its Lease and nothing else:
                # no watch, no list, no create.
                leases = f"/apis/coordination.k8s.io/v1/namespaces/{rights.namespace}/leases"
                asked = second_proxy.requests
                assert asked and all(r.path.startswith(leases) and not r.watch for r in asked), asked

                assert first.process is not None
                os.kill(first.process.pid, signal.SIGKILL)
                first.process.wait()
                await record_unstarted(tmp_path, "handover", "recorded")
                await until_ready(second, "the second service to take over")
                held = real_kube.cluster.admin.get(
                    f"/apis/coordination.k8s.io/v1/namespaces/{rights.namespace}/leases/{lease}"
                )
                assert held["spec"]["holderIdentity"] != "" and held["spec"]["leaseTransitions"] >= 1, held
                release.set()
                job = await wait_for(second, "handover", {"SUCCEEDED", "FAILED", "KILLED"})
                recorded = await wait_for(second, "recorded", {"SUCCEEDED", "FAILED", "KILLED"})
            assert job["state"] == "SUCCEEDED", job
            assert recorded["state"] == "SUCCEEDED", recorded
            added.close()
            # Each job's owner ConfigMap, trainers' Job and parameter servers' StatefulSet,
            # each made once: the new leader adopted what the old one made, and made what
            # the old one had only recorded.
            made = sorted(added.seen)
            assert made == sorted((kind, job) for kind in WATCHED for job in ("handover", "recorded")), made

            # A leader that cannot renew its Lease stops at once: it exits non-zero, in words.
            first.start()
            assert await ready(first) == 503  # a follower now
            second_proxy.hang(path="/leases/")
            assert second.process is not None
            assert second.process.wait(timeout=30) == 1
            assert "leader_lease_lost" in second.log_path.read_text()
            second_proxy.heal()  # its hung requests end
            await until_ready(first, "the first service to lead again")
        finally:
            if added is not None:
                added.close()
            first.stop()
            second.stop()
            real_kube.cluster.admin.request("DELETE", f"/api/v1/namespaces/{namespace}")
