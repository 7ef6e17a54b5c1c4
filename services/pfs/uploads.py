"""tus 1.0 uploads into PFS at /api/v1/pfs/uploads (docs/pfs.md, shared/TUS.md).

An upload is a part `<id>.part` in its volume's staging (`Staging`, common/storage; on a
POSIX root `.uploads/` under the datacenter root) plus a JSON record `<id>.info`. Its
offset is always the part's size: bytes are appended as they arrive and made durable
before an offset is acknowledged, so whatever a client was told survives a crash, and
whatever it was not told is simply sent again. When the last byte is in, the file is
verified and placed (`Staging.place`: a rename on the same filesystem, never visible
half-written); each completion step is idempotent, so a crash between any two is
finished by the next HEAD or PATCH.

Appending takes one of two paths by the staging's `direct`: a POSIX staging file is
written through its descriptor, read back from the page cache to be hashed in threads
and fdatasynced as the body arrives (`_receive_direct`); any other medium is given the
body's pieces (`Staging.append`), hashed here in the loop (`_receive_streaming`).

One request at a time works on an upload (an asyncio lock per id, this service being one
process; several replicas would need a lease in the store as well). Like tusd's request
unlock, a newer HEAD, PATCH or DELETE asks an in-flight PATCH to stop, keep what it has
and let go, so a client reconnecting after a dead connection is never stuck behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog
from prometheus_client import CollectorRegistry

from paddlecloud.common.errors import DomainError, Exists
from paddlecloud.common.internal_auth import Identity
from paddlecloud.common.quantity import readable_bytes
from paddlecloud.common.storage.base import AbstractVolume
from paddlecloud.common.storage.posix import ChunkWriter, PosixStaging
from paddlecloud.common.store import Store
from paddlecloud.common.volume import PathNotFound, PfsPath, check_access

from . import tus
from .errors import (
    BadLength,
    BadMetadata,
    BodyStalled,
    ChecksumMismatch,
    Conflict,
    MismatchedOffset,
    OverMaxSize,
    QuotaExceeded,
    StorageFull,
    UploadExpired,
    UploadFailed,
    UploadInterrupted,
    UploadLocked,
    UploadNotFound,
    UploadTooLarge,
    code_of,
    refusal_for,
)
from .figures import PfsFigures
from .packages import check_package
from .records import Record

log = structlog.get_logger()

GC_TASK = "pfs-uploads-gc"
GC_INTERVAL = 600.0
# How long a request waits for the one before it on the same upload (which was asked to
# stop and only has to sync what it received) before it gives up (UploadLocked).
LOCK_TIMEOUT = 30.0
_ID = re.compile(r"^[A-Za-z0-9_-]{32}$")
_SHA256_HEX = re.compile(r"^[0-9a-fA-F]{64}$")
_FULL = (errno.ENOSPC, errno.EDQUOT)
SYNC_EVERY = 4 * 1024 * 1024
# Received bytes are hashed in worker threads a batch of this size at a time; a chunk of
# up to this size is hashed whole while it is being fdatasynced.
HASH_BATCH = 16 * 1024 * 1024
HASH_READ_BLOCK = 1024 * 1024

T = TypeVar("T")


async def _blocking(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run file-system work in a thread. If the caller is cancelled meanwhile, the thread
    still finishes before the cancellation goes on, so the descriptors it uses stay valid."""
    future = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        await asyncio.wait({future})
        raise


async def _all(*steps: Awaitable[Any]) -> None:
    """Run `steps` at once and wait for every one of them, then raise the first error."""
    for outcome in await asyncio.gather(*steps, return_exceptions=True):
        if isinstance(outcome, BaseException):
            raise outcome


def _hash_back(fd: int, offset: int, length: int, digest: Any) -> None:
    """Feed `length` bytes of `fd` from `offset` to `digest`, a block at a time."""
    while length > 0:
        block = os.pread(fd, min(HASH_READ_BLOCK, length), offset)
        if not block:
            raise OSError(errno.EIO, "the staging file is shorter than what was written to it")
        digest.update(block)
        offset += len(block)
        length -= len(block)


class _Hashing:
    """The digests of one PATCH body (the chunk's checksum, the whole file's sha256).

    With a readable descriptor, what was written is read back from the page cache and
    hashed in worker threads, each digest in a thread of its own (hashlib lets go of the
    GIL): the event loop only receives and writes, and no received bytes are kept for
    hashing, so memory stays flat however many uploads run at once. A batch (HASH_BATCH)
    is hashed at a time, in order; a chunk up to HASH_BATCH long is hashed while it is
    fdatasynced, when the CPU would otherwise be waiting for the disk.

    Without one (a chunk staged beside the staging file), pieces are hashed as they come.
    """

    def __init__(self, digests: list[Any], fd: int | None, start: int) -> None:
        self._digests = digests
        self._fd = fd
        self._start = start  # where the body's first byte is in the file
        self._written = 0
        self._queued = 0  # bytes handed to the threads
        self._running: asyncio.Future[Any] | None = None

    def wrote(self, piece: bytes) -> bool:
        """Account for bytes just written; True when a batch is waiting for `flush`."""
        if self._fd is None:
            for digest in self._digests:
                digest.update(piece)
            return False
        self._written += len(piece)
        return bool(self._digests) and self._written - self._queued >= HASH_BATCH

    async def flush(self) -> None:
        """Start hashing what was written since the last batch, once that batch is done."""
        await self.settle()
        if self._fd is None or not self._digests or self._queued == self._written:
            return
        offset, length = self._start + self._queued, self._written - self._queued
        self._queued = self._written
        loop = asyncio.get_running_loop()
        self._running = asyncio.gather(
            *(loop.run_in_executor(None, _hash_back, self._fd, offset, length, d) for d in self._digests)
        )

    async def finish(self) -> None:
        """Hash everything written and wait until the digests are complete."""
        await self.flush()
        await self.settle()

    async def settle(self) -> None:
        """Wait for the batch being hashed, even if cancelled meanwhile: the digests must
        not change under whoever reads them next, nor the file under the threads."""
        running = self._running
        if running is None:
            return
        try:
            await asyncio.shield(running)
        except asyncio.CancelledError:
            await asyncio.wait({running})
            raise
        finally:
            if running.done():
                self._running = None


class _Slot:
    """The lock of one upload, and how to ask whoever holds it to stop reading."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0
        self.stop_requested = False
        self.on_stop: Callable[[], None] | None = None

    def request_stop(self) -> None:
        self.stop_requested = True
        if self.on_stop is not None:
            self.on_stop()


# A body as it arrives: each call gives the next piece, b"" at its end; a broken
# connection raises ConnectionError. The API layer makes one from a request.
ByteSource = Callable[[], Awaitable[bytes]]


# What stops a body before its end: a stall or a newer request (the read deadline), a broken
# connection, a full disk, the handler's cancellation.
_STOPS = (TimeoutError, ConnectionError, OSError, asyncio.CancelledError)


@dataclass(frozen=True)
class _Body:
    """One PATCH body on its way in: for which upload, from which offset, at most how much."""

    source: ByteSource
    record: Record
    slot: _Slot
    start: int
    room: int
    checksum: tus.Checksum | None


def astuple_shallow(body: _Body) -> tuple[ByteSource, Record, _Slot, int, int, tus.Checksum | None]:
    """The body's fields, as they are (dataclasses.astuple would copy the record)."""
    return body.source, body.record, body.slot, body.start, body.room, body.checksum


@dataclass(frozen=True)
class Received:
    """What one PATCH body did: the durable offset after it, and why it stopped early, if it did."""

    offset: int
    refusal: DomainError | None = None


class _Syncer:
    """fdatasync in the background every SYNC_EVERY bytes of a PATCH, one at a time.

    An fdatasync costs in proportion to what was written since the one before, even where
    writeback has already been done (the disk's write cache is flushed too): here 14 ms
    after 16 MiB written back, 0.1 ms after 4 KiB. Syncing as the body arrives leaves the
    fdatasync that the 204 waits for only the last few MiB. In bench/pfs's CLI upload, 4 MiB
    was about 4% faster than syncing only at the end of each 16 MiB chunk; 2 and 8 MiB did as
    well as 4.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._since = 0
        self._future: asyncio.Future[None] | None = None

    def wrote(self, n: int) -> None:
        self._since += n
        if self._since >= SYNC_EVERY and (self._future is None or self._future.done()):
            if self._future is not None and (self._future.cancelled() or self._future.exception()):
                return  # settle() reports it; fsync errors are told once per descriptor
            self._since = 0
            self._future = asyncio.get_running_loop().run_in_executor(None, os.fdatasync, self._fd)

    async def settle(self) -> None:
        """Wait for a background sync in flight (even if cancelled meanwhile); raise its error."""
        if self._future is None:
            return
        try:
            await asyncio.shield(self._future)
        except asyncio.CancelledError:
            await asyncio.wait({self._future})
            raise


class Uploads:
    """The uploads of one datacenter: records, locks, quota, completion and expiry."""

    def __init__(
        self,
        volume: AbstractVolume,
        store: Store,
        *,
        datacenter: str,
        max_size: int,
        expiry_seconds: float,
        read_timeout: float,
        clock: Callable[[], float] = time.time,
        figures: PfsFigures | None = None,
    ) -> None:
        self.figures = figures or PfsFigures(CollectorRegistry(), datacenter)
        self.volume = volume
        self.store = store
        self.datacenter = datacenter
        self.max_size = max_size
        self.expiry_seconds = expiry_seconds
        self.read_timeout = read_timeout
        self.clock = clock
        self.quotas = volume.quotas
        self.staging = volume.staging
        self._records: dict[str, Record] = {}
        # The last known offset of each active upload: what `_reserved` counts for a deferred
        # one without asking the storage (no await between a quota check and its reservation).
        self._offsets: dict[str, int] = {}
        self._slots: dict[str, _Slot] = {}
        # Running sha256 of each upload received in this process's life: (bytes hashed, hasher).
        self._hashers: dict[str, tuple[int, Any]] = {}

    def in_flight(self) -> int:
        """How many uploads are active: created, and not complete, failed, expired or terminated."""
        return sum(1 for record in self._records.values() if record.state == "active")

    async def load(self) -> None:
        records = []
        for raw in await self.staging.load_records():
            try:
                records.append(Record.from_json(raw))
            except (ValueError, TypeError) as exc:
                log.warning("upload_record_unreadable", error=repr(exc))
        self._records = {r.id: r for r in records}
        for record in records:
            if record.state == "active":
                self._offsets[record.id] = await self.staging.part_size(record.id) or 0
        log.info("uploads_loaded", count=len(records))

    async def _write_record(self, record: Record) -> None:
        await self.staging.write_record(record.id, record.to_json())

    async def _part_size(self, upload_id: str) -> int | None:
        """The part's size from the storage, remembered as the upload's offset."""
        size = await self.staging.part_size(upload_id)
        if size is None:
            self._offsets.pop(upload_id, None)
        else:
            self._offsets[upload_id] = size
        return size

    # lookup and locking ----------------------------------------------------------

    def lookup(self, upload_id: str, identity: Identity) -> Record:
        """The caller's own upload; everyone else's, like an unknown one, is not found."""
        record = self._records.get(upload_id) if _ID.match(upload_id) else None
        if record is None or record.owner != identity.user:
            raise UploadNotFound(f"There is no upload {upload_id[:40]!r} of yours here.")
        return record

    async def expiry(self, record: Record) -> float:
        """When an unfinished upload expires: a while after its creation or its last write."""
        last_write = await self.staging.part_mtime(record.id)
        if last_write is None:
            return record.expires
        return max(record.expires, last_write + self.expiry_seconds)

    async def check_alive(self, record: Record) -> None:
        """Refuse an upload that expired or failed (UploadExpired, UploadFailed): start over."""
        if record.state == "expired" or (
            record.state == "active" and await self.expiry(record) <= self.clock()
        ):
            raise UploadExpired(f"Upload {record.id} expired; start a new one.")
        if record.state == "failed":
            raise UploadFailed(
                f"Upload {record.id} failed and was discarded: {record.error.get('detail', '')}",
                reason=record.error.get("code"),
            )

    @contextlib.asynccontextmanager
    async def hold(self, upload_id: str) -> AsyncIterator[_Slot]:
        """Hold the upload's lock, asking a PATCH that holds it to stop and let go first."""
        slot = self._slots.setdefault(upload_id, _Slot())
        slot.users += 1
        try:
            if slot.lock.locked():
                slot.request_stop()
            try:
                async with asyncio.timeout(LOCK_TIMEOUT):
                    await slot.lock.acquire()
            except TimeoutError:
                raise UploadLocked(
                    f"Upload {upload_id} is busy with another request; try again shortly."
                ) from None
            slot.stop_requested = False
            try:
                yield slot
            finally:
                slot.on_stop = None
                slot.lock.release()
        finally:
            slot.users -= 1
            if slot.users == 0:
                self._slots.pop(upload_id, None)

    # creation --------------------------------------------------------------------

    async def create(self, identity: Identity, length: int | None, metadata: tus.Metadata) -> Record:
        """Check everything, reserve the quota and create the staging file and its record."""
        if length is not None and length > self.max_size:
            raise OverMaxSize(
                f"Upload-Length {length} is over this server's Tus-Max-Size of {self.max_size} bytes.",
            )
        path_text = metadata.get("path")
        if not path_text:
            raise BadMetadata(
                "Upload-Metadata must name the destination: "
                "path <base64 of /pfs/<datacenter>/home/<user>/...>."
            )
        sha256 = _sha256(metadata.get("sha256"))
        overwrite = _flag(metadata, "overwrite")
        dest = PfsPath.parse(path_text, self.datacenter)
        check_access(dest, identity, write=True)
        await self._check_destination(dest, overwrite)
        charged_to = dest.owner if dest.area == "home" else None
        now = self.clock()
        record = Record(
            id=secrets.token_urlsafe(24),
            owner=identity.user,
            path=dest.text,
            length=length,
            metadata=metadata.header(),
            sha256=sha256,
            overwrite=overwrite,
            charged_to=charged_to,
            inode=0,
            created=now,
            expires=now + self.expiry_seconds,
        )
        if charged_to is not None and length is not None:
            # No await between the check and the reservation: two uploads racing each
            # other cannot both fit into the same free space.
            await self._check_quota(charged_to, length, exclude=None)
        self._records[record.id] = record
        self._offsets[record.id] = 0
        try:
            record.inode = await self.staging.create_part(record.id)
            await self._write_record(record)
        except OSError as exc:
            self._records.pop(record.id, None)
            self._offsets.pop(record.id, None)
            with contextlib.suppress(OSError):
                await self.staging.remove(record.id, record=True)
            if exc.errno in _FULL:
                raise StorageFull("The filesystem is full; the upload was not created.") from exc
            raise
        log.info("upload_created", upload=record.id, dest=record.path, length=length)
        return record

    async def _check_destination(self, dest: PfsPath, overwrite: bool) -> None:
        if dest.is_area_root:
            raise Conflict(f"{dest}: is a directory; upload to a file beneath it.")
        try:
            st = await self.volume.stat(dest)
        except PathNotFound:
            return  # a home is created on its first write
        except FileNotFoundError:
            return
        except NotADirectoryError:
            raise Conflict(f"{dest}: a file is in the way of its parent directories.") from None
        except OSError as exc:
            raise refusal_for(exc, dest) from exc
        if st.kind == "dir":
            raise Conflict(f"{dest}: is a directory.")
        if not overwrite:
            raise Exists(
                f"{dest}: already exists; upload with metadata 'overwrite 1' (base64 'MQ==') to replace it."
            )

    async def receive_first(
        self, record: Record, identity: Identity, body: ByteSource, checksum: tus.Checksum | None
    ) -> tuple[Record, int]:
        """creation-with-upload: the body sent with the creation of `record` (an empty upload
        is simply finished); the upload and its offset after it.

        A broken or stalled body still created the upload, and the answer says where it is;
        any other refusal is raised."""
        async with self.hold(record.id) as slot:
            if record.length == 0:
                return await self.finish(record, identity), 0
            room = record.length if record.length is not None else self.max_size
            received = await self.receive(body, record, slot, 0, room, checksum)
            refusal = received.refusal
            if refusal is not None and not isinstance(refusal, (UploadInterrupted, BodyStalled)):
                raise refusal
            if record.length is not None and received.offset == record.length:
                record = await self.finish(record, identity)
            return record, received.offset

    async def _check_quota(self, user: str, requested: int, *, exclude: str | None) -> None:
        account = await self.store.get_user(user)
        limit = account.quota.storage_bytes if account is not None else None
        if account is not None:
            await self.quotas.sync(user, limit)  # CephFS: the home enforces it for jobs too
        if limit is None:
            return
        used = (await self.volume.usage(user)).bytes
        reserved = self._reserved(user, exclude)
        if used + reserved + requested > limit:
            held = f", {readable_bytes(reserved)} held by unfinished uploads" if reserved else ""
            raise QuotaExceeded(
                f"Uploading {readable_bytes(requested)} would take {user}'s storage over its quota of "
                f"{readable_bytes(limit)}: {readable_bytes(used)} in use{held}.",
                requested=requested,
                used=used,
                reserved=reserved,
                limit=limit,
            )

    def _reserved(self, user: str, exclude: str | None) -> int:
        total = 0
        for record in self._records.values():
            if record.charged_to == user and record.state == "active" and record.id != exclude:
                # A deferred upload holds what it staged so far.
                staged = record.length if record.length is not None else self._offsets.get(record.id)
                total += staged or 0
        return total

    # HEAD ------------------------------------------------------------------------

    async def status(self, upload_id: str, identity: Identity) -> tuple[Record, int]:
        """The caller's upload and its offset; one whose last byte is in but that was not
        finished (a crash, a full disk at the last step) is finished first."""
        self.lookup(upload_id, identity)  # an unknown id takes no lock
        async with self.hold(upload_id):
            record = self.lookup(upload_id, identity)
            await self.check_alive(record)
            offset = record.length or 0
            if record.state == "active":
                size = await self._part_size(record.id)
                if size is None or size == record.length:
                    try:
                        record = await self.finish(record, identity)
                    except DomainError:
                        await self.check_alive(record)  # the verdict, as this upload's state
                        raise
                else:
                    offset = size
        return record, offset

    # PATCH -----------------------------------------------------------------------

    async def append(
        self,
        upload_id: str,
        identity: Identity,
        body: ByteSource,
        length: int | None,
        offset: int,
        checksum: tus.Checksum | None,
        new_length: int | None,
    ) -> tuple[Record, int]:
        """One PATCH of the caller's upload (`_patch`); the upload and its offset after it."""
        self.lookup(upload_id, identity)  # an unknown id takes no lock
        async with self.hold(upload_id) as slot:
            record = self.lookup(upload_id, identity)
            await self.check_alive(record)
            record = await self._patch(body, length, record, identity, slot, offset, checksum, new_length)
            current = record.length if record.state == "complete" else await self._part_size(record.id)
        return record, current or 0

    async def _patch(
        self,
        body: ByteSource,
        length: int | None,
        record: Record,
        identity: Identity,
        slot: _Slot,
        offset: int,
        checksum: tus.Checksum | None,
        new_length: int | None,
    ) -> Record:
        """Append one PATCH body at `offset` (the caller holds the lock); finish if it was the last.

        `body` gives the body's pieces as they arrive (empty at its end); `length` is its
        announced length, when there is one."""
        if record.state == "complete":
            if new_length is not None and new_length != record.length:
                raise BadLength(f"Upload-Length is {record.length} and cannot change.")
            # A retry of the last PATCH whose answer was lost: nothing to do.
            if offset != record.length:
                raise MismatchedOffset(
                    f"Upload {record.id} is complete at offset {record.length}.", offset=record.length
                )
            await _nothing_past_the_end(body, length, record)
            return record
        current = await self._part_size(record.id)
        if current is None or (record.length is not None and current == record.length):
            # Complete but not finished (a crash, or a full disk at the last step).
            record = await self.finish(record, identity)
            if offset != record.length:
                raise MismatchedOffset(
                    f"Upload {record.id} is complete at offset {record.length}.", offset=record.length
                )
            await _nothing_past_the_end(body, length, record)
            return record
        if new_length is not None:
            await self._declare_length(record, new_length, current)
        if offset != current:
            raise MismatchedOffset(
                f"Upload-Offset is {offset} but upload {record.id} is at {current}: "
                "HEAD it and resume there.",
                offset=current,
            )
        room = (record.length if record.length is not None else self.max_size) - current
        if length is not None and length > room:
            raise UploadTooLarge(
                f"The body ({length} bytes) goes past the end of the upload "
                f"({room} bytes left); nothing was written."
            )
        received = await self.receive(body, record, slot, current, room, checksum)
        if received.refusal is not None:
            raise received.refusal
        if record.length is not None and received.offset == record.length:
            record = await self.finish(record, identity)
        return record

    async def _declare_length(self, record: Record, length: int, current: int) -> None:
        if record.length is not None:
            if length != record.length:
                raise BadLength(f"Upload-Length is {record.length} and cannot change.")
            return
        if length < current:
            raise BadLength(f"Upload-Length {length} is less than the {current} bytes already received.")
        if length > self.max_size:
            raise OverMaxSize(
                f"Upload-Length {length} is over this server's Tus-Max-Size of {self.max_size} bytes.",
            )
        if record.charged_to is not None:
            await self._check_quota(record.charged_to, length, exclude=record.id)
        record.length = length
        await self._write_record(record)

    async def receive(
        self,
        body: ByteSource,
        record: Record,
        slot: _Slot,
        start: int,
        room: int,
        checksum: tus.Checksum | None,
    ) -> Received:
        """Append the body as it arrives, at most `room` bytes; sync before returning the new offset.

        A disconnect, a stalled body or a newer request on the upload stops the read:
        what arrived is kept (unless it was a checksummed chunk, which cannot be verified
        any more) and synced, and the refusal says why.
        """
        incoming = _Body(body, record, slot, start, room, checksum)
        if isinstance(self.staging, PosixStaging) and self.staging.direct:
            received = await self._receive_direct(self.staging, incoming)
        else:
            received = await self._receive_streaming(incoming)
        self._offsets[record.id] = received.offset
        return received

    async def _receive_direct(self, staging: PosixStaging, incoming: _Body) -> Received:
        """`receive` on a POSIX staging file, through its descriptor: written as it arrives,
        read back from the page cache to be hashed in threads, fdatasynced as it goes."""
        body, record, slot, start, room, checksum = astuple_shallow(incoming)
        fd = staging.open_part(record.id)
        try:
            writer = staging.writer(record.id, fd, start, verify=checksum is not None)
            syncer = _Syncer(writer.fd)
            whole = self._running_hash(record.id, start)
            saved = whole.copy() if whole is not None and checksum is not None else None
            chunk = checksum.hasher() if checksum is not None else None
            hashing = _Hashing(
                [d for d in (chunk, whole) if d is not None],
                writer.fd if writer.in_place else None,
                start,
            )
            refusal: DomainError | None = None
            cancelled: asyncio.CancelledError | None = None
            loop = asyncio.get_running_loop()
            stopped = False
            try:
                async with asyncio.timeout(self.read_timeout) as scope:

                    def stop() -> None:
                        nonlocal stopped
                        stopped = True
                        scope.reschedule(loop.time())

                    slot.on_stop = stop
                    try:
                        if slot.stop_requested:
                            stop()
                        await self._pump(body, writer, syncer, hashing, room, scope)
                    finally:
                        slot.on_stop = None
            except _STOPS as exc:
                refusal, cancelled = self._interruption(exc, record, stopped)
            synced = time.perf_counter()
            refusal, whole = await self._settle(
                fd, writer, syncer, hashing, checksum, chunk, start, refusal, whole, saved
            )
            offset = os.fstat(fd).st_size
            sync_ms = round((time.perf_counter() - synced) * 1000, 1)
        finally:
            os.close(fd)
        return self._received(record, start, offset, refusal, whole, cancelled, sync_ms=sync_ms)

    def _interruption(
        self, exc: BaseException, record: Record, stopped: bool
    ) -> tuple[DomainError, asyncio.CancelledError | None]:
        """Why a body stopped before its end, as the refusal that answers it (what arrived is
        kept), and the cancellation to raise once that is settled.

        A cancelled handler (a server that cancels handlers of gone clients, or shutdown)
        keeps and syncs what arrived all the same; the caller raises the cancellation after."""
        if isinstance(exc, asyncio.CancelledError):
            return UploadInterrupted("The request was cancelled; what arrived was kept."), exc
        return self._stopped_by(exc, record, stopped), None

    def _stopped_by(self, exc: BaseException, record: Record, stopped: bool) -> DomainError:
        if isinstance(exc, TimeoutError):
            if stopped:
                return UploadInterrupted(
                    f"A newer request on upload {record.id} took over; what arrived was kept."
                )
            return BodyStalled(
                f"The body stalled for {self.read_timeout:g} s; what arrived was kept. HEAD, then resume."
            )
        if isinstance(exc, ConnectionError):
            return UploadInterrupted("The connection broke mid-body; what arrived was kept.")
        if isinstance(exc, OSError) and exc.errno in _FULL:
            return StorageFull(
                "The filesystem is full. What was written before is kept: HEAD the upload and "
                "resume once there is room."
            )
        raise exc

    def _received(
        self,
        record: Record,
        start: int,
        offset: int,
        refusal: DomainError | None,
        whole: Any,
        cancelled: asyncio.CancelledError | None,
        **measured: Any,
    ) -> Received:
        """What one body did, remembered (the running hash), counted and logged; a
        cancellation raised on."""
        self.figures.uploaded.inc(max(0, offset - start))
        if whole is not None:
            self._hashers[record.id] = (offset, whole)
        else:
            self._hashers.pop(record.id, None)
        log.info(
            "upload_chunk_written",
            upload=record.id,
            start=start,
            offset=offset,
            **measured,
            stopped=None if refusal is None else code_of(refusal),
        )
        if cancelled is not None:
            raise cancelled
        return Received(offset, refusal)

    async def _receive_streaming(self, incoming: _Body) -> Received:
        """`receive` on a staging that appends what it is given (`Staging.append`): the body's
        pieces go to it as they arrive, hashed here in the loop. A checksummed chunk that does
        not match, or that was cut short, is truncated back to `start`."""
        body, record, slot, start, room, checksum = astuple_shallow(incoming)
        whole = self._running_hash(record.id, start)
        saved = whole.copy() if whole is not None and checksum is not None else None
        chunk = checksum.hasher() if checksum is not None else None
        loop = asyncio.get_running_loop()
        refusal: DomainError | None = None
        cancelled: asyncio.CancelledError | None = None
        stopped = False
        reading: asyncio.Timeout | None = None
        hashed = 0

        def stop() -> None:
            nonlocal stopped
            stopped = True
            if reading is not None:
                reading.reschedule(loop.time())

        async def pieces() -> AsyncIterator[bytes]:
            # The deadline covers each read of the body only: never the storage's own writes,
            # which a timeout must not cut half-way.
            nonlocal reading, hashed
            left = room
            while left > 0:
                async with asyncio.timeout(self.read_timeout) as scope:
                    reading = scope
                    try:
                        if stopped:
                            stop()
                        piece = await body()
                    finally:
                        reading = None
                if not piece:
                    return
                piece = piece[:left]  # the rest is past the upload's end: never read on
                left -= len(piece)
                for digest in (chunk, whole):
                    if digest is not None:
                        digest.update(piece)
                hashed += len(piece)
                yield piece

        slot.on_stop = stop
        stopped = slot.stop_requested
        try:
            try:
                offset = await self.staging.append(record.id, start, pieces())
            finally:
                slot.on_stop = None
        except _STOPS as exc:
            refusal, cancelled = self._interruption(exc, record, stopped)
        if refusal is not None:
            offset = await self.staging.part_size(record.id) or start
        if checksum is not None:
            refusal = refusal or _mismatch(checksum, chunk, start)
            if refusal is not None and offset != start:
                # An interrupted checksummed chunk cannot be verified: it goes too.
                await self.staging.truncate(record.id, start)
                offset, whole, hashed = start, saved, 0
        if whole is not None and offset != start + hashed:
            whole = None  # the storage kept another amount than was hashed: hash it back at the end
        return self._received(record, start, offset, refusal, whole, cancelled)

    async def _settle(
        self,
        fd: int,
        writer: ChunkWriter,
        syncer: _Syncer,
        hashing: _Hashing,
        checksum: tus.Checksum | None,
        chunk: Any,
        start: int,
        refusal: DomainError | None,
        whole: Any,
        saved: Any,
    ) -> tuple[DomainError | None, Any]:
        """Settle and verify what a body left: sync it, check the chunk's checksum, keep or
        take back the chunk. The refusal to answer (the body's own, or a mismatch or full
        disk found here) and the upload's running hash after it (None when unknown)."""
        try:
            await syncer.settle()
            # An interrupted checksummed chunk cannot be verified: it is discarded below.
            keep = checksum is None or refusal is None
            in_sync = keep and writer.in_place and writer.written > 0
            if in_sync:
                # The chunk goes to disk while its last batch is hashed: the 204 waits for
                # both, and a chunk that turns out not to match is still taken back below.
                await _all(hashing.finish(), _blocking(os.fdatasync, fd))
            else:
                await hashing.finish()
            discarded = False
            if checksum is not None:
                refusal = refusal or _mismatch(checksum, chunk, start)
                if refusal is not None:
                    writer.discard()
                    whole = saved
                    discarded = True  # the truncation must be as durable as the bytes were
                else:
                    writer.commit()
            if discarded or (writer.written and not in_sync):
                await _blocking(os.fdatasync, fd)
        except OSError as exc:
            # Nothing past `start` is known to be on disk: take it back.
            await hashing.settle()
            with contextlib.suppress(OSError):
                writer.discard()
            whole = None
            if exc.errno not in _FULL:
                raise
            refusal = StorageFull("The filesystem is full; the chunk was not stored.")
        return refusal, whole

    async def _pump(
        self,
        body: ByteSource,
        writer: ChunkWriter,
        syncer: _Syncer,
        hashing: _Hashing,
        room: int,
        scope: asyncio.Timeout,
    ) -> None:
        """Copy the body to the writer piece by piece as it arrives, pushing the read deadline on."""
        loop = asyncio.get_running_loop()
        # Pushing the deadline costs a timer each time; doing it once in a while is enough.
        kick_every = min(1.0, self.read_timeout / 4)
        kicked = loop.time()
        left = room
        while left > 0:
            piece = await body()
            if not piece:
                return
            if len(piece) > left:
                piece = piece[:left]  # the rest is past the upload's end: never read on
            left -= len(piece)
            before = writer.written
            try:
                writer.write(piece)
            finally:
                done = writer.written - before
                # Only what was written counts (a full disk may stop a write half-way).
                full = hashing.wrote(piece if done == len(piece) else piece[:done])
            syncer.wrote(done)
            if full:
                await hashing.flush()
            now = loop.time()
            if now - kicked >= kick_every:
                scope.reschedule(now + self.read_timeout)
                kicked = now

    def _running_hash(self, upload_id: str, start: int) -> Any:
        known = self._hashers.get(upload_id)
        if known is not None and known[0] == start:
            return known[1]
        return hashlib.sha256() if start == 0 else None

    # completion ------------------------------------------------------------------

    async def finish(self, record: Record, identity: Identity) -> Record:
        """Verify the received file and move it into place; idempotent, and safe after a crash.

        A verdict about the upload itself (checksum mismatch, destination taken or not
        allowed) fails it for good and discards its data; a full disk or an I/O error
        leaves it complete-but-unfinished, for the next HEAD or PATCH to finish.
        """
        size = await self._part_size(record.id)
        if size is None:
            return await self._recover_placed(record)
        assert record.length is not None and size == record.length
        known = self._hashers.pop(record.id, None)
        if known is not None and known[0] == size:
            digest = known[1].hexdigest()
        else:
            digest = await self.staging.hash_part(record.id)
        if record.sha256 is not None and digest != record.sha256:
            refusal = ChecksumMismatch(
                f"The file's sha256 is {digest}, not the {record.sha256} the upload declared; "
                "it was discarded.",
                expected=record.sha256,
                received=digest,
            )
            await self._fail(record, refusal)
            raise refusal
        try:
            dest = PfsPath.parse(record.path, self.datacenter)
            check_access(dest, identity, write=True)
            await check_package(self.staging, record.id, dest, digest)
            await self._place(record, dest, digest)
        except DomainError as refusal:
            # A full disk or quota is no verdict on the upload: the next HEAD or PATCH finishes it.
            if not isinstance(refusal, StorageFull):
                await self._fail(record, refusal)
            raise
        return await self._mark_complete(record, digest)

    async def _place(self, record: Record, dest: PfsPath, digest: str) -> None:
        """Move the complete part to its destination (`Staging.place`), its failures as refusals."""
        try:
            await self.staging.place(record.id, dest, digest=digest, overwrite=record.overwrite)
        except FileExistsError:
            raise Exists(
                f"{dest}: appeared while uploading; upload again with overwrite to replace it."
            ) from None
        except (IsADirectoryError, NotADirectoryError):
            raise Conflict(
                f"{dest}: a directory is where the file should go, or a file is in the way."
            ) from None
        except OSError as exc:
            if exc.errno == errno.EDQUOT:
                raise await self._over_quota(dest, record.length or 0) from exc
            raise refusal_for(exc, dest) from exc

    async def _over_quota(self, dest: PfsPath, requested: int) -> StorageFull:
        """The refusal (507) of a write the storage refused with EDQUOT, with the home's figures."""
        user = dest.owner if dest.area == "home" and dest.owner is not None else dest.area
        used: int | None = None
        limit: int | None = None
        with contextlib.suppress(OSError, DomainError):
            if dest.owner is not None:
                self.volume.forget_usage(dest.owner)
                used = (await self.volume.usage(dest.owner)).bytes
                account = await self.store.get_user(dest.owner)
                limit = account.quota.storage_bytes if account is not None else None
        shown = {
            key: "unknown" if value is None else readable_bytes(value)
            for key, value in (("used", used), ("limit", limit))
        }
        return StorageFull(
            f"{dest}: the storage quota of {user} is used up ({shown['used']} of {shown['limit']}, "
            f"{readable_bytes(requested)} more requested); nothing was placed, and what was received "
            "is kept.",
            requested=requested,
            used=used,
            limit=limit,
        )

    async def _recover_placed(self, record: Record) -> Record:
        """The staging file is gone: if it is at its destination, the rename happened before a crash."""
        try:
            dest = PfsPath.parse(record.path, self.datacenter)
            digest = await self.staging.placed(record.id, record.inode, dest, record.length or 0)
        except (OSError, DomainError):
            digest = None
        if digest is None:
            refusal = UploadFailed(f"Upload {record.id}'s data is gone; start again.")
            await self._fail(record, refusal)
            raise refusal
        return await self._mark_complete(record, digest)

    async def _mark_complete(self, record: Record, digest: str) -> Record:
        record.state = "complete"
        record.result_sha256 = digest
        record.expires = self.clock() + self.expiry_seconds
        await self._write_record(record)
        self._hashers.pop(record.id, None)
        self._offsets.pop(record.id, None)
        if record.charged_to is not None:
            self.volume.forget_usage(record.charged_to)
            await self.quotas.settle(record.charged_to)  # the home may be new
        log.info("upload_completed", upload=record.id, dest=record.path, size=record.length)
        return record

    async def _fail(self, record: Record, refusal: DomainError) -> None:
        record.state = "failed"
        record.error = {"code": code_of(refusal), "detail": refusal.message}
        record.expires = self.clock() + self.expiry_seconds
        self._hashers.pop(record.id, None)
        self._offsets.pop(record.id, None)
        await self._write_record(record)
        await self.staging.remove(record.id, record=False)
        log.info("upload_failed", upload=record.id, code=code_of(refusal))

    # termination and expiry ------------------------------------------------------

    async def end(self, upload_id: str, identity: Identity) -> None:
        """DELETE (termination): the caller's upload is forgotten, its staging data removed."""
        self.lookup(upload_id, identity)  # an unknown id takes no lock
        async with self.hold(upload_id):
            await self.terminate(self.lookup(upload_id, identity))

    async def terminate(self, record: Record) -> None:
        """Forget the upload and its staging data (a finished file stays where it is)."""
        self._records.pop(record.id, None)
        self._hashers.pop(record.id, None)
        self._offsets.pop(record.id, None)
        await self.staging.remove(record.id, record=True)
        log.info("upload_terminated", upload=record.id, state=record.state)

    async def forget_user(self, user: str) -> int:
        """Terminate every upload a deleted user started (so none lands in a later home of
        the same name); how many."""
        mine = [r for r in self._records.values() if r.owner == user]
        for record in mine:
            async with self.hold(record.id):
                await self.terminate(record)
        return len(mine)

    async def collect(self, now: float | None = None) -> int:
        """Expire abandoned uploads and forget old records; returns how many were touched.

        An expired upload's data goes at once, while its record stays (so it answers UploadExpired)
        for another expiry period. Uploads in use by a request are left for the next round.
        """
        now = self.clock() if now is None else now
        touched = 0
        for record in list(self._records.values()):
            if record.id in self._slots:
                continue
            if record.state == "active":
                if await self.expiry(record) > now:
                    continue
                async with self.hold(record.id):
                    record.state = "expired"
                    record.expires = now + self.expiry_seconds
                    self._hashers.pop(record.id, None)
                    self._offsets.pop(record.id, None)
                    await self._write_record(record)
                    await self.staging.remove(record.id, record=False)
                log.info("upload_expired", upload=record.id)
            elif record.expires <= now:
                async with self.hold(record.id):
                    self._records.pop(record.id, None)
                    await self.staging.remove(record.id, record=True)
            else:
                continue
            touched += 1
        for name in await self.staging.orphans(set(self._records), now - self.expiry_seconds):
            await self.staging.unlink(name)
            touched += 1
        if touched:
            log.info("uploads_collected", count=touched)
        return touched


async def _nothing_past_the_end(body: ByteSource, length: int | None, record: Record) -> None:
    """Refuse a body sent to a complete upload: its bytes would go past the end (tus:
    offset + body ≤ Upload-Length), and answering 204 would say they were kept."""
    if length == 0 or (length is None and not await body()):
        return  # an empty retry of the last PATCH, whose answer was lost
    raise UploadTooLarge(
        f"Upload {record.id} is complete at {record.length} bytes: the body goes past its end "
        "(0 bytes left); nothing was written."
    )


def _mismatch(checksum: tus.Checksum, chunk: Any, start: int) -> ChecksumMismatch | None:
    """The refusal of a chunk whose digest is not the one its Upload-Checksum named."""
    if chunk is None or chunk.digest() == checksum.digest:
        return None
    return ChecksumMismatch(
        f"The chunk's {checksum.algorithm} does not match Upload-Checksum; it was "
        f"discarded and the upload stays at offset {start}.",
        offset=start,
    )


def _sha256(value: str | None) -> str | None:
    """The optional whole-file sha256 from the metadata, as lower-case hex."""
    if value is None:
        return None
    if not _SHA256_HEX.match(value):
        raise BadMetadata("Upload-Metadata: sha256 must be 64 hexadecimal digits.")
    return value.lower()


def _flag(metadata: tus.Metadata, key: str) -> bool:
    """A 0/1 metadata value such as `overwrite`; absent means 0."""
    if not metadata.has(key):
        return False
    value = metadata.get(key)
    if value not in ("0", "1"):
        raise BadMetadata(f"Upload-Metadata: {key} must be base64 of '1' or '0'.")
    return value == "1"
