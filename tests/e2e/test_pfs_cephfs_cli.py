"""The CLI against `paddlecloud server` with its data, PFS root included, on CephFS (ceph-fuse).

The tree copy both ways (with skips of identical files) and resumes after an interrupted
transfer, taken whole from test_pfs_cli.py with their state on the session's CephFS mount.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_pfs_cli import (
    test_a_tree_goes_up_is_listed_is_skipped_when_identical_and_comes_back,
    test_interrupted_transfers_resume_without_resending,
)

pytestmark = pytest.mark.cephfs


@pytest.fixture
def tmp_path(cephfs_tmp_path: Path) -> Path:
    return cephfs_tmp_path
