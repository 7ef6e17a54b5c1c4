"""The SDK's transfer engine: files and trees between a local disk and PFS, resumable and verified.

Uploads speak tus 1.0 (`docs/pfs.md`): one POST creates the upload with the destination, the
whole file's sha256 (the server refuses to place a file that does not match it) and the
overwrite flag; PATCHes then send `CHUNK_SIZE` pieces, each with its own `Upload-Checksum`.
The upload URL is remembered in `<home>/.paddle/uploads.json` under (endpoint, user, absolute
local path, size, mtime_ns, destination), so the next run HEADs it and continues from the
server's offset; a 404 or 410 there (expired, collected) starts over.

Downloads stream into `<dest>.paddlecloud-part`, whose server ETag is remembered in the same
file; the next run asks for the rest with `Range` and `If-Range: <etag>` (a 200 instead of a
206 means the file changed, so it starts over). Every finished transfer is compared by sha256
with what the other side holds, unless verification is turned off; the part file is renamed
into place only after that.

Trees are walked on one side and listed (`ls?recursive=1`) on the other; files already
identical at the destination (same size, then same sha256) are skipped; several files move
at once (`jobs`).

`on_chunk`, when given, is called with the running count after each upload chunk the server
acknowledged and each chunk's worth of download bytes written (the e2e tests stop a transfer
there, as if it were killed, to see it resume).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import posixpath
import stat
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Literal
from urllib.parse import urlsplit

from isal.isal_zlib import crc32

from . import pfspaths
from .config import DEFAULT_JOBS, atomic_write
from .errors import ApiError, ConnectionProblem, PaddleCloudError
from .progress import Progress, human_size, summary_text

if TYPE_CHECKING:
    from .client import AsyncClient

# Each PATCH costs a round trip through the gateway and an fdatasync on the server
# whatever its size; 16 MiB measured fastest here (8 and 32 MiB slower: more round trips,
# or a longer tail of hashing and syncing after the last byte). An upload holds two chunks.
CHUNK_SIZE = 16 * 1024 * 1024
READ_BLOCK = 1024 * 1024
# A download's part file is fdatasynced in the background every this many bytes, so the
# fsync before the rename does not find the whole file still in memory (see _PartWriter).
WRITEBACK_EVERY = 8 * 1024 * 1024
TUS_VERSION = "1.0.0"
TUS_HEADERS = {"Tus-Resumable": TUS_VERSION}
PART_SUFFIX = ".paddlecloud-part"
STATE_FILE = "uploads.json"
STATE_VERSION = 1
# Entries this old are dropped: the server collects abandoned uploads long before (24 h by
# default), and a part file's ETag is worth nothing once the user has moved on.
STATE_MAX_AGE = 7 * 24 * 3600.0
# A chunk is tried this many times across network errors, 5xx answers and checksum mismatches
# (460: the bytes were damaged on the way) before the transfer gives up; the next run resumes.
MAX_ATTEMPTS = 5
RETRY_BASE_DELAY = 0.5
RETRY_MAX_DELAY = 8.0
RETRYABLE_STATUSES = frozenset({460, 500, 502, 503, 504})

Direction = Literal["upload", "download"]
Status = Literal["uploaded", "downloaded", "identical", "failed"]


class TransferError(PaddleCloudError):
    """One file could not be transferred; the message names it."""


class TransferFailed(PaddleCloudError):
    """Some files of a tree failed; `report` has what happened to each of them."""

    def __init__(self, report: TransferReport) -> None:
        self.report = report
        failed = [r for r in report.files if r.status == "failed"]
        first = f": {failed[0].error}" if failed else ""
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        super().__init__(f"{len(failed)} of {len(report.files)} files failed{first}{more}")


# --- local files (blocking: called through asyncio.to_thread) --------------------------------


def file_sha256(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    """The file's sha256 in lower-case hex, read in `READ_BLOCK` pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        while block := source.read(READ_BLOCK):
            digest.update(block)
            if on_bytes is not None:
                on_bytes(len(block))
    return digest.hexdigest()


def chunk_checksum(data: bytes) -> str:
    """An `Upload-Checksum` value: the algorithm, then the base64 digest (tus checksum extension).

    CRC-32, not sha256: it is there to catch a chunk damaged on the way, which ISA-L's CRC-32
    does at eight times sha256's speed on both ends of every chunk (zlib's at twice); the whole
    file's sha256 is the end-to-end check.
    """
    return "crc32 " + base64.b64encode(crc32(data).to_bytes(4, "big")).decode("ascii")


def encode_metadata(metadata: Mapping[str, str]) -> str:
    """`Upload-Metadata`: `key base64(value)` pairs joined by commas, as tus defines it."""
    return ",".join(
        f"{key} {base64.b64encode(value.encode()).decode('ascii')}" for key, value in metadata.items()
    )


class _ChunkReader:
    """Reads one upload's chunks; a chunk is held while it is sent, never the whole file.

    The chunk is held (rather than streamed from disk) because its checksum goes in the
    header before the body, and because bytes in hand can be resent after a 460 or a reset.
    At most two are in memory: the one being sent and the next one, read ahead.
    """

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def read(self, offset: int, size: int) -> tuple[bytes, str]:
        # pread: the next chunk is read ahead while this one is sent, and a retry may read
        # again meanwhile, so no shared file position.
        data = os.pread(self._fd, size, offset)
        return data, chunk_checksum(data)

    def close(self) -> None:
        os.close(self._fd)


class _PartWriter:
    """Appends a download to its part file, hashing what it writes.

    Every WRITEBACK_EVERY bytes the file is fdatasynced in a thread of its own, one sync at
    a time, while the download goes on. Left alone, the kernel keeps the whole download dirty
    in memory and the fsync in `finish` writes all of it then; an fdatasync also costs in
    proportion to what was written since the last (the disk's write cache is flushed too).
    Syncing as it goes made a 1 GiB download about 1.4x faster here (bench/pfs); asking the
    kernel to start writeback (POSIX_FADV_DONTNEED) did little for that last fsync.
    """

    def __init__(self, path: Path, start: int, digest: Any) -> None:
        self.path = path
        self.digest = digest
        self._file: BinaryIO = open(path, "r+b" if start else "wb")
        self._file.truncate(start)
        self._file.seek(start)
        self.size = start
        self._synced_at = start
        self._syncer: ThreadPoolExecutor | None = None
        self._sync: Future[None] | None = None

    def write(self, data: bytes) -> None:
        self._file.write(data)
        self.digest.update(data)
        self.size += len(data)
        if self.size - self._synced_at >= WRITEBACK_EVERY and (self._sync is None or self._sync.done()):
            self._sync_in_background()

    def _sync_in_background(self) -> None:
        if self._sync is not None:
            self._sync.result()  # an error of the last one is this download's error
        self._file.flush()
        if self._syncer is None:
            self._syncer = ThreadPoolExecutor(1, thread_name_prefix="pfs-download-sync")
        self._sync = self._syncer.submit(os.fdatasync, self._file.fileno())
        self._synced_at = self.size

    def _settle(self) -> None:
        """Wait for the background sync, if any, and let its thread go."""
        if self._syncer is not None:
            self._syncer.shutdown(wait=True)
            self._syncer = None

    def flush(self) -> None:
        self._file.flush()

    def finish(self) -> None:
        """Durable before the rename that publishes it (STYLE §11)."""
        self._file.flush()
        self._settle()
        if self._sync is not None:
            self._sync.result()
        os.fsync(self._file.fileno())
        self._file.close()

    def close(self) -> None:
        self._settle()  # never close the descriptor under a sync still using it
        self._file.close()


async def _settled(task: asyncio.Future[Any]) -> None:
    """Wait for `task` to end, whatever its outcome; its result is not wanted."""
    with contextlib.suppress(Exception):
        await asyncio.shield(task)


def _hash_prefix(path: Path, size: int, on_bytes: Callable[[int], None] | None) -> Any:
    """A sha256 object fed with the first `size` bytes of `path` (a part file being resumed)."""
    digest = hashlib.sha256()
    left = size
    with open(path, "rb") as source:
        while left > 0 and (block := source.read(min(READ_BLOCK, left))):
            digest.update(block)
            left -= len(block)
            if on_bytes is not None:
                on_bytes(len(block))
    return digest


def _publish(part: Path, dest: Path) -> None:
    os.replace(part, dest)
    with contextlib.suppress(OSError):
        dir_fd = os.open(dest.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _stat_or_none(path: Path) -> os.stat_result | None:
    """os.stat (following symlinks), or None when nothing is there (a file on the way counts)."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _check_parent(dest: Path, shown: str) -> None:
    """Refuse a local destination whose parent directory is missing (`cp` without `-p`)."""
    parent = dest.parent
    info = _stat_or_none(parent)
    if info is None:
        raise TransferError(f"{shown}: the directory {parent} does not exist (-p makes it)")
    if not stat.S_ISDIR(info.st_mode):
        raise TransferError(f"{shown}: {parent} is not a directory")


# --- resume state ----------------------------------------------------------------------------


class ResumeState:
    """Unfinished transfers in one JSON file (mode 0600, replaced atomically on every change).

    Uploads map to their tus URL, downloads to the ETag of the file their part file holds the
    beginning of. A damaged file is treated as empty: losing it costs a restart, not a failure.
    Concurrent transfers in one process serialise through a lock and re-read before writing;
    two processes at once may lose each other's entries, which again only costs a restart.
    """

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()

    @staticmethod
    def upload_key(endpoint: str, user: str, local: Path, size: int, mtime_ns: int, destination: str) -> str:
        # A changed file (size or mtime) is a different upload: the server verifies the
        # sha256 given at creation, which the old bytes would no longer match.
        return json.dumps([endpoint.rstrip("/"), user, str(local), size, mtime_ns, destination])

    @staticmethod
    def download_key(endpoint: str, user: str, remote: str, part: Path) -> str:
        return json.dumps([endpoint.rstrip("/"), user, remote, str(part)])

    def get(self, kind: Literal["uploads", "downloads"], key: str) -> dict[str, Any] | None:
        with self._lock:
            entry = self._read()[kind].get(key)
        return entry if isinstance(entry, dict) else None

    def put(self, kind: Literal["uploads", "downloads"], key: str, record: Mapping[str, Any]) -> None:
        with self._lock:
            state = self._read()
            state[kind][key] = {**record, "updated": self._clock()}
            self._write(state)

    def drop(self, kind: Literal["uploads", "downloads"], key: str) -> None:
        with self._lock:
            state = self._read()
            if state[kind].pop(key, None) is not None:
                self._write(state)

    def stale_uploads(self, endpoint: str, user: str, local: Path, destination: str, keep: str) -> list[str]:
        """Keys of this file's earlier uploads to the same place, made before it changed."""
        prefix = [endpoint.rstrip("/"), user, str(local)]
        found = []
        with self._lock:
            for key in self._read()["uploads"]:
                try:
                    parts = json.loads(key)
                except ValueError:
                    continue
                if (
                    key != keep
                    and isinstance(parts, list)
                    and parts[:3] == prefix
                    and parts[-1] == destination
                ):
                    found.append(key)
        return found

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raw = {}
        state: dict[str, dict[str, Any]] = {"uploads": {}, "downloads": {}}
        if isinstance(raw, dict):
            for kind in state:
                entries = raw.get(kind)
                if isinstance(entries, dict):
                    state[kind] = {k: v for k, v in entries.items() if isinstance(v, dict)}
        return state

    def _write(self, state: dict[str, dict[str, Any]]) -> None:
        cutoff = self._clock() - STATE_MAX_AGE
        for kind in state:
            state[kind] = {
                k: v
                for k, v in state[kind].items()
                if isinstance(v.get("updated"), int | float) and v["updated"] > cutoff
            }
        body = json.dumps({"version": STATE_VERSION, **state}, indent=2, sort_keys=True) + "\n"
        try:
            atomic_write(self.path, body.encode("utf-8"))
        except OSError as exc:
            raise PaddleCloudError(
                f"{self.path}: cannot write the transfer state: {exc.strerror or exc}"
            ) from None


# --- results ---------------------------------------------------------------------------------


@dataclass
class FileResult:
    """What happened to one file: `uploaded`/`downloaded`, `identical` (skipped) or `failed`."""

    source: str
    destination: str
    size: int
    status: Status
    resumed_from: int | None = None
    sha256: str | None = None
    error: str | None = None
    # The failure itself, re-raised as is when a single file was asked for.
    exception: BaseException | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "destination": self.destination,
            "size": self.size,
            "status": self.status,
            "resumed_from": self.resumed_from,
            "sha256": self.sha256,
            "error": self.error,
        }


@dataclass
class TransferReport:
    """Every file of one `upload` or `download`, the directories made, and the time it took."""

    direction: Direction
    files: list[FileResult] = field(default_factory=list)
    directories_created: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def transferred(self) -> list[FileResult]:
        return [r for r in self.files if r.status in ("uploaded", "downloaded")]

    @property
    def identical(self) -> int:
        return sum(1 for r in self.files if r.status == "identical")

    @property
    def failed(self) -> int:
        return sum(1 for r in self.files if r.status == "failed")

    @property
    def resumed(self) -> int:
        return sum(1 for r in self.transferred if r.resumed_from)

    @property
    def bytes(self) -> int:
        return sum(r.size for r in self.transferred)

    def summary(self) -> str:
        """`uploaded 12 files (1.2 GiB) in 8.1s, 3 already identical`."""
        return summary_text(
            "uploaded" if self.direction == "upload" else "downloaded",
            files=len(self.transferred),
            size=self.bytes,
            seconds=self.seconds,
            identical=self.identical,
            resumed=self.resumed,
            failed=self.failed,
            directories=len(self.directories_created),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "direction": self.direction,
            "transferred": len(self.transferred),
            "bytes": self.bytes,
            "identical": self.identical,
            "resumed": self.resumed,
            "failed": self.failed,
            "seconds": round(self.seconds, 3),
            "directories_created": self.directories_created,
            "files": [r.to_dict() for r in self.files],
        }


# --- decisions (pure) ------------------------------------------------------------------------

Decision = Literal["transfer", "identical", "conflict"]


def skip_decision(
    dest_size: int | None, src_size: int, dest_sha256: str | None, src_sha256: str | None, overwrite: bool
) -> Decision:
    """Whether to send a file, skip it (already identical), or refuse (a different file is there).

    `dest_size` is None when nothing is at the destination. Checksums are compared only when
    the sizes match (they are computed only then); a missing checksum never counts as equal.
    """
    if dest_size is None:
        return "transfer"
    if dest_size == src_size and dest_sha256 is not None and dest_sha256 == src_sha256:
        return "identical"
    return "transfer" if overwrite else "conflict"


Placement = Literal["into", "as", "contents"]


def has_trailing_slash(path: str) -> bool:
    """Whether `path` names a directory's contents, as cp and rsync read a source: `data/`, `.`, `..`."""
    return path.endswith(("/", os.sep)) or os.path.basename(path) in (".", "..")


def placement(source: str, dest: str, *, several: bool, dest_is_dir: bool, source_is_dir: bool) -> Placement:
    """Where a source goes, by cp's rule and rsync's trailing slash.

    - `contents`: a directory given with a trailing slash (`data/`, or `.`): what it holds goes
      into `dest`, made if missing; nothing named after the source is made (rsync's `src/`).
    - `into`: `dest/NAME`: with several sources, a `dest` ending in `/` (or `.`, `..`), or a
      `dest` that is an existing directory: copying into an existing directory nests, as cp does.
    - `as`: the source becomes `dest`.

    So `cp -r data pfs:data` makes `pfs:data` the first time and `pfs:data/data` the second;
    `cp -r data/ pfs:data` copies into `pfs:data` every time (and so resumes and skips).
    """
    if source_is_dir and has_trailing_slash(source):
        return "contents"
    if several or has_trailing_slash(dest) or dest_is_dir:
        return "into"
    return "as"


def upload_target(name: str, dest: str, *, into: bool) -> str:
    """Where a source called `name` goes: into the directory `dest`, or to `dest` itself."""
    return pfspaths.join(dest, name) if into else pfspaths.strip_slash(dest)


def download_target(source: str, dest: Path, *, into: bool) -> Path:
    """Where the PFS file or directory `source` goes: into the directory `dest`, or to `dest`."""
    return dest / pfspaths.basename(source) if into else dest


def nesting_note(name: str, dest: str) -> str | None:
    """A word when a directory goes into an existing one of its own name (`data` into `data`):
    most likely a second run, which nests where the first one did not."""
    if pfspaths.basename(dest) != name:
        return None
    shown = dest.rstrip("/" + os.sep)
    return (
        f"{shown} exists: copying {name} into it, as {shown}/{name}; to copy into {shown} "
        f"itself (as a second run should), end the source with a slash: {name}/"
    )


def _upload_location(location: str) -> str:
    """The upload URL as a path on our endpoint.

    Only the path is kept from an absolute `Location`: every request must go through the
    gateway we talk to (with our token), never to an address a service behind it named.
    """
    parts = urlsplit(location)
    path = parts.path or location
    return f"{path}?{parts.query}" if parts.query else path


def _entry_type(entry: Mapping[str, Any] | None) -> str | None:
    return None if entry is None else str(entry.get("type"))


# --- the engine ------------------------------------------------------------------------------


@dataclass
class _UploadTask:
    local: Path
    remote: str
    label: str
    size: int
    existing: Mapping[str, Any] | None = None
    checked: bool = False  # whether `existing` is known (from a listing) or must be asked for


@dataclass
class _DownloadTask:
    remote: str
    local: Path
    label: str
    entry: Mapping[str, Any]


class Transfers:
    """Runs uploads and downloads for one client; one instance per command or SDK call.

    `user` is who the state file's keys name; `on_chunk` is called with the running count of
    chunks moved (see the module's note). `parents`: a download may make the missing parent
    directories of its local destination (`cp -p`); without it, only the destination itself
    (and what lies beneath it) is made. On PFS, missing directories are always made.
    """

    def __init__(
        self,
        client: AsyncClient,
        *,
        user: str,
        state: ResumeState,
        progress: Progress,
        jobs: int = DEFAULT_JOBS,
        overwrite: bool = False,
        verify: bool = True,
        chunk_size: int = CHUNK_SIZE,
        on_chunk: Callable[[int], None] | None = None,
        parents: bool = True,
    ) -> None:
        if jobs < 1:
            raise ValueError(f"jobs must be at least 1, got {jobs}")
        self.client = client
        self.user = user
        self.state = state
        self.progress = progress
        self.jobs = jobs
        self.overwrite = overwrite
        self.verify = verify
        self.chunk_size = chunk_size
        self.parents = parents
        self._on_chunk = on_chunk
        self._chunks = 0

    # --- uploads -----------------------------------------------------------------------------

    async def upload(
        self, sources: Sequence[str | os.PathLike[str]], dest: str, *, recursive: bool = False
    ) -> TransferReport:
        """Upload local files (and with `recursive`, directory trees) to the PFS path `dest`.

        Placement as `placement` says: inside `dest` under the source's own name, as `dest`,
        or, for a directory given as a string ending in `/`, its contents into `dest`.
        """
        started = time.monotonic()
        report = TransferReport("upload")
        tasks: list[_UploadTask] = []
        dirs: list[str] = []
        dest_entry = await self._remote_stat(pfspaths.strip_slash(dest))
        # A home is a directory even before its first write has made it.
        dest_is_dir = _entry_type(dest_entry) == "dir" or pfspaths.is_area_root(dest)
        # On PFS a missing destination's parents are made (docs/pfs.md), and said: a mistyped
        # `pfs:does/not/exist/` must not quietly leave three directories behind.
        ancestors = [] if dest_entry is not None or dest_is_dir else await self._missing_parents(dest)
        tree = len(sources) > 1
        for given in sources:
            text = os.fspath(given)
            source = Path(text)  # without the trailing slash, which `placement` reads from `text`
            info = await asyncio.to_thread(_stat_or_none, source)
            if info is None:
                raise TransferError(f"{text}: no such file or directory")
            source_is_dir = stat.S_ISDIR(info.st_mode)
            if text.endswith(("/", os.sep)) and not source_is_dir:
                raise TransferError(
                    f"{text}: not a directory (a trailing slash names a directory's contents)"
                )
            where = placement(
                text, dest, several=len(sources) > 1, dest_is_dir=dest_is_dir, source_is_dir=source_is_dir
            )
            if where == "into":
                if dest_entry is not None and _entry_type(dest_entry) != "dir":
                    raise TransferError(f"{pfspaths.strip_slash(dest)} exists and is not a directory")
                if dest_entry is None and pfspaths.strip_slash(dest) not in dirs:
                    dirs.append(pfspaths.strip_slash(dest))
            # resolve(): `cp -r . dest/` names the copy after the directory, not ".".
            name = (await asyncio.to_thread(source.resolve)).name
            target = upload_target(name, dest, into=where == "into")
            if source_is_dir:
                if not recursive:
                    raise TransferError(f"{text} is a directory (use -r to upload it and everything in it)")
                tree = True
                if where == "into" and dest_entry is not None and (note := nesting_note(name, dest)):
                    self.progress.note(note)
                await self._plan_upload_tree(source, name, target, tasks, dirs)
            elif stat.S_ISREG(info.st_mode):
                task = _UploadTask(source, target, name, info.st_size)
                if where == "as":
                    task.existing, task.checked = dest_entry, True
                tasks.append(task)
            else:
                raise TransferError(f"{text} is not a regular file")
        report.directories_created.extend(ancestors)  # made by the first mkdir below
        for path in dirs:
            entry = await self.client.pfs_mkdir(path, parents=True)
            report.directories_created.append(str(entry.get("path", path)))
        if ancestors:
            made = ancestors + [d for d in dirs if d == pfspaths.strip_slash(dest)]
            self.progress.note(f"made missing directories on PFS: {', '.join(made)}")
        self.progress.expect(sum(task.size for task in tasks))
        await self._run(tasks, self._upload_guarded, report, raise_single=not tree)
        report.seconds = time.monotonic() - started
        return report

    async def _plan_upload_tree(
        self, root: Path, name: str, target: str, tasks: list[_UploadTask], dirs: list[str]
    ) -> None:
        found = await self._listing(target)
        if found is None:
            listing: dict[str, dict[str, Any]] = {}
            if target not in dirs:
                dirs.append(target)  # made even when the tree is empty
        elif pfspaths.strip_slash(target) in found:
            # A directory's listing holds only what is beneath it; a file's holds the file.
            raise TransferError(f"{target} exists and is not a directory")
        else:
            listing = found
        local_dirs, local_files, skipped = await asyncio.to_thread(_walk, root)
        for line in skipped:
            self.progress.note(line)
        for relative in local_dirs:
            remote = pfspaths.join(target, relative)
            entry = listing.get(remote)
            if entry is None:
                if remote not in dirs:
                    dirs.append(remote)
            elif _entry_type(entry) != "dir":
                raise TransferError(f"{remote} exists and is not a directory (for {root / relative})")
        for relative, size in local_files:
            remote = pfspaths.join(target, relative)
            label = f"{name}/{relative}"
            tasks.append(_UploadTask(root / relative, remote, label, size, listing.get(remote), True))

    async def _upload_guarded(self, task: _UploadTask) -> FileResult:
        try:
            return await self._upload_one(task)
        except (PaddleCloudError, OSError) as exc:
            return self._failure(str(task.local), task.remote, task.size, exc)

    async def _upload_one(self, task: _UploadTask) -> FileResult:
        info = await asyncio.to_thread(os.stat, task.local)
        size = info.st_size
        if size != task.size:
            self.progress.expect(size - task.size)
        existing = task.existing if task.checked else await self._remote_stat(task.remote)
        local_sha: str | None = None
        key = ResumeState.upload_key(
            self.client.endpoint, self.user, task.local.resolve(), size, info.st_mtime_ns, task.remote
        )
        if existing is not None:
            if _entry_type(existing) == "dir":
                raise TransferError(f"{task.remote} is a directory on PFS; {task.local} cannot replace it")
            remote_sha = None
            if existing.get("size") == size:
                local_sha = await self._hash(task.local, task.label, size)
                remote_sha = await self._remote_sha256(task.remote)
            decision = skip_decision(existing.get("size"), size, remote_sha, local_sha, self.overwrite)
            if decision == "identical":
                self.progress.expect(-size)
                await asyncio.to_thread(self.state.drop, "uploads", key)
                self.progress.note(f"skipped {task.label}: already identical at {task.remote}")
                return FileResult(str(task.local), task.remote, size, "identical", sha256=local_sha)
            if decision == "conflict":
                raise TransferError(
                    f"{task.remote} exists and differs from {task.local} (use --overwrite to replace it)"
                )

        url, offset, sha = await self._resume_upload(key, task, size)
        if url is None:
            # No pass over the file before sending: the server verifies every chunk on
            # arrival (Upload-Checksum), the whole file's sha256 is worked out from the
            # chunks as they go, and compared with the server's at the end. A sha256
            # already known (the file was compared with an existing one) is given up front.
            sha = local_sha
            url = await self._create_upload(task.remote, size, sha, task.local.name)
            await asyncio.to_thread(
                self.state.put,
                "uploads",
                key,
                {"url": url, "sha256": sha, "overwrite": self.overwrite, "destination": task.remote},
            )
        resumed_from = offset or None
        if offset:
            self.progress.expect(-offset)
            self.progress.note(f"resuming {task.label} at {human_size(offset)} of {human_size(size)}")
        server_sha, sent_sha = await self._send_chunks(url, task, size, offset)
        if self.verify:
            if server_sha is None:
                server_sha = await self._remote_sha256(task.remote)
            sha = sha or sent_sha or await self._hash(task.local, task.label, size)
            if server_sha != sha:
                raise TransferError(
                    f"{task.remote}: sha256 on PFS ({server_sha}) differs from {task.local}'s ({sha}) "
                    "after the upload"
                )
        await asyncio.to_thread(self.state.drop, "uploads", key)
        self.progress.note(f"uploaded {task.label} -> {task.remote} ({human_size(size)})")
        return FileResult(
            str(task.local), task.remote, size, "uploaded", resumed_from=resumed_from, sha256=sha
        )

    async def _resume_upload(
        self, key: str, task: _UploadTask, size: int
    ) -> tuple[str | None, int, str | None]:
        """(url, offset, sha256) of an unfinished upload of this very file, else (None, 0, None).

        Earlier uploads of the same file to the same place, made before it changed, are
        terminated: their staged bytes would count against the quota until they expire.
        """
        for stale in await asyncio.to_thread(
            self.state.stale_uploads, self.client.endpoint, self.user, task.local.resolve(), task.remote, key
        ):
            record = await asyncio.to_thread(self.state.get, "uploads", stale)
            if record and isinstance(record.get("url"), str):
                with contextlib.suppress(PaddleCloudError):
                    await self.client.request("DELETE", record["url"], headers=TUS_HEADERS)
            await asyncio.to_thread(self.state.drop, "uploads", stale)
        record = await asyncio.to_thread(self.state.get, "uploads", key)
        if record is None or not isinstance(record.get("url"), str):
            return None, 0, None
        url: str = record["url"]
        if bool(record.get("overwrite")) != self.overwrite:
            # Created with the other overwrite flag, which the server checks on completion.
            with contextlib.suppress(PaddleCloudError):
                await self.client.request("DELETE", url, headers=TUS_HEADERS)
            await asyncio.to_thread(self.state.drop, "uploads", key)
            return None, 0, None
        try:
            offset, length = await self._head(url)
        except ApiError as exc:
            if exc.status in (403, 404, 410):
                # Expired, collected, or not ours any more: tus says start over.
                await asyncio.to_thread(self.state.drop, "uploads", key)
                return None, 0, None
            raise
        if length is not None and length != size:
            await asyncio.to_thread(self.state.drop, "uploads", key)
            return None, 0, None
        sha = record.get("sha256")
        return url, offset, sha if isinstance(sha, str) else None

    async def _create_upload(self, remote: str, size: int, sha: str | None, filename: str) -> str:
        metadata = {"path": remote, "filename": filename}
        if sha is not None:
            metadata["sha256"] = sha
        if self.overwrite:
            metadata["overwrite"] = "1"
        headers = {**TUS_HEADERS, "Upload-Length": str(size), "Upload-Metadata": encode_metadata(metadata)}
        async with self.client.open("POST", "pfs/uploads", data=b"", headers=headers) as response:
            location = response.headers.get("Location")
        if not location:
            raise TransferError(f"{self.client.endpoint} created an upload for {remote} without a Location")
        return _upload_location(location)

    async def _head(self, url: str) -> tuple[int, int | None]:
        async with self.client.open("HEAD", url, headers=TUS_HEADERS) as response:
            offset = response.headers.get("Upload-Offset")
            length = response.headers.get("Upload-Length")
        if offset is None or not offset.isdigit():
            raise TransferError(f"{url}: the server's HEAD answer has no Upload-Offset")
        return int(offset), int(length) if length and length.isdigit() else None

    async def _send_chunks(
        self, url: str, task: _UploadTask, size: int, offset: int
    ) -> tuple[str | None, str | None]:
        """PATCH the file from `offset` to its end.

        Returns the server's sha256 of the finished file (if it said) and the sha256 of
        the file as it was read to be sent: the part sent before, when resuming, then each
        chunk as it is read. None if `verify` is off, or if a recovery went on from an offset
        other than where the reads had got to (the caller then hashes the file afresh).
        """
        server_sha: str | None = None
        bar = self.progress.file(task.label, size, offset)
        reader = await asyncio.to_thread(_ChunkReader, task.local)
        whole = await asyncio.to_thread(_hash_prefix, task.local, offset, None) if self.verify else None
        hashed = offset  # `whole` covers the file's bytes before this offset
        ahead: tuple[int, asyncio.Task[tuple[bytes, str]]] | None = None

        def read_and_hash(at: int, length: int) -> tuple[bytes, str]:
            # A chunk joins the whole file's sha256 in the thread that reads it, while the
            # chunk before is on its way, not when it is acknowledged: the CPU is then free
            # for the next PATCH, when client, gateway and pfs all want it at once. Reads run
            # one at a time and in order (below), so `hashed` has one writer at a time.
            nonlocal hashed
            data, checksum = reader.read(at, length)
            if whole is not None and at == hashed:
                whole.update(data)
                hashed = at + len(data)
            return data, checksum

        def read(at: int) -> asyncio.Task[tuple[bytes, str]]:
            length = min(self.chunk_size, size - at)
            return asyncio.create_task(asyncio.to_thread(read_and_hash, at, length), name="pfs-read-ahead")

        try:
            attempt = 0
            while offset < size:
                if ahead is not None and ahead[0] == offset:
                    pending = ahead[1]
                else:
                    if ahead is not None:  # read for an offset we no longer need
                        await _settled(ahead[1])
                    pending = read(offset)
                data, checksum = await pending
                # Read the next chunk from disk while this one travels.
                following = offset + len(data)
                ahead = (following, read(following)) if data and following < size else None
                if not data:
                    raise TransferError(f"{task.local} shrank while it was being uploaded")
                headers = {
                    **TUS_HEADERS,
                    "Content-Type": "application/offset+octet-stream",
                    "Upload-Offset": str(offset),
                    "Upload-Checksum": checksum,
                }
                try:
                    async with self.client.open("PATCH", url, data=data, headers=headers) as response:
                        new_offset = response.headers.get("Upload-Offset")
                        server_sha = response.headers.get("PaddleCloud-Sha256") or server_sha
                except (ApiError, ConnectionProblem) as exc:
                    attempt += 1
                    current = await self._recover(url, task, offset, exc, attempt)
                    if current > offset:
                        bar.update(current - offset)  # kept from the broken PATCH
                    offset = current
                    continue
                if new_offset is None or not new_offset.isdigit() or int(new_offset) <= offset:
                    raise TransferError(
                        f"{url}: the server acknowledged the chunk without a new Upload-Offset"
                    )
                bar.update(int(new_offset) - offset)
                offset = int(new_offset)
                attempt = 0
                self._chunk_done()
        finally:
            if ahead is not None:
                # Not cancelled: that would not stop its thread, which could then read
                # from the descriptor closed below. A read is short; let it finish.
                await _settled(ahead[1])
            reader.close()
            bar.close()
        sent = whole.hexdigest() if whole is not None and hashed == size else None
        return server_sha, sent

    async def _recover(
        self, url: str, task: _UploadTask, offset: int, exc: PaddleCloudError, attempt: int
    ) -> int:
        """After a failed PATCH: the offset to go on from, or raise when that would not help."""
        status = exc.status if isinstance(exc, ApiError) else None
        if status == 409:
            # A wrong offset changes nothing on the server (tus core): ask where it is. A 409
            # at the same offset is something else (the destination appeared meanwhile).
            current, _ = await self._head(url)
            if current != offset and attempt < MAX_ATTEMPTS:
                return current
            raise exc
        if attempt >= MAX_ATTEMPTS or not (status is None or status in RETRYABLE_STATUSES):
            raise exc
        delay = min(RETRY_MAX_DELAY, RETRY_BASE_DELAY * 2 ** (attempt - 1))
        self.progress.note(f"retrying {task.label} at {human_size(offset)} in {delay:g}s: {exc}")
        await asyncio.sleep(delay)
        # The server keeps what it received of a broken PATCH (tus core): HEAD says how much.
        current, _ = await self._head(url)
        return current

    # --- downloads ---------------------------------------------------------------------------

    async def download(
        self, sources: Sequence[str], destination: str | Path, *, recursive: bool = False
    ) -> TransferReport:
        """Download PFS files (and with `recursive`, directory trees) to the local path `destination`.

        Placement as for `upload` (`placement`); a PFS directory ending in `/` gives its contents.
        """
        started = time.monotonic()
        report = TransferReport("download")
        tasks: list[_DownloadTask] = []
        dirs: list[Path] = []
        dest = Path(destination)
        dest_info = await asyncio.to_thread(_stat_or_none, dest)
        dest_is_dir = dest_info is not None and stat.S_ISDIR(dest_info.st_mode)
        if dest_info is None and not self.parents:
            # Checked before anything is asked of PFS or made here: a mistyped destination
            # must not leave a trail of directories behind.
            await asyncio.to_thread(_check_parent, dest, str(destination))
        tree = len(sources) > 1
        for given in sources:
            source = pfspaths.strip_slash(given)
            entry = await self.client.pfs_stat(source)
            kind = _entry_type(entry)
            if given.endswith("/") and kind != "dir":
                raise TransferError(
                    f"{given}: not a directory (a trailing slash names a directory's contents)"
                )
            # On the text given: Path("out/") has lost the slash that says "into out".
            where = placement(
                given,
                str(destination),
                several=len(sources) > 1,
                dest_is_dir=dest_is_dir,
                source_is_dir=kind == "dir",
            )
            if where == "into":
                if dest_info is not None and not dest_is_dir:
                    raise TransferError(f"{dest} exists and is not a directory")
                if dest_info is None and dest not in dirs:
                    dirs.append(dest)
            target = download_target(source, dest, into=where == "into")
            if kind == "dir":
                if not recursive:
                    raise TransferError(
                        f"{source} is a directory (use -r to download it and everything in it)"
                    )
                tree = True
                name = pfspaths.basename(source)
                if where == "into" and dest_is_dir and (note := nesting_note(name, str(destination))):
                    self.progress.note(note)
                await self._plan_download_tree(source, target, tasks, dirs)
            elif kind == "file":
                tasks.append(_DownloadTask(source, target, pfspaths.basename(source), entry))
            else:
                raise TransferError(f"{source} is a {kind}, not a file or directory")
        for path in dirs:
            made = await asyncio.to_thread(_make_dir, path)
            if made:
                report.directories_created.append(str(path))
        self.progress.expect(sum(int(task.entry.get("size") or 0) for task in tasks))
        await self._run(tasks, self._download_guarded, report, raise_single=not tree)
        report.seconds = time.monotonic() - started
        return report

    async def _plan_download_tree(
        self, root: str, target: Path, tasks: list[_DownloadTask], dirs: list[Path]
    ) -> None:
        info = await asyncio.to_thread(_stat_or_none, target)
        if info is not None and not stat.S_ISDIR(info.st_mode):
            raise TransferError(f"{target} exists and is not a directory")
        if target not in dirs:
            dirs.append(target)
        answer = await self.client.pfs_ls(root, recursive=True)
        name = pfspaths.basename(root)
        for entry in answer.get("entries") or []:
            path = str(entry.get("path", ""))
            try:
                relative = pfspaths.relative_to(path, root)
            except ValueError:
                continue
            if not relative:
                continue
            local = target.joinpath(*relative.split("/"))
            kind = _entry_type(entry)
            if kind == "dir":
                dirs.append(local)
            elif kind == "file":
                tasks.append(_DownloadTask(path, local, f"{name}/{relative}", entry))
            else:
                self.progress.note(f"skipped {name}/{relative}: a {kind} on PFS, not a file")

    async def _download_guarded(self, task: _DownloadTask) -> FileResult:
        try:
            return await self._download_one(task)
        except (PaddleCloudError, OSError) as exc:
            return self._failure(task.remote, str(task.local), int(task.entry.get("size") or 0), exc)

    async def _download_one(self, task: _DownloadTask) -> FileResult:
        size = int(task.entry.get("size") or 0)
        local_info = await asyncio.to_thread(_stat_or_none, task.local)
        remote_sha: str | None = None
        if local_info is not None:
            if stat.S_ISDIR(local_info.st_mode):
                raise TransferError(f"{task.local} is a directory; {task.remote} cannot replace it")
            local_sha = None
            if local_info.st_size == size:
                local_sha = await self._hash(task.local, task.label, size)
                remote_sha = await self._remote_sha256(task.remote)
            decision = skip_decision(local_info.st_size, size, local_sha, remote_sha, self.overwrite)
            if decision == "identical":
                self.progress.expect(-size)
                self.progress.note(f"skipped {task.label}: already identical at {task.local}")
                return FileResult(task.remote, str(task.local), size, "identical", sha256=local_sha)
            if decision == "conflict":
                raise TransferError(
                    f"{task.local} exists and differs from {task.remote} (use --overwrite to replace it)"
                )
        if self.verify and remote_sha is None:
            remote_sha = await self._remote_sha256(task.remote)

        part = task.local.with_name(task.local.name + PART_SUFFIX)
        key = ResumeState.download_key(self.client.endpoint, self.user, task.remote, part.resolve())
        record = await asyncio.to_thread(self.state.get, "downloads", key)
        part_info = await asyncio.to_thread(_stat_or_none, part)
        part_size = part_info.st_size if part_info is not None else 0
        start = 0
        if record and isinstance(record.get("etag"), str) and 0 < part_size < size:
            start = part_size
        try:
            got, digest = await self._fetch(task, part, key, start, size, record)
        except ApiError as exc:
            if exc.status != 416 or not start:
                raise
            # The part no longer fits the file (it shrank): fetch it whole.
            got, digest = await self._fetch(task, part, key, 0, size, record)
        if self.verify and digest != remote_sha:
            raise TransferError(
                f"{task.remote}: the downloaded bytes' sha256 ({digest}) differs from PFS's ({remote_sha}); "
                "the file may have changed while it was read, run again"
            )
        await asyncio.to_thread(_publish, part, task.local)
        await asyncio.to_thread(self.state.drop, "downloads", key)
        self.progress.note(f"downloaded {task.label} -> {task.local} ({human_size(got.size)})")
        resumed = got.resumed_from or None
        return FileResult(
            task.remote, str(task.local), got.size, "downloaded", resumed_from=resumed, sha256=digest
        )

    async def _fetch(
        self,
        task: _DownloadTask,
        part: Path,
        key: str,
        start: int,
        size: int,
        record: Mapping[str, Any] | None,
    ) -> tuple[_Fetched, str]:
        headers: dict[str, str] = {}
        if start:
            headers = {"Range": f"bytes={start}-", "If-Range": str(record["etag"]) if record else ""}
        await asyncio.to_thread(_make_dir, task.local.parent)
        async with self.client.open(
            "GET", "pfs/files", params={"path": task.remote}, headers=headers
        ) as response:
            if response.status == 206 and start:
                first = _content_range_start(response.headers.get("Content-Range"))
                if first != start:
                    raise TransferError(
                        f"{task.remote}: asked for bytes from {start}, got a range from {first}"
                    )
                self.progress.note(f"resuming {task.label} at {human_size(start)} of {human_size(size)}")
            elif start:
                # If-Range did not match: the file changed since the part was written.
                self.progress.note(f"{task.label} changed on PFS since the last attempt; starting over")
                start = 0
            length = response.content_length
            total = start + length if length is not None else size
            etag = response.headers.get("ETag")
            if etag:
                await asyncio.to_thread(
                    self.state.put, "downloads", key, {"etag": etag, "size": total, "remote": task.remote}
                )
            self.progress.expect(total - size - start)
            digest: Any = hashlib.sha256()
            if start:
                hashing = self.progress.file(f"sha256 {task.label}", start, counts=False)
                try:
                    digest = await asyncio.to_thread(_hash_prefix, part, start, hashing.update)
                finally:
                    hashing.close()
            writer = await asyncio.to_thread(_PartWriter, part, start, digest)
            bar = self.progress.file(task.label, total, start)
            writing: asyncio.Future[None] | None = None
            next_chunk = (start // self.chunk_size + 1) * self.chunk_size

            async def written() -> None:
                # Wait for the block in the writer's hands, then flush at each chunk boundary.
                nonlocal next_chunk
                if writing is not None:
                    await writing
                while writer.size >= next_chunk:
                    next_chunk += self.chunk_size
                    await asyncio.to_thread(writer.flush)
                    self._chunk_done()

            try:
                async for block in response.content.iter_chunked(READ_BLOCK):
                    # A block is written and hashed in a thread while the next one arrives.
                    await written()
                    writing = asyncio.ensure_future(asyncio.to_thread(writer.write, block))
                    bar.update(len(block))
                await written()
                await asyncio.to_thread(writer.finish)
            finally:
                if writing is not None:
                    await _settled(writing)
                writer.close()
                bar.close()
        if writer.size != total:
            raise TransferError(f"{task.remote}: got {writer.size} bytes of {total}; run again to resume")
        return _Fetched(writer.size, start), writer.digest.hexdigest()

    # --- shared ------------------------------------------------------------------------------

    async def _run(
        self,
        tasks: Sequence[Any],
        worker: Callable[[Any], Awaitable[FileResult]],
        report: TransferReport,
        *,
        raise_single: bool,
    ) -> None:
        """Run `worker` over `tasks`, `jobs` at a time; results in the tasks' order.

        A single file's failure is raised as is (one clear line); in a tree each failure is
        reported as it happens and the others go on.
        """
        results: list[FileResult | None] = [None] * len(tasks)
        queue = deque(enumerate(tasks))
        errors: list[BaseException] = []

        async def run() -> None:
            while queue:
                index, task = queue.popleft()
                result = await worker(task)
                results[index] = result
                if result.exception is not None:
                    errors.append(result.exception)
                    if not raise_single:
                        self.progress.problem(f"{result.source}: {result.error}")

        try:
            async with asyncio.TaskGroup() as group:
                for number in range(min(self.jobs, len(tasks))):
                    group.create_task(run(), name=f"pfs-transfer-{number}")
        except BaseExceptionGroup as group_error:
            # Only what the guards let through gets here (a bug, Ctrl-C): show it, not the group.
            raise group_error.exceptions[0] from None
        report.files.extend(r for r in results if r is not None)
        if raise_single and errors:
            raise errors[0]

    def _failure(self, source: str, destination: str, size: int, exc: BaseException) -> FileResult:
        if isinstance(exc, OSError) and not isinstance(exc, PaddleCloudError):
            where = exc.filename or source
            exc = TransferError(f"{where}: {exc.strerror or exc}")
        return FileResult(source, destination, size, "failed", error=str(exc), exception=exc)

    async def _hash(self, path: Path, label: str, size: int) -> str:
        bar = self.progress.file(f"sha256 {label}", size, counts=False)
        try:
            return await asyncio.to_thread(file_sha256, path, bar.update)
        finally:
            bar.close()

    async def _remote_sha256(self, path: str) -> str | None:
        entry = await self.client.pfs_stat(path, checksum=True)
        value = entry.get("sha256")
        return value if isinstance(value, str) else None

    async def _missing_parents(self, dest: str) -> list[str]:
        """The parent directories of the missing PFS path `dest` that are missing too, top first."""
        missing: list[str] = []
        parent = posixpath.dirname(pfspaths.strip_slash(dest))
        while parent.count("/") > 3 and not pfspaths.is_area_root(parent):
            if await self._remote_stat(parent) is not None:
                break
            missing.insert(0, parent)
            parent = posixpath.dirname(parent)
        return missing

    async def _remote_stat(self, path: str) -> Mapping[str, Any] | None:
        try:
            return await self.client.pfs_stat(path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def _listing(self, path: str) -> dict[str, dict[str, Any]] | None:
        """Everything beneath the directory `path` by path (a file: itself); None if nothing is there."""
        try:
            answer = await self.client.pfs_ls(path, recursive=True)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return {
            pfspaths.strip_slash(str(e.get("path"))): e
            for e in answer.get("entries") or []
            if isinstance(e, dict)
        }

    def _chunk_done(self) -> None:
        self._chunks += 1
        if self._on_chunk is not None:
            self._on_chunk(self._chunks)


@dataclass(frozen=True)
class _Fetched:
    size: int
    resumed_from: int


def _content_range_start(value: str | None) -> int | None:
    # `bytes 100-199/200`
    if not value or not value.startswith("bytes "):
        return None
    first = value[len("bytes ") :].split("-", 1)[0]
    return int(first) if first.isdigit() else None


def _make_dir(path: Path) -> bool:
    """mkdir -p; True if `path` did not exist before."""
    if path.is_dir():
        return False
    path.mkdir(parents=True, exist_ok=True)
    return True


def _walk(root: Path) -> tuple[list[str], list[tuple[str, int]], list[str]]:
    """A local tree as `/`-separated relative paths: directories, (file, size), and skip notes.

    Symlinks to files are followed (their contents are uploaded); symlinks to directories are
    not (they may loop, and PFS has no way to make them); other special files are skipped.
    """
    dirs: list[str] = []
    files: list[tuple[str, int]] = []
    skipped: list[str] = []
    for current, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(current)
        relative_base = base.relative_to(root).as_posix()
        relative_base = "" if relative_base == "." else relative_base
        kept = []
        for name in sorted(dirnames):
            if (base / name).is_symlink():
                skipped.append(f"skipped {base / name}: a symlink to a directory")
            else:
                kept.append(name)
                dirs.append(f"{relative_base}/{name}" if relative_base else name)
        dirnames[:] = kept
        for name in sorted(filenames):
            path = base / name
            try:
                info = path.stat()
            except OSError:
                skipped.append(f"skipped {path}: a broken symlink")
                continue
            if not stat.S_ISREG(info.st_mode):
                skipped.append(f"skipped {path}: not a regular file")
                continue
            files.append((f"{relative_base}/{name}" if relative_base else name, info.st_size))
    return sorted(dirs), sorted(files), skipped
