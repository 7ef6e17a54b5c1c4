"""The HDFS volume through the storage interface, against Hadoop's real minicluster (WebHDFS)."""

from __future__ import annotations

import asyncio
import errno
import hashlib
from collections.abc import AsyncIterator

import pytest
from hdfs_cluster import RealHdfs

from paddlecloud.common.config import HdfsStorage
from paddlecloud.common.storage.hdfs import HdfsVolume
from paddlecloud.common.volume import PfsPath
from paddlecloud.common.webhdfs import HdfsPath, WebHdfs, chunks_of

DC = "dc1"


def home(user: str, *parts: str) -> PfsPath:
    return PfsPath(DC, "home", user, parts)


@pytest.fixture
async def volume(real_hdfs: RealHdfs) -> AsyncIterator[HdfsVolume]:
    """A volume over a fresh root, acting for users with doas as an operator sets it up."""
    client = WebHdfs(real_hdfs.url, real_hdfs.platform_user, timeout=30)
    vol = HdfsVolume(client, HdfsPath.parse(real_hdfs.fresh_root()), proxy_users=True, replication=1)
    try:
        yield vol
    finally:
        await vol.close()


async def put(vol: HdfsVolume, path: PfsPath, data: bytes) -> None:
    """A file written the way an upload lands: staged, appended, placed."""
    upload = hashlib.sha256(path.text.encode()).hexdigest()[:16]
    await vol.staging.create_part(upload)
    await vol.staging.append(upload, 0, chunks_of([data]))
    await vol.staging.place(upload, path, digest=hashlib.sha256(data).hexdigest(), overwrite=False)


async def test_tree_operations_and_ranged_read(volume: HdfsVolume, real_hdfs: RealHdfs) -> None:
    await volume.ensure_home("alice")
    status = real_hdfs.status(f"{volume.root.text}/home/alice")
    assert status is not None and status["owner"] == "alice" and status["permission"] == "700"

    assert await volume.mkdir(home("alice", "data", "sub"), parents=True) is True
    assert await volume.mkdir(home("alice", "data", "sub"), parents=True) is False
    with pytest.raises(FileExistsError):
        await volume.mkdir(home("alice", "data"), parents=False)
    with pytest.raises(FileNotFoundError):
        await volume.mkdir(home("alice", "no", "such"), parents=False)

    data = bytes(range(256)) * 40
    await put(volume, home("alice", "data", "sub", "x.bin"), data)
    st = await volume.stat(home("alice", "data", "sub", "x.bin"))
    assert (st.kind, st.size, st.mode) == ("file", len(data), 0o644)
    assert real_hdfs.status(f"{volume.root.text}/home/alice/data/sub/x.bin")["owner"] == "alice"  # type: ignore[index]

    download = await volume.open(home("alice", "data", "sub", "x.bin"))
    assert download is not None
    got = b"".join([c async for c in download.chunks(1000, 300)])
    await download.close()
    assert got == data[1000:1300]
    assert await volume.open(home("alice", "data")) is None

    entries = await volume.list(home("alice"), recursive=True, max_path_bytes=4096)
    assert [(e.path, e.stat.kind) for e in entries] == [
        ("/pfs/dc1/home/alice/data", "dir"),
        ("/pfs/dc1/home/alice/data/sub", "dir"),
        ("/pfs/dc1/home/alice/data/sub/x.bin", "file"),
    ]
    # The sha256 the upload gave is remembered in an xattr, valid while the file is unchanged.
    remembered = await volume.sha256(home("alice", "data", "sub", "x.bin"), compute=False)
    assert remembered is not None and remembered[1] == hashlib.sha256(data).hexdigest()

    await volume.move(home("alice", "data", "sub", "x.bin"), home("alice", "data", "y.bin"), overwrite=False)
    with pytest.raises(FileNotFoundError):
        await volume.stat(home("alice", "data", "sub", "x.bin"))
    await put(volume, home("alice", "z.bin"), b"z")
    with pytest.raises(FileExistsError):
        await volume.move(home("alice", "z.bin"), home("alice", "data", "y.bin"), overwrite=False)
    with pytest.raises(IsADirectoryError):
        await volume.move(home("alice", "z.bin"), home("alice", "data"), overwrite=True)
    await volume.move(home("alice", "z.bin"), home("alice", "data", "y.bin"), overwrite=True)
    assert (await volume.stat(home("alice", "data", "y.bin"))).size == 1

    usage = await volume.usage("alice")
    assert (usage.bytes, usage.files) == (1, 1)

    with pytest.raises(OSError) as refused:
        await volume.remove(home("alice", "data"), recursive=False)
    assert refused.value.errno == errno.ENOTEMPTY
    await volume.remove(home("alice", "data"), recursive=True)
    assert await volume.list(home("alice"), recursive=True, max_path_bytes=4096) == []


async def test_quota_refuses_with_edquot_and_leaves_nothing(volume: HdfsVolume) -> None:
    await volume.ensure_home("carol")
    await volume.quotas.sync("carol", 2 * 1024 * 1024)  # two of the minicluster's 1 MiB blocks
    await put(volume, home("carol", "small"), b"s" * 1000)
    staging = volume.staging
    await staging.create_part("big")
    await staging.append("big", 0, chunks_of([b"b" * (3 * 1024 * 1024)]))
    with pytest.raises(OSError) as refused:
        await staging.place("big", home("carol", "big"), digest="0" * 64, overwrite=False)
    assert refused.value.errno == errno.EDQUOT
    assert "quota" in str(refused.value) and "\tat org.apache" not in str(refused.value)
    with pytest.raises(FileNotFoundError):
        await volume.stat(home("carol", "big"))
    assert (await volume.usage("carol")).bytes == 1000
    # The quota lifted, the same staged part goes in.
    await volume.quotas.sync("carol", None)
    assert not volume.quotas.has_quota("carol")
    await staging.place("big", home("carol", "big"), digest="0" * 64, overwrite=False)
    assert (await volume.usage("carol")).bytes == 1000 + 3 * 1024 * 1024


async def test_webhdfs_refusals_carry_posix_errnos(volume: HdfsVolume, real_hdfs: RealHdfs) -> None:
    client, root = volume.client, volume.root
    await client.create(root.child("f"), b"x")
    with pytest.raises(FileExistsError):
        await client.create(root.child("f"), b"y")
    with pytest.raises(NotADirectoryError):
        await client.mkdirs(root.child("f", "sub"))
    await client.mkdirs(root.child("d", "e"))
    with pytest.raises(OSError) as refused:
        await client.delete(root.child("d"), recursive=False)
    assert refused.value.errno == errno.ENOTEMPTY
    # What a job writing straight into a home over its space quota meets.
    real_hdfs.make_dir(f"{root.text}/q", owner=real_hdfs.platform_user)
    await client.set_quota(root.child("q"), space=512 * 1024)  # less than one block
    with pytest.raises(OSError) as refused:
        await client.create(root.child("q", "big"), b"b" * 2048)
    assert refused.value.errno == errno.EDQUOT
    assert "quota" in str(refused.value) and "\tat org.apache" not in str(refused.value)
    with pytest.raises(FileNotFoundError):
        await client.status(root.child("missing"))


async def test_staging_appends_places_and_recognises_after_a_crash(volume: HdfsVolume) -> None:
    staging = volume.staging
    await staging.write_record("u1", b'{"id": "u1"}')
    marker = await staging.create_part("u1")
    assert await staging.part_size("u1") == 0
    size = await staging.append("u1", 0, chunks_of([b"hello ", b"hdfs"]))
    assert size == 10 == await staging.part_size("u1")
    size = await staging.append("u1", size, chunks_of([b"!!"]))
    assert size == 12
    await staging.truncate("u1", 10)  # not on a block boundary: HDFS recovers the block first
    assert await staging.append("u1", 10, chunks_of([b"."])) == 11
    digest = await staging.hash_part("u1")
    assert digest == hashlib.sha256(b"hello hdfs.").hexdigest()
    assert await staging.load_records() == [b'{"id": "u1"}']

    dest = home("dave", "in", "file.txt")
    await staging.place("u1", dest, digest=digest, overwrite=False)
    assert await staging.part_size("u1") is None
    assert await staging.placed("u1", marker, dest, 11) == digest
    assert await staging.placed("u1", marker + 1, dest, 11) is None

    # A second upload never replaces the first without overwrite.
    await staging.create_part("u2")
    await staging.append("u2", 0, chunks_of([b"other"]))
    with pytest.raises(FileExistsError):
        await staging.place("u2", dest, digest="0" * 64, overwrite=False)
    await staging.remove("u2", record=False)
    await staging.remove("u1", record=True)
    assert await staging.orphans(set(), older_than=2e9) == []


async def test_a_cut_append_keeps_what_arrived_and_uploads_survive_a_restart(
    volume: HdfsVolume, real_hdfs: RealHdfs
) -> None:
    async def cut_off() -> AsyncIterator[bytes]:
        yield b"a" * 1000
        yield b"b" * 24
        raise ConnectionResetError("the client went away")

    staging = volume.staging
    await staging.write_record("cut", b'{"id": "cut"}')
    await staging.create_part("cut")
    with pytest.raises(ConnectionResetError):
        await staging.append("cut", 0, cut_off())
    assert await staging.part_size("cut") == 1024
    # A new pfs process (a new volume, a new client) finds the upload where it was and goes on.
    client = WebHdfs(real_hdfs.url, real_hdfs.platform_user, timeout=30)
    restarted = HdfsVolume(client, volume.root, proxy_users=True, replication=1)
    try:
        assert await restarted.staging.load_records() == [b'{"id": "cut"}']
        assert await restarted.staging.append("cut", 1024, chunks_of([b"c"])) == 1025
        assert (
            await restarted.staging.hash_part("cut")
            == hashlib.sha256(b"a" * 1000 + b"b" * 24 + b"c").hexdigest()
        )
        await restarted.staging.remove("cut", record=True)
    finally:
        await restarted.close()


async def test_symlinks_are_never_followed_and_listings_page(volume: HdfsVolume, real_hdfs: RealHdfs) -> None:
    await put(volume, home("bob", "secret"), b"bob's")
    await volume.ensure_home("alice")
    for n in range(6):  # more than the minicluster's page of 4 entries
        await volume.mkdir(home("alice", f"d{n}"), parents=False)
    real_hdfs.make_symlink(f"{volume.root.text}/home/alice/link", f"{volume.root.text}/home/bob")

    for probe in (home("alice", "link"), home("alice", "link", "secret")):
        with pytest.raises(OSError) as refused:
            await volume.stat(probe)
        assert refused.value.errno == errno.ELOOP
    with pytest.raises(OSError) as refused:
        await volume.open(home("alice", "link", "secret"))
    assert refused.value.errno == errno.ELOOP
    with pytest.raises(OSError) as refused:
        await volume.move(home("alice", "d0"), home("alice", "link", "d0"), overwrite=False)
    assert refused.value.errno == errno.ELOOP

    entries = await volume.list(home("alice"), recursive=True, max_path_bytes=4096)
    assert [(e.name, e.stat.kind) for e in entries] == [
        *((f"d{n}", "dir") for n in range(6)),
        ("link", "symlink"),
    ]
    await volume.remove(home("alice", "link"), recursive=True)  # the link, not bob's home
    assert (await volume.stat(home("bob", "secret"))).size == 5


def test_a_volume_is_built_from_its_config_before_the_loop_runs() -> None:
    config = HdfsStorage(
        namenode="http://namenode.example:9870", root_path="/dc1", user="pc", proxy_users=True
    )
    volume = HdfsVolume.from_config(config)
    assert (volume.root.text, volume.client.user, volume.proxy_users, volume.replication) == (
        "/dc1",
        "pc",
        True,
        3,
    )
    asyncio.run(volume.close())


async def test_doas_keeps_homes_apart_and_bad_parts_are_refused(volume: HdfsVolume) -> None:
    await put(volume, home("bob", "secret"), b"bob's")
    await volume.ensure_home("alice")
    as_alice = volume.for_user("alice")
    with pytest.raises(PermissionError):
        await as_alice.stat(home("bob", "secret"))
    with pytest.raises(PermissionError):
        await as_alice.list(home("bob"), recursive=False, max_path_bytes=4096)
    assert (await volume.for_user("bob").stat(home("bob", "secret"))).size == 5

    for bad in ("..", ".", "", "a/b"):
        with pytest.raises(OSError) as refused:
            await volume.stat(PfsPath(DC, "home", "bob", (bad,)))
        assert refused.value.errno == errno.EINVAL


async def test_a_home_appears_owned_by_its_user_never_by_the_platform(real_hdfs: RealHdfs) -> None:
    """A request of the user's, made at any step of `ensure_home`, finds no home (a 404) or its
    own: never the home between its MKDIRS and its SETOWNER, still the platform's and 0700,
    which refused the user (a 403 to `ls` while the CLI's first `cp -r` made its directories).
    Two at once both succeed and leave nothing aside."""
    root = HdfsPath.parse(real_hdfs.fresh_root())
    probe = root.child("home", "alice", "data")
    seen: list[str] = []

    class Watched(WebHdfs):
        """The real client, asking as alice before each change it makes to the namespace."""

        async def _as_alice(self) -> None:
            try:
                await self.status(probe, doas="alice")
                seen.append("found")
            except OSError as exc:
                seen.append(type(exc).__name__)

        async def mkdirs(
            self, path: HdfsPath, *, permission: int | None = None, doas: str | None = None
        ) -> None:
            await self._as_alice()
            await super().mkdirs(path, permission=permission, doas=doas)

        async def set_owner(self, path: HdfsPath, owner: str, group: str | None = None) -> None:
            await self._as_alice()
            await super().set_owner(path, owner, group)

        async def rename(
            self, src: HdfsPath, dst: HdfsPath, *, overwrite: bool = False, doas: str | None = None
        ) -> None:
            await self._as_alice()
            await super().rename(src, dst, overwrite=overwrite, doas=doas)

    vol = HdfsVolume(
        Watched(real_hdfs.url, real_hdfs.platform_user, timeout=30), root, proxy_users=True, replication=1
    )
    try:
        await vol.check_writable()
        await vol.ensure_home("alice")
        await vol.client._as_alice()  # type: ignore[attr-defined]
        assert len(seen) >= 3 and set(seen) == {"FileNotFoundError"}, seen
        status = real_hdfs.status(f"{root.text}/home/alice")
        assert status is not None and status["owner"] == "alice" and status["permission"] == "700"

        await asyncio.gather(vol.ensure_home("bob"), vol.ensure_home("bob"))
        status = real_hdfs.status(f"{root.text}/home/bob")
        assert status is not None and status["owner"] == "bob" and status["permission"] == "700"
        assert [e.name for e in await vol.client.list(root.child(".uploads"))] == []
    finally:
        await vol.close()
