"""PFS's file operations (docs/pfs.md): resolve a path for a caller, open a download, list,
stat, mkdir, rm, mv, a file's sha256, a home's usage and a deleted user's home, beneath a
datacenter's root; the endpoints in api.py call `Files`.

The rules live here, not in the handlers, and a refusal is a domain error (errors.py,
common/volume.py), which the service's table shows as a problem. Every path is resolved
beneath its area by `volume.Volume`; changes go through `*at` calls on the parent's
descriptor, so a symlink is never followed out of a home, and nothing here builds a host
path from a string.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from paddlecloud.common import trees
from paddlecloud.common.errors import Exists, Forbidden, NotFound
from paddlecloud.common.internal_auth import Identity
from paddlecloud.common.store import Store
from paddlecloud.common.store.models import USER_NAME
from paddlecloud.common.volume import (
    MAX_PATH_BYTES,
    PathForbidden,
    PathNotFound,
    PfsPath,
    Root,
    Volume,
    check_access,
    check_name,
    kind,
)

from .cephfs import CephQuotas
from .errors import BadRequest, Conflict, TreeTooDeep, refusal_for
from .fsops import remember_sha256, remembered_sha256, rename_noreplace
from .usage import Usage

log = structlog.get_logger()

HASH_CHUNK = 1024 * 1024
# Hashing a large file holds a worker thread for minutes; cap how many do so at once so
# downloads and listings (which share asyncio's default executor) are never starved.
HASH_CONCURRENCY = 4


# Refusals -------------------------------------------------------------------------


def prepare_write(root: Root, path: PfsPath) -> None:
    """A user's home appears on their first write; `check_access` let only its owner or an admin here."""
    if path.area == "home" and path.owner is not None:
        with fs_errors(path):
            root.ensure_home(path.owner)


@contextlib.contextmanager
def fs_errors(path: PfsPath | str) -> Iterator[None]:
    """Filesystem errors as the domain refuses the request (`errors.refusal_for`)."""
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.ELOOP and not isinstance(exc, PermissionError):
            # Our own O_NOFOLLOW met a symlink swapped in since we looked.
            raise PathForbidden(f"{path}: is a symlink, which this call does not follow") from exc
        raise refusal_for(exc, path) from exc


# Entries --------------------------------------------------------------------------


def _mtime(ns: int) -> str:
    seconds, rest = divmod(ns, 10**9)
    moment = datetime.fromtimestamp(seconds, UTC).replace(microsecond=rest // 1000)
    return moment.isoformat(timespec="microseconds")


def entry_of(text: str, name: str, st: os.stat_result, target: str | None = None) -> dict[str, Any]:
    what = kind(st)
    entry: dict[str, Any] = {
        "path": text,
        "name": name,
        "type": what,
        "size": st.st_size if what == "file" else 0,
        "mtime": _mtime(st.st_mtime_ns),
        "mode": format(stat.S_IMODE(st.st_mode), "04o"),
    }
    if target is not None:
        entry["target"] = target
    return entry


def lstat_entry(root: Root, path: PfsPath) -> dict[str, Any]:
    """`path`'s entry, describing a symlink rather than what it points to."""
    if path.is_area_root:
        return entry_of(path.text, path.name, root.lstat(path))
    with root.parent_fd(path) as (fd, name):
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        target = os.readlink(name, dir_fd=fd) if stat.S_ISLNK(st.st_mode) else None
    return entry_of(path.text, path.name, st, target)


def _read_dir(fd: int, text: str) -> list[dict[str, Any]]:
    """The entries of the directory open at `fd`."""
    found = []
    with os.scandir(fd) as it:
        for item in it:
            try:
                st = item.stat(follow_symlinks=False)
                target = os.readlink(item.name, dir_fd=fd) if stat.S_ISLNK(st.st_mode) else None
            except FileNotFoundError:
                continue  # removed while we read
            # Names come from the disk (a job may have made any name): shown, not re-validated.
            found.append(entry_of(f"{text}/{item.name}", item.name, st, target))
    return found


def _walk(fd: int, text: str, recursive: bool) -> list[dict[str, Any]]:
    """Every entry beneath the directory open at `fd` (which this closes), never following symlinks.

    Recursively through `trees.walk`: a bounded number of descriptors at any depth. A
    tree holding a path longer than a PFS path may be (MAX_PATH_BYTES: 2,048 levels of
    one-letter names at most) is refused with TREE_TOO_DEEP: such paths could not be
    named in a later call, and their listing would grow with the square of the depth.
    """
    try:
        if not recursive:
            out = _read_dir(fd, text)
        else:
            out = []
            room = MAX_PATH_BYTES - len(os.fsencode(text)) - 1
            with contextlib.closing(trees.walk(fd)) as found:
                for item in found:
                    if item.path_bytes > room:
                        raise TreeTooDeep(
                            f"{text}: holds paths longer than {MAX_PATH_BYTES} bytes ({item.depth} levels "
                            "down and deeper), which PFS cannot name; list a directory further down, "
                            "or remove the tree with rm -r"
                        )
                    target = None
                    if stat.S_ISLNK(item.st.st_mode):
                        try:
                            target = os.readlink(item.name, dir_fd=item.dir_fd)
                        except FileNotFoundError:
                            continue  # removed while we read
                    out.append(entry_of(f"{text}/{item.relative()}", item.name, item.st, target))
    finally:
        os.close(fd)
    out.sort(key=lambda e: e["path"])
    return out


def list_tree(root: Root, path: PfsPath, recursive: bool) -> list[dict[str, Any]]:
    if path.is_area_root:
        fd = root.open(path, os.O_RDONLY | os.O_DIRECTORY)
        return _walk(fd, path.text, recursive)
    with root.parent_fd(path) as (parent, name):
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            # A file's listing is that file; a symlink's is the link itself, never its target.
            target = os.readlink(name, dir_fd=parent) if stat.S_ISLNK(st.st_mode) else None
            return [entry_of(path.text, path.name, st, target)]
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    return _walk(fd, path.text, recursive)


# Listing and stat -----------------------------------------------------------------


def file_sha256(root: Root, path: PfsPath, *, compute: bool) -> tuple[os.stat_result, str | None] | None:
    """The file's stat and sha256 (remembered, or computed if `compute`); None if not a file.

    The descriptor is opened and closed here, in the thread that reads it.
    """
    with root.parent_fd(path) as (parent, name):
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
            return st, remembered
        digest = hashlib.sha256()
        while block := os.read(fd, HASH_CHUNK):
            digest.update(block)
        after = os.fstat(fd)
        if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
            raise Conflict(f"{path}: the file changed while it was being hashed; try again")
        hexdigest = digest.hexdigest()
        remember_sha256(fd, hexdigest, st)
        return st, hexdigest
    finally:
        os.close(fd)


# Changes --------------------------------------------------------------------------


def make_dirs(root: Root, path: PfsPath, parents: bool) -> tuple[bool, dict[str, Any]]:
    if path.is_area_root:
        if not parents:
            raise Exists(f"{path}: already exists")
        return False, lstat_entry(root, path)
    steps = [
        PfsPath(path.datacenter, path.area, path.owner, path.parts[:n]) for n in range(1, len(path.parts) + 1)
    ]
    created = False
    for step in steps if parents else [path]:
        with root.parent_fd(step) as (parent, name):
            try:
                os.mkdir(name, 0o755, dir_fd=parent)
                root.adopt(step, parent, name)
                created = step == path
            except FileExistsError:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    # A symlink counts as in the way too: mkdir -p does not follow it.
                    raise Conflict(f"{step}: a {kind(st)} is in the way") from None
                if not parents:
                    raise Exists(f"{path}: already exists") from None
    return created, lstat_entry(root, path)


def remove_path(root: Root, path: PfsPath, recursive: bool) -> None:
    with root.parent_fd(path) as (parent, name):
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=parent)  # a symlink goes, never what it points to
        elif recursive:
            # Any depth, a bounded number of descriptors, never into a symlink.
            trees.remove_tree(parent, name)
        else:
            os.rmdir(name, dir_fd=parent)


def move_path(root: Root, src: PfsPath, dst: PfsPath, overwrite: bool) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        with fs_errors(src):
            src_dir, src_name = stack.enter_context(root.parent_fd(src))
            src_st = os.stat(src_name, dir_fd=src_dir, follow_symlinks=False)
        with fs_errors(dst):
            dst_dir, dst_name = stack.enter_context(root.parent_fd(dst))
            try:
                dst_st: os.stat_result | None = os.stat(dst_name, dir_fd=dst_dir, follow_symlinks=False)
            except FileNotFoundError:
                dst_st = None
        moving_dir = stat.S_ISDIR(src_st.st_mode)
        both = f"{src} → {dst}"
        with fs_errors(both):
            try:
                if dst_st is None:
                    rename_noreplace(src_dir, src_name, dst_dir, dst_name, is_dir=moving_dir)
                elif stat.S_ISDIR(dst_st.st_mode):
                    raise Exists(f"{dst}: is a directory, and mv never replaces a directory")
                elif not overwrite:
                    raise Exists(f"{dst}: already exists (set overwrite to replace it)")
                elif moving_dir:
                    raise Conflict(f"{both}: a directory cannot replace a {kind(dst_st)}")
                else:
                    # rename(2) replaces a non-directory atomically; had a directory
                    # appeared there since, it fails with EISDIR rather than replace it.
                    os.rename(src_name, dst_name, src_dir_fd=src_dir, dst_dir_fd=dst_dir)
            except OSError as exc:
                if exc.errno == errno.EINVAL:
                    # The kernel's own check, which also sees through symlinks inside the home.
                    raise BadRequest(f"{src} cannot be moved into itself ({dst})") from exc
                if exc.errno in (errno.EXDEV, errno.EBUSY) and not isinstance(exc, PermissionError):
                    raise Conflict(f"{both}: cannot be moved there (another filesystem or in use)") from exc
                raise
        with fs_errors(dst):
            entry = lstat_entry(root, dst)
    return entry


def _is_own_home(path: PfsPath, identity: Identity) -> bool:
    return path.area == "home" and path.is_area_root and path.owner == identity.user


@dataclass(frozen=True)
class HomeUse:
    """A home's usage against its owner's storage quota (`limit`, None: none), and whether the
    filesystem holds jobs' own writes to it too (`enforced`: CephFS)."""

    user: str
    bytes: int
    files: int
    limit: int | None
    enforced: bool


class Files:
    """The file operations of one datacenter, with their rules: who may use a path, what may
    be removed, moved or replaced, and where a caller's own home stands in before it exists."""

    def __init__(
        self, root: Volume, usage: Usage, quotas: CephQuotas, store: Store, *, datacenter: str
    ) -> None:
        self.root = root
        self.usage = usage
        self.quotas = quotas
        self.store = store
        self.datacenter = datacenter
        self._hash_slots = asyncio.Semaphore(HASH_CONCURRENCY)

    def resolve(self, identity: Identity, text: str, *, write: bool) -> PfsPath:
        """The PFS path `text` names, if `identity` may read it (or write it)."""
        path = PfsPath.parse(text, self.datacenter)
        check_access(path, identity, write=write)
        return path

    async def listing(self, identity: Identity, path: PfsPath, recursive: bool) -> list[dict[str, Any]]:
        """A directory's entries (every descendant if `recursive`), or a file's own."""
        try:
            with fs_errors(path):
                return await asyncio.to_thread(list_tree, self.root, path, recursive)
        except PathNotFound:
            # Your own home exists for you before your first write; it is simply empty.
            if not _is_own_home(path, identity):
                raise
            return []

    def open_file(self, identity: Identity, path: PfsPath) -> tuple[int, os.stat_result] | None:
        """The regular file at `path` opened for reading, with its stat (the caller closes it);
        None for a directory (or the caller's own home, not made yet): its listing answers."""
        try:
            with fs_errors(path):
                # O_NONBLOCK: opening a FIFO a job left behind must not wait for a writer.
                fd = self.root.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except PathNotFound:
            if _is_own_home(path, identity):
                return None
            raise
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                os.close(fd)
                return None
            if not stat.S_ISREG(st.st_mode):
                raise Conflict(f"{path}: is neither a regular file nor a directory")
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        return fd, st

    async def stat(self, path: PfsPath, *, sha256: bool) -> dict[str, Any]:
        """`path`'s entry; with `sha256`, a file's carries its sha256 too."""
        with fs_errors(path):
            entry = lstat_entry(self.root, path)
            if not sha256 or entry["type"] != "file":
                return entry
            # First the cheap way: what the upload (or an earlier stat) remembered.
            found = file_sha256(self.root, path, compute=False)
            if found is not None and found[1] is None:
                async with self._hash_slots:
                    found = await asyncio.to_thread(file_sha256, self.root, path, compute=True)
        if found is None:  # no longer a regular file: it changed under us
            return entry
        st, digest = found
        return {**entry_of(path.text, path.name, st), "sha256": digest}

    async def mkdir(self, path: PfsPath, *, parents: bool) -> tuple[bool, dict[str, Any]]:
        """Whether the directory was made, and its entry; with `parents`, one that exists is fine."""
        prepare_write(self.root, path)
        with fs_errors(path):
            created, entry = await asyncio.to_thread(make_dirs, self.root, path, parents)
        if created:
            log.info("pfs_mkdir", path=path.text)
        return created, entry

    async def remove(self, path: PfsPath, *, recursive: bool) -> None:
        """Remove a file, a symlink, or a directory (one with content only if `recursive`)."""
        if path.is_area_root:
            raise PathForbidden(f"{path}: the root of a home or of public cannot be removed")
        try:
            with fs_errors(path):
                await asyncio.to_thread(remove_path, self.root, path, recursive)
        finally:
            # Even a recursive removal that failed halfway removed something.
            self._forget_usage(path)
        log.info("pfs_removed", path=path.text, recursive=recursive)

    async def move(self, src: PfsPath, dst: PfsPath, *, overwrite: bool) -> dict[str, Any]:
        """Move `src` to `dst`, replacing a file there only with `overwrite`, never a directory."""
        for end in (src, dst):
            if end.is_area_root:
                raise PathForbidden(f"{end}: the root of a home or of public cannot be moved or replaced")
        same_area = (src.datacenter, src.area, src.owner) == (dst.datacenter, dst.area, dst.owner)
        if same_area and len(dst.parts) > len(src.parts) and dst.parts[: len(src.parts)] == src.parts:
            raise BadRequest(f"{src} cannot be moved into itself ({dst})")
        if self.quotas.crosses_realms(src.owner, dst.owner):
            # ceph-fuse refuses such renames, and the hard link rename_noreplace falls back on
            # would slip the file past the destination's quota (docs/storage.md).
            raise Conflict(f"{src} → {dst}: crosses a storage quota boundary; copy, then remove")
        prepare_write(self.root, dst)
        try:
            entry = await asyncio.to_thread(move_path, self.root, src, dst, overwrite)
        finally:
            self._forget_usage(src)
            self._forget_usage(dst)
        log.info("pfs_moved", src=src.text, dst=dst.text, overwrite=overwrite)
        return entry

    def _forget_usage(self, path: PfsPath) -> None:
        if path.area == "home" and path.owner is not None:
            self.usage.forget(path.owner)

    def check_retirement(self, identity: Identity, name: str) -> None:
        """Whether `identity` may retire the home of user `name`: admins only (the gateway,
        deleting a user), and only a name an account could have."""
        if not identity.admin:
            raise Forbidden("only an administrator may retire a home")
        check_name(name, f"user {name[:100]!r}")
        if not USER_NAME.match(name):
            # No account could have it, so no home: an answer of 200 would say it was retired.
            why = f"{name[:100]!r} is not a user name (lowercase letters, digits and '-')"
            raise BadRequest(why, field="name")

    async def retire_home(self, name: str, *, archive: bool) -> str | None:
        """Take the home of deleted user `name` away, archived or removed; where it went."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        where = await asyncio.to_thread(self.root.retire_home, name, archive=archive, stamp=stamp)
        self.usage.forget(name)
        return where

    async def usage_of(self, identity: Identity, user: str | None) -> HomeUse:
        """The home of `user` (the caller's own if None) against its quota; others' for admins only."""
        user = identity.user if user is None else user
        check_name(user, f"user {user[:100]!r}")
        if user != identity.user and not identity.admin:
            raise Forbidden(f"only an admin may see another user's usage; yours is user={identity.user}")
        record = await self.store.get_user(user)
        if record is None and user != identity.user:
            raise NotFound(f"there is no user {user!r}")
        limit = record.quota.storage_bytes if record is not None else None
        if record is not None:
            await self.quotas.sync(user, limit)  # CephFS: the home carries the quota too
        measured = await self.usage.of(user)
        return HomeUse(user, measured.bytes, measured.files, limit, self.quotas.enabled)
