"""The kubernetes jobs backend's end-to-end tests, shared: `paddlecloud server` with
`jobs.backend: kubernetes` on the session's real control plane (tests/kube_real), its jobs
service authenticating with the jobs-service token the Helm chart's RBAC gives (never
rbac.py), and what those tests ask of it (submit, wait, the objects a job left).

Every test gets names of its own on the shared cluster: the chart's rights in a namespace
`pcjobs-<hex>` and the users' namespaces under a `t<hex>-` prefix, both deleted after it."""

from __future__ import annotations

import queue
import secrets
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from test_jobs_cli import as_json, make_package, ok, run_cli

from kube_real import KubeClient, PodScript
from kube_real.chart import ChartRights, install_rights
from kube_real.fixtures import RealKube
from paddlecloud.jobs.kube.names import COMPLETION_INDEX, LABEL_JOB, LABEL_ROLE, POD_INDEX, namespace_for

Obj = dict[str, Any]
DC = "datacenter1"
# Where a job's objects live in the API, for `objects_of`: everything the backend makes
# for a job carries its name in LABEL_JOB.
JOB_COLLECTIONS = {
    "configmaps": "/api/v1",
    "statefulsets": "/apis/apps/v1",
    "jobs": "/apis/batch/v1",
    "services": "/api/v1",
    "pods": "/api/v1",
    "secrets": "/api/v1",
    "networkpolicies": "/apis/networking.k8s.io/v1",
}


def kube_settings(kubeconfig: Path | str, prefix: str, **overrides: Any) -> Obj:
    """`jobs.kubernetes` for a test: short timings, and a `hostpath` datacenter (a `pvc`
    one needs a claim in each user's namespace, which no test makes)."""
    return {
        "kubeconfig": str(kubeconfig),
        "namespace_prefix": prefix,
        "datacenters": {DC: {"kind": "hostpath", "host_path": "/srv/pfs"}},
        "watch_timeout_seconds": 5,
        "max_backoff_seconds": 1,
        "quota_sync_seconds": 0.5,
        "image_pull_timeout_seconds": 3,
        **overrides,
    }


def write_server_config(path: Path, settings: Obj, jobs: Obj | None = None, **sections: Obj) -> Path:
    """A `--server-config` YAML with the kubernetes backend and `settings`, `jobs`' other
    settings (`metrics`), and any other sections (`builder=...`) as given."""
    jobs_section = {"backend": "kubernetes", "kubernetes": settings, **(jobs or {})}
    path.write_text(yaml.safe_dump({"jobs": jobs_section, **sections}))
    return path


def role_of(pod: Obj) -> str:
    return str(pod["metadata"]["labels"].get(LABEL_ROLE))


def index_of(pod: Obj) -> int:
    """A pod's trainer id (the Indexed Job's index) or parameter server index."""
    labels = pod["metadata"]["labels"]
    return int(labels.get(COMPLETION_INDEX, labels.get(POD_INDEX, -1)))


def script(**by_role: Callable[[Obj], PodScript]) -> Callable[[Obj], PodScript]:
    """A kubelet script by role (pserver, trainer); by default parameter servers serve
    until deleted (their StatefulSet restarts them: restartPolicy Always) and other pods
    print `<role> done` and exit 0."""

    def decide(pod: Obj) -> PodScript:
        role = role_of(pod)
        if role in by_role:
            return by_role[role](pod)
        return PodScript(run_forever=True) if role == "pserver" else PodScript(lines=(f"{role} done",))

    return decide


def wait(condition: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    """`condition()`'s first true value, asked again until `timeout` runs out."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def lines_of(process: subprocess.Popen[str]) -> queue.Queue[str | None]:
    """A process's stdout lines as they come, None at its end."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True, name="follow-stdout").start()
    return lines


@dataclass
class KubeBackend:
    """A `paddlecloud server` on the real control plane, for one test."""

    server: Any  # conftest.Server
    kube: RealKube
    rights: ChartRights
    prefix: str  # of the users' namespaces
    tmp_path: Path
    shared: str | None = None  # the one namespace of shared mode

    def namespace(self, user: str = "admin") -> str:
        return self.shared or namespace_for(user, self.prefix)

    def objects_of(self, job: str, user: str = "admin") -> list[str]:
        """What is left of `job` in its user's namespace, as `<plural>/<name>`, as the
        cluster's admin sees it (a pod being deleted counts)."""
        admin, namespace = self.kube.cluster.admin, self.namespace(user)
        found = []
        for plural, base in JOB_COLLECTIONS.items():
            listing = admin.get(
                f"{base}/namespaces/{namespace}/{plural}", query={"labelSelector": f"{LABEL_JOB}={job}"}
            )
            found += [f"{plural}/{obj['metadata']['name']}" for obj in listing["items"]]
        return found

    def package(self) -> Path:
        """The test's job package (test_jobs_cli.make_package), made on first use."""
        package = self.tmp_path / "pkg"
        if not package.exists():
            make_package(package)
        return package

    def submit(self, name: str, *flags: str) -> dict[str, Any]:
        """Submits the test package as `name` through the CLI; the job as `get job` shows it."""
        ok(run_cli(self.server, "submit", "--name", name, *flags, str(self.package())))
        return self.job(name)

    def job(self, name: str, *flags: str) -> dict[str, Any]:
        result: dict[str, Any] = as_json(run_cli(self.server, *flags, "-o", "json", "get", "job", name))
        return result

    def wait_for_state(
        self, name: str, states: tuple[str, ...], *flags: str, timeout: float = 60
    ) -> dict[str, Any]:
        """The job once it is in one of `states`; `flags` go before `get` (`--datacenter x`)."""
        result: dict[str, Any] = wait(
            lambda: (j := self.job(name, *flags))["state"] in states and j, f"{name} in {states}", timeout
        )
        return result

    def refused_by_quota(self, name: str, *flags: str) -> dict[str, Any]:
        """The job once it waits PENDING because the namespace's ResourceQuota refuses its
        pods, in the words the real API server gave; `flags` go before `get`."""
        job: dict[str, Any] = wait(
            lambda: "quota" in (j := self.job(name, *flags))["reason"] and j, "the quota's refusal", 90
        )
        assert job["state"] == "PENDING", job
        assert job["reason"].startswith("the namespace's quota refuses its pods: "), job
        assert "exceeded quota: paddlecloud-quota" in job["reason"], job
        return job

    def remove(self) -> None:
        """Stops the server, then deletes the users' namespaces and the chart's rights."""
        self.server.stop()
        admin = self.kube.cluster.admin
        for namespace in admin.get("/api/v1/namespaces")["items"]:
            name = namespace["metadata"]["name"]
            if name.startswith(self.prefix):
                admin.request("DELETE", f"/api/v1/namespaces/{name}")
        self.rights.remove()


@contextmanager
def kube_backends(
    real_kube: RealKube, server_factory: Any, tmp_path: Path
) -> Iterator[Callable[..., KubeBackend]]:
    """`kube_backend` as a function a test calls with its options (each server stopped and
    all it made deleted at the end), for a fixture that leaves the options to each test."""
    with ExitStack() as stack:

        def start(**options: Any) -> KubeBackend:
            backend: KubeBackend = stack.enter_context(
                kube_backend(real_kube, server_factory, tmp_path, **options)
            )
            return backend

        yield start


@contextmanager
def kube_backend(
    real_kube: RealKube,
    server_factory: Any,
    tmp_path: Path,
    via: Callable[[Path], Path] | None = None,
    *,
    sets: tuple[str, ...] = (),
    mutate: Callable[[list[Obj]], None] | None = None,
    shared_labels: dict[str, str] | None = None,
    prefix: str | None = None,
    jobs: Obj | None = None,
    **overrides: Any,
) -> Iterator[KubeBackend]:
    """A `paddlecloud server` on the real control plane for one test: the chart's
    jobs-service rights in a namespace of the test's own, the users' namespaces under a
    prefix of the test's own, `overrides` in `jobs.kubernetes`; all of it removed after.
    `via` turns the rights' kubeconfig into the one the service uses (a fault proxy's,
    kube_real/faults.py); `sets` and `mutate` go to the chart's rights
    (kube_real.chart.install_rights: a mutation test drops a rule); `shared_labels` runs
    the service in shared mode, in a namespace of the test's made first with those labels,
    as an operator would; `prefix` gives the users' namespaces' prefix (two releases
    sharing one), which the test then cleans up itself. The service is who the chart
    says (its paddlecloud.yaml's release, tenant_role, service_account: the release is
    the rights' namespace and `pc`). `jobs` adds to the jobs section (`metrics`).
    A test module makes it its fixture:

        @pytest.fixture
        def backend(real_kube, server_factory, tmp_path):
            with kube_backend(real_kube, server_factory, tmp_path) as started:
                yield started
    """
    token = secrets.token_hex(2)
    prefix = prefix or f"t{token}-"
    shared = None
    if shared_labels is not None:
        shared = f"{prefix}jobs"  # under the prefix, so it goes with the users' namespaces
        admin = real_kube.cluster.admin
        admin.create("/api/v1/namespaces", {"metadata": {"name": shared, "labels": shared_labels}})
        # Until the ServiceAccount controller made `default`, its admission plugin refuses
        # every pod there, before PodSecurity looks.
        admin.wait_for(f"/api/v1/namespaces/{shared}/serviceaccounts", lambda _: True, name="default")
        sets = (*sets, "jobs.kubernetes.namespaceMode=shared", f"jobs.kubernetes.namespace={shared}")
        overrides = {"namespace_mode": "shared", "namespace": shared, **overrides}
    rights = install_rights(real_kube.cluster, tmp_path, f"pcjobs-{token}", sets=sets, mutate=mutate)
    backend = None
    try:
        path = write_server_config(
            tmp_path / "server.yaml",
            kube_settings(
                via(rights.kubeconfig) if via else rights.kubeconfig,
                prefix,
                **{**rights.settings, **overrides},
            ),
            jobs,
        )
        backend = KubeBackend(
            server_factory("--server-config", str(path)), real_kube, rights, prefix, tmp_path, shared
        )
        yield backend
    finally:
        if backend is not None:
            backend.remove()
        else:
            rights.remove()
            if shared is not None:
                real_kube.cluster.admin.request("DELETE", f"/api/v1/namespaces/{shared}")


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
