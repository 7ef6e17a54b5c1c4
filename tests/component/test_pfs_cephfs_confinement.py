"""Confinement and crashes on CephFS: the traversal suite and pfs killed mid-upload, on ceph-fuse.

openat2(RESOLVE_BENEATH) and the O_NOFOLLOW walk both resolve through FUSE here, each
symlink planted in a home being refused as on a local disk; a pfs killed with SIGKILL
resumes to the same sha256 from what CephFS kept. Taken whole from the local-disk suites,
with their state on the session's CephFS mount (tests/ceph_cluster.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_pfs_traversal import (
    pfs,
    test_links_themselves_are_listed_moved_and_removed_never_followed,
    test_raw_pre_encoded_queries,
    test_symlinks_out_of_the_home_are_refused_on_every_endpoint,
    test_traversal_spellings_are_bad_paths_on_every_endpoint,
    test_usage_names_a_user_never_a_path,
)
from test_pfs_uploads_process import (
    platform,
    test_a_broken_connection_keeps_what_arrived,
    test_kill_mid_upload_then_restart_and_resume,
)

pytestmark = pytest.mark.cephfs


@pytest.fixture
def tmp_path(cephfs_tmp_path: Path) -> Path:
    return cephfs_tmp_path
