"""What the jobs service may do on a shared cluster, as the real API server enforces it
(issue 31, findings 1-3): the token the Helm chart gives it (tests/kube_real/chart.py
installs the chart's ClusterRoles, tenant role and ValidatingAdmissionPolicy) is refused
everywhere but in the namespaces of its own release; a namespace named `<prefix><user>`
that it did not make is left exactly as it was while the user's job waits, saying why;
two releases on one cluster run their jobs side by side through restarts of both.

docs/kubernetes.md, "What the service can do, and why", describes the model.
"""

from __future__ import annotations

import secrets
import signal
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import kube_backend_support as kb
import pytest
from test_jobs_cli import ok, run_cli

import kube_real
from kube_real.chart import install_rights
from kube_real.client import KubeClient
from kube_real.fixtures import RealKube
from paddlecloud.jobs.kube import names

Obj = dict[str, Any]
RBAC = "/apis/rbac.authorization.k8s.io/v1"
# What a namespace holds that nobody made in it: the root CA publisher's ConfigMap, the
# ServiceAccount controller's `default`.
BUILT_IN = {"configmaps/kube-root-ca.crt", "serviceaccounts/default"}
NAMESPACED = {
    "configmaps": "/api/v1",
    "secrets": "/api/v1",
    "serviceaccounts": "/api/v1",
    "resourcequotas": "/api/v1",
    "limitranges": "/api/v1",
    "networkpolicies": "/apis/networking.k8s.io/v1",
    "rolebindings": RBAC,
    "jobs": "/apis/batch/v1",
}


def refused(reply: kube_real.Reply, what: str) -> str:
    assert reply.status == 403, f"{what}: {reply.status} {reply.message}"
    return reply.message


def contents(admin: KubeClient, namespace: str) -> set[str]:
    """Every object in `namespace` of the kinds the service makes, as `<plural>/<name>`."""
    found = set()
    for plural, base in NAMESPACED.items():
        for obj in admin.get(f"{base}/namespaces/{namespace}/{plural}")["items"]:
            found.add(f"{plural}/{obj['metadata']['name']}")
    return found


def binding(name: str, role: str, account: str, namespace: str) -> Obj:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }


def test_the_services_token_is_refused_outside_its_own_namespaces(
    real_kube: RealKube, tmp_path: Path
) -> None:
    """Each a 403 from the real API server: RBAC (no namespaced right cluster-wide) or the
    chart's admission policy (namespaces and RoleBindings of other releases)."""
    admin = real_kube.cluster.admin
    token = secrets.token_hex(2)
    rights = install_rights(real_kube.cluster, tmp_path, f"pcjobs-{token}")
    service = rights.client()
    foreign, own = f"t{token}-team", f"t{token}-alice"
    pod = {"restartPolicy": "Never", "containers": [{"name": "x", "image": "busybox"}]}
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "x"},
        "spec": {"template": {"spec": pod}},
    }
    # Every change is a dry run: authorization and admission answer it alike, and a
    # service with the rights of old (a ClusterRole over every namespace) changes nothing.
    dry = {"dryRun": "All"}
    try:
        admin.create("/api/v1/namespaces", {"metadata": {"name": foreign, "labels": {"team": "ops"}}})
        admin.create(f"/api/v1/namespaces/{foreign}/secrets", {"metadata": {"name": "s"}, "data": {}})
        before = admin.get(f"/api/v1/namespaces/{foreign}")
        for namespace in ("kube-system", foreign):
            refused(
                service.request("POST", f"/apis/batch/v1/namespaces/{namespace}/jobs", job, query=dry),
                namespace,
            )
            refused(service.request("GET", f"/api/v1/namespaces/{namespace}/secrets/s"), "a Secret")
            refused(service.request("GET", f"/api/v1/namespaces/{namespace}/pods"), "its pods")
        refused(service.request("GET", "/api/v1/pods"), "every pod")
        ours = {
            names.LABEL_RELEASE: names.release_label(rights.settings["release"]),
            names.MANAGED_BY: names.MANAGER,
        }
        for namespace in ("kube-system", foreign):
            # Not even by claiming it: patching in the release's label is a change too.
            patch = {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged", **ours}}}
            message = refused(
                service.request(
                    "PATCH",
                    f"/api/v1/namespaces/{namespace}",
                    patch,
                    query=dry,
                    content_type="application/merge-patch+json",
                ),
                f"patching {namespace}",
            )
            assert "ValidatingAdmissionPolicy" in message and "only namespaces of its release" in message
            refused(
                service.request("DELETE", f"/api/v1/namespaces/{namespace}", query=dry),
                f"deleting {namespace}",
            )
            refused(
                service.request(
                    "POST",
                    f"{RBAC}/namespaces/{namespace}/rolebindings",
                    binding("x", rights.settings["tenant_role"], rights.account, rights.namespace),
                    query=dry,
                ),
                f"granting itself rights in {namespace}",
            )
        after = admin.get(f"/api/v1/namespaces/{foreign}")
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        refused(
            service.request(
                "POST", "/api/v1/namespaces", {"metadata": {"name": f"t{token}-bare"}}, query=dry
            ),
            "a namespace without the release's label",
        )
        # Its own namespace: made, and its own rights bound there, and nothing more.
        made = service.call("POST", "/api/v1/namespaces", {"metadata": {"name": own, "labels": ours}})
        assert made["metadata"]["labels"][names.LABEL_RELEASE] == ours[names.LABEL_RELEASE]
        tenant = rights.settings["tenant_role"]
        refused(
            service.request(
                "POST",
                f"{RBAC}/namespaces/{own}/rolebindings",
                binding("x", "admin", rights.account, rights.namespace),
            ),
            "binding another ClusterRole",
        )
        refused(
            service.request(
                "POST",
                f"{RBAC}/namespaces/{own}/rolebindings",
                binding("x", tenant, "default", rights.namespace),
            ),
            "binding the tenant role to another account",
        )
        service.call(
            "POST",
            f"{RBAC}/namespaces/{own}/rolebindings",
            binding("x", tenant, rights.account, rights.namespace),
        )
        kb.wait(
            lambda: service.request("GET", f"/apis/batch/v1/namespaces/{own}/jobs").status == 200,
            "the tenant role in effect in its own namespace",
        )
        # ... whose release label it may not take off.
        unlabel = {"metadata": {"labels": {names.LABEL_RELEASE: None}}}
        refused(
            service.request(
                "PATCH", f"/api/v1/namespaces/{own}", unlabel, content_type="application/merge-patch+json"
            ),
            "unlabelling its own namespace",
        )
        assert service.request("DELETE", f"/api/v1/namespaces/{own}").status == 200
    finally:
        for namespace in (foreign, own):
            admin.request("DELETE", f"/api/v1/namespaces/{namespace}")
        rights.remove()


def test_a_namespace_it_did_not_make_is_left_as_it_was_and_the_job_waits_saying_why(
    real_kube: RealKube, server_factory: Any, tmp_path: Path
) -> None:
    """A team's namespace happens to be `<prefix><user>`: nothing in it changes (not a
    label, no policy, no RoleBinding), the user's job stays PENDING naming it and what an
    admin can do, and deleting a user of that name leaves it."""
    admin = real_kube.cluster.admin
    prefix = f"t{secrets.token_hex(2)}-"
    squatted = {}
    for user in ("admin", "ops"):
        namespace = f"{prefix}{user}"
        admin.create("/api/v1/namespaces", {"metadata": {"name": namespace, "labels": {"team": user}}})
        admin.create(f"/api/v1/namespaces/{namespace}/configmaps", {"metadata": {"name": "team-config"}})
        admin.wait_for(f"/api/v1/namespaces/{namespace}/serviceaccounts", lambda _: True, name="default")
        squatted[namespace] = (admin.get(f"/api/v1/namespaces/{namespace}"), contents(admin, namespace))
    with kb.kube_backend(real_kube, server_factory, tmp_path, prefix=prefix) as k:
        k.submit("clash")
        job = kb.wait(
            lambda: "not made by this installation" in (j := k.job("clash"))["reason"] and j, "the reason"
        )
        assert job["state"] == "PENDING", job
        reason = job["reason"]
        assert f"the namespace {prefix}admin exists" in reason, reason
        assert (
            "rename the user" in reason and "namespacePrefix" in reason and "remove that namespace" in reason
        )
        k.server.cli("users", "create", "ops", "--password-stdin", stdin="ops-password\n")
        k.server.cli("users", "delete", "ops")
        ok(run_cli(k.server, "kill", "clash"))
        for namespace, (before, objects) in squatted.items():
            now = admin.get(f"/api/v1/namespaces/{namespace}")
            assert now["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], namespace
            assert now["metadata"]["labels"] == before["metadata"]["labels"]
            assert now["status"]["phase"] == "Active"
            assert contents(admin, namespace) == objects, namespace
            assert objects == BUILT_IN | {"configmaps/team-config"}


def test_a_job_waiting_on_its_users_namespace_holds_back_no_one_elses(
    real_kube: RealKube, server_factory: Any, tmp_path: Path
) -> None:
    """The start queue is first come, first started, but a job that waits for what only its
    user lacks (here: a namespace of that name the service did not make) is passed: bob's
    job queued behind it (his namespace was being deleted) starts once it can."""
    admin = real_kube.cluster.admin
    prefix = f"t{secrets.token_hex(2)}-"
    squatted = f"{prefix}admin"
    admin.create("/api/v1/namespaces", {"metadata": {"name": squatted, "labels": {"team": "admin"}}})
    try:
        with kb.kube_backend(real_kube, server_factory, tmp_path, prefix=prefix) as k:
            server, as_bob = k.server, ("--datacenter", "as-bob")
            server.cli("users", "create", "bob", "--password-stdin", stdin="bob-password\n")
            server.add_datacenter("as-bob", "bob", "bob-password")
            ok(run_cli(server, *as_bob, "submit", "--name", "first", str(k.package())))
            assert k.wait_for_state("first", ("SUCCEEDED", "FAILED"), *as_bob)["state"] == "SUCCEEDED"
            bob = k.namespace("bob")
            kb.hold_finalizer(admin, bob, held=True)
            admin.call("DELETE", f"/api/v1/namespaces/{bob}")
            try:
                k.submit("clash")  # first in the queue, and it stays there
                kb.wait(lambda: "not made by this installation" in k.job("clash")["reason"], "clash waits")
                ok(run_cli(server, *as_bob, "submit", "--name", "second", str(k.package())))
                kb.wait(lambda: "is being deleted" in k.job("second", *as_bob)["reason"], "second waits")
            finally:
                kb.hold_finalizer(admin, bob, held=False)
            job = k.wait_for_state("second", ("SUCCEEDED", "FAILED"), *as_bob, timeout=90)
            assert (job["state"], job["reason"]) == ("SUCCEEDED", "every trainer exited 0"), job
            clash = k.job("clash")
            assert clash["state"] == "PENDING" and "not made by this installation" in clash["reason"], clash
    finally:
        admin.call("DELETE", f"/api/v1/namespaces/{squatted}")


@pytest.fixture
def two_servers(real_kube: RealKube, server_factory: Any, tmp_path: Path) -> Iterator[list[kb.KubeBackend]]:
    """Two releases (each its own chart rights, so its own release) whose users'
    namespaces share one prefix, each `paddlecloud server` with a home of its own."""
    prefix = f"t{secrets.token_hex(2)}-"
    with ExitStack() as stack:
        started = []
        for name in ("a", "b"):
            root = tmp_path / name
            root.mkdir()

            def start(*args: str, root: Path = root) -> Any:
                return server_factory(*args, home=root / "home", data_dir=root / "data")

            started.append(stack.enter_context(kb.kube_backend(real_kube, start, root, prefix=prefix)))
        yield started


def restart_jobs_service(k: kb.KubeBackend) -> None:
    """Kill the jobs service; `paddlecloud server` starts it again, which resumes and sweeps
    before it answers."""
    jobs = k.server.services()["jobs"]
    jobs.send_signal(signal.SIGKILL)
    jobs.wait(timeout=10)
    kb.wait(
        lambda: (
            (s := k.server.services().get("jobs")) is not None
            and s.pid != jobs.pid
            and run_cli(k.server, "-o", "json", "get", "jobs").returncode == 0
        ),
        "the jobs service started again",
    )


def test_two_releases_run_jobs_side_by_side_through_restarts(
    real_kube: RealKube, two_servers: list[kb.KubeBackend]
) -> None:
    """Release a runs the admin's job, release b bob's, both in the same prefix's
    namespaces; each service is restarted twice while both run (each start sweeps what it
    thinks is left over), and both jobs end SUCCEEDED. b's admin, whose namespace a made,
    waits, saying whose it is: a clash of names is never silent."""
    a, b = two_servers
    b.server.cli("users", "create", "bob", "--password-stdin", stdin="bob-password\n")
    b.server.add_datacenter("as-bob", "bob", "bob-password")
    release = threading.Event()
    trainer = kb.script(trainer=lambda pod: kube_real.PodScript(lines=("working",), until=release))
    try:
        with real_kube.scripted(trainer):
            a.submit("side", "--pservers", "1")
            ok(run_cli(b.server, "--datacenter", "as-bob", "submit", "--name", "side", str(b.package())))
            for k, flags in ((a, ()), (b, ("--datacenter", "as-bob"))):
                k.wait_for_state("side", ("RUNNING",), *flags)
            for _ in range(2):
                for k in (a, b):
                    restart_jobs_service(k)
                    assert a.objects_of("side", "admin") and b.objects_of("side", "bob")
                    assert a.job("side")["state"] == "RUNNING"
                    assert b.job("side", "--datacenter", "as-bob")["state"] == "RUNNING"
            b.submit("clash")
            job = kb.wait(lambda: "another PaddleCloud" in (j := b.job("clash"))["reason"] and j, "the clash")
            theirs = names.release_label(a.rights.settings["release"])
            assert job["state"] == "PENDING" and f"(release {theirs})" in job["reason"], job
            ok(run_cli(b.server, "kill", "clash"))
            release.set()
            done = [
                a.wait_for_state("side", ("SUCCEEDED", "FAILED", "KILLED"), timeout=90),
                b.wait_for_state(
                    "side", ("SUCCEEDED", "FAILED", "KILLED"), "--datacenter", "as-bob", timeout=90
                ),
            ]
    finally:
        release.set()
    assert [j["state"] for j in done] == ["SUCCEEDED", "SUCCEEDED"], done
    kb.wait(lambda: not a.objects_of("side", "admin") and not b.objects_of("side", "bob"), "nothing left")
