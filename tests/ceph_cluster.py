"""A real CephFS for the tests: one single-node cluster per session, mounted with ceph-fuse.

`scripts/ceph-cluster.sh` starts it under a temporary directory and stops it again; the
`cephfs_mount` fixture owns it for the session, so nothing outlives the tests. Where the
cluster cannot run (no Ceph packages, not root, no /dev/fuse) the tests that need it are
skipped and say why; where it should run and does not start, they fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "ceph-cluster.sh"
_DAEMONS = ("ceph-mon", "ceph-mgr", "ceph-osd", "ceph-mds", "ceph-fuse", "monmaptool")


def unavailable() -> str | None:
    """Why a Ceph cluster cannot run on this machine, or None when it can."""
    missing = [tool for tool in _DAEMONS if shutil.which(tool) is None]
    if missing:
        return (
            f"CephFS tests need Debian's ceph packages ({', '.join(missing)} missing; "
            "`make system-deps` installs them as root)"
        )
    if os.geteuid() != 0:
        return "CephFS tests need root (the cluster's daemons and the ceph-fuse mount)"
    if not os.path.exists("/dev/fuse"):
        return "CephFS tests need /dev/fuse for ceph-fuse"
    return None


class CephCluster:
    """A running cluster: its config, and the CephFS root mounted with ceph-fuse."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.conf = directory / "ceph.conf"
        self.mount = directory / "mnt"

    @classmethod
    def start(cls, directory: Path) -> CephCluster:
        result = subprocess.run(
            [str(SCRIPT), "up", str(directory)], capture_output=True, text=True, timeout=180
        )
        if result.returncode != 0:
            raise RuntimeError(f"the Ceph cluster did not start ({result.returncode}):\n{result.stderr}")
        return cls(directory)

    def mount_client(self, name: str) -> Path:
        """One more ceph-fuse client of the same filesystem, as another node would mount it."""
        subprocess.run(
            [str(SCRIPT), "mount", str(self.directory), name], check=True, capture_output=True, timeout=60
        )
        return self.directory / f"mnt-{name}"

    def stop(self) -> None:
        subprocess.run([str(SCRIPT), "down", str(self.directory)], check=True, timeout=120)


@pytest.fixture(scope="session")
def ceph_cluster() -> Iterator[CephCluster]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    # Short, under /tmp: the daemons' admin sockets must fit in a unix socket path.
    directory = Path(tempfile.mkdtemp(prefix="pc-ceph-"))
    try:
        cluster = CephCluster.start(directory)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        subprocess.run([str(SCRIPT), "down", str(directory)], check=False, timeout=120)
        pytest.fail(str(exc))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def other_client(ceph_cluster: CephCluster) -> Path:
    """The same CephFS through a second ceph-fuse client (a job's node); gone with the cluster."""
    return ceph_cluster.mount_client("b")


@pytest.fixture
def cephfs_tmp_path(ceph_cluster: CephCluster) -> Iterator[Path]:
    """A fresh directory on the CephFS mount for one test, removed after it."""
    path = ceph_cluster.mount / "tests" / uuid.uuid4().hex
    path.mkdir(parents=True)
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)
