"""The one place where the jobs service's backend is chosen: `jobs.backend` in the config."""

from __future__ import annotations

from paddlecloud.common.config import Config
from paddlecloud.common.store import Store
from paddlecloud.common.volume import Root

from .backend import Backend


def create_backend(config: Config, root: Root, store: Store) -> Backend:
    """The backend `jobs.backend` names, not opened yet."""
    if config.jobs.backend == "local":
        from .local.backend import LocalBackend

        return LocalBackend(config, root)
    if config.jobs.backend == "kubernetes":
        from .kube.backend import KubernetesBackend

        return KubernetesBackend(config, store)
    raise ValueError(f"jobs.backend: unknown backend {config.jobs.backend!r}")
