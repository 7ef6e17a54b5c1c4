"""The session's real control plane as a pytest fixture (tests/conftest.py imports it, so
every tier has it): its tests run on one pytest-xdist worker, so it starts once."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

import kube_real
import kube_real.cluster
from kube_real.kubelet import PodScript, default_script

Obj = dict[str, Any]


@dataclass
class RealKube:
    """The real control plane (tests/kube_real) and its one simulated node."""

    cluster: kube_real.cluster.Cluster
    kubelet: kube_real.SimulatedKubelet

    @contextmanager
    def scripted(self, script: Callable[[Obj], PodScript]) -> Iterator[None]:
        """The node runs pods created meanwhile as `script` says, then as by default."""
        self.kubelet.script = script
        try:
            yield
        finally:
            self.kubelet.script = default_script


@pytest.fixture(scope="session")
def real_kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealKube]:
    """etcd, kube-apiserver, kube-controller-manager and kube-scheduler on loopback, and a
    simulated kubelet for node `sim-0`. `make test` builds the binaries first (`make
    kube-control-plane`); where they are not built (pytest run by hand on a fresh
    machine) the tests are skipped, saying so: the cold build takes half an hour, longer
    than a test may."""
    bins = kube_real.cluster.bin_dir()
    if not all(
        (bins / b).exists() for b in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
    ):
        pytest.skip(
            f"the Kubernetes control plane is not built in {bins}: make kube-control-plane (docs/testing.md)"
        )
    cluster = kube_real.start(tmp_path_factory.mktemp("kube"), bins)
    kubelet = cluster.kubelet("sim-0")
    try:
        kubelet.start()
        cluster.admin.wait_for("/api/v1/nodes", _node_ready, name="sim-0")
        yield RealKube(cluster, kubelet)
    finally:
        kubelet.stop()
        cluster.stop()
    assert not kubelet.errors, f"the simulated kubelet failed: {kubelet.errors}"


def _node_ready(node: Obj) -> bool:
    """Ready, and without the taints the node lifecycle controller puts on a new node."""
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", ()))
    return ready and not node["spec"].get("taints")
