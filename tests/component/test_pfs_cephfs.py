"""The pfs suites again, with the datacenter root on a real CephFS (ceph-fuse), and what only CephFS has.

Everything a test keeps (config, store, the PFS root) lives in a directory of its own on the
session's CephFS mount (tests/ceph_cluster.py). The tests taken from the local-disk suites are a
representative set (uploads, resumes, checksums, ranged downloads, confinement, atomic
placement, expiry, xattrs): the whole of them passes here too, in about two and a half
minutes, which `make test` on two cores cannot afford beside everything else.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest
from test_pfs_files import (  # the local-disk suite's fixtures and tests, collected here again
    Pfs,
    pfs,
    sending,
    test_a_file_cut_short_while_it_is_sent_cuts_the_download,
    test_download_a_file_with_its_validators,
    test_if_range_applies_the_range_only_to_the_same_version,
    test_ls_recursive_includes_every_descendant_but_never_enters_symlinks,
    test_mkdir_with_a_file_or_symlink_in_the_way,
    test_mv_never_replaces_without_overwrite_and_never_a_directory,
    test_one_range_is_206,
    test_ranges_past_four_gibibytes,
    test_rm_r,
    test_stat_sha256_is_computed_or_remembered,
    tree,
)
from test_pfs_uploads import (
    Platform,
    make_platform,
    metadata,
    platform,
    problem,
    sha256,
    test_a_crash_after_the_rename_is_finished_by_the_next_head,
    test_a_symlink_out_of_the_home_is_not_followed,
    test_an_upload_resumes_across_a_restart,
    test_chunk_checksums,
    test_creation_with_upload,
    test_deferred_length,
    test_destination_taken_during_the_upload_is_409_at_completion,
    test_expired_uploads_are_collected,
    test_orphaned_staging_files_are_collected,
    test_overwrite_replaces_the_destination_atomically,
    test_parents_are_created_and_public_is_for_admins,
    test_quota_counts_the_home_and_unfinished_uploads,
    test_tuspy_uploads_and_resumes_through_the_gateway,
    test_upload_cut_at_random_points_then_resumed_is_byte_identical,
    test_whole_file_sha256_mismatch_is_460_and_nothing_appears,
)

from ceph_cluster import CephCluster
from paddlecloud.common.storage import cephfs, posix
from paddlecloud.pfs.app import QUOTA_TASK
from paddlecloud.pfs.keys import QUOTAS, VOLUME
from support import wait_until

pytestmark = pytest.mark.cephfs

MIB = 2**20


@pytest.fixture
def tmp_path(cephfs_tmp_path: Path) -> Path:
    """Every test here keeps its state on CephFS: the fixtures above all build on tmp_path."""
    return cephfs_tmp_path


def quota_xattr(home: Path) -> int | None:
    fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return cephfs.quota_of(fd)
    finally:
        os.close(fd)


def rbytes(home: Path) -> int:
    """The bytes beneath `home` as Ceph counts them for its quota."""
    return int(os.getxattr(home, "ceph.dir.rbytes"))


async def set_quota(platform: Platform, user: str, storage: str | int | None) -> None:
    admin = await platform.user("root", admin=True)
    resp = await platform.client.put(f"/api/v1/users/{user}/quota", json={"storage": storage}, headers=admin)
    assert resp.status == 200, await resp.text()


async def usage_of(platform: Platform, who: dict[str, str]) -> dict[str, int | None]:
    resp = await platform.client.get("/api/v1/pfs/usage", headers=who)
    assert resp.status == 200, await resp.text()
    return dict(await resp.json())


async def test_the_root_is_recognised_as_cephfs(platform: Platform, tmp_path: Path) -> None:
    assert cephfs.is_cephfs(platform.root)
    assert not cephfs.is_cephfs(Path("/tmp"))
    # The quota task runs only here.
    assert any(t.get_name() == QUOTA_TASK for t in asyncio.all_tasks())


async def test_a_storage_quota_becomes_the_homes_ceph_quota(platform: Platform) -> None:
    alice = await platform.user("alice", storage=8 * MIB)
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/first.bin", 10)
    assert (await platform.patch(alice, url, 0, b"0123456789")).status == 204
    # The home was created by that upload, and given the quota at once.
    assert quota_xattr(platform.home("alice")) == 8 * MIB
    # An admin changes it through the gateway; pfs applies it when it next looks at the quota.
    await set_quota(platform, "alice", "16Mi")
    assert (await usage_of(platform, alice))["limit"] == 16 * MIB
    assert quota_xattr(platform.home("alice")) == 16 * MIB
    await set_quota(platform, "alice", None)
    assert (await usage_of(platform, alice))["limit"] is None
    assert quota_xattr(platform.home("alice")) is None


async def test_the_periodic_pass_gives_quotas_to_homes_no_request_touched(platform: Platform) -> None:
    await platform.user("carol", storage=4 * MIB)
    platform.home("carol").mkdir(parents=True)  # as a job or `mkdir` would make it
    quotas = platform.pfs_server[0].app[QUOTAS]
    await quotas.sync_all(platform.store)
    assert quota_xattr(platform.home("carol")) == 4 * MIB
    # Whoever owns a home can lift its quota through a mount whose client may set quotas
    # (a job on the local backend can): the next pass puts it back.
    os.setxattr(platform.home("carol"), cephfs.QUOTA_MAX_BYTES, b"0")
    await quotas.sync_all(platform.store)
    assert quota_xattr(platform.home("carol")) == 4 * MIB


async def test_usage_reads_recursive_statistics_without_walking(
    platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = await platform.user("alice")
    home = platform.home("alice")
    for i in range(30):
        (home / f"d{i % 3}" / f"e{i % 5}").mkdir(parents=True, exist_ok=True)
        (home / f"d{i % 3}" / f"e{i % 5}" / f"f{i}").write_bytes(b"x" * (i + 1))
    expected = {"bytes": sum(range(1, 31)), "files": 30}

    def no_walk(_fd: int) -> posix.HomeUsage:
        raise AssertionError("usage walked the tree on CephFS")

    monkeypatch.setattr(posix, "_walk_allocated", no_walk)
    assert await wait_until_usage(platform, alice, expected)


async def wait_until_usage(platform: Platform, who: dict[str, str], expected: dict[str, int]) -> bool:
    """The MDS propagates recursive statistics lazily: wait for them, never for a time."""
    deadline = asyncio.get_running_loop().time() + 120  # a bound, not a timing
    while True:
        platform.pfs_server[0].app[VOLUME].forget_usage("alice")
        got = await usage_of(platform, who)
        if {k: got[k] for k in expected} == expected:
            return True
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"usage stayed {got}, expected {expected}")
        await asyncio.sleep(0.1)


async def test_a_write_over_the_ceph_quota_is_507_and_nothing_is_lost(platform: Platform) -> None:
    """pfs's own accounting allows the upload; Ceph refuses it at placement, since a job filled
    the home meanwhile. The 507 has the numbers, the home keeps what it had, and the received
    upload stays whole, to be placed once there is room."""
    quota = 4 * MIB
    alice = await platform.user("alice", storage=quota)
    first = os.urandom(MIB)
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/kept.bin", len(first))
    assert (await platform.patch(alice, url, 0, first)).status == 204
    assert quota_xattr(platform.home("alice")) == quota

    data = os.urandom(2 * MIB)
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/late.bin", len(data))  # fits: 1 + 2 of 4
    # A job writes 2 MiB into the home directly, which pfs does not count as it goes.
    job_file = platform.home("alice") / "from-a-job.bin"
    job_file.write_bytes(b"j" * (2 * MIB))
    # Ceph enforces a quota from the recursive statistics its MDS propagates lazily: the job's
    # bytes count once they show there. Under load that took long enough for the placement to
    # slip in first (1 run in a full `make test` at load 11); waited for, never a time.
    assert await wait_until(lambda: rbytes(platform.home("alice")) >= 3 * MIB, 120)
    resp = await platform.patch(alice, url, 0, data)
    body = await problem(resp, 507, "ERR_STORAGE_FULL")
    assert body["limit"] == quota and body["requested"] == len(data)
    assert body["used"] >= 3 * MIB
    assert "of 4.0 MiB, 2.0 MiB more requested)" in body["detail"], body["detail"]  # not in bytes
    # Nothing half-written: the destination is absent, no temporary file is left beside it,
    # and what was there before is intact.
    assert sorted(os.listdir(platform.home("alice"))) == ["from-a-job.bin", "kept.bin"]
    assert (platform.home("alice") / "kept.bin").read_bytes() == first
    # What was received is durable and still the upload's: once there is room, it is placed.
    part = platform.root / ".uploads" / (url.rsplit("/", 1)[1] + ".part")
    assert hashlib.sha256(part.read_bytes()).hexdigest() == sha256(data)
    job_file.unlink()
    head = await platform.client.head(url, headers=alice)
    assert head.status == 200, head.status
    assert head.headers["PaddleCloud-Sha256"] == sha256(data)
    assert (platform.home("alice") / "late.bin").read_bytes() == data
    assert sorted(os.listdir(platform.home("alice"))) == ["kept.bin", "late.bin"]


async def test_sizes_and_contents_agree_across_clients(
    platform: Platform, ceph_cluster: CephCluster, other_client: Path
) -> None:
    """What pfs placed through one ceph-fuse client, another (a job's node) sees whole at once,
    and what that one writes pfs serves whole once it is closed."""
    alice = await platform.user("alice")
    data = os.urandom(3 * MIB + 17)
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/shared.bin", len(data))
    assert (await platform.patch(alice, url, 0, data)).status == 204
    there = other_client / platform.home("alice").relative_to(ceph_cluster.mount)
    assert (there / "shared.bin").stat().st_size == len(data)
    assert hashlib.sha256((there / "shared.bin").read_bytes()).hexdigest() == sha256(data)

    written = os.urandom(2 * MIB + 5)
    (there / "from-b.bin").write_bytes(written)
    resp = await platform.client.get(
        "/api/v1/pfs/files", params={"path": "/pfs/dc1/home/alice/from-b.bin"}, headers=alice
    )
    assert resp.status == 200
    assert int(resp.headers["Content-Length"]) == len(written)
    assert await resp.read() == written
    assert await wait_until(
        lambda: (platform.home("alice") / "from-b.bin").stat().st_size == len(written), 30
    )


async def test_a_crash_after_a_copy_into_a_quota_realm_is_finished_by_the_next_head(
    platform: Platform,
) -> None:
    """Into a home with a Ceph quota, a finished upload is copied (not renamed) into place;
    a crash between that copy's rename and the staging file's removal leaves both behind.
    The copy carries the upload's id, so the next HEAD finishes the upload instead of
    finding its destination taken."""
    alice = await platform.user("alice", storage=8 * MIB)
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/first.bin", 1)
    assert (await platform.patch(alice, url, 0, b"1")).status == 204
    assert quota_xattr(platform.home("alice")) == 8 * MIB
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/copied.bin", 5)
    upload_id = url.rsplit("/", 1)[1]
    assert (await platform.patch(alice, url, 0, b"abcd")).status == 204
    part = platform.root / ".uploads" / f"{upload_id}.part"
    with part.open("ab") as f:
        f.write(b"e")
    placed = platform.home("alice") / "copied.bin"
    placed.write_bytes(b"abcde")
    os.setxattr(placed, cephfs.UPLOAD_XATTR, upload_id.encode())
    await platform.restart_pfs()
    head = await platform.client.head(url, headers=alice)
    assert head.status == 200, head.status
    assert head.headers["PaddleCloud-Sha256"] == sha256(b"abcde")
    assert placed.read_bytes() == b"abcde"
    assert not part.exists()
    assert sorted(os.listdir(platform.home("alice"))) == ["copied.bin", "first.bin"]


async def test_an_admins_mv_out_of_or_into_a_quota_realm_is_409(platform: Platform) -> None:
    admin = await platform.user("root", admin=True)
    alice = await platform.user("alice", storage=8 * MIB)
    bob = await platform.user("bob")
    for who, user in ((alice, "alice"), (bob, "bob")):
        url = await platform.new_upload(who, f"/pfs/dc1/home/{user}/mine.bin", 3)
        assert (await platform.patch(who, url, 0, user[:3].encode())).status == 204
    assert quota_xattr(platform.home("alice")) == 8 * MIB
    for src, dst in (("alice", "bob"), ("bob", "alice")):
        resp = await platform.client.post(
            "/api/v1/pfs/mv",
            json={"src": f"/pfs/dc1/home/{src}/mine.bin", "dst": f"/pfs/dc1/home/{dst}/moved.bin"},
            headers=admin,
        )
        assert resp.status == 409, await resp.text()
        assert "quota" in (await resp.json())["detail"]
    assert sorted(os.listdir(platform.home("alice"))) == ["mine.bin"]
    assert sorted(os.listdir(platform.home("bob"))) == ["mine.bin"]
    # Within one home, a move is the rename it always was.
    resp = await platform.client.post(
        "/api/v1/pfs/mv",
        json={"src": "/pfs/dc1/home/alice/mine.bin", "dst": "/pfs/dc1/home/alice/renamed.bin"},
        headers=alice,
    )
    assert resp.status == 200, await resp.text()
    assert (platform.home("alice") / "renamed.bin").read_bytes() == b"ali"
