"""charts/paddlecloud installed and upgraded by Helm 4 into the real control plane
(tests/kube_real): every object the chart renders, for its defaults and each
charts/paddlecloud/ci/*-values.yaml, is accepted by the real API server (server-side apply,
validation and admission); the workloads' pods are scheduled and run on the simulated
kubelet; and the chart's jobs-service ServiceAccount, with its own token, creates a job's
objects, so a right missing from the chart's RBAC is a 403 (shown by dropping each rule).

One release per values set, each in a namespace of its own, installed in parallel once
for the module; the tests then wait on what each release made.
"""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube_real import KubeClient, Reply, chart
from kube_real.chart import CHART, FULLNAME, RELEASE, collection, render, values_args
from kube_real.fixtures import RealKube
from paddlecloud.builder import kaniko_manifests
from paddlecloud.builder.backend import PipIndex
from paddlecloud.common.config import KanikoSection, KubernetesSection
from paddlecloud.common.store import Job, Quota
from paddlecloud.jobs.backend import Launch
from paddlecloud.jobs.kube import manifests
from paddlecloud.jobs.kube.manifests import JobPlan
from paddlecloud.jobs.spec import JobSpec

Obj = dict[str, Any]

VALUES_SETS = sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))
SETS = ["default", *VALUES_SETS]
# Namespaces an operator makes before installing, named by the ci values sets (the chart
# makes the kaniko builder's builds namespace itself: builder.kaniko.createNamespace).
OPERATOR_NAMESPACES = ("paddlecloud-jobs",)
# Warnings a values set is known to earn from the API server: none. (The in-tree cephfs
# volume earned "deprecated in v1.28, non-functional in v1.31+"; kind cephfs is ceph-csi
# now, a static PersistentVolume the pfs pod claims, and runs like the others.)
KNOWN_WARNING: dict[str, str] = {}


def stem(values: str) -> str:
    return values.removesuffix("-values.yaml")


def helm(kubeconfig: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Helm 4 (kube_real/chart.py), failing the test where make install-dev has not fetched it."""
    try:
        return chart.helm(kubeconfig, home, *args)
    except chart.HelmMissing as exc:
        pytest.fail(str(exc))


# --- What an operator makes before installing ------------------------------------------


def claims(objects: list[Obj]) -> tuple[set[str], list[tuple[str, str, str]]]:
    """The PersistentVolumeClaims the workloads mount by name (the operator's: not those
    the chart makes itself, pfs's of storage.kind cephfs), and those their StatefulSets'
    templates make (name, size, access mode)."""
    named: set[str] = set()
    templated: list[tuple[str, str, str]] = []
    charts = {o["metadata"]["name"] for o in objects if o["kind"] == "PersistentVolumeClaim"}
    for obj in objects:
        if obj["kind"] not in ("Deployment", "StatefulSet"):
            continue
        for volume in obj["spec"]["template"]["spec"].get("volumes", ()):
            if "persistentVolumeClaim" in volume:
                named.add(volume["persistentVolumeClaim"]["claimName"])
        for template in obj["spec"].get("volumeClaimTemplates", ()):
            for index in range(obj["spec"].get("replicas", 1)):
                templated.append(
                    (
                        f"{template['metadata']['name']}-{obj['metadata']['name']}-{index}",
                        template["spec"]["resources"]["requests"]["storage"],
                        template["spec"]["accessModes"][0],
                    )
                )
    return named - charts, templated


def volume(name: str, namespace: str, claim: str, size: str, mode: str) -> Obj:
    """A PersistentVolume kept for one claim (claimRef): no provisioner here, so the real
    PV controller binds it as it binds an operator's static volumes."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": [mode],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "",
            "hostPath": {"path": f"/srv/{name}"},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }


def operator_objects(values: str, namespace: str, objects: list[Obj]) -> list[Obj]:
    """What the values set says an operator made beforehand: its claims (with volumes),
    the Secrets it names, and nothing the chart makes itself."""
    made: list[Obj] = []
    named, templated = claims(objects)
    for claim in sorted(named):
        pv = f"{namespace}-{claim}"
        made.append(volume(pv, namespace, claim, "1Gi", "ReadWriteMany"))
        made.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": namespace},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "volumeName": pv,
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            }
        )
    for claim, size, mode in templated:
        made.append(volume(f"{namespace}-{claim}", namespace, claim, size, mode))
    secrets_named = {
        "existing-secrets-values.yaml": {
            "platform-secrets": {"internal-secret": "s" * 48, "admin-password": "admin-secret"},
            "platform-mongodb": {
                "mongodb-root-password": "root",
                "mongodb-password": "user",
                "mongodb-uri": "mongodb://paddlecloud:user@mongo:27017/paddlecloud",
            },
        },
    }.get(values, {})
    for name, data in secrets_named.items():
        made.append(
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace}}
            | {"stringData": data}
        )
    return made


# --- The releases ----------------------------------------------------------------------


@dataclass
class Release:
    """One values set's release, in its own namespace."""

    values: str
    namespace: str
    objects: list[Obj]
    install: subprocess.CompletedProcess[str] | None = None
    error: str = ""
    cleanup: list[str] = field(default_factory=list)  # paths to DELETE afterwards


def install(real_kube: RealKube, home: Path, release: Release) -> Release:
    admin = real_kube.cluster.admin
    try:
        # The strictest Pod Security level the chart's storage allows (restricted, but
        # for a hostPath volume), enforced and warned on: the chart's
        # pods are meant to meet it, and the real PodSecurity judges that.
        level = manifests.pod_security_level(chart_settings(release.objects))
        labels = {f"{manifests.POD_SECURITY}/{mode}": level for mode in ("enforce", "warn")}
        admin.create("/api/v1/namespaces", {"metadata": {"name": release.namespace, "labels": labels}})
        admin.wait_for(
            f"/api/v1/namespaces/{release.namespace}/serviceaccounts", lambda _: True, name="default"
        )
        for obj in operator_objects(release.values, release.namespace, release.objects):
            path = collection(obj)
            admin.create(path, obj)
            if obj["kind"] == "PersistentVolume":
                release.cleanup.append(f"{path}/{obj['metadata']['name']}")
        release.install = helm(
            real_kube.cluster.admin_kubeconfig,
            home,
            "install",
            RELEASE,
            str(CHART),
            "-n",
            release.namespace,
            *values_args(release.values),
        )
    except Exception as exc:  # reported by the test of this values set, not the fixture
        release.error = f"{type(exc).__name__}: {exc}"
    return release


@pytest.fixture(scope="module")
def releases(real_kube: RealKube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Release]]:
    """Every values set installed at once, each in a namespace of its own."""
    admin = real_kube.cluster.admin
    kubeconfig = real_kube.cluster.admin_kubeconfig
    home = tmp_path_factory.mktemp("helm")
    # Made here unless another test of the session made them (then left to it).
    made = [
        name
        for name in OPERATOR_NAMESPACES
        if admin.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}}).status == 201
    ]
    suffix = secrets.token_hex(3)

    def render_and_install(values: str) -> Release:
        namespace = f"helm-{stem(values)}-{suffix}"
        return install(
            real_kube, home, Release(values, namespace, render(kubeconfig, home, values, namespace))
        )

    def uninstall(release: Release) -> None:
        helm(kubeconfig, home, "uninstall", RELEASE, "-n", release.namespace)
        admin.request("DELETE", f"/api/v1/namespaces/{release.namespace}")
        for path in release.cleanup:
            admin.request("DELETE", path)

    with ThreadPoolExecutor(max_workers=len(SETS)) as pool:
        done = {r.values: r for r in pool.map(render_and_install, SETS)}
        yield done
        list(pool.map(uninstall, done.values()))
    for name in made:
        admin.request("DELETE", f"/api/v1/namespaces/{name}")


@pytest.fixture(params=SETS)
def release(releases: dict[str, Release], request: pytest.FixtureRequest) -> Release:
    """The release of one values set, failing the test where its install failed."""
    release = releases[request.param]
    assert not release.error, release.error
    assert release.install is not None
    assert release.install.returncode == 0, f"helm install {release.values}:\n{release.install.stderr}"
    return release


def rolled_out(workload: Obj) -> bool:
    """Every replica of the current template Ready, as `kubectl rollout status` judges."""
    spec, status = workload["spec"], workload.get("status", {})
    replicas = spec.get("replicas", 1)
    return bool(
        status.get("observedGeneration", 0) >= workload["metadata"]["generation"]
        and status.get("updatedReplicas", 0) == replicas
        and status.get("readyReplicas", 0) == replicas
        and status.get("replicas", 0) == replicas
    )


def wait_rolled_out(admin: KubeClient, release: Release) -> None:
    """Each Deployment and StatefulSet of the release rolled out; every pod of the
    namespace bound to the simulated node and Running."""
    for kind, api in (("Deployment", "/apis/apps/v1"), ("StatefulSet", "/apis/apps/v1")):
        for obj in release.objects:
            if obj["kind"] == kind:
                path = f"{api}/namespaces/{release.namespace}/{kind.lower()}s"
                admin.wait_for(path, rolled_out, name=obj["metadata"]["name"], timeout=90)
    pods = admin.get(f"/api/v1/namespaces/{release.namespace}/pods")["items"]
    running = [p for p in pods if "deletionTimestamp" not in p["metadata"]]
    assert running
    for pod in running:
        assert pod["spec"].get("nodeName"), pod["metadata"]["name"]
        assert pod["status"]["phase"] == "Running", (pod["metadata"]["name"], pod["status"])


def test_helm_install_is_accepted_and_every_workload_runs(real_kube: RealKube, release: Release) -> None:
    admin = real_kube.cluster.admin
    assert release.install is not None
    assert "STATUS: deployed" in release.install.stdout
    # Helm prints the API server's warnings (PodSecurity's "would violate", deprecated
    # fields) on stderr: the chart earns none but the one its cephfs values are known for.
    warnings = [line for line in release.install.stderr.splitlines() if "Warning" in line]
    assert all(KNOWN_WARNING.get(release.values, "\0") in line for line in warnings), warnings
    for obj in release.objects:
        name = obj["metadata"]["name"]
        stored = admin.get(f"{collection(obj, release.namespace)}/{name}")
        expected = dict(obj["metadata"]["labels"])
        if obj["kind"] == "Namespace":  # the API server labels each namespace with its name
            expected["kubernetes.io/metadata.name"] = name
        assert stored["metadata"]["labels"] == expected, (obj["kind"], name)
    if release.values in KNOWN_WARNING:
        # A real kubelet of this version cannot mount the volume (the API server says
        # so above); the simulated one would pretend to, so "Running" would prove nothing.
        assert warnings
        return
    wait_rolled_out(admin, release)


def stored_secrets(admin: KubeClient, release: Release) -> dict[str, Obj]:
    return {
        o["metadata"]["name"]: admin.get(f"{collection(o, release.namespace)}/{o['metadata']['name']}")[
            "data"
        ]
        for o in release.objects
        if o["kind"] == "Secret"
    }


def config_checksum(admin: KubeClient, release: Release) -> str:
    gateway = admin.get(f"/apis/apps/v1/namespaces/{release.namespace}/deployments/{FULLNAME}-gateway")
    return str(gateway["spec"]["template"]["metadata"]["annotations"]["checksum/config"])


@dataclass
class Upgrade:
    """What a release had before `helm upgrade --set log.level=debug`, and Helm's answer."""

    checksum: str
    secrets: dict[str, Obj]
    result: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def upgrades(
    real_kube: RealKube, releases: dict[str, Release], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Upgrade]:
    """Every installed release upgraded at once, with a config change (the tests of the
    installs ran first: pytest keeps the order of the test functions)."""
    admin = real_kube.cluster.admin
    home = tmp_path_factory.mktemp("helm-upgrade")

    def upgrade(release: Release) -> Upgrade:
        checksum, generated = config_checksum(admin, release), stored_secrets(admin, release)
        result = helm(
            real_kube.cluster.admin_kubeconfig,
            home,
            "upgrade",
            RELEASE,
            str(CHART),
            "-n",
            release.namespace,
            *values_args(release.values),
            "--set",
            "log.level=debug",
        )
        return Upgrade(checksum, generated, result)

    ok = [r for r in releases.values() if r.install is not None and r.install.returncode == 0]
    with ThreadPoolExecutor(max_workers=len(SETS)) as pool:
        return dict(zip([r.values for r in ok], pool.map(upgrade, ok), strict=True))


def test_helm_upgrade_rolls_every_workload(
    real_kube: RealKube, release: Release, upgrades: dict[str, Upgrade]
) -> None:
    admin = real_kube.cluster.admin
    upgrade = upgrades[release.values]
    assert upgrade.result.returncode == 0, upgrade.result.stderr
    assert "STATUS: deployed" in upgrade.result.stdout and "REVISION: 2" in upgrade.result.stdout
    assert config_checksum(admin, release) != upgrade.checksum
    # The generated secrets are kept: the chart's `lookup` reads them from the real server.
    assert stored_secrets(admin, release) == upgrade.secrets
    if release.values not in KNOWN_WARNING:  # as above: no volume a real kubelet could mount
        wait_rolled_out(admin, release)


# --- The jobs service's rights, with its own token ---------------------------------------


def chart_settings(objects: list[Obj]) -> KubernetesSection:
    """jobs.kubernetes as the chart's ConfigMap gives it to the service."""
    (configmap,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == FULLNAME]
    config = yaml.safe_load(configmap["data"]["paddlecloud.yaml"])
    return KubernetesSection.model_validate(config["jobs"]["kubernetes"])


def small_job(user: str, settings: KubernetesSection) -> tuple[list[Obj], JobPlan]:
    """The tenancy objects of `user` and the plan of a 1-pserver, 2-trainer job."""
    datacenter = next(iter(settings.datacenters))
    home = f"/pfs/{datacenter}/home/{user}"
    spec = JobSpec.model_validate({"name": "mnist", "package": f"{home}/mnist", "trainers": 2, "pservers": 1})
    job = Job(id=secrets.token_hex(16), owner=user, name=spec.name, state="PENDING", spec=spec.to_dict())
    launch = Launch(
        job=job,
        spec=spec,
        datacenter=datacenter,
        pfs_home=home,
        output=f"{home}/jobs/{spec.name}/output",
        package=f"{home}/mnist",
        package_kind="dir",
        input=None,
        runtime=None,
    )
    tenancy = manifests.tenancy_objects(user, Quota(cpu_milli=8000, memory_bytes=16 << 30, gpu=0), settings)
    namespace = manifests.namespace_of(user, settings)
    if settings.namespace_mode == "per-user" and settings.service_account:
        # Right after the namespace, the service binds the tenant role to itself there.
        account = settings.service_account.split("/")
        tenancy.insert(1, manifests.tenant_binding(namespace, (account[0], account[1]), settings))
    plan = JobPlan(launch, settings, namespace, manifests.image_for(launch, settings))
    return tenancy, plan


def create_job_objects(client: KubeClient, tenancy: list[Obj], plan: JobPlan) -> tuple[Obj, Reply] | None:
    """Creates what the jobs service creates for a new user's job, in its order: the
    tenancy objects, the owner ConfigMap, then its children with the owner's uid. The
    first object refused and the API server's answer, or None when all were created."""
    for obj in tenancy:
        reply = client.request("POST", collection(obj, plan.namespace), obj)
        if reply.status != 201:
            return obj, reply
        if obj["kind"] == "RoleBinding":
            # The RBAC authorizer learns of it from a watch: wait until a right no
            # mutation drops holds there.
            pods = f"/api/v1/namespaces/{plan.namespace}/pods"
            deadline = time.monotonic() + 30
            while client.request("GET", pods).status == 403 and time.monotonic() < deadline:
                time.sleep(0.1)
    owner = manifests.owner_object(plan)
    reply = client.request("POST", collection(owner), owner)
    if reply.status != 201:
        return owner, reply
    plan = JobPlan(
        plan.launch, plan.settings, plan.namespace, plan.image, owner_uid=reply.body["metadata"]["uid"]
    )
    for obj in manifests.job_objects(plan):
        reply = client.request("POST", collection(obj), obj)
        if reply.status != 201:
            return obj, reply
    return None


def test_the_jobs_service_account_creates_a_job_with_its_own_token(
    real_kube: RealKube, release: Release
) -> None:
    admin = real_kube.cluster.admin
    settings = chart_settings(release.objects)
    user = f"{stem(release.values)}-{secrets.token_hex(2)}"
    tenancy, plan = small_job(user, settings)
    service = real_kube.cluster.service_account(release.namespace, f"{FULLNAME}-jobs")
    try:
        refused = create_job_objects(service, tenancy, plan)
        assert refused is None, f"{refused[0]['kind']} {refused[0]['metadata']['name']}: {refused[1]}"
        # What it then reads to follow the job: its pods, their events.
        for path in ("pods", "events"):
            assert service.request("GET", f"/api/v1/namespaces/{plan.namespace}/{path}").status == 200
        # And nothing it was not given: Secrets are written, never read.
        reply = service.request("GET", f"/api/v1/namespaces/{plan.namespace}/secrets")
        assert reply.status == 403, reply
    finally:
        if settings.namespace_mode == "per-user":
            admin.request("DELETE", f"/api/v1/namespaces/{plan.namespace}")
        else:
            for obj in [*tenancy, manifests.owner_object(plan)]:
                admin.request("DELETE", f"{collection(obj, plan.namespace)}/{obj['metadata']['name']}")


# The chart's per-user rules, each dropped in turn, that creating a job's objects uses.
MUTATED = ["namespaces", "resourcequotas", "limitranges", "networkpolicies", "configmaps"]
MUTATED += ["configmaps/finalizers", "services", "statefulsets", "jobs", "rolebindings"]


def needs(obj: Obj, resource: str) -> bool:
    """Whether creating `obj` needs the rule on `resource`."""
    if resource == "configmaps/finalizers":
        # OwnerReferencesPermissionEnforcement: blockOwnerDeletion asks for update on
        # the owner's finalizers.
        return any(ref.get("blockOwnerDeletion") for ref in obj["metadata"].get("ownerReferences", ()))
    return collection(obj, "x").rsplit("/", 1)[1] == resource


@pytest.mark.parametrize("resource", MUTATED)
def test_the_chart_rbac_minus_one_rule_is_refused_403(
    real_kube: RealKube, tmp_path: Path, resource: str
) -> None:
    """A mutation of the chart's RBAC: its ClusterRoles rendered (the cluster rights and
    the tenant role the service binds in its namespaces), one rule the service uses
    dropped, for a fresh ServiceAccount; the real API server then refuses the first
    object that rule was for with 403, naming the resource, and nothing before it."""
    admin = real_kube.cluster.admin
    namespace = f"helm-mutant-{secrets.token_hex(3)}"
    objects = render(real_kube.cluster.admin_kubeconfig, tmp_path, "default", namespace)
    roles = [o for o in objects if o["kind"] == "ClusterRole"]
    assert len(roles) == 2, "the cluster rights and the tenant role"
    (binding,) = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    (account,) = [
        o for o in objects if o["kind"] == "ServiceAccount" and o["metadata"]["name"] == f"{FULLNAME}-jobs"
    ]
    dropped = 0
    for role in roles:
        kept = [rule for rule in role["rules"] if rule["resources"] != [resource]]
        dropped += len(role["rules"]) - len(kept)
        role["rules"] = kept
    assert dropped == 1, f"the chart has no rule for {resource}"
    user = f"mutant-{secrets.token_hex(2)}"
    tenancy, plan = small_job(user, chart_settings(objects))
    expected = next(o for o in [*tenancy, *manifests.all_objects(plan)] if needs(o, resource))
    admin.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    try:
        for obj in (account, *roles, binding):
            admin.create(collection(obj, namespace), obj)
        service = real_kube.cluster.service_account(namespace, account["metadata"]["name"])
        refused = create_job_objects(service, tenancy, plan)
        assert refused is not None, f"every object was created without the rule on {resource}"
        obj, reply = refused
        assert (obj["kind"], obj["metadata"]["name"]) == (expected["kind"], expected["metadata"]["name"]), (
            reply
        )
        assert reply.status == 403, reply
        if resource == "configmaps/finalizers":
            # OwnerReferencesPermissionEnforcement's words, not RBAC's.
            assert "cannot set blockOwnerDeletion" in reply.message, reply
        else:
            account_name = f"system:serviceaccount:{namespace}:{FULLNAME}-jobs"
            assert f'User "{account_name}" cannot create resource "{resource}"' in reply.message, reply
    finally:
        for obj in (*roles, binding):
            admin.request("DELETE", f"{collection(obj)}/{obj['metadata']['name']}")
        admin.request("DELETE", f"/api/v1/namespaces/{plan.namespace}")
        admin.request("DELETE", f"/api/v1/namespaces/{namespace}")


# --- The kaniko builder's rights, with its own token ---------------------------------------


def test_the_builder_service_account_runs_a_kaniko_build_with_its_own_token(
    real_kube: RealKube, releases: dict[str, Release]
) -> None:
    """What the kaniko backend does for one build (services/builder/kaniko.py), with the
    token of the chart's builder ServiceAccount: the context ConfigMap and the push
    Secret, the Job, then both made the Job's (an owner reference that blocks the Job's
    deletion, which OwnerReferencesPermissionEnforcement allows only to who may update
    `jobs/finalizers`)."""
    release = releases["kaniko-values.yaml"]
    assert release.install is not None and release.install.returncode == 0, release.error or release.install
    (configmap,) = [
        o for o in release.objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == FULLNAME
    ]
    kaniko = yaml.safe_load(configmap["data"]["paddlecloud.yaml"])["builder"]["kaniko"]
    # The push credentials' file is in the builder's pod, not here; the manifests do not read it.
    settings = KanikoSection.model_validate({k: v for k, v in kaniko.items() if k != "auth_file"})
    key = secrets.token_hex(32)
    build = kaniko_manifests.KanikoBuild(
        build_id=secrets.token_hex(16),
        key=key,
        owner="alice",
        base=f"python:3.11-slim@sha256:{'0' * 64}",
        destination=f"{settings.registry}/{settings.repository}/alice:{key}",
        requirements="numpy\n",
        builder_version="0.1.0",
        settings=settings,
        index=PipIndex(),
        timeout_seconds=600,
    )
    builder = real_kube.cluster.service_account(release.namespace, f"{FULLNAME}-builder")
    context = kaniko_manifests.context_config_map(build)
    push = kaniko_manifests.docker_config_secret(build, '{"auths": {}}')
    job = kaniko_manifests.build_job(build)
    try:
        for obj in (context, push):
            builder.create(collection(obj), obj)
        made = builder.create(collection(job), job)
        for obj in (context, push):
            reply = builder.request(
                "PATCH",
                f"{collection(obj)}/{obj['metadata']['name']}",
                kaniko_manifests.owned_by(made),
                content_type="application/merge-patch+json",
            )
            assert reply.status == 200, reply.message
    finally:
        admin = real_kube.cluster.admin
        for obj in (context, push, job):
            admin.request("DELETE", f"{collection(obj)}/{obj['metadata']['name']}")
