"""Job packages: a local directory named by the sha256 of its manifest, packed into a
reproducible `.tar.gz` only when PFS does not hold it yet.

`submit` lists the package directory, hashes each file (or takes its sha256 from the stat
cache, `StatCache`, when the file is provably unchanged), names the package by the sha256 of
its manifest (`paddlecloud.common.manifest`; the format is in docs/jobs.md) and asks PFS for
`<home>/.paddlecloud/packages/<identity>.tar.gz`. Only when PFS lacks it is the archive built,
from the same entries, and uploaded; pfs recomputes the identity from the archive's members
before it places the file, so no archive sits under a name its contents do not have. The
archive is reproducible (the same files give the same bytes, though only the manifest names it):

- entries in sorted order of their `/`-separated relative path (a directory before what it
  holds); directories are kept, empty ones too;
- every entry's mtime 0, uid/gid 0, user and group names empty; modes normalised to 0755 for
  directories and for files with any execute bit, 0644 for other files (umasks differ);
- gzip headers without a file name and with mtime 0, at a fixed compression level; a file
  of at least `STORE_FROM` bytes whose first `SAMPLE` bytes deflate would not shrink (weights,
  data, archives) is stored in a gzip member of its own at level 0 instead. The archive is then
  several gzip members one after another, which gzip, GNU and busybox tar, and Python's gzip
  module read as one stream; deflate gains nothing on such bytes and costs ~30 MB/s of a core.

A file whose bytes differ from what was hashed when the archive is built is an error (it
changed under us), never a package with the wrong name.

What goes in: everything beneath the directory except what `.paddlecloudignore` (at the
package's top; gitignore syntax: `#` comments, `*`, `?`, `[...]`, `**`, a trailing `/` for
directories only, a `/` at the start or in the middle anchors the pattern to the top, and
`!` re-includes; the last matching pattern wins, and as in git nothing inside an excluded
directory can be re-included) and the defaults (`DEFAULT_IGNORES`) leave out.

Symlinks are never followed out of the package: a link whose target lies inside the package
is stored as a link (with a relative target, so it still works where the package is
unpacked); a link leading outside it, or to nothing, is left out with a note. Sockets, FIFOs
and devices are left out with a note.

A ready-made `.tar.gz`/`.zip` (`submit --package x.tar.gz`) is still named by the sha256 of
its bytes, as every package was before manifests; pfs accepts either name.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import stat
import tarfile
import tempfile
import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO, Literal, cast

import pathspec

from paddlecloud.common.manifest import DIR_MODE, EXEC_MODE, FILE_MODE, LINK_MODE, Member, identity

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
# A file at least this large is sampled: if deflate shrinks its first SAMPLE bytes by less than
# a tenth (random or already compressed bytes), it is stored, not compressed.
STORE_FROM = 1024 * 1024
SAMPLE = 64 * 1024
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


# (size, mtime_ns, ctime_ns, inode, device): what says a file is unchanged without reading it.
StatKey = tuple[int, int, int, int, int]


@dataclass(frozen=True)
class Entry:
    """One archive member: its relative path, kind, size (files), mode bits and link target;
    a file's stat key (what the stat cache compares) and, once hashed, its content sha256."""

    relative: str
    kind: Kind
    size: int = 0
    executable: bool = False
    target: str = ""
    key: StatKey | None = None
    sha256: str = ""

    @property
    def mode(self) -> int:
        """The mode the archive stores (and the manifest names)."""
        if self.kind == "dir":
            return DIR_MODE
        if self.kind == "symlink":
            return LINK_MODE
        return EXEC_MODE if self.executable else FILE_MODE

    def member(self) -> Member:
        return Member(self.relative, self.kind, self.mode, self.size, self.sha256, self.target)


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
                found.entries.append(Entry(relative, "file", info.st_size, executable, key=_key(info)))
            else:
                found.notes.append(f"left out {relative}: not a regular file, directory or symlink")
    # A path sorts before every path it is a prefix of, so directories precede their contents.
    found.entries.sort(key=lambda e: e.relative)
    return found


def _key(info: os.stat_result) -> StatKey:
    return (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev)


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


# --- hashing, and the stat cache -----------------------------------------------------------------

STAT_CACHE_VERSION = 1
STAT_CACHE_DIR = "paddlecloud/package-stats"
# A cache holds at most this many files' entries (a bigger tree is hashed each time) ...
STAT_CACHE_MAX_ENTRIES = 200_000
# ... and at most this many package directories are remembered (the least recently used go).
STAT_CACHE_MAX_FILES = 64
# A file changed at most this long before it was hashed is not remembered: the kernel stamps
# files from a clock that ticks every few milliseconds, so a write just after the read can
# leave its stat unchanged. Filesystems with coarser stamps have the cache's own mtime (below).
RACY_WINDOW_NS = 50_000_000


def cache_home(env: Mapping[str, str] | None = None) -> Path:
    """`$XDG_CACHE_HOME`, or `~/.cache`."""
    env = os.environ if env is None else env
    configured = env.get("XDG_CACHE_HOME", "")
    return Path(configured) if os.path.isabs(configured) else Path.home() / ".cache"


class StatCache:
    """What each file of one package directory hashed to, under its stat key, so that an
    unchanged file is never read again (git's index, in small).

    Trusted for nothing but skipping a read, and only when provably safe: the entry's key
    (size, mtime, ctime, inode, device) is the file's current one, and both its times are
    older than the cache file's own mtime, as git's "racy git" rule asks (a file written in
    the same tick as the cache could have changed without its stat changing). A missing,
    corrupt, foreign (another directory's) or newer-format cache is an empty one, never an
    error. Written atomically (a temporary file renamed over it), bounded in entries and files.
    """

    def __init__(self, path: Path | None, root: Path, *, racy_window_ns: int = RACY_WINDOW_NS) -> None:
        self.path = path
        self.root = str(root)
        self.racy_window_ns = racy_window_ns
        self._known: dict[str, list[Any]] = {}
        self._written_ns = 0
        self._next: dict[str, list[Any]] = {}
        self.reads = 0  # files hashed from their bytes in this run

    @classmethod
    def for_directory(cls, root: Path, env: Mapping[str, str] | None = None) -> StatCache:
        """The cache of package directory `root` (resolved), loaded from the user's cache dir."""
        name = hashlib.sha256(os.fsencode(root)).hexdigest()[:40] + ".json"
        cache = cls(cache_home(env) / STAT_CACHE_DIR / name, root)
        cache.load()
        return cache

    def load(self) -> None:
        """Read the cache file; anything amiss leaves the cache empty."""
        if self.path is None:
            return
        try:
            with open(self.path, "rb") as source:
                written = os.fstat(source.fileno()).st_mtime_ns
                data = json.loads(source.read())
        except (OSError, ValueError):
            return
        if (
            not isinstance(data, dict)
            or data.get("version") != STAT_CACHE_VERSION
            or data.get("root") != self.root
        ):
            return
        entries = data.get("entries")
        if isinstance(entries, dict):
            self._known = {k: v for k, v in entries.items() if _valid_cached(v)}
            self._written_ns = written

    def lookup(self, relative: str, key: StatKey) -> str | None:
        """The remembered sha256 of the file at `relative`, if it is provably unchanged."""
        known = self._known.get(relative)
        if known is None or tuple(known[:5]) != key:
            return None
        _, mtime, ctime, _, _ = key
        if max(mtime, ctime) >= self._written_ns:
            return None  # racy: changed in the cache's own tick, perhaps after it was hashed
        return str(known[5])

    def remember(self, relative: str, key: StatKey, sha256: str, hashed_at_ns: int) -> None:
        """Keep `sha256` for the next run, unless the file changed too recently to be sure."""
        _, mtime, ctime, _, _ = key
        if max(mtime, ctime) < hashed_at_ns - self.racy_window_ns:
            self._next[relative] = [*key, sha256]

    def save(self) -> None:
        """Replace the cache file with this run's entries (quietly: a cache is never fatal)."""
        if self.path is None or len(self._next) > STAT_CACHE_MAX_ENTRIES:
            return
        if self._next == self._known and self._written_ns:
            return  # nothing new: keep the file (and its older, trusted mtime) as it is
        data = {"version": STAT_CACHE_VERSION, "root": self.root, "entries": self._next}
        with contextlib.suppress(OSError, UnicodeEncodeError):
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, temporary = tempfile.mkstemp(prefix=".stats-", dir=self.path.parent)
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(json.dumps(data, ensure_ascii=True, separators=(",", ":")).encode())
                os.replace(temporary, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise
            _prune(self.path.parent)


def _valid_cached(value: object) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 6
        and all(type(v) is int for v in value[:5])
        and isinstance(value[5], str)
        and len(value[5]) == 64
    )


def _prune(directory: Path) -> None:
    """Forget the least recently written caches beyond `STAT_CACHE_MAX_FILES`."""
    caches = []
    for path in directory.glob("*.json"):
        with contextlib.suppress(OSError):
            caches.append((path.stat().st_mtime_ns, path))
    for _, path in sorted(caches, reverse=True)[STAT_CACHE_MAX_FILES:]:
        with contextlib.suppress(OSError):
            path.unlink()


def hash_entries(collected: Collected, cache: StatCache | None = None) -> None:
    """Give every file of `collected` its content sha256: from `cache` when it is provably
    unchanged, else by reading it (which `cache` then remembers)."""
    top = collected.root.resolve()
    hashed: list[Entry] = []
    for entry in collected.entries:
        if entry.kind == "file" and entry.key is not None:
            known = cache.lookup(entry.relative, entry.key) if cache is not None else None
            if known is None:
                started = time.time_ns()
                known = _hash_file(top / entry.relative, entry)
                if cache is not None:
                    cache.reads += 1
                    cache.remember(entry.relative, entry.key, known, started)
            elif cache is not None:
                cache.remember(entry.relative, entry.key, known, time.time_ns())
            entry = replace(entry, sha256=known)
        hashed.append(entry)
    collected.entries = hashed


def _hash_file(path: Path, entry: Entry) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as source:
            if _key(os.fstat(source.fileno())) != entry.key:
                raise PackageError(f"{entry.relative} changed while the package was being made; try again")
            while block := source.read(READ_BLOCK):
                digest.update(block)
            if _key(os.fstat(source.fileno())) != entry.key:
                raise PackageError(f"{entry.relative} changed while the package was being made; try again")
    except OSError as exc:
        raise PackageError(f"{entry.relative}: cannot read it into the package: {exc}") from None
    return digest.hexdigest()


# --- the archive ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Package:
    """A package: its name on PFS, what it holds, and (once built, or when given) its archive.

    `sha256` is the package's identity: the sha256 of its manifest for a directory, of its
    bytes for a ready-made archive. `archive` is None until `build` makes it (only when PFS
    lacks the package); `size` is the archive's bytes once there is one.
    """

    source: Path
    archive: Path | None
    sha256: str
    size: int  # bytes of the archive (0 before it is built)
    files: int
    bytes: int  # the files' total, uncompressed
    suffix: str = ".tar.gz"
    ignored: int = 0
    notes: tuple[str, ...] = ()
    largest: tuple[tuple[str, int], ...] = ()
    collected: Collected | None = field(default=None, repr=False, compare=False)

    @property
    def filename(self) -> str:
        """`<identity>.tar.gz`: the name on PFS, which says exactly what it holds."""
        return self.sha256 + self.suffix

    @property
    def big(self) -> bool:
        return self.bytes > BIG_PACKAGE


class _HashingReader:
    """A file that hashes what tarfile reads of it, to compare with what the manifest says."""

    def __init__(self, source: BinaryIO) -> None:
        self.source = source
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.source.read(size)
        self.digest.update(data)
        return data


class _GzipMembers:
    """What tarfile writes, gzipped into `out` as one gzip member per run of the same level:
    `level(n)` ends the current member when n differs. Headers say no name and mtime 0."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.written = 0
        self.current = COMPRESS_LEVEL
        self.gz = self._member(COMPRESS_LEVEL)

    def _member(self, level: int) -> gzip.GzipFile:
        return gzip.GzipFile(filename="", mode="wb", fileobj=self.out, mtime=0, compresslevel=level)

    def level(self, level: int) -> None:
        if level != self.current:
            self.gz.close()  # writes the member's trailer; `out` stays open
            self.gz, self.current = self._member(level), level

    def write(self, data: bytes) -> int:
        self.written += len(data)
        return self.gz.write(data)

    def tell(self) -> int:
        return self.written

    def close(self) -> None:
        self.gz.close()


def _level_for(path: Path, size: int) -> int:
    """0 (stored) for a large file deflate would not shrink, else COMPRESS_LEVEL."""
    if size < STORE_FROM:
        return COMPRESS_LEVEL
    try:
        with open(path, "rb") as f:
            sample = f.read(SAMPLE)
    except OSError:
        return COMPRESS_LEVEL  # _add_file says what is wrong with it
    return 0 if len(zlib.compress(sample, 1)) * 10 > len(sample) * 9 else COMPRESS_LEVEL


def write_archive(collected: Collected, out: BinaryIO) -> int:
    """Write the reproducible `.tar.gz` of `collected` (its files hashed) to `out`; returns
    its size. PackageError if a file no longer has the bytes its entry was hashed from."""
    top = collected.root.resolve()
    before = out.tell()
    gz = _GzipMembers(out)
    # tarfile calls only write() and tell() of what it writes to.
    gzfile = cast(BinaryIO, gz)
    with contextlib.closing(gz), tarfile.open(fileobj=gzfile, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in collected.entries:
            info = tarfile.TarInfo(entry.relative)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = entry.mode
            if entry.kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif entry.kind == "symlink":
                info.type = tarfile.SYMTYPE
                info.linkname = entry.target
                tar.addfile(info)
            else:
                gz.level(_level_for(top / entry.relative, entry.size))
                _add_file(tar, info, top / entry.relative, entry)
        gz.level(COMPRESS_LEVEL)  # the tar's end blocks, compressed as every archive's were
    return out.tell() - before


def _add_file(tar: tarfile.TarFile, info: tarfile.TarInfo, path: Path, entry: Entry) -> None:
    changed = PackageError(f"{entry.relative} changed while the package was being made; try again")
    try:
        with open(path, "rb") as source:
            size = os.fstat(source.fileno()).st_size
            if size != entry.size:
                raise changed
            info.size = size
            reader = _HashingReader(source)
            tar.addfile(info, reader)  # tarfile only calls read()
    except OSError as exc:
        # tarfile says "unexpected end of data" when a file shrinks under it.
        raise PackageError(f"{entry.relative}: cannot read it into the package: {exc}") from None
    if entry.sha256 and reader.digest.hexdigest() != entry.sha256:
        raise changed


def identify(source: Path, rules: IgnoreRules | None = None, cache: StatCache | None = None) -> Package:
    """The package of directory `source`, named by its manifest, without building an archive
    (blocking; run it in a thread). With `cache`, unchanged files are not read, and the
    cache is saved for the next run."""
    collected = collect(source, rules)
    if collected.files == 0:
        collected.notes.append("the package holds no files")
    hash_entries(collected, cache)
    if cache is not None:
        cache.save()
    return Package(
        source=source,
        archive=None,
        sha256=identity(e.member() for e in collected.entries),
        size=0,
        files=collected.files,
        bytes=collected.bytes,
        ignored=collected.ignored,
        notes=tuple(collected.notes),
        largest=tuple(largest_paths(collected.entries)),
        collected=collected,
    )


def build(pkg: Package, workdir: Path) -> Package:
    """`pkg` with its archive built as `workdir/<identity>.tar.gz` (blocking; run it in a
    thread); a package that already has its archive is returned as it is."""
    if pkg.archive is not None or pkg.collected is None:
        return pkg
    partial = workdir / "package.tar.gz.partial"
    with open(partial, "wb") as out:
        size = write_archive(pkg.collected, out)
    archive = workdir / pkg.filename
    os.replace(partial, archive)
    return replace(pkg, archive=archive, size=size)


def pack(source: Path, workdir: Path, rules: IgnoreRules | None = None) -> Package:
    """Name the directory `source` and build its archive in `workdir` (blocking), no cache."""
    return build(identify(source, rules), workdir)


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


def prepare(source: Path, *, cache: bool = True, env: Mapping[str, str] | None = None) -> Package:
    """The package for a local path: a directory is named by its manifest (its files' hashes
    kept in the user's stat cache unless `cache` is false), an archive file taken as is."""
    if source.is_dir():
        try:
            top = source.resolve(strict=True)
        except OSError:
            raise PackageError(f"{source}: no such directory") from None
        return identify(source, cache=StatCache.for_directory(top, env) if cache else None)
    if source.is_file():
        return existing_archive(source)
    if source.exists():
        raise PackageError(f"{source}: a package is a directory, or a .tar.gz, .tgz or .zip archive")
    raise PackageError(f"{source}: no such directory (a package already on PFS is /pfs/... or pfs:...)")
