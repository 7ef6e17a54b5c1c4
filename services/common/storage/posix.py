"""A datacenter's storage as a directory on this host (local disk or a CephFS mount), behind base.py.

Moved here from pfs (files.py, staging.py, usage.py, fsops.py) unchanged in how it touches
the disk: every path is resolved beneath its area by the kernel (`volume.Volume`: openat2
RESOLVE_BENEATH, O_NOFOLLOW); creating, renaming and removing go through `*at` calls on
the parent's descriptor, so a symlink is never followed out of a home; a finished upload
is renamed into place with renameat2(RENAME_NOREPLACE), or copied into a CephFS quota
realm (cephfs.py). Failures are OSErrors with the kernel's errno, and the path grammar's
refusals (`PathNotFound`, `PathForbidden`); pfs words them.

Everything blocking runs in a worker thread, except what the upload path calls inline as
it always did (a stat of a staging file, appends of what just arrived).
"""

from __future__ import annotations

import asyncio
import bisect
import builtins
import contextlib
import errno
import hashlib
import heapq
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

from .. import trees
from ..diskuse import DiskUse, walk_allocated
from ..errors import DomainError
from ..volume import PfsPath, Volume, kind
from . import cephfs
from .base import (
    AbstractVolume,
    Changed,
    Children,
    Download,
    Entry,
    Kind,
    Staging,
    Stat,
    TreeTooDeep,
    tree_order,
)
from .fsops import remember_sha256, remembered_sha256, rename_noreplace

HASH_CHUNK = 1024 * 1024
_READ_BLOCK = 1024 * 1024
# Read size for downloads where the loop cannot sendfile: large enough that the thread hop
# each read costs stays small next to the read (256 KiB reads measured 5% slower end to end),
# small enough that a few hundred downloads at once stay within a few hundred MiB.
DOWNLOAD_CHUNK = 1024 * 1024


def stat_of(st: os.stat_result, target: str | None = None) -> Stat:
    """A kernel stat as the interface's `Stat` (the ident is device and inode)."""
    what: Kind = kind(st)  # type: ignore[assignment]
    return Stat(
        kind=what,
        size=st.st_size if what == "file" else 0,
        mtime_ns=st.st_mtime_ns,
        mode=stat.S_IMODE(st.st_mode),
        ident=f"{st.st_ino:x}",
        target=target,
    )


# Downloads ------------------------------------------------------------------------


class PosixDownload(Download):
    """A file opened beneath its area: its descriptor, sent by the kernel where it can be."""

    def __init__(self, fd: int, st: os.stat_result) -> None:
        self.fd = fd
        self.stat = stat_of(st)

    async def sendfile(self, transport: object, start: int, length: int) -> int | None:
        """loop.sendfile of the open descriptor: the kernel copies the range from the page
        cache to the socket. None where it cannot (uvloop; TLS; a filesystem without
        sendfile), and then nothing was sent."""
        loop = asyncio.get_running_loop()
        # Wraps the open descriptor, which stays ours, for sendfile: nothing here blocks.
        with open(self.fd, "rb", buffering=0, closefd=False) as file:  # noqa: ASYNC230
            # NotImplementedError: uvloop. RuntimeError (SendfileNotAvailableError among them):
            # a transport (TLS) or a file system without sendfile.
            with contextlib.suppress(NotImplementedError, RuntimeError):
                return await loop.sendfile(transport, file, start, length, fallback=False)  # type: ignore[arg-type]
        return None

    async def chunks(self, start: int, length: int) -> AsyncIterator[bytes]:
        """Ranged reads off the loop, DOWNLOAD_CHUNK at a time, with pread."""
        sent = 0
        while sent < length:
            chunk = await asyncio.to_thread(
                os.pread, self.fd, min(DOWNLOAD_CHUNK, length - sent), start + sent
            )
            if not chunk:
                return
            sent += len(chunk)
            yield chunk

    async def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# Listing --------------------------------------------------------------------------


# Paging a huge directory reads every name of it for each page (`_read_page`), so a read keeps
# the names of up to AHEAD_NAMES entries past its page, and the next pages of a directory that
# has not changed since (its inode, mtime and ctime) are served from them: a million entries in
# pages of 10,000 are read 20 times, not 100. At most AHEAD_DIRS directories' names are kept
# (~3.5 MB each).
AHEAD_NAMES = 50_000
AHEAD_DIRS = 4
# A directory changed this shortly before it was read may change again within the same
# timestamp (the kernel stamps them from a clock that ticks every few ms): not remembered.
RACY_NS = 50_000_000


@dataclass
class _Ahead:
    """Sorted names of one directory, every one after `start` up to the last held (all of
    them with `complete`), read while its (mtime, ctime) were `version`."""

    version: tuple[int, int]
    start: str | None
    names: list[str]
    complete: bool

    def take(self, after: str | None, limit: int) -> list[str] | None:
        """The page after `after` from these names; None where they do not hold all of it."""
        if self.start is not None and (after is None or after < self.start):
            return None
        i = 0 if after is None else bisect.bisect_right(self.names, after)
        if i + limit <= len(self.names) or self.complete:
            return self.names[i : i + limit]
        return None


class PageNames:
    """The names of the directories paged lately (see AHEAD_NAMES); safe across threads."""

    def __init__(self) -> None:
        self._dirs: OrderedDict[tuple[int, int], _Ahead] = OrderedDict()
        self._lock = threading.Lock()

    def page(self, fd: int, after: str | None, limit: int) -> list[str]:
        """The first `limit` names by name after `after` of the directory open at `fd`."""
        st = os.fstat(fd)
        ident, version = (st.st_dev, st.st_ino), (st.st_mtime_ns, st.st_ctime_ns)
        with self._lock:
            ahead = self._dirs.get(ident)
            if ahead is not None and ahead.version == version:
                self._dirs.move_to_end(ident)
                taken = ahead.take(after, limit)
                if taken is not None:
                    return taken
        read_at = time.time_ns()
        keep = max(limit, AHEAD_NAMES)
        with os.scandir(fd) as it:
            every = (item.name for item in it)
            names = heapq.nsmallest(keep, every if after is None else (n for n in every if n > after))
        if max(version) < read_at - RACY_NS:
            with self._lock:
                self._dirs[ident] = _Ahead(version, after, names, len(names) < keep)
                self._dirs.move_to_end(ident)
                while len(self._dirs) > AHEAD_DIRS:
                    self._dirs.popitem(last=False)
        return names[:limit]


def _entry_at(fd: int, text: str, name: str) -> Entry | None:
    """The entry `name` of the directory open at `fd` (listed as `text`), never followed;
    None where it was removed since its name was read."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        target = os.readlink(name, dir_fd=fd) if stat.S_ISLNK(st.st_mode) else None
    except FileNotFoundError:
        return None
    # Names come from the disk (a job may have made any name): shown, not re-validated.
    return Entry(f"{text}/{name}", name, stat_of(st, target))


def _read_dir(fd: int, text: str) -> list[Entry]:
    """The entries of the directory open at `fd`."""
    with os.scandir(fd) as it:
        found = [_entry_at(fd, text, item.name) for item in it]
    return [entry for entry in found if entry is not None]


def _read_page(
    fd: int, text: str, after: str | None, limit: int, names: PageNames
) -> tuple[list[Entry], str | None]:
    """The first `limit` entries by name of the directory open at `fd` whose names sort after
    `after`, in that order, and the name to resume after (None: no more). An entry removed
    while read is left out, yet still counts to the page.

    A directory has no order of its own that survives changes (readdir's is the filesystem's
    hash order, and a cookie into it is not portable), so a page reads every name and keeps
    only the smallest past `after` in a heap: memory bounded, time linear in the directory
    (`PageNames` spares the reads of the pages that follow). Only the entries served are stat'ed.
    """
    page = names.page(fd, after, limit)
    found = [_entry_at(fd, text, name) for name in page]
    return [entry for entry in found if entry is not None], page[-1] if len(page) == limit else None


def _walk(fd: int, text: str, recursive: bool, max_path_bytes: int) -> list[Entry]:
    """Every entry beneath the directory open at `fd` (which this closes), never following symlinks.

    Recursively through `trees.walk`: a bounded number of descriptors at any depth. A
    tree holding a path longer than `max_path_bytes` raises TreeTooDeep: such paths could
    not be named in a later call, and their listing would grow with the square of the depth.
    """
    try:
        if not recursive:
            out = _read_dir(fd, text)
        else:
            out = []
            room = max_path_bytes - len(os.fsencode(text)) - 1
            with contextlib.closing(trees.walk(fd)) as found:
                for item in found:
                    if item.path_bytes > room:
                        raise TreeTooDeep(text, item.depth)
                    target = None
                    if stat.S_ISLNK(item.st.st_mode):
                        try:
                            target = os.readlink(item.name, dir_fd=item.dir_fd)
                        except FileNotFoundError:
                            continue  # removed while we read
                    out.append(Entry(f"{text}/{item.relative()}", item.name, stat_of(item.st, target)))
    finally:
        os.close(fd)
    out.sort(key=tree_order)
    return out


# Usage ----------------------------------------------------------------------------

# A walk of a large home takes a while; quota checks may be this stale, and uploads in
# flight are counted separately by the caller (their sizes are reserved at creation).
# CephFS's recursive statistics cost two getxattr calls and are never cached here (they
# trail the tree by seconds themselves: the MDS propagates them lazily).
CACHE_SECONDS = 30.0

# What a home holds: allocated bytes and regular files (services/common/diskuse.py).
HomeUsage = DiskUse
_walk_allocated = walk_allocated


class Usage:
    """Bytes and files per user's home, cached for CACHE_SECONDS (not on CephFS)."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._cache: dict[str, tuple[float, HomeUsage]] = {}
        self._cached = not cephfs.is_cephfs(root)

    def forget(self, user: str) -> None:
        """Drop the cached figure after a change this service made (upload, rm, mv)."""
        self._cache.pop(user, None)

    async def of(self, user: str) -> HomeUsage:
        cached = self._cache.get(user)
        if cached is not None and time.monotonic() - cached[0] < CACHE_SECONDS:
            return cached[1]
        home = self._root / "home" / user
        usage = await asyncio.to_thread(self._measure, home)
        if self._cached:
            self._cache[user] = (time.monotonic(), usage)
        return usage

    @staticmethod
    def _measure(home: os.PathLike[str]) -> HomeUsage:
        try:
            fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return HomeUsage(0, 0)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a home replaced by a symlink holds nothing of its own
                return HomeUsage(0, 0)
            raise
        try:
            # CephFS keeps recursive statistics per directory: no walk, at any size.
            stats = cephfs.rstats(fd)
            return HomeUsage(*stats) if stats is not None else _walk_allocated(fd)
        finally:
            os.close(fd)


# The volume -----------------------------------------------------------------------


class PosixVolume(AbstractVolume):
    """`/pfs/<dc>` as a directory on this host: `home/<user>/`, `public/`, `.uploads/`."""

    kind = "posix"

    def __init__(
        self, root: Path, *, use_openat2: bool | None = None, quotas: cephfs.CephQuotas | None = None
    ) -> None:
        self.root = Volume(root, use_openat2=use_openat2)
        self.path = self.root.root
        self.quotas: cephfs.CephQuotas = cephfs.CephQuotas(self.path) if quotas is None else quotas
        self.staging: PosixStaging = PosixStaging(self.path / ".uploads", self.root, self.quotas)
        self.usage_cache = Usage(self.path)
        self.page_names = PageNames()

    async def close(self) -> None:
        self.staging.close()

    async def check_writable(self) -> None:
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise OSError(f"{self.path} is not a writable directory")

    async def ensure_home(self, user: str) -> None:
        self.root.ensure_home(user)

    # reading ------------------------------------------------------------------

    async def stat(self, path: PfsPath) -> Stat:
        return self.lstat(path)

    def lstat(self, path: PfsPath) -> Stat:
        """`path`'s stat, describing a symlink rather than what it points to (blocking, brief)."""
        if path.is_area_root:
            return stat_of(self.root.lstat(path))
        with self.root.parent_fd(path) as (fd, name):
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            target = os.readlink(name, dir_fd=fd) if stat.S_ISLNK(st.st_mode) else None
        return stat_of(st, target)

    async def open(self, path: PfsPath) -> PosixDownload | None:
        """The file at `path` opened beneath its area; None for a directory. Something else
        (a FIFO, a device a job left) comes back with its kind, unread, for the caller to refuse."""
        # O_NONBLOCK: opening a FIFO a job left behind must not wait for a writer.
        fd = self.root.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        if stat.S_ISDIR(st.st_mode):
            os.close(fd)
            return None
        return PosixDownload(fd, st)

    async def list(self, path: PfsPath, *, recursive: bool, max_path_bytes: int) -> list[Entry]:
        return await asyncio.to_thread(self._list, path, recursive, max_path_bytes)

    def _list(self, path: PfsPath, recursive: bool, max_path_bytes: int) -> builtins.list[Entry]:
        opened = self._open_dir(path)
        if isinstance(opened, Entry):
            return [opened]
        return _walk(opened, path.text, recursive, max_path_bytes)

    def _open_dir(self, path: PfsPath) -> int | Entry:
        """The directory at `path` opened (never through a symlink), or the entry of what is
        there instead: a file's listing is that file, a symlink's the link, never its target."""
        if path.is_area_root:
            return self.root.open(path, os.O_RDONLY | os.O_DIRECTORY)
        with self.root.parent_fd(path) as (parent, name):
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                target = os.readlink(name, dir_fd=parent) if stat.S_ISLNK(st.st_mode) else None
                return Entry(path.text, path.name, stat_of(st, target))
            return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)

    async def children(self, path: PfsPath, after: str | None, limit: int) -> Children | Entry:
        return await asyncio.to_thread(self._children, path, after, limit)

    def _children(self, path: PfsPath, after: str | None, limit: int) -> Children | Entry:
        opened = self._open_dir(path)
        if isinstance(opened, Entry):
            return opened
        try:
            return Children(*_read_page(opened, path.text, after, limit, self.page_names))
        finally:
            os.close(opened)

    async def sha256(self, path: PfsPath, *, compute: bool) -> tuple[Stat, str | None] | None:
        if not compute:
            return self._sha256(path, compute=False)
        return await asyncio.to_thread(self._sha256, path, compute=True)

    def _sha256(self, path: PfsPath, *, compute: bool) -> tuple[Stat, str | None] | None:
        """The file's stat and sha256 (remembered, or computed if `compute`); None if not a file.

        The descriptor is opened and closed here, in the thread that reads it.
        """
        with self.root.parent_fd(path) as (parent, name):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    return None
                raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            remembered = remembered_sha256(fd, st)
            if remembered is not None or not compute:
                return stat_of(st), remembered
            digest = hashlib.sha256()
            while block := os.read(fd, HASH_CHUNK):
                digest.update(block)
            after = os.fstat(fd)
            if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
                raise Changed(errno.EAGAIN, "the file changed while it was being hashed", path.text)
            hexdigest = digest.hexdigest()
            remember_sha256(fd, hexdigest, st)
            return stat_of(st), hexdigest
        finally:
            os.close(fd)

    # changes ------------------------------------------------------------------

    async def mkdir(self, path: PfsPath, *, parents: bool) -> bool:
        return await asyncio.to_thread(self._mkdir, path, parents)

    def _mkdir(self, path: PfsPath, parents: bool) -> bool:
        """Each missing step made, owned like its area. Something in the way raises
        FileExistsError naming the step it is at (an existing directory only without `parents`)."""
        if path.is_area_root:
            if not parents:
                raise FileExistsError(errno.EEXIST, "already exists", path.text)
            return False
        steps = [
            PfsPath(path.datacenter, path.area, path.owner, path.parts[:n])
            for n in range(1, len(path.parts) + 1)
        ]
        created = False
        for step in steps if parents else [path]:
            with self.root.parent_fd(step) as (parent, name):
                try:
                    os.mkdir(name, 0o755, dir_fd=parent)
                    self.root.adopt(step, parent, name)
                    created = step == path
                except FileExistsError:
                    st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                    # A symlink counts as in the way too: mkdir -p does not follow it.
                    if not stat.S_ISDIR(st.st_mode) or not parents:
                        raise FileExistsError(
                            errno.EEXIST, f"a {kind(st)} is in the way", step.text
                        ) from None
        return created

    async def remove(self, path: PfsPath, *, recursive: bool) -> None:
        await asyncio.to_thread(self._remove, path, recursive)

    def _remove(self, path: PfsPath, recursive: bool) -> None:
        with self.root.parent_fd(path) as (parent, name):
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(name, dir_fd=parent)  # a symlink goes, never what it points to
            elif recursive:
                # Any depth, a bounded number of descriptors, never into a symlink.
                trees.remove_tree(parent, name)
            else:
                os.rmdir(name, dir_fd=parent)

    async def move(self, src: PfsPath, dst: PfsPath, *, overwrite: bool) -> None:
        await asyncio.to_thread(self._move, src, dst, overwrite)

    def _move(self, src: PfsPath, dst: PfsPath, overwrite: bool) -> None:
        with contextlib.ExitStack() as stack:
            src_dir, src_name = stack.enter_context(self.root.parent_fd(src))
            src_st = os.stat(src_name, dir_fd=src_dir, follow_symlinks=False)
            dst_dir, dst_name = stack.enter_context(self.root.parent_fd(dst))
            try:
                dst_st: os.stat_result | None = os.stat(dst_name, dir_fd=dst_dir, follow_symlinks=False)
            except FileNotFoundError:
                dst_st = None
            moving_dir = stat.S_ISDIR(src_st.st_mode)
            if dst_st is None:
                rename_noreplace(src_dir, src_name, dst_dir, dst_name, is_dir=moving_dir)
            elif stat.S_ISDIR(dst_st.st_mode):
                raise IsADirectoryError(errno.EISDIR, "is a directory", dst.text)
            elif not overwrite:
                raise FileExistsError(errno.EEXIST, "already exists", dst.text)
            elif moving_dir:
                raise NotADirectoryError(
                    errno.ENOTDIR, f"a directory cannot replace a {kind(dst_st)}", dst.text
                )
            else:
                # rename(2) replaces a non-directory atomically; had a directory
                # appeared there since, it fails with EISDIR rather than replace it.
                os.rename(src_name, dst_name, src_dir_fd=src_dir, dst_dir_fd=dst_dir)

    async def usage(self, user: str) -> DiskUse:
        return await self.usage_cache.of(user)

    def forget_usage(self, user: str) -> None:
        self.usage_cache.forget(user)

    async def retire_home(self, user: str, *, archive: bool, stamp: str) -> str | None:
        return await asyncio.to_thread(self.root.retire_home, user, archive=archive, stamp=stamp)


# Staging --------------------------------------------------------------------------


class DirectWriter:
    """Appends straight to the staging file; a discard truncates back (POSIX filesystems)."""

    in_place = True

    def __init__(self, part_fd: int, start: int) -> None:
        self.fd = part_fd
        self._start = start
        self.written = 0

    def write(self, data: bytes) -> int:
        """Append `data`; on an error (ENOSPC) what was written so far stays counted."""
        view = memoryview(data)
        done = 0
        while done < len(view):
            n = os.write(self.fd, view[done:])
            done += n
            self.written += n
        return done

    def commit(self) -> None:
        pass

    def discard(self) -> None:
        os.ftruncate(self.fd, self._start)
        self.written = 0


class StagedChunkWriter:
    """For mounts that cannot truncate: a chunk that still needs verifying is written
    beside the staging file and appended to it only once it verified."""

    in_place = False

    def __init__(self, staging: PosixStaging, upload_id: str, part_fd: int) -> None:
        self._staging = staging
        self._name = f"{upload_id}.chunk"
        self._part_fd = part_fd
        self.fd = os.open(
            self._name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600, dir_fd=staging.dir_fd
        )
        self._inner = DirectWriter(self.fd, 0)
        self.written = 0

    def write(self, data: bytes) -> int:
        try:
            return self._inner.write(data)
        finally:
            self.written = self._inner.written

    def commit(self) -> None:
        # Without truncate there is no undo: were this copy to fail half-way, the upload
        # would keep a partial, unverified chunk. Only append-only mounts take that risk.
        os.close(self.fd)
        self.fd = -1
        src = os.open(self._name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=self._staging.dir_fd)
        try:
            while block := os.read(src, _READ_BLOCK):
                DirectWriter(self._part_fd, 0).write(block)
        finally:
            os.close(src)
            os.unlink(self._name, dir_fd=self._staging.dir_fd)

    def discard(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._name, dir_fd=self._staging.dir_fd)
        self.written = 0


ChunkWriter = DirectWriter | StagedChunkWriter


class PosixStaging(Staging):
    """The `.uploads` directory under the datacenter root: `<id>.part` and `<id>.info`.

    On the same filesystem as the homes (so the final rename is atomic) and outside every
    home (so no user or job sees it). Staging files are only ever appended to (O_APPEND,
    no pre-allocation, no seeks). pfs appends through the descriptor helpers below
    (`direct`): pread read-back hashing and fdatasync as the body arrives.
    """

    direct = True

    def __init__(
        self,
        directory: Path,
        root: Volume | None = None,
        quotas: cephfs.CephQuotas | None = None,
        *,
        can_truncate: bool = True,
    ) -> None:
        self.directory = directory
        self._root = root
        self._quotas = quotas
        self.dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        # False on append-only mounts: checksummed chunks are then staged on their own.
        self.can_truncate = can_truncate

    def close(self) -> None:
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1

    @property
    def root(self) -> Volume:
        if self._root is None:
            raise RuntimeError("this staging directory places nothing (no volume given)")
        return self._root

    # staging files: the descriptor helpers of the direct path ------------------

    async def create_part(self, upload_id: str) -> int:
        return await asyncio.to_thread(self._create_part, upload_id)

    def _create_part(self, upload_id: str) -> int:
        """Create the empty staging file; its inode, for recognising it after the final move."""
        fd = os.open(
            f"{upload_id}.part",
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC,
            0o644,
            dir_fd=self.dir_fd,
        )
        try:
            os.fsync(fd)
            return os.fstat(fd).st_ino
        finally:
            os.close(fd)

    def open_part(self, upload_id: str) -> int:
        """An append-only descriptor of the staging file; FileNotFoundError once it moved.

        It can read too: what a PATCH appended is read back (from the page cache) to be hashed.
        """
        return os.open(f"{upload_id}.part", os.O_RDWR | os.O_APPEND | os.O_CLOEXEC, dir_fd=self.dir_fd)

    def stat_part(self, upload_id: str) -> os.stat_result:
        return os.stat(f"{upload_id}.part", dir_fd=self.dir_fd, follow_symlinks=False)

    # A stat of one file in a directory this process holds open: inline, as it always was.
    async def part_size(self, upload_id: str) -> int | None:
        try:
            return self.stat_part(upload_id).st_size
        except FileNotFoundError:
            return None

    async def part_mtime(self, upload_id: str) -> float | None:
        try:
            return self.stat_part(upload_id).st_mtime
        except FileNotFoundError:
            return None

    def writer(self, upload_id: str, part_fd: int, start: int, *, verify: bool) -> ChunkWriter:
        if verify and not self.can_truncate:
            return StagedChunkWriter(self, upload_id, part_fd)
        return DirectWriter(part_fd, start)

    async def hash_part(self, upload_id: str) -> str:
        return await asyncio.to_thread(self._hash_part, upload_id)

    async def read_part(self, upload_id: str) -> AsyncGenerator[bytes]:
        fd = await asyncio.to_thread(
            os.open, f"{upload_id}.part", os.O_RDONLY | os.O_CLOEXEC, dir_fd=self.dir_fd
        )
        try:
            while block := await asyncio.to_thread(os.read, fd, _READ_BLOCK):
                yield block
        finally:
            os.close(fd)

    def _hash_part(self, upload_id: str) -> str:
        """The staging file's sha256, read from disk (after a restart lost the running hash)."""
        with opened(os.open(f"{upload_id}.part", os.O_RDONLY | os.O_CLOEXEC, dir_fd=self.dir_fd)) as fd:
            return hash_fd(fd)

    async def remove(self, upload_id: str, *, record: bool) -> None:
        await asyncio.to_thread(self._remove, upload_id, record)

    def _remove(self, upload_id: str, record: bool) -> None:
        """Delete the upload's staging data (and its record): idempotent."""
        names = [f"{upload_id}.part", f"{upload_id}.chunk"]
        if record:
            names += [f"{upload_id}.info", f"{upload_id}.info.tmp"]
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=self.dir_fd)
        os.fsync(self.dir_fd)

    # records ------------------------------------------------------------------

    async def write_record(self, upload_id: str, data: bytes) -> None:
        await asyncio.to_thread(self._write_record, upload_id, data)

    def _write_record(self, upload_id: str, data: bytes) -> None:
        """Replace the record atomically and durably: tmp, fsync, rename, fsync the directory."""
        tmp = f"{upload_id}.info.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600, dir_fd=self.dir_fd)
        try:
            DirectWriter(fd, 0).write(data)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.dir_fd)
            raise
        os.close(fd)
        os.rename(tmp, f"{upload_id}.info", src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        os.fsync(self.dir_fd)

    async def load_records(self) -> list[bytes]:
        return await asyncio.to_thread(self._load_records)

    def _load_records(self) -> list[bytes]:
        records = []
        for name in os.listdir(self.dir_fd):
            if not name.endswith(".info"):
                continue
            # An unreadable one (gone since, or a symlink) is skipped; pfs says which it could not parse.
            with contextlib.suppress(OSError):
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.dir_fd)
                with os.fdopen(fd, "rb") as f:
                    records.append(f.read())
        return records

    async def orphans(self, known: set[str], older_than: float) -> list[str]:
        return await asyncio.to_thread(self._orphans, known, older_than)

    def _orphans(self, known: set[str], older_than: float) -> list[str]:
        """Staging leftovers with no record (a crash during creation), last touched before `older_than`."""
        found = []
        for name in os.listdir(self.dir_fd):
            upload_id, _, suffix = name.partition(".")
            if upload_id in known or suffix not in ("part", "chunk", "info.tmp"):
                continue
            with contextlib.suppress(FileNotFoundError):
                if os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False).st_mtime < older_than:
                    found.append(name)
        return found

    async def unlink(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.dir_fd)

    # placing ------------------------------------------------------------------

    async def place(self, upload_id: str, dest: PfsPath, *, digest: str, overwrite: bool) -> None:
        await asyncio.to_thread(self._place, upload_id, dest, digest, overwrite)

    def _place(self, upload_id: str, dest: PfsPath, digest: str, overwrite: bool) -> None:
        """Create the parents, then rename the staging file to its destination and sync."""
        root = self.root
        if dest.area == "home" and dest.owner is not None:
            root.ensure_home(dest.owner)
        self._make_parents(dest)
        with opened(root.open(dest.parent(), os.O_RDONLY | os.O_DIRECTORY)) as dir_fd:
            part = f"{upload_id}.part"
            with opened(os.open(part, os.O_RDONLY | os.O_CLOEXEC, dir_fd=self.dir_fd)) as fd:
                # Staged owner-only; placed readable, and owned like its home.
                os.fchmod(fd, 0o644)
                owner = root.area_owner(dest)
                if owner is not None:
                    os.fchown(fd, *owner)
                # Before the rename: it keeps the xattr and the mtime the xattr names.
                remember_sha256(fd, digest)
                os.fsync(fd)
            # CephFS: a home with a quota is a realm of its own. ceph-fuse refuses a
            # rename into it (EXDEV), and the hard link rename_noreplace falls back on
            # (FUSE takes no RENAME_NOREPLACE) would slip past the quota: copy instead.
            by_copy = self._quotas is not None and self._quotas.has_quota(dest.owner)
            try:
                if by_copy:
                    pass  # straight to the copy below
                elif overwrite:
                    os.rename(part, dest.name, src_dir_fd=self.dir_fd, dst_dir_fd=dir_fd)
                else:
                    rename_noreplace(self.dir_fd, part, dir_fd, dest.name)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                by_copy = True  # another filesystem or realm, wherever that happens
            if by_copy:
                cephfs.place_by_copy(
                    self.dir_fd,
                    part,
                    dir_fd,
                    dest.name,
                    marker=upload_id,
                    digest=digest,
                    overwrite=overwrite,
                    owner=owner,
                )
            os.fsync(dir_fd)

    def _make_parents(self, dest: PfsPath) -> None:
        """`mkdir -p` of the destination's parents, each resolved beneath its area."""
        for depth in range(1, len(dest.parts)):
            sub = PfsPath(dest.datacenter, dest.area, dest.owner, dest.parts[:depth])
            with self.root.parent_fd(sub) as (fd, name):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
                    self.root.adopt(sub, fd, name)

    async def placed(self, upload_id: str, marker: int, dest: PfsPath, length: int) -> str | None:
        return await asyncio.to_thread(self._placed, upload_id, marker, dest, length)

    def _placed(self, upload_id: str, marker: int, dest: PfsPath, length: int) -> str | None:
        """The staging file is gone: if it is at its destination, the rename happened before a crash."""
        try:
            with opened(self.root.open(dest, os.O_RDONLY | os.O_NOFOLLOW)) as fd:
                st = os.fstat(fd)
                ours = st.st_ino == marker or cephfs.placed_by(fd) == upload_id
                if not ours or st.st_size != length:
                    return None
                digest = remembered_sha256(fd) or hash_fd(fd)
            with opened(self.root.open(dest.parent(), os.O_RDONLY | os.O_DIRECTORY)) as dir_fd:
                os.fsync(dir_fd)
            return digest
        except (OSError, DomainError):
            return None


def hash_fd(fd: int) -> str:
    digest = hashlib.sha256()
    while block := os.read(fd, _READ_BLOCK):
        digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def opened(fd: int) -> Iterator[int]:
    """Close a descriptor when the block ends, however it ends."""
    try:
        yield fd
    finally:
        os.close(fd)
