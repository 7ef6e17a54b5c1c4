"""Refusals that only a real API server gives, each reaching a job's reason: `paddlecloud
server` with `jobs.backend: kubernetes` on the real control plane (tests/kube_real), the
jobs service authenticating with a token of the ServiceAccount the Helm chart renders,
read with the real CLI (`paddlecloud -o json get job NAME`).

- the chart's RBAC minus the rule for StatefulSets: the create is refused 403 and the job
  FAILS naming the right it lacks (and leaves nothing behind); a job that needs no
  StatefulSet says that the service may not watch them;
- a hostPath PFS volume in a namespace that enforces PodSecurity `restricted`: the Job
  controller's FailedCreate event reaches the job's reason, and the job FAILS;
- a user's namespace held Terminating: the job waits PENDING, saying why, and starts once
  the namespace is gone and made again.
(The fourth, an invalid Job spec, needs the manifests mutated in-process:
tests/component/test_submit_refusals.py.)
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_jobs_cli import as_json, make_package, ok, run_cli

from kube_real import KubeClient
from kube_real.chart import ChartRights, install_rights
from kube_real.fixtures import RealKube
from paddlecloud.jobs.kube.names import LABEL_JOB, MANAGED_BY, MANAGER, namespace_for

Obj = dict[str, Any]

DC = "datacenter1"
ENDED = ("SUCCEEDED", "FAILED", "KILLED")
# Every kind a job makes, by the API path of its collection in a namespace.
JOB_KINDS = {
    "configmaps": "/api/v1/namespaces/{ns}/configmaps",
    "services": "/api/v1/namespaces/{ns}/services",
    "secrets": "/api/v1/namespaces/{ns}/secrets",
    "pods": "/api/v1/namespaces/{ns}/pods",
    "statefulsets": "/apis/apps/v1/namespaces/{ns}/statefulsets",
    "jobs": "/apis/batch/v1/namespaces/{ns}/jobs",
    "networkpolicies": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
}


@dataclass
class KubeServer:
    """A `paddlecloud server` on the real control plane with the chart's rights, whose
    users' namespaces (or its one shared namespace) start with `prefix`."""

    server: Any
    rights: ChartRights
    prefix: str
    admin: KubeClient
    shared: str | None = None  # the shared namespace, in shared mode

    @property
    def namespace(self) -> str:
        """Where the admin's jobs run."""
        return self.shared or namespace_for("admin", self.prefix)

    def job(self, name: str) -> Obj:
        return dict(as_json(run_cli(self.server, "-o", "json", "get", "job", name)))

    def submit(self, tmp_path: Path, name: str, *flags: str) -> Obj:
        package = tmp_path / f"pkg-{name}"
        if not package.exists():
            make_package(package)
        ok(run_cli(self.server, "submit", "--name", name, *flags, str(package)))
        return self.job(name)

    def wait_job(self, name: str, until: Callable[[Obj], bool], what: str, timeout: float = 60) -> Obj:
        """The job as `get job` shows it once `until` holds; fails naming `what`, with the
        job as last seen."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(name)
            if until(job):
                return job
            assert time.monotonic() < deadline, f"{name}: no {what} in {timeout:.0f} s: {job}"
            time.sleep(0.3)

    def wait_nothing_left(self, job: str, timeout: float = 60) -> None:
        """Returns once none of the job's objects is left (the garbage collector removes
        what the deleted owner owned, in the background)."""
        deadline = time.monotonic() + timeout
        while left := self.objects_of(job):
            assert time.monotonic() < deadline, f"{job}: still there after {timeout:.0f} s: {left}"
            time.sleep(0.3)

    def objects_of(self, job: str) -> list[str]:
        """What is left in the job's namespace of the job's objects."""
        found = []
        for kind, path in JOB_KINDS.items():
            listing = self.admin.get(
                path.format(ns=self.namespace), query={"labelSelector": f"{LABEL_JOB}={job}"}
            )
            found += [f"{kind}/{o['metadata']['name']}" for o in listing["items"]]
        return found


@pytest.fixture
def kube_server(
    real_kube: RealKube, server_factory: Any, tmp_path: Path
) -> Iterator[Callable[..., KubeServer]]:
    """Starts `paddlecloud server` on the real control plane: `start(sets=..., mutate=...,
    shared_labels=..., **settings)`; `sets` and `mutate` go to the chart's rights
    (kube_real.chart.install_rights), `shared_labels` makes the namespace shared mode runs
    in (the operator's, labelled so), `settings` override `jobs.kubernetes`. Afterwards the
    server stops and everything the test made goes: its namespaces and the rights."""
    admin = real_kube.cluster.admin
    made: list[KubeServer] = []

    def start(
        *,
        sets: tuple[str, ...] = (),
        mutate: Callable[[list[Obj]], None] | None = None,
        shared_labels: dict[str, str] | None = None,
        **settings: Any,
    ) -> KubeServer:
        token = secrets.token_hex(3)
        prefix = f"t{token}-"
        shared = None
        if shared_labels is not None:
            shared = f"{prefix}jobs"
            admin.create("/api/v1/namespaces", {"metadata": {"name": shared, "labels": shared_labels}})
            # Until the ServiceAccount controller made `default`, its admission plugin
            # refuses every pod there, before PodSecurity looks.
            admin.wait_for(f"/api/v1/namespaces/{shared}/serviceaccounts", lambda _: True, name="default")
            sets = (*sets, "jobs.kubernetes.namespaceMode=shared", f"jobs.kubernetes.namespace={shared}")
            settings = {"namespace_mode": "shared", "namespace": shared, **settings}
        rights = install_rights(real_kube.cluster, tmp_path, f"pcjobs-{token}", sets=sets, mutate=mutate)
        kube = KubeServer(None, rights, prefix, admin, shared)
        made.append(kube)
        kubernetes = {
            "kubeconfig": str(rights.kubeconfig),
            "namespace_prefix": prefix,
            "datacenters": {DC: {"kind": "hostpath", "host_path": "/srv/paddlecloud-pfs"}},
            "watch_timeout_seconds": 5,
            "max_backoff_seconds": 1,
            "quota_sync_seconds": 0.5,
            **settings,
        }
        config = tmp_path / f"server-{token}.yaml"
        config.write_text(yaml.safe_dump({"jobs": {"backend": "kubernetes", "kubernetes": kubernetes}}))
        kube.server = server_factory(
            "--server-config",
            str(config),
            home=tmp_path / f"home-{token}",
            data_dir=tmp_path / f"data-{token}",
        )
        return kube

    yield start
    for kube in made:
        if kube.server is not None:
            kube.server.stop()
        for namespace in admin.get("/api/v1/namespaces")["items"]:
            if namespace["metadata"]["name"].startswith(kube.prefix):
                admin.request("DELETE", f"/api/v1/namespaces/{namespace['metadata']['name']}")
        kube.rights.remove()


def without_rule(resource: str) -> Callable[[list[Obj]], None]:
    """A mutation of the chart's rights: the rule for `resource` dropped from every role."""

    def drop(objects: list[Obj]) -> None:
        dropped = 0
        for obj in objects:
            if obj["kind"] in ("ClusterRole", "Role"):
                rules = obj["rules"]
                obj["rules"] = [r for r in rules if resource not in r.get("resources", ())]
                dropped += len(rules) - len(obj["rules"])
        assert dropped, f"the chart gives no rule for {resource}"

    return drop


def test_a_right_missing_from_the_chart_fails_the_job_naming_it_and_leaves_nothing(
    kube_server: Callable[..., KubeServer], tmp_path: Path
) -> None:
    """FAILED, not PENDING: nothing but a mended installation lets the job start (RBAC's
    403 is no outage), and the reason tells the user it is the operator's to mend."""
    kube = kube_server(mutate=without_rule("statefulsets"))
    kube.submit(tmp_path, "norights", "--pservers", "1", "--trainers", "1")
    job = kube.wait_job("norights", lambda j: j["state"] in ENDED, "end")
    assert job["state"] == "FAILED", job
    reason = job["reason"]
    assert reason.startswith("Kubernetes refused the job: create StatefulSet norights-pserver: "), reason
    account = f"system:serviceaccount:{kube.rights.namespace}:{kube.rights.account}"
    assert f'User "{account}" cannot create resource "statefulsets" in API group "apps"' in reason, reason
    assert "an operator must grant it" in reason, reason
    assert [e["reason"] for e in job["events"]] == ["JobSubmitted", "JobFailed"], job["events"]
    # The owner made before the refusal was deleted, and what it owned with it.
    kube.wait_nothing_left("norights")
    # Nor may the service watch StatefulSets: a job without parameter servers is made,
    # and says why its state cannot be followed (not "the API is not answering").
    kube.submit(tmp_path, "unwatched")
    refused = f'User "{account}" cannot list resource "statefulsets" in API group "apps" at the cluster scope'
    job = kube.wait_job("unwatched", lambda j: refused in j["reason"], "the refused watch in its reason")
    assert job["reason"].startswith("the jobs service may not watch StatefulSets (list StatefulSet: "), job
    assert "an operator must grant it" in job["reason"], job


def test_pod_security_refusing_a_hostpath_volume_fails_the_job_in_its_words(
    kube_server: Callable[..., KubeServer], tmp_path: Path
) -> None:
    """The operator's shared namespace enforces `restricted`, the datacenter is a hostPath:
    the API server takes the Job, its controller's pods are refused. FAILED: neither the
    pods' volume nor the namespace's level changes while the job waits."""
    kube = kube_server(shared_labels={"pod-security.kubernetes.io/enforce": "restricted"})
    kube.submit(tmp_path, "psa")
    job = kube.wait_job("psa", lambda j: j["state"] in ENDED, "end")
    assert job["state"] == "FAILED", job
    reason = job["reason"]
    assert reason.startswith("Kubernetes refuses its pods (Pod Security admission): "), reason
    refused = (
        'violates PodSecurity "restricted:latest": restricted volume types '
        '(volume "pfs" uses restricted volume type "hostPath")'
    )
    assert refused in reason, reason
    assert job["events"][-1]["reason"] == "JobFailed" and job["events"][-1]["message"] == reason
    kube.wait_nothing_left("psa")


HOLD = "paddlecloud.test/hold"


def hold_finalizer(admin: KubeClient, namespace: str, held: bool) -> Obj:
    """Adds or removes a finalizer of the test's in the namespace's spec (only the finalize
    subresource may change them): a namespace being deleted stays Terminating while it is
    there, and goes at once when it is the last to go."""
    path = f"/api/v1/namespaces/{namespace}"
    while True:
        obj = admin.get(path)
        kept = [f for f in obj["spec"].get("finalizers", ()) if f != HOLD]
        obj["spec"]["finalizers"] = [*kept, HOLD] if held else kept
        reply = admin.request("PUT", f"{path}/finalize", obj)
        if reply.status != 409:  # 409: changed meanwhile (the namespace controller); again
            assert reply.status == 200, reply
            return dict(reply.body)


def test_a_job_waits_while_its_namespace_terminates_then_starts_in_it_made_again(
    kube_server: Callable[..., KubeServer], tmp_path: Path
) -> None:
    kube = kube_server()
    admin, namespace = kube.admin, kube.namespace
    # A first job made the user's namespace (and the service remembers it made it).
    kube.submit(tmp_path, "first")
    assert kube.wait_job("first", lambda j: j["state"] in ENDED, "end")["state"] == "SUCCEEDED"
    old = hold_finalizer(admin, namespace, held=True)
    admin.call("DELETE", f"/api/v1/namespaces/{namespace}")
    try:
        assert admin.get(f"/api/v1/namespaces/{namespace}")["status"]["phase"] == "Terminating"
        kube.submit(tmp_path, "second")
        why = f"the namespace {namespace} is being deleted; the job starts once it is gone and made again"
        job = kube.wait_job("second", lambda j: j["reason"] == why or j["state"] != "PENDING", "reason")
        assert (job["state"], job["reason"]) == ("PENDING", why), job
        waiting = [e for e in job["events"] if e["reason"] == "WaitingForResources"]
        assert [e["message"] for e in waiting] == [why], job["events"]
    finally:
        hold_finalizer(admin, namespace, held=False)
    job = kube.wait_job("second", lambda j: j["state"] in ENDED, "end")
    assert (job["state"], job["reason"]) == ("SUCCEEDED", "every trainer exited 0"), job
    made = admin.get(f"/api/v1/namespaces/{namespace}")
    assert made["metadata"]["uid"] != old["metadata"]["uid"]
    assert made["metadata"]["labels"][MANAGED_BY] == MANAGER
    kube.wait_nothing_left("second")
