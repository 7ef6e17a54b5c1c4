"""The builder's own figures on /metrics: its cache's hits and misses, and builds by how they ended."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from paddlecloud.common.store.models import FAILED, SUCCEEDED


class BuildFigures:
    """Counted by `Builder` as requests are answered and builds end."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.hits = Counter(
            "paddlecloud_build_cache_hits",
            "Build requests answered without a new build: an environment built before "
            "(found by its cache key), or the identical build already under way",
            registry=registry,
        )
        self.misses = Counter(
            "paddlecloud_build_cache_misses",
            "Build requests that started a new build (no environment of their cache key)",
            registry=registry,
        )
        self.finished = Counter(
            "paddlecloud_builds_finished",
            "Builds that ended, by their final state (SUCCEEDED or FAILED)",
            ["state"],
            registry=registry,
        )
        for state in (SUCCEEDED, FAILED):
            self.finished.labels(state)
