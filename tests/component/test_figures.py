"""The operators' figures where a service run cannot show them: a job's waits in PENDING
timed once each, from the store's compare-and-set (a stale copy of a job included), and
a count a scrape refreshes at most once per period."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from paddlecloud.common.figures import ScrapeCache
from paddlecloud.common.store import Job, open_store
from paddlecloud.common.store.models import BUILDING, KILLED, PENDING, RUNNING, utcnow
from paddlecloud.jobs.figures import JobFigures
from paddlecloud.jobs.leadership import Leadership
from paddlecloud.jobs.records import JobRecord, JobRecords
from paddlecloud.jobs.spec import JobSpec


def pending(registry: CollectorRegistry) -> tuple[float | None, float | None]:
    """How many waits were timed, and their seconds together."""
    count = registry.get_sample_value("paddlecloud_job_pending_seconds_count")
    total = registry.get_sample_value("paddlecloud_job_pending_seconds_sum")
    return count, total


async def test_each_wait_in_pending_is_timed_once_even_from_a_stale_copy(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/store.db")
    await store.open()
    try:
        registry = CollectorRegistry()
        figures = JobFigures(registry, Leadership(acting=True))
        records = JobRecords(store, figures)
        spec = JobSpec.model_validate({"name": "waits", "package": "/pfs/dc1/home/alice/pkg"})
        submitted = utcnow() - timedelta(seconds=40)
        job = JobRecord(Job("j1", "alice", "waits", PENDING, spec.to_dict(), created_at=submitted), spec)
        await records.create(job)
        assert registry.get_sample_value("paddlecloud_jobs_submitted_total") == 1

        building = await records.transition(job, BUILDING, "building")
        assert building is not None
        count, total = pending(registry)
        assert count == 1 and total is not None and 40 <= total < 100  # since its submit
        # Built, it waits again: a second wait, timed from its return to PENDING.
        waiting = await records.transition(building, PENDING, "waiting for resources")
        assert waiting is not None
        # A stale copy (it still says BUILDING) leaves PENDING: the store's state decides.
        assert await records.transition(building, RUNNING, "started") is not None
        count, total = pending(registry)
        assert count == 2 and total is not None and total < 60  # the second wait: from its own start
        # A stale copy that says PENDING of a RUNNING job: nothing more is timed.
        assert await records.transition(job, KILLED, "killed") is not None
        assert pending(registry)[0] == 2
        assert registry.get_sample_value("paddlecloud_jobs_finished_total", {"state": KILLED}) == 1
    finally:
        await store.close()


async def test_a_scrape_counts_at_most_once_per_period_and_a_failed_count_is_tried_again() -> None:
    now = [100.0]
    counted: list[float] = []
    failing = [False]

    async def count() -> None:
        if failing[0]:
            raise OSError("the store is down")
        counted.append(now[0])

    cache = ScrapeCache("test_figure", count, 15.0, clock=lambda: now[0])
    await cache()
    now[0] += 14.0
    await cache()
    assert counted == [100.0]
    now[0] += 1.0
    failing[0] = True
    await cache()  # logged, not raised: the scrape still answers
    failing[0] = False
    await cache()  # the failed count did not start a new period
    assert counted == [100.0, 115.0]


@pytest.mark.parametrize("acting", [True, False])
async def test_only_the_acting_replica_reports_jobs_by_state(tmp_path: Path, acting: bool) -> None:
    store: Any = open_store(f"sqlite:///{tmp_path}/store.db")
    await store.open()
    try:
        spec = JobSpec.model_validate({"name": "one", "package": "/pfs/dc1/home/alice/pkg"})
        await store.create_job(Job("j1", "alice", "one", RUNNING, spec.to_dict()))
        registry = CollectorRegistry()
        figures = JobFigures(registry, Leadership(acting=acting))
        await figures.count(store)
        running = registry.get_sample_value("paddlecloud_jobs", {"state": RUNNING})
        assert running == (1 if acting else None)
        assert registry.get_sample_value("paddlecloud_jobs_acting") == (1 if acting else 0)
    finally:
        await store.close()
