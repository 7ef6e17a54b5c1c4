"""The jobs service's own figures on /metrics: jobs by state, time PENDING, submits and ends.

Several replicas (Kubernetes, leader election): only the acting replica submits and
moves jobs, so the counters and the histogram move on it alone, and only it reports
`paddlecloud_jobs` (every replica reads the same store: were followers to report it
too, a sum over replicas would count each job twice). `paddlecloud_jobs_acting` says
which replica acts.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from paddlecloud.common.store import Store
from paddlecloud.common.store.models import JOB_STATES, TERMINAL_STATES, utcnow

from .leadership import Leadership

# From seconds (a job that starts at once) to a day (one queued for a busy cluster).
PENDING_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 24 * 3600)


class JobFigures:
    """The figures, registered in the app's registry; `paddlecloud_jobs` is this
    collector's, from the last `count`."""

    def __init__(self, registry: CollectorRegistry, leadership: Leadership) -> None:
        self._leadership = leadership
        self._counts: dict[str, int] | None = None
        self.submitted = Counter(
            "paddlecloud_jobs_submitted",
            "Jobs submitted (recorded PENDING) by this replica",
            registry=registry,
        )
        self.finished = Counter(
            "paddlecloud_jobs_finished",
            "Jobs that reached a final state on this replica, by that state",
            ["state"],
            registry=registry,
        )
        for state in sorted(TERMINAL_STATES):
            self.finished.labels(state)  # every final state shows, at 0, before the first
        self.pending = Histogram(
            "paddlecloud_job_pending_seconds",
            "Time a job spent PENDING, observed when it left PENDING (for BUILDING or RUNNING, "
            "or a final state); a job that waits again after its build is observed again",
            buckets=PENDING_BUCKETS,
            registry=registry,
        )
        acting = Gauge(
            "paddlecloud_jobs_acting",
            "1 on the jobs service replica that acts (the leader), 0 on a standby",
            registry=registry,
        )
        acting.set_function(lambda: float(leadership.acting))
        registry.register(self)

    def left_pending(self, since: datetime) -> None:
        self.pending.observe(max(0.0, (utcnow() - since).total_seconds()))

    async def count(self, store: Store) -> None:
        """Count the jobs by state from the store (the acting replica only)."""
        self._counts = await store.count_jobs_by_state() if self._leadership.acting else None

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield self._family()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = self._family()
        if self._counts is not None and self._leadership.acting:
            for state in JOB_STATES:
                family.add_metric([state], self._counts.get(state, 0))
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "paddlecloud_jobs",
            "Jobs in the store by state, every user's history included (reported by the acting replica)",
            labels=["state"],
        )
