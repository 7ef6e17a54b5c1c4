"""The Kubernetes REST layer the jobs backend uses: it lives in paddlecloud.common.kube, so
the builder's Kaniko backend talks to the same API the same way (services import no
other service)."""

from paddlecloud.common.kube import RESOURCES, Gone, Kube, KubeError, Resource

__all__ = ["RESOURCES", "Gone", "Kube", "KubeError", "Resource"]
