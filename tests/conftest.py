"""Fixtures for every tier: no test may leave asyncio tasks running."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator

import pytest

# The session's HDFS (Hadoop's minicluster over WebHDFS), for the tests that ask for it.
from hdfs_cluster import real_hdfs  # noqa: F401

# The session's Ceph cluster, for the tests marked cephfs wherever they live.
from ceph_cluster import ceph_cluster, cephfs_tmp_path, other_client  # noqa: F401

# The session's Kubernetes control plane (tests/kube_real), for the tests that ask for it.
from kube_real.fixtures import real_kube  # noqa: F401


@pytest.fixture(autouse=True)
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves a task of its own behind when it ends."""
    before = set(asyncio.all_tasks())
    yield
    # Give tasks that are already finishing one turn of the loop to do so.
    await asyncio.sleep(0)
    leaked = [t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()]
    assert not leaked, f"test leaked asyncio tasks: {[t.get_name() for t in leaked]}"


# Session fixtures that start a whole cluster: the tests using one run on one pytest-xdist
# worker (`--dist loadgroup`), so a parallel run starts each cluster once, not per worker.
_ONE_WORKER = {
    "ceph_cluster": "ceph",
    "cephfs_tmp_path": "ceph",
    "other_client": "ceph",
    "real_kube": "kube-real",
    "real_hdfs": "hdfs",
}


# Groups whose tests may be dealt to this many workers, each starting a cluster of its own:
# the control plane starts in seconds and each of its tests makes its own server, so its
# tests need not run one after another on one worker (on one, they were the run's longest
# group: 1279 s for the whole suite, 1087 s once dealt to two). The
# tests of a module with module-scoped fixtures stay together, in the first.
_SPREAD = {"kube-real": 2}


def _module_bound(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(
        d.scope in ("module", "package", "class") for defs in info.name2fixturedefs.values() for d in defs
    )


# tryfirst: pytest-xdist reads the groups in its own collection hook on each worker.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    dealt: dict[str, int] = {}
    for item in items:  # the same order on every worker, so the same groups
        groups = {_ONE_WORKER[f] for f in getattr(item, "fixturenames", ()) if f in _ONE_WORKER}
        if item.get_closest_marker("cephfs"):
            groups.add("ceph")
        if groups:
            # A test needing two clusters would need them on one worker; none does yet.
            assert len(groups) == 1, f"{item.nodeid} needs {groups} on one worker"
            group = groups.pop()
            if group in _SPREAD and not _module_bound(item):
                turn = dealt.get(group, 0)
                dealt[group] = turn + 1
                group = f"{group}-{turn % _SPREAD[group] + 1}" if turn % _SPREAD[group] else group
            item.add_marker(pytest.mark.xdist_group(group))


_FIGURE = "figure"
_FIGURES: list[str] = []


@pytest.fixture
def report_figure(request: pytest.FixtureRequest):
    """Tests that measure something print it at the end of the run, even when they pass.
    The figure travels in the test's report, so it reaches the summary from an xdist worker."""

    def report(line: str) -> None:
        request.node.user_properties.append((_FIGURE, line))

    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        _FIGURES.extend(value for name, value in report.user_properties if name == _FIGURE)


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
