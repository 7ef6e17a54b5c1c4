"""services/common/storage/cephfs.py where there is no CephFS: everything falls back, and the copy into a
quota realm keeps its promises on any filesystem; and the CephFS fixture says why it skips."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import ceph_cluster
from paddlecloud.common.storage import cephfs


def test_a_local_filesystem_is_not_cephfs_and_has_no_rstats_or_quota(tmp_path: Path) -> None:
    assert not cephfs.is_cephfs(tmp_path)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert cephfs.rstats(fd) is None
        assert cephfs.quota_of(fd) is None
    finally:
        os.close(fd)


async def test_quotas_do_nothing_off_cephfs(tmp_path: Path) -> None:
    (tmp_path / "home" / "alice").mkdir(parents=True)
    quotas = cephfs.CephQuotas(tmp_path)
    assert not quotas.enabled
    await quotas.sync("alice", 1024)
    assert not quotas.has_quota("alice")
    assert not quotas.crosses_realms("alice", "bob")


def _dirs(tmp_path: Path) -> tuple[int, int]:
    (tmp_path / "staging").mkdir()
    (tmp_path / "home").mkdir()
    return (
        os.open(tmp_path / "staging", os.O_RDONLY | os.O_DIRECTORY),
        os.open(tmp_path / "home", os.O_RDONLY | os.O_DIRECTORY),
    )


def test_place_by_copy_puts_a_whole_marked_copy_and_removes_the_source(tmp_path: Path) -> None:
    src_dir, dst_dir = _dirs(tmp_path)
    data = os.urandom(9 * 1024 * 1024 + 3)  # more than one copy block
    (tmp_path / "staging" / "u.part").write_bytes(data)
    try:
        cephfs.place_by_copy(
            src_dir, "u.part", dst_dir, "f.bin", marker="u", digest="0" * 64, overwrite=False, owner=None
        )
    finally:
        os.close(src_dir)
        os.close(dst_dir)
    placed = tmp_path / "home" / "f.bin"
    assert placed.read_bytes() == data
    assert os.listdir(tmp_path / "home") == ["f.bin"]
    assert not (tmp_path / "staging" / "u.part").exists()
    assert oct(placed.stat().st_mode & 0o777) == "0o644"
    fd = os.open(placed, os.O_RDONLY)
    try:
        assert cephfs.placed_by(fd) in ("u", None)  # None where the filesystem has no user xattrs
    finally:
        os.close(fd)


def test_place_by_copy_never_replaces_another_file_and_leaves_nothing_behind(tmp_path: Path) -> None:
    src_dir, dst_dir = _dirs(tmp_path)
    (tmp_path / "staging" / "u.part").write_bytes(b"new")
    (tmp_path / "home" / "f.bin").write_bytes(b"someone else's")
    try:
        with pytest.raises(FileExistsError):
            cephfs.place_by_copy(
                src_dir, "u.part", dst_dir, "f.bin", marker="u", digest="0" * 64, overwrite=False, owner=None
            )
    finally:
        os.close(src_dir)
        os.close(dst_dir)
    assert (tmp_path / "home" / "f.bin").read_bytes() == b"someone else's"
    assert os.listdir(tmp_path / "home") == ["f.bin"]
    assert (tmp_path / "staging" / "u.part").read_bytes() == b"new"


def test_place_by_copy_removes_its_partial_copy_when_a_write_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src_dir, dst_dir = _dirs(tmp_path)
    (tmp_path / "staging" / "u.part").write_bytes(os.urandom(8 * 1024 * 1024))
    writes = 0
    real_pwrite = os.pwrite

    def quota_after_one_block(fd: int, data: bytes, offset: int) -> int:
        nonlocal writes
        writes += 1
        if writes > 1:
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(cephfs.os, "pwrite", quota_after_one_block)
    try:
        with pytest.raises(OSError) as raised:
            cephfs.place_by_copy(
                src_dir, "u.part", dst_dir, "f.bin", marker="u", digest="0" * 64, overwrite=True, owner=None
            )
    finally:
        os.close(src_dir)
        os.close(dst_dir)
    assert raised.value.errno == errno.EDQUOT
    assert os.listdir(tmp_path / "home") == []
    assert (tmp_path / "staging" / "u.part").stat().st_size == 8 * 1024 * 1024


def test_the_cephfs_fixture_says_why_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ceph_cluster.shutil, "which", lambda _name: None)
    reason = ceph_cluster.unavailable()
    assert reason is not None and "ceph packages" in reason and "make system-deps" in reason
