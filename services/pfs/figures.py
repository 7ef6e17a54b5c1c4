"""pfs's own figures on /metrics: uploads in flight, bytes uploaded, bytes stored in the datacenter."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from paddlecloud.common.storage.base import AbstractVolume
from paddlecloud.common.store import Store


class PfsFigures:
    """Counted by `Uploads` as bodies arrive; the others read when scraped."""

    def __init__(self, registry: CollectorRegistry, datacenter: str) -> None:
        self._datacenter = datacenter
        self.uploaded = Counter(
            "paddlecloud_uploaded_bytes",
            "Bytes received into uploads and made durable (tus PATCH and creation-with-upload bodies)",
            registry=registry,
        )
        self.in_flight = Gauge(
            "paddlecloud_uploads_in_flight",
            "Uploads created and not yet complete, failed, expired or terminated",
            registry=registry,
        )
        self.stored = Gauge(
            "paddlecloud_pfs_stored_bytes",
            "Bytes the users' homes hold in the datacenter (the usage quotas count), as last counted",
            ["datacenter"],
            registry=registry,
        )

    def count_in_flight(self, count: Callable[[], int]) -> None:
        """Read the uploads in flight from `count` at each scrape."""
        self.in_flight.set_function(lambda: float(count()))

    async def count_stored(self, store: Store, volume: AbstractVolume) -> None:
        """Sum every user's home usage (each cached by the volume as quota checks cache it)."""
        total = 0
        for user in await store.list_users():
            total += (await volume.usage(user.name)).bytes
        self.stored.labels(self._datacenter).set(total)
