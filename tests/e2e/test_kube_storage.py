"""CephFS through ceph-csi on the real control plane (issue 32, findings 1 and 2): the
PersistentVolumes, claims and pods the jobs service makes for `kind: cephfs` are accepted
by the real API server with the chart's rights and admission policy; the real PV binder
of kube-controller-manager binds each user's claims, made with their namespace on their
first job, with no step by an admin, and again after an admin deleted the namespace; a
deleted user's volumes go as objects only (Retain: ceph-csi never deletes a static
volume's data), and the user made again gets them again.

No kubelet here mounts anything (tests/kube_real/kubelet.py is simulated): that ceph-csi
mounts the volumes is for a real cluster (docs/kubernetes.md, "CephFS through ceph-csi")."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kube_backend_support as kb
import pytest
from test_jobs_cli import ok, run_cli

import kube_real
from kube_real.chart import install_rights
from kube_real.fixtures import RealKube
from paddlecloud.common.config import KubernetesSection
from paddlecloud.jobs.kube import manifests, names

pytestmark = pytest.mark.slow

Obj = dict[str, Any]
DC = kb.DC
CEPHFS = {
    "kind": "cephfs",
    "cluster_id": "4a9e4c3e-5a8b-11ef-9b1f-0242ac120002",
    "fs_name": "cephfs",
    "root_path": "/paddlecloud",
    "node_stage_secret": "ceph-csi-cephfs/csi-cephfs-secret",
}
# The same storage as the chart's values: its admission policy admits only volumes over it.
CHART_STORAGE = (
    "storage.kind=cephfs",
    f"storage.clusterID={CEPHFS['cluster_id']}",
    f"storage.fsName={CEPHFS['fs_name']}",
    f"storage.rootPath={CEPHFS['root_path']}",
    "storage.nodeStageSecretNamespace=ceph-csi-cephfs",
    "storage.nodeStageSecretName=csi-cephfs-secret",
)


def volumes_of(admin: Any, user: str, release: str) -> list[Obj]:
    """The PersistentVolumes of `user` that the release made, as the cluster's admin sees them."""
    selector = f"{names.LABEL_RELEASE}={names.release_label(release)},{names.LABEL_USER}={user}"
    return list(admin.get("/api/v1/persistentvolumes", query={"labelSelector": selector})["items"])


def test_the_services_token_may_make_only_its_releases_ceph_csi_volumes(
    real_kube: RealKube, tmp_path: Path
) -> None:
    """The chart's admission policy on PersistentVolumes, as the real API server enforces
    it (every change a dry run): the service's own volumes are admitted, and one without
    the release's label, of another driver, not retained, or claimed outside its users'
    namespaces is refused, as is deleting a volume that is not its release's."""
    admin = real_kube.cluster.admin
    prefix = f"t{secrets.token_hex(2)}-"
    rights = install_rights(
        real_kube.cluster,
        tmp_path,
        f"pcjobs-{prefix[1:-1]}",
        sets=(f"jobs.kubernetes.namespacePrefix={prefix}", *CHART_STORAGE),
    )
    service, dry = rights.client(), {"dryRun": "All"}
    settings = KubernetesSection(
        namespace_prefix=prefix, release=rights.settings["release"], datacenters={DC: CEPHFS}
    )
    foreign = f"{prefix}foreign-pv"
    try:
        home = manifests.user_volumes("alice", settings)[0]
        reply = service.request("POST", "/api/v1/persistentvolumes", home, query=dry)
        assert reply.status == 201, reply.message

        def refused(change: Any, says: str) -> None:
            bad = {**home, "metadata": dict(home["metadata"]), "spec": dict(home["spec"])}
            change(bad)
            reply = service.request("POST", "/api/v1/persistentvolumes", bad, query=dry)
            assert reply.status == 403, (says, reply.status, reply.message)
            assert "ValidatingAdmissionPolicy" in reply.message and says in reply.message, reply.message

        refused(lambda pv: pv["metadata"].update(labels={}), "only PersistentVolumes labelled")
        # Only over this release's CephFS storage: not another path, file system or Secret.
        attributes, over = home["spec"]["csi"]["volumeAttributes"], "over this release's CephFS storage"
        for key, value in (("rootPath", "/"), ("rootPath", "/paddlecloud/home/../x"), ("fsName", "other")):
            csi = {**home["spec"]["csi"], "volumeAttributes": {**attributes, key: value}}
            refused(lambda pv, csi=csi: pv["spec"].update(csi=csi), over)
        secret = {"name": "csi-cephfs-secret", "namespace": "kube-system"}
        refused(lambda pv: pv["spec"].update(csi={**home["spec"]["csi"], "nodeStageSecretRef": secret}), over)
        refused(lambda pv: pv["spec"].update(csi={**home["spec"]["csi"], "driver": "x.csi.io"}), "ceph-csi")
        refused(lambda pv: pv["spec"].update(persistentVolumeReclaimPolicy="Delete"), "retained")
        refused(
            lambda pv: pv["spec"].update(claimRef={**home["spec"]["claimRef"], "namespace": "kube-system"}),
            "claimed in a namespace of its users",
        )
        # Someone else's volume is not the service's to delete.
        admin.create("/api/v1/persistentvolumes", {**home, "metadata": {"name": foreign}})
        reply = service.request("DELETE", f"/api/v1/persistentvolumes/{foreign}", query=dry)
        assert reply.status == 403 and "only PersistentVolumes labelled" in reply.message, reply.message
    finally:
        admin.request("DELETE", f"/api/v1/persistentvolumes/{foreign}")
        rights.remove()


@pytest.fixture
def backend(real_kube: RealKube, server_factory: Any, tmp_path: Path) -> Iterator[kb.KubeBackend]:
    prefix = f"t{secrets.token_hex(2)}-"
    with kb.kube_backend(
        real_kube,
        server_factory,
        tmp_path,
        prefix=prefix,
        sets=(f"jobs.kubernetes.namespacePrefix={prefix}", *CHART_STORAGE),
        datacenters={DC: CEPHFS},
    ) as started:
        try:
            yield started
        finally:
            admin = real_kube.cluster.admin
            release = started.rights.settings["release"]
            for pv in volumes_of(admin, "bob", release):
                admin.request("DELETE", f"/api/v1/persistentvolumes/{pv['metadata']['name']}")


def test_a_new_users_first_job_gets_its_claims_and_a_deleted_user_keeps_the_data(
    backend: kb.KubeBackend,
) -> None:
    k, admin, server = backend, backend.kube.cluster.admin, backend.server
    release = k.rights.settings["release"]
    namespace = k.namespace("bob")
    ran: list[Obj] = []  # the trainer pods the kubelet ran

    def seen(pod: Obj) -> kube_real.PodScript:
        ran.append(pod)
        return kube_real.PodScript()

    for life in ("first", "second"):
        # No admin makes anything in the cluster: only the user, in PaddleCloud.
        server.cli("users", "create", "bob", "--password-stdin", stdin="bob-password\n")
        server.add_datacenter(f"as-bob-{life}", "bob", "bob-password")
        as_bob = ("--datacenter", f"as-bob-{life}")
        ran.clear()
        with k.kube.scripted(kb.script(trainer=seen)):
            ok(run_cli(server, *as_bob, "submit", "--name", "first", "--trainers", "1", str(k.package())))
            done = k.wait_for_state("first", ("SUCCEEDED", "FAILED"), *as_bob, timeout=90)
        assert done["state"] == "SUCCEEDED", done
        claims = admin.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims")["items"]
        assert {c["metadata"]["name"]: c["status"]["phase"] for c in claims} == {
            names.claim_name(DC, "bob", area): "Bound" for area in names.PFS_AREAS
        }
        volumes = volumes_of(admin, "bob", release)
        assert sorted(pv["spec"]["csi"]["volumeAttributes"]["rootPath"] for pv in volumes) == [
            "/paddlecloud/home/bob",
            "/paddlecloud/public",
        ]
        for pv in volumes:
            assert pv["spec"]["csi"]["driver"] == "cephfs.csi.ceph.com"
            assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
            assert pv["status"]["phase"] == "Bound"
        # The pod ran with the claims as its PFS (the kubelet admitted it: they were bound).
        assert ran and all(
            {
                v["persistentVolumeClaim"]["claimName"]
                for v in pod["spec"]["volumes"]
                if "persistentVolumeClaim" in v
            }
            == {c["metadata"]["name"] for c in claims}
            for pod in ran
        )
        if life == "first":
            # An admin deletes the namespace by hand: the claims go, the volumes stay
            # (Released, naming the old claims); the user's next job makes the namespace
            # and claims again, and the volumes are bound to them again.
            admin.request("DELETE", f"/api/v1/namespaces/{namespace}")
            kb.wait(lambda: admin.request("GET", f"/api/v1/namespaces/{namespace}").status == 404, "gone")
            with k.kube.scripted(kb.script(trainer=seen)):
                ok(run_cli(server, *as_bob, "submit", "--name", "again", "--trainers", "1", str(k.package())))
                done = k.wait_for_state("again", ("SUCCEEDED", "FAILED"), *as_bob, timeout=90)
            assert done["state"] == "SUCCEEDED", done
            assert {pv["status"]["phase"] for pv in volumes_of(admin, "bob", release)} == {"Bound"}
        # The user goes: their namespace (and claims) and the volume objects, and only
        # those: a Retain volume's data is never deleted (ceph-csi never deletes a static
        # volume's), and the same user made again gets volumes bound to new claims.
        server.cli("users", "delete", "bob")
        kb.wait(lambda: not volumes_of(admin, "bob", release), "bob's volumes deleted")
        kb.wait(
            lambda: admin.request("GET", f"/api/v1/namespaces/{namespace}").status == 404, "bob's namespace"
        )
