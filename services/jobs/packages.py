"""What the jobs service reads of a job's files on PFS: that a path exists, the package's
kind, its requirements.txt. The first half of a PFS seam: `Packages` is the one place
that reads the datacenter's disk for a submit, so a backend whose PFS is not a POSIX
disk has one class to give another implementation of.
"""

from __future__ import annotations

import os
import stat
import tarfile
import zipfile
from typing import BinaryIO

from paddlecloud.common import errors
from paddlecloud.common.errors import Invalid
from paddlecloud.common.volume import PfsPath, Root

from .errors import PackageNotFound

REQUIREMENTS = "requirements.txt"
MAX_REQUIREMENTS = 64 * 1024
ARCHIVE_SUFFIXES = {".tar.gz": "tar", ".tgz": "tar", ".tar": "tar", ".zip": "zip"}


class Packages:
    """Job packages and paths on a datacenter's root, read beneath each area by the kernel.
    Blocking: callers run these in a thread."""

    def __init__(self, root: Root) -> None:
        self._root = root

    def must_exist(self, field: str, path: PfsPath) -> os.stat_result:
        """What is at `path`; Invalid, naming `field`, if nothing is (or a symlink leads out)."""
        try:
            fd = self._root.open(path, os.O_PATH | os.O_CLOEXEC)
        except PermissionError:
            raise Invalid(f"{path} leads outside its area through a symlink", field=field) from None
        except (FileNotFoundError, NotADirectoryError, errors.ProblemError):
            raise Invalid(f"{path} does not exist on PFS", field=field) from None
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def kind(self, path: PfsPath) -> str:
        """The package's kind (dir, tar or zip); PackageNotFound or Invalid if it is missing or neither."""
        try:
            st = self.must_exist("package", path)
        except Invalid:
            # One line a person reads: where it was looked for, and the first two things to try.
            raise PackageNotFound(
                f"{path} not found on PFS: upload it (`paddlecloud submit DIR` does) or check the path "
                f"(`paddlecloud ls {path.parent()}`); a full storage quota stops uploads too",
                field="package",
            ) from None
        if stat.S_ISDIR(st.st_mode):
            return "dir"
        kind = next((k for suffix, k in ARCHIVE_SUFFIXES.items() if path.name.endswith(suffix)), None)
        if stat.S_ISREG(st.st_mode) and kind is not None:
            return kind
        raise Invalid(f"{path} must be a directory or a .tar.gz, .tgz, .tar or .zip archive", field="package")

    def requirements(self, package: PfsPath, kind: str) -> str | None:
        """The package's requirements.txt, if it has one with something in it."""
        try:
            data = self._read_requirements(package, kind)
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

    def _read_requirements(self, package: PfsPath, kind: str) -> bytes | None:
        if kind == "dir":
            fd = self._root.open(package.child(REQUIREMENTS), os.O_RDONLY | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                return f.read(MAX_REQUIREMENTS + 1)
        fd = self._root.open(package, os.O_RDONLY | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            return _archived_requirements(f, kind)


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
