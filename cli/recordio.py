"""RecordIO files: read and write the chunked record format of Go's `github.com/PaddlePaddle/recordio`.

A file is a sequence of chunks. Each chunk is a 20-byte header of five little-endian
uint32 — magic ``0x01020304``, CRC-32 (IEEE, as ``zlib.crc32``) of the compressed
payload, compressor, compressed payload size, number of records — followed by the
compressed payload. Before compression the payload is, for each record, its length as a
little-endian uint32 and then its bytes. There is no file header or footer, so files
can be concatenated.

What was checked against the Go reference (header.go, chunk.go, writer.go):

- compressor 2 is ``compress/gzip``: a gzip stream with its header, not raw deflate or
  zlib. We write it with ``gzip.compress(..., mtime=0)``, which Go reads; we read any
  gzip stream, including several concatenated members.
- compressor 1 is ``snappy.NewBufferedWriter``/``snappy.NewReader`` of
  ``github.com/golang/snappy``: the snappy *framing* format (stream identifier, then
  compressed/uncompressed chunks with masked CRC-32C), not raw snappy blocks. It needs
  the optional ``cramjam`` package (installed by ``python-snappy`` >= 0.7, or by the
  ``recordio-snappy`` extra). We call cramjam directly because python-snappy's own
  ``StreamDecompressor`` silently drops a truncated frame instead of failing.
- the Go writer measures a chunk by the sum of its record lengths and refuses a record
  of ``maxChunkSize`` bytes or more. Our writer measures the whole uncompressed payload
  (length prefixes included), starts a new chunk before that would exceed
  ``max_chunk_size``, and gives a record larger than ``max_chunk_size`` a chunk of its
  own instead of refusing it. Go's reader has no chunk-size limit, so it reads both.
- the Go reader ignores bytes after the last record of a payload; this one reports them
  as a record count mismatch, since no writer produces them.

`reader(path)` and `writer(path)` are the original Python binding's interface (the
PaddlePaddle `recordio` package over the Go library, which the original docs use):
`reader("/pfs/.../housing-*").read()` returns the next record, `b""` for an empty one, and
None at the end of the last file; `path` may be a glob, or several separated by commas.

Every problem found while reading raises `RecordIOError`, whose message names the file
(when known), the chunk's byte offset and what is wrong. Only the standard library is
imported unless a snappy chunk is met: training code imports this in every worker.
"""

from __future__ import annotations

import bisect
import enum
import glob
import gzip
import io
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import IO, Any

__all__ = [
    "DEFAULT_MAX_CHUNK_SIZE",
    "MAGIC",
    "ChunkInfo",
    "Compressor",
    "Index",
    "Reader",
    "RecordIOError",
    "Writer",
    "reader",
    "writer",
]

MAGIC = 0x01020304
DEFAULT_MAX_CHUNK_SIZE = 32 << 20
_HEADER = struct.Struct("<5I")
_LENGTH = struct.Struct("<I")
_UINT32_MAX = 0xFFFFFFFF


class Compressor(enum.IntEnum):
    """How a chunk's payload is compressed; the values are the Go package's constants."""

    NONE = 0
    SNAPPY = 1
    GZIP = 2


class RecordIOError(Exception):
    """A RecordIO file is malformed: bad magic, checksum, compressor, sizes or record counts."""

    def __init__(self, name: str | None, offset: int, problem: str) -> None:
        self.name = name
        self.offset = offset
        self.problem = problem
        where = name if name is not None else "RecordIO stream"
        super().__init__(f"{where}: chunk at byte offset {offset}: {problem}")


@dataclass(frozen=True)
class ChunkInfo:
    """Where one chunk is and what its header says; `first_record` counts from the file's start."""

    offset: int
    checksum: int
    compressor: int
    compressed_size: int
    num_records: int
    first_record: int


@dataclass(frozen=True)
class Index:
    """Chunk offsets and record counts of a file, like the Go package's `Index`."""

    chunks: tuple[ChunkInfo, ...]

    @property
    def num_records(self) -> int:
        if not self.chunks:
            return 0
        last = self.chunks[-1]
        return last.first_record + last.num_records

    def locate(self, record: int) -> tuple[int, int]:
        """Return (chunk number, position within that chunk) of record number `record`."""
        if not 0 <= record < self.num_records:
            raise IndexError(f"record {record} is out of range: the file holds {self.num_records}")
        firsts = [c.first_record for c in self.chunks]
        chunk = bisect.bisect_right(firsts, record) - 1
        # Chunks with zero records share a first_record with their successor; skip them.
        while self.chunks[chunk].num_records == 0:
            chunk += 1
        return chunk, record - self.chunks[chunk].first_record


def _snappy() -> Any:
    try:
        # Imported here: optional, and not worth loading in workers that never meet snappy.
        import cramjam
    except ImportError:
        return None
    return cramjam.snappy


def _compress(payload: bytes, compressor: Compressor) -> bytes:
    if compressor is Compressor.NONE:
        return payload
    if compressor is Compressor.GZIP:
        # mtime=0 keeps output reproducible; Go's gzip.NewWriter writes 0 there too.
        return gzip.compress(payload, mtime=0)
    snappy = _snappy()
    if snappy is None:
        raise RuntimeError(
            "install cramjam (pip install 'paddlecloud[recordio-snappy]', which brings it) "
            "to write snappy-compressed RecordIO"
        )
    return bytes(snappy.compress(payload))


def _name_of(file: object) -> str | None:
    name = getattr(file, "name", None)
    return name if isinstance(name, str) else None


class Writer:
    """Writes records into chunks of at most `max_chunk_size` uncompressed payload bytes.

    `file_or_path` is a path (created or truncated, and closed by `close`) or a binary
    file object (left open by `close`). A chunk is written when the next record would
    not fit, on `flush` and on `close`; a record larger than `max_chunk_size` is written
    as a chunk of its own. Records are bytes-like; empty records are allowed.
    """

    def __init__(
        self,
        file_or_path: str | os.PathLike[str] | IO[bytes],
        compressor: Compressor | int = Compressor.NONE,
        max_chunk_size: int = DEFAULT_MAX_CHUNK_SIZE,
    ) -> None:
        self.compressor = Compressor(compressor)
        if self.compressor is Compressor.SNAPPY and _snappy() is None:
            raise RuntimeError(
                "install cramjam (pip install 'paddlecloud[recordio-snappy]', which brings it) "
                "to write snappy-compressed RecordIO"
            )
        if max_chunk_size <= 0:
            raise ValueError(f"max_chunk_size must be positive, not {max_chunk_size}")
        self.max_chunk_size = max_chunk_size
        self._owns_file = isinstance(file_or_path, str | os.PathLike)
        self._file: IO[bytes] | None = (
            open(file_or_path, "wb") if isinstance(file_or_path, str | os.PathLike) else file_or_path
        )
        self._pending: list[bytes] = []
        self._pending_size = 0
        self.records_written = 0
        self.chunks_written = 0

    def write(self, record: bytes | bytearray | memoryview) -> None:
        """Add one record; it reaches the file when its chunk is full or on flush/close."""
        if self._file is None:
            raise ValueError("write to a closed RecordIO writer")
        if not isinstance(record, bytes | bytearray | memoryview):
            raise TypeError(f"a record must be bytes, not {type(record).__name__}")
        data = bytes(record)
        if len(data) > _UINT32_MAX - _LENGTH.size:
            raise ValueError(f"a record of {len(data)} bytes does not fit RecordIO's uint32 sizes")
        size = _LENGTH.size + len(data)
        if self._pending and self._pending_size + size > self.max_chunk_size:
            self._dump()
        self._pending.append(data)
        self._pending_size += size
        if self._pending_size >= self.max_chunk_size:
            self._dump()

    def flush(self) -> None:
        """Write the pending records as a (possibly short) chunk and flush the file."""
        if self._file is None:
            raise ValueError("flush of a closed RecordIO writer")
        self._dump()
        self._file.flush()

    def close(self) -> None:
        """Write the pending records; close the file if this writer opened it. Idempotent."""
        if self._file is None:
            return
        try:
            self.flush()
        finally:
            if self._owns_file:
                self._file.close()
            self._file = None

    def __enter__(self) -> Writer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _dump(self) -> None:
        if not self._pending:
            return
        assert self._file is not None
        payload = b"".join(_LENGTH.pack(len(r)) + r for r in self._pending)
        compressed = _compress(payload, self.compressor)
        if len(compressed) > _UINT32_MAX:
            raise ValueError(f"a chunk of {len(compressed)} compressed bytes does not fit a uint32 size")
        header = _HEADER.pack(
            MAGIC, zlib.crc32(compressed), int(self.compressor), len(compressed), len(self._pending)
        )
        self._file.write(header + compressed)
        self.records_written += len(self._pending)
        self.chunks_written += 1
        self._pending = []
        self._pending_size = 0


class Reader:
    """Reads records from a RecordIO file, all of them or a range, checking every chunk.

    `file_or_path` is a path (opened here, closed by `close`) or a binary file object
    (left open). Iterating yields every record from the start of the file, reading chunk
    by chunk; that works on unseekable streams. `index`, `read_chunk` and `records` with
    a start need a seekable file, like the Go package's `Index` and `RangeScanner`.
    """

    def __init__(self, file_or_path: str | os.PathLike[str] | IO[bytes]) -> None:
        if isinstance(file_or_path, str | os.PathLike):
            self.name: str | None = os.fspath(file_or_path)
            self._file: IO[bytes] = open(file_or_path, "rb")
            self._owns_file = True
        else:
            self.name = _name_of(file_or_path)
            self._file = file_or_path
            self._owns_file = False
        self._index: Index | None = None

    def __iter__(self) -> Iterator[bytes]:
        return self.records()

    def records(self, start: int = 0, count: int | None = None) -> Iterator[bytes]:
        """Yield `count` records (all remaining if None) beginning with record number `start`."""
        if start < 0 or (count is not None and count < 0):
            raise ValueError(f"start and count must not be negative (got {start}, {count})")
        if count == 0:
            return
        if start == 0:
            yield from self._sequential(count)
            return
        index = self.index()
        if start >= index.num_records:
            return
        chunk_no, skip = index.locate(start)
        remaining = count
        for info in index.chunks[chunk_no:]:
            records = self._read_chunk_at(info.offset)[skip:]
            skip = 0
            if remaining is not None:
                records = records[:remaining]
                remaining -= len(records)
            yield from records
            if remaining == 0:
                return

    def index(self) -> Index:
        """Scan the chunk headers (not the payloads) once and return where each chunk is."""
        if self._index is not None:
            return self._index
        end = self._file.seek(0, io.SEEK_END)
        offset = 0
        first_record = 0
        chunks: list[ChunkInfo] = []
        while offset < end:
            self._file.seek(offset)
            info = self._read_header(offset, first_record)
            assert info is not None  # offset < end, so there is at least one byte
            payload_end = offset + _HEADER.size + info.compressed_size
            if payload_end > end:
                raise RecordIOError(
                    self.name,
                    offset,
                    f"truncated payload: header says {info.compressed_size} bytes, "
                    f"the file holds {end - offset - _HEADER.size}",
                )
            chunks.append(info)
            first_record += info.num_records
            offset = payload_end
        self._index = Index(tuple(chunks))
        return self._index

    def read_chunk(self, chunk: int) -> list[bytes]:
        """Return the records of chunk number `chunk` (0-based, in file order)."""
        return self._read_chunk_at(self.index().chunks[chunk].offset)

    @property
    def num_records(self) -> int:
        return self.index().num_records

    def close(self) -> None:
        if self._owns_file:
            self._file.close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- reading ---------------------------------------------------------------------

    def _sequential(self, count: int | None) -> Iterator[bytes]:
        if self._file.seekable():
            self._file.seek(0)
        offset = 0
        remaining = count
        while True:
            info = self._read_header(offset, 0)
            if info is None:
                return
            records = self._read_payload(info)
            offset += _HEADER.size + info.compressed_size
            if remaining is not None:
                records = records[:remaining]
                remaining -= len(records)
            # Yielding may let the caller touch the file; resume from our own offset.
            position = offset
            yield from records
            if remaining == 0:
                return
            if self._file.seekable():
                self._file.seek(position)

    def _read_chunk_at(self, offset: int) -> list[bytes]:
        self._file.seek(offset)
        info = self._read_header(offset, 0)
        if info is None:
            raise RecordIOError(self.name, offset, "no chunk here: end of file")
        return self._read_payload(info)

    def _read_exactly(self, n: int) -> bytes:
        parts = []
        while n > 0:
            part = self._file.read(n)
            if not part:
                break
            parts.append(part)
            n -= len(part)
        return b"".join(parts)

    def _read_header(self, offset: int, first_record: int) -> ChunkInfo | None:
        raw = self._read_exactly(_HEADER.size)
        if not raw:
            return None
        if len(raw) < _HEADER.size:
            raise RecordIOError(
                self.name, offset, f"truncated chunk header: {len(raw)} of {_HEADER.size} bytes"
            )
        magic, checksum, compressor, size, num_records = _HEADER.unpack(raw)
        if magic != MAGIC:
            raise RecordIOError(
                self.name,
                offset,
                f"bad magic number 0x{magic:08x} (expected 0x{MAGIC:08x}): "
                "not a RecordIO file, or not a chunk boundary",
            )
        if compressor not in Compressor._value2member_map_:
            raise RecordIOError(
                self.name, offset, f"unknown compressor {compressor} (known: 0 none, 1 snappy, 2 gzip)"
            )
        return ChunkInfo(offset, checksum, compressor, size, num_records, first_record)

    def _read_payload(self, info: ChunkInfo) -> list[bytes]:
        offset = info.offset
        compressed = self._read_exactly(info.compressed_size)
        if len(compressed) < info.compressed_size:
            raise RecordIOError(
                self.name,
                offset,
                f"truncated payload: header says {info.compressed_size} bytes, "
                f"the file holds {len(compressed)}",
            )
        actual = zlib.crc32(compressed)
        if actual != info.checksum:
            raise RecordIOError(
                self.name,
                offset,
                f"checksum mismatch: header says 0x{info.checksum:08x}, payload has 0x{actual:08x}",
            )
        payload = self._decompress(compressed, Compressor(info.compressor), offset)
        return self._split(payload, info.num_records, offset)

    def _decompress(self, data: bytes, compressor: Compressor, offset: int) -> bytes:
        if compressor is Compressor.NONE:
            return data
        if compressor is Compressor.GZIP:
            try:
                return gzip.decompress(data)
            except (OSError, EOFError, zlib.error) as e:
                raise RecordIOError(self.name, offset, f"cannot decompress gzip payload: {e}") from e
        snappy = _snappy()
        if snappy is None:
            raise RecordIOError(
                self.name,
                offset,
                "snappy-compressed chunk: install cramjam (pip install "
                "'paddlecloud[recordio-snappy]', which brings it) to read snappy-compressed RecordIO",
            )
        try:
            return bytes(snappy.decompress(data))
        except Exception as e:  # cramjam.DecompressionError, without importing cramjam's names
            raise RecordIOError(self.name, offset, f"cannot decompress snappy payload: {e}") from e

    def _split(self, payload: bytes, num_records: int, offset: int) -> list[bytes]:
        view = memoryview(payload)
        records: list[bytes] = []
        pos = 0
        for i in range(num_records):
            if pos + _LENGTH.size > len(view):
                raise RecordIOError(
                    self.name,
                    offset,
                    f"record count mismatch: header says {num_records} records, the payload holds {i}",
                )
            (length,) = _LENGTH.unpack_from(view, pos)
            pos += _LENGTH.size
            if pos + length > len(view):
                raise RecordIOError(
                    self.name,
                    offset,
                    f"record {i} of length {length} runs past the end of the "
                    f"{len(view)}-byte payload (at payload byte {pos})",
                )
            records.append(bytes(view[pos : pos + length]))
            pos += length
        if pos != len(view):
            raise RecordIOError(
                self.name,
                offset,
                f"record count mismatch: header says {num_records} records, "
                f"but {len(view) - pos} payload bytes follow them",
            )
        return records


# --- the original binding's interface ------------------------------------------------------


def expand(paths: str | os.PathLike[str]) -> list[str]:
    """The files `paths` names: comma-separated paths or globs, each glob's matches sorted."""
    found: list[str] = []
    for part in os.fspath(paths).split(","):
        part = part.strip()
        if not part:
            continue
        if glob.has_magic(part):
            matches = sorted(glob.glob(part))
            if not matches:
                raise FileNotFoundError(f"no RecordIO file matches {part}")
            found.extend(matches)
        else:
            found.append(part)
    if not found:
        raise FileNotFoundError(f"no RecordIO file named in {os.fspath(paths)!r}")
    return found


class reader:  # lower case: the original binding's name, which the original docs call
    """The records of one or more RecordIO files, one `read()` at a time, as the original
    binding read them::

        r = recordio.reader("/pfs/dc1/public/dataset/housing-*")
        while True:
            record = r.read()
            if record is None:   # the end (an empty record is b"")
                break
            ...
        r.close()

    Files are read in the order `expand` gives, each opened only when reached. Also an
    iterator and a context manager.
    """

    def __init__(self, paths: str | os.PathLike[str]) -> None:
        self.paths = expand(paths)
        self._next_file = 0
        self._current: Reader | None = None
        self._records: Iterator[bytes] | None = None

    def read(self) -> bytes | None:
        """The next record (`b""` for an empty one), or None once every file is read."""
        while True:
            if self._records is not None:
                record = next(self._records, None)
                if record is not None:
                    return record
                self._close_current()
            if self._next_file >= len(self.paths):
                return None
            self._current = Reader(self.paths[self._next_file])
            self._next_file += 1
            self._records = iter(self._current)

    def close(self) -> None:
        self._close_current()
        self._next_file = len(self.paths)

    def _close_current(self) -> None:
        if self._current is not None:
            self._current.close()
        self._current = None
        self._records = None

    def __iter__(self) -> Iterator[bytes]:
        while (record := self.read()) is not None:
            yield record

    def __enter__(self) -> reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class writer:  # lower case: the original binding's name
    """Writes records to one RecordIO file, as the original binding did: `write(record)`
    takes bytes (or a str, written as UTF-8); `close()` writes the last chunk."""

    def __init__(self, path: str | os.PathLike[str], compressor: Compressor | int = Compressor.NONE) -> None:
        self._writer = Writer(path, compressor=compressor)

    def write(self, record: bytes | bytearray | memoryview | str) -> None:
        self._writer.write(record.encode("utf-8") if isinstance(record, str) else record)

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
