"""A datacenter's storage as pfs and jobs use it: the operations, not the medium.

Shaped after backend.ai storage-proxy's `AbstractVolume`: one abstract class per thing a
service needs of the storage (stat, list, a ranged read, mkdir, move, remove a tree,
usage and quota, and an upload's staging and commit), with one implementation per medium:

- `posix.PosixVolume`: a directory on this host (local disk or a CephFS mount), every
  path resolved beneath its area by the kernel (`paddlecloud.common.volume.Root`:
  openat2 RESOLVE_BENEATH, O_NOFOLLOW), CephFS's xattr quotas and recursive statistics;
- `hdfs.HdfsVolume`: a directory tree in HDFS over WebHDFS (asynchronous HTTP, no JNI),
  each request made as the platform's HDFS user, `doas` the user it acts for.

The rules stay in the services (who may touch a path, what a home's root may not be,
how a refusal reads); a volume only does what it is asked, beneath the datacenter root.
Failures are `OSError`s with the errno a POSIX file system would give (ENOENT, EEXIST,
ENOTDIR, EISDIR, ENOTEMPTY, EACCES, EDQUOT, ENOSPC, ELOOP for a symlink met where none
is followed, EXDEV for a move the storage refuses across quota realms), or the path
refusals of `paddlecloud.common.volume` (`PathForbidden`, `PathNotFound`); the services
turn them into problems as they always have (pfs: `errors.refusal_for`).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Literal

from ..diskuse import DiskUse
from ..store import Store
from ..volume import PfsPath

Kind = Literal["file", "dir", "symlink", "other"]


@dataclass(frozen=True)
class Stat:
    """What a volume says of one path, never following a symlink."""

    kind: Kind
    size: int  # bytes, for a file; 0 otherwise
    mtime_ns: int
    mode: int  # permission bits (0o7777 at most)
    # Stable for the life of this file (POSIX: device and inode; HDFS: its fileId): with
    # size and mtime it makes a download's ETag.
    ident: str
    target: str | None = None  # a symlink's target, as stored; never followed


@dataclass(frozen=True)
class Entry:
    """One path of a listing: its PFS path text, its name, and its stat."""

    path: str
    name: str
    stat: Stat


@dataclass(frozen=True)
class Children:
    """One page of a directory's entries, by name, and the name to resume after (None: the
    directory holds no more). An entry removed while read is left out of `entries` yet still
    counts towards the page, so `resume` can name an entry that is not there."""

    entries: list[Entry]
    resume: str | None


def tree_order(entry: Entry) -> list[str]:
    """A listing's order: by path components, so that a directory is followed by everything
    beneath it before its next sibling ("a", "a/x", "a-b"), as a paged listing serves it."""
    return entry.path.split("/")


class Download(abc.ABC):
    """A regular file opened for reading: what it was when opened, and its bytes."""

    stat: Stat

    @abc.abstractmethod
    def chunks(self, start: int, length: int) -> AsyncIterator[bytes]:
        """The file's bytes from `start`, `length` of them, fewer if the file is now shorter."""

    async def sendfile(self, transport: object, start: int, length: int) -> int | None:
        """Let the kernel copy the range to `transport` (a socket transport); the bytes sent,
        or None where this volume cannot (then `chunks` serves)."""
        return None

    @abc.abstractmethod
    async def close(self) -> None: ...


class Quotas(abc.ABC):
    """Storage quotas the medium itself holds on each home, so that jobs' own writes are
    bounded too (CephFS: ceph.quota.max_bytes; HDFS: a space quota). Where the medium has
    none, `enabled` is False and pfs alone counts what its uploads add."""

    enabled: bool

    @abc.abstractmethod
    async def sync(self, user: str, limit: int | None) -> None:
        """Make the home of `user` hold `limit` bytes (None: no quota); cheap when unchanged."""

    @abc.abstractmethod
    async def settle(self, user: str, *, check: bool = False) -> None:
        """After pfs made a home: give it the quota remembered for its user."""

    async def sync_all(self, store: Store) -> None:
        """Every user's quota onto their home: the periodic pass that catches homes no
        request of pfs's made (a job's, through a node's mount)."""
        if not self.enabled:
            return
        for user in await store.list_users():
            await self.sync(user.name, user.quota.storage_bytes)
            await self.settle(user.name, check=True)

    @abc.abstractmethod
    def has_quota(self, user: str | None) -> bool:
        """Whether the home of `user` holds a quota of its own (a boundary for renames)."""

    @abc.abstractmethod
    def crosses_realms(self, src_owner: str | None, dst_owner: str | None) -> bool:
        """Whether a move between these areas crosses a quota boundary the medium refuses
        to rename across (CephFS); pfs then asks for copy-and-remove."""


class Staging(abc.ABC):
    """Where an upload's bytes wait until they are complete, and how they are placed.

    A staged upload is `<id>.part` beside its record `<id>.info`, both in the volume's
    staging directory (never under a user's area). The offset of an upload is the size of
    its part: bytes are appended, and what `append` returned is durable. `place` moves a
    complete part to its destination so that nothing half-written is ever visible under
    the destination's name.
    """

    # Whether appending needs the descriptor-level path (POSIX: pread, fdatasync, page
    # cache read-back); a streaming medium (HDFS) appends through `append`.
    direct: bool = False

    @abc.abstractmethod
    async def load_records(self) -> list[bytes]:
        """Every `<id>.info` (raw JSON), those unreadable skipped."""

    @abc.abstractmethod
    async def write_record(self, upload_id: str, data: bytes) -> None:
        """Replace `<id>.info` atomically and durably."""

    @abc.abstractmethod
    async def create_part(self, upload_id: str) -> int:
        """Create the empty part; a number that recognises it at its destination after a
        crash (POSIX: its inode; HDFS: its fileId)."""

    @abc.abstractmethod
    async def part_size(self, upload_id: str) -> int | None:
        """The part's size (the upload's offset); None once it is gone (placed or removed)."""

    @abc.abstractmethod
    async def part_mtime(self, upload_id: str) -> float | None:
        """When the part was last written (seconds since the epoch); None once it is gone."""

    async def append(self, upload_id: str, start: int, pieces: AsyncIterator[bytes]) -> int:
        """Append `pieces` to the part, which is `start` bytes long; the part's size after,
        durable. Pieces already sent when `pieces` raises are kept: the size says how far."""
        raise NotImplementedError("this staging appends through its descriptors (direct)")

    async def truncate(self, upload_id: str, size: int) -> None:
        """Take the part back to `size` bytes (a checksummed chunk that did not match)."""
        raise NotImplementedError("this staging truncates through its descriptors (direct)")

    @abc.abstractmethod
    async def hash_part(self, upload_id: str) -> str:
        """The part's sha256 (hex), read back from the storage."""

    @abc.abstractmethod
    def read_part(self, upload_id: str) -> AsyncGenerator[bytes]:
        """The part's bytes from its start, in pieces, read back from the storage (an async
        generator: close it if you stop early)."""

    @abc.abstractmethod
    async def place(self, upload_id: str, dest: PfsPath, *, digest: str, overwrite: bool) -> None:
        """Move the complete part to `dest`, making its parents (and the home) first.

        Never replaces what is at `dest` unless `overwrite` (FileExistsError), never a
        directory (IsADirectoryError); the placed file is readable, owned like its area,
        and remembers `digest` where the medium can. Idempotent after a crash.
        """

    @abc.abstractmethod
    async def placed(self, upload_id: str, marker: int, dest: PfsPath, length: int) -> str | None:
        """After a crash that lost the part: the sha256 of `dest` if it is this upload's
        placed file (`marker` as `create_part` gave it, and `length` bytes); else None."""

    @abc.abstractmethod
    async def remove(self, upload_id: str, *, record: bool) -> None:
        """Delete the part (and the record with `record`): idempotent."""

    @abc.abstractmethod
    async def orphans(self, known: set[str], older_than: float) -> list[str]:
        """Names of staging leftovers of no upload in `known`, last touched before `older_than`."""

    @abc.abstractmethod
    async def unlink(self, name: str) -> None:
        """Remove one leftover `orphans` named."""


class ReadVolume(abc.ABC):
    """What a service that only reads PFS needs (jobs: a submission's package and inputs,
    a job's training curves in its output)."""

    kind: str  # "posix" or "hdfs"

    @abc.abstractmethod
    async def stat(self, path: PfsPath) -> Stat:
        """`path`'s stat, not following a final symlink (FileNotFoundError if nothing is there)."""

    @abc.abstractmethod
    async def open(self, path: PfsPath) -> Download | None:
        """The regular file at `path` opened for reading; None for a directory;
        OSError(ELOOP) for a symlink, FileNotFoundError where nothing is."""

    @abc.abstractmethod
    async def list(self, path: PfsPath, *, recursive: bool, max_path_bytes: int) -> list[Entry]:
        """A directory's entries (every descendant with `recursive`, never entering a
        symlink), or a file's or symlink's own; in `tree_order`. A tree holding a path
        longer than `max_path_bytes` raises `TreeTooDeep`."""

    @abc.abstractmethod
    async def children(self, path: PfsPath, after: str | None, limit: int) -> Children | Entry:
        """At most `limit` entries of the directory at `path` whose names sort after `after`
        (Python's order of str: code points, so UTF-8 byte order), by name; or, where `path` is
        no directory, the entry of what is there (a symlink's own, never followed). Memory
        bounded by `limit` whatever the directory holds."""

    async def read(self, path: PfsPath, limit: int) -> bytes:
        """At most `limit` bytes from the start of the file at `path`."""
        download = await self.open(path)
        if download is None:
            raise IsADirectoryError(21, "Is a directory", str(path))
        try:
            out = bytearray()
            async for chunk in download.chunks(0, min(limit, download.stat.size)):
                out += chunk
            return bytes(out)
        finally:
            await download.close()

    async def close(self) -> None:  # noqa: B027 (optional: a volume that holds nothing has nothing to do)
        """Let go of what the volume holds (descriptors, HTTP sessions)."""


class AbstractVolume(ReadVolume):
    """A datacenter's storage as pfs serves it: `/pfs/<dc>/home/<user>/...` and `/pfs/<dc>/public/...`."""

    staging: Staging
    quotas: Quotas

    @abc.abstractmethod
    async def check_writable(self) -> None:
        """Raise OSError unless the datacenter root can be written (readiness)."""

    @abc.abstractmethod
    async def ensure_home(self, user: str) -> None:
        """Make `home/<user>` if it is missing (its quota comes with `quotas.settle`)."""

    @abc.abstractmethod
    async def sha256(self, path: PfsPath, *, compute: bool) -> tuple[Stat, str | None] | None:
        """A regular file's stat and sha256: the one remembered with its size and mtime, or
        (with `compute`) read and remembered; None if `path` is not a regular file. A file
        that changes while it is read raises `Changed`."""

    @abc.abstractmethod
    async def mkdir(self, path: PfsPath, *, parents: bool) -> bool:
        """Make the directory (and its parents with `parents`); whether it was made. An
        existing directory is FileExistsError without `parents`; a file in the way is
        FileExistsError or NotADirectoryError."""

    @abc.abstractmethod
    async def remove(self, path: PfsPath, *, recursive: bool) -> None:
        """Remove a file, a symlink, or a directory (one with content only with
        `recursive`, else OSError(ENOTEMPTY)); never following a symlink."""

    @abc.abstractmethod
    async def move(self, src: PfsPath, dst: PfsPath, *, overwrite: bool) -> None:
        """Rename `src` to `dst`: a file at `dst` is replaced only with `overwrite`
        (FileExistsError), a directory never (IsADirectoryError or FileExistsError)."""

    @abc.abstractmethod
    async def usage(self, user: str) -> DiskUse:
        """What the home of `user` holds (bytes, regular files); zero if it has no home.
        May be cached briefly; `forget_usage` drops the figure after a change."""

    @abc.abstractmethod
    def forget_usage(self, user: str) -> None: ...

    @abc.abstractmethod
    async def retire_home(self, user: str, *, archive: bool, stamp: str) -> str | None:
        """Take a deleted user's home out of `home/`: into `archive/<user>.<stamp>` with
        `archive`, else removed; the PFS path it went to, or None."""


class TreeTooDeep(OSError):
    """A recursive listing met a path longer than PFS can name (pfs: TREE_TOO_DEEP)."""

    def __init__(self, path: str, depth: int) -> None:
        super().__init__(f"{path}: holds paths too long to name, {depth} levels down and deeper")
        self.path = path
        self.depth = depth


class Changed(OSError):
    """A file changed while it was being read whole (pfs: a 409 that says try again)."""
