"""Fixtures for every tier: no test may leave asyncio tasks running."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator

import pytest

# The session's Ceph cluster, for the tests marked cephfs wherever they live.
from ceph_cluster import ceph_cluster, cephfs_tmp_path, other_client  # noqa: F401


@pytest.fixture(autouse=True)
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves a task of its own behind when it ends."""
    before = set(asyncio.all_tasks())
    yield
    # Give tasks that are already finishing one turn of the loop to do so.
    await asyncio.sleep(0)
    leaked = [t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()]
    assert not leaked, f"test leaked asyncio tasks: {[t.get_name() for t in leaked]}"


_FIGURES: list[str] = []


@pytest.fixture
def report_figure():
    """Tests that measure something print it at the end of the run, even when they pass."""

    def report(line: str) -> None:
        _FIGURES.append(line)

    return report


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if _FIGURES:
        terminalreporter.section("figures")
        for line in _FIGURES:
            terminalreporter.write_line(line)


@pytest.fixture
def remove_tmp_path_after(tmp_path):
    """For tests that build trees deeper than Python's recursion limit: pytest's own clean-up
    of old temporary directories walks them recursively and would crash a later run, so the
    test's directory is removed right after it with `rm -rf`, which walks iteratively."""
    yield
    subprocess.run(["rm", "-rf", str(tmp_path)], check=True)
