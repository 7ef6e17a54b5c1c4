"""The real Kubernetes control plane for the tests: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler built from Kubernetes' own modules
(scripts/kube-control-plane.sh), started on loopback, with simulated kubelets for nodes
(docs/testing.md, "A real control plane")."""

from kube_real.client import ApiError, KubeClient, Reply
from kube_real.cluster import Cluster, build, start
from kube_real.kubelet import PodScript, SimulatedKubelet

__all__ = ["ApiError", "Cluster", "KubeClient", "PodScript", "Reply", "SimulatedKubelet", "build", "start"]
