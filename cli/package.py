"""Job packages: a local directory packed into a reproducible `.tar.gz` that is named by its sha256.

`submit` packs the package directory, names the archive `<sha256>.tar.gz` and uploads it to
`<home>/.paddlecloud/packages/` only when PFS does not hold that name yet, so an unchanged
package is never uploaded twice. That works only if the same content always gives the same
bytes, hence the archive is reproducible:

- entries in sorted order of their `/`-separated relative path (a directory before what it
  holds); directories are kept, empty ones too;
- every entry's mtime 0, uid/gid 0, user and group names empty; modes normalised to 0755 for
  directories and for files with any execute bit, 0644 for other files (umasks differ);
- gzip header without a file name and with mtime 0, at a fixed compression level.

The sha256 is of the compressed bytes (what PFS stores and verifies), so a different zlib
could give other bytes for the same files; that costs one upload, not a wrong package.

What goes in: everything beneath the directory except what `.paddlecloudignore` (at the
package's top; gitignore syntax: `#` comments, `*`, `?`, `[...]`, `**`, a trailing `/` for
directories only, a `/` at the start or in the middle anchors the pattern to the top, and
`!` re-includes; the last matching pattern wins, and as in git nothing inside an excluded
directory can be re-included) and the defaults (`DEFAULT_IGNORES`) leave out.

Symlinks are never followed out of the package: a link whose target lies inside the package
is stored as a link (with a relative target, so it still works where the package is
unpacked); a link leading outside it, or to nothing, is left out with a note. Sockets, FIFOs
and devices are left out with a note.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import stat
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Literal

import pathspec

from .errors import PaddleCloudError

IGNORE_FILE = ".paddlecloudignore"
# Left out unless `.paddlecloudignore` re-includes them (`!.venv`): version control, virtual
# environments and caches are never what a job needs, and they are often most of the bytes.
DEFAULT_IGNORES: tuple[str, ...] = (
    ".git",
    ".hg",
    ".svn",
    ".venv",
    "__pycache__/",
    "*.pyc",
    "*.pyo",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    ".ipynb_checkpoints/",
    ".DS_Store",
)
# Where packages live on PFS, beneath the user's home.
PACKAGE_DIR = ".paddlecloud/packages"
# Above this (the files' total, uncompressed) the largest paths are named in a note.
BIG_PACKAGE = 100 * 2**20
LARGEST_SHOWN = 5
COMPRESS_LEVEL = 6
ARCHIVE_SUFFIXES = {".tar.gz": ".tar.gz", ".tgz": ".tar.gz", ".zip": ".zip"}
READ_BLOCK = 1024 * 1024

Kind = Literal["dir", "file", "symlink"]


class PackageError(PaddleCloudError):
    """The package cannot be made: not a directory, unreadable, a file changing under us."""


# --- ignore rules ------------------------------------------------------------------------------


class IgnoreRules:
    """gitignore patterns (git's own semantics, through `pathspec`) over `/`-separated
    paths relative to the package's top."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self.spec = pathspec.GitIgnoreSpec.from_lines(patterns)

    @classmethod
    def for_directory(cls, root: Path, *, defaults: Sequence[str] = DEFAULT_IGNORES) -> IgnoreRules:
        """The defaults, then the lines of `root/.paddlecloudignore` if there is one."""
        lines = list(defaults)
        ignore_file = root / IGNORE_FILE
        if ignore_file.is_file():
            try:
                lines.extend(ignore_file.read_text(encoding="utf-8").splitlines())
            except (OSError, UnicodeDecodeError) as exc:
                raise PackageError(f"{ignore_file}: cannot read it: {exc}") from None
        return cls(lines)

    def ignored(self, relative: str, is_dir: bool) -> bool:
        """Whether the entry at `relative` is left out; the last pattern that matches decides."""
        return self.spec.match_file(relative + "/" if is_dir else relative)


# --- collecting ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One archive member: its relative path, kind, size (files), mode bits and link target."""

    relative: str
    kind: Kind
    size: int = 0
    executable: bool = False
    target: str = ""


@dataclass
class Collected:
    """What a directory contributes to its package, and what was left out."""

    root: Path
    entries: list[Entry] = field(default_factory=list)
    ignored: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def files(self) -> int:
        return sum(1 for e in self.entries if e.kind == "file")

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.entries)


def collect(root: Path, rules: IgnoreRules | None = None) -> Collected:
    """Walk `root` (not following symlinks) and list what the package holds, sorted."""
    try:
        top = root.resolve(strict=True)
    except OSError:
        raise PackageError(f"{root}: no such directory") from None
    if not top.is_dir():
        raise PackageError(f"{root}: not a directory")
    rules = rules if rules is not None else IgnoreRules.for_directory(top)
    found = Collected(root)
    pending = [""]
    while pending:
        relative_dir = pending.pop()
        directory = top / relative_dir if relative_dir else top
        try:
            with os.scandir(directory) as scan:
                children = sorted(scan, key=lambda e: e.name)
        except OSError as exc:
            raise PackageError(f"{directory}: cannot list it: {exc.strerror or exc}") from None
        for child in children:
            relative = f"{relative_dir}/{child.name}" if relative_dir else child.name
            try:
                info = child.stat(follow_symlinks=False)
            except OSError as exc:
                found.notes.append(f"left out {relative}: {exc.strerror or exc}")
                continue
            is_dir = stat.S_ISDIR(info.st_mode)
            if rules.ignored(relative, is_dir):
                found.ignored += 1
                continue
            if stat.S_ISLNK(info.st_mode):
                entry = _link_entry(top, relative, found.notes)
                if entry is not None:
                    found.entries.append(entry)
            elif is_dir:
                found.entries.append(Entry(relative, "dir"))
                pending.append(relative)
            elif stat.S_ISREG(info.st_mode):
                executable = bool(info.st_mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH))
                found.entries.append(Entry(relative, "file", info.st_size, executable))
            else:
                found.notes.append(f"left out {relative}: not a regular file, directory or symlink")
    # A path sorts before every path it is a prefix of, so directories precede their contents.
    found.entries.sort(key=lambda e: e.relative)
    return found


def _link_entry(top: Path, relative: str, notes: list[str]) -> Entry | None:
    link = top / relative
    text = os.readlink(link)
    try:
        target = link.resolve(strict=True)
    except (OSError, RuntimeError):  # missing target, or a loop
        notes.append(f"left out {relative}: a symlink to {text}, which does not exist")
        return None
    if target != top and top not in target.parents:
        notes.append(f"left out {relative}: a symlink to {text}, outside the package")
        return None
    # Relative to the link's own (real) directory: the archive is unpacked elsewhere.
    return Entry(relative, "symlink", target=os.path.relpath(target, link.parent.resolve()))


def largest_paths(entries: Sequence[Entry], count: int = LARGEST_SHOWN) -> list[tuple[str, int]]:
    """The biggest top-level directories (with everything beneath) and files, biggest first."""
    sizes: dict[str, int] = {}
    for entry in entries:
        if entry.kind != "file":
            continue
        sizes[entry.relative] = entry.size
        top, sep, _ = entry.relative.partition("/")
        if sep:
            sizes[top + "/"] = sizes.get(top + "/", 0) + entry.size
    return sorted(sizes.items(), key=lambda item: (-item[1], item[0]))[:count]


# --- the archive ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Package:
    """A package ready to upload: the archive on disk, its sha256 and what it holds."""

    source: Path
    archive: Path
    sha256: str
    size: int  # bytes of the archive
    files: int
    bytes: int  # the files' total, uncompressed
    suffix: str = ".tar.gz"
    ignored: int = 0
    notes: tuple[str, ...] = ()
    largest: tuple[tuple[str, int], ...] = ()

    @property
    def filename(self) -> str:
        """`<sha256>.tar.gz`: the name on PFS, which says exactly what it holds."""
        return self.sha256 + self.suffix

    @property
    def big(self) -> bool:
        return self.bytes > BIG_PACKAGE


class _HashingWriter:
    """A write-only file that hashes and counts what passes through to `target`."""

    def __init__(self, target: BinaryIO) -> None:
        self.target = target
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self.target.write(data)

    def flush(self) -> None:
        self.target.flush()


def write_archive(collected: Collected, out: BinaryIO) -> tuple[str, int]:
    """Write the reproducible `.tar.gz` of `collected` to `out`; returns (sha256 hex, size)."""
    top = collected.root.resolve()
    writer = _HashingWriter(out)
    gz = gzip.GzipFile(filename="", mode="wb", fileobj=writer, mtime=0, compresslevel=COMPRESS_LEVEL)
    with gz, tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in collected.entries:
            info = tarfile.TarInfo(entry.relative)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if entry.kind == "dir":
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            elif entry.kind == "symlink":
                info.type = tarfile.SYMTYPE
                info.mode = 0o777
                info.linkname = entry.target
                tar.addfile(info)
            else:
                info.mode = 0o755 if entry.executable else 0o644
                _add_file(tar, info, top / entry.relative, entry)
    return writer.digest.hexdigest(), writer.size


def _add_file(tar: tarfile.TarFile, info: tarfile.TarInfo, path: Path, entry: Entry) -> None:
    try:
        with open(path, "rb") as source:
            size = os.fstat(source.fileno()).st_size
            if size != entry.size:
                raise PackageError(f"{entry.relative} changed while the package was being made; try again")
            info.size = size
            tar.addfile(info, source)
    except OSError as exc:
        # tarfile says "unexpected end of data" when a file shrinks under it.
        raise PackageError(f"{entry.relative}: cannot read it into the package: {exc}") from None


def pack(source: Path, workdir: Path, rules: IgnoreRules | None = None) -> Package:
    """Pack the directory `source` into `workdir/<sha256>.tar.gz` (blocking; run it in a thread)."""
    collected = collect(source, rules)
    if collected.files == 0:
        collected.notes.append("the package holds no files")
    partial = workdir / "package.tar.gz.partial"
    with open(partial, "wb") as out:
        sha256, size = write_archive(collected, out)
    archive = workdir / f"{sha256}.tar.gz"
    os.replace(partial, archive)
    return Package(
        source=source,
        archive=archive,
        sha256=sha256,
        size=size,
        files=collected.files,
        bytes=collected.bytes,
        ignored=collected.ignored,
        notes=tuple(collected.notes),
        largest=tuple(largest_paths(collected.entries)),
    )


def archive_suffix(path: Path) -> str | None:
    """`.tar.gz` or `.zip` for a file that is already a package archive, else None."""
    name = path.name.lower()
    for suffix, canonical in ARCHIVE_SUFFIXES.items():
        if name.endswith(suffix):
            return canonical
    return None


def existing_archive(path: Path) -> Package:
    """A ready-made `.tar.gz`/`.tgz`/`.zip` taken as the package as is, named by its sha256."""
    suffix = archive_suffix(path)
    if suffix is None:
        raise PackageError(f"{path}: a package is a directory, or a .tar.gz, .tgz or .zip archive")
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as source:
            while block := source.read(READ_BLOCK):
                digest.update(block)
            size = os.fstat(source.fileno()).st_size
    except OSError as exc:
        raise PackageError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    return Package(
        source=path, archive=path, sha256=digest.hexdigest(), size=size, files=1, bytes=size, suffix=suffix
    )


def prepare(source: Path, workdir: Path) -> Package:
    """The package for a local path: a directory is packed, an archive file taken as is."""
    if source.is_dir():
        return pack(source, workdir)
    if source.is_file():
        return existing_archive(source)
    if source.exists():
        raise PackageError(f"{source}: a package is a directory, or a .tar.gz, .tgz or .zip archive")
    raise PackageError(f"{source}: no such directory (a package already on PFS is /pfs/... or pfs:...)")
