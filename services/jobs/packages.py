"""What the jobs service reads of a job's files on PFS: that a path exists, the package's
kind, its requirements.txt. `Packages` is the one place that reads the datacenter's storage
for a submit, through `ReadVolume` (common/storage/base.py): a POSIX root or HDFS alike.
"""

from __future__ import annotations

import asyncio
import io
import tarfile
import zipfile
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

from paddlecloud.common import errors
from paddlecloud.common.errors import Invalid
from paddlecloud.common.storage.base import Download, Kind, ReadVolume
from paddlecloud.common.volume import PfsPath

from .errors import PackageNotFound

REQUIREMENTS = "requirements.txt"
MAX_REQUIREMENTS = 64 * 1024
ARCHIVE_SUFFIXES = {".tar.gz": "tar", ".tgz": "tar", ".tar": "tar", ".zip": "zip"}
# How much an archive is read at a time when looking into it: one ranged read of the storage each.
ARCHIVE_READ = 1024 * 1024
# How many archives' requirements.txt are remembered (a few hundred bytes to 64 KiB each).
REMEMBERED = 256


class Packages:
    """Job packages and paths on a datacenter's storage, read beneath each area (a POSIX
    root: by the kernel, following no symlink out of it)."""

    def __init__(self, volume: ReadVolume) -> None:
        self._volume = volume
        # An archive's requirements.txt, by its path and what its stat says of its bytes (file
        # identity, size, mtime): a resubmitted package is not gunzipped again to find it. A
        # stale entry would need the owner to rewrite their own file in place with the same
        # size and mtime, and would change only the requirements of their own job.
        self._archived: OrderedDict[tuple[str, str, int, int, str], bytes | None] = OrderedDict()

    async def must_exist(self, field: str, path: PfsPath) -> Kind:
        """What kind of thing is at `path`; Invalid, naming `field`, if nothing is (or a symlink
        leads out)."""
        try:
            download = await self._volume.open(path)
        except PermissionError:
            raise Invalid(f"{path} leads outside its area through a symlink", field=field) from None
        except (FileNotFoundError, NotADirectoryError, errors.ProblemError, errors.DomainError):
            raise Invalid(f"{path} does not exist on PFS", field=field) from None
        if download is None:
            return "dir"
        await download.close()
        return download.stat.kind

    async def kind(self, path: PfsPath) -> str:
        """The package's kind (dir, tar or zip); PackageNotFound or Invalid if it is missing or neither."""
        try:
            found = await self.must_exist("package", path)
        except Invalid:
            # One line a person reads: where it was looked for, and the first two things to try.
            raise PackageNotFound(
                f"{path} not found on PFS: upload it (`paddlecloud submit DIR` does) or check the path "
                f"(`paddlecloud ls {path.parent()}`); a full storage quota stops uploads too",
                field="package",
            ) from None
        if found == "dir":
            return "dir"
        kind = next((k for suffix, k in ARCHIVE_SUFFIXES.items() if path.name.endswith(suffix)), None)
        if found == "file" and kind is not None:
            return kind
        raise Invalid(f"{path} must be a directory or a .tar.gz, .tgz, .tar or .zip archive", field="package")

    async def requirements(self, package: PfsPath, kind: str) -> str | None:
        """The package's requirements.txt, if it has one with something in it."""
        try:
            data = await self._read_requirements(package, kind)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        except (OSError, tarfile.TarError, zipfile.BadZipFile) as exc:
            raise Invalid(f"cannot read {package}: {exc}", field="package") from None
        if data is None:
            return None
        if len(data) > MAX_REQUIREMENTS:
            raise Invalid(
                f"its {REQUIREMENTS} is larger than {MAX_REQUIREMENTS // 1024} KiB", field="package"
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise Invalid(f"its {REQUIREMENTS} is not UTF-8 text", field="package") from None
        return text if text.strip() else None

    async def _read_requirements(self, package: PfsPath, kind: str) -> bytes | None:
        if kind == "dir":
            return await self._volume.read(package.child(REQUIREMENTS), MAX_REQUIREMENTS + 1)
        download = await self._volume.open(package)
        if download is None:
            raise IsADirectoryError(21, "Is a directory", package.text)
        st = download.stat
        key = (package.text, kind, st.size, st.mtime_ns, st.ident)
        if key in self._archived:
            await download.close()
            self._archived.move_to_end(key)
            return self._archived[key]
        found = await self._scan(download, kind)
        self._archived[key] = found
        if len(self._archived) > REMEMBERED:
            self._archived.popitem(last=False)
        return found

    async def _scan(self, download: Download, kind: str) -> bytes | None:
        loop = asyncio.get_running_loop()
        # tarfile and zipfile read synchronously, in a thread of their own: not one of the
        # default executor's, which serves the ranged reads that thread waits for.
        pool = ThreadPoolExecutor(1, thread_name_prefix="package-archive")
        try:
            archive = io.BufferedReader(_Ranged(download, loop), ARCHIVE_READ)
            return await loop.run_in_executor(pool, _archived_requirements, archive, kind)
        finally:
            pool.shutdown(wait=False)
            await download.close()


class _Ranged(io.RawIOBase):
    """An open PFS file as a seekable binary file for tarfile and zipfile, read from a worker
    thread: each read is one ranged read (`Download.chunks`) done on the event loop. Nothing
    but what they read is held, however large the archive."""

    def __init__(self, download: Download, loop: asyncio.AbstractEventLoop) -> None:
        self._download = download
        self._loop = loop
        self._size = download.stat.size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        want = min(len(buffer), self._size - self._pos)
        if want <= 0:
            return 0
        data = asyncio.run_coroutine_threadsafe(self._read(self._pos, want), self._loop).result()
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)

    async def _read(self, start: int, length: int) -> bytes:
        out = bytearray()
        async for chunk in self._download.chunks(start, length):
            out += chunk
        return bytes(out)


def _archived_requirements(archive: BinaryIO, kind: str) -> bytes | None:
    """requirements.txt at the top of a .tar.gz/.tar or .zip package, or None."""
    if kind == "zip":
        with zipfile.ZipFile(archive) as z:
            names = set(z.namelist())
            for name in (REQUIREMENTS, f"./{REQUIREMENTS}"):
                if name in names:
                    with z.open(name) as f:
                        return f.read(MAX_REQUIREMENTS + 1)
        return None
    with tarfile.open(fileobj=archive, mode="r:*") as tar:
        for member in tar:
            if member.name in (REQUIREMENTS, f"./{REQUIREMENTS}") and member.isfile():
                extracted = tar.extractfile(member)
                return None if extracted is None else extracted.read(MAX_REQUIREMENTS + 1)
    return None
