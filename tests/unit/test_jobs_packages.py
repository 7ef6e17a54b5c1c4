"""The jobs service's `Packages` reads PFS through a `ReadVolume`: a package's kind and its
requirements.txt, an archive's by ranged reads of the storage, never the whole archive."""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from paddlecloud.common.errors import Invalid
from paddlecloud.common.storage.base import Children, Download, Entry, ReadVolume, Stat
from paddlecloud.common.storage.posix import PosixVolume
from paddlecloud.common.volume import PfsPath
from paddlecloud.jobs.packages import Packages
from support import tar_of

MIB = 1024 * 1024


class Counted(Download):
    """A download that counts the bytes read through it, and has no sendfile."""

    def __init__(self, inner: Download, volume: RangedReads) -> None:
        self.inner = inner
        self.stat = inner.stat
        self.volume = volume

    async def chunks(self, start: int, length: int) -> AsyncIterator[bytes]:
        async for chunk in self.inner.chunks(start, length):
            self.volume.read_bytes += len(chunk)
            yield chunk

    async def close(self) -> None:
        await self.inner.close()


class RangedReads(ReadVolume):
    """A POSIX volume seen only as a ReadVolume whose files are read by ranges (as HDFS's are)."""

    kind = "ranged"

    def __init__(self, inner: PosixVolume) -> None:
        self.inner = inner
        self.read_bytes = 0

    async def stat(self, path: PfsPath) -> Stat:
        return await self.inner.stat(path)

    async def open(self, path: PfsPath) -> Download | None:
        download = await self.inner.open(path)
        return None if download is None else Counted(download, self)

    async def list(self, path: PfsPath, *, recursive: bool, max_path_bytes: int) -> list[Entry]:
        return await self.inner.list(path, recursive=recursive, max_path_bytes=max_path_bytes)

    async def children(self, path: PfsPath, after: str | None, limit: int) -> Children | Entry:
        return await self.inner.children(path, after, limit)


@pytest.fixture
async def volume(tmp_path: Path) -> AsyncIterator[RangedReads]:
    posix = PosixVolume(tmp_path / "pfs")
    await posix.ensure_home("alice")
    yield RangedReads(posix)
    await posix.close()


def home(tmp_path: Path) -> Path:
    return tmp_path / "pfs" / "home" / "alice"


def pfs(*parts: str) -> PfsPath:
    return PfsPath("dc1", "home", "alice", parts)


@pytest.mark.parametrize("suffix", ["tar.gz", "zip"])
async def test_an_archives_requirements_are_read_by_ranges(
    volume: RangedReads, tmp_path: Path, suffix: str
) -> None:
    ballast = os.urandom(8 * MIB)  # incompressible: the archive stays this large
    if suffix == "zip":
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as z:
            z.writestr("requirements.txt", "numpy\n")
            z.writestr("data.bin", ballast)
        archive = buffer.getvalue()
    else:
        archive = tar_gz({"requirements.txt": b"numpy\n", "data.bin": ballast})
    (home(tmp_path) / f"pkg.{suffix}").write_bytes(archive)
    packages = Packages(volume)
    kind = await packages.kind(pfs(f"pkg.{suffix}"))
    assert await packages.requirements(pfs(f"pkg.{suffix}"), kind) == "numpy\n"
    # What it looked at, not the whole archive.
    assert 0 < volume.read_bytes < len(archive) // 2


async def test_a_directorys_requirements_and_a_symlink_out_refused(
    volume: RangedReads, tmp_path: Path
) -> None:
    (home(tmp_path) / "pkg").mkdir()
    (home(tmp_path) / "pkg" / "requirements.txt").write_text("paddlepaddle\n")
    os.symlink("/etc", home(tmp_path) / "out")
    packages = Packages(volume)
    assert await packages.kind(pfs("pkg")) == "dir"
    assert await packages.requirements(pfs("pkg"), "dir") == "paddlepaddle\n"
    with pytest.raises(Invalid, match="leads outside its area through a symlink"):
        await packages.must_exist("input", pfs("out", "passwd"))
    with pytest.raises(Invalid, match="does not exist on PFS"):
        await packages.must_exist("input", pfs("nothing"))


def tar_gz(entries: dict[str, bytes]) -> bytes:
    return tar_of(entries, "w:gz")


async def test_a_resubmitted_archive_is_not_read_again_until_it_changes(
    volume: RangedReads, tmp_path: Path
) -> None:
    # requirements.txt last, as a sorted package puts it after its data: the whole archive is read.
    archive = home(tmp_path) / "pkg.tar.gz"
    archive.write_bytes(tar_gz({"data.bin": os.urandom(2 * MIB), "requirements.txt": b"numpy\n"}))
    packages = Packages(volume)
    assert await packages.requirements(pfs("pkg.tar.gz"), "tar") == "numpy\n"
    first = volume.read_bytes
    assert first > 2 * MIB
    assert await packages.requirements(pfs("pkg.tar.gz"), "tar") == "numpy\n"
    assert volume.read_bytes == first  # remembered: not one byte read again

    # Rewritten in place (same inode) with other requirements: its size and mtime say so.
    with open(archive, "r+b") as f:
        f.truncate(0)
        f.write(tar_gz({"data.bin": os.urandom(2 * MIB), "requirements.txt": b"paddlepaddle==3.3.1\n"}))
    assert await packages.requirements(pfs("pkg.tar.gz"), "tar") == "paddlepaddle==3.3.1\n"
    assert volume.read_bytes > first

    # Another archive that has none is remembered as having none, and not confused with this one.
    (home(tmp_path) / "other.tar.gz").write_bytes(tar_gz({"main.py": b"print(1)\n"}))
    assert await packages.requirements(pfs("other.tar.gz"), "tar") is None
    read = volume.read_bytes
    assert await packages.requirements(pfs("other.tar.gz"), "tar") is None
    assert volume.read_bytes == read
    assert await packages.requirements(pfs("pkg.tar.gz"), "tar") == "paddlepaddle==3.3.1\n"
