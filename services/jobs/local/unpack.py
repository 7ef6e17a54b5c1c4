"""Unpacking a job's archive package (tar, gzip'd or not, or zip) with a bound on what it writes.

The jobs service unpacks as root, onto the platform's own disk, an archive a user
uploaded: a few MiB of compressed zeros can declare gigabytes. So the archive's
headers are read first and an archive that declares more than the limit is refused
before anything is written; then the members are written as the headers are read
again, counted once more, so an archive that changed in between is stopped too.
Each member costs its size rounded up to whole 4 KiB blocks, and at least one block
(an empty file or a directory still takes an inode and a directory entry), which is
about what the filesystem allocates for it.

Names: tar members go through tarfile's `data` filter (no absolute names, no `..`, no
links out of the target, no devices, no set-uid bits); zip names are checked the same
way and zip archives hold no links. A zip member's data is cut by zipfile at the size
its header declares (and a wrong size then fails its CRC check), so the sizes counted
before writing are the sizes written.
"""

from __future__ import annotations

import tarfile
import zipfile
from pathlib import Path
from typing import BinaryIO

from paddlecloud.common.quantity import format_bytes, readable_bytes

BLOCK = 4096
LIMIT_SETTING = "jobs.package_max_bytes"


class PackageTooLarge(ValueError):
    """The archive unpacks to more than a package may take."""


def charge(size: int) -> int:
    """What one member costs: its size in whole blocks, at least one."""
    return max(1, -(-size // BLOCK)) * BLOCK


def _too_large(total: int, limit: int, *, declared: bool) -> PackageTooLarge:
    how = "its headers declare" if declared else "its members reached"
    return PackageTooLarge(
        f"the package unpacks to more than a package may take: {how} at least {readable_bytes(total)}, "
        f"the limit is {format_bytes(limit)} ({LIMIT_SETTING})"
    )


def unpack(archive: BinaryIO, kind: str, target: Path, limit: int) -> int:
    """Unpack `archive` (seekable; `kind` "zip", else a tar) into the empty directory
    `target`; the bytes charged for it. PackageTooLarge when it would take more than
    `limit`, raised before anything is written when the headers say so; ValueError for
    an unsafe name; tarfile.TarError or zipfile.BadZipFile for a broken archive."""
    if kind == "zip":
        return _unzip(archive, target, limit)
    return _untar(archive, target, limit)


def _untar(archive: BinaryIO, target: Path, limit: int) -> int:
    total = 0
    with tarfile.open(fileobj=archive, mode="r:*") as tar:
        # Headers only: tarfile skips each member's data (a compressed archive is still
        # decompressed to get past it, so this stops at the first header over the limit).
        for member in tar:
            total += charge(member.size)
            if total > limit:
                raise _too_large(total, limit, declared=True)
    archive.seek(0)
    written = 0

    def bounded(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        # tarfile writes exactly `member.size` bytes for a member it lets through.
        nonlocal written
        safe = tarfile.data_filter(member, path)
        written += charge(member.size)
        if written > limit:
            raise _too_large(written, limit, declared=False)
        return safe

    with tarfile.open(fileobj=archive, mode="r:*") as tar:
        tar.extractall(target, filter=bounded)  # noqa: S202 - the data filter checks every name
    return written


def _unzip(archive: BinaryIO, target: Path, limit: int) -> int:
    with zipfile.ZipFile(archive) as z:
        infos = z.infolist()
        total = 0
        for info in infos:
            name = Path(info.filename)
            if name.is_absolute() or ".." in name.parts:
                raise ValueError(f"the zip archive holds an unsafe name: {info.filename!r}")
            total += charge(info.file_size)
            if total > limit:
                raise _too_large(total, limit, declared=True)
        # The central directory read above is the one extraction uses: the sizes counted
        # are the sizes zipfile cuts each member's data at.
        z.extractall(target, members=infos)  # noqa: S202 - every name was checked above
    return total
