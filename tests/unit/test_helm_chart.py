"""charts/paddlecloud through the real Helm 4 engine (installed by `make install-dev`).

Lint (strict) and render with every values set under charts/paddlecloud/ci/; each rendered
object validates strict against the Kubernetes version the code pins; bad values are
refused by the schema; the ConfigMap is loaded by the services' own `load_config`; the
rendered Roles equal the rights services/jobs/kube/rbac.py declares. `helm install` and
`helm upgrade` against the real control plane are tests/e2e/test_helm_real.py.
"""

from __future__ import annotations

import base64
import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from paddlecloud.common.config import BuilderSection, Config, KubernetesSection, load_config
from paddlecloud.jobs.kube import rbac
from paddlecloud.jobs.kube.manifests import KUBERNETES_VERSION, user_volumes, volume_source
from paddlecloud.jobs.kube.names import release_label

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "paddlecloud"
HELM = Path(sys.executable).parent / "helm"
VALUES_SETS = sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))
SETS = [None, *VALUES_SETS]  # None: the chart's defaults
SERVICES = ("gateway", "jobs", "pfs", "builder")
RELEASE = "pc"
NAMESPACE = "paddle"


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    if not HELM.is_file():
        pytest.fail(f"no Helm at {HELM}: run make install-dev (scripts/install_helm.py)")
    result = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


def values_args(values: str | None, sets: tuple[str, ...] = ()) -> list[str]:
    args = ["-f", str(CHART / "ci" / values)] if values else []
    for s in sets:
        args += ["--set", s]
    return args


@functools.cache
def render(values: str | None, *sets: str) -> tuple[dict[str, Any], ...]:
    """Every object `helm template` renders for the values set (and --set overrides)."""
    out = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, *values_args(values, sets)).stdout
    return tuple(doc for doc in yaml.safe_load_all(out) if doc)


def find(objects: tuple[dict[str, Any], ...], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    (found,) = find(objects, kind, name)
    return found


def config_text(objects: tuple[dict[str, Any], ...]) -> str:
    return str(one(objects, "ConfigMap", f"{RELEASE}-paddlecloud")["data"]["paddlecloud.yaml"])


def loadable(values: str | None) -> bool:
    """Whether this checkout's config knows the values set's builder backend (the kaniko
    backend lands with its own branch)."""
    objects = render(values)
    backend = yaml.safe_load(config_text(objects))["builder"]["backend"]
    return backend in BuilderSection.model_fields["backend"].annotation.__args__  # type: ignore[union-attr]


# --- Lint and render ---------------------------------------------------------------------


def test_lint_strict_with_every_values_set() -> None:
    for values in SETS:
        result = helm("lint", "--strict", str(CHART), *values_args(values), check=False)
        assert result.returncode == 0, f"{values}: {result.stdout}{result.stderr}"


@pytest.mark.parametrize("values", SETS)
def test_every_object_validates_strict(values: str | None) -> None:
    objects = render(values)
    assert objects
    for obj in objects:
        assert kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True) == KUBERNETES_VERSION


@pytest.mark.parametrize("values", SETS)
def test_every_pod_is_restricted_and_probed(values: str | None) -> None:
    objects = render(values)
    workloads = find(objects, "Deployment") + find(objects, "StatefulSet")
    assert {w["metadata"]["name"] for w in find(objects, "Deployment")} == {
        f"{RELEASE}-paddlecloud-{s}" for s in SERVICES
    }
    for workload in workloads:
        pod = workload["spec"]["template"]["spec"]
        name = workload["metadata"]["name"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] > 0, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), name
        for container in pod["containers"] + pod.get("initContainers", []):
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["readOnlyRootFilesystem"] is True, name
            assert context["runAsNonRoot"] is True, name
            assert context["capabilities"] == {"drop": ["ALL"]}, name
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, name
            assert container["resources"]["requests"] and container["resources"]["limits"], name
            assert container["readinessProbe"] and container["livenessProbe"], name
        if workload["kind"] == "Deployment":
            (container,) = pod["containers"]
            service = name.rsplit("-", 1)[1]
            assert container["command"][:3] == ["python", "-m", f"paddlecloud.{service}"]
            assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
            assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
            # Only the services that call the API server hold a token.
            kaniko = service == "builder" and values == "kaniko-values.yaml"
            assert pod["automountServiceAccountToken"] is (service == "jobs" or kaniko), name
            assert pod["serviceAccountName"] == name


def test_disruption_budgets_where_there_is_more_than_one_replica() -> None:
    budgets = {b["metadata"]["name"] for b in find(render(None), "PodDisruptionBudget")}
    assert budgets == {f"{RELEASE}-paddlecloud-gateway"}  # gateway: 2 replicas by default
    budgets = {b["metadata"]["name"] for b in find(render("pvc-values.yaml"), "PodDisruptionBudget")}
    assert budgets == {f"{RELEASE}-paddlecloud-gateway", f"{RELEASE}-paddlecloud-pfs"}
    assert not find(render("sqlite-values.yaml"), "PodDisruptionBudget")


def test_only_the_gateway_is_exposed() -> None:
    objects = render("ingress-tls-values.yaml")
    (ingress,) = find(objects, "Ingress")
    assert ingress["spec"]["tls"] == [
        {"hosts": ["paddle.example.com"], "secretName": "paddle-example-com-tls"}
    ]
    (rule,) = ingress["spec"]["rules"]
    (path,) = rule["http"]["paths"]
    assert path["backend"]["service"]["name"] == f"{RELEASE}-paddlecloud-gateway"
    assert not find(render(None), "Ingress")
    for values in SETS:
        assert all(s["spec"]["type"] == "ClusterIP" for s in find(render(values), "Service"))


def test_a_changed_config_rolls_the_pods() -> None:
    def checksum(objects: tuple[dict[str, Any], ...]) -> str:
        deployment = one(objects, "Deployment", f"{RELEASE}-paddlecloud-gateway")
        return str(deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    assert checksum(render(None)) != checksum(render(None, "log.level=debug"))


# --- Values the schema refuses -----------------------------------------------------------


@pytest.mark.parametrize(
    ("sets", "says"),
    [
        (["gatway.replicas=2"], "additional properties 'gatway' not allowed"),
        (["storage.claimname=x"], "additional properties 'claimname' not allowed"),
        (["gateway.replicas=0"], "/gateway/replicas"),
        (["jobs.replicas=2", "jobs.kubernetes.leaderElection.enabled=false"], "/jobs/replicas"),
        (["store.type=sqlite", "store.sqlite.existingClaim=db", "pfs.replicas=2"], "/pfs/replicas"),
        (["store.type=sqlite", "store.sqlite.existingClaim=db"], "/gateway/replicas"),  # 2 by default
        (["storage.kind=nfs"], "/storage/kind"),
        (["storage.kind=hostpath", "storage.hostPath=relative"], "/storage/hostPath"),
        # The in-tree cephfs values (Kubernetes 1.31 removed that driver): refused, naming ceph-csi.
        (
            ["storage.kind=cephfs", "storage.monitors={m:6789}", "storage.secretName=key"],
            "storage.kind cephfs now means the ceph-csi driver (cephfs.csi.ceph.com)",
        ),
        (["storage.kind=cephfs", "storage.fsName=cephfs"], "storage.clusterID is needed"),
        (
            ["storage.kind=cephfs", "jobs.kubernetes.namespaceMode=shared", "jobs.kubernetes.namespace=ml"],
            "storage.kind cephfs needs jobs.kubernetes.namespaceMode per-user",
        ),
        # An HDFS datacenter: no Kerberos yet; job pods on each node's HDFS mount (hostPath).
        (["pfs.hdfs.namenode=http://nn:9870", "pfs.hdfs.kerberos=true"], "pfs.hdfs.kerberos: Kerberos"),
        (
            ["pfs.hdfs.namenode=http://nn:9870"],
            "pfs.hdfs: job pods see an HDFS datacenter through each node's HDFS mount: "
            "storage.kind must be hostpath",
        ),
        (["pfs.hdfs.namenode=nn:9870"], "/pfs/hdfs/namenode"),
        (["pfs.hdfs.replication=0"], "/pfs/hdfs/replication"),
        (["pfs.hdfs.principal=pc@EXAMPLE.COM"], "additional properties 'principal' not allowed"),
        (["ingress.enabled=true", "ingress.tls.enabled=true"], "/ingress/tls/secretName"),
        (["mongodb.enabled=false"], "store.external.uri"),
        # Kaniko's layer cache pushed from the executor, where user code runs: removed.
        (["builder.kaniko.cacheRepository=x"], "additional properties 'cacheRepository' not allowed"),
    ],
)
def test_bad_values_are_refused(sets: list[str], says: str) -> None:
    args = [f"--set={s}" for s in sets]
    result = helm("template", RELEASE, str(CHART), *args, check=False)
    assert result.returncode != 0
    assert says in result.stderr


# --- The configuration the services load ---------------------------------------------------


@pytest.mark.parametrize("values", SETS)
def test_the_services_load_the_rendered_config(values: str | None, tmp_path: Path) -> None:
    objects = render(values)
    if not loadable(values):
        pytest.skip("this checkout's builder has no kaniko backend")
    path = tmp_path / "paddlecloud.yaml"
    text = config_text(objects)
    if "auth_file" in text:  # the push Secret's file, mounted in the builder's pod
        (tmp_path / "config.json").write_text('{"auths": {}}')
        text = text.replace("/etc/paddlecloud/registry/config.json", str(tmp_path / "config.json"))
    path.write_text(text)
    config = load_config(path, env={})
    assert config.jobs.backend == "kubernetes"
    assert config.jobs.kubernetes.kubeconfig == "in-cluster"
    # Secrets are files, from Secrets: never values in the ConfigMap.
    assert str(config.internal.secret_file) == "/etc/paddlecloud/secrets/internal-secret"
    assert str(config.store.url_file) == "/etc/paddlecloud/secrets/store-url"
    assert str(config.gateway.admin_password_file) == "/etc/paddlecloud/secrets/admin-password"
    assert config.internal.secret is None and config.gateway.admin_password is None
    # Each service is reached where the chart's Services are.
    for service, port in (("jobs", 8081), ("pfs", 8082), ("builder", 8083)):
        assert getattr(config.gateway, f"{service}_url") == f"http://{RELEASE}-paddlecloud-{service}:{port}"
    assert config.pfs.url == config.gateway.pfs_url and config.builder.url == config.gateway.builder_url
    assert config.jobs.kubernetes.run_as_user == 1000


def test_an_hdfs_datacenter_reaches_pfs_as_pfs_hdfs(tmp_path: Path) -> None:
    """pfs.hdfs's values become the services' `pfs.hdfs` (HdfsStorage), job pods keep the
    nodes' HDFS mount (hostpath); without a namenode there is no `pfs.hdfs` at all."""
    path = tmp_path / "paddlecloud.yaml"
    path.write_text(config_text(render("hdfs-values.yaml")))
    config = load_config(path, env={})
    assert config.pfs.hdfs is not None
    assert config.pfs.hdfs.model_dump() == {
        "namenode": "http://namenode.hadoop.svc:9870",
        "root_path": "/paddlecloud",
        "user": "paddlecloud",
        "proxy_users": True,
        "kerberos": False,
        "replication": 3,
        "timeout": 60.0,
    }
    volume = config.jobs.kubernetes.datacenters[config.pfs.datacenter]
    assert (volume.kind, volume.host_path) == ("hostpath", "/mnt/hdfs/paddlecloud")
    for values in ("hostpath-values.yaml", None):
        assert "hdfs" not in yaml.safe_load(config_text(render(values)))["pfs"]


def test_the_dns_pods_and_the_disk_bound_reach_the_jobs_service(tmp_path: Path) -> None:
    # Unset: the service's defaults. OpenShift's selector replaces them (Helm merges maps,
    # so a default in values.yaml could only be added to, selecting no pod at all).
    def kubernetes(*sets: str) -> Any:
        path = tmp_path / "paddlecloud.yaml"
        path.write_text(config_text(render(None, *sets)))
        return load_config(path, env={}).jobs.kubernetes

    default = kubernetes()
    assert default.dns.namespace_labels == {"kubernetes.io/metadata.name": "kube-system"}
    assert default.dns.pod_labels == {"k8s-app": "kube-dns"} and default.dns.ports == ()
    assert default.max_container_disk == "1Ti"
    openshift = kubernetes(
        r"jobs.kubernetes.dns.namespaceLabels.kubernetes\.io/metadata\.name=openshift-dns",
        r"jobs.kubernetes.dns.podLabels.dns\.operator\.openshift\.io/daemonset-dns=default",
        "jobs.kubernetes.dns.ports={5353}",
        "jobs.kubernetes.maxContainerDisk=200Gi",
    )
    assert openshift.dns.namespace_labels == {"kubernetes.io/metadata.name": "openshift-dns"}
    assert openshift.dns.pod_labels == {"dns.operator.openshift.io/daemonset-dns": "default"}
    assert openshift.dns.ports == (5353,) and openshift.max_container_disk == "200Gi"


def test_no_secret_value_is_in_a_configmap() -> None:
    for values in SETS:
        objects = render(values)
        configmaps = yaml.safe_dump([c.get("data") for c in find(objects, "ConfigMap")])
        for secret in find(objects, "Secret"):
            for value in secret.get("data", {}).values():
                assert base64.b64decode(value).decode() not in configmaps


@pytest.mark.parametrize("values", SETS)
def test_each_secret_file_comes_from_a_secret(values: str | None) -> None:
    objects = render(values)
    generated = {s["metadata"]["name"]: set(s.get("data", {})) for s in find(objects, "Secret")}
    for deployment in find(objects, "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        (secrets,) = [v for v in pod["volumes"] if v["name"] == "secrets"]
        files = {}
        for source in secrets["projected"]["sources"]:
            (item,) = source["secret"]["items"]
            files[item["path"]] = (source["secret"]["name"], item["key"])
        wanted = {"internal-secret", "store-url"} | (
            {"admin-password"} if deployment["metadata"]["name"].endswith("gateway") else set()
        )
        assert set(files) == wanted
        for name, key in files.values():
            # Generated by the chart, or an operator's Secret the values name.
            assert key in generated.get(name, set()) or name.startswith("platform-")


def test_pfs_mounts_the_volume_job_pods_get(tmp_path: Path) -> None:
    for values in SETS:
        objects = render(values)
        text = config_text(objects)
        volumes = yaml.safe_load(text)["jobs"]["kubernetes"]["datacenters"]
        (dc,) = volumes
        described = Config.model_validate(
            {"jobs": {"kubernetes": {"kubeconfig": "in-cluster", "datacenters": volumes}}}
        ).jobs.kubernetes.datacenters[dc]
        pod = one(objects, "Deployment", f"{RELEASE}-paddlecloud-pfs")["spec"]["template"]["spec"]
        (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "pfs"]
        assert mount["mountPath"] == f"/pfs/{dc}" == yaml.safe_load(text)["pfs"]["root"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "pfs"]
        if described.kind == "cephfs":
            # pfs's claim of its own static ceph-csi volume over the root, which job pods'
            # volumes (the jobs backend's own) cut into each user's home and public.
            claim = one(objects, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
            pv = one(objects, "PersistentVolume", claim["spec"]["volumeName"])
            assert pv["spec"]["claimRef"]["name"] == claim["metadata"]["name"]
            settings = KubernetesSection(datacenters={dc: described})
            jobs_pv = user_volumes("alice", settings)[0]["spec"]
            assert pv["spec"]["persistentVolumeReclaimPolicy"] == jobs_pv["persistentVolumeReclaimPolicy"]
            assert pv["spec"]["csi"]["volumeAttributes"] == jobs_pv["csi"]["volumeAttributes"] | {
                "rootPath": described.root_path
            }
            for key in ("driver", "nodeStageSecretRef"):
                assert pv["spec"]["csi"][key] == jobs_pv["csi"][key]
            continue
        # pfs mounts exactly what job pods mount (the jobs backend's own mapping).
        assert {k: v for k, v in volume.items() if k != "name"} == volume_source(described), values
    kinds = {
        yaml.safe_load(config_text(render(v)))["jobs"]["kubernetes"]["datacenters"].popitem()[1]["kind"]
        for v in SETS
    }
    assert kinds == {"cephfs", "pvc", "hostpath"}


def test_the_jobs_service_reads_the_pfs_pfs_serves() -> None:
    """jobs checks a submission's package, input and requirements.txt on PFS at its
    `pfs.root` (services/jobs/packages.py): without the volume there, every submit on a
    cluster would be refused as "does not exist on PFS". It mounts pfs's volume read-only."""
    for values in SETS:
        objects = render(values)
        root = yaml.safe_load(config_text(objects))["pfs"]["root"]
        pods = {
            c: one(objects, "Deployment", f"{RELEASE}-paddlecloud-{c}")["spec"]["template"]["spec"]
            for c in ("pfs", "jobs")
        }
        (mount,) = [m for m in pods["jobs"]["containers"][0]["volumeMounts"] if m["name"] == "pfs"]
        assert mount == {"name": "pfs", "mountPath": root, "readOnly": True}, values
        (volume,) = [v for v in pods["jobs"]["volumes"] if v["name"] == "pfs"]
        assert volume in pods["pfs"]["volumes"], values


def test_mongodb_bundled_with_auth_and_a_volume_or_external() -> None:
    objects = render(None)
    statefulset = one(objects, "StatefulSet", f"{RELEASE}-paddlecloud-mongodb")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    assert "--auth" in container["args"]
    assert {e["name"] for e in container["env"]} >= {"MONGO_INITDB_ROOT_PASSWORD", "PADDLECLOUD_PASSWORD"}
    assert statefulset["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    store_url = base64.b64decode(
        one(objects, "Secret", f"{RELEASE}-paddlecloud")["data"]["store-url"]
    ).decode()
    password = base64.b64decode(
        one(objects, "Secret", f"{RELEASE}-paddlecloud-mongodb")["data"]["mongodb-password"]
    ).decode()
    assert store_url == (
        f"mongodb://paddlecloud:{password}@{RELEASE}-paddlecloud-mongodb:27017/paddlecloud?authSource=paddlecloud"
    )
    external = render("external-mongodb-values.yaml")
    assert not find(external, "StatefulSet")
    assert base64.b64decode(
        one(external, "Secret", f"{RELEASE}-paddlecloud")["data"]["store-url"]
    ).startswith(b"mongodb://paddlecloud:secret@mongo.example.com")
    assert not find(render("sqlite-values.yaml"), "StatefulSet")


# --- RBAC and network policies ---------------------------------------------------------------


def test_the_chart_rbac_files_are_the_codes() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "chart_rbac.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def rules_and_subjects(objects: tuple[dict[str, Any], ...], kind: str) -> tuple[list[Any], list[Any]]:
    objects = tuple(o for o in objects if not o["metadata"]["name"].endswith("-jobs-leader"))  # its own test
    (role,) = find(objects, kind)
    (binding,) = find(objects, f"{kind}Binding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": kind,
        "name": role["metadata"]["name"],
    }
    return role["rules"], binding["subjects"]


def test_per_user_mode_binds_only_the_cluster_rights_cluster_wide() -> None:
    """The ClusterRoleBinding grants what cannot be namespaced, with `bind` on the tenant
    ClusterRole only; the tenant role holds the namespaced rights and is bound by no
    binding of the chart (the service binds it in each namespace it makes); the config
    tells the service those names and its own."""
    objects = render(None)
    cluster_name = f"{NAMESPACE}-{RELEASE}-paddlecloud-jobs"
    tenant = f"{cluster_name}-tenant"
    role = one(objects, "ClusterRole", cluster_name)
    assert role["rules"] == rbac.policy_rules("cluster", tenant)
    (binding,) = find(objects, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": cluster_name,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": f"{RELEASE}-paddlecloud-jobs", "namespace": NAMESPACE}
    ]
    assert one(objects, "ClusterRole", tenant)["rules"] == rbac.policy_rules("tenant")
    # The one Role is the Lease's (test_two_jobs_replicas_elect_one_leader_...).
    leader = [f"{RELEASE}-paddlecloud-jobs-leader"]
    assert [r["metadata"]["name"] for r in find(objects, "Role")] == leader
    assert [r["metadata"]["name"] for r in find(objects, "RoleBinding")] == leader
    kubernetes = yaml.safe_load(config_text(objects))["jobs"]["kubernetes"]
    assert kubernetes["release"] == f"{NAMESPACE}.{RELEASE}"
    assert kubernetes["tenant_role"] == tenant
    assert kubernetes["service_account"] == f"{NAMESPACE}/{RELEASE}-paddlecloud-jobs"
    policy = one(objects, "ValidatingAdmissionPolicy", cluster_name)
    (condition,) = policy["spec"]["matchConditions"]
    assert f"'system:serviceaccount:{NAMESPACE}:{RELEASE}-paddlecloud-jobs'" in condition["expression"]
    assert {v["reason"] for v in policy["spec"]["validations"]} == {"Forbidden"}
    assert one(objects, "ValidatingAdmissionPolicyBinding", cluster_name)["spec"] == {
        "policyName": cluster_name,
        "validationActions": ["Deny"],
    }


def test_the_release_label_in_the_policy_is_the_services() -> None:
    """A release whose "<namespace>.<name>" is longer than a label value: the chart hashes
    it as names.release_label does, or the policy would refuse every namespace."""
    long_namespace = "a-namespace-with-a-rather-long-name-of-fifty-characters"[:50]
    out = helm("template", "production-release", str(CHART), "-n", long_namespace).stdout
    objects = tuple(doc for doc in yaml.safe_load_all(out) if doc)
    release = yaml.safe_load(config_text_of(objects))["jobs"]["kubernetes"]["release"]
    assert len(release) > 63
    (policy,) = find(objects, "ValidatingAdmissionPolicy")
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["release"] == f"'{release_label(release)}'"


def config_text_of(objects: tuple[dict[str, Any], ...]) -> str:
    (config,) = (o for o in objects if o["kind"] == "ConfigMap" and "paddlecloud.yaml" in o.get("data", {}))
    return str(config["data"]["paddlecloud.yaml"])


def test_shared_mode_has_only_a_role_in_the_jobs_namespace() -> None:
    objects = render("shared-namespace-values.yaml")
    rules, subjects = rules_and_subjects(objects, "Role")
    assert rules == rbac.policy_rules("shared")
    assert one(objects, "Role", f"{RELEASE}-paddlecloud-jobs")["metadata"]["namespace"] == "paddlecloud-jobs"
    assert subjects == [
        {"kind": "ServiceAccount", "name": f"{RELEASE}-paddlecloud-jobs", "namespace": NAMESPACE}
    ]
    assert not find(objects, "ClusterRole") and not find(objects, "ClusterRoleBinding")
    assert not find(objects, "ValidatingAdmissionPolicy")


def test_the_kaniko_builder_gets_the_role_its_code_declares() -> None:
    from paddlecloud.builder import rbac as builder_rbac

    objects = render("kaniko-values.yaml")
    role = one(objects, "Role", f"{RELEASE}-paddlecloud-builder")
    assert role["metadata"]["namespace"] == "paddlecloud-builds"
    assert role["rules"] == builder_rbac.policy_rules()
    binding = one(objects, "RoleBinding", f"{RELEASE}-paddlecloud-builder")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": f"{RELEASE}-paddlecloud-builder", "namespace": NAMESPACE}
    ]


def test_the_builds_namespace_is_baseline_and_its_pods_reach_only_dns_the_index_and_the_registry() -> None:
    """docs/builder.md, "The builds namespace": Kaniko's executor runs as root with added
    capabilities (`baseline`, not `restricted`), and runs user code: its pods may reach the
    cluster's DNS and the operator's index and registry, nothing else, and nothing them."""
    egress = ("builder.kaniko.egress.cidrs={10.0.0.5/32,10.1.0.0/16}", "builder.kaniko.egress.ports={443}")
    objects = render("kaniko-values.yaml", *egress)
    labels = one(objects, "Namespace", "paddlecloud-builds")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
    assert (
        labels["pod-security.kubernetes.io/warn"]
        == labels["pod-security.kubernetes.io/audit"]
        == "restricted"
    )
    policy = one(objects, "NetworkPolicy", f"{RELEASE}-paddlecloud-builds")
    assert policy["metadata"]["namespace"] == "paddlecloud-builds"
    spec = policy["spec"]
    # Every pod there, no ingress rule at all (deny), egress only as listed.
    assert (
        spec["podSelector"] == {} and spec["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in spec
    )
    dns = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
    }
    assert spec["egress"] == [
        {"to": [dns]},
        {
            "to": [{"ipBlock": {"cidr": "10.0.0.5/32"}}, {"ipBlock": {"cidr": "10.1.0.0/16"}}],
            "ports": [{"protocol": "TCP", "port": 443}],
        },
    ]
    # The DNS pods chosen as jobs.kubernetes.dns chooses them for job pods.
    openshift = render(
        "kaniko-values.yaml",
        "jobs.kubernetes.dns.namespaceLabels.kubernetes\\.io/metadata\\.name=openshift-dns",
        "jobs.kubernetes.dns.ports={5353}",
    )
    rule = one(openshift, "NetworkPolicy", f"{RELEASE}-paddlecloud-builds")["spec"]["egress"][0]
    assert rule["to"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "openshift-dns"
    }
    assert rule["ports"] == [{"protocol": "UDP", "port": 5353}, {"protocol": "TCP", "port": 5353}]
    # An operator who makes the namespace: no Namespace; no policies: no policy.
    assert not find(render("kaniko-values.yaml", "builder.kaniko.createNamespace=false"), "Namespace")
    assert not find(render("kaniko-values.yaml", "networkPolicy.enabled=false"), "NetworkPolicy")
    # The executor is pinned by digest; the pusher is the platform's.
    kaniko = yaml.safe_load(config_text(objects))["builder"]["kaniko"]
    assert kaniko["executor_image"].startswith("ghcr.io/osscontainertools/kaniko:v1.28.2@sha256:")
    assert kaniko["pusher_image"] == "paddlecloud/pusher:0.1.0"
    assert "cache_repository" not in kaniko


@pytest.mark.parametrize("values", SETS)
def test_least_privilege(values: str | None) -> None:
    objects = render(values)
    for role in find(objects, "ClusterRole") + find(objects, "Role"):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
            assert "pods/exec" not in rule["resources"] and "pods/attach" not in rule["resources"]
            if "secrets" in rule["resources"]:
                assert not {"get", "list", "watch"} & set(rule["verbs"])
    bound = {
        s["name"]
        for kind in ("ClusterRoleBinding", "RoleBinding")
        for b in find(objects, kind)
        for s in b["subjects"]
    }
    builder = {f"{RELEASE}-paddlecloud-builder"} if values == "kaniko-values.yaml" else set()
    assert bound == {f"{RELEASE}-paddlecloud-jobs"} | builder
    accounts = {a["metadata"]["name"] for a in find(objects, "ServiceAccount")}
    assert accounts >= {f"{RELEASE}-paddlecloud-{s}" for s in SERVICES}


def test_network_policies() -> None:
    objects = render(None)

    def callers(component: str) -> list[str] | None:
        policy = one(objects, "NetworkPolicy", f"{RELEASE}-paddlecloud-{component}")
        (rule,) = policy["spec"]["ingress"]
        if "from" not in rule:
            return None
        return sorted(p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in rule["from"])

    assert callers("gateway") is None  # from anywhere: the way in
    assert callers("jobs") == ["gateway"]
    assert callers("pfs") == ["gateway", "jobs"]  # jobs asks pfs for storage usage
    assert callers("builder") == ["gateway", "jobs"]  # jobs asks the builder for environments
    assert callers("mongodb") == ["builder", "gateway", "jobs", "pfs"]
    gateway = one(render("ingress-tls-values.yaml"), "NetworkPolicy", f"{RELEASE}-paddlecloud-gateway")
    assert gateway["spec"]["ingress"][0]["from"][0]["namespaceSelector"]


def test_prometheus_may_reach_every_services_metrics_where_the_values_let_it() -> None:
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    scrape = {"ports": [{"port": "http", "protocol": "TCP"}], "from": [monitoring]}
    only_ingress = "networkPolicy.gatewayFrom[0].podSelector.matchLabels.ingress=yes"
    for values, sets in ((None, ()), ("grafana-values.yaml", ()), ("grafana-values.yaml", (only_ingress,))):
        objects = render(values, *sets)
        for component in SERVICES:
            rules = one(objects, "NetworkPolicy", f"{RELEASE}-paddlecloud-{component}")["spec"]["ingress"]
            # A gateway open to anyone needs no rule of its own for Prometheus.
            opened = values is not None and (component != "gateway" or bool(sets))
            assert [r for r in rules if r.get("from") == [monitoring]] == ([scrape] if opened else []), (
                component
            )
        (mongodb,) = one(objects, "NetworkPolicy", f"{RELEASE}-paddlecloud-mongodb")["spec"]["ingress"]
        assert monitoring not in mongodb["from"]


def test_the_grafana_dashboard_ships_in_a_configmap_the_sidecar_loads() -> None:
    assert not find(render(None), "ConfigMap", f"{RELEASE}-paddlecloud-grafana-dashboard")  # off by default
    objects = render("grafana-values.yaml", "grafana.dashboard.namespace=monitoring")
    dashboard = one(objects, "ConfigMap", f"{RELEASE}-paddlecloud-grafana-dashboard")
    assert dashboard["metadata"]["namespace"] == "monitoring"  # where a sidecar watches only its own
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "PaddleCloud"}
    shipped = json.loads(dashboard["data"]["paddlecloud.json"])
    assert shipped == json.loads((CHART / "dashboards" / "paddlecloud.json").read_text())
    default = one(render("grafana-values.yaml"), "ConfigMap", f"{RELEASE}-paddlecloud-grafana-dashboard")
    assert default["metadata"]["namespace"] == NAMESPACE


def test_two_jobs_replicas_elect_one_leader_by_a_lease_only_they_may_renew(tmp_path: Path) -> None:
    objects = render(None, "jobs.replicas=2")
    deployment = one(objects, "Deployment", f"{RELEASE}-paddlecloud-jobs")
    assert deployment["spec"]["replicas"] == 2
    # A follower is never Ready: a rolling update would wait for ever on a new pod.
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container["env"]
    # No budget for jobs: it would count the follower disrupted and block evicting the leader.
    assert not find(objects, "PodDisruptionBudget", f"{RELEASE}-paddlecloud-jobs")
    path = tmp_path / "paddlecloud.yaml"
    path.write_text(config_text(objects))
    election = load_config(path, env={}).jobs.kubernetes.leader_election
    assert election.enabled and election.namespace == NAMESPACE
    role = one(objects, "Role", f"{RELEASE}-paddlecloud-jobs-leader")
    assert role["rules"] == rbac.leader_rules(election.lease_name)
    binding = one(objects, "RoleBinding", f"{RELEASE}-paddlecloud-jobs-leader")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": f"{RELEASE}-paddlecloud-jobs", "namespace": NAMESPACE}
    ]
    assert not find(
        render(None, "jobs.kubernetes.leaderElection.enabled=false"), "Role", role["metadata"]["name"]
    )
