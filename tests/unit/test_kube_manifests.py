"""The kubernetes backend's manifests: strict schema checks, the values that matter, Pod Security, RBAC.

kubernetes-validate checks shapes and field names (strict: a misspelled field fails)
but not enum values nor nulls, so the values Kubernetes acts on are asserted here too.
`resolve_env` plays the kubelet's part (downward API fields, `$(VAR)` expansion) so a
worker's environment can be compared, key by key, with the local backend's.
"""

from __future__ import annotations

import base64
import hashlib
import io
import itertools
import json
import shutil
import socket
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from pydantic import ValidationError

from paddlecloud.common.config import DatacenterVolume, KubernetesSection, load_config
from paddlecloud.common.store import Job, Quota, Registry
from paddlecloud.jobs import sdk
from paddlecloud.jobs.backend import Launch, Runtime
from paddlecloud.jobs.contract import (
    DEVICE_ENV,
    FLEET_ENV,
    KUBEFLOW_ENV,
    PADDLE_V1_ENV,
    PADDLECLOUD_ENV,
    PYTORCH_ENV,
)
from paddlecloud.jobs.kube import manifests, names, rbac
from paddlecloud.jobs.kube.manifests import KUBERNETES_VERSION, JobPlan
from paddlecloud.jobs.local.plan import HostPlan, Ports, WorkerPaths, build_plan
from paddlecloud.jobs.spec import JobSpec

JOB_ID = "0123456789abcdef0123456789abcdef"
USER = "alice"
DC = "dc1"
HOME = f"/pfs/{DC}/home/{USER}"
NAMESPACE = "paddle-alice"

VOLUMES = {
    "cephfs": DatacenterVolume(
        kind="cephfs",
        cluster_id="4a9e4c3e-5a8b-11ef-9b1f-0242ac120002",
        fs_name="cephfs",
        root_path="/pfs/dc1",
        node_stage_secret="ceph-csi-cephfs/csi-cephfs-secret",
    ),
    "pvc": DatacenterVolume(kind="pvc", claim_name="pfs-dc1"),
    "hostpath": DatacenterVolume(kind="hostpath", host_path="/mnt/pfs/dc1"),
}


def settings_for(kind: str = "pvc", **overrides: Any) -> KubernetesSection:
    return KubernetesSection(datacenters={DC: VOLUMES[kind]}, **overrides)


def make_launch(
    *,
    package_kind: str = "dir",
    input_path: str | None = None,
    runtime: Runtime | None = None,
    **spec_fields: Any,
) -> Launch:
    fields: dict[str, Any] = {"name": "mnist", "package": f"{HOME}/mnist", "trainers": 3, "pservers": 2}
    spec = JobSpec.model_validate(fields | spec_fields)
    package = {"dir": f"{HOME}/mnist", "tar": f"{HOME}/mnist.tar.gz", "zip": f"{HOME}/mnist.zip"}[
        package_kind
    ]
    job = Job(id=JOB_ID, owner=USER, name=spec.name, state="PENDING", spec=spec.to_dict())
    return Launch(
        job=job,
        spec=spec,
        datacenter=DC,
        pfs_home=HOME,
        output=f"{HOME}/jobs/{spec.name}/output",
        package=package,
        package_kind=package_kind,
        input=input_path,
        runtime=runtime,
    )


REGISTRY = Registry(
    owner=USER, name="private", server="registry.example.com:5000", username="bob", password="s3cr$t"
)


def make_plan(
    kind: str = "pvc",
    *,
    registry: Registry | None = None,
    settings: KubernetesSection | None = None,
    **fields: Any,
) -> JobPlan:
    if registry is not None:
        fields.setdefault("registry", registry.name)
    launch = make_launch(**fields)
    settings = settings or settings_for(kind)
    return JobPlan(
        launch=launch,
        settings=settings,
        namespace=NAMESPACE,
        image=manifests.image_for(launch, settings),
        registry=registry,
        owner_uid="5f0c1d2e-0000-4000-8000-000000000001",
    )


def validate(obj: dict[str, Any]) -> None:
    """Strict schema check, plus what the schemas let through: nulls (they allow any)."""
    assert kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True) == KUBERNETES_VERSION
    for path, value in walk(obj):
        assert value is not None, f"{obj['kind']} {obj['metadata']['name']}: {path} is null"


def walk(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from walk(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from walk(item, f"{path}[{i}]")


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = by_kind(objects, kind)
    return found


def pod_templates(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Role → pod template of every workload."""
    found = {}
    for obj in objects:
        if obj["kind"] in ("StatefulSet", "Job"):
            found[obj["spec"]["template"]["metadata"]["labels"][names.LABEL_ROLE]] = obj["spec"]["template"]
    return found


def containers(pod_spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [*pod_spec.get("initContainers", []), *pod_spec["containers"]]


# --- Playing the kubelet -----------------------------------------------------------------


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion (third_party/forked/golang/expansion): `$$` is `$`,
    `$(NAME)` a defined variable's value or itself, any other `$` stays."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            following = text[i + 1]
            if following == "$":
                out.append("$")
                i += 2
                continue
            if following == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    out.append(env.get(text[i + 2 : end], text[i : end + 1]))
                    i = end + 1
                    continue
                out.append("$(")
                i += 2
                continue
            out.append("$" + following)
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def test_expand_is_kubernetes_expansion() -> None:
    env = {"A": "x", "B": "$(A)"}
    assert expand("$(A)-$(B)-$(C)", env) == "x-$(A)-$(C)"  # values are not expanded again
    assert expand("$$(A) $$ $x $( a$", env) == "$(A) $ $x $( a$"


def field_value(path: str, pod: Mapping[str, Any]) -> str:
    for prefix, source in (("metadata.annotations", "annotations"), ("metadata.labels", "labels")):
        if path.startswith(prefix + "['"):
            return pod["metadata"][source][path[len(prefix) + 2 : -2]]
    if path == "status.podIP":
        return pod["status"]["podIP"]
    if path == "metadata.namespace":
        return pod["metadata"]["namespace"]
    raise AssertionError(f"no downward API field {path} in this resolver")


def resolve_env(container: Mapping[str, Any], pod: Mapping[str, Any]) -> dict[str, str]:
    """A container's environment as the kubelet makes it, in order."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "valueFrom" in var:
            env[var["name"]] = field_value(var["valueFrom"]["fieldRef"]["fieldPath"], pod)
        else:
            env[var["name"]] = expand(var["value"], env)
    return env


def running_pod(template: Mapping[str, Any], role: str, index: int, pod_ip: str) -> dict[str, Any]:
    """What the controllers add to a pod of `template`: its index and its address."""
    metadata: dict[str, Any] = {
        "namespace": NAMESPACE,
        "labels": dict(template["metadata"]["labels"]),
        "annotations": dict(template["metadata"].get("annotations", {})),
    }
    if role == names.ROLE_TRAINER:
        metadata["annotations"][names.COMPLETION_INDEX] = str(index)
    else:
        metadata["labels"][names.POD_INDEX] = str(index)
    return {"metadata": metadata, "spec": template["spec"], "status": {"podIP": pod_ip}}


def worker_env(plan: JobPlan, role: str, index: int, pod_ip: str = "10.1.2.3") -> dict[str, str]:
    template = pod_templates(manifests.job_objects(plan))[role]
    pod = running_pod(template, role, index, pod_ip)
    return resolve_env(pod["spec"]["containers"][0], pod)


# --- Every manifest, strictly valid ------------------------------------------------------

MATRIX = list(itertools.product([0, 2], [0, 3], ["cephfs", "pvc", "hostpath"], [None, REGISTRY]))


@pytest.mark.parametrize(("gpu", "pservers", "kind", "registry"), MATRIX)
def test_every_job_manifest_is_valid(gpu: int, pservers: int, kind: str, registry: Registry | None) -> None:
    plan = make_plan(kind, gpu=gpu, pservers=pservers, registry=registry)
    objects = manifests.all_objects(plan)
    for obj in objects:
        validate(obj)
    kinds = [o["kind"] for o in objects]
    expected = ["ConfigMap", *(["Secret"] if registry else []), "NetworkPolicy"]
    expected += ["Service", "StatefulSet"] if pservers else []
    expected += ["Service", "Job"]
    assert kinds == expected
    assert_job_invariants(plan, objects)


def assert_job_invariants(plan: JobPlan, objects: list[dict[str, Any]]) -> None:
    spec = plan.launch.spec
    owner, children = objects[0], objects[1:]
    assert owner["metadata"]["name"] == names.owner_name(spec.name)
    assert "ownerReferences" not in owner["metadata"]
    assert json.loads(owner["data"][manifests.SPEC_KEY]) == spec.to_dict()
    for obj in objects:
        meta = obj["metadata"]
        assert meta["namespace"] == NAMESPACE
        labels = meta["labels"]
        assert labels[names.MANAGED_BY] == names.MANAGER
        assert labels[names.LABEL_RELEASE] == names.release_label(plan.settings.release)
        assert labels[names.LABEL_USER] == names.user_label(USER)
        assert labels[names.LABEL_JOB] == spec.name
        assert labels[names.LABEL_JOB_ID] == JOB_ID
        assert labels[names.LABEL_ROLE] in (names.ROLE_JOB, names.ROLE_PSERVER, names.ROLE_TRAINER)
    for child in children:
        (ref,) = child["metadata"]["ownerReferences"]
        assert ref == {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": owner["metadata"]["name"],
            "uid": plan.owner_uid,
            "controller": False,
            "blockOwnerDeletion": True,
        }
    templates = pod_templates(objects)
    assert set(templates) == ({names.ROLE_PSERVER} if spec.pservers else set()) | {names.ROLE_TRAINER}
    for role, template in templates.items():
        assert template["metadata"]["labels"] == names.job_labels(
            USER, spec.name, JOB_ID, plan.settings.release
        ) | {names.LABEL_ROLE: role}
        assert_pod(plan, role, template["spec"])
    no_shared_parts(objects)


def no_shared_parts(objects: list[dict[str, Any]]) -> None:
    """No dict or list appears twice: a caller may change one manifest without another."""
    seen: dict[int, str] = {}
    for n, obj in enumerate(objects):
        for path, value in walk(obj):
            if isinstance(value, dict | list):
                assert id(value) not in seen, f"{n}{path} is also {seen[id(value)]}"
                seen[id(value)] = f"{n}{path}"


def assert_pod(plan: JobPlan, role: str, pod: dict[str, Any]) -> None:
    spec, settings = plan.launch.spec, plan.settings
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False
    assert pod["restartPolicy"] == ("Never" if role == names.ROLE_TRAINER else "Always")
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert restricted_violations(pod) == pfs_violations(settings)
    if plan.registry is not None:
        assert pod["imagePullSecrets"] == [{"name": names.registry_secret_name(spec.name)}]
    else:
        assert "imagePullSecrets" not in pod
    (main,) = pod["containers"]
    assert main["name"] == role
    assert main["image"] == plan.image
    assert main["workingDir"] == manifests.WORK_DIR
    # The entry runs after a line that appends the SDK to PYTHONPATH (the kubelet's `$$` is `$`).
    assert main["command"] == ["/bin/sh", "-c", sdk.pythonpath_prefix().replace("$", "$$") + spec.entry]
    assert_sdk(plan, pod, main)
    cpu, memory = (spec.cpu, spec.memory) if role == names.ROLE_TRAINER else (spec.pscpu, spec.psmemory)
    # Every container asks for the job's disk, and the work volume holds no more.
    wanted = {"cpu": str(cpu), "memory": str(memory), "ephemeral-storage": spec.disk}
    assert main["resources"]["requests"] == wanted
    gpus = {"nvidia.com/gpu": str(spec.gpu)} if role == names.ROLE_TRAINER and spec.gpu else {}
    assert main["resources"]["limits"] == wanted | gpus
    for init in pod["initContainers"]:
        assert init["image"] == settings.init_image
        assert "nvidia.com/gpu" not in init["resources"]["limits"]
        assert init["resources"]["limits"] == wanted, "init containers must not raise the pod's resources"
        assert init["resources"]["requests"] == wanted
    assert pod["volumes"][0] == {"name": manifests.WORK_VOLUME, "emptyDir": {"sizeLimit": spec.disk}}
    assert all("emptyDir" not in volume for volume in pod["volumes"][1:])
    if plan.registry is None:  # with one: test_images_pulled_with_a_users_credentials_...
        assert {c["imagePullPolicy"] for c in [*pod["initContainers"], main]} == {settings.image_pull_policy}
    init_names = [c["name"] for c in pod["initContainers"]]
    waits = role == names.ROLE_TRAINER and spec.pservers > 0
    assert init_names == ["unpack", *(["wait-pservers"] if waits else [])]
    assert_pfs_mounts(plan, pod)
    assert_contract_keys(role, main, passes=spec.passes)


def assert_sdk(plan: JobPlan, pod: dict[str, Any], main: dict[str, Any]) -> None:
    """The SDK's files come from the job's own ConfigMap, mounted read-only in the main
    container alone, and PYTHONPATH is no variable of the pod's (a user may set it)."""
    (volume,) = [v for v in pod["volumes"] if v["name"] == manifests.SDK_VOLUME]
    assert volume["configMap"]["name"] == names.owner_name(plan.launch.spec.name)
    assert {item["path"] for item in volume["configMap"]["items"]} == {sdk.INIT, sdk.METRICS}
    assert volume["configMap"]["defaultMode"] == 0o444
    owner = manifests.owner_object(plan)
    for item in volume["configMap"]["items"]:
        assert owner["data"][item["key"]] == sdk.files()[item["path"]]
    assert {"name": manifests.SDK_VOLUME, "mountPath": sdk.SDK_DIR, "readOnly": True} in main["volumeMounts"]
    for init in pod["initContainers"]:
        assert all(m["name"] != manifests.SDK_VOLUME for m in init.get("volumeMounts", []))
    assert "PYTHONPATH" not in {var["name"] for var in main["env"]} - set(plan.launch.spec.env)


def assert_pfs_mounts(plan: JobPlan, pod: dict[str, Any]) -> None:
    """Home read-write and public read-only: by subPath of the root, or (cephfs) each
    from the user's own claim over it; never the whole PFS."""
    volume = plan.settings.datacenters[DC]
    if volume.kind == "cephfs":
        claims = {v["name"]: v for v in pod["volumes"] if v["name"].startswith(manifests.PFS_VOLUME)}
        assert claims == {
            "pfs-home": {
                "name": "pfs-home",
                "persistentVolumeClaim": {"claimName": names.claim_name(DC, USER, "home")},
            },
            "pfs-public": {
                "name": "pfs-public",
                "persistentVolumeClaim": {
                    "claimName": names.claim_name(DC, USER, "public"),
                    "readOnly": True,
                },
            },
        }
        wanted = [
            {"name": "pfs-home", "mountPath": HOME},
            {"name": "pfs-public", "mountPath": f"/pfs/{DC}/public", "readOnly": True},
        ]
    else:
        (pfs,) = [v for v in pod["volumes"] if v["name"] == manifests.PFS_VOLUME]
        sources: dict[str, dict[str, Any]] = {
            "pvc": {"persistentVolumeClaim": {"claimName": volume.claim_name}},
            "hostpath": {"hostPath": {"path": volume.host_path, "type": "Directory"}},
        }
        assert pfs == {"name": manifests.PFS_VOLUME, **sources[volume.kind]}
        wanted = [
            {"name": "pfs", "mountPath": HOME, "subPath": f"home/{USER}"},
            {"name": "pfs", "mountPath": f"/pfs/{DC}/public", "subPath": "public", "readOnly": True},
        ]
    for container in containers(pod):
        mounts = [m for m in container.get("volumeMounts", []) if m["name"].startswith(manifests.PFS_VOLUME)]
        if container["name"] == "wait-pservers":
            assert mounts == []
            continue
        assert mounts == wanted
        for mount in container.get("volumeMounts", []):
            assert mount["mountPath"] not in ("/pfs", f"/pfs/{DC}", f"/pfs/{DC}/home")
            assert mount.get("subPath", "") != "" or mount["name"] != manifests.PFS_VOLUME


def assert_contract_keys(role: str, container: dict[str, Any], *, passes: int | None) -> None:
    keys = [var["name"] for var in container["env"]]
    assert len(keys) == len(set(keys))
    expected = set(PADDLECLOUD_ENV + PADDLE_V1_ENV + FLEET_ENV + KUBEFLOW_ENV)
    if passes is None:
        # A job that gives no passes is told none: its program's own default applies.
        expected.discard("PADDLE_INIT_NUM_PASSES")
        assert "PADDLE_INIT_NUM_PASSES" not in keys
    if role == names.ROLE_TRAINER:
        expected |= set(PYTORCH_ENV)
    else:
        assert not set(PYTORCH_ENV) & set(keys), "a pserver must not look like a torch rank"
    assert expected <= set(keys)
    # The index comes first: every later value may refer to it.
    assert container["env"][0]["name"] == "TRAINER_ID"
    assert "valueFrom" in container["env"][0]


def test_trainers_are_an_indexed_job() -> None:
    plan = make_plan(max_restarts=4)
    job = one(manifests.job_objects(plan), "Job")
    assert job["metadata"]["name"] == "mnist-trainer"
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 3
    assert spec["backoffLimitPerIndex"] == 4
    assert spec["maxFailedIndexes"] == 0
    assert "backoffLimit" not in spec
    assert spec["podReplacementPolicy"] == "Failed"
    assert spec["podFailurePolicy"] == {
        "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
    }
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == "mnist-trainer"
    index = pod["containers"][0]["env"][0]
    assert index == {
        "name": "TRAINER_ID",
        "valueFrom": {
            "fieldRef": {
                "apiVersion": "v1",
                "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']",
            }
        },
    }


def test_parameter_servers_are_a_parallel_statefulset_behind_a_headless_service() -> None:
    plan = make_plan(pservers=3)
    objects = manifests.job_objects(plan)
    sts = one(objects, "StatefulSet")
    assert sts["metadata"]["name"] == sts["spec"]["serviceName"] == "mnist-pserver"
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    template_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= template_labels.items()
    main = sts["spec"]["template"]["spec"]["containers"][0]
    assert (
        main["env"][0]["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.labels['apps.kubernetes.io/pod-index']"
    )
    assert main["readinessProbe"]["tcpSocket"]["port"] == plan.settings.pserver_port
    services = {s["metadata"]["name"]: s for s in by_kind(objects, "Service")}
    assert set(services) == {"mnist-pserver", "mnist-trainer"}
    for name, service in services.items():
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["publishNotReadyAddresses"] is True
        role = name.rsplit("-", 1)[1]
        pods = pod_templates(objects)[role]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= pods.items()
    assert [p["port"] for p in services["mnist-pserver"]["spec"]["ports"]] == [7164]
    assert [p["port"] for p in services["mnist-trainer"]["spec"]["ports"]] == [7170, 29500]


def test_without_parameter_servers_there_is_nothing_to_wait_for() -> None:
    objects = manifests.job_objects(make_plan(pservers=0))
    assert not by_kind(objects, "StatefulSet")
    assert [s["metadata"]["name"] for s in by_kind(objects, "Service")] == ["mnist-trainer"]
    init = pod_templates(objects)[names.ROLE_TRAINER]["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["unpack"]


def test_the_job_network_policy_joins_its_own_pods_only() -> None:
    policy = one(manifests.job_objects(make_plan()), "NetworkPolicy")
    own = {"podSelector": {"matchLabels": {names.LABEL_JOB_ID: JOB_ID}}}
    assert policy["metadata"]["name"] == "mnist"
    assert policy["spec"] == {
        "podSelector": own["podSelector"],
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [{"from": [own]}],
        "egress": [{"to": [own]}],
    }


@pytest.mark.parametrize(
    ("server", "image", "main", "init"),
    [
        # The job's image is in the registry its credentials are for; busybox is not.
        ("registry.example.com:5000", "registry.example.com:5000/team/paddle:2.6", "Always", "IfNotPresent"),
        (
            "https://registry.example.com:5000/v2/",
            "registry.example.com:5000/paddle",
            "Always",
            "IfNotPresent",
        ),
        # Credentials for another registry: the kubelet never sends them for these images.
        ("registry.example.com:5000", "python:3.11-slim", "IfNotPresent", "IfNotPresent"),
        # Docker Hub's: every image of this pod is pulled from there with them.
        ("https://index.docker.io/v1/", "team/paddle:2.6", "Always", "Always"),
    ],
)
def test_images_pulled_with_a_users_credentials_are_pulled_always(
    server: str, image: str, main: str, init: str
) -> None:
    registry = Registry(owner=USER, name="private", server=server, username="bob", password="pw")
    plan = make_plan(registry=registry, image=image)
    for template in (
        one(manifests.job_objects(plan), kind)["spec"]["template"] for kind in ("Job", "StatefulSet")
    ):
        (container,) = template["spec"]["containers"]
        assert (container["image"], container["imagePullPolicy"]) == (image, main)
        assert {c["imagePullPolicy"] for c in template["spec"]["initContainers"]} == {init}
    # Without credentials, the setting, whatever the image.
    plain = make_plan(image=image, settings=settings_for("pvc", image_pull_policy="Never"))
    pod = one(manifests.job_objects(plain), "Job")["spec"]["template"]["spec"]
    assert {c["imagePullPolicy"] for c in [*pod["initContainers"], *pod["containers"]]} == {"Never"}


def test_registry_credentials_become_a_dockerconfigjson_secret() -> None:
    plan = make_plan(registry=REGISTRY)
    secret = one(manifests.job_objects(plan), "Secret")
    assert secret["metadata"]["name"] == "mnist-registry"
    assert secret["type"] == "kubernetes.io/dockerconfigjson"
    config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    assert config == {
        "auths": {
            "registry.example.com:5000": {
                "username": "bob",
                "password": "s3cr$t",
                "auth": base64.b64encode(b"bob:s3cr$t").decode(),
            }
        }
    }
    shown = manifests.redacted(manifests.all_objects(plan))
    assert "s3cr" not in json.dumps(shown)
    assert one(shown, "Secret")["data"] == {".dockerconfigjson": "<redacted>"}
    assert one(manifests.all_objects(plan), "Secret")["data"] == secret["data"], "redacted copies"
    # The SDK's source is named, not printed; the spec is printed as it is.
    owner, printed = one(manifests.all_objects(plan), "ConfigMap"), one(shown, "ConfigMap")
    assert printed["data"]["sdk-metrics.py"] == (
        f"<the SDK's paddlecloud/metrics.py, {len(owner['data']['sdk-metrics.py'])} characters>"
    )
    assert printed["data"][manifests.SPEC_KEY] == owner["data"][manifests.SPEC_KEY]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"registry": None, "spec": {"registry": "private"}}, "no credentials were given"),
        ({"registry": Registry("mallory", "private", "r", "u", "p")}, "is not one"),
        ({"registry": Registry(USER, "other", "r", "u", "p")}, "is not one"),
        ({"spec": {"registry": None}}, "is not one"),
        ({"settings": KubernetesSection()}, "has no volume"),
        ({"launch": {"package": "/pfs/dc1/home/bob/mnist"}}, "neither in"),
        ({"launch": {"package": f"{HOME}/../bob/mnist"}}, "neither in"),
        ({"launch": {"input": "/pfs/dc2/public/data"}}, "neither in"),
        ({"launch": {"output": "/pfs/dc1/public/out"}}, "is not in"),
        ({"launch": {"package_kind": "rar"}}, "package_kind"),
    ],
)
def test_launches_the_manifests_cannot_run_are_refused(change: dict[str, Any], message: str) -> None:
    plan = make_plan(registry=REGISTRY)
    launch = plan.launch
    if "spec" in change:
        launch = Launch(**{**vars(launch), "spec": launch.spec.model_copy(update=change["spec"])})
    if "launch" in change:
        launch = Launch(**{**vars(launch), **change["launch"]})
    plan = JobPlan(
        launch=launch,
        settings=change.get("settings", plan.settings),
        namespace=NAMESPACE,
        image="x",
        registry=change.get("registry", plan.registry),
    )
    with pytest.raises(ValueError, match=message):
        manifests.job_objects(plan)
    with pytest.raises(ValueError, match=message):
        manifests.owner_object(plan)  # before anything is created


def test_image_for_prefers_the_built_image_then_the_specs_then_the_platforms() -> None:
    settings = settings_for(gpu_image="cuda:12")
    assert (
        manifests.image_for(make_launch(runtime=Runtime(image="built:1"), image="mine:2"), settings)
        == "built:1"
    )
    assert manifests.image_for(
        make_launch(runtime=Runtime(python="/x/bin/python"), image="mine:2"), settings
    ) == ("mine:2")
    assert manifests.image_for(make_launch(gpu=1), settings) == "cuda:12"
    assert manifests.image_for(make_launch(gpu=1), settings_for()) == "python:3.11-slim"
    assert manifests.image_for(make_launch(), settings) == "python:3.11-slim"


def test_output_is_deterministic() -> None:
    first = json.dumps(manifests.all_objects(make_plan(registry=REGISTRY, gpu=1)))
    assert json.dumps(manifests.all_objects(make_plan(registry=REGISTRY, gpu=1))) == first


def test_fs_group_when_set_never_chowns_the_volume_on_every_mount() -> None:
    plan = make_plan(settings=settings_for(fs_group=2000))
    pod = pod_templates(manifests.job_objects(plan))[names.ROLE_TRAINER]["spec"]
    assert pod["securityContext"]["fsGroup"] == 2000
    assert pod["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"


def test_gpu_trainers_tolerate_gpu_nodes_and_parameter_servers_get_no_gpu() -> None:
    templates = pod_templates(manifests.job_objects(make_plan(gpu=2)))
    assert templates["trainer"]["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert "tolerations" not in templates["pserver"]["spec"]
    assert "nvidia.com/gpu" not in templates["pserver"]["spec"]["containers"][0]["resources"]["limits"]


# --- Pod Security ----------------------------------------------------------------------

# Pod Security Standards (kubernetes.io/docs/concepts/security/pod-security-standards/).
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
SELINUX_TYPES = {None, "", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def baseline_violations(pod: Mapping[str, Any]) -> list[str]:
    found = [key for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key)]
    pod_security = pod.get("securityContext", {})
    found += [f"sysctl {s['name']}" for s in pod_security.get("sysctls", []) if s["name"] not in SAFE_SYSCTLS]
    found += [f"volume {v['name']}: hostPath" for v in pod.get("volumes", []) if "hostPath" in v]
    for where, security in [("pod", pod_security)] + [
        (c["name"], c.get("securityContext", {})) for c in containers(pod)
    ]:
        if security.get("windowsOptions", {}).get("hostProcess"):
            found.append(f"{where}: hostProcess")
        if security.get("privileged"):
            found.append(f"{where}: privileged")
        extra = set(security.get("capabilities", {}).get("add", [])) - BASELINE_CAPABILITIES
        if extra:
            found.append(f"{where}: adds {sorted(extra)}")
        if security.get("procMount", "Default") != "Default":
            found.append(f"{where}: procMount")
        if security.get("seccompProfile", {}).get("type") == "Unconfined":
            found.append(f"{where}: seccomp Unconfined")
        if security.get("appArmorProfile", {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
            found.append(f"{where}: AppArmor")
        selinux = security.get("seLinuxOptions", {})
        if selinux.get("type") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            found.append(f"{where}: SELinux")
    for container in containers(pod):
        if any(port.get("hostPort") for port in container.get("ports", [])):
            found.append(f"{container['name']}: hostPort")
    return found


def restricted_violations(pod: Mapping[str, Any]) -> list[str]:
    """Every rule of Pod Security's `restricted` level (which includes baseline's)."""
    found = baseline_violations(pod)
    for volume in pod.get("volumes", []):
        kind = next(k for k in volume if k != "name")
        if kind not in RESTRICTED_VOLUMES and kind != "hostPath":  # hostPath: counted by baseline
            found.append(f"volume {volume['name']}: {kind}")
    pod_security = pod.get("securityContext", {})
    if pod_security.get("runAsUser") == 0:
        found.append("pod: runAsUser 0")
    for container in containers(pod):
        name, security = container["name"], container.get("securityContext", {})
        if security.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation is not false")
        caps = security.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            found.append(f"{name}: does not drop ALL capabilities")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: adds capabilities")
        if security.get("runAsNonRoot", pod_security.get("runAsNonRoot")) is not True:
            found.append(f"{name}: runAsNonRoot is not true")
        if security.get("runAsUser") == 0:
            found.append(f"{name}: runAsUser 0")
        seccomp = security.get("seccompProfile", pod_security.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccomp {seccomp}")
    return found


def pfs_violations(settings: KubernetesSection) -> list[str]:
    """What restricted refuses of a job pod: only an in-line PFS volume, never more."""
    kind = settings.datacenters[DC].kind
    return {"pvc": [], "cephfs": [], "hostpath": ["volume pfs: hostPath"]}[kind]


def test_the_pod_security_checks_catch_what_they_check() -> None:
    pod = pod_templates(manifests.job_objects(make_plan()))[names.ROLE_TRAINER]["spec"]
    assert restricted_violations(pod) == []
    bad = json.loads(json.dumps(pod))
    bad["hostNetwork"] = True
    bad["securityContext"]["sysctls"] = [{"name": "kernel.msgmax", "value": "1"}]
    main = bad["containers"][0]
    main["securityContext"] |= {"allowPrivilegeEscalation": True, "privileged": True, "runAsUser": 0}
    main["securityContext"]["capabilities"] = {"add": ["SYS_ADMIN"]}
    main["securityContext"]["seccompProfile"] = {"type": "Unconfined"}
    main["ports"][0]["hostPort"] = 80
    bad["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    bad["volumes"].append({"name": "nfs", "nfs": {"server": "x", "path": "/"}})
    found = restricted_violations(bad)
    for words in [
        "hostNetwork",
        "sysctl kernel.msgmax",
        "volume host: hostPath",
        "volume nfs: nfs",
        "trainer: privileged",
        "trainer: adds ['SYS_ADMIN']",
        "trainer: seccomp Unconfined",
        "trainer: hostPort",
        "trainer: allowPrivilegeEscalation is not false",
        "trainer: does not drop ALL capabilities",
        "trainer: runAsUser 0",
    ]:
        assert words in found, (words, found)


@pytest.mark.parametrize("kind", ["pvc", "cephfs", "hostpath"])
def test_job_pods_meet_restricted_but_for_an_inline_pfs_volume(kind: str) -> None:
    plan = make_plan(kind, pservers=2, registry=REGISTRY)
    for template in pod_templates(manifests.job_objects(plan)).values():
        assert restricted_violations(template["spec"]) == pfs_violations(plan.settings)
        # ...and the namespace's level admits them.
        level = manifests.pod_security_level(plan.settings)
        if level == "restricted":
            assert restricted_violations(template["spec"]) == []
        elif level == "baseline":
            assert baseline_violations(template["spec"]) == []
        else:
            assert level == "privileged" and kind == "hostpath"


# --- Tenancy -----------------------------------------------------------------------------

QUOTA = Quota(
    cpu_milli=8500, gpu=4, memory_bytes=32 * 2**30, jobs=3, storage_bytes=10**12, disk_bytes=200 * 2**30
)


@pytest.mark.parametrize("kind", ["cephfs", "pvc", "hostpath"])
@pytest.mark.parametrize("quota", [QUOTA, Quota()])
def test_per_user_tenancy(kind: str, quota: Quota) -> None:
    settings = settings_for(kind, storage_cidrs=("10.0.0.0/24", "fd00::/64"), storage_ports=(6789, 3300))
    objects = manifests.tenancy_objects("Alice@Example.com", quota, settings)
    for obj in objects:
        validate(obj)
        assert obj["metadata"]["labels"][names.MANAGED_BY] == names.MANAGER
        assert obj["metadata"]["labels"][names.LABEL_RELEASE] == "paddlecloud"
        assert obj["metadata"]["labels"][names.LABEL_USER] == names.user_label("Alice@Example.com")
        assert obj["metadata"]["annotations"][names.ANNOTATION_USER] == "Alice@Example.com"
    namespace = names.namespace_for("Alice@Example.com", "paddle-")
    kinds = [o["kind"] for o in objects]
    quota_kinds = ["ResourceQuota"] if quota != Quota() else []
    volume_kinds = ["PersistentVolume"] * 2 + ["PersistentVolumeClaim"] * 2 if kind == "cephfs" else []
    assert kinds == ["Namespace", *quota_kinds, "LimitRange", "NetworkPolicy", "NetworkPolicy", *volume_kinds]
    ns = objects[0]
    assert ns["metadata"]["name"] == namespace
    level = {"pvc": "restricted", "cephfs": "restricted", "hostpath": "privileged"}[kind]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == level
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce-version"] == f"v{KUBERNETES_VERSION}"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/warn"] == "restricted"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/audit"] == "restricted"
    assert all(
        o["metadata"].get("namespace") == namespace for o in objects[1:] if o["kind"] != "PersistentVolume"
    )
    deny, egress = by_kind(objects, "NetworkPolicy")
    assert deny["metadata"]["name"] == names.DENY_ALL_POLICY
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    assert egress["spec"]["podSelector"] == {}
    assert egress["spec"]["policyTypes"] == ["Egress"]
    assert egress["spec"]["egress"] == [
        {
            "to": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                }
            ]
        },
        {
            "to": [{"ipBlock": {"cidr": "10.0.0.0/24"}}, {"ipBlock": {"cidr": "fd00::/64"}}],
            "ports": [{"protocol": "TCP", "port": 6789}, {"protocol": "TCP", "port": 3300}],
        },
    ]


def test_cephfs_volumes_are_static_ceph_csi_volumes_per_user() -> None:
    """Each user's home (read-write) and public (read-only), each a ceph-csi static
    volume of its own with a distinct handle, retained, claimed in advance by the claim
    in the user's namespace that the job pods mount."""
    settings = settings_for("cephfs")
    made = {user: manifests.user_volumes(user, settings) for user in ("alice", "bob")}
    handles = [
        o["spec"]["csi"]["volumeHandle"]
        for objs in made.values()
        for o in objs
        if o["kind"] == "PersistentVolume"
    ]
    assert len(handles) == len(set(handles)) == 4
    home, public, home_claim, public_claim = made["alice"]
    for pv, claim, root, mode in (
        (home, home_claim, "/pfs/dc1/home/alice", "ReadWriteMany"),
        (public, public_claim, "/pfs/dc1/public", "ReadOnlyMany"),
    ):
        validate(pv)
        validate(claim)
        assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
        assert pv["spec"]["csi"] == {
            "driver": "cephfs.csi.ceph.com",
            "volumeHandle": pv["metadata"]["name"],
            "readOnly": mode == "ReadOnlyMany",
            "nodeStageSecretRef": {"name": "csi-cephfs-secret", "namespace": "ceph-csi-cephfs"},
            "volumeAttributes": {
                "clusterID": "4a9e4c3e-5a8b-11ef-9b1f-0242ac120002",
                "fsName": "cephfs",
                "staticVolume": "true",
                "rootPath": root,
            },
        }
        assert pv["spec"]["accessModes"] == claim["spec"]["accessModes"] == [mode]
        ref = pv["spec"]["claimRef"]
        assert (ref["namespace"], ref["name"]) == (NAMESPACE, claim["metadata"]["name"])
        assert claim["spec"]["volumeName"] == pv["metadata"]["name"]
        assert claim["spec"]["storageClassName"] == pv["spec"]["storageClassName"] == ""
        assert pv["metadata"]["labels"][names.LABEL_RELEASE] == "paddlecloud"
    # Another installation's volumes for the same user are other objects.
    other = manifests.user_volumes("alice", settings_for("cephfs", release="other"))
    assert {o["metadata"]["name"] for o in other if o["kind"] == "PersistentVolume"}.isdisjoint(handles)
    assert manifests.user_volumes("alice", settings_for("pvc")) == []


def test_shared_tenancy_makes_no_namespace_and_no_quota() -> None:
    settings = settings_for("pvc", namespace_mode="shared", namespace="ml-jobs")
    objects = manifests.tenancy_objects("alice", QUOTA, settings)
    assert [o["kind"] for o in objects] == ["LimitRange", "NetworkPolicy", "NetworkPolicy"]
    for obj in objects:
        validate(obj)
        assert obj["metadata"]["namespace"] == "ml-jobs"
        assert obj["metadata"]["labels"] == names.managed_labels("paddlecloud")
        assert "annotations" not in obj["metadata"], "the namespace's objects are no one user's"
    # The operator's own pods there are left alone.
    for policy in by_kind(objects, "NetworkPolicy"):
        assert policy["spec"]["podSelector"] == {"matchLabels": names.managed_labels("paddlecloud")}
    egress = by_kind(objects, "NetworkPolicy")[1]
    assert egress["spec"]["egress"] == [
        {
            "to": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                }
            ]
        }
    ]
    # Every user gets the same objects: create them idempotently.
    assert manifests.tenancy_objects("bob", Quota(cpu_milli=1), settings) == objects
    assert manifests.namespace_of("bob", settings) == "ml-jobs"


def test_resource_quota_from_a_users_quota() -> None:
    quota = manifests.resource_quota("paddle-alice", "alice", QUOTA, "pc")
    assert quota is not None
    validate(quota)
    assert quota["metadata"]["name"] == names.QUOTA_NAME
    assert quota["metadata"]["labels"][names.LABEL_RELEASE] == "pc"
    assert quota["spec"]["hard"] == {
        "requests.cpu": "8500m",
        "limits.cpu": "8500m",
        "requests.memory": "32Gi",
        "limits.memory": "32Gi",
        "requests.nvidia.com/gpu": "4",
        "pods": "6000",
        "requests.ephemeral-storage": "200Gi",
        "limits.ephemeral-storage": "200Gi",
    }
    no_gpus = manifests.resource_quota("paddle-alice", "alice", Quota(gpu=0), "pc")
    assert no_gpus is not None
    assert no_gpus["spec"]["hard"] == {"requests.nvidia.com/gpu": "0"}
    assert manifests.resource_quota("paddle-alice", "alice", Quota(storage_bytes=5), "pc") is None


def test_the_release_label_is_a_label_value_for_any_release() -> None:
    assert names.release_label("paddlecloud") == "paddlecloud"
    assert names.release_label("ml.prod") == "ml.prod"
    long = "a-namespace-of-forty-characters-exactly.a-release-name-of-thirty"
    label = names.release_label(long)
    assert len(label) <= 63 and label.startswith(long[:54]) and label != names.release_label(long + "x")
    assert names.release_label("team/prod") == f"team-prod-{hashlib.sha256(b'team/prod').hexdigest()[:8]}"
    assert (
        names.managed_selector("ml.prod") == f"{names.MANAGED_BY}=paddlecloud,{names.LABEL_RELEASE}=ml.prod"
    )


def test_the_tenant_binding_binds_the_tenant_role_to_the_service_only() -> None:
    settings = settings_for(release="ml.prod", tenant_role="ml-prod-tenant")
    binding = manifests.tenant_binding("paddle-alice", ("ml", "prod-jobs"), settings)
    validate(binding)
    assert binding["metadata"]["namespace"] == "paddle-alice"
    assert binding["metadata"]["labels"][names.LABEL_RELEASE] == "ml.prod"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "ml-prod-tenant",
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "prod-jobs", "namespace": "ml"}]


def test_limit_range_bounds_a_container_that_asks_for_nothing() -> None:
    settings = settings_for(max_container_cpu="96", max_container_memory="768Gi", max_container_disk="500Gi")
    (limits,) = by_kind(manifests.tenancy_objects("alice", Quota(), settings), "LimitRange")
    assert limits["spec"]["limits"] == [
        {
            "type": "Container",
            "default": {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "1Gi"},
            "defaultRequest": {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "1Gi"},
            "max": {"cpu": "96", "memory": "768Gi", "ephemeral-storage": "500Gi"},
        }
    ]


def test_dns_egress_goes_to_the_configured_dns_pods_on_any_port_or_the_ports_given() -> None:
    openshift = {
        "namespace_labels": {"kubernetes.io/metadata.name": "openshift-dns"},
        "pod_labels": {"dns.operator.openshift.io/daemonset-dns": "default"},
    }
    to = [
        {
            "namespaceSelector": {"matchLabels": openshift["namespace_labels"]},
            "podSelector": {"matchLabels": openshift["pod_labels"]},
        }
    ]
    for ports, rule in (
        ((), {"to": to}),
        (
            (5353,),
            {"to": to, "ports": [{"protocol": "UDP", "port": 5353}, {"protocol": "TCP", "port": 5353}]},
        ),
    ):
        settings = settings_for(dns=openshift | {"ports": ports})
        policy = by_kind(manifests.tenancy_objects("alice", Quota(), settings), "NetworkPolicy")[1]
        validate(policy)
        assert policy["metadata"]["name"] == names.DNS_STORAGE_POLICY
        assert policy["spec"]["egress"] == [rule]


def test_tenancy_names_can_never_be_a_jobs_names() -> None:
    for name in (names.DENY_ALL_POLICY, names.DNS_STORAGE_POLICY):
        with pytest.raises(ValidationError):
            JobSpec(name=name, package="p")


def test_kubernetes_settings_are_checked() -> None:
    bad_settings: list[dict[str, Any]] = [
        {"storage_cidrs": ["10.0.0.1"]},
        {"storage_cidrs": ["ten"]},
        {"storage_ports": [0]},
        {"max_container_cpu": "500m"},
        {"max_container_memory": "lots"},
        {"max_container_disk": "100Mi"},
        {"dns": {"pod_labels": {}}},
        {"dns": {"namespace_labels": {"kubernetes.io/metadata.name": "bad value!"}}},
        {"dns": {"pod_labels": {"-bad": "x"}}},
        {"dns": {"ports": [70000]}},
        {"cluster_domain": "Cluster.Local"},
        {"run_as_user": 0},
        {"master_port": 7170},
    ]
    for bad in bad_settings:
        with pytest.raises(ValidationError):
            KubernetesSection(**bad)
    assert KubernetesSection(cluster_domain="").cluster_domain == ""


def test_short_dns_names_without_a_cluster_domain() -> None:
    env = worker_env(make_plan(settings=settings_for(cluster_domain="")), names.ROLE_TRAINER, 1)
    assert env["POD_IP"] == f"mnist-trainer-1.mnist-trainer.{NAMESPACE}.svc"


# --- The runtime contract, compared with the local backend's ----------------------------

SOCKET_KEYS = {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"}

# Keys whose values differ between the backends, and how:
# - hosts: local workers are all 127.0.0.1; a pod is <pod>.<service>.<ns>.svc.<domain>.
#   In these keys every host is replaced by H before comparing; ports, order and counts
#   must agree (the local plan is given the kube ports to make that so).
HOST_KEYS = {
    "POD_IP",
    "PADDLE_INIT_PSERVERS",
    "PADDLE_PSERVERS_IP_PORT_LIST",
    "PADDLE_TRAINER_ENDPOINTS",
    "PADDLE_CURRENT_ENDPOINT",
    "MASTER_ADDR",
    "PADDLE_MASTER",
}
# - NAMESPACE: "" locally (there is none), the job's namespace on Kubernetes;
# - TRAINER_PACKAGE: the package's path locally, the unpacked copy (/job/work) in a pod;
# - LOCAL_RANK, LOCAL_WORLD_SIZE: locally every trainer shares the machine (its rank, the
#   trainer count) unless it holds GPUs; in a pod it is alone (0, 1);
# - DEVICE_ENV for a GPU trainer: locally the GPUs it holds; on Kubernetes the device
#   plugin sets NVIDIA_VISIBLE_DEVICES itself, so neither key is in the manifest.
# - GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME: the interface workers reach each other on,
#   loopback (lo) locally, the pod's own (eth0) on Kubernetes.
OTHER_KEYS = {"NAMESPACE", "TRAINER_PACKAGE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", *SOCKET_KEYS}


def hostless(key: str, value: str) -> str:
    if key in ("POD_IP", "MASTER_ADDR"):
        return "H"
    if key == "PADDLE_INIT_PSERVERS":
        return ",".join("H" for part in value.split(",") if part)
    return ",".join(f"H:{part.rsplit(':', 1)[1]}" for part in value.split(",") if part)


def local_envs(plan: JobPlan) -> dict[tuple[str, int], dict[str, str]]:
    """What the local backend gives the same job's workers (local/backend.py's call)."""
    launch, spec, settings = plan.launch, plan.launch.spec, plan.settings
    paths = WorkerPaths(
        pfs_home=str(launch.pfs_home),
        output=str(launch.output),
        package=str(launch.package),
        input=None if launch.input is None else str(launch.input),
    )
    ports = Ports(
        (settings.pserver_port,) * spec.pservers,
        (settings.trainer_port,) * spec.trainers,
        settings.master_port,
    )
    devices = {f"trainer-{i}": [str(i)] * spec.gpu for i in range(spec.trainers)} if spec.gpu else {}
    local = build_plan(launch, HostPlan(paths=paths, ports=ports, devices=devices))
    return {(w.role.value.lower(), w.index): dict(w.env) for w in local.workers}


@pytest.mark.parametrize("pservers", [0, 2])
@pytest.mark.parametrize("gpu", [0, 1])
def test_the_environment_is_the_local_backends(pservers: int, gpu: int) -> None:
    user_env = {"LEARNING_RATE": "0.1", "PRICE": "$(HOME) costs $$5 $", "EMPTY": ""}
    plan = make_plan(
        pservers=pservers, trainers=3, gpu=gpu, env=user_env, passes=4, input_path=f"{HOME}/data"
    )
    local = local_envs(plan)
    assert set(local) == {("pserver", i) for i in range(pservers)} | {("trainer", i) for i in range(3)}
    for (role, index), expected in local.items():
        kube = worker_env(plan, role, index)
        differing_devices = set(DEVICE_ENV) if role == "trainer" and gpu else set()
        assert kube.keys() == expected.keys() - differing_devices, (role, index)
        for key in kube:
            if key in HOST_KEYS:
                assert hostless(key, kube[key]) == hostless(key, expected[key]), (role, index, key)
            elif key not in OTHER_KEYS:
                assert kube[key] == expected[key], (role, index, key)
        assert kube["PRICE"] == "$(HOME) costs $$5 $", "a user's value reaches the program as written"
        assert kube["NAMESPACE"] == NAMESPACE and expected["NAMESPACE"] == ""
        assert kube["TRAINER_PACKAGE"] == "/job/work" and expected["TRAINER_PACKAGE"] == plan.launch.package
        for key in SOCKET_KEYS:
            assert (kube[key], expected[key]) == ("eth0", "lo"), (role, index, key)
        assert kube["PADDLE_DISTRI_BACKEND"] == ("nccl" if gpu else "gloo"), (role, index)
        if role == "trainer":
            assert (kube["LOCAL_RANK"], kube["LOCAL_WORLD_SIZE"]) == ("0", "1")
            # A local GPU trainer sees only its own devices: alone among them, as in a pod.
            alone = ("0", "1") if gpu else (str(index), "3")
            assert (expected["LOCAL_RANK"], expected["LOCAL_WORLD_SIZE"]) == alone


def test_a_users_collective_settings_win_on_both_backends() -> None:
    # Defaults, unlike the rest of the contract: a user on InfiniBand or with a GPU job
    # that should use gloo says so in `env`.
    chosen = {"GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "ib0", "PADDLE_DISTRI_BACKEND": "gloo"}
    plan = make_plan(pservers=1, trainers=2, gpu=1, env=chosen)
    for (role, index), local in local_envs(plan).items():
        kube = worker_env(plan, role, index)
        assert {k: kube[k] for k in chosen} == {k: local[k] for k in chosen} == chosen, (role, index)


# The two real Paddle examples (examples/paddle_collective, examples/paddle_ps), as
# `paddlecloud submit` sends them; tests/e2e/test_paddle_examples.py runs them locally.
PADDLE_JOBS = {
    "collective-cpu": {"name": "paddle-collective", "trainers": 2, "pservers": 0},
    "collective-gpu": {"name": "paddle-collective", "trainers": 2, "pservers": 0, "gpu": 1},
    "ps": {"name": "paddle-ps", "trainers": 2, "pservers": 2},
}


@pytest.mark.parametrize("example", sorted(PADDLE_JOBS))
def test_the_paddle_examples_dry_run_manifests_carry_what_paddle_reads(example: str) -> None:
    fields = PADDLE_JOBS[example]
    plan = make_plan(**fields)
    objects = manifests.all_objects(plan)  # what `submit --dry-run` shows
    for obj in objects:
        validate(obj)
    local = local_envs(plan)
    gpu = bool(fields.get("gpu"))
    name = str(fields["name"])
    for (role, index), expected in local.items():
        kube = worker_env(plan, role, index)
        devices = set(DEVICE_ENV) if role == "trainer" and gpu else set()
        assert kube.keys() == expected.keys() - devices, (role, index)
        for key in kube.keys() - OTHER_KEYS - HOST_KEYS:
            assert kube[key] == expected[key], (role, index, key)
        # What Paddle's collective mode and fleet read (docs/paddle.md).
        assert kube["PADDLE_DISTRI_BACKEND"] == ("nccl" if gpu else "gloo")
        assert kube["GLOO_SOCKET_IFNAME"] == kube["NCCL_SOCKET_IFNAME"] == "eth0"
        assert expected["GLOO_SOCKET_IFNAME"] == expected["NCCL_SOCKET_IFNAME"] == "lo"
        trainers = kube["PADDLE_TRAINER_ENDPOINTS"].split(",")
        assert len(trainers) == int(kube["PADDLE_TRAINERS_NUM"]) == 2
        assert kube["PADDLE_TRAINER_ID"] == str(index) and kube["TRAINING_ROLE"] == role.upper()
        own = f"{kube['POD_IP']}:{kube['PADDLE_PORT']}"
        assert own == kube["PADDLE_CURRENT_ENDPOINT"]
        servers = [e for e in kube["PADDLE_PSERVERS_IP_PORT_LIST"].split(",") if e]
        assert len(servers) == fields["pservers"]
        assert own == (trainers if role == "trainer" else servers)[index]
        assert (
            kube["PADDLE_MASTER"].rsplit(":", 1)[0]
            == f"{name}-trainer-0.{name}-trainer.{NAMESPACE}.svc.cluster.local"
        )


def dns(service: str, index: int) -> str:
    return f"mnist-{service}-{index}.mnist-{service}.{NAMESPACE}.svc.cluster.local"


def test_every_worker_finds_itself_in_the_endpoint_lists() -> None:
    plan = make_plan(pservers=2, trainers=3)
    for role, count, key in (
        ("pserver", 2, "PADDLE_PSERVERS_IP_PORT_LIST"),
        ("trainer", 3, "PADDLE_TRAINER_ENDPOINTS"),
    ):
        for index in range(count):
            env = worker_env(plan, role, index, pod_ip=f"10.0.0.{index}")
            assert (
                env["TRAINER_ID"] == env["PADDLE_TRAINER_ID"] == env["PADDLE_INIT_TRAINER_ID"] == str(index)
            )
            assert env["POD_IP"] == dns(role, index)
            # Paddle's fleet parameter server looks itself up as POD_IP:PADDLE_PORT.
            own = f"{env['POD_IP']}:{env['PADDLE_PORT']}"
            assert own == env["PADDLE_CURRENT_ENDPOINT"] == env[key].split(",")[index]
            assert env["PADDLE_PSERVERS_IP_PORT_LIST"] == f"{dns('pserver', 0)}:7164,{dns('pserver', 1)}:7164"
            assert env["PADDLE_INIT_PSERVERS"] == f"{dns('pserver', 0)},{dns('pserver', 1)}"
            assert env["PADDLE_INIT_PORT"] == "7164"
            assert env["PADDLE_MASTER"] == f"{dns('trainer', 0)}:29500"
            if role == "trainer":
                assert env["RANK"] == str(index)
                assert env["MASTER_ADDR"] == dns("trainer", 0)


# --- The init containers' scripts, run ---------------------------------------------------


def busybox_bin(tmp_path: Path) -> Path:
    """A PATH directory of busybox applets: the init image's tools, as near as this machine has."""
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("busybox is not installed (apt-get install busybox)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "cp", "tar", "unzip", "mkdir", "rm", "sleep", "cat", "echo"):
        (bin_dir / tool).symlink_to(busybox)
    return bin_dir


def run_init(
    container: dict[str, Any],
    pod: dict[str, Any],
    bin_dir: Path,
    paths: Mapping[str, str],
    timeout: float = 10,
) -> subprocess.CompletedProcess[str]:
    """Run an init container's command as the kubelet would, with its absolute paths moved
    under the test's directory."""
    env = resolve_env(container, pod)
    command = [expand(part, env) for part in container["command"]]
    for old, new in paths.items():
        command = [part.replace(old, new) for part in command]
        env = {k: v.replace(old, new) for k, v in env.items()}
    return subprocess.run(
        [str(bin_dir / "sh"), *command[1:]],
        env={**env, "PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def make_package(tmp_path: Path, kind: str) -> Path:
    files = {"train.py": "print('hi')\n", "lib/util.py": "X = 1\n", "trainer_id": "stale\n"}
    if kind == "dir":
        root = tmp_path / "pfs" / "home" / USER / "mnist"
        for name, text in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        return root
    home = tmp_path / "pfs" / "home" / USER
    home.mkdir(parents=True)
    if kind == "tar":
        path = home / "mnist.tar.gz"
        with tarfile.open(path, "w:gz") as tar:
            for name, text in files.items():
                info = tarfile.TarInfo(name)
                info.size = len(text)
                tar.addfile(info, io.BytesIO(text.encode()))
        return path
    path = home / "mnist.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


@pytest.mark.parametrize("kind", ["dir", "tar", "zip"])
def test_the_unpack_container_fills_the_work_directory(tmp_path: Path, kind: str) -> None:
    bin_dir = busybox_bin(tmp_path)
    make_package(tmp_path, kind)
    plan = make_plan(package_kind=kind, pservers=2)
    for role, index in (("trainer", 2), ("pserver", 1)):
        work = tmp_path / f"work-{role}"
        work.mkdir()
        template = pod_templates(manifests.job_objects(plan))[role]
        pod = running_pod(template, role, index, "10.0.0.9")
        unpack = template["spec"]["initContainers"][0]
        paths = {manifests.WORK_DIR: str(work), "/pfs/dc1": str(tmp_path / "pfs")}
        done = run_init(unpack, pod, bin_dir, paths)
        assert done.returncode == 0, done.stderr
        assert (work / "train.py").read_text() == "print('hi')\n"
        assert (work / "lib" / "util.py").read_text() == "X = 1\n"
        assert (work / "trainer_id").read_text() == f"{index}\n"
        assert (work / "trainer_count").read_text() == "3\n"
        assert (tmp_path / "pfs" / "home" / USER / "jobs" / "mnist" / "output").is_dir()


def test_trainers_wait_for_every_parameter_server(tmp_path: Path) -> None:
    bin_dir = busybox_bin(tmp_path)
    # A stand-in for `nc -z -w 2 HOST PORT` that connects to 127.0.0.1, whatever the host.
    fake_nc = bin_dir / "nc"
    fake_nc.write_text(
        f"#!{sys.executable}\n"
        "import socket, sys\n"
        "try:\n"
        "    socket.create_connection(('127.0.0.1', int(sys.argv[-1])), timeout=1).close()\n"
        "except OSError:\n"
        "    sys.exit(1)\n"
    )
    fake_nc.chmod(0o755)
    plan = make_plan(pservers=2)
    template = pod_templates(manifests.job_objects(plan))["trainer"]
    (wait,) = [c for c in template["spec"]["initContainers"] if c["name"] == "wait-pservers"]
    pod = running_pod(template, "trainer", 0, "10.0.0.9")
    with socket.socket() as first, socket.socket() as second:
        first.bind(("127.0.0.1", 0))
        first.listen()
        second.bind(("127.0.0.1", 0))
        second.listen()
        p1, p2 = first.getsockname()[1], second.getsockname()[1]
        # The endpoints with the test's ports in place of the real one.
        wait = json.loads(json.dumps(wait))
        wait["env"] = [{"name": "PSERVERS", "value": f"{dns('pserver', 0)}:{p1},{dns('pserver', 1)}:{p2}"}]
        done = run_init(wait, pod, bin_dir, {})
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [
            f"waiting for {dns('pserver', 0)}:{p1}",
            f"waiting for {dns('pserver', 1)}:{p2}",
        ]
        second.close()  # one server stops accepting: the trainers keep waiting
        with pytest.raises(subprocess.TimeoutExpired):
            run_init(wait, pod, bin_dir, {}, timeout=1.5)


# --- RBAC ------------------------------------------------------------------------------


@pytest.mark.parametrize("part", ["cluster", "tenant", "shared"])
def test_rbac_is_least_privilege(part: rbac.Part) -> None:
    role = rbac.role(part, "paddlecloud-jobs", "ml-jobs" if part == "shared" else None, "pc-tenant")
    validate(role)
    assert role["kind"] == ("Role" if part == "shared" else "ClusterRole")
    for rule in role["rules"]:
        assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"]
        assert not set(rule["verbs"]) & rbac.FORBIDDEN_VERBS
        assert not set(rule["resources"]) & rbac.FORBIDDEN_RESOURCES
        if "bind" in rule["verbs"]:  # the tenant role, by name, and nothing else
            assert rule == {
                "apiGroups": ["rbac.authorization.k8s.io"],
                "resources": ["clusterroles"],
                "resourceNames": ["pc-tenant"],
                "verbs": ["bind"],
            }
    granted = {(p.group, p.resource): set(p.verbs) for p in rbac.permissions(part)}
    if part == "cluster":
        # Only what cannot be namespaced, and making its own RoleBindings.
        assert granted == {
            ("", "namespaces"): {"get", "list", "watch", "create", "patch", "delete"},
            ("rbac.authorization.k8s.io", "rolebindings"): {"create"},
            ("rbac.authorization.k8s.io", "clusterroles"): {"bind"},
            # Each user's static PFS volumes (kind cephfs); the chart's policy confines them.
            ("", "persistentvolumes"): {"get", "create", "patch", "delete"},
        }
        return
    assert all(p.scope == "namespaced" for p in rbac.permissions(part))
    assert not any(p.group == "rbac.authorization.k8s.io" for p in rbac.permissions(part))
    assert granted[("", "secrets")].isdisjoint({"get", "list", "watch"}), "credentials are never read back"
    # Creating pods gives nothing that creating Jobs and StatefulSets did not: a job's
    # viewer is the one pod the service makes itself (and deletes when idle).
    assert granted[("", "pods")] == {"get", "list", "watch", "create", "delete"}
    assert granted[("", "pods/log")] == {"get"}
    assert ("", "namespaces") not in granted


def test_allowed_answers_for_recorded_requests() -> None:
    assert rbac.allowed("create", "", "namespaces", False, "per-user")
    assert not rbac.allowed("create", "", "namespaces", False, "shared")
    assert rbac.allowed("delete", "", "namespaces", False, "per-user")  # a deleted user's
    assert rbac.allowed("watch", "", "namespaces", False, "per-user")  # the release's, by label
    assert rbac.allowed("create", "batch", "jobs", True, "shared")
    assert rbac.allowed("watch", "", "pods", True, "per-user")
    for mode in ("per-user", "shared"):
        assert not rbac.allowed("watch", "", "pods", False, mode), "never across namespaces"
        assert not rbac.allowed("list", "", "configmaps", False, mode), "never across namespaces"
    assert rbac.allowed("create", "", "pods", True, "per-user")  # a job's viewer
    assert not rbac.allowed("create", "", "pods", False, "per-user"), "never across namespaces"
    assert not rbac.allowed("get", "", "secrets", True, "per-user")
    assert rbac.allowed("create", "", "secrets", True, "per-user")
    assert not rbac.allowed("create", "", "pods/exec", True, "per-user")
    assert rbac.allowed("get", "", "pods/log", True, "shared")
    assert not rbac.allowed("get", "apps", "jobs", True, "per-user"), "the group matters"
    rbac_group = "rbac.authorization.k8s.io"
    assert rbac.allowed("create", rbac_group, "rolebindings", True, "per-user")
    assert not rbac.allowed("create", rbac_group, "rolebindings", True, "shared")
    assert rbac.allowed("bind", rbac_group, "clusterroles", False, "per-user", "t", tenant_role="t")
    assert not rbac.allowed("bind", rbac_group, "clusterroles", False, "per-user", "admin", tenant_role="t")
    assert not rbac.allowed("bind", rbac_group, "clusterroles", False, "per-user", None, tenant_role="t")


def test_every_job_object_is_one_the_service_may_create() -> None:
    plan = make_plan(pservers=2, registry=REGISTRY)
    groups = {"v1": "", "apps/v1": "apps", "batch/v1": "batch", "networking.k8s.io/v1": "networking.k8s.io"}
    plural = {
        "ConfigMap": "configmaps",
        "Secret": "secrets",
        "NetworkPolicy": "networkpolicies",
        "Service": "services",
        "StatefulSet": "statefulsets",
        "Job": "jobs",
        "Namespace": "namespaces",
        "ResourceQuota": "resourcequotas",
        "LimitRange": "limitranges",
        "RoleBinding": "rolebindings",
        "Pod": "pods",
    }
    groups["rbac.authorization.k8s.io/v1"] = "rbac.authorization.k8s.io"
    for mode in ("per-user", "shared"):
        settings = settings_for(namespace_mode=mode)
        viewer = manifests.ViewerPlan(
            job_name="j1", job_id="id1", owner=USER, datacenter=DC, kind="visualdl", output=f"{HOME}/out",
            prefix="/p", image="viewers:1", settings=settings, namespace=NAMESPACE,
        )  # fmt: skip
        # A viewer's, which the service deletes as well (its ConfigMap and pod).
        assert rbac.allowed("delete", "", "configmaps", True, mode)
        assert rbac.allowed("delete", "", "pods", True, mode)
        objects = manifests.all_objects(plan) + manifests.tenancy_objects(USER, QUOTA, settings)
        objects += [manifests.viewer_owner(viewer), *manifests.viewer_objects(viewer)]
        if mode == "per-user":
            objects.append(manifests.tenant_binding("paddle-alice", ("pc", "pc-jobs"), settings))
        for obj in objects:
            namespaced = obj["kind"] != "Namespace"
            assert rbac.allowed("create", groups[obj["apiVersion"]], plural[obj["kind"]], namespaced, mode)


def test_an_hdfs_datacenters_job_sees_its_home_and_public_of_the_nodes_mount_only(tmp_path: Path) -> None:
    """`pfs.hdfs` with the one volume kind config validation lets through for it: every
    container that mounts PFS gets the node's HDFS mount at exactly the user's home
    (read-write) and public (read-only), by subPath; the mount's root, other homes and
    pfs's staging (`.uploads`) are in no container, and no other host path is in the pod."""
    path = tmp_path / "paddlecloud.yaml"
    path.write_text(
        f"pfs:\n  datacenter: {DC}\n  hdfs: {{namenode: 'http://nn.example:9870', root_path: /paddlecloud}}\n"
        "jobs:\n  backend: kubernetes\n  kubernetes:\n    datacenters:\n"
        f"      {DC}: {{kind: hostpath, host_path: /mnt/hdfs/paddlecloud}}\n"
    )
    settings = load_config(path, env={}).jobs.kubernetes
    plan = make_plan(settings=settings)
    for role, template in pod_templates(manifests.job_objects(plan)).items():
        pod = template["spec"]
        host = [v for v in pod["volumes"] if "hostPath" in v]
        assert host == [{"name": "pfs", "hostPath": {"path": "/mnt/hdfs/paddlecloud", "type": "Directory"}}]
        seen: dict[str, list[dict[str, Any]]] = {}
        for container in containers(pod):
            seen[container["name"]] = [m for m in container.get("volumeMounts", []) if m["name"] == "pfs"]
        wanted = [
            {"name": "pfs", "mountPath": HOME, "subPath": f"home/{USER}"},
            {"name": "pfs", "mountPath": f"/pfs/{DC}/public", "subPath": "public", "readOnly": True},
        ]
        assert seen.pop("wait-pservers", []) == [], role
        assert seen and all(mounts == wanted for mounts in seen.values()), (role, seen)


@pytest.mark.parametrize("kind", ["pvc", "cephfs", "hostpath"])
@pytest.mark.parametrize("viewer", ["tensorboard", "visualdl"])
def test_a_viewer_is_a_restricted_pod_seeing_the_home_read_only(kind: str, viewer: str) -> None:
    """A job's viewer (docs/metrics.md §4.5): valid objects owned by its ConfigMap, the
    owner's home read-only where the job pods see it, restricted Pod Security, no token,
    and a policy that admits the jobs service's pods to its port and nothing else."""
    output = f"/pfs/{DC}/home/alice/jobs/j1/output"
    plan = manifests.ViewerPlan(
        job_name="j1", job_id="id1", owner="alice", datacenter=DC, kind=viewer, output=output,
        prefix=f"/api/v1/jobs/j1/{viewer}", image="viewers:1", settings=settings_for(kind),
        namespace="paddle-alice", jobs_namespace="pc", owner_uid="u1",
    )  # fmt: skip
    owner = manifests.viewer_owner(plan)
    objects = manifests.viewer_objects(plan)
    for obj in (owner, *objects):
        validate(obj)
        labels = obj["metadata"]["labels"]
        assert labels[names.LABEL_VIEWER_OF] == "id1" and names.LABEL_JOB_ID not in labels
        assert obj["metadata"]["name"] == f"j1-{viewer}"
    assert owner["data"][manifests.VIEWER_SERVE_KEY] == manifests.VIEWER_SERVE.read_text()
    pod, service, policy = (one(objects, k) for k in ("Pod", "Service", "NetworkPolicy"))
    for obj in (pod, service, policy):
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "u1"
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (main,) = spec["containers"]
    assert main["securityContext"]["allowPrivilegeEscalation"] is False
    assert main["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert main["resources"]["requests"] == main["resources"]["limits"]
    port = manifests.VIEWER_PORTS[viewer]
    assert main["command"][-5:] == ["--port", str(port), viewer, output, f"/api/v1/jobs/j1/{viewer}"]
    home = [m for m in main["volumeMounts"] if m["mountPath"] == f"/pfs/{DC}/home/alice"]
    assert len(home) == 1 and home[0]["readOnly"] is True
    assert not any(m["mountPath"].startswith(f"/pfs/{DC}/public") for m in main["volumeMounts"])
    if kind == "cephfs":
        claims = [v for v in spec["volumes"] if "persistentVolumeClaim" in v]
        assert [c["persistentVolumeClaim"]["readOnly"] for c in claims] == [True]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": port}]
    assert rule["from"] == [
        {
            "podSelector": {"matchLabels": {"app.kubernetes.io/component": "jobs"}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "pc"}},
        }
    ]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert service["spec"]["selector"] == policy["spec"]["podSelector"]["matchLabels"]


def test_a_viewer_of_an_output_outside_the_home_is_refused() -> None:
    plan = manifests.ViewerPlan(
        job_name="j1", job_id="id1", owner="alice", datacenter=DC, kind="tensorboard",
        output=f"/pfs/{DC}/home/bob/out", prefix="/p", image="viewers:1", settings=settings_for(),
        namespace="paddle-alice",
    )  # fmt: skip
    with pytest.raises(ValueError, match="not in alice's home"):
        manifests.viewer_owner(plan)
