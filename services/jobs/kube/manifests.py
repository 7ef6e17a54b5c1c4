"""The kubernetes backend's manifests: pure functions from a job or a user to plain dicts.

Nothing here talks to the API server; every function returns Kubernetes' own JSON shape
(`apiVersion`, `kind`, `metadata`, ...) and the same output for the same input, so the
backend can create, compare and print (`submit --dry-run -o yaml`) them alike. They are
checked, strict, against Kubernetes KUBERNETES_VERSION (tests/unit/test_kube_manifests.py).
docs/kubernetes.md explains the objects; the choices that matter when reading the code:

- One job = one ConfigMap (`names.owner_name`, the spec's JSON) that owns every other
  object of the job, so deleting it removes them all (the garbage collector's cascade).
  Children carry `blockOwnerDeletion: true` (a foreground delete of the owner ends only
  once they are gone) and `controller: false` (no controller manages a ConfigMap).
- Trainers are an Indexed Job: the completion index is the trainer id, read with the
  downward API, so it survives restarts. Parameter servers are a StatefulSet, whose pod
  index (the `apps.kubernetes.io/pod-index` label) is theirs.
- Every worker's environment comes from `contract.contract_env`, as on the local
  backend. Per-pod values are `$(TRAINER_ID)` references that the kubelet expands, and
  every literal has its `$` doubled, so a user's `$(HOME)` stays as written.
- Every container, init containers too, requests and is limited to the job's `disk` of
  ephemeral storage, and the work emptyDir has it as its sizeLimit: the kubelet evicts
  a pod past either, before it fills the node's disk and other tenants' pods are evicted.
- An image pulled with the job's registry credentials is pulled `Always`: the kubelet
  checks the job's credentials on every start, so an image one user pulled with theirs is
  never run from the node's cache by another without any.
- POD_IP is the pod's stable DNS name, not its address: Paddle's fleet parameter server
  finds itself by looking up `POD_IP:PADDLE_PORT` in PADDLE_PSERVERS_IP_PORT_LIST, which
  holds DNS names (the only endpoints known before the pods exist).
"""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paddlecloud.common.config import DatacenterVolume, KubernetesSection
from paddlecloud.common.dockerconfig import Credentials, dockerconfigjson, host_of, image_host
from paddlecloud.common.quantity import format_bytes, format_cpu_milli, parse_bytes, parse_cpu_milli
from paddlecloud.common.store import Quota, Registry

from .. import sdk
from ..backend import Launch
from ..contract import RESERVED_ENV, JobContract, contract_env
from ..spec import DEFAULT_CPU, DEFAULT_DISK, DEFAULT_MEMORY, MAX_PSERVERS, MAX_TRAINERS
from . import names

# The Kubernetes version the manifests are written for and checked against: the first in
# which everything they use is GA (Job backoffLimitPerIndex, podFailurePolicy and
# podReplacementPolicy; the StatefulSet pod-index label).
KUBERNETES_VERSION = "1.33"

# Where the job package is unpacked, the working directory of every worker (as on the
# local backend, whose sandboxed workers also run in /job/work).
WORK_DIR = "/job/work"
GPU_RESOURCE = "nvidia.com/gpu"
# A container's writable layer, its logs on the node and its pod's emptyDir volumes.
DISK_RESOURCE = "ephemeral-storage"
# A pod's own network interface: CNI plugins name it eth0 (the CNI spec's CNI_IFNAME as
# the kubelet passes it); gloo and NCCL bind their sockets there.
POD_INTERFACE = "eth0"
PFS_VOLUME = "pfs"
WORK_VOLUME = "work"
SDK_VOLUME = "sdk"
POD_SECURITY = "pod-security.kubernetes.io"
# The owner ConfigMap's key for the job's spec.
SPEC_KEY = "spec.json"
# The owner ConfigMap's keys for the SDK's files (sdk.py), by their path below sdk.SDK_DIR:
# a key may not hold a `/`, so the pods' volume maps each key to its path.
SDK_KEYS = {"sdk-init.py": sdk.INIT, "sdk-metrics.py": sdk.METRICS}

# The downward API fields that hold a pod's index within its role.
_INDEX_FIELD = {
    "PSERVER": f"metadata.labels['{names.POD_INDEX}']",
    "TRAINER": f"metadata.annotations['{names.COMPLETION_INDEX}']",
}
_ROLE_LABEL = {"PSERVER": names.ROLE_PSERVER, "TRAINER": names.ROLE_TRAINER}


@dataclass(frozen=True)
class JobPlan:
    """Everything the manifests of one job depend on, resolved by the backend.

    `image` is what the job's containers run (`image_for`); `registry` the saved
    credentials the spec names (None when it names none); `owner_uid` the uid of the
    job's owner ConfigMap, which its children's ownerReferences need: create the owner
    first, then the children with its uid (the placeholder serves a dry run)."""

    launch: Launch
    settings: KubernetesSection
    namespace: str
    image: str
    registry: Registry | None = None
    owner_uid: str = "<owner-uid>"


def image_for(launch: Launch, settings: KubernetesSection) -> str:
    """The image a job runs: the one built for its requirements, else the spec's, else
    the platform's (its GPU image for a job that asks for GPUs, where there is one)."""
    if launch.runtime is not None and launch.runtime.image:
        return launch.runtime.image
    if launch.spec.image:
        return launch.spec.image
    if launch.spec.gpu > 0 and settings.gpu_image:
        return settings.gpu_image
    return settings.default_image


# --- Tenancy ---------------------------------------------------------------------------


def namespace_of(user: str, settings: KubernetesSection) -> str:
    """The namespace `user`'s jobs run in, in either mode."""
    if settings.namespace_mode == "shared":
        return settings.namespace
    return names.namespace_for(user, settings.namespace_prefix)


def pod_security_level(settings: KubernetesSection) -> str:
    """The Pod Security level a per-user namespace enforces: `restricted` unless a
    datacenter's PFS volume is of a type it forbids. Restricted admits only volumes
    defined through PersistentVolumes (pvc, and cephfs: the service's claims); a
    `hostPath` one needs `privileged`. Job pods meet every other rule of restricted
    whatever the level, and the namespace warns and audits at restricted."""
    kinds = {volume.kind for volume in settings.datacenters.values()}
    return "privileged" if "hostpath" in kinds else "restricted"


def tenancy_objects(user: str, quota: Quota, settings: KubernetesSection) -> list[dict[str, Any]]:
    """The objects of `user`'s namespace, in creation order: the Namespace and its
    ResourceQuota (per-user mode only), a LimitRange, the NetworkPolicies that deny
    every pod all traffic but to the cluster's DNS pods (`settings.dns`) and the storage
    CIDRs (each job's own policy then lets its pods reach each other), and the user's
    PFS volumes and claims of cephfs datacenters (`user_volumes`).

    In shared mode the operator made `settings.namespace`: there is no Namespace object,
    and no ResourceQuota, since a quota there would bound every user together (the
    service enforces each user's quota when a job is submitted). Its LimitRange and
    policies are the namespace's, the same for every user (create them idempotently);
    the policies select only PaddleCloud's pods, leaving the operator's own alone."""
    namespace = namespace_of(user, settings)
    shared = settings.namespace_mode == "shared"
    labels = names.managed_labels(settings.release)
    annotations: dict[str, str] = {}
    if not shared:
        labels[names.LABEL_USER] = names.user_label(user)
        annotations[names.ANNOTATION_USER] = user
    objects: list[dict[str, Any]] = []
    if not shared:
        level = pod_security_level(settings)
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": _metadata(
                    namespace,
                    None,
                    labels
                    | {
                        f"{POD_SECURITY}/enforce": level,
                        f"{POD_SECURITY}/enforce-version": f"v{KUBERNETES_VERSION}",
                        f"{POD_SECURITY}/warn": "restricted",
                        f"{POD_SECURITY}/audit": "restricted",
                    },
                    annotations,
                ),
            }
        )
        quota_object = resource_quota(namespace, user, quota, settings.release)
        if quota_object is not None:
            objects.append(quota_object)
    objects.append(_limit_range(namespace, labels, annotations, settings))

    def pods() -> dict[str, Any]:
        # Per-user: every pod of the namespace is ours. Shared: only ours.
        return {"matchLabels": names.managed_labels(settings.release)} if shared else {}

    objects.append(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": _metadata(names.DENY_ALL_POLICY, namespace, labels, annotations),
            # Selected, with no rule allowing anything: no traffic in or out.
            "spec": {"podSelector": pods(), "policyTypes": ["Ingress", "Egress"]},
        }
    )
    egress: list[dict[str, Any]] = [_dns_rule(settings)]
    if settings.storage_cidrs:
        rule: dict[str, Any] = {"to": [{"ipBlock": {"cidr": cidr}} for cidr in settings.storage_cidrs]}
        if settings.storage_ports:
            rule["ports"] = [{"protocol": "TCP", "port": port} for port in settings.storage_ports]
        egress.append(rule)
    objects.append(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": _metadata(names.DNS_STORAGE_POLICY, namespace, labels, annotations),
            "spec": {"podSelector": pods(), "policyTypes": ["Egress"], "egress": egress},
        }
    )
    if not shared:  # (shared mode admits no cephfs volume: config.py)
        objects.extend(user_volumes(user, settings))
    return objects


def tenant_binding(namespace: str, account: tuple[str, str], settings: KubernetesSection) -> dict[str, Any]:
    """The RoleBinding that gives the service (`account`: its ServiceAccount's namespace
    and name) its rights in a namespace it made: the tenant ClusterRole the chart installs,
    bound there only. Its cluster-wide rights let it create RoleBindings with `bind` on
    that one ClusterRole, and the chart's ValidatingAdmissionPolicy admits no other."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(names.TENANT_BINDING, namespace, names.managed_labels(settings.release), {}),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": settings.tenant_role,
        },
        "subjects": [{"kind": "ServiceAccount", "name": account[1], "namespace": account[0]}],
    }


def _dns_rule(settings: KubernetesSection) -> dict[str, Any]:
    """Egress to the cluster's DNS pods, chosen by their namespace's and their own labels.
    No port by default: a policy is checked after the Service's address was translated to
    a pod's, so it sees the port the pods listen on, which is not 53 everywhere (5353 on
    OpenShift), and a rule for 53 would leave every lookup unanswered there. Port 53 to
    anywhere is not allowed any more: it let job pods reach any server on port 53."""
    dns = settings.dns
    rule: dict[str, Any] = {
        "to": [
            {
                "namespaceSelector": {"matchLabels": dict(dns.namespace_labels)},
                "podSelector": {"matchLabels": dict(dns.pod_labels)},
            }
        ]
    }
    if dns.ports:
        rule["ports"] = [{"protocol": proto, "port": port} for port in dns.ports for proto in ("UDP", "TCP")]
    return rule


def resource_quota(namespace: str, user: str, quota: Quota, release: str) -> dict[str, Any] | None:
    """The ResourceQuota of a per-user namespace from the user's Quota; None when the
    quota limits none of what it covers (delete an existing one then). Apply it again,
    whole, when an admin changes the quota.

    cpu and memory bound requests and limits alike (job pods ask for both, equal).
    GPUs are `requests.nvidia.com/gpu` only: Kubernetes admits no `limits.` quota for an
    extended resource, whose request always equals its limit. `pods` follows the
    concurrent-jobs limit: that many jobs of the largest size the spec allows, a
    backstop that never refuses a job the service accepted. Disk bounds ephemeral
    storage (a job's `disk`), requests and limits alike. Storage is the pfs service's to
    enforce, on the PFS, not the namespace's."""
    hard: dict[str, str] = {}
    if quota.cpu_milli is not None:
        cpu = format_cpu_milli(quota.cpu_milli)
        hard |= {"requests.cpu": cpu, "limits.cpu": cpu}
    if quota.memory_bytes is not None:
        memory = format_bytes(quota.memory_bytes)
        hard |= {"requests.memory": memory, "limits.memory": memory}
    if quota.gpu is not None:
        hard[f"requests.{GPU_RESOURCE}"] = str(quota.gpu)
    if quota.disk_bytes is not None:
        disk = format_bytes(quota.disk_bytes)
        hard |= {f"requests.{DISK_RESOURCE}": disk, f"limits.{DISK_RESOURCE}": disk}
    if quota.jobs is not None:
        hard["pods"] = str(quota.jobs * (MAX_PSERVERS + MAX_TRAINERS))
    if not hard:
        return None
    labels = names.managed_labels(release) | {names.LABEL_USER: names.user_label(user)}
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": _metadata(names.QUOTA_NAME, namespace, labels, {names.ANNOTATION_USER: user}),
        "spec": {"hard": hard},
    }


def _limit_range(
    namespace: str, labels: Mapping[str, str], annotations: Mapping[str, str], settings: KubernetesSection
) -> dict[str, Any]:
    # A container that asks for nothing gets what a job's worker gets by default, as
    # request and limit (so it counts in the quota as what it may use).
    default = {
        "cpu": _cpu(DEFAULT_CPU),
        "memory": _memory(DEFAULT_MEMORY),
        DISK_RESOURCE: _memory(DEFAULT_DISK),
    }
    largest = {
        "cpu": _cpu(settings.max_container_cpu),
        "memory": _memory(settings.max_container_memory),
        DISK_RESOURCE: _memory(settings.max_container_disk),
    }
    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": _metadata(names.LIMIT_RANGE_NAME, namespace, labels, annotations),
        "spec": {
            "limits": [
                {"type": "Container", "default": default, "defaultRequest": dict(default), "max": largest}
            ]
        },
    }


# --- One job ---------------------------------------------------------------------------


def owner_object(plan: JobPlan) -> dict[str, Any]:
    """The job's owner: a ConfigMap with the job's spec, made first, and the SDK's files
    (sdk.py) that its pods mount, so that a job carries the SDK of the platform that
    started it and nothing outlives it. Immutable: the spec of a job never changes (labels
    and annotations still may), and the kubelet need not watch it.

    Raises ValueError as `job_objects` does, so a launch that cannot run is refused
    before anything is created."""
    _check(plan)
    spec = plan.launch.spec.to_dict()
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _job_metadata(plan, names.owner_name(plan.launch.spec.name), names.ROLE_JOB, owned=False),
        "immutable": True,
        "data": {
            SPEC_KEY: json.dumps(spec, sort_keys=True, separators=(",", ":")),
            **{key: sdk.files()[path] for key, path in SDK_KEYS.items()},
        },
    }


def job_objects(plan: JobPlan) -> list[dict[str, Any]]:
    """The job's other objects, each owned by its ConfigMap, in creation order: the
    registry Secret (when the job names a registry), the job's NetworkPolicy, then the
    parameter servers' Service and StatefulSet (when it has any), then the trainers'
    Service and Job, so that every name a worker looks up exists before it starts.

    Raises ValueError for a launch these objects cannot run: a datacenter without a
    volume in the settings, a package or output outside the user's PFS areas, a
    registry that is missing or another user's, a user variable of the contract."""
    _check(plan)
    spec = plan.launch.spec
    job = spec.name
    objects: list[dict[str, Any]] = []
    if plan.registry is not None:
        objects.append(_registry_secret(plan, plan.registry))
    objects.append(_job_network_policy(plan))
    settings = plan.settings
    if spec.pservers > 0:
        ps_ports = {"paddle": settings.pserver_port}
        objects.append(_headless_service(plan, "PSERVER", names.pserver_name(job), ps_ports))
        objects.append(_pserver_statefulset(plan))
    ports = {"paddle": settings.trainer_port, "master": settings.master_port}
    objects.append(_headless_service(plan, "TRAINER", names.trainer_name(job), ports))
    objects.append(_trainer_job(plan))
    return objects


def all_objects(plan: JobPlan) -> list[dict[str, Any]]:
    """The owner, then its children: everything one job creates, in order."""
    return [owner_object(plan), *job_objects(plan)]


def redacted(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`objects` with every Secret's data replaced by a placeholder, for printing, and the
    SDK's source files in the owner ConfigMap by a line that names them (a dry run's YAML
    would otherwise be mostly platform code)."""
    shown = []
    for obj in objects:
        data = obj.get("data") or {}
        if obj.get("kind") == "Secret":
            obj = {**obj, "data": dict.fromkeys(data, "<redacted>")}
        elif obj.get("kind") == "ConfigMap" and SDK_KEYS.keys() <= data.keys():
            sdk_files = {key: f"<the SDK's {SDK_KEYS[key]}, {len(data[key])} characters>" for key in SDK_KEYS}
            obj = {**obj, "data": data | sdk_files}
        shown.append(obj)
    return shown


def _check(plan: JobPlan) -> None:
    launch = plan.launch
    dc, user = launch.datacenter, launch.job.owner
    if dc not in plan.settings.datacenters:
        raise ValueError(f"datacenter {dc!r} has no volume in jobs.kubernetes.datacenters")
    home, public = _home(launch), f"/pfs/{dc}/public"
    if launch.pfs_home != home:
        raise ValueError(f"pfs_home {launch.pfs_home!r} is not {user}'s home on {dc}, {home!r}")
    # The launch's paths were parsed by the service: checked again as the words that the
    # manifests carry (str() of a PfsPath is its text).
    for what, path in (("package", launch.package), ("input", launch.input)):
        if path is not None and not _beneath(str(path), home, public):
            raise ValueError(f"the {what} {str(path)!r} is neither in {home} nor in {public}")
    if not _beneath(str(launch.output), home):
        raise ValueError(f"the output {str(launch.output)!r} is not in {home}")
    if launch.package_kind not in _UNPACK:
        raise ValueError(f"package_kind must be one of {', '.join(_UNPACK)}, not {launch.package_kind!r}")
    named, registry = launch.spec.registry, plan.registry
    if named is not None and registry is None:
        raise ValueError(f"the job names registry {named!r}, but no credentials were given")
    if registry is not None and (registry.owner, registry.name) != (user, named):
        raise ValueError(f"registry {registry.name!r} of {registry.owner!r} is not one {user}'s job names")
    clashes = sorted(RESERVED_ENV & launch.spec.env.keys())
    if clashes:
        raise ValueError(f"env may not set variables of the runtime contract: {', '.join(clashes)}")


def _home(launch: Launch) -> str:
    return f"/pfs/{launch.datacenter}/home/{launch.job.owner}"


def _beneath(path: str, *roots: str) -> bool:
    parts = path.split("/")
    if ".." in parts or "." in parts:
        return False
    return any(path == root or path.startswith(root + "/") for root in roots)


# --- Metadata --------------------------------------------------------------------------


def _metadata(
    name: str, namespace: str | None, labels: Mapping[str, str], annotations: Mapping[str, str]
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def _labels(plan: JobPlan, role: str) -> dict[str, str]:
    job = plan.launch.job
    return names.job_labels(job.owner, plan.launch.spec.name, job.id, plan.settings.release) | {
        names.LABEL_ROLE: role
    }


def _job_metadata(plan: JobPlan, name: str, role: str, *, owned: bool = True) -> dict[str, Any]:
    meta = _metadata(
        name, plan.namespace, _labels(plan, role), {names.ANNOTATION_USER: plan.launch.job.owner}
    )
    if owned:
        meta["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "name": names.owner_name(plan.launch.spec.name),
                "uid": plan.owner_uid,
                "controller": False,
                "blockOwnerDeletion": True,
            }
        ]
    return meta


def _selector(plan: JobPlan, role: str) -> dict[str, str]:
    return {names.LABEL_JOB_ID: plan.launch.job.id, names.LABEL_ROLE: _ROLE_LABEL[role]}


# --- Objects ---------------------------------------------------------------------------


def _registry_secret(plan: JobPlan, registry: Registry) -> dict[str, Any]:
    # The key as the kubelet looks it up (Docker Hub's is https://index.docker.io/v1/).
    text = dockerconfigjson({registry.server: Credentials(registry.username, registry.password)})
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _job_metadata(plan, names.registry_secret_name(plan.launch.spec.name), names.ROLE_JOB),
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(text.encode()).decode()},
    }


def _job_network_policy(plan: JobPlan) -> dict[str, Any]:
    # Any port: besides the contract's, frameworks open their own (NCCL, gloo, brpc).
    def own() -> dict[str, Any]:
        return {"matchLabels": {names.LABEL_JOB_ID: plan.launch.job.id}}

    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _job_metadata(plan, plan.launch.spec.name, names.ROLE_JOB),
        "spec": {
            "podSelector": own(),
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": own()}]}],
            "egress": [{"to": [{"podSelector": own()}]}],
        },
    }


def _headless_service(plan: JobPlan, role: str, name: str, ports: Mapping[str, int]) -> dict[str, Any]:
    # Headless, for the pods' own DNS names (<pod>.<service>.<ns>.svc); published before
    # they are ready, since a worker looks its peers up while they start.
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _job_metadata(plan, name, _ROLE_LABEL[role]),
        "spec": {
            "clusterIP": "None",
            "selector": _selector(plan, role),
            "publishNotReadyAddresses": True,
            "ports": [
                {"name": port_name, "protocol": "TCP", "port": port, "targetPort": port}
                for port_name, port in ports.items()
            ],
        },
    }


def _pserver_statefulset(plan: JobPlan) -> dict[str, Any]:
    spec = plan.launch.spec
    name = names.pserver_name(spec.name)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _job_metadata(plan, name, names.ROLE_PSERVER),
        "spec": {
            "serviceName": name,
            "replicas": spec.pservers,
            # Every server at once: none of them waits for another.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": _selector(plan, "PSERVER")},
            "template": _pod_template(plan, "PSERVER"),
        },
    }


def _trainer_job(plan: JobPlan) -> dict[str, Any]:
    spec = plan.launch.spec
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _job_metadata(plan, names.trainer_name(spec.name), names.ROLE_TRAINER),
        "spec": {
            "completionMode": "Indexed",
            "completions": spec.trainers,
            "parallelism": spec.trainers,
            # Each trainer may fail max_restarts times; one more fails its index, and
            # with no failed index allowed, the job.
            "backoffLimitPerIndex": spec.max_restarts,
            "maxFailedIndexes": 0,
            # An evicted or preempted trainer is not the program's failure: it is
            # restarted without counting (the backend bounds evictions itself).
            "podFailurePolicy": {
                "rules": [
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
                ]
            },
            # A replacement starts once the old pod is gone: two pods never hold one
            # trainer's DNS name.
            "podReplacementPolicy": "Failed",
            "template": _pod_template(plan, "TRAINER"),
        },
    }


def _pod_template(plan: JobPlan, role: str) -> dict[str, Any]:
    settings, spec = plan.settings, plan.launch.spec
    job = spec.name
    security: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": settings.run_as_user,
        "runAsGroup": settings.run_as_group,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if settings.fs_group is not None:
        security |= {"fsGroup": settings.fs_group, "fsGroupChangePolicy": "OnRootMismatch"}
    init = [_unpack_container(plan, role)]
    if role == "TRAINER" and spec.pservers > 0:
        init.append(_wait_container(plan))
    pod: dict[str, Any] = {
        "restartPolicy": "Never" if role == "TRAINER" else "Always",
        # Job pods never talk to the API server, and see no Service's variables.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": security,
        "initContainers": init,
        "containers": [_main_container(plan, role)],
        # The work directory is bounded by itself too: the kubelet evicts the pod once
        # the volume holds more than the job's disk, whatever the containers' limits.
        "volumes": [
            {"name": WORK_VOLUME, "emptyDir": {"sizeLimit": format_bytes(spec.disk_bytes)}},
            *_pfs_volumes(plan),
            _sdk_volume(plan),
        ],
    }
    if role == "TRAINER":
        # Indexed Job pods are named <job>-trainer-<index> as hosts; the subdomain
        # makes that <job>-trainer-<index>.<job>-trainer.<ns>.svc resolve.
        pod["subdomain"] = names.trainer_name(job)
    if plan.registry is not None:
        pod["imagePullSecrets"] = [{"name": names.registry_secret_name(job)}]
    if role == "TRAINER" and spec.gpu > 0:
        # GPU nodes are commonly tainted so that only pods asking for GPUs land there.
        pod["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "metadata": {
            "labels": _labels(plan, _ROLE_LABEL[role]),
            "annotations": {names.ANNOTATION_USER: plan.launch.job.owner},
        },
        "spec": pod,
    }


def _container_security(*, read_only_root: bool = False) -> dict[str, Any]:
    security: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "privileged": False,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if read_only_root:
        security["readOnlyRootFilesystem"] = True
    return security


def _resources(plan: JobPlan, role: str, *, gpus: bool) -> dict[str, Any]:
    spec = plan.launch.spec
    if role == "TRAINER":
        amount = {"cpu": format_cpu_milli(spec.cpu_milli), "memory": format_bytes(spec.memory_bytes)}
    else:
        amount = {"cpu": format_cpu_milli(spec.pscpu_milli), "memory": format_bytes(spec.psmemory_bytes)}
    # Every worker's disk, init containers' too: a pod's bound is the largest of its
    # init containers' and the sum of its containers', so this is the pod's whole.
    amount[DISK_RESOURCE] = format_bytes(spec.disk_bytes)
    limits = dict(amount)
    if gpus and role == "TRAINER" and spec.gpu > 0:
        limits[GPU_RESOURCE] = str(spec.gpu)
    # Requests equal limits: a worker gets what it asked for, and the quota counts that.
    return {"requests": amount, "limits": limits}


def _pull_policy(plan: JobPlan, image: str) -> str:
    """`Always` for an image pulled with the user's registry Secret (the kubelet uses a
    Secret's credentials for images of that registry only): with `IfNotPresent` a node
    that holds the image from one user's pull runs it for anyone, credentials or not,
    while `Always` makes the kubelet ask the registry with this pod's credentials each
    time (a manifest check when the layers are there). Other images keep the setting."""
    registry = plan.registry
    if registry is not None and image_host(image) == host_of(registry.server):
        return "Always"
    return plan.settings.image_pull_policy


def _main_container(plan: JobPlan, role: str) -> dict[str, Any]:
    spec, settings = plan.launch.spec, plan.settings
    command = spec.entry if role == "TRAINER" else (spec.psentry or spec.entry)
    port = settings.trainer_port if role == "TRAINER" else settings.pserver_port
    ports = [{"name": "paddle", "containerPort": port, "protocol": "TCP"}]
    if role == "TRAINER":
        ports.append({"name": "master", "containerPort": settings.master_port, "protocol": "TCP"})
    container: dict[str, Any] = {
        "name": _ROLE_LABEL[role],
        "image": plan.image,
        "imagePullPolicy": _pull_policy(plan, plan.image),
        # PYTHONPATH gains the SDK in the shell, after the image's and the user's own:
        # an env entry would replace the image's value, which the kubelet cannot refer to.
        "command": ["/bin/sh", "-c", _literal(sdk.pythonpath_prefix() + command)],
        "workingDir": WORK_DIR,
        "env": _contract_env(plan, role),
        "ports": ports,
        "resources": _resources(plan, role, gpus=True),
        "securityContext": _container_security(),
        "volumeMounts": [
            {"name": WORK_VOLUME, "mountPath": WORK_DIR},
            *_pfs_mounts(plan),
            {"name": SDK_VOLUME, "mountPath": sdk.SDK_DIR, "readOnly": True},
        ],
        # A failed worker's last lines become its termination message: the reason.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if role == "PSERVER":
        # Ready once it accepts connections: what `get workers` and the trainers wait for.
        container["readinessProbe"] = {"tcpSocket": {"port": port}, "periodSeconds": 5}
    return container


# One command per package kind; the package's path comes in $PACKAGE, never in the text.
_UNPACK = {
    "dir": f'cp -R "$PACKAGE/." {WORK_DIR}/',
    "tar": f'tar -xzf "$PACKAGE" -C {WORK_DIR}',
    "zip": f'unzip -q -o "$PACKAGE" -d {WORK_DIR}',
}


def _unpack_container(plan: JobPlan, role: str) -> dict[str, Any]:
    """Copies or unpacks the package into the work directory, makes the output
    directory, and writes the worker's `trainer_id` and `trainer_count` there (over any
    the package has: it may not point them elsewhere)."""
    launch = plan.launch
    script = "\n".join(
        [
            "set -eu",
            _UNPACK[launch.package_kind],
            'mkdir -p "$OUTPUT"',
            f"rm -f {WORK_DIR}/trainer_id {WORK_DIR}/trainer_count",
            f"printf '%s\\n' \"$TRAINER_ID\" > {WORK_DIR}/trainer_id",
            f"printf '%s\\n' \"$TRAINERS\" > {WORK_DIR}/trainer_count",
        ]
    )
    env = [
        _index_env(role),
        {"name": "TRAINERS", "value": str(launch.spec.trainers)},
        {"name": "PACKAGE", "value": _literal(str(launch.package))},
        {"name": "OUTPUT", "value": _literal(str(launch.output))},
    ]
    return {
        "name": "unpack",
        "image": plan.settings.init_image,
        "imagePullPolicy": _pull_policy(plan, plan.settings.init_image),
        "command": ["/bin/sh", "-c", _literal(script)],
        "env": env,
        "resources": _resources(plan, role, gpus=False),
        "securityContext": _container_security(read_only_root=True),
        "volumeMounts": [{"name": WORK_VOLUME, "mountPath": WORK_DIR}, *_pfs_mounts(plan)],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def _wait_container(plan: JobPlan) -> dict[str, Any]:
    """Waits until every parameter server accepts connections (DESIGN §4: trainers start
    after them). No deadline: the backend fails a job whose servers cannot start."""
    script = "\n".join(
        [
            "set -eu",
            "IFS=,",
            "for endpoint in $PSERVERS; do",
            '  host="${endpoint%:*}"; port="${endpoint##*:}"',
            '  echo "waiting for $host:$port"',
            '  until nc -z -w 2 "$host" "$port"; do sleep 1; done',
            "done",
        ]
    )
    endpoints = ",".join(f"{host}:{port}" for host, port in _endpoints(plan)[0])
    return {
        "name": "wait-pservers",
        "image": plan.settings.init_image,
        "imagePullPolicy": _pull_policy(plan, plan.settings.init_image),
        "command": ["/bin/sh", "-c", _literal(script)],
        "env": [{"name": "PSERVERS", "value": endpoints}],
        "resources": _resources(plan, "TRAINER", gpus=False),
        "securityContext": _container_security(read_only_root=True),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


# --- Volumes ---------------------------------------------------------------------------


def _sdk_volume(plan: JobPlan) -> dict[str, Any]:
    """The SDK's files from the job's owner ConfigMap, each at its path, read-only to all."""
    return {
        "name": SDK_VOLUME,
        "configMap": {
            "name": names.owner_name(plan.launch.spec.name),
            "items": [{"key": key, "path": path} for key, path in SDK_KEYS.items()],
            "defaultMode": 0o444,
        },
    }


def _volume(plan: JobPlan) -> DatacenterVolume:
    return plan.settings.datacenters[plan.launch.datacenter]


def _pfs_volumes(plan: JobPlan) -> list[dict[str, Any]]:
    """The pod's PFS volumes: with kind cephfs the user's two claims (home read-write,
    public read-only), else the datacenter's whole root once (mounted by subPath)."""
    volume, dc, user = _volume(plan), plan.launch.datacenter, plan.launch.job.owner
    if volume.kind != "cephfs":
        return [{"name": PFS_VOLUME, **volume_source(volume)}]
    return [
        {
            "name": f"{PFS_VOLUME}-{area}",
            "persistentVolumeClaim": {"claimName": names.claim_name(dc, user, area)}
            | ({"readOnly": True} if area == "public" else {}),
        }
        for area in names.PFS_AREAS
    ]


def volume_source(volume: DatacenterVolume) -> dict[str, Any]:
    """A pvc or hostpath datacenter's PFS root as a pod volume's source (the chart mounts
    pfs's the same). A cephfs one has no in-line source: it comes through claims."""
    if volume.kind == "pvc":
        return {"persistentVolumeClaim": {"claimName": volume.claim_name}}
    if volume.kind == "hostpath":
        # Directory: a node without the PFS mounted fails the pod, never gets an empty one.
        return {"hostPath": {"path": volume.host_path, "type": "Directory"}}
    raise ValueError("a cephfs volume is mounted through its PersistentVolumeClaims (user_volumes)")


def _pfs_mounts(plan: JobPlan) -> list[dict[str, Any]]:
    """The user's home read-write and the public area read-only: the rest of the PFS
    (other users' homes) is never in the container. With kind cephfs each is a volume of
    its own (and the node mounts no more than that); else subPaths of the root."""
    dc, user = plan.launch.datacenter, plan.launch.job.owner
    home, public = f"/pfs/{dc}/home/{user}", f"/pfs/{dc}/public"
    if _volume(plan).kind == "cephfs":
        return [
            {"name": f"{PFS_VOLUME}-home", "mountPath": home},
            {"name": f"{PFS_VOLUME}-public", "mountPath": public, "readOnly": True},
        ]
    return [
        {"name": PFS_VOLUME, "mountPath": home, "subPath": f"home/{user}"},
        {"name": PFS_VOLUME, "mountPath": public, "subPath": "public", "readOnly": True},
    ]


# ceph-csi's driver, and the size a static volume and its claim state: ceph-csi enforces
# none for a static volume (the pfs service enforces each user's storage quota), but both
# must state one, and the claim's must not exceed the volume's.
CEPHFS_DRIVER = "cephfs.csi.ceph.com"
STATIC_VOLUME_SIZE = "1Ti"


def user_volumes(user: str, settings: KubernetesSection) -> list[dict[str, Any]]:
    """For each cephfs datacenter, `user`'s static PersistentVolumes (cluster-wide) and
    their claims in the user's namespace, volumes first: one over the user's home
    (read-write) and one over public (read-only), rather than the PFS root per user, so a
    node mounts only what the pod may see. Each volume is bound to its claim in advance
    (claimRef) and kept when the claim goes (Retain): ceph-csi never deletes a static
    volume's data, and the service deletes only the volume object (forget_user)."""
    namespace = namespace_of(user, settings)
    labels = names.managed_labels(settings.release) | {names.LABEL_USER: names.user_label(user)}
    annotations = {names.ANNOTATION_USER: user}
    volumes: list[dict[str, Any]] = []
    claims: list[dict[str, Any]] = []
    for dc, volume in settings.datacenters.items():
        if volume.kind != "cephfs":
            continue
        root = volume.root_path.rstrip("/")
        secret_namespace, _, secret_name = str(volume.node_stage_secret).partition("/")
        for area in names.PFS_AREAS:
            read_only = area == "public"
            pv, claim = names.volume_name(settings.release, dc, user, area), names.claim_name(dc, user, area)
            modes = ["ReadOnlyMany"] if read_only else ["ReadWriteMany"]
            volumes.append(
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolume",
                    "metadata": _metadata(pv, None, labels, annotations),
                    "spec": {
                        "accessModes": modes,
                        "capacity": {"storage": STATIC_VOLUME_SIZE},
                        "persistentVolumeReclaimPolicy": "Retain",
                        "storageClassName": "",
                        "volumeMode": "Filesystem",
                        "claimRef": {
                            "apiVersion": "v1",
                            "kind": "PersistentVolumeClaim",
                            "namespace": namespace,
                            "name": claim,
                        },
                        "csi": {
                            "driver": CEPHFS_DRIVER,
                            "volumeHandle": pv,
                            "readOnly": read_only,
                            "nodeStageSecretRef": {"name": secret_name, "namespace": secret_namespace},
                            "volumeAttributes": {
                                "clusterID": str(volume.cluster_id),
                                "fsName": str(volume.fs_name),
                                "staticVolume": "true",
                                "rootPath": f"{root}/{area}/{user}" if area == "home" else f"{root}/{area}",
                            },
                        },
                    },
                }
            )
            claims.append(
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": _metadata(claim, namespace, labels, annotations),
                    "spec": {
                        "accessModes": modes,
                        "resources": {"requests": {"storage": STATIC_VOLUME_SIZE}},
                        "storageClassName": "",
                        "volumeMode": "Filesystem",
                        "volumeName": pv,
                    },
                }
            )
    return volumes + claims


# --- The runtime contract --------------------------------------------------------------


def _literal(text: str) -> str:
    """`text` as the kubelet must leave it: it expands `$(VAR)` in env values, command
    and args, and turns `$$` into `$`."""
    return text.replace("$", "$$")


def _domain(settings: KubernetesSection) -> str:
    return f"svc.{settings.cluster_domain}" if settings.cluster_domain else "svc"


def _host(plan: JobPlan, service: str, index: str) -> str:
    """The DNS name of a pod of a StatefulSet or Indexed Job named `service`, whose
    headless Service has the same name: `<service>-<index>.<service>.<ns>.svc...`."""
    return f"{service}-{index}.{service}.{plan.namespace}.{_domain(plan.settings)}"


def _endpoints(plan: JobPlan) -> tuple[list[tuple[str, int]], list[tuple[str, int]], tuple[str, int]]:
    spec, settings = plan.launch.spec, plan.settings
    pservers = [
        (_host(plan, names.pserver_name(spec.name), str(i)), settings.pserver_port)
        for i in range(spec.pservers)
    ]
    trainers = [
        (_host(plan, names.trainer_name(spec.name), str(i)), settings.trainer_port)
        for i in range(spec.trainers)
    ]
    master = (_host(plan, names.trainer_name(spec.name), "0"), settings.master_port)
    return pservers, trainers, master


def _index_env(role: str) -> dict[str, Any]:
    return {
        "name": "TRAINER_ID",
        "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": _INDEX_FIELD[role]}},
    }


def _contract_env(plan: JobPlan, role: str) -> list[dict[str, Any]]:
    """The runtime contract as a container's env: TRAINER_ID from the downward API
    first, then everything else, whose per-pod parts refer to it as $(TRAINER_ID)."""
    launch, spec = plan.launch, plan.launch.spec
    pservers, trainers, master = _endpoints(plan)
    user_env = {key: _literal(value) for key, value in spec.env.items()}
    contract = JobContract(
        job_name=spec.name,
        user=_literal(launch.job.owner),
        datacenter=launch.datacenter,
        pfs_home=_literal(launch.pfs_home),
        output=_literal(str(launch.output)),
        entry=_literal(spec.entry),
        package_dir=WORK_DIR,
        namespace=plan.namespace,
        passes=spec.passes,
        use_gpu=spec.gpu > 0,
        devices_per_trainer=max(spec.gpu, 1),
        pservers=pservers,
        trainers=trainers,
        master=master,
        socket_ifname=POD_INTERFACE,
        user_env=user_env,
        input=None if launch.input is None else _literal(str(launch.input)),
    )
    service = names.trainer_name(spec.name) if role == "TRAINER" else names.pserver_name(spec.name)
    own_port = plan.settings.trainer_port if role == "TRAINER" else plan.settings.pserver_port
    values = contract_env(
        contract,
        role=role,
        index="$(TRAINER_ID)",
        host=_host(plan, service, "$(TRAINER_ID)"),
        port=own_port,
        # One trainer per pod: it is alone on its machine, as far as it can see.
        local_rank="0",
        local_world_size=1,
        # A GPU trainer's devices are the device plugin's to give (it sets
        # NVIDIA_VISIBLE_DEVICES); every other worker is told it has none, so that an
        # image whose runtime defaults to all GPUs shows it none.
        devices=None if role == "TRAINER" and spec.gpu > 0 else (),
    )
    env = [_index_env(role)]
    env += [{"name": key, "value": value} for key, value in values.items() if key != "TRAINER_ID"]
    return env


def _cpu(text: str) -> str:
    return format_cpu_milli(parse_cpu_milli(text))


def _memory(text: str) -> str:
    return format_bytes(parse_bytes(text))


# --- A job's viewer --------------------------------------------------------------------

# The launcher the local backend runs too (services/jobs/local/viewer_serve.py), given to
# the viewer's pod through its ConfigMap: the image needs only Python and the packages.
VIEWER_SERVE = Path(__file__).resolve().parent.parent / "local" / "viewer_serve.py"
VIEWER_SERVE_KEY = "viewer_serve.py"
VIEWER_DIR = "/viewer"
# Each viewer's usual port (TensorBoard's 6006, VisualDL's 8040).
VIEWER_PORTS = {"tensorboard": 6006, "visualdl": 8040}
# What a viewer's pod asks for and is held to (requests equal limits, as a job's workers:
# the namespace's quota counts them): reading event files and drawing a few thousand
# points, not training.
VIEWER_RESOURCES = {"cpu": "1", "memory": "1Gi", DISK_RESOURCE: "1Gi"}
VIEWER_TMP = "256Mi"


@functools.cache
def viewer_serve_source() -> str:
    return VIEWER_SERVE.read_text(encoding="utf-8")


@dataclass(frozen=True)
class ViewerPlan:
    """One job's viewer of `kind` in `namespace`: `output` (the job's output directory, a
    PFS path in the owner's home) served under the URL path `prefix`, by `image`.
    `jobs_namespace` is the jobs service's own (None: any), whose pods alone may connect.
    `owner_uid`: the viewer's ConfigMap's, once made (see JobPlan)."""

    job_name: str
    job_id: str
    owner: str
    datacenter: str
    kind: str
    output: str
    prefix: str
    image: str
    settings: KubernetesSection
    namespace: str
    jobs_namespace: str | None = None
    owner_uid: str = "<owner-uid>"

    @property
    def name(self) -> str:
        return names.viewer_name(self.job_name, self.kind)

    @property
    def port(self) -> int:
        return VIEWER_PORTS[self.kind]


def _viewer_labels(plan: ViewerPlan) -> dict[str, str]:
    return names.managed_labels(plan.settings.release) | {
        names.LABEL_USER: names.user_label(plan.owner),
        names.LABEL_JOB: plan.job_name,
        names.LABEL_VIEWER_OF: plan.job_id,
        names.LABEL_ROLE: names.ROLE_VIEWER,
        names.LABEL_VIEWER: plan.kind,
    }


def _viewer_selector(plan: ViewerPlan) -> dict[str, str]:
    return {names.LABEL_VIEWER_OF: plan.job_id, names.LABEL_VIEWER: plan.kind}


def _viewer_metadata(plan: ViewerPlan, *, owned: bool = True) -> dict[str, Any]:
    meta = _metadata(plan.name, plan.namespace, _viewer_labels(plan), {names.ANNOTATION_USER: plan.owner})
    if owned:
        meta["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "name": plan.name,
                "uid": plan.owner_uid,
                "controller": False,
                "blockOwnerDeletion": True,
            }
        ]
    return meta


def viewer_owner(plan: ViewerPlan) -> dict[str, Any]:
    """The viewer's ConfigMap: the launcher's source, and the owner of the rest (deleting
    it removes them). Not the job's owner: a finished job's objects are deleted, and its
    viewer is wanted most then."""
    if not _beneath(plan.output, f"/pfs/{plan.datacenter}/home/{plan.owner}"):
        raise ValueError(f"the output {plan.output} is not in {plan.owner}'s home")
    if plan.datacenter not in plan.settings.datacenters:
        raise ValueError(f"no PFS volume is configured for datacenter {plan.datacenter!r}")
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _viewer_metadata(plan, owned=False),
        "data": {VIEWER_SERVE_KEY: viewer_serve_source()},
    }


def viewer_objects(plan: ViewerPlan) -> list[dict[str, Any]]:
    """The viewer's Pod, Service and NetworkPolicy, owned by `viewer_owner(plan)`.

    A bare Pod rather than a Deployment of one: the jobs service starts it on demand,
    reaches it by its address once Ready and deletes it when idle; a Deployment's
    replacement pod would come at another address the service does not follow, and it
    would need rights over Deployments and ReplicaSets. A pod that ends is started again
    on the next request (viewers.py). It sees the owner's home read-only, at the path the
    job pods see it, and serves the job's output directory from there."""
    settings, dc, user = plan.settings, plan.datacenter, plan.owner
    home = f"/pfs/{dc}/home/{user}"
    volume = settings.datacenters[dc]
    if volume.kind == "cephfs":
        pfs = {
            "name": f"{PFS_VOLUME}-home",
            "persistentVolumeClaim": {"claimName": names.claim_name(dc, user, "home"), "readOnly": True},
        }
        mount = {"name": f"{PFS_VOLUME}-home", "mountPath": home, "readOnly": True}
    else:
        pfs = {"name": PFS_VOLUME, **volume_source(volume)}
        mount = {"name": PFS_VOLUME, "mountPath": home, "subPath": f"home/{user}", "readOnly": True}
    container = {
        "name": plan.kind,
        "image": plan.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": [
            "python",
            "-I",
            f"{VIEWER_DIR}/{VIEWER_SERVE_KEY}",
            "--port",
            str(plan.port),
            plan.kind,
            plan.output,
            plan.prefix,
        ],
        # Its own, nothing of the service's; TensorBoard and VisualDL write only below HOME.
        "env": [{"name": "HOME", "value": "/tmp"}, {"name": "LANG", "value": "C.UTF-8"}],  # noqa: S108
        "ports": [{"name": "http", "containerPort": plan.port, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": plan.port}, "periodSeconds": 2},
        "resources": {"requests": dict(VIEWER_RESOURCES), "limits": dict(VIEWER_RESOURCES)},
        "securityContext": _container_security(read_only_root=True),
        "volumeMounts": [
            mount,
            {"name": "launcher", "mountPath": VIEWER_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _viewer_metadata(plan),
        "spec": {
            "restartPolicy": "Always",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": settings.run_as_user,
                "runAsGroup": settings.run_as_group,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [container],
            "volumes": [
                pfs,
                {
                    "name": "launcher",
                    "configMap": {
                        "name": plan.name,
                        "items": [{"key": VIEWER_SERVE_KEY, "path": VIEWER_SERVE_KEY}],
                        "defaultMode": 0o444,
                    },
                },
                {"name": "tmp", "emptyDir": {"sizeLimit": VIEWER_TMP}},
            ],
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _viewer_metadata(plan),
        "spec": {
            "selector": _viewer_selector(plan),
            "ports": [{"name": "http", "port": plan.port, "targetPort": plan.port, "protocol": "TCP"}],
        },
    }
    source: dict[str, Any] = {"podSelector": {"matchLabels": {"app.kubernetes.io/component": "jobs"}}}
    source["namespaceSelector"] = (
        {"matchLabels": {"kubernetes.io/metadata.name": plan.jobs_namespace}} if plan.jobs_namespace else {}
    )
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _viewer_metadata(plan),
        # The namespace's deny-all still holds every other way: the viewer reaches nothing
        # (its egress stays denied), and only the jobs service reaches its port.
        "spec": {
            "podSelector": {"matchLabels": _viewer_selector(plan)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [source], "ports": [{"protocol": "TCP", "port": plan.port}]}],
        },
    }
    return [pod, service, policy]
