"""The one place where the jobs service's backend is chosen: `jobs.backend` in the config."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from paddlecloud.common.config import Config
from paddlecloud.common.store import Store
from paddlecloud.common.volume import Root

from .backend import Backend
from .leadership import Leadership

# Who acts among replicas: given this replica's Leadership and what acting means (an async
# context manager factory), a context for the service's life in which it acts once elected.
Election = Callable[
    [Leadership, Callable[[], AbstractAsyncContextManager[None]]], AbstractAsyncContextManager[None]
]


def create_backend(config: Config, root: Root, store: Store) -> Backend:
    """The backend `jobs.backend` names, not opened yet."""
    if config.jobs.backend == "local":
        from .local.backend import LocalBackend

        return LocalBackend(config, root)
    if config.jobs.backend == "kubernetes":
        from .kube.backend import KubernetesBackend

        return KubernetesBackend(config, store)
    raise ValueError(f"jobs.backend: unknown backend {config.jobs.backend!r}")


def unrunnable(config: Config) -> str | None:
    """Why no job can run from this datacenter with this backend, or None.

    The local backend runs a job's processes on this host against the datacenter's POSIX
    root (its package, input and output are paths there). An HDFS datacenter (`pfs.hdfs`)
    has no such root here, so a job would start and find none of its files: the submit is
    refused instead, before anything is recorded. On Kubernetes each node mounts HDFS and
    job pods see it by hostPath (config validation holds the volume to that kind).
    """
    if config.jobs.backend == "local" and config.pfs.hdfs is not None:
        return (
            f"datacenter {config.pfs.datacenter!r} keeps its files in HDFS, which jobs on this "
            "machine cannot see (the local backend runs jobs on a POSIX root); run the jobs of an "
            "HDFS datacenter on Kubernetes (jobs.backend kubernetes), where each node mounts HDFS "
            '(docs/storage.md, "What jobs see")'
        )
    return None


def create_election(config: Config) -> Election | None:
    """How replicas elect the one that acts, or None where one process acts alone: the
    kubernetes backend with `jobs.kubernetes.leader_election.enabled` (a Lease)."""
    if config.jobs.backend != "kubernetes" or not config.jobs.kubernetes.leader_election.enabled:
        return None
    from .kube.leader import campaign

    settings = config.jobs.kubernetes

    def elect(
        leadership: Leadership, acting: Callable[[], AbstractAsyncContextManager[None]]
    ) -> AbstractAsyncContextManager[None]:
        return campaign(settings, leadership, acting)

    return elect
