"""The kubernetes jobs backend end to end while its API server misbehaves: `paddlecloud
server` with `jobs.backend: kubernetes` and the real CLI, against the real control plane
(tests/kube_real) seen through the fault-injecting proxy (kube_real/faults.py), with
exactly the rights the Helm chart gives the jobs service. The faults are the ones a real
API server does not give on demand: watches that expire, a minute of 500s, a call that
hangs."""

from __future__ import annotations

import functools
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kube_backend_support as kb
import pytest
import yaml
from test_jobs_cli import as_json, ok, run_cli, wait_for_state

from kube_real import KubeClient, PodScript
from kube_real.chart import install_rights
from kube_real.faults import FaultProxy
from kube_real.fixtures import RealKube
from paddlecloud.jobs.kube.names import LABEL_JOB

pytestmark = pytest.mark.slow

DC = "datacenter1"
Obj = dict[str, Any]


@dataclass
class Faulty:
    """A `paddlecloud server` whose jobs service reaches the API server through `proxy`;
    the admin's jobs go to `namespace`."""

    backend: kb.KubeBackend
    proxy: FaultProxy

    @property
    def server(self) -> Any:
        return self.backend.server

    @property
    def namespace(self) -> str:
        return self.backend.namespace()


@pytest.fixture
def faulty(real_kube: RealKube, server_factory: Any, tmp_path: Path) -> Iterator[Faulty]:
    """The server through the proxy, its calls timing out at 3 s (kube_backend_support)."""
    with (
        FaultProxy(real_kube.cluster) as proxy,
        kb.kube_backend(
            real_kube, server_factory, tmp_path, via=proxy.kubeconfig, request_timeout_seconds=3
        ) as backend,
    ):
        yield Faulty(backend, proxy)


def submit(faulty: Faulty, name: str, *flags: str) -> None:
    ok(run_cli(faulty.server, "submit", "--name", name, *flags, str(faulty.backend.package())))


def get_job(server: Any, name: str) -> Obj:
    return as_json(run_cli(server, "-o", "json", "get", "job", name))


def complete(job: Obj) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or ()
    return any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)


def lists(proxy: FaultProxy, path: str) -> int:
    """How many lists (not watches) of the collection at `path` reached the proxy."""
    return sum(1 for r in proxy.requests if r.method == "GET" and not r.watch and r.path == path)


def left_of(faulty: Faulty, job: str) -> bool:
    """Whether nothing is left of `job` (the real garbage collector removes what the
    owner owned; pods go once the kubelet let them go)."""
    return not faulty.backend.objects_of(job)


def changes(watch: Iterator[Obj]) -> Iterator[Obj]:
    """A watch's events without its bookmarks (the API server sends them when it likes)."""
    return (event for event in watch if event["type"] != "BOOKMARK")


def test_the_proxy_streams_and_injects_each_fault(real_kube: RealKube, tmp_path: Path) -> None:
    """The proxy itself, with the jobs service's token: a watch streams through it (an
    event arrives while the watch is open, not when it ends), and each fault is what the
    tests below rely on."""
    admin = real_kube.cluster.admin
    rights = install_rights(real_kube.cluster, tmp_path, f"pcjobs-{secrets.token_hex(2)}")
    configmaps = f"/api/v1/namespaces/{rights.namespace}/configmaps"
    # The service's rights in a namespace are the tenant role, bound there as it binds it
    # in each namespace it makes: here, in the rights' own.
    tenant = rights.settings["tenant_role"]
    admin.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{rights.namespace}/rolebindings",
        {
            "metadata": {"name": "tenant"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": tenant},
            "subjects": [{"kind": "ServiceAccount", "name": rights.account, "namespace": rights.namespace}],
        },
    )
    try:
        with FaultProxy(real_kube.cluster) as proxy:
            token = yaml.safe_load(proxy.kubeconfig(rights.kubeconfig).read_text())["users"][0]["user"][
                "token"
            ]
            service = KubeClient(proxy.url, real_kube.cluster.pki.ca_cert, token=token)
            # The root CA publisher's ConfigMap comes with a new namespace: in the list, not the watch.
            admin.wait_for(configmaps, lambda _: True, name="kube-root-ca.crt")
            kb.wait(lambda: service.request("GET", configmaps).status == 200, "the tenant binding in effect")
            version = service.get(configmaps)["metadata"]["resourceVersion"]
            watch = changes(service.watch(configmaps, resource_version=version, timeout=60))
            admin.create(configmaps, {"metadata": {"name": "first"}})
            assert next(watch)["object"]["metadata"]["name"] == "first"
            # Still open: the second change comes on the same stream.
            admin.create(configmaps, {"metadata": {"name": "second"}})
            assert next(watch)["object"]["metadata"]["name"] == "second"

            proxy.expire_watches()
            assert list(watch) == []  # ended, cleanly
            [event] = service.watch(configmaps, resource_version=version, timeout=60)
            assert event["type"] == "ERROR" and event["object"]["code"] == 410, event
            assert event["object"]["reason"] == "Expired"
            assert event["object"]["message"].startswith(f"too old resource version: {version} (")
            fresh = service.get(configmaps)["metadata"]["resourceVersion"]
            watch = changes(service.watch(configmaps, resource_version=fresh, timeout=60))
            admin.create(configmaps, {"metadata": {"name": "third"}})
            assert next(watch)["object"]["metadata"]["name"] == "third"

            proxy.fail(500, seconds=60, method="GET", path="/configmaps$")
            assert list(watch) == []  # a failing server's watches end
            failed = service.request("GET", configmaps)
            assert failed.status == 500 and failed.body["reason"] == "InternalError", failed
            assert service.request("GET", f"/api/v1/namespaces/{rights.namespace}/pods").status == 200
            proxy.heal()
            assert service.request("GET", configmaps).status == 200

            proxy.hang(method="POST", path="/configmaps$", times=1, forward=True)
            with pytest.raises(TimeoutError):
                service.request("POST", configmaps, {"metadata": {"name": "lost"}}, timeout=2)
            # The API server made it; only the answer was lost. The next call is answered.
            assert admin.get(f"{configmaps}/lost")["metadata"]["name"] == "lost"
            again = service.request("POST", configmaps, {"metadata": {"name": "lost"}})
            assert again.status == 409, again
            seen = [(r.method, r.fault) for r in proxy.requests if r.path == configmaps]
            assert ("POST", "hung") in seen and ("GET", "expired") in seen and ("GET", "failed") in seen
    finally:
        rights.remove()


def test_an_expired_watch_relists_without_missing_the_end(
    real_kube: RealKube, faulty: Faulty, tmp_path: Path
) -> None:
    server, proxy = faulty.server, faulty.proxy
    with real_kube.scripted(kb.script(trainer=lambda pod: PodScript(lines=("x",), run_seconds=4))):
        submit(faulty, "relist")
        wait_for_state(server, "relist", ("RUNNING",))
        # The watches go away (their resumes hang), the job ends meanwhile, and then every
        # resume is answered 410 Gone: only a new list can show the service the end.
        proxy.hang(watch=True)
        proxy.expire_watches()
        # The informer's list and watch of Jobs, in the user's namespace (its only rights).
        trainers_jobs = f"/apis/batch/v1/namespaces/{faulty.namespace}/jobs"
        lists_before = lists(proxy, trainers_jobs)
        real_kube.cluster.admin.wait_for(
            f"/apis/batch/v1/namespaces/{faulty.namespace}/jobs",
            complete,
            query={"labelSelector": f"{LABEL_JOB}=relist"},
        )
        assert get_job(server, "relist")["state"] == "RUNNING"
        proxy.heal()
        done = wait_for_state(server, "relist", ("SUCCEEDED", "FAILED"))
    assert done["state"] == "SUCCEEDED", done
    assert done["reason"] == "every trainer exited 0"
    expired = [r for r in proxy.requests if r.fault == "expired" and r.path == trainers_jobs]
    assert expired, f"no watch of Jobs was resumed from before the expiry: {proxy.requests}"
    assert lists(proxy, trainers_jobs) > lists_before
    # The end's log was kept from what the new list showed, and nothing is left.
    assert "[trainer-0] x" in ok(run_cli(server, "logs", "relist")).splitlines()
    kb.wait(functools.partial(left_of, faulty, "relist"), "the job's objects to go")


def test_an_api_server_answering_500_for_a_minute_loses_nothing(
    real_kube: RealKube, faulty: Faulty, tmp_path: Path
) -> None:
    server, proxy = faulty.server, faulty.proxy
    outage = 60.0
    # The trainer ends inside the outage: only what the service sees after it shows the end.
    with real_kube.scripted(kb.script(trainer=lambda pod: PodScript(lines=("steady",), run_seconds=20))):
        submit(faulty, "steady")
        wait_for_state(server, "steady", ("RUNNING",))
        proxy.fail(500, seconds=outage)
        ends = time.monotonic() + outage
        # A submit meanwhile waits for the API rather than failing, and says so for as long
        # as it waits (the stale watch's note is for jobs the cluster has).
        submit(faulty, "later")
        seen: set[str] = set()
        reasons: set[str] = set()
        later: list[Obj] = []
        while time.monotonic() < ends - 2:
            job = get_job(server, "steady")
            seen.add(job["state"])
            reasons.add(job["reason"])
            if time.monotonic() < ends - 10:  # well inside the outage, however slow the CLI
                later.append(get_job(server, "later"))
            time.sleep(2)  # a reader polling through the outage, as a person would
        assert seen == {"RUNNING"}, seen
        assert any("the Kubernetes API is not answering" in r for r in reasons), reasons
        assert len(later) >= 3, later
        for waiting in later:
            assert waiting["state"] == "PENDING", waiting
            assert "the job starts once it does" in waiting["reason"], waiting
        # The 500s reached the service (its requests went through the proxy).
        assert any(r.fault == "failed" and r.status == 500 for r in proxy.requests)
        proxy.heal()
        assert wait_for_state(server, "steady", ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"
        assert wait_for_state(server, "later", ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"
    assert "[trainer-0] steady" in ok(run_cli(server, "logs", "steady")).splitlines()
    for name in ("steady", "later"):
        kb.wait(functools.partial(left_of, faulty, name), f"{name}'s objects to go")


def test_a_hung_create_times_out_and_the_job_still_starts(
    real_kube: RealKube, faulty: Faulty, tmp_path: Path
) -> None:
    """The API server creates the trainers' Job and its answer never comes: the call ends
    at `request_timeout_seconds`, the job waits saying why, and the next try adopts the
    Job the first one made (409, then read back) instead of failing or making a second."""
    server, proxy = faulty.server, faulty.proxy
    creates = rf"^/apis/batch/v1/namespaces/{faulty.namespace}/jobs$"
    proxy.hang(method="POST", path=creates, times=1, forward=True)
    with real_kube.scripted(
        kb.script(trainer=lambda pod: PodScript(lines=("after the hang",), run_seconds=1))
    ):
        submit(faulty, "hung")
        done = wait_for_state(server, "hung", ("SUCCEEDED", "FAILED"))
    assert done["state"] == "SUCCEEDED", done
    waited = [e for e in done["events"] if e["reason"] == "WaitingForResources"]
    assert len(waited) == 1, done["events"]
    assert "the Kubernetes API is not answering" in waited[0]["message"], waited
    assert "did not answer" in waited[0]["message"] and "the job starts once it does" in waited[0]["message"]
    posts = [r for r in proxy.requests if r.method == "POST" and r.path.endswith(f"{faulty.namespace}/jobs")]
    assert [r.fault for r in posts] == ["hung", ""], posts
    assert posts[1].status == 409  # the first try's Job, adopted
    assert "[trainer-0] after the hang" in ok(run_cli(server, "logs", "hung")).splitlines()
    kb.wait(functools.partial(left_of, faulty, "hung"), "the job's objects to go")
