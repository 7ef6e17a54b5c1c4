"""PFS's file operations (docs/pfs.md): resolve a path for a caller, open a download, list,
stat, mkdir, rm, mv, a file's sha256, a home's usage and a deleted user's home, on a
datacenter's storage; the endpoints in api.py call `Files`.

The rules live here, not in the handlers or the storage: who may use a path, what an
area's root may not be, where a caller's own home stands in before it exists, and how a
refusal reads. A refusal is a domain error (errors.py, common/volume.py), which the
service's table shows as a problem. The storage itself (`AbstractVolume`,
common/storage/) resolves every path beneath its area and fails with OSErrors.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from paddlecloud.common.errors import DomainError, Exists, Forbidden, NotFound
from paddlecloud.common.internal_auth import Identity
from paddlecloud.common.storage.base import AbstractVolume, Changed, Download, Stat
from paddlecloud.common.storage.base import TreeTooDeep as StorageTreeTooDeep
from paddlecloud.common.store import Store
from paddlecloud.common.store.models import USER_NAME
from paddlecloud.common.volume import (
    MAX_PATH_BYTES,
    PathForbidden,
    PathNotFound,
    PfsPath,
    check_access,
    check_name,
)

from . import listing
from .errors import BadRequest, Conflict, TreeTooDeep, refusal_for

log = structlog.get_logger()

# Hashing a large file holds a worker thread for minutes; cap how many do so at once so
# downloads and listings (which share asyncio's default executor) are never starved.
HASH_CONCURRENCY = 4


# Refusals -------------------------------------------------------------------------


@contextlib.contextmanager
def fs_errors(path: PfsPath | str) -> Iterator[None]:
    """Storage errors as the domain refuses the request (`errors.refusal_for`)."""
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.ELOOP and not isinstance(exc, PermissionError):
            # Our own O_NOFOLLOW met a symlink swapped in since we looked.
            raise PathForbidden(f"{path}: is a symlink, which this call does not follow") from exc
        raise refusal_for(exc, path) from exc


# Entries --------------------------------------------------------------------------


def _mtime(ns: int) -> str:
    """ISO 8601 in UTC to the microsecond: `2026-11-28T01:02:03.123456+00:00`."""
    seconds, rest = divmod(ns, 10**9)
    return f"{_second(seconds)}.{rest // 1000:06d}+00:00"


@functools.lru_cache(maxsize=4096)
def _second(seconds: int) -> str:
    # A listing's entries share few seconds (a job writes its files together): each is
    # formatted once, not once per entry (a fifth of a 20,000-entry listing's time).
    return datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None).isoformat(timespec="seconds")


def entry_of(text: str, name: str, st: Stat) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "path": text,
        "name": name,
        "type": st.kind,
        "size": st.size if st.kind == "file" else 0,
        "mtime": _mtime(st.mtime_ns),
        "mode": format(st.mode, "04o"),
    }
    if st.target is not None:
        entry["target"] = st.target
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

    def __init__(self, volume: AbstractVolume, store: Store, *, datacenter: str) -> None:
        self.volume = volume
        self.quotas = volume.quotas
        self.store = store
        self.datacenter = datacenter
        self._hash_slots = asyncio.Semaphore(HASH_CONCURRENCY)

    def resolve(self, identity: Identity, text: str, *, write: bool) -> PfsPath:
        """The PFS path `text` names, if `identity` may read it (or write it)."""
        path = PfsPath.parse(text, self.datacenter)
        check_access(path, identity, write=write)
        return path

    async def prepare_write(self, path: PfsPath) -> None:
        """A user's home appears on their first write; `check_access` let only its owner or an admin here."""
        if path.area == "home" and path.owner is not None:
            with fs_errors(path):
                await self.volume.ensure_home(path.owner)

    async def entry(self, path: PfsPath) -> dict[str, Any]:
        """`path`'s entry, describing a symlink rather than what it points to."""
        return entry_of(path.text, path.name, await self.volume.stat(path))

    async def listing(self, identity: Identity, path: PfsPath, recursive: bool) -> list[dict[str, Any]]:
        """A directory's entries (every descendant if `recursive`), or a file's own."""
        try:
            with fs_errors(path):
                try:
                    found = await self.volume.list(path, recursive=recursive, max_path_bytes=MAX_PATH_BYTES)
                except StorageTreeTooDeep as exc:
                    # Such paths could not be named in a later call (MAX_PATH_BYTES: 2,048 levels of
                    # one-letter names at most), and their listing would grow with the square of the depth.
                    raise TreeTooDeep(
                        f"{exc.path}: holds paths longer than {MAX_PATH_BYTES} bytes ({exc.depth} levels "
                        "down and deeper), which PFS cannot name; list a directory further down, "
                        "or remove the tree with rm -r"
                    ) from None
        except PathNotFound:
            # Your own home exists for you before your first write; it is simply empty.
            if not _is_own_home(path, identity):
                raise
            return []
        return [entry_of(e.path, e.name, e.stat) for e in found]

    async def page(
        self, identity: Identity, path: PfsPath, *, recursive: bool, resume: tuple[str, ...], limit: int
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of `listing` (docs/pfs.md): at most `limit` entries in tree order after the
        entry `resume` names (from the previous page's cursor: listing.read_cursor), and the
        next page's cursor (None: this was the last)."""
        try:
            with fs_errors(path):
                top = await self.volume.stat(path)
                if top.kind != "dir":
                    return ([] if resume else [entry_of(path.text, path.name, top)]), None
                found = await listing.page(
                    self.volume.children, path, recursive=recursive, after=resume, limit=limit
                )
        except PathNotFound:
            if not _is_own_home(path, identity):
                raise
            return [], None
        return [entry_of(e.path, e.name, e.stat) for e in found.entries], found.next

    async def open_file(self, identity: Identity, path: PfsPath) -> Download | None:
        """The regular file at `path` opened for reading (the caller closes it); None for a
        directory (or the caller's own home, not made yet): its listing answers."""
        try:
            with fs_errors(path):
                download = await self.volume.open(path)
        except PathNotFound:
            if _is_own_home(path, identity):
                return None
            raise
        if download is not None and download.stat.kind != "file":
            await download.close()
            raise Conflict(f"{path}: is neither a regular file nor a directory")
        return download

    async def stat(self, path: PfsPath, *, sha256: bool) -> dict[str, Any]:
        """`path`'s entry; with `sha256`, a file's carries its sha256 too."""
        with fs_errors(path):
            entry = await self.entry(path)
            if not sha256 or entry["type"] != "file":
                return entry
            try:
                # First the cheap way: what the upload (or an earlier stat) remembered.
                found = await self.volume.sha256(path, compute=False)
                if found is not None and found[1] is None:
                    async with self._hash_slots:
                        found = await self.volume.sha256(path, compute=True)
            except Changed:
                raise Conflict(f"{path}: the file changed while it was being hashed; try again") from None
        if found is None:  # no longer a regular file: it changed under us
            return entry
        st, digest = found
        return {**entry_of(path.text, path.name, st), "sha256": digest}

    async def mkdir(self, path: PfsPath, *, parents: bool) -> tuple[bool, dict[str, Any]]:
        """Whether the directory was made, and its entry; with `parents`, one that exists is fine."""
        await self.prepare_write(path)
        with fs_errors(path):
            try:
                created = await self.volume.mkdir(path, parents=parents)
            except FileExistsError as exc:
                raise await self._in_the_way(path, exc) from None
            entry = await self.entry(path)
        if created:
            log.info("pfs_mkdir", path=path.text)
        return created, entry

    async def _in_the_way(self, path: PfsPath, exc: FileExistsError) -> Exists | Conflict:
        """What a mkdir met: the directory itself (Exists), or something else where a
        directory should be, at `path` or one of its parents (Conflict, naming it)."""
        step = path
        if isinstance(exc.filename, str) and exc.filename != path.text:
            with contextlib.suppress(DomainError):
                step = PfsPath.parse(exc.filename, self.datacenter)
        try:
            st = await self.volume.stat(step)
        except (OSError, DomainError):
            return Exists(f"{path}: already exists")
        if st.kind != "dir":
            # A symlink counts as in the way too: mkdir -p does not follow it.
            return Conflict(f"{step}: a {st.kind} is in the way")
        return Exists(f"{path}: already exists")

    async def remove(self, path: PfsPath, *, recursive: bool) -> None:
        """Remove a file, a symlink, or a directory (one with content only if `recursive`)."""
        if path.is_area_root:
            raise PathForbidden(f"{path}: the root of a home or of public cannot be removed")
        try:
            with fs_errors(path):
                await self.volume.remove(path, recursive=recursive)
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
        await self.prepare_write(dst)
        try:
            await self._move(src, dst, overwrite)
        finally:
            self._forget_usage(src)
            self._forget_usage(dst)
        log.info("pfs_moved", src=src.text, dst=dst.text, overwrite=overwrite)
        with fs_errors(dst):
            return await self.entry(dst)

    async def _move(self, src: PfsPath, dst: PfsPath, overwrite: bool) -> None:
        """The move's rules, said before the storage is asked (which holds them itself, atomically)."""
        with fs_errors(src):
            src_st = await self.volume.stat(src)
        with fs_errors(dst):
            try:
                dst_st: Stat | None = await self.volume.stat(dst)
            except FileNotFoundError:
                dst_st = None
        both = f"{src} → {dst}"
        if dst_st is not None:
            if dst_st.kind == "dir":
                raise Exists(f"{dst}: is a directory, and mv never replaces a directory")
            if not overwrite:
                raise Exists(f"{dst}: already exists (set overwrite to replace it)")
            if src_st.kind == "dir":
                raise Conflict(f"{both}: a directory cannot replace a {dst_st.kind}")
        try:
            await self.volume.move(src, dst, overwrite=overwrite)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                # The kernel's own check, which also sees through symlinks inside the home.
                raise BadRequest(f"{src} cannot be moved into itself ({dst})") from exc
            if exc.errno in (errno.EXDEV, errno.EBUSY) and not isinstance(exc, PermissionError):
                raise Conflict(f"{both}: cannot be moved there (another filesystem or in use)") from exc
            if isinstance(exc, IsADirectoryError):
                raise Exists(f"{dst}: is a directory, and mv never replaces a directory") from exc
            if isinstance(exc, FileExistsError):
                raise Exists(f"{dst}: already exists (set overwrite to replace it)") from exc
            # A parent of `dst` gone meanwhile is the destination's refusal; the rest, the move's.
            with fs_errors(dst if exc.errno in (errno.ENOENT, errno.ENOTDIR) else both):
                raise

    def _forget_usage(self, path: PfsPath) -> None:
        if path.area == "home" and path.owner is not None:
            self.volume.forget_usage(path.owner)

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
        where = await self.volume.retire_home(name, archive=archive, stamp=stamp)
        self.volume.forget_usage(name)
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
        measured = await self.volume.usage(user)
        return HomeUse(user, measured.bytes, measured.files, limit, self.quotas.enabled)
