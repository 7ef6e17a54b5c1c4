"""A job package's manifest and identity, which the CLI computes from files and pfs from an archive.

A package is named by the sha256 of its manifest (docs/jobs.md, "Package identity"), not of
its compressed archive, so the CLI can name an unchanged package without building anything.
The manifest lists every member, sorted by its `/`-separated relative path, one line each:

    paddlecloud-package-manifest/1
    ["<path>","dir",493,0,"",""]
    ["<path>","file",420,<size>,"<sha256 of its bytes>",""]
    ["<path>","symlink",511,0,"","<target>"]

each line JSON with ASCII escapes and no spaces, ending in `\\n`. Modes are what the archive
stores (0755 for directories and executable files, 0644 for other files, 0777 for links),
so the archive alone determines the manifest, and pfs recomputes the identity from the
members' bytes when a package is uploaded (`identity_of_archive`).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, Literal

HEADER = b"paddlecloud-package-manifest/1\n"
Kind = Literal["dir", "file", "symlink"]
READ_BLOCK = 1024 * 1024
# The most members an uploaded archive may have for its identity to be recomputed: the
# manifest is held whole to be sorted (~300 bytes a member), so this bounds what pfs holds
# for one upload at ~60 MiB. Beyond it the archive is refused, saying so.
MAX_MEMBERS = 200_000
DIR_MODE = 0o755
EXEC_MODE = 0o755
FILE_MODE = 0o644
LINK_MODE = 0o777


class NotAPackage(ValueError):
    """The archive is not one the CLI makes: unreadable, or a member it never writes."""


@dataclass(frozen=True)
class Member:
    """One manifest line: a member's path, kind, mode, size and content sha256 or link target."""

    path: str
    kind: Kind
    mode: int
    size: int = 0
    sha256: str = ""
    target: str = ""

    def line(self) -> bytes:
        fields = [self.path, self.kind, self.mode, self.size, self.sha256, self.target]
        return json.dumps(fields, ensure_ascii=True, separators=(",", ":")).encode("ascii") + b"\n"


def serialise(members: Iterable[Member]) -> bytes:
    """The canonical manifest: the header, then the members sorted by path."""
    ordered = sorted(members, key=lambda m: m.path)
    return HEADER + b"".join(m.line() for m in ordered)


def identity(members: Iterable[Member]) -> str:
    """The package's name: the sha256 (hex) of its canonical manifest."""
    return hashlib.sha256(serialise(members)).hexdigest()


def members_of_archive(archive: BinaryIO) -> Iterator[Member]:
    """The members of a `.tar.gz` read as a stream, each file's bytes hashed; NotAPackage
    for a damaged archive or a member the CLI never writes (hard links, devices, odd paths)."""
    seen: set[str] = set()
    try:
        # gzip.GzipFile, not tarfile's "r|gz": it reads an archive of several gzip members
        # (the CLI stores incompressible files in members of their own) as one stream.
        with gzip.GzipFile(fileobj=archive, mode="rb") as gz, tarfile.open(fileobj=gz, mode="r|") as tar:
            for info in tar:
                if len(seen) >= MAX_MEMBERS:
                    raise NotAPackage(f"more than {MAX_MEMBERS:,} members")
                yield _member(tar, info, seen)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise NotAPackage(f"not a readable .tar.gz: {exc}") from None


def identity_of_archive(archive: BinaryIO) -> str:
    """The identity of the package an archive holds (blocking: run it in a thread)."""
    return identity(list(members_of_archive(archive)))


def _member(tar: tarfile.TarFile, info: tarfile.TarInfo, seen: set[str]) -> Member:
    path = info.name
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise NotAPackage(f"member {path!r} is not a plain relative path")
    if path in seen:
        raise NotAPackage(f"member {path!r} appears twice")
    seen.add(path)
    mode = info.mode & 0o7777
    if info.isdir():
        return Member(path, "dir", mode)
    if info.issym():
        return Member(path, "symlink", mode, target=info.linkname)
    if not info.isreg():
        raise NotAPackage(f"member {path!r} is neither a file, a directory nor a symlink")
    source = tar.extractfile(info)
    digest = hashlib.sha256()
    if source is not None:
        while block := source.read(READ_BLOCK):
            digest.update(block)
    return Member(path, "file", mode, info.size, digest.hexdigest())
