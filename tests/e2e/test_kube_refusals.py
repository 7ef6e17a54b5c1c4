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
  the namespace is gone and made again;
- in an operator's shared namespace: pods refused while its ServiceAccount is missing (the
  job waits, and runs once it is made), refused by a LimitRange's maximum (the job FAILS),
  and a PFS volume that does not mount (simulated kubelet: the job waits), each in the
  words of the Warning Event that told it.
(Another, an invalid Job spec, needs the manifests mutated in-process:
tests/component/test_submit_refusals.py.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import kube_backend_support as kb
import pytest

from kube_real import KubeClient, PodScript
from kube_real.fixtures import RealKube
from paddlecloud.jobs.kube.names import MANAGED_BY, MANAGER

Obj = dict[str, Any]

ENDED = ("SUCCEEDED", "FAILED", "KILLED")


@pytest.fixture
def kube_server(
    real_kube: RealKube, server_factory: Any, tmp_path: Path
) -> Iterator[Callable[..., kb.KubeBackend]]:
    """Starts `paddlecloud server` on the real control plane, as
    `kube_backend_support.kube_backend(sets=..., mutate=..., shared_labels=...,
    **settings)` does; stopped, and all it made deleted, after the test."""
    with ExitStack() as stack:

        def start(**options: Any) -> kb.KubeBackend:
            backend: kb.KubeBackend = stack.enter_context(
                kb.kube_backend(real_kube, server_factory, tmp_path, **options)
            )
            return backend

        yield start


def ended(backend: kb.KubeBackend, name: str, what: str = "its end") -> Obj:
    """The job once it ended, as `get job` shows it."""
    job: Obj = kb.wait(lambda: (j := backend.job(name))["state"] in ENDED and j, f"{name}: {what}")
    return job


def nothing_left(backend: kb.KubeBackend, job: str) -> None:
    """Returns once none of the job's objects is left (the garbage collector removes what
    the deleted owner owned, in the background)."""
    kb.wait(lambda: not backend.objects_of(job), f"nothing left of {job}")


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
    kube_server: Callable[..., kb.KubeBackend],
) -> None:
    """FAILED, not PENDING: nothing but a mended installation lets the job start (RBAC's
    403 is no outage), and the reason tells the user it is the operator's to mend."""
    kube = kube_server(mutate=without_rule("statefulsets"))
    kube.submit("norights", "--pservers", "1", "--trainers", "1")
    job = ended(kube, "norights")
    assert job["state"] == "FAILED", job
    reason = job["reason"]
    assert reason.startswith("Kubernetes refused the job: create StatefulSet norights-pserver: "), reason
    account = f"system:serviceaccount:{kube.rights.namespace}:{kube.rights.account}"
    assert f'User "{account}" cannot create resource "statefulsets" in API group "apps"' in reason, reason
    assert "an operator must grant it" in reason, reason
    assert [e["reason"] for e in job["events"]] == ["JobSubmitted", "JobFailed"], job["events"]
    # The owner made before the refusal was deleted, and what it owned with it.
    nothing_left(kube, "norights")
    # Nor may the service watch StatefulSets: a job without parameter servers is made,
    # and says why its state cannot be followed (not "the API is not answering").
    kube.submit("unwatched")
    refused = (
        f'User "{account}" cannot list resource "statefulsets" in API group "apps" '
        f'in the namespace "{kube.namespace()}"'
    )
    job = kb.wait(lambda: refused in (j := kube.job("unwatched"))["reason"] and j, "the refused watch")
    assert job["reason"].startswith("the jobs service may not watch StatefulSets (list StatefulSet: "), job
    assert "an operator must grant it" in job["reason"], job


def test_pod_security_refusing_a_hostpath_volume_fails_the_job_in_its_words(
    kube_server: Callable[..., kb.KubeBackend],
) -> None:
    """The operator's shared namespace enforces `restricted`, the datacenter is a hostPath:
    the API server takes the Job, its controller's pods are refused. FAILED: neither the
    pods' volume nor the namespace's level changes while the job waits."""
    kube = kube_server(shared_labels={"pod-security.kubernetes.io/enforce": "restricted"})
    kube.submit("psa")
    job = ended(kube, "psa")
    assert job["state"] == "FAILED", job
    reason = job["reason"]
    assert reason.startswith("Kubernetes refuses its pods (Pod Security admission): "), reason
    refused = (
        'violates PodSecurity "restricted:latest": restricted volume types '
        '(volume "pfs" uses restricted volume type "hostPath")'
    )
    assert refused in reason, reason
    assert job["events"][-1]["reason"] == "JobFailed" and job["events"][-1]["message"] == reason
    nothing_left(kube, "psa")


def test_a_job_waits_while_its_namespace_terminates_then_starts_in_it_made_again(
    kube_server: Callable[..., kb.KubeBackend],
) -> None:
    kube = kube_server()
    admin, namespace = kube.kube.cluster.admin, kube.namespace()
    # A first job made the user's namespace (and the service remembers it made it).
    kube.submit("first")
    assert ended(kube, "first")["state"] == "SUCCEEDED"
    old = kb.hold_finalizer(admin, namespace, held=True)
    admin.call("DELETE", f"/api/v1/namespaces/{namespace}")
    try:
        assert admin.get(f"/api/v1/namespaces/{namespace}")["status"]["phase"] == "Terminating"
        kube.submit("second")
        why = f"the namespace {namespace} is being deleted; the job starts once it is gone and made again"
        job = kb.wait(
            lambda: ((j := kube.job("second"))["reason"] == why or j["state"] != "PENDING") and j,
            "its reason",
        )
        assert (job["state"], job["reason"]) == ("PENDING", why), job
        waiting = [e for e in job["events"] if e["reason"] == "WaitingForResources"]
        assert [e["message"] for e in waiting] == [why], job["events"]
    finally:
        kb.hold_finalizer(admin, namespace, held=False)
    job = ended(kube, "second")
    assert (job["state"], job["reason"]) == ("SUCCEEDED", "every trainer exited 0"), job
    made = admin.get(f"/api/v1/namespaces/{namespace}")
    assert made["metadata"]["uid"] != old["metadata"]["uid"]
    assert made["metadata"]["labels"][MANAGED_BY] == MANAGER
    nothing_left(kube, "second")


@contextmanager
def without_default_account(admin: KubeClient, namespace: str) -> Iterator[None]:
    """The namespace's `default` ServiceAccount deleted, and kept from being made again
    meanwhile: the ServiceAccount controller remakes it at once, so a ValidatingAdmissionPolicy
    of the test's denies creating it there (the controller's tries are refused too). The
    policy's binding is in force once a dry-run create is denied by it (policies are loaded
    asynchronously); on leaving, the policy goes and the test makes the account itself."""
    name = f"{namespace}-no-default-account"
    policies = "/apis/admissionregistration.k8s.io/v1"
    rule = {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["CREATE"],
        "resources": ["serviceaccounts"],
    }
    admin.create(
        f"{policies}/validatingadmissionpolicies",
        {
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [rule]},
                "validations": [{"expression": "object.metadata.name != 'default'", "message": name}],
            },
        },
    )
    admin.create(
        f"{policies}/validatingadmissionpolicybindings",
        {
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        },
    )
    accounts = f"/api/v1/namespaces/{namespace}/serviceaccounts"
    try:
        kb.wait(
            lambda: (
                name in str(admin.request("POST", accounts, DEFAULT_ACCOUNT, query={"dryRun": "All"}).body)
            ),
            "the test's policy in force",
        )
        admin.call("DELETE", f"{accounts}/default")
        yield
    finally:
        admin.request("DELETE", f"{policies}/validatingadmissionpolicybindings/{name}")
        admin.request("DELETE", f"{policies}/validatingadmissionpolicies/{name}")
    # The controller's next try may come later than the test wants; a 409 says it came first.
    kb.wait(lambda: admin.request("POST", accounts, DEFAULT_ACCOUNT).status in (201, 409), "the account made")


DEFAULT_ACCOUNT = {"metadata": {"name": "default"}}


def test_refusals_of_pods_and_volumes_reach_the_reason_in_words(
    kube_server: Callable[..., kb.KubeBackend], real_kube: RealKube
) -> None:
    """In the operator's shared namespace: pods refused while its ServiceAccount is missing
    (the job waits, and runs once it is made), refused by a LimitRange's maximum (the job
    FAILS: its pods never fit), and a volume that does not mount (the job waits)."""
    kube = kube_server(shared_labels={})
    admin, namespace = kube.kube.cluster.admin, kube.namespace()
    with without_default_account(admin, namespace):
        kube.submit("noaccount")
        why = "its pods wait for the namespace's ServiceAccount to be made: "
        job = kb.wait(lambda: (j := kube.job("noaccount"))["reason"].startswith(why) and j, "the reason")
        assert job["state"] == "PENDING", job
        missing = f'error looking up service account {namespace}/default: serviceaccount "default" not found'
        assert missing in job["reason"], job
    job = ended(kube, "noaccount")
    assert (job["state"], job["reason"]) == ("SUCCEEDED", "every trainer exited 0"), job

    limits = {
        "metadata": {"name": "small"},
        "spec": {"limits": [{"type": "Container", "max": {"cpu": "500m"}}]},
    }
    admin.create(f"/api/v1/namespaces/{namespace}/limitranges", limits)
    kube.submit("toobig")  # a trainer asks for 1 cpu
    job = ended(kube, "toobig")
    assert job["state"] == "FAILED", job
    assert job["reason"].startswith("the namespace's LimitRange refuses its pods: "), job
    assert "maximum cpu usage per Container is 500m, but limit is 1" in job["reason"], job
    nothing_left(kube, "toobig")
    admin.call("DELETE", f"/api/v1/namespaces/{namespace}/limitranges/small")

    error = "mount failed: exit status 32: mount error(13): Permission denied"
    with real_kube.scripted(kb.script(trainer=lambda _: PodScript(mount_error=error))):
        kube.submit("nomount")
        why = 'a volume of its pods does not mount: MountVolume.SetUp failed for volume "pfs" : '
        job = kb.wait(lambda: (j := kube.job("nomount"))["reason"].startswith(why) and j, "the reason")
    assert job["state"] == "PENDING", job
    assert job["reason"].startswith(f"{why}{error} (pod nomount-trainer-0-"), job
