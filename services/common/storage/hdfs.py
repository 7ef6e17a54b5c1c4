"""A datacenter's storage in HDFS, over WebHDFS: the `AbstractVolume` pfs and jobs use.

Layout beneath `pfs.hdfs.root_path` (R): `R/home/<user>`, `R/public`, `R/.uploads` (staged
uploads and their records, the platform's own), `R/archive` (retired homes).

Who acts: the platform's HDFS user (`pfs.hdfs.user`) makes homes, sets quotas and owns
the staging area; it must be an HDFS superuser (in `dfs.permissions.superusergroup`),
since SETOWNER and SETQUOTA are superuser operations. With `proxy_users`, everything done
in a home runs `doas` that home's user, so HDFS's own permissions hold: a home is made
owned by its user, mode 0700, and what pfs creates there belongs to the user. A view
`for_user(name)` runs every operation `doas` the user who asked instead, so HDFS also
refuses what pfs would (another user's home). Without `proxy_users` the platform user does
everything, as root does on a POSIX root, and homes are its own.

What HDFS does not do as POSIX does, and what this does instead:
- Confinement: paths are built from checked components only (`webhdfs.HdfsPath`), never
  from a user's string. HDFS symlinks are off unless an operator turns them on; a path
  whose status says SYMLINK is never followed (ELOOP), and WebHDFS does not resolve one
  inside a path for its client (UnresolvedLinkException, ELOOP).
- sha256 is not something HDFS keeps: it is computed by reading the file and remembered in
  the xattr `user.paddlecloud.sha256` as `<length>:<mtime ms>:<hex>`, trusted only while the
  file's length and mtime are those (an upload sets it on the part before it is renamed).
- Appends are sent in whole APPEND requests of at most `APPEND_BATCH` bytes (bounded
  memory, never a whole file), each closing the file again: a client cut off mid-PATCH
  leaves no half-sent APPEND holding the file's lease, so the next PATCH can append at once.
- After a TRUNCATE not on a block boundary, HDFS recovers the last block before the file
  can be appended to again: `truncate` waits until an empty APPEND succeeds (capped backoff).
- `place` is a rename2: without overwrite it fails when anything is at the destination, so
  a racing writer is never replaced; with overwrite it replaces a file atomically (a
  directory at the destination is refused first).
- Space quotas count every replica and reserve a whole block before writing one: a limit
  of N bytes is set as N x replication, and a write is refused (EDQUOT) once less than
  a block (x replication) remains. Staged parts live outside the homes, so an upload over
  quota is refused at its rename into the home, leaving nothing there.
- Durable: an APPEND is acknowledged once the DataNodes hold the bytes and the file is
  closed again (HDFS's own guarantee); that they are on disk too is the cluster's
  `dfs.datanode.synconclose`, an operator's choice.
- Usage is GETCONTENTSUMMARY's `length` and `fileCount` (bytes as written, not replicas).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import secrets
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING

from ..diskuse import DiskUse
from ..volume import PfsPath
from ..webhdfs import QUOTA_DONT_SET, QUOTA_RESET, FileStatus, HdfsPath, WebHdfs, check_part
from .base import (
    AbstractVolume,
    Changed,
    Children,
    Download,
    Entry,
    Kind,
    Quotas,
    Staging,
    Stat,
    TreeTooDeep,
    tree_order,
)

if TYPE_CHECKING:
    from ..config import HdfsStorage

SHA256_XATTR = "user.paddlecloud.sha256"
APPEND_BATCH = 8 * 1024 * 1024
_HOME_MODE = 0o700
_KINDS: dict[str, Kind] = {"FILE": "file", "DIRECTORY": "dir", "SYMLINK": "symlink"}


def _stat(status: FileStatus) -> Stat:
    return Stat(
        kind=_KINDS.get(status.type, "other"),
        size=status.length if status.type == "FILE" else 0,
        mtime_ns=status.modification_ms * 1_000_000,
        mode=status.permission & 0o7777,
        ident=str(status.file_id),
        target=status.symlink,
    )


def _remembered(status: FileStatus) -> str:
    return f"{status.length}:{status.modification_ms}:"


class HdfsDownload(Download):
    """A file in HDFS opened for reading: OPEN with offset and length, streamed."""

    def __init__(self, client: WebHdfs, path: HdfsPath, stat: Stat, doas: str | None) -> None:
        self.client, self.path, self.stat, self.doas = client, path, stat, doas

    async def chunks(self, start: int, length: int) -> AsyncIterator[bytes]:
        if length <= 0:
            return
        # Closed at once when the reader stops early (a client gone mid-download), so the
        # DataNode's connection goes back to the pool then, not when the generator is collected.
        async with contextlib.aclosing(self.client.open(self.path, start, length, doas=self.doas)) as stream:
            async for chunk in stream:
                yield chunk

    async def close(self) -> None:
        return None


async def _sha256_of(client: WebHdfs, path: HdfsPath, length: int, doas: str | None) -> str:
    digest = hashlib.sha256()
    if length > 0:
        async for chunk in client.open(path, 0, length, doas=doas):
            digest.update(chunk)
    return digest.hexdigest()


async def _batches(
    pieces: AsyncIterator[bytes], limit: int
) -> AsyncIterator[tuple[bytes, BaseException | None]]:
    """`pieces` regrouped into byte strings of at most `limit`; the last one comes with the
    exception `pieces` raised, if it did, so what arrived before it is still written."""
    buffer = bytearray()
    try:
        async for piece in pieces:
            view = memoryview(piece)
            while view:
                take = min(len(view), limit - len(buffer))
                buffer += view[:take]
                view = view[take:]
                if len(buffer) >= limit:
                    yield bytes(buffer), None
                    buffer.clear()
    except Exception as exc:
        yield bytes(buffer), exc
        return
    if buffer:
        yield bytes(buffer), None


class HdfsQuotas(Quotas):
    """Space quotas on each home (SETQUOTA storagespacequota = limit x replication)."""

    enabled = True

    def __init__(self, volume: HdfsVolume) -> None:
        self.volume = volume
        self._limits: dict[str, int | None] = {}
        self._applied: dict[str, int | None] = {}

    async def _apply(self, user: str) -> None:
        limit = self._limits.get(user)
        space = QUOTA_RESET if limit is None else limit * self.volume.replication
        try:
            await self.volume.client.set_quota(self.volume.home(user), namespace=QUOTA_DONT_SET, space=space)
        except FileNotFoundError:
            return  # no home yet: `settle` sets it when pfs makes one
        self._applied[user] = limit

    async def sync(self, user: str, limit: int | None) -> None:
        self._limits[user] = limit
        if user in self._applied and self._applied[user] == limit:
            return
        await self._apply(user)

    async def settle(self, user: str, *, check: bool = False) -> None:
        if user in self._limits and (check or self._applied.get(user, -1) != self._limits[user]):
            await self._apply(user)

    def has_quota(self, user: str | None) -> bool:
        return user is not None and self._limits.get(user) is not None

    def crosses_realms(self, src_owner: str | None, dst_owner: str | None) -> bool:
        # HDFS renames across quota directories, checking the destination's quota itself.
        return False


class HdfsStaging(Staging):
    """Uploads staged in `<root>/.uploads` as the platform user: `<id>.part` and `<id>.info`."""

    direct = False

    def __init__(self, volume: HdfsVolume) -> None:
        self.volume = volume
        self.client = volume.client
        self.dir = volume.root.child(".uploads")

    def _part(self, upload_id: str) -> HdfsPath:
        return self.dir.child(f"{check_part(upload_id)}.part")

    def _record(self, upload_id: str) -> HdfsPath:
        return self.dir.child(f"{check_part(upload_id)}.info")

    async def _status(self, path: HdfsPath) -> FileStatus | None:
        try:
            return await self.client.status(path)
        except FileNotFoundError:
            return None

    async def load_records(self) -> list[bytes]:
        try:
            entries = await self.client.list(self.dir)
        except FileNotFoundError:
            return []
        out = []
        for entry in entries:
            if entry.type != "FILE" or not entry.name.endswith(".info"):
                continue
            try:
                out.append(
                    b"".join([c async for c in self.client.open(self.dir.child(entry.name), 0, entry.length)])
                )
            except OSError:
                continue  # gone since it was listed, or unreadable: skipped, as on POSIX
        return out

    async def write_record(self, upload_id: str, data: bytes) -> None:
        # CREATE then rename2 OVERWRITE: a reader sees the old record or the new, never half.
        temporary = self.dir.child(f"{check_part(upload_id)}.info.tmp")
        await self.client.create(temporary, data, overwrite=True, permission=0o600)
        await self.client.rename(temporary, self._record(upload_id), overwrite=True)

    async def create_part(self, upload_id: str) -> int:
        part = self._part(upload_id)
        await self.client.create(part, b"", overwrite=True, permission=0o600)
        return (await self.client.status(part)).file_id

    async def part_size(self, upload_id: str) -> int | None:
        status = await self._status(self._part(upload_id))
        return None if status is None else status.length

    async def part_mtime(self, upload_id: str) -> float | None:
        status = await self._status(self._part(upload_id))
        return None if status is None else status.modification_ms / 1000

    async def append(self, upload_id: str, start: int, pieces: AsyncIterator[bytes]) -> int:
        part = self._part(upload_id)
        size = start
        async for batch, failure in _batches(pieces, APPEND_BATCH):
            if batch:
                await self.client.append(part, batch)
                size += len(batch)
            if failure is not None:
                raise failure
        return size

    async def truncate(self, upload_id: str, size: int) -> None:
        part = self._part(upload_id)
        if await self.client.truncate(part, size):
            return
        # The last block is being recovered: no APPEND succeeds until the file is closed
        # again. An empty APPEND is the probe (it opens and closes the file, adding nothing).
        delay = 0.05
        deadline = asyncio.get_running_loop().time() + self.volume.timeout
        while True:
            try:
                await self.client.append(part, b"")
                return
            except OSError as exc:
                if exc.errno != errno.EAGAIN or asyncio.get_running_loop().time() > deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def hash_part(self, upload_id: str) -> str:
        part = self._part(upload_id)
        status = await self.client.status(part)
        return await _sha256_of(self.client, part, status.length, None)

    async def read_part(self, upload_id: str) -> AsyncGenerator[bytes]:
        part = self._part(upload_id)
        status = await self.client.status(part)
        if status.length > 0:
            async for chunk in self.client.open(part, 0, status.length, doas=None):
                yield chunk

    async def place(self, upload_id: str, dest: PfsPath, *, digest: str, overwrite: bool) -> None:
        volume = self.volume
        target = volume.hdfs_path(dest)
        doas = volume.doas_for(dest)
        await volume.refuse_existing(target, dest, doas, overwrite=overwrite)
        if dest.owner is not None:
            await volume.ensure_home(dest.owner)
        if len(dest.parts) > 1:
            await self.client.mkdirs(target.parent(), doas=doas)
        part = self._part(upload_id)
        status = await self.client.status(part)
        await self.client.set_xattr(part, SHA256_XATTR, _remembered(status) + digest)
        await self.client.set_permission(part, 0o644)
        if doas is not None:
            await self.client.set_owner(part, doas)
        # rename2: with NONE it fails if anything appeared at `dest` since the check above.
        await self.client.rename(part, target, overwrite=overwrite)

    async def placed(self, upload_id: str, marker: int, dest: PfsPath, length: int) -> str | None:
        status = await self.volume.status_or_none(self.volume.hdfs_path(dest), None)
        if status is None or status.type != "FILE" or status.file_id != marker or status.length != length:
            return None
        value = await self.client.xattr(self.volume.hdfs_path(dest), SHA256_XATTR)
        if value is not None and value.startswith(_remembered(status)):
            return value[len(_remembered(status)) :]
        return await _sha256_of(self.client, self.volume.hdfs_path(dest), length, None)

    async def remove(self, upload_id: str, *, record: bool) -> None:
        await self.client.delete(self._part(upload_id), recursive=False)
        if record:
            await self.client.delete(self._record(upload_id), recursive=False)

    async def orphans(self, known: set[str], older_than: float) -> list[str]:
        try:
            entries = await self.client.list(self.dir)
        except FileNotFoundError:
            return []
        return sorted(
            e.name
            for e in entries
            if e.name.split(".", 1)[0] not in known and e.modification_ms / 1000 < older_than
        )

    async def unlink(self, name: str) -> None:
        await self.client.delete(self.dir.child(name), recursive=False)


class HdfsVolume(AbstractVolume):
    """A datacenter root in HDFS (`pfs.hdfs`); see the module's docstring for the mapping."""

    kind = "hdfs"

    def __init__(
        self,
        client: WebHdfs,
        root: HdfsPath,
        *,
        proxy_users: bool,
        replication: int,
        timeout: float = 60.0,
        acting: str | None = None,
    ) -> None:
        self.client = client
        self.root = root
        self.proxy_users = proxy_users
        self.replication = replication
        self.timeout = timeout
        self.acting = acting
        self.staging: Staging = HdfsStaging(self)
        self.quotas: Quotas = HdfsQuotas(self)

    @classmethod
    def from_config(cls, config: HdfsStorage) -> HdfsVolume:
        """The volume `pfs.hdfs` describes; `close()` it when done."""
        client = WebHdfs(config.namenode, config.user, timeout=config.timeout)
        return cls(
            client,
            HdfsPath.parse(config.root_path),
            proxy_users=config.proxy_users,
            replication=config.replication,
            timeout=config.timeout,
        )

    def for_user(self, user: str) -> HdfsVolume:
        """A view of this volume whose every operation runs `doas` `user` (with
        proxy_users), so HDFS refuses what that user may not do; it shares the client."""
        view = HdfsVolume(
            self.client,
            self.root,
            proxy_users=self.proxy_users,
            replication=self.replication,
            timeout=self.timeout,
            acting=check_part(user),
        )
        view.staging, view.quotas = self.staging, self.quotas
        return view

    async def close(self) -> None:
        if self.acting is None:
            await self.client.close()

    # Paths and identities
    def home(self, user: str) -> HdfsPath:
        return self.root.child("home", user)

    def hdfs_path(self, path: PfsPath) -> HdfsPath:
        area = self.home(str(path.owner)) if path.area == "home" else self.root.child("public")
        return area.child(*path.parts)

    def doas_for(self, path: PfsPath) -> str | None:
        """Whom a request about `path` is made for: the asking user of a `for_user` view,
        else the home's user; None (the platform itself) for public or without proxy_users."""
        if not self.proxy_users:
            return None
        if self.acting is not None:
            return self.acting
        return path.owner if path.area == "home" else None

    async def status_or_none(self, path: HdfsPath, doas: str | None) -> FileStatus | None:
        try:
            return await self.client.status(path, doas=doas)
        except FileNotFoundError:
            return None

    async def refuse_existing(
        self, target: HdfsPath, shown: PfsPath, doas: str | None, *, overwrite: bool
    ) -> None:
        """Before a rename onto `target`: a directory there is never replaced (rename2's
        OVERWRITE would take an empty one), a file only with `overwrite`."""
        existing = await self.status_or_none(target, doas)
        if existing is None:
            return
        if existing.type == "DIRECTORY":
            raise IsADirectoryError(errno.EISDIR, "Is a directory", shown.text)
        if not overwrite:
            raise FileExistsError(errno.EEXIST, "File exists", shown.text)

    # ReadVolume
    async def stat(self, path: PfsPath) -> Stat:
        return _stat(await self.client.status(self.hdfs_path(path), doas=self.doas_for(path)))

    async def open(self, path: PfsPath) -> Download | None:
        target, doas = self.hdfs_path(path), self.doas_for(path)
        status = await self.client.status(target, doas=doas)
        if status.type == "DIRECTORY":
            return None
        if status.type != "FILE":
            raise OSError(errno.ELOOP, "a symlink is never followed", path.text)
        return HdfsDownload(self.client, target, _stat(status), doas)

    # AbstractVolume
    async def check_writable(self) -> None:
        probe = self.root.child(".uploads", ".writable")
        await self.client.create(probe, b"", overwrite=True, permission=0o600)
        await self.client.delete(probe, recursive=False)

    async def ensure_home(self, user: str) -> None:
        home = self.home(user)
        if await self.status_or_none(home, None) is not None:
            return
        # MKDIRS gives its mode to the parents it makes too: `home` itself must stay 0755,
        # or no user could reach their own home beneath it.
        await self.client.mkdirs(home.parent(), permission=0o755)
        if not self.proxy_users:
            await self.client.mkdirs(home, permission=0o755)
            return
        # Made aside in the staging directory, given to its user, then renamed into place: a
        # request of the user's never meets the home between MKDIRS and SETOWNER, still the
        # platform's and 0700, which refuses them. One left aside by a crash is an orphan there.
        aside = self.root.child(".uploads", f"home-{secrets.token_hex(8)}")
        await self.client.mkdirs(aside, permission=_HOME_MODE)
        await self.client.set_owner(aside, user)
        try:
            await self.client.rename(aside, home)
        except FileExistsError:
            # Another request made the home meanwhile.
            await self.client.delete(aside, recursive=False)

    async def list(self, path: PfsPath, *, recursive: bool, max_path_bytes: int) -> list[Entry]:
        doas = self.doas_for(path)
        top = await self.client.status(self.hdfs_path(path), doas=doas)
        if top.type != "DIRECTORY":
            return [Entry(path.text, path.name, _stat(top))]
        out: list[Entry] = []
        pending = [(path, 0)]
        while pending:
            directory, depth = pending.pop()
            for status in await self.client.list(self.hdfs_path(directory), doas=doas):
                child = directory.child(status.name)
                if len(child.text.encode()) > max_path_bytes:
                    raise TreeTooDeep(path.text, depth + 1)
                out.append(Entry(child.text, status.name, _stat(status)))
                if recursive and status.type == "DIRECTORY":
                    pending.append((child, depth + 1))
        out.sort(key=tree_order)
        return out

    async def children(self, path: PfsPath, after: str | None, limit: int) -> Children | Entry:
        # WebHDFS pages a directory itself (LISTSTATUS_BATCH, startAfter, in byte order): the
        # NameNode's batches are read until `limit` entries are in hand, never the whole directory.
        target, doas = self.hdfs_path(path), self.doas_for(path)
        top = await self.client.status(target, doas=doas)
        if top.type != "DIRECTORY":
            return Entry(path.text, path.name, _stat(top))
        out: list[Entry] = []
        start, more = after or "", True
        while more and len(out) < limit:
            batch, more = await self.client.list_batch(target, start, doas=doas)
            out.extend(Entry(f"{path.text}/{s.name}", s.name, _stat(s)) for s in batch)
            if batch:
                start = batch[-1].name
        if len(out) > limit:
            out, more = out[:limit], True
        return Children(out, out[-1].name if more and out else None)

    async def sha256(self, path: PfsPath, *, compute: bool) -> tuple[Stat, str | None] | None:
        target, doas = self.hdfs_path(path), self.doas_for(path)
        status = await self.status_or_none(target, doas)
        if status is None or status.type != "FILE":
            return None
        value = await self.client.xattr(target, SHA256_XATTR, doas=doas)
        if value is not None and value.startswith(_remembered(status)):
            return _stat(status), value[len(_remembered(status)) :]
        if not compute:
            return _stat(status), None
        digest = await _sha256_of(self.client, target, status.length, doas)
        after = await self.client.status(target, doas=doas)
        if (after.length, after.modification_ms, after.file_id) != (
            status.length,
            status.modification_ms,
            status.file_id,
        ):
            raise Changed(errno.EAGAIN, "the file changed while it was read", path.text)
        # Remembered by the platform itself: the user may read the file without being
        # allowed to write it (mode 0444), and the memo is the platform's, not theirs.
        await self.client.set_xattr(target, SHA256_XATTR, _remembered(status) + digest)
        return _stat(status), digest

    async def mkdir(self, path: PfsPath, *, parents: bool) -> bool:
        target, doas = self.hdfs_path(path), self.doas_for(path)
        existing = await self.status_or_none(target, doas)
        if existing is not None:
            if existing.type == "DIRECTORY" and parents:
                return False
            raise FileExistsError(errno.EEXIST, "File exists", path.text)
        if not parents:
            parent = await self.client.status(target.parent(), doas=doas)
            if parent.type != "DIRECTORY":
                raise NotADirectoryError(errno.ENOTDIR, "Not a directory", path.parent().text)
        await self.client.mkdirs(target, doas=doas)
        return True

    async def remove(self, path: PfsPath, *, recursive: bool) -> None:
        target, doas = self.hdfs_path(path), self.doas_for(path)
        # No status first: a symlink's status is refused (ELOOP), but DELETE takes the link
        # itself, never what it points to.
        if not await self.client.delete(target, recursive=recursive, doas=doas):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path.text)
        if path.owner is not None:
            self.forget_usage(path.owner)

    async def move(self, src: PfsPath, dst: PfsPath, *, overwrite: bool) -> None:
        source, target = self.hdfs_path(src), self.hdfs_path(dst)
        # One user's own move runs as that user; a move between areas (an admin's) as the platform.
        doas = self.doas_for(src) if self.doas_for(src) == self.doas_for(dst) else None
        await self.client.status(source, doas=doas)
        await self.refuse_existing(target, dst, doas, overwrite=overwrite)
        await self.client.rename(source, target, overwrite=overwrite, doas=doas)

    async def usage(self, user: str) -> DiskUse:
        try:
            summary = await self.client.content_summary(self.home(user))
        except FileNotFoundError:
            return DiskUse(bytes=0, files=0)
        return DiskUse(bytes=summary.length, files=summary.file_count)

    def forget_usage(self, user: str) -> None:
        # Nothing is cached: GETCONTENTSUMMARY is one NameNode call, kept current by HDFS.
        return None

    async def retire_home(self, user: str, *, archive: bool, stamp: str) -> str | None:
        home = self.home(user)
        status = await self.status_or_none(home, None)
        if status is None or status.type != "DIRECTORY":
            return None
        if not archive:
            await self.client.delete(home, recursive=True)
            return None
        target = self.root.child("archive", f"{check_part(user)}.{check_part(stamp)}")
        await self.client.mkdirs(target.parent(), permission=0o700)
        await self.client.rename(home, target)
        return target.text


__all__ = ["HdfsDownload", "HdfsQuotas", "HdfsStaging", "HdfsVolume"]
