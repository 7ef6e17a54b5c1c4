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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_jobs_cli import as_json, make_package, ok, run_cli, wait_for_state

from kube_real import KubeClient, PodScript
from kube_real.chart import install_rights
from kube_real.faults import FaultProxy
from kube_real.fixtures import RealKube
from paddlecloud.jobs.kube.names import LABEL_JOB, LABEL_ROLE, namespace_for

pytestmark = pytest.mark.slow

DC = "datacenter1"
Obj = dict[str, Any]
TRAINERS_JOBS = "/apis/batch/v1/jobs"  # the informer's list and watch of Jobs


def script(**by_role: Callable[[Obj], PodScript]) -> Callable[[Obj], PodScript]:
    """A kubelet script by role (pserver, trainer); parameter servers serve until deleted."""

    def decide(pod: Obj) -> PodScript:
        role = str(pod["metadata"]["labels"].get(LABEL_ROLE))
        if role in by_role:
            return by_role[role](pod)
        return PodScript(run_forever=True) if role == "pserver" else PodScript(lines=(f"{role} done",))

    return decide


@dataclass
class Faulty:
    """A `paddlecloud server` whose jobs service reaches the API server through `proxy`;
    the admin's jobs go to `namespace`."""

    server: Any
    proxy: FaultProxy
    namespace: str


def kube_config(tmp_path: Path, kubeconfig: Path, prefix: str) -> Path:
    settings: Obj = {
        "kubeconfig": str(kubeconfig),
        "namespace_prefix": prefix,
        # A pvc datacenter needs a claim in each user's namespace; hostPath needs none.
        "datacenters": {DC: {"kind": "hostpath", "host_path": "/srv/pfs"}},
        "request_timeout_seconds": 3,
        "watch_timeout_seconds": 5,
        "max_backoff_seconds": 1,
        "quota_sync_seconds": 0.5,
        "image_pull_timeout_seconds": 3,
    }
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump({"jobs": {"backend": "kubernetes", "kubernetes": settings}}))
    return path


@pytest.fixture
def faulty(real_kube: RealKube, server_factory: Any, tmp_path: Path) -> Iterator[Faulty]:
    """The server, its rights (a namespace of their own) and users' namespaces named for
    this test alone; all of it deleted after."""
    token = secrets.token_hex(2)
    admin = real_kube.cluster.admin
    rights = install_rights(real_kube.cluster, tmp_path, f"pcjobs-{token}")
    prefix = f"t{token}-"
    server = None
    try:
        with FaultProxy(real_kube.cluster) as proxy:
            config = kube_config(tmp_path, proxy.kubeconfig(rights.kubeconfig), prefix)
            server = server_factory("--server-config", str(config))
            yield Faulty(server, proxy, namespace_for("admin", prefix))
            server.stop()
    finally:
        if server is not None:
            server.stop()
        for namespace in admin.get("/api/v1/namespaces")["items"]:
            if namespace["metadata"]["name"].startswith(prefix):
                admin.request("DELETE", f"/api/v1/namespaces/{namespace['metadata']['name']}")
        rights.remove()


def submit(server: Any, tmp_path: Path, name: str, *flags: str) -> None:
    package = tmp_path / f"pkg-{name}"
    make_package(package)
    ok(run_cli(server, "submit", "--name", name, *flags, str(package)))


def get_job(server: Any, name: str) -> Obj:
    return as_json(run_cli(server, "-o", "json", "get", "job", name))


def complete(job: Obj) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or ()
    return any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)


def lists(proxy: FaultProxy, path: str) -> int:
    """How many lists (not watches) of the collection at `path` reached the proxy."""
    return sum(1 for r in proxy.requests if r.method == "GET" and not r.watch and r.path == path)


def objects_of(real_kube: RealKube, namespace: str, job: str) -> list[str]:
    """What is left of `job` in `namespace`, as the admin sees it (the real garbage
    collector removes what the owner owned; pods go once the kubelet let them go)."""
    admin = real_kube.cluster.admin
    found = []
    for base, plural in (
        ("/api/v1", "configmaps"),
        ("/apis/apps/v1", "statefulsets"),
        ("/apis/batch/v1", "jobs"),
        ("/api/v1", "services"),
        ("/api/v1", "pods"),
        ("/apis/networking.k8s.io/v1", "networkpolicies"),
    ):
        listing = admin.get(
            f"{base}/namespaces/{namespace}/{plural}", query={"labelSelector": f"{LABEL_JOB}={job}"}
        )
        found += [f"{plural}/{o['metadata']['name']}" for o in listing["items"]]
    return found


def left_of(real_kube: RealKube, namespace: str, job: str) -> bool:
    """Whether nothing is left of `job`."""
    return not objects_of(real_kube, namespace, job)


def wait(condition: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)  # the CLI and the admin's lists are what is polled, not the service


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
    try:
        with FaultProxy(real_kube.cluster) as proxy:
            token = yaml.safe_load(proxy.kubeconfig(rights.kubeconfig).read_text())["users"][0]["user"][
                "token"
            ]
            service = KubeClient(proxy.url, real_kube.cluster.pki.ca_cert, token=token)
            # The root CA publisher's ConfigMap comes with a new namespace: in the list, not the watch.
            admin.wait_for(configmaps, lambda _: True, name="kube-root-ca.crt")
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
    with real_kube.scripted(script(trainer=lambda pod: PodScript(lines=("x",), run_seconds=4))):
        submit(server, tmp_path, "relist")
        wait_for_state(server, "relist", ("RUNNING",))
        # The watches go away (their resumes hang), the job ends meanwhile, and then every
        # resume is answered 410 Gone: only a new list can show the service the end.
        proxy.hang(watch=True)
        proxy.expire_watches()
        lists_before = lists(proxy, TRAINERS_JOBS)
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
    expired = [r for r in proxy.requests if r.fault == "expired" and r.path == TRAINERS_JOBS]
    assert expired, f"no watch of Jobs was resumed from before the expiry: {proxy.requests}"
    assert lists(proxy, TRAINERS_JOBS) > lists_before
    # The end's log was kept from what the new list showed, and nothing is left.
    assert "[trainer-0] x" in ok(run_cli(server, "logs", "relist")).splitlines()
    wait(functools.partial(left_of, real_kube, faulty.namespace, "relist"), "the job's objects to go")


def test_an_api_server_answering_500_for_a_minute_loses_nothing(
    real_kube: RealKube, faulty: Faulty, tmp_path: Path
) -> None:
    server, proxy = faulty.server, faulty.proxy
    outage = 60.0
    # The trainer ends inside the outage: only what the service sees after it shows the end.
    with real_kube.scripted(script(trainer=lambda pod: PodScript(lines=("steady",), run_seconds=20))):
        submit(server, tmp_path, "steady")
        wait_for_state(server, "steady", ("RUNNING",))
        proxy.fail(500, seconds=outage)
        ends = time.monotonic() + outage
        # A submit meanwhile waits for the API rather than failing.
        submit(server, tmp_path, "later")
        seen: set[str] = set()
        reasons: set[str] = set()
        while time.monotonic() < ends - 2:
            job = get_job(server, "steady")
            seen.add(job["state"])
            reasons.add(job["reason"])
            time.sleep(2)  # a reader polling through the outage, as a person would
        assert seen == {"RUNNING"}, seen
        assert any("the Kubernetes API is not answering" in r for r in reasons), reasons
        waiting = get_job(server, "later")
        assert waiting["state"] == "PENDING" and "the job starts once it does" in waiting["reason"], waiting
        # The 500s reached the service (its requests went through the proxy).
        assert any(r.fault == "failed" and r.status == 500 for r in proxy.requests)
        proxy.heal()
        assert wait_for_state(server, "steady", ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"
        assert wait_for_state(server, "later", ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"
    assert "[trainer-0] steady" in ok(run_cli(server, "logs", "steady")).splitlines()
    for name in ("steady", "later"):
        wait(functools.partial(left_of, real_kube, faulty.namespace, name), f"{name}'s objects to go")


def test_a_hung_create_times_out_and_the_job_still_starts(
    real_kube: RealKube, faulty: Faulty, tmp_path: Path
) -> None:
    """The API server creates the trainers' Job and its answer never comes: the call ends
    at `request_timeout_seconds`, the job waits saying why, and the next try adopts the
    Job the first one made (409, then read back) instead of failing or making a second."""
    server, proxy = faulty.server, faulty.proxy
    creates = rf"^/apis/batch/v1/namespaces/{faulty.namespace}/jobs$"
    proxy.hang(method="POST", path=creates, times=1, forward=True)
    with real_kube.scripted(script(trainer=lambda pod: PodScript(lines=("after the hang",), run_seconds=1))):
        submit(server, tmp_path, "hung")
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
    wait(functools.partial(left_of, real_kube, faulty.namespace, "hung"), "the job's objects to go")
