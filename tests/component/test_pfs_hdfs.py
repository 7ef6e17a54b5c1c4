"""The pfs suites again, with the datacenter in a real HDFS (Hadoop's minicluster over WebHDFS),
and what only HDFS has: homes owned by their users (doas), space quotas, symlinks never followed.

Each test gets a datacenter root of its own in the session's minicluster
(tests/hdfs_cluster.py; proxy users on, replication 1, 1 MiB blocks). The tests taken from
the local-disk suites are those that look at pfs only through its API; what the others
read off the disk is checked here through WebHDFS itself (`real_hdfs`), as the superuser.
A SIGKILL of pfs mid-upload and `paddlecloud cp -r` both ways are in
tests/e2e/test_pfs_hdfs_cli.py.
"""

from __future__ import annotations

import os
import urllib.error
from pathlib import Path
from typing import Any

import pytest
from hdfs_cluster import PLATFORM_USER, RealHdfs
from test_pfs_files import (  # the local-disk suites' fixtures and API-only tests, collected here again
    pfs,
    test_a_missing_path_is_400_naming_it,
    test_alice_cannot_touch_bobs_files,
    test_bad_json_is_400,
    test_bad_limits_and_cursors_are_400_naming_them,
    test_bidirectional_controls_are_refused_in_every_name,
    test_bodies_are_validated_strictly,
    test_mv_into_itself_and_missing_ends,
    test_paging_returns_every_entry_once_in_tree_order,
    test_queries_are_parsed_strictly,
    test_retiring_a_home_no_user_could_have_is_400_naming_it,
    test_usage_of_others_is_for_admins,
    test_your_own_home_is_empty_before_your_first_write,
)
from test_pfs_packages import built
from test_pfs_traversal import (
    test_raw_pre_encoded_queries,
    test_traversal_spellings_are_bad_paths_on_every_endpoint,
    test_usage_names_a_user_never_a_path,
)
from test_pfs_uploads import (
    Platform,
    make_platform,
    metadata,
    platform,
    problem,
    sha256,
    test_a_completed_upload_answers_a_retried_last_patch,
    test_bad_checksum_headers_are_400,
    test_options_advertises_the_protocol,
    test_quota_applies_when_a_deferred_length_is_declared,
    test_staged_chunks_are_appended_only_once_verified,
    test_uploads_belong_to_their_creator,
    test_wrong_content_type_is_415,
)

MIB = 2**20
API = "/api/v1/pfs"


@pytest.fixture
def hdfs_root(real_hdfs: RealHdfs) -> str:
    return real_hdfs.fresh_root()


@pytest.fixture
def pfs_settings(real_hdfs: RealHdfs, hdfs_root: str) -> dict[str, Any]:
    """pfs on the minicluster: every suite's service serves this test's root in HDFS."""
    return {
        "hdfs": {
            "namenode": real_hdfs.url,
            "root_path": hdfs_root,
            "user": PLATFORM_USER,
            "replication": 1,
            "proxy_users": True,
        }
    }


async def upload(platform: Platform, who: dict[str, str], path: str, data: bytes, **meta: str) -> Any:
    url = await platform.new_upload(who, path, len(data), **meta)
    return await platform.patch(who, url, 0, data)


async def test_an_upload_is_staged_then_placed_whole_and_owned_by_its_user(
    platform: Platform, real_hdfs: RealHdfs, hdfs_root: str
) -> None:
    alice = await platform.user("alice")
    data = os.urandom(3 * MIB + 5)
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/data/run 1.bin", len(data))
    upload_id = url.rsplit("/", 1)[1]
    for offset in range(0, 2 * MIB + 1, MIB + 1):
        resp = await platform.patch(alice, url, offset, data[offset : offset + MIB + 1])
        assert resp.status == 204, await resp.text()
    # Two chunks in: they wait in the staging area, nothing under the destination's name.
    assert real_hdfs.status(f"{hdfs_root}/home/alice/data/run 1.bin") is None
    staged = real_hdfs.status(f"{hdfs_root}/.uploads/{upload_id}.part")
    assert staged is not None and staged["length"] == 2 * (MIB + 1)
    assert await platform.offset(alice, url) == 2 * (MIB + 1)

    resp = await platform.patch(alice, url, 2 * (MIB + 1), data[2 * (MIB + 1) :])
    assert resp.status == 204, await resp.text()
    assert resp.headers["PaddleCloud-Sha256"] == sha256(data)
    placed = real_hdfs.status(f"{hdfs_root}/home/alice/data/run 1.bin")
    assert placed is not None and placed["length"] == len(data)
    # Made as alice (doas): HDFS's own permissions are hers, and her home is hers alone.
    assert placed["owner"] == "alice"
    home = real_hdfs.status(f"{hdfs_root}/home/alice")
    assert home is not None and (home["owner"], home["permission"]) == ("alice", "700")
    assert real_hdfs.read(f"{hdfs_root}/home/alice/data/run 1.bin") == data
    assert f"{upload_id}.part" not in real_hdfs.listdir(f"{hdfs_root}/.uploads")

    # Read back through pfs: whole, a range, and the sha256 the upload remembered.
    path = "/pfs/dc1/home/alice/data/run 1.bin"
    resp = await platform.client.get(f"{API}/files", params={"path": path}, headers=alice)
    assert resp.status == 200 and await resp.read() == data
    etag = resp.headers["ETag"]
    resp = await platform.client.get(
        f"{API}/files", params={"path": path}, headers={**alice, "Range": "bytes=1048570-2097160"}
    )
    assert resp.status == 206 and await resp.read() == data[1048570:2097161]
    assert resp.headers["Content-Range"] == f"bytes 1048570-2097160/{len(data)}"
    resp = await platform.client.get(
        f"{API}/files", params={"path": path}, headers={**alice, "If-None-Match": etag}
    )
    assert resp.status == 304
    resp = await platform.client.get(
        f"{API}/stat", params={"path": path, "checksum": "sha256"}, headers=alice
    )
    assert resp.status == 200 and (await resp.json())["sha256"] == sha256(data)


async def test_an_upload_resumes_after_pfs_restarts(
    platform: Platform, real_hdfs: RealHdfs, hdfs_root: str
) -> None:
    alice = await platform.user("alice")
    data = os.urandom(2 * MIB + 3)
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/resumed.bin", len(data))
    assert (await platform.patch(alice, url, 0, data[:MIB])).status == 204
    await platform.restart_pfs()  # a new volume, reading its records back from HDFS
    assert await platform.offset(alice, url) == MIB
    resp = await platform.patch(alice, url, MIB, data[MIB:])
    assert resp.status == 204, await resp.text()
    # The running hash was lost with the old process: the whole file was hashed again.
    assert resp.headers["PaddleCloud-Sha256"] == sha256(data)
    assert real_hdfs.read(f"{hdfs_root}/home/alice/resumed.bin") == data


async def test_a_write_over_the_homes_space_quota_is_refused_and_leaves_nothing(
    platform: Platform, real_hdfs: RealHdfs, hdfs_root: str
) -> None:
    quota = 4 * MIB
    alice = await platform.user("alice", storage=quota)
    first = os.urandom(MIB)
    assert (await upload(platform, alice, "/pfs/dc1/home/alice/kept.bin", first)).status == 204
    # The home carries the quota as an HDFS space quota (x replication, 1 here).
    summary = real_hdfs.content_summary(f"{hdfs_root}/home/alice")
    assert summary["spaceQuota"] == quota

    # Over the quota: refused at creation with the figures (a 4xx), nothing staged or placed.
    resp = await platform.create(alice, 4 * MIB, metadata(path="/pfs/dc1/home/alice/big.bin"))
    body = await problem(resp, 403, "ERR_QUOTA_EXCEEDED")
    assert body["limit"] == quota and body["used"] == MIB
    assert real_hdfs.listdir(f"{hdfs_root}/home/alice") == ["kept.bin"]
    assert not [n for n in real_hdfs.listdir(f"{hdfs_root}/.uploads") if n.endswith(".part")]

    # HDFS holds it for a job's own writes as well: a job writing 4 MiB more into the home
    # (straight to HDFS, as its node's mount would) is refused by the NameNode.
    with pytest.raises(urllib.error.HTTPError) as refused:
        real_hdfs.write_as("alice", f"{hdfs_root}/home/alice/from-a-job.bin", os.urandom(4 * MIB))
    assert b"Quota" in refused.value.read()
    assert real_hdfs.read(f"{hdfs_root}/home/alice/kept.bin") == first


async def test_a_whole_file_sha256_mismatch_places_nothing(
    platform: Platform, real_hdfs: RealHdfs, hdfs_root: str
) -> None:
    alice = await platform.user("alice")
    data = b"not what was announced"
    resp = await upload(platform, alice, "/pfs/dc1/home/alice/x.bin", data, sha256=sha256(b"other"))
    await problem(resp, 460, "ERR_CHECKSUM_MISMATCH")
    assert real_hdfs.status(f"{hdfs_root}/home/alice/x.bin") is None
    assert not [n for n in real_hdfs.listdir(f"{hdfs_root}/.uploads") if n.endswith(".part")]


async def test_a_package_is_checked_against_its_name_read_back_from_hdfs(
    platform: Platform, real_hdfs: RealHdfs, hdfs_root: str, tmp_path: Path
) -> None:
    alice = await platform.user("alice")
    identity, data = built(tmp_path, "a", {"train.py": "print(1)\n"})
    other, _ = built(tmp_path, "b", {"train.py": "print(2)\n"})
    packages = "/pfs/dc1/home/alice/.paddlecloud/packages"
    resp = await upload(platform, alice, f"{packages}/{other}.tar.gz", data)
    await problem(resp, 422, "ERR_PACKAGE_MISMATCH")
    assert real_hdfs.status(f"{hdfs_root}/home/alice/.paddlecloud/packages/{other}.tar.gz") is None
    assert not [n for n in real_hdfs.listdir(f"{hdfs_root}/.uploads") if n.endswith(".part")]
    assert (await upload(platform, alice, f"{packages}/{identity}.tar.gz", data)).status == 204
    assert real_hdfs.status(f"{hdfs_root}/home/alice/.paddlecloud/packages/{identity}.tar.gz") is not None


async def test_overwrite_is_asked_for_and_then_replaces(
    platform: Platform, real_hdfs: RealHdfs, hdfs_root: str
) -> None:
    alice = await platform.user("alice")
    path = "/pfs/dc1/home/alice/model.bin"
    assert (await upload(platform, alice, path, b"one")).status == 204
    resp = await platform.create(alice, 3, metadata(path=path))
    await problem(resp, 409, "ERR_ALREADY_EXISTS")
    assert (await upload(platform, alice, path, b"two", overwrite="1")).status == 204
    assert real_hdfs.read(f"{hdfs_root}/home/alice/model.bin") == b"two"


async def test_a_symlink_in_a_home_is_never_followed(
    platform: Platform, real_hdfs: RealHdfs, hdfs_root: str
) -> None:
    alice, bob = await platform.user("alice"), await platform.user("bob")
    assert (await upload(platform, bob, "/pfs/dc1/home/bob/secret.txt", b"bob's")).status == 204
    assert (await upload(platform, alice, "/pfs/dc1/home/alice/mine.txt", b"alice's")).status == 204
    # A link a job of alice's could leave (HDFS symlinks are on in the minicluster).
    real_hdfs.make_symlink(f"{hdfs_root}/home/alice/bobs", f"{hdfs_root}/home/bob")

    resp = await platform.client.get(f"{API}/ls", params={"path": "/pfs/dc1/home/alice"}, headers=alice)
    assert resp.status == 200
    entries = {e["name"]: e["type"] for e in (await resp.json())["entries"]}
    assert entries == {"bobs": "symlink", "mine.txt": "file"}
    through = "/pfs/dc1/home/alice/bobs/secret.txt"
    for endpoint in ("files", "stat", "ls"):
        resp = await platform.client.get(f"{API}/{endpoint}", params={"path": through}, headers=alice)
        assert resp.status in (403, 404), (endpoint, resp.status)
        assert b"bob's" not in await resp.read()
    resp = await platform.create(alice, 4, metadata(path="/pfs/dc1/home/alice/bobs/planted.txt"))
    if resp.status == 201:  # refused at placement, then: never written through the link
        resp = await platform.patch(alice, resp.headers["Location"], 0, b"evil")
    assert resp.status in (403, 404, 409), resp.status
    assert real_hdfs.listdir(f"{hdfs_root}/home/bob") == ["secret.txt"]
    # The link itself is removed, never what it points to.
    resp = await platform.client.delete(
        f"{API}/files", params={"path": "/pfs/dc1/home/alice/bobs", "recursive": "1"}, headers=alice
    )
    assert resp.status == 204, await resp.text()
    assert real_hdfs.listdir(f"{hdfs_root}/home/bob") == ["secret.txt"]


async def test_trees_are_made_listed_moved_and_removed(
    platform: Platform, real_hdfs: RealHdfs, hdfs_root: str
) -> None:
    alice = await platform.user("alice")
    resp = await platform.client.post(
        f"{API}/mkdir", json={"path": "/pfs/dc1/home/alice/a/b/c", "parents": True}, headers=alice
    )
    assert resp.status == 201, await resp.text()
    files = {"a/one.txt": b"1", "a/b/two.txt": b"22", "a/b/c/three.txt": b"333", "a/b/c/empty": b""}
    for name, data in files.items():
        if data:
            assert (await upload(platform, alice, f"/pfs/dc1/home/alice/{name}", data)).status == 204
        else:
            resp = await platform.create(alice, 0, metadata(path=f"/pfs/dc1/home/alice/{name}"))
            assert resp.status == 201
    resp = await platform.client.get(
        f"{API}/ls", params={"path": "/pfs/dc1/home/alice/a", "recursive": "1"}, headers=alice
    )
    listed = {
        e["path"].removeprefix("/pfs/dc1/home/alice/"): (e["type"], e["size"])
        for e in (await resp.json())["entries"]
    }
    assert listed == {
        "a/b": ("dir", 0),
        "a/b/c": ("dir", 0),
        **{name: ("file", len(data)) for name, data in files.items()},
    }
    resp = await platform.client.post(
        f"{API}/mv",
        json={"src": "/pfs/dc1/home/alice/a/b", "dst": "/pfs/dc1/home/alice/moved"},
        headers=alice,
    )
    assert resp.status == 200, await resp.text()
    assert real_hdfs.read(f"{hdfs_root}/home/alice/moved/c/three.txt") == b"333"
    resp = await platform.client.delete(
        f"{API}/files", params={"path": "/pfs/dc1/home/alice/moved"}, headers=alice
    )
    body = await resp.json()
    assert resp.status == 409 and "not empty" in body["detail"].lower(), body
    resp = await platform.client.delete(
        f"{API}/files", params={"path": "/pfs/dc1/home/alice/moved", "recursive": "1"}, headers=alice
    )
    assert resp.status == 204
    assert real_hdfs.listdir(f"{hdfs_root}/home/alice") == ["a"]
    resp = await platform.client.get(f"{API}/usage", headers=alice)
    usage = await resp.json()
    assert (usage["bytes"], usage["files"]) == (1, 1), usage
