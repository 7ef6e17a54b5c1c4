"""Server config: YAML, environment overrides, validation, secrets kept out of reprs."""

from __future__ import annotations

import pytest

from paddlecloud.common.config import ConfigError, apply_env, load_config


def test_defaults_without_a_file() -> None:
    config = load_config(None, env={})
    assert config.gateway.port == 8080
    assert config.store_url().startswith("sqlite:///")


def test_env_overrides_every_section(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("gateway:\n  port: 9000\n  read_timeout: 30\npfs:\n  datacenter: dc1\n")
    config = load_config(
        path,
        env={
            "PADDLECLOUD_GATEWAY_PORT": "9100",
            "PADDLECLOUD_PFS_DATACENTER": "dc2",
            "PADDLECLOUD_STORE_URL": "mongodb://db:27017/pc",
            "PADDLECLOUD_INTERNAL_SECRET": "s3cret",
            "PADDLECLOUD_ENDPOINT": "not server config, ignored",
            "HOME": "/root",
        },
    )
    assert config.gateway.port == 9100
    assert config.gateway.read_timeout == 30
    assert config.pfs.datacenter == "dc2"
    assert config.store_url() == "mongodb://db:27017/pc"
    assert config.internal_secret() == b"s3cret"


def test_unknown_env_key_is_named() -> None:
    with pytest.raises(ConfigError, match="PADDLECLOUD_GATEWAY_PROT"):
        apply_env({}, {"PADDLECLOUD_GATEWAY_PROT": "1"})


@pytest.mark.parametrize(
    ("yaml_text", "words"),
    [
        ("gateway:\n  port: seventy\n", "gateway.port"),
        ("gateway:\n  colour: red\n", "gateway.colour"),
        ("- a\n- b\n", "mapping of sections"),
        ("gateway: [\n", "not valid YAML"),
        ("log:\n  format: xml\n", "log.format"),
        ("jobs:\n  package_max_bytes: lots\n", "jobs.package_max_bytes"),
        ("jobs:\n  log_max_bytes: 64Ki\n", "jobs.log_max_bytes"),
        ("jobs:\n  network: host\n", "jobs.network"),
        (
            "jobs:\n  viewers: {tensorboard: venv/bin/python}\n",
            "jobs.viewers.tensorboard: 'venv/bin/python' is not",
        ),
        ("jobs:\n  viewers: {idle_seconds: 0}\n", "jobs.viewers.idle_seconds"),
        ("jobs:\n  viewers: {grafana: /usr/bin/python3}\n", "jobs.viewers.grafana"),
        ("gateway:\n  default_quota: {memory: lots}\n", "gateway.default_quota.memory: 'lots' is not"),
        (
            "gateway:\n  default_quota: {cpu: 2000000}\n",
            "gateway.default_quota.cpu: 2000000 is more than a quota may be",
        ),
        (
            "gateway:\n  default_quota: {storage: 2Ei}\n",
            "gateway.default_quota.storage: '2Ei' is more than a quota may be",
        ),
        ("gateway:\n  default_quota: {gpu: -1}\n", "gateway.default_quota.gpu"),
        ("gateway:\n  default_quota: {jobs: yes}\n", "gateway.default_quota.jobs: expected a whole number"),
        ("gateway:\n  default_quota: {disks: 1Gi}\n", "gateway.default_quota.disks"),
        ("gateway:\n  default_quota: {disk: lots}\n", "gateway.default_quota.disk: 'lots' is not"),
        (
            "jobs:\n  kubernetes:\n    leader_election: {lease_seconds: 5, renew_seconds: 5}\n",
            "jobs.kubernetes.leader_election: renew_seconds",
        ),
        (
            "jobs:\n  kubernetes:\n    leader_election: {renew_seconds: 2, retry_seconds: 2}\n",
            "jobs.kubernetes.leader_election: retry_seconds",
        ),
        (
            "jobs:\n  kubernetes:\n    leader_election: {namespace: Kube_System}\n",
            "leader_election.namespace",
        ),
        # kind cephfs is ceph-csi: static volumes only, per-user mode only (docs/kubernetes.md).
        (
            "jobs:\n  kubernetes:\n    datacenters:\n      dc1: {kind: cephfs, cluster_id: c, fs_name: f,"
            " node_stage_secret: ns/s, provisioning: dynamic}\n",
            "cephfs provisioning dynamic is not supported: ceph-csi would make a fresh subvolume",
        ),
        (
            "jobs:\n  kubernetes:\n    namespace_mode: shared\n    namespace: ml\n    datacenters:\n"
            "      dc1: {kind: cephfs, cluster_id: c, fs_name: f, node_stage_secret: ns/s}\n",
            "a cephfs volume needs namespace_mode per-user",
        ),
        (
            "jobs:\n  kubernetes:\n    datacenters:\n      dc1: {kind: cephfs, cluster_id: c, fs_name: f,"
            " node_stage_secret: s}\n",
            "jobs.kubernetes.datacenters.dc1.node_stage_secret",
        ),
        # An HDFS datacenter's job pods see HDFS through each node's mount (hostPath).
        *(
            (
                f"pfs:\n  datacenter: dc1\n  hdfs: {{namenode: 'http://nn:9870'}}\n"
                f"jobs:\n  kubernetes:\n    datacenters:\n      dc1: {volume}\n",
                "pfs.hdfs: datacenter 'dc1' keeps its files in HDFS, which job pods see through each "
                "node's HDFS mount: jobs.kubernetes.datacenters.dc1.kind must be hostpath",
            )
            for volume in (
                "{kind: cephfs, cluster_id: c, fs_name: f, node_stage_secret: ns/s}",
                "{kind: pvc, claim_name: pfs}",
            )
        ),
        ("pfs:\n  hdfs: {namenode: 'http://nn:9870', kerberos: true}\n", "hdfs kerberos is not supported"),
    ],
)
def test_bad_files_name_the_key(tmp_path, yaml_text: str, words: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError, match=words.replace(".", r"\.").replace("[", r"\[")):
        load_config(path, env={})


def test_an_hdfs_datacenter_runs_jobs_on_its_nodes_hdfs_mount(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "pfs:\n  datacenter: dc1\n  hdfs: {namenode: 'http://nn:9870', root_path: /pc}\n"
        "jobs:\n  backend: kubernetes\n  kubernetes:\n    datacenters:\n"
        "      dc1: {kind: hostpath, host_path: /mnt/hdfs/pc}\n"
    )
    config = load_config(path, env={})
    assert config.pfs.hdfs is not None and config.pfs.hdfs.root_path == "/pc"
    assert config.jobs.kubernetes.datacenters["dc1"].host_path == "/mnt/hdfs/pc"


def test_an_hdfs_datacenter_from_the_environment() -> None:
    env = {"PADDLECLOUD_PFS_HDFS": "{namenode: 'http://nn:9870', proxy_users: true, replication: 2}"}
    hdfs = load_config(None, env=env).pfs.hdfs
    assert hdfs is not None
    assert (hdfs.namenode, hdfs.proxy_users, hdfs.replication) == ("http://nn:9870", True, 2)
    with pytest.raises(ConfigError, match=r"config pfs\.hdfs\.namenode: Field required"):
        load_config(None, env={"PADDLECLOUD_PFS_HDFS": "{user: pc}"})


def test_missing_file_is_a_config_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml", env={})


def test_secrets_from_files_and_never_in_repr(tmp_path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("from-a-file\n")
    config = load_config(
        None,
        env={
            "PADDLECLOUD_INTERNAL_SECRET_FILE": str(secret),
            "PADDLECLOUD_GATEWAY_ADMIN_PASSWORD": "pw-in-env",
        },
    )
    assert config.internal_secret() == b"from-a-file"
    assert config.admin_password() == "pw-in-env"
    text = repr(config) + str(config.model_dump())
    assert "pw-in-env" not in text and "from-a-file" not in text


def test_missing_secret_refuses_to_run() -> None:
    config = load_config(None, env={})
    with pytest.raises(ConfigError, match=r"internal\.secret is not set"):
        config.internal_secret()


def test_disk_bounds_take_quantities() -> None:
    config = load_config(
        None, env={"PADDLECLOUD_JOBS_PACKAGE_MAX_BYTES": "2Gi", "PADDLECLOUD_JOBS_LOG_MAX_BYTES": "64Mi"}
    )
    assert (config.jobs.package_max_bytes, config.jobs.log_max_bytes) == (2 * 2**30, 64 * 2**20)
    defaults = load_config(None, env={}).jobs
    assert (defaults.package_max_bytes, defaults.log_max_bytes) == (2**30, 256 * 2**20)


def test_a_default_quota_for_new_users_from_the_file_or_the_environment(tmp_path) -> None:
    assert load_config(None, env={}).gateway.default_quota.model_dump() == dict.fromkeys(
        ("cpu", "gpu", "memory", "jobs", "storage", "disk")
    )
    path = tmp_path / "c.yaml"
    path.write_text("gateway:\n  default_quota: {cpu: 4, memory: 16Gi, jobs: 2}\n")
    quota = load_config(path, env={}).gateway.default_quota
    assert (quota.cpu, quota.gpu, quota.memory, quota.jobs, quota.storage) == ("4", None, "16Gi", 2, None)
    env = {"PADDLECLOUD_GATEWAY_DEFAULT_QUOTA": "{gpu: 1, storage: 100Gi}"}
    quota = load_config(None, env=env).gateway.default_quota
    assert (quota.gpu, quota.storage, quota.cpu) == (1, "100Gi", None)


def test_the_lease_is_in_the_named_namespace_or_the_pods_and_outside_a_pod_one_must_be_named(
    tmp_path,
) -> None:
    from paddlecloud.common.config import LeaderElection
    from paddlecloud.jobs.kube.leader import lease_namespace

    absent, mounted = tmp_path / "absent", tmp_path / "namespace"
    mounted.write_text("paddlecloud\n")
    assert lease_namespace(LeaderElection(namespace="ops"), absent) == "ops"
    assert lease_namespace(LeaderElection(), mounted) == "paddlecloud"
    with pytest.raises(ConfigError, match=r"jobs\.kubernetes\.leader_election\.namespace: not set"):
        lease_namespace(LeaderElection(), absent)


def test_viewers_from_the_file_or_the_environment_and_unset_by_default(tmp_path) -> None:
    assert load_config(None, env={}).jobs.viewers.tensorboard is None
    env = {"PADDLECLOUD_JOBS_VIEWERS": "{visualdl: /opt/vdl/bin/python, idle_seconds: 30}"}
    viewers = load_config(None, env=env).jobs.viewers
    assert (viewers.visualdl, viewers.tensorboard, viewers.idle_seconds) == ("/opt/vdl/bin/python", None, 30)
