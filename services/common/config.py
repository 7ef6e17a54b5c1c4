"""Server configuration: one YAML file, a section per service, environment overrides, validated once."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .quantity import QuantityError, parse_bytes, parse_cpu_milli

ENV_PREFIX = "PADDLECLOUD_"
DEFAULT_DATA_DIR = Path("~/.paddlecloud")


class ConfigError(Exception):
    """The configuration cannot be used; the message names the offending key."""


def _section_text(value: Any) -> Any:
    """A nested section given as one environment variable: its YAML (or JSON) text."""
    if isinstance(value, str):
        try:
            return yaml.safe_load(value) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"not YAML: {exc}") from None
    return value


def _byte_size(value: Any) -> Any:
    """A size in bytes given as a quantity (`1Gi`) or a number."""
    if isinstance(value, str):
        try:
            return parse_bytes(value)
        except QuantityError as exc:
            raise ValueError(str(exc)) from None
    return value


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ServiceSection(_Section):
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)
    # Largest JSON body a handler parses; streamed bodies enforce their own limits.
    max_json_body: int = Field(1024 * 1024, gt=0)
    # Slow and idle clients (docs/configuration.md). A connection has header_timeout
    # seconds, from its start or from the end of its previous answer, to send a whole
    # request line and headers, or it is closed: idle keep-alive connections included.
    # A JSON body must arrive whole within body_timeout seconds of its handler asking
    # for it (408). Streamed bodies (tus PATCH: pfs.upload_read_timeout) bound silences.
    header_timeout: float = Field(60.0, gt=0, le=3600)
    body_timeout: float = Field(60.0, gt=0, le=3600)
    # The figures /metrics counts when scraped (jobs by state from the store, bytes stored
    # per datacenter from the homes' usage) are counted at most once per this many
    # seconds; scrapes in between answer the last count (docs/metrics.md, section 5).
    metrics_cache_seconds: float = Field(15.0, ge=0, le=3600)


# The largest quota a limit may be, per resource (an admin's PUT or the default for new
# users): far past any one platform, and small enough that every sum of them stays exact
# in the store's 64-bit integers. A larger value is a typo or a probe (10^30 GPUs).
MAX_QUOTA_CPU_MILLI = 10**6 * 1000  # a million CPUs
MAX_QUOTA_GPU = 10**6
MAX_QUOTA_BYTES = 2**60  # 1Ei, of memory or storage
MAX_QUOTA_JOBS = 10**6


class DefaultQuota(_Section):
    """The quota a user gets when an admin creates them (`paddlecloud users create`); a
    limit left unset is unlimited. Changing it changes no existing user's quota."""

    cpu: str | None = None  # a quantity: 4, 500m
    gpu: int | None = Field(None, ge=0, le=MAX_QUOTA_GPU)
    memory: str | None = None  # a quantity: 16Gi
    jobs: int | None = Field(None, ge=0, le=MAX_QUOTA_JOBS)  # active at once
    storage: str | None = None  # a quantity: 100Gi
    disk: str | None = None  # a quantity: 100Gi, the scratch space of the user's workers together

    @field_validator("cpu", "memory", "storage", "disk", mode="before")
    @classmethod
    def _quantity(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ValueError("expected a quantity such as 4, 500m or 16Gi")
        cpu = info.field_name == "cpu"
        try:
            amount = parse_cpu_milli(value) if cpu else parse_bytes(value)
        except QuantityError as exc:
            raise ValueError(str(exc)) from None
        if amount > (MAX_QUOTA_CPU_MILLI if cpu else MAX_QUOTA_BYTES):
            most = "a million CPUs" if cpu else "1Ei"
            raise ValueError(f"{value!r} is more than a quota may be (at most {most})")
        return str(value)

    @field_validator("gpu", "jobs", mode="before")
    @classmethod
    def _count(cls, value: Any) -> Any:
        if isinstance(value, bool):  # YAML's `yes` or `true` is no number of GPUs or jobs
            raise ValueError(f"expected a whole number, not {value}")
        return value


class GatewaySection(ServiceSection):
    port: int = Field(8080, ge=0, le=65535)
    jobs_url: str = "http://127.0.0.1:8081"
    pfs_url: str = "http://127.0.0.1:8082"
    builder_url: str = "http://127.0.0.1:8083"
    token_ttl_seconds: int = Field(7 * 24 * 3600, gt=0)
    # Per-hop timeouts for proxied calls. The read timeout bounds the silence between
    # two chunks, not the whole transfer, so multi-GB uploads and `logs -f` survive.
    connect_timeout: float = Field(2.0, gt=0)
    read_timeout: float = Field(300.0, gt=0)
    # Pooled connections to each service: as many as the clients it may serve at once
    # (the services' listen backlog is 1024), so a burst waits in no pool.
    pool_size: int = Field(1024, gt=0)
    # Logins (docs/security.md): after login_failures_per_user failed logins for one user
    # name, or login_failures_per_address from one client address, within
    # login_window_seconds, logins for it are refused with 429 until the oldest failure
    # leaves the window (0 turns a limit off). At most login_max_concurrent_hashes
    # password hashes (argon2, 64 MiB each) run at once; the rest wait their turn.
    login_failures_per_user: int = Field(10, ge=0)
    login_failures_per_address: int = Field(100, ge=0)
    login_window_seconds: float = Field(300.0, gt=0, le=86400)
    login_max_concurrent_hashes: int = Field(4, ge=1, le=64)
    admin_username: str = "admin"
    admin_password: SecretStr | None = Field(None, repr=False)
    admin_password_file: Path | None = None
    # What `users create` gives a new user (not the bootstrapped admin); unset: unlimited.
    # PADDLECLOUD_GATEWAY_DEFAULT_QUOTA carries the whole section as YAML (or JSON).
    default_quota: DefaultQuota = DefaultQuota()

    _default_quota_text = field_validator("default_quota", mode="before")(_section_text)


# The in-tree `cephfs:` volume's settings: Kubernetes 1.31 removed that driver from the
# kubelet, so a config that still gives them is refused at start, naming the CSI way.
_IN_TREE_CEPHFS = ("monitors", "user", "secret_name", "path")
_CEPHFS_CSI = (
    "kind cephfs now means the ceph-csi driver (cephfs.csi.ceph.com); the in-tree cephfs volume "
    "was removed in Kubernetes 1.31: give cluster_id, fs_name, root_path and node_stage_secret "
    "(<namespace>/<name> of the Secret with userID and userKey) instead of {keys} "
    '(docs/kubernetes.md, "CephFS through ceph-csi")'
)


class DatacenterVolume(_Section):
    """Where a datacenter's PFS root (`/pfs/<dc>`) comes from in job pods. Pods mount
    `home/<user>` and `public` of it, never the whole root."""

    kind: Literal["cephfs", "pvc", "hostpath"]
    # cephfs (ceph-csi, cephfs.csi.ceph.com): the service makes, per user, a static
    # PersistentVolume over <root_path>/home/<user> (read-write) and one over
    # <root_path>/public (read-only), each with its claim in the user's namespace. The
    # cluster's fsid as ceph-csi's config names it (its clusterID), the file system, the
    # PFS root's path in it, and "<namespace>/<name>" of the Secret holding the CephFS
    # user's userID and userKey that ceph-csi mounts with (its nodeStageSecretRef).
    cluster_id: str | None = Field(None, min_length=1, max_length=253, pattern=r"^[!-~]+$")
    fs_name: str | None = Field(None, min_length=1, max_length=253, pattern=r"^[!-~]+$")
    root_path: str = Field("/", pattern=r"^/[!-~]*$")
    node_stage_secret: str | None = Field(
        None, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?$", max_length=317
    )
    # static: the volumes above (pfs serves the same files). dynamic (fresh subvolumes
    # from a StorageClass) is refused: pfs could not see what jobs write there.
    provisioning: Literal["static", "dynamic"] = "static"
    # pvc: a claim in each job namespace (ReadWriteMany) whose root is the PFS root.
    claim_name: str | None = None
    # hostpath: the PFS root as mounted on every node (HDFS-FUSE or NFS mounts).
    host_path: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _not_in_tree(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("kind") == "cephfs":
            old = [key for key in _IN_TREE_CEPHFS if key in data]
            if old:
                raise ValueError(_CEPHFS_CSI.format(keys=", ".join(old)))
        return data

    @model_validator(mode="after")
    def _complete(self) -> DatacenterVolume:
        missing = {
            "cephfs": [k for k in ("cluster_id", "fs_name", "node_stage_secret") if not getattr(self, k)],
            "pvc": [] if self.claim_name else ["claim_name"],
            "hostpath": [] if self.host_path else ["host_path"],
        }[self.kind]
        if missing:
            raise ValueError(f"a {self.kind} volume needs {' and '.join(missing)}")
        if self.kind == "cephfs" and self.provisioning == "dynamic":
            raise ValueError(
                "cephfs provisioning dynamic is not supported: ceph-csi would make a fresh subvolume "
                "per claim, which the pfs service cannot see, so uploads and job files would differ; "
                "use provisioning static (the default) over the PFS root pfs serves"
            )
        if self.kind == "cephfs" and ".." in self.root_path.split("/"):
            raise ValueError(f"root_path may not contain '..': {self.root_path!r}")
        if self.kind == "hostpath" and not str(self.host_path).startswith("/"):
            raise ValueError(f"host_path must be absolute, not {self.host_path!r}")
        return self


class LeaderElection(_Section):
    """One acting jobs service among replicas: a coordination.k8s.io/v1 Lease
    (docs/kubernetes.md, "One leader"). The timings are client-go's, and mean the same."""

    # Off by default outside the chart (one process, nothing to elect); the chart turns it on.
    enabled: bool = False
    # The Lease's namespace: the release's (the chart sets it). Unset: the namespace of
    # the pod the service runs in (its service account's), needed when it runs outside one.
    namespace: str | None = Field(None, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    lease_name: str = Field(
        "paddlecloud-jobs-leader", pattern=r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$", max_length=253
    )
    # How long a follower waits, after it last saw the Lease change, before taking it.
    lease_seconds: int = Field(15, ge=1)
    # How long the leader keeps trying to renew before it gives up and exits.
    renew_seconds: float = Field(10.0, gt=0)
    # How often the leader renews, and a follower tries to take the Lease.
    retry_seconds: float = Field(2.0, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> LeaderElection:
        # client-go's checks: a leader gives up before a follower may take over, and
        # gets more than one try (with jitter) before it does.
        if not self.renew_seconds < self.lease_seconds:
            raise ValueError(
                f"renew_seconds ({self.renew_seconds:g}) must be less than "
                f"lease_seconds ({self.lease_seconds})"
            )
        if not self.retry_seconds * 1.2 < self.renew_seconds:
            raise ValueError(
                f"retry_seconds ({self.retry_seconds:g}) must be less than renew_seconds / 1.2 "
                f"({self.renew_seconds / 1.2:g})"
            )
        return self


def _kubeconfig_path(cls: Any, value: str | None) -> str | None:
    """A kubeconfig setting: unset, "in-cluster", or a file that exists."""
    if value is None or value == "in-cluster":
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(f"no kubeconfig file at {value} (give a file, or in-cluster)")
    return str(path)


# A label's name (an optional DNS-subdomain prefix and a name) and value, as the API
# server checks them: a policy with a bad one would be refused in every namespace.
_LABEL_NAME = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"


def _port_list(value: tuple[int, ...]) -> tuple[int, ...]:
    bad = [port for port in value if not 1 <= port <= 65535]
    if bad:
        raise ValueError(f"ports must be from 1 to 65535, not {bad}")
    return value


class DnsSelector(_Section):
    """The cluster's DNS pods, which job pods may reach on any port (or `ports`): the
    namespace they run in and their own labels, by label. The defaults are kube-dns and
    CoreDNS as kubeadm, kind, GKE, EKS and AKS label them; OpenShift's are in
    docs/kubernetes.md. A port list is for clusters whose DNS pods serve more than DNS."""

    namespace_labels: dict[str, str] = {"kubernetes.io/metadata.name": "kube-system"}
    pod_labels: dict[str, str] = {"k8s-app": "kube-dns"}
    ports: tuple[int, ...] = ()

    @field_validator("namespace_labels", "pod_labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        if not value:
            # An empty selector selects every namespace (or pod): DNS would be everything.
            raise ValueError("give at least one label; an empty selector would allow every pod")
        for key, text in value.items():
            if len(key.rpartition("/")[0]) > 253 or not re.match(_LABEL_NAME, key):
                raise ValueError(f"{key!r} is not a label name such as k8s-app or example.com/name")
            if not re.match(_LABEL_VALUE, text):
                raise ValueError(f"{text!r} ({key}) is not a label value (63 letters, digits, -_. at most)")
        return value

    _ports = field_validator("ports")(_port_list)


class KubernetesSection(_Section):
    """The kubernetes jobs backend (docs/kubernetes.md)."""

    # "in-cluster" (the pod's service account) or the path of a kubeconfig file;
    # unset: in-cluster inside a pod, else $KUBECONFIG or ~/.kube/config.
    kubeconfig: str | None = None
    context: str | None = None
    # per-user: a namespace per user, made on first use (needs rights over namespaces);
    # shared: every job in `namespace`, which an operator made.
    namespace_mode: Literal["per-user", "shared"] = "per-user"
    namespace_prefix: str = Field("paddle-", pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?-?$", max_length=20)
    namespace: str = Field("paddlecloud-jobs", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    # Which installation this service is: every object it makes carries it as the label
    # paddlecloud.org/release (names.release_label: hashed when not a label value), and it
    # watches, adopts, sweeps and deletes only what carries its own. Two installations on
    # one cluster must differ; the chart sets "<release namespace>.<release name>".
    release: str = Field("paddlecloud", min_length=1, max_length=253, pattern=r"^[!-~]+$")
    # Per-user mode: the ClusterRole the service binds, in each namespace it makes, to its
    # own ServiceAccount (the chart installs it: every right it needs in a user's namespace).
    tenant_role: str = Field(
        "paddlecloud-jobs-tenant", pattern=r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$", max_length=253
    )
    # "<namespace>/<name>" of the service's own ServiceAccount, the subject of those
    # RoleBindings; unset: asked of the API server (a SelfSubjectReview of its credentials).
    service_account: str | None = Field(
        None, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?$", max_length=317
    )
    # The image a job runs when it names none and builds none; GPU jobs get gpu_image.
    default_image: str = "python:3.11-slim"
    gpu_image: str | None = None
    # The small image of the init containers (unpack the package, wait for pservers).
    init_image: str = "busybox:1.36"
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    # Each datacenter's PFS volume, by datacenter name.
    datacenters: dict[str, DatacenterVolume] = {}
    pserver_port: int = Field(7164, ge=1, le=65535)
    trainer_port: int = Field(7170, ge=1, le=65535)
    # Trainer 0's PyTorch/Kubeflow rendezvous (MASTER_PORT, PADDLE_MASTER): PyTorch's default.
    master_port: int = Field(29500, ge=1, le=65535)
    # Workers reach each other as <pod>.<service>.<namespace>.svc.<cluster_domain>; the full
    # name is what a pod's /etc/hosts holds for itself. "": the short .svc form, which the
    # pods' DNS search path completes.
    cluster_domain: str = Field(
        "cluster.local", pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$"
    )
    # Job pods run as this user and group (never root). PFS files are theirs: use the uid
    # and gid the pfs service writes as. fs_group is off by default: with it set, the
    # kubelet may chown a whole PFS volume on every mount.
    run_as_user: int = Field(1000, ge=1)
    run_as_group: int = Field(1000, ge=1)
    fs_group: int | None = Field(None, ge=1)
    # Job pods may reach their own job's pods, DNS and nothing else, unless listed here:
    # the storage their programs talk to themselves (object stores, HDFS, NFS servers; a
    # PFS volume is mounted by the node, which no NetworkPolicy restricts). No ports: all.
    storage_cidrs: tuple[str, ...] = ()
    storage_ports: tuple[int, ...] = ()
    # The cluster's DNS pods, by selector: job pods may reach them whatever port they
    # listen on behind the DNS Service (5353 on OpenShift).
    dns: DnsSelector = DnsSelector()
    # The largest container a user's namespace admits (its LimitRange), for pods that do
    # not come from a job spec as well as those that do; a container that asks for
    # nothing gets a job's default, 1 CPU, 1Gi of memory and 1Gi of disk
    # (ephemeral-storage: its writable layer, logs and emptyDir volumes).
    max_container_cpu: str = "256"
    max_container_memory: str = "2Ti"
    max_container_disk: str = "1Ti"
    # Every API call has this timeout; a watch asks the API server to end it after
    # watch_timeout_seconds, and the backend lists again after it.
    request_timeout_seconds: float = Field(10.0, gt=0)
    watch_timeout_seconds: int = Field(300, ge=1)
    # Reconnects back off from 0.2 s up to this, with jitter.
    max_backoff_seconds: float = Field(10.0, gt=0)
    # How often each user's ResourceQuota is brought to the quota an admin set.
    quota_sync_seconds: float = Field(30.0, gt=0)
    # A job whose image cannot be pulled for this long fails (it waits PENDING until then).
    image_pull_timeout_seconds: float = Field(300.0, gt=0)
    # A trainer pod evicted more often than this fails the job.
    max_evictions: int = Field(3, ge=0)
    # Largest part of one container's log kept after its pod goes (the end is kept).
    kept_log_bytes: int = Field(8 * 2**20, gt=0)
    # Which of several jobs service replicas acts on the cluster.
    leader_election: LeaderElection = LeaderElection()

    @model_validator(mode="after")
    def _distinct_ports(self) -> KubernetesSection:
        # Trainer 0 listens on both: its own endpoint and the rendezvous.
        if self.trainer_port == self.master_port:
            raise ValueError(f"trainer_port and master_port must differ (both are {self.master_port})")
        return self

    @model_validator(mode="after")
    def _cephfs_per_user(self) -> KubernetesSection:
        # A cephfs datacenter's volumes are PersistentVolumes (cluster-wide) that the
        # service makes per user; shared mode's rights are one namespace's Role.
        cephfs = sorted(dc for dc, volume in self.datacenters.items() if volume.kind == "cephfs")
        if cephfs and self.namespace_mode == "shared":
            raise ValueError(
                f"datacenter {cephfs[0]!r}: a cephfs volume needs namespace_mode per-user (the "
                "service makes each user's PersistentVolumes, which shared mode has no right to)"
            )
        return self

    @field_validator("storage_cidrs")
    @classmethod
    def _cidrs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for cidr in value:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(f"{cidr!r} is not a CIDR such as 10.0.0.0/16") from None
            if "/" not in cidr:
                raise ValueError(f"{cidr!r} is not a CIDR such as 10.0.0.0/16 (the /bits are missing)")
        return value

    _ports = field_validator("storage_ports")(_port_list)

    @field_validator("max_container_cpu", "max_container_memory", "max_container_disk")
    @classmethod
    def _max_quantity(cls, value: str, info: ValidationInfo) -> str:
        parse = parse_cpu_milli if info.field_name == "max_container_cpu" else parse_bytes
        try:
            amount = parse(value)
        except QuantityError as exc:
            raise ValueError(str(exc)) from None
        least = 1000 if info.field_name == "max_container_cpu" else 2**30
        if amount < least:
            raise ValueError(f"{value!r} is below a job's default container (1 CPU, 1Gi, 1Gi of disk)")
        return value

    _kubeconfig = field_validator("kubeconfig")(_kubeconfig_path)


class MetricsSection(_Section):
    """What the jobs service samples of running jobs (docs/metrics.md)."""

    # Seconds between two samples of each running worker's resource use (cgroups and
    # nvidia-smi on one machine, the metrics API on Kubernetes). Below 0.1 s a sample
    # costs more than it tells; above an hour a job's series says nothing.
    interval: float = Field(5.0, ge=0.1, le=3600)


class ViewersSection(_Section):
    """VisualDL and TensorBoard for each job (docs/metrics.md §4): which interpreters run
    them on one machine, which image on Kubernetes, and when an idle one is stopped."""

    # The Python interpreter (an absolute path) of an environment that has the viewer's
    # package, `tensorboard` or `visualdl`, kept apart from the platform's own (`make
    # viewers` makes both under ~/.cache/paddlecloud). None: that viewer is not offered.
    tensorboard: str | None = None
    visualdl: str | None = None
    # Kubernetes: the image of a viewer's pod; it must have `python` on its PATH with
    # both packages importable (tensorboard 2.21, visualdl 2.5); the launcher comes in a
    # ConfigMap. None: no viewer is offered on Kubernetes (the interpreters are not used there).
    image: str | None = None
    # A viewer nobody asked anything of for this long is stopped (started again on the
    # next request); how long a starting one may take to answer.
    idle_seconds: float = Field(600.0, gt=0)
    start_timeout_seconds: float = Field(60.0, gt=0)

    @field_validator("tensorboard", "visualdl")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not os.path.isabs(value):
            raise ValueError(f"{value!r} is not an absolute path to a Python interpreter")
        return value


class JobsSection(ServiceSection):
    port: int = Field(8081, ge=0, le=65535)
    backend: Literal["local", "kubernetes"] = "local"
    kubernetes: KubernetesSection = KubernetesSection()
    # Local backend: one directory per job (plan, state, events, logs, working dirs).
    work_dir: Path = DEFAULT_DATA_DIR / "jobs"
    # How often the service looks at an active job's state, and how long a killed
    # worker gets between SIGTERM and SIGKILL.
    poll_seconds: float = Field(0.1, gt=0)
    # How often a log follower looks for new lines: what a line waits, at most, between
    # being written and being sent (a few stat and read calls per follower each time).
    log_poll_seconds: float = Field(0.02, gt=0)
    grace_seconds: float = Field(10.0, ge=0)
    # Local jobs run sandboxed (services/common/sandbox.py: bubblewrap namespaces, an
    # unprivileged uid per user from sandbox_uid_base on): "auto" where bwrap exists,
    # "required" refuses to start without it, "off" runs jobs as the service's own user.
    sandbox: Literal["auto", "required", "off"] = "auto"
    sandbox_uid_base: int = Field(200_000, ge=1000)
    sandbox_uid_count: int = Field(100_000, gt=0)
    # Sandboxed local jobs get a network namespace each (services/common/netns.py):
    # "outbound" reaches other hosts through pasta, never the host's loopback; "none":
    # the job's own loopback only.
    network: Literal["none", "outbound"] = "outbound"
    # cpu, memory and pids limits per worker with cgroups (v2 or v1): "auto" where this
    # service may make groups, "required" refuses to start otherwise, "off": advisory.
    limits: Literal["auto", "required", "off"] = "auto"
    pids_max: int = Field(4096, gt=0)
    # The GPUs jobs may use (device ids as CUDA numbers them); unset: what
    # `nvidia-smi -L` lists. PADDLECLOUD_JOBS_GPUS takes a comma-separated list.
    gpus: tuple[str, ...] | None = None
    # Disk a local job takes on the platform's own disk (docs/security.md): an archive
    # package unpacks to at most package_max_bytes (refused before unpacking when its
    # headers declare more); a running job may add at most scratch_max_bytes to its
    # package and working directories (checked every few seconds: over it, the job
    # fails); its logs keep at most log_max_bytes, the newest, shared equally among its
    # workers. Quantities (`1Gi`) or bytes.
    package_max_bytes: int = Field(2**30, gt=0)
    scratch_max_bytes: int = Field(2**30, gt=0)
    log_max_bytes: int = Field(256 * 2**20, ge=2**20)
    viewers: ViewersSection = ViewersSection()

    metrics: MetricsSection = MetricsSection()

    # PADDLECLOUD_JOBS_KUBERNETES (and _METRICS, _VIEWERS) carries the whole section as YAML (or JSON).
    _kubernetes_text = field_validator("kubernetes", "metrics", "viewers", mode="before")(_section_text)

    _byte_sizes = field_validator("package_max_bytes", "scratch_max_bytes", "log_max_bytes", mode="before")(
        _byte_size
    )

    @field_validator("gpus", mode="before")
    @classmethod
    def _split_gpus(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        if isinstance(value, list):
            return tuple(str(v) for v in value)
        return value


class HdfsStorage(_Section):
    """A datacenter root in HDFS, reached over WebHDFS (docs/storage.md, HDFS)."""

    # The NameNode's HTTP address (WebHDFS at <url>/webhdfs/v1), e.g. http://nn.example:9870.
    namenode: str = Field(..., pattern=r"^https?://[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:[0-9]{1,5})?/?$")
    # The datacenter root in HDFS: home/<user>, public and .uploads live beneath it.
    root_path: str = Field("/paddlecloud", pattern=r"^/[!-~]*$")
    # The HDFS user the platform is (simple authentication: user.name=<user>).
    user: str = Field("paddlecloud", pattern=r"^[A-Za-z_][-A-Za-z0-9_.]{0,63}$")
    # Act as each user with doas=<user> (the NameNode must list `user` in its
    # hadoop.proxyuser.<user>.hosts/groups): HDFS's own permissions then hold per user.
    proxy_users: bool = False
    # Kerberos (SPNEGO) is not supported yet: a setting of true is refused at start.
    kerberos: bool = False
    # Space quotas count every replica: a quota of N bytes is set as N * replication.
    replication: int = Field(3, ge=1, le=512)
    timeout: float = Field(60.0, gt=0)

    @model_validator(mode="after")
    def _supported(self) -> HdfsStorage:
        if self.kerberos:
            raise ValueError(
                "hdfs kerberos is not supported yet (docs/storage.md, HDFS): use simple "
                "authentication behind a trusted network"
            )
        if ".." in self.root_path.split("/"):
            raise ValueError(f"root_path may not contain '..': {self.root_path!r}")
        return self


class PfsSection(ServiceSection):
    port: int = Field(8082, ge=0, le=65535)
    # Where other services (jobs, for storage usage) reach pfs; `paddlecloud server` sets it.
    url: str = "http://127.0.0.1:8082"
    root: Path = DEFAULT_DATA_DIR / "pfs"
    datacenter: str = "datacenter1"
    # tus uploads: the largest one (Tus-Max-Size), how long an unfinished one is kept after
    # its last write, and the longest silence tolerated within one PATCH body.
    max_upload_size: int = Field(2**40, gt=0)
    upload_expiry_seconds: int = Field(24 * 3600, gt=0)
    upload_read_timeout: float = Field(60.0, gt=0)
    # Where the datacenter's files live: on this host under `root` (local disk or a CephFS
    # mount; the default), or in HDFS (then `root` keeps only pfs's own state).
    hdfs: HdfsStorage | None = None

    # PADDLECLOUD_PFS_HDFS carries the whole mapping as YAML (or JSON).
    _hdfs_text = field_validator("hdfs", mode="before")(_section_text)


_HOST_PORT = r"^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:[0-9]{1,5})?$"
_REPOSITORY = r"^[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$"


# ghcr.io/osscontainertools/kaniko, the maintained fork of GoogleContainerTools/kaniko
# (archived June 2025): v1.28.2's multi-platform index, as published.
KANIKO_EXECUTOR_IMAGE = (
    "ghcr.io/osscontainertools/kaniko:v1.28.2"
    "@sha256:4ea0e7301e3f6806de15150e4982c73018351e28c1dca6947bd3b4afb5ae3c60"
)


class KanikoSection(_Section):
    """The kaniko builder backend (docs/builder.md): runtime images built by a Kaniko Job
    in `namespace` and pushed to `<registry>/<repository>:<cache key>`."""

    # The registry images are pushed to (host or host:port, as image names spell it).
    registry: str | None = Field(None, pattern=_HOST_PORT)
    # Each user's images land under <repository>/<user>, tagged with the cache key.
    repository: str = Field("paddlecloud/runtime", pattern=_REPOSITORY)
    # Removed: Kaniko's layer cache pushed from the executor, where user code runs, so it
    # would need the push credentials there. Refused when set (docs/builder.md).
    cache_repository: str | None = None
    # A docker config.json with the push credentials for `registry`: the operator's
    # kubernetes.io/dockerconfigjson Secret, mounted into the builder's pod. Read at start,
    # never logged. Unset: the registry takes pushes without credentials.
    auth_file: Path | None = None
    # Registries reached over plain http (a registry in the cluster or on loopback);
    # every other one over https with its certificate checked.
    insecure_registries: tuple[str, ...] = ()
    # The image a request is built on when it names none (the jobs service names the image
    # the job would run: jobs.kubernetes.default_image or gpu_image).
    base_image: str = "python:3.11-slim"
    # The maintained Kaniko fork, pinned by the digest of its published index
    # (docs/builder.md, "The executor image").
    executor_image: str = KANIKO_EXECUTOR_IMAGE
    # Pushes the executor's tarball with the push credentials: the platform image plus
    # crane (images/pusher/Dockerfile); it runs no user code.
    pusher_image: str = "paddlecloud/pusher:0.1.0"
    # Copies the build context into the executor's workspace.
    init_image: str = "busybox:1.36"
    # Build Jobs run here; an operator makes it (the builder gets a Role in it).
    namespace: str = Field("paddlecloud-builds", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    # The executor's requests and limits (the same: a build is not squeezed by its neighbours).
    cpu: str = "1"
    memory: str = "2Gi"
    ephemeral_storage: str = "10Gi"
    # Hosts pip may reach without a valid certificate (--trusted-host): an http wheelhouse.
    trusted_hosts: tuple[str, ...] = ()
    # How often the builder looks at a build pod that has not started yet.
    poll_seconds: float = Field(1.0, gt=0)
    # The builder's own credentials for the cluster: "in-cluster" or a kubeconfig file
    # (with `context`, else its current one). Unset: jobs.kubernetes's kubeconfig and
    # context. In the chart each service's pod has its own ServiceAccount either way; where
    # one machine runs both services (`paddlecloud server`), this keeps the builder to
    # its own Role rather than the jobs service's rights.
    kubeconfig: str | None = None
    context: str | None = None

    @field_validator("insecure_registries", "trusted_hosts", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("cpu", "memory", "ephemeral_storage")
    @classmethod
    def _quantity(cls, value: str, info: ValidationInfo) -> str:
        parse = parse_cpu_milli if info.field_name == "cpu" else parse_bytes
        try:
            if parse(value) <= 0:
                raise ValueError(f"{value!r} must be more than zero")
        except QuantityError as exc:
            raise ValueError(str(exc)) from None
        return value

    _kubeconfig = field_validator("kubeconfig")(_kubeconfig_path)

    @field_validator("cache_repository")
    @classmethod
    def _no_layer_cache(cls, value: str | None) -> str | None:
        if value is not None:
            raise ValueError(
                "Kaniko's layer cache is removed: it pushes from the executor, where user code "
                "runs and so could read the push credentials; remove cache_repository (each "
                "user's image per cache key is the cache)"
            )
        return value

    @field_validator("auth_file")
    @classmethod
    def _auth_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.expanduser().is_file():
            raise ValueError(f"no file at {value} (the push Secret's .dockerconfigjson, mounted)")
        return value


class BuilderSection(ServiceSection):
    port: int = Field(8083, ge=0, le=65535)
    # Where internal callers (the jobs service) reach the builder; `paddlecloud server`
    # sets it to the address it bound, as it sets gateway.builder_url.
    url: str = "http://127.0.0.1:8083"
    # local: a virtualenv per key on this machine; kaniko: an image per key, built on
    # Kubernetes (the `kaniko` section; the cluster is jobs.kubernetes's kubeconfig).
    backend: Literal["local", "kaniko"] = "local"
    kaniko: KanikoSection = KanikoSection()
    # Local backend: environments, build logs and in-progress builds live here.
    work_dir: Path = DEFAULT_DATA_DIR / "builder"
    # pip runs sandboxed like jobs (auto | required | off), as this unprivileged uid.
    sandbox: Literal["auto", "required", "off"] = "auto"
    sandbox_uid: int = Field(199_999, ge=1000)
    # Where pip looks for packages: an index, and/or wheel directories or pages
    # (comma-separated in PADDLECLOUD_BUILDER_FIND_LINKS); no_index builds offline.
    index_url: str | None = None
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    # Published environments are collected least recently used first once together
    # they take more than this (a quantity: 20Gi), sparing those an active job uses and
    # those handed out in the last min_idle_seconds (a job may be about to record it).
    cache_max_bytes: int = Field(20 * 2**30, gt=0)
    min_idle_seconds: float = Field(300.0, ge=0)
    max_concurrent_builds: int = Field(2, gt=0)
    build_timeout_seconds: float = Field(3600.0, gt=0)
    max_requirements_bytes: int = Field(64 * 1024, gt=0)
    # How often a log follower looks for new lines and the build's end.
    poll_seconds: float = Field(0.1, gt=0)

    @field_validator("find_links", mode="before")
    @classmethod
    def _split_find_links(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    # PADDLECLOUD_BUILDER_KANIKO carries the whole section as YAML (or JSON).
    _kaniko_text = field_validator("kaniko", mode="before")(_section_text)

    @model_validator(mode="after")
    def _kaniko_complete(self) -> BuilderSection:
        if self.backend != "kaniko":
            return self
        if self.kaniko.registry is None:
            raise ValueError("the kaniko backend needs kaniko.registry (where images are pushed)")
        # A Kaniko pod reaches packages over the network: a directory on this machine means nothing there.
        for where in (self.index_url, *self.find_links):
            if where is None:
                continue
            if not where.startswith(("https://", "http://")):
                raise ValueError(
                    f"{where!r}: the kaniko backend needs http(s) URLs for index_url and find_links"
                )
            if "@" in where.split("://", 1)[1].split("/", 1)[0]:
                raise ValueError(
                    f"index_url and find_links may not hold credentials: they are written into "
                    f"every image's history ({where.split('://', 1)[0]}://...@...)"
                )
        return self

    _cache_max_bytes = field_validator("cache_max_bytes", mode="before")(_byte_size)


class StoreSection(_Section):
    # sqlite:///absolute/path.db or mongodb://host:port/database
    url: SecretStr = Field(SecretStr(f"sqlite:///{DEFAULT_DATA_DIR}/paddlecloud.db"), repr=False)
    url_file: Path | None = None


class InternalSection(_Section):
    """The secret the gateway signs forwarded identities with; services verify it."""

    secret: SecretStr | None = Field(None, repr=False)
    secret_file: Path | None = None


class LogSection(_Section):
    format: Literal["auto", "json", "console"] = "auto"
    level: Literal["debug", "info", "warning", "error"] = "info"


class Config(_Section):
    gateway: GatewaySection = GatewaySection()
    jobs: JobsSection = JobsSection()
    pfs: PfsSection = PfsSection()
    builder: BuilderSection = BuilderSection()
    store: StoreSection = StoreSection()
    internal: InternalSection = InternalSection()
    log: LogSection = LogSection()

    @model_validator(mode="after")
    def _kubernetes_volumes(self) -> Config:
        volumes = self.jobs.kubernetes.datacenters
        if self.jobs.backend == "kubernetes" and self.pfs.datacenter not in volumes:
            raise ValueError(
                f"jobs.kubernetes.datacenters has no volume for datacenter {self.pfs.datacenter!r} "
                f"(pfs.datacenter); job pods would have no PFS"
            )
        return self

    @model_validator(mode="after")
    def _hdfs_on_nodes(self) -> Config:
        # pfs serves an HDFS datacenter over WebHDFS; job pods see the same files only
        # through each node's own HDFS mount (FUSE or an NFS gateway), by hostPath. A
        # cephfs or pvc volume would be other storage: uploads and job files would differ.
        dc = self.pfs.datacenter
        volume = self.jobs.kubernetes.datacenters.get(dc)
        if self.pfs.hdfs is not None and volume is not None and volume.kind != "hostpath":
            raise ValueError(
                f"pfs.hdfs: datacenter {dc!r} keeps its files in HDFS, which job pods see through "
                f"each node's HDFS mount: jobs.kubernetes.datacenters.{dc}.kind must be hostpath "
                f"(host_path: where the nodes mount the HDFS root), not {volume.kind} "
                '(docs/storage.md, "What jobs see")'
            )
        return self

    def internal_secret(self) -> bytes:
        """The internal secret's bytes, from the value or the file; refuses to run without one."""
        return _secret_bytes(self.internal.secret, self.internal.secret_file, "internal.secret")

    def store_url(self) -> str:
        return _secret_bytes(self.store.url, self.store.url_file, "store.url").decode()

    def admin_password(self) -> str | None:
        gw = self.gateway
        if gw.admin_password is None and gw.admin_password_file is None:
            return None
        raw = _secret_bytes(gw.admin_password, gw.admin_password_file, "gateway.admin_password")
        return bytes(raw).decode()


def _secret_bytes(value: SecretStr | None, file: Path | None, name: str) -> bytes:
    if file is not None:
        try:
            data = file.expanduser().read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"{name}_file: cannot read {file}: {exc.strerror}") from exc
        if not data:
            raise ConfigError(f"{name}_file: {file} is empty")
        return data
    if value is None or not value.get_secret_value():
        raise ConfigError(f"{name} is not set (set it or {name}_file)")
    return value.get_secret_value().encode()


def apply_env(raw: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """Return `raw` with every `PADDLECLOUD_<SECTION>_<KEY>` variable of `env` applied."""
    sections = set(Config.model_fields)
    for name in sections:
        if not isinstance(raw.get(name) or {}, dict):
            raise ConfigError(f"config {name}: a section is a mapping of settings, not {raw[name]!r}")
    merged = {name: dict(raw.get(name) or {}) for name in sections}
    merged.update({k: v for k, v in raw.items() if k not in sections})
    for var, value in env.items():
        if not var.startswith(ENV_PREFIX):
            continue
        rest = var[len(ENV_PREFIX) :].lower()
        section, _, key = rest.partition("_")
        if section not in sections:
            continue  # other PADDLECLOUD_* variables (client, tests) are not server config
        section_model = Config.model_fields[section].annotation
        assert isinstance(section_model, type) and issubclass(section_model, BaseModel)
        if key not in section_model.model_fields:
            raise ConfigError(f"{var}: {section} has no key {key!r}")
        merged[section][key] = value
    return merged


def load_config(path: Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Load `path` (YAML; none means defaults), apply environment overrides and validate."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).expanduser().read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
        raw = loaded
    return validate_config(raw, os.environ if env is None else env)


def validate_config(raw: dict[str, Any], env: Mapping[str, str]) -> Config:
    """`raw` (a config file's sections) with `env`'s overrides applied, validated; ConfigError
    naming the first bad or unknown setting."""
    merged = apply_env(raw, env)
    try:
        return Config.model_validate(merged)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        raise ConfigError(f"config {where}: {message}" if where else f"config: {message}") from exc
