"""The one place where the builder's backend is chosen: `builder.backend` in the config."""

from __future__ import annotations

from paddlecloud.common.config import Config

from .backend import BuildBackend


def create_build_backend(config: Config) -> BuildBackend:
    """The backend `builder.backend` names, not opened yet."""
    if config.builder.backend == "local":
        from .local import LocalBuildBackend

        return LocalBuildBackend(config)
    if config.builder.backend == "kaniko":
        from .kaniko import KanikoBuildBackend

        return KanikoBuildBackend(config)
    raise ValueError(f"builder.backend: unknown backend {config.builder.backend!r}")
