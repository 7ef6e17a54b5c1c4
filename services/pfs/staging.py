"""Upload staging on disk: `.uploads/<id>.part` files, their `<id>.info` records, and the final move.

Everything here is synchronous file-system work, called from the upload handlers either
inline (appends of what just arrived) or in a thread (fsync, hashing, renames). The
staging directory lives under the datacenter root, on the same filesystem as the homes
(so the final rename is atomic) and outside every home (so no user or job sees it).

Staging files are only ever appended to (O_APPEND, no pre-allocation, no seeks), so an
append-only mount such as HDFS over FUSE can hold them; the offset of an upload is
always its staging file's size.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Protocol

import structlog

log = structlog.get_logger()

State = Literal["active", "complete", "failed", "expired"]
RECORD_VERSION = 1
_READ_BLOCK = 1024 * 1024


@dataclass
class Record:
    """What the service remembers of one upload; the offset is never stored, it is the file's size."""

    id: str
    owner: str  # the user who created it; nobody else may see it
    path: str  # the destination, an absolute PFS path
    length: int | None  # None while deferred (creation-defer-length)
    metadata: str  # the Upload-Metadata header as received (validated, safe to echo)
    sha256: str | None  # the whole file's expected sha256, if the client gave one
    overwrite: bool
    charged_to: str | None  # whose storage quota the upload counts against (None: public)
    inode: int  # the staging file's inode: recognises it at its destination after a crash
    created: float
    # When an unfinished upload expires, unless it was written to later (see Uploads.expiry);
    # for finished, failed and expired ones, when their record is forgotten.
    expires: float
    state: State = "active"
    result_sha256: str | None = None
    error: dict[str, str] = field(default_factory=dict)  # code and detail when failed
    version: int = RECORD_VERSION

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Record:
        data: dict[str, Any] = json.loads(raw)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class ChunkWriter(Protocol):
    """One PATCH body's bytes on their way into a staging file.

    `write` appends what arrived; `commit` makes the chunk part of the upload (the caller
    syncs it afterwards); `discard` puts the upload back as it was before the chunk (a
    checksum mismatch, an interrupted checksummed chunk, a full disk). `in_place` writers
    write into the staging file itself (`fd`, from the chunk's start offset on), so their
    bytes can be read back and synced before `commit`.
    """

    written: int
    fd: int  # where the bytes go until commit
    in_place: bool

    def write(self, data: bytes) -> int: ...

    def commit(self) -> None: ...

    def discard(self) -> None: ...


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
    """For filesystems that cannot truncate (HDFS): a chunk that still needs verifying is
    written beside the staging file and appended to it only once it verified."""

    in_place = False

    def __init__(self, staging: Staging, upload_id: str, part_fd: int) -> None:
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


class Staging:
    """The `.uploads` directory: staging files, records, and moving a finished file into place."""

    def __init__(self, directory: Path, *, can_truncate: bool = True) -> None:
        self.directory = directory
        self.dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        # False on append-only mounts: checksummed chunks are then staged on their own.
        self.can_truncate = can_truncate

    def close(self) -> None:
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1

    # staging files ---------------------------------------------------------------

    def create_part(self, upload_id: str) -> int:
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

    def part_size(self, upload_id: str) -> int | None:
        try:
            return self.stat_part(upload_id).st_size
        except FileNotFoundError:
            return None

    def writer(self, upload_id: str, part_fd: int, start: int, *, verify: bool) -> ChunkWriter:
        if verify and not self.can_truncate:
            return StagedChunkWriter(self, upload_id, part_fd)
        return DirectWriter(part_fd, start)

    def hash_part(self, upload_id: str) -> str:
        """The staging file's sha256, read from disk (after a restart lost the running hash)."""
        fd = os.open(f"{upload_id}.part", os.O_RDONLY | os.O_CLOEXEC, dir_fd=self.dir_fd)
        try:
            return hash_fd(fd)
        finally:
            os.close(fd)

    def remove(self, upload_id: str, *, record: bool) -> None:
        """Delete the upload's staging data (and its record): idempotent."""
        names = [f"{upload_id}.part", f"{upload_id}.chunk"]
        if record:
            names += [f"{upload_id}.info", f"{upload_id}.info.tmp"]
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=self.dir_fd)
        os.fsync(self.dir_fd)

    # records ---------------------------------------------------------------------

    def write_record(self, record: Record) -> None:
        """Replace the record atomically and durably: tmp, fsync, rename, fsync the directory."""
        tmp = f"{record.id}.info.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600, dir_fd=self.dir_fd)
        try:
            DirectWriter(fd, 0).write(record.to_json())
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.dir_fd)
            raise
        os.close(fd)
        os.rename(tmp, f"{record.id}.info", src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        os.fsync(self.dir_fd)

    def load_records(self) -> list[Record]:
        records = []
        for name in os.listdir(self.dir_fd):
            if not name.endswith(".info"):
                continue
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.dir_fd)
                with os.fdopen(fd, "rb") as f:
                    records.append(Record.from_json(f.read()))
            except (OSError, ValueError, TypeError) as exc:
                log.warning("upload_record_unreadable", name=name, error=repr(exc))
        return records

    def orphans(self, known: set[str], older_than: float) -> list[str]:
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

    def unlink(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.dir_fd)


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
