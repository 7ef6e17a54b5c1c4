"""What CephFS offers a POSIX volume: per-home quotas, recursive statistics, renames across realms.

- A user's storage quota is also the `ceph.quota.max_bytes` xattr on their home, so that
  their jobs (which write into the home directly, not through pfs) are held to it too.
  The store stays the truth: `CephQuotas` makes each home's xattr match it, whenever pfs
  consults a quota and every QUOTA_SYNC_SECONDS for every user.
- `ceph.dir.rbytes` and `ceph.dir.rfiles` give a home's bytes and files at once, however
  many files it holds, where other filesystems need a walk (posix.Usage falls back to one).
- A directory with a quota is a quota realm of its own, and ceph-fuse refuses a rename
  into it from outside (EXDEV); staging lives outside every home, so a finished upload is
  then copied into a temporary file beside its destination and renamed within the realm.

Everything here is synchronous except `CephQuotas.sync`; callers run it in threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from pathlib import Path

import structlog

from ..store import Store
from ..volume import check_name
from .base import Quotas
from .fsops import remember_sha256, rename_noreplace

log = structlog.get_logger()

QUOTA_MAX_BYTES = "ceph.quota.max_bytes"
RBYTES = "ceph.dir.rbytes"
RFILES = "ceph.dir.rfiles"
# Marks a file that an upload copied into place, so that a crash between its rename and
# the removal of the staging file is recognised on the next HEAD (the inode differs).
UPLOAD_XATTR = "user.paddlecloud.upload"
QUOTA_SYNC_SECONDS = 30.0
_COPY_BLOCK = 4 * 1024 * 1024
# What a filesystem without these virtual xattrs says: local filesystems refuse the
# `ceph.` namespace (EOPNOTSUPP); other FUSE filesystems have no such attribute (ENODATA).
_NOT_CEPH = frozenset({errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EINVAL})
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def is_cephfs(path: Path) -> bool:
    """Whether `path` is on CephFS (kernel client or ceph-fuse): it has recursive statistics."""
    try:
        os.getxattr(path, RBYTES)
    except OSError as exc:
        if exc.errno in _NOT_CEPH:
            return False
        raise
    return True


def rstats(dir_fd: int) -> tuple[int, int] | None:
    """Bytes and files beneath the directory `dir_fd` from CephFS's recursive statistics; None elsewhere.

    The MDS keeps these per directory, so this costs two getxattr calls at any size. They are
    propagated lazily: another client's writes show once it flushed them (seconds at most).
    """
    try:
        rbytes = os.getxattr(dir_fd, RBYTES)
        rfiles = os.getxattr(dir_fd, RFILES)
    except OSError as exc:
        if exc.errno in _NOT_CEPH:
            return None
        raise
    return int(rbytes), int(rfiles)


def quota_of(dir_fd: int) -> int | None:
    """The directory's `ceph.quota.max_bytes`; None where it has none (or 0, which means none)."""
    try:
        raw = os.getxattr(dir_fd, QUOTA_MAX_BYTES)
    except OSError as exc:
        if exc.errno in _NOT_CEPH:
            return None
        raise
    return int(raw) or None


def set_quota(dir_fd: int, limit: int | None) -> None:
    """Set (or with None remove) the directory's `ceph.quota.max_bytes`."""
    if quota_of(dir_fd) == limit:
        return
    if limit is None:
        os.setxattr(dir_fd, QUOTA_MAX_BYTES, b"0")  # CephFS's way of removing a quota
    else:
        os.setxattr(dir_fd, QUOTA_MAX_BYTES, str(limit).encode())


def place_by_copy(
    src_dir: int,
    src: str,
    dst_dir: int,
    dst: str,
    *,
    marker: str,
    digest: str,
    overwrite: bool,
    owner: tuple[int, int] | None,
) -> None:
    """Put a copy of `src` at `dst` atomically, then remove `src`: for a rename that crosses realms.

    The copy goes to a hidden temporary file beside `dst`, is synced, marked with `marker`
    and renamed into place (never replacing unless `overwrite`), so `dst` is either absent
    or whole. On any failure (EDQUOT above all) the temporary file goes and `src` stays.
    """
    tmp = f".{marker}.paddlecloud-tmp"
    with contextlib.ExitStack() as stack:
        src_fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC, dir_fd=src_dir)
        stack.callback(os.close, src_fd)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        out = os.open(tmp, flags, 0o600, dir_fd=dst_dir)
        try:
            try:
                _copy(src_fd, out)
                os.fchmod(out, 0o644)
                if owner is not None:
                    os.fchown(out, *owner)
                os.setxattr(out, UPLOAD_XATTR, marker.encode())
                # After the last write: the record names the copy's own mtime.
                remember_sha256(out, digest)
                os.fsync(out)
            finally:
                os.close(out)
            if overwrite:
                os.rename(tmp, dst, src_dir_fd=dst_dir, dst_dir_fd=dst_dir)
            else:
                try:
                    rename_noreplace(dst_dir, tmp, dst_dir, dst)
                except FileExistsError:
                    # Placed already, by this upload before a crash: only `src` is left to remove.
                    if _marked(dst_dir, dst) != marker:
                        raise
                    os.unlink(tmp, dir_fd=dst_dir)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dst_dir)
            raise
    os.fsync(dst_dir)
    os.unlink(src, dir_fd=src_dir)


def placed_by(fd: int) -> str | None:
    """The upload that copied this file into place, if one did."""
    try:
        return os.getxattr(fd, UPLOAD_XATTR).decode()
    except (OSError, UnicodeDecodeError):
        return None


def _marked(dir_fd: int, name: str) -> str | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        return placed_by(fd)
    finally:
        os.close(fd)


def _copy(src: int, dst: int) -> None:
    """Plain reads and writes. Not copy_file_range: ceph-fuse copies objects in the cluster
    then, past the client's quota check (measured: 1 MiB into a realm with none left)."""
    offset = 0
    while block := os.pread(src, _COPY_BLOCK, offset):
        view = memoryview(block)
        done = 0
        while done < len(view):  # at the quota's edge a write is short, and the next one EDQUOT
            done += os.pwrite(dst, view[done:], offset + done)
        offset += len(block)


class CephQuotas(Quotas):
    """Keeps every home's `ceph.quota.max_bytes` equal to its user's storage quota in the store.

    Does nothing where the root is not on CephFS. Remembers what it applied, so a quota that
    did not change costs nothing; a home that does not exist yet gets its quota once it does.
    """

    def __init__(self, root: Path, *, enabled: bool | None = None) -> None:
        self._homes = root / "home"
        self.enabled = is_cephfs(root) if enabled is None else enabled
        self._applied: dict[str, int | None] = {}
        self._wanted: dict[str, int | None] = {}

    async def sync(self, user: str, limit: int | None) -> None:
        """Make `user`'s home carry `limit` (None: no quota), if it exists and does not yet."""
        if not self.enabled:
            return
        self._wanted[user] = limit
        await self.settle(user)

    async def settle(self, user: str, *, check: bool = False) -> None:
        """After a write that may have created `user`'s home: give it the quota last seen.

        With `check`, the home's xattr is read again even if pfs set that quota already.
        """
        if user not in self._wanted:
            return
        limit = self._wanted[user]
        if not check and user in self._applied and self._applied[user] == limit:
            return
        if await asyncio.to_thread(self._apply, user, limit):
            self._applied[user] = limit

    async def sync_all(self, store: Store) -> None:
        """Every user's quota onto their home: the periodic pass that catches what no request did.

        It reads each home's xattr again rather than trusting what it applied: a process that
        owns a home, on a mount whose client has the `p` capability, can change the quota
        itself (a job on the local backend can), and is put right here (docs/storage.md).
        """
        if not self.enabled:
            return
        for user in await store.list_users():
            self._wanted[user.name] = user.quota.storage_bytes
            await self.settle(user.name, check=True)

    def has_quota(self, user: str | None) -> bool:
        """Whether `user`'s home is a quota realm of its own (what is in it, not what pfs wants)."""
        if not self.enabled or user is None:
            return False
        try:
            fd = os.open(self._homes / user, _DIR_FLAGS)
        except OSError:
            return False
        try:
            return quota_of(fd) is not None
        finally:
            os.close(fd)

    def crosses_realms(self, src_owner: str | None, dst_owner: str | None) -> bool:
        """Whether a move between these homes (None: public) leaves or enters a quota realm."""
        return src_owner != dst_owner and (self.has_quota(src_owner) or self.has_quota(dst_owner))

    def _apply(self, user: str, limit: int | None) -> bool:
        check_name(user, f"home {user!r}")
        try:
            fd = os.open(self._homes / user, _DIR_FLAGS)
        except (FileNotFoundError, NotADirectoryError):
            return False  # created on the user's first write; the next sync applies it
        try:
            before = quota_of(fd)
            set_quota(fd, limit)
        except PermissionError as exc:
            # A client without the `p` MDS capability may not set quotas. Uploads go on with
            # pfs's own accounting; this is said once per change, not on every request.
            log.warning("pfs_ceph_quota_refused", user=user, limit=limit, error=exc.strerror)
            return True
        finally:
            os.close(fd)
        if before != limit:
            # Not what pfs set last: somebody else changed the xattr.
            changed = user in self._applied and self._applied[user] != before
            report = log.warning if changed else log.info
            report("pfs_ceph_quota_set", user=user, limit=limit, before=before, changed_by_others=changed)
        return True
