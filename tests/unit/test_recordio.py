"""RecordIO: round trips with every compressor, the Go chunk layout byte for byte, and every corruption."""

from __future__ import annotations

import gzip
import io
import struct
import zlib
from pathlib import Path

import pytest

from paddlecloud import recordio
from paddlecloud.recordio import MAGIC, Compressor, Reader, RecordIOError, Writer

HAVE_SNAPPY = recordio._snappy() is not None
COMPRESSORS = [
    Compressor.NONE,
    Compressor.GZIP,
    pytest.param(
        Compressor.SNAPPY,
        marks=pytest.mark.skipif(not HAVE_SNAPPY, reason="python-snappy (cramjam) is not installed"),
    ),
]


def chunk(payload: bytes, num_records: int, compressor: int = 0, checksum: int | None = None) -> bytes:
    """A chunk built by hand from the Go layout, independent of Writer."""
    crc = zlib.crc32(payload) if checksum is None else checksum
    return struct.pack("<5I", MAGIC, crc, compressor, len(payload), num_records) + payload


def records_payload(*records: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(r)) + r for r in records)


def write(records: list[bytes], **kwargs: object) -> bytes:
    buf = io.BytesIO()
    with Writer(buf, **kwargs) as w:  # type: ignore[arg-type]
        for r in records:
            w.write(r)
    return buf.getvalue()


def error_of(data: bytes) -> RecordIOError:
    with pytest.raises(RecordIOError) as info:
        list(Reader(io.BytesIO(data)))
    return info.value


@pytest.mark.parametrize("compressor", COMPRESSORS)
def test_round_trip_with_each_compressor(compressor: Compressor, tmp_path: Path) -> None:
    records = [b"", b"x", bytes(range(256)) * 40, b"hello " * 1000, b""]
    path = tmp_path / "data.recordio"
    with Writer(path, compressor=compressor) as w:
        for r in records:
            w.write(r)
    raw = path.read_bytes()
    assert struct.unpack_from("<5I", raw)[2] == int(compressor)
    with Reader(path) as reader:
        assert list(reader) == records
        assert reader.num_records == len(records)


def test_gzip_payload_is_a_gzip_stream_as_go_writes_it() -> None:
    raw = write([b"abc", b"defg"], compressor=Compressor.GZIP)
    _, crc, comp, size, count = struct.unpack_from("<5I", raw)
    body = raw[20:]
    assert (comp, size, count, crc) == (2, len(body), 2, zlib.crc32(body))
    assert body[:2] == b"\x1f\x8b"  # gzip magic, not raw deflate or zlib
    assert gzip.decompress(body) == records_payload(b"abc", b"defg")


def test_reads_chunks_made_by_another_writer_with_each_compressor() -> None:
    payload = records_payload(b"one", b"", b"three")
    data = chunk(payload, 3) + chunk(gzip.compress(payload), 3, compressor=2)
    assert list(Reader(io.BytesIO(data))) == [b"one", b"", b"three"] * 2


@pytest.mark.skipif(not HAVE_SNAPPY, reason="python-snappy (cramjam) is not installed")
def test_reads_a_hand_made_snappy_framing_stream() -> None:
    payload = records_payload(b"go", b"snappy")
    # Snappy framing format as golang/snappy's Writer emits it: the stream identifier,
    # then an uncompressed-data chunk (type 0x01) whose first 4 bytes are the masked
    # CRC-32C of the data.
    crc32c = _crc32c(payload)
    masked = (((crc32c >> 15) | (crc32c << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    body = struct.pack("<I", masked) + payload
    stream = b"\xff\x06\x00\x00sNaPpY" + b"\x01" + len(body).to_bytes(3, "little") + body
    assert list(Reader(io.BytesIO(chunk(stream, 2, compressor=1)))) == [b"go", b"snappy"]
    # The same payload with its framing CRC broken is refused, although the chunk CRC matches.
    broken = stream[:14] + bytes([stream[14] ^ 1]) + stream[15:]
    err = error_of(chunk(broken, 2, compressor=1))
    assert "cannot decompress snappy payload" in str(err)


def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_snappy_without_the_library_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recordio, "_snappy", lambda: None)
    err = error_of(chunk(b"\xff\x06\x00\x00sNaPpY", 0, compressor=1))
    # The package the extra really installs is named (cramjam), not python-snappy.
    assert "install cramjam" in str(err) and "python-snappy" not in str(err)
    with pytest.raises(RuntimeError, match="install cramjam"):
        Writer(io.BytesIO(), compressor=Compressor.SNAPPY)


def test_exact_layout_of_a_tiny_chunk() -> None:
    raw = write([b"ab", b""])
    payload = b"\x02\x00\x00\x00ab\x00\x00\x00\x00"
    assert len(raw) == 20 + len(payload)
    assert struct.unpack("<5I", raw[:20]) == (0x01020304, zlib.crc32(payload), 0, len(payload), 2)
    assert raw[:4] == b"\x04\x03\x02\x01"  # little-endian magic
    assert raw[20:] == payload


def test_empty_writer_writes_nothing() -> None:
    assert write([]) == b""
    assert list(Reader(io.BytesIO(b""))) == []


def test_many_small_records_span_several_chunks_within_the_limit() -> None:
    records = [f"record-{i}".encode() * (i % 7) for i in range(500)]
    raw = write(records, max_chunk_size=256)
    reader = Reader(io.BytesIO(raw))
    index = reader.index()
    assert len(index.chunks) > 10
    for info in index.chunks:
        assert info.compressed_size <= 256  # uncompressed: payload size == compressed size
    assert sum(c.num_records for c in index.chunks) == 500
    assert list(reader) == records


def test_a_record_bigger_than_the_chunk_size_gets_a_chunk_of_its_own() -> None:
    big = b"B" * 1000
    raw = write([b"a", big, b"c"], max_chunk_size=100)
    reader = Reader(io.BytesIO(raw))
    assert [c.num_records for c in reader.index().chunks] == [1, 1, 1]
    assert reader.read_chunk(1) == [big]
    assert list(reader) == [b"a", big, b"c"]


def test_flush_ends_a_chunk_and_close_is_idempotent() -> None:
    buf = io.BytesIO()
    w = Writer(buf)
    w.write(b"1")
    w.flush()
    assert len(buf.getvalue()) == 25
    w.write(b"2")
    w.close()
    w.close()
    assert not buf.closed  # a file object passed in stays open
    assert [c.num_records for c in Reader(buf).index().chunks] == [1, 1]
    with pytest.raises(ValueError, match="closed"):
        w.write(b"3")


def test_writer_refuses_text() -> None:
    with pytest.raises(TypeError, match="bytes"):
        Writer(io.BytesIO()).write("text")  # type: ignore[arg-type]


def test_range_reading_across_chunks() -> None:
    records = [str(i).encode() for i in range(100)]
    reader = Reader(io.BytesIO(write(records, max_chunk_size=40)))
    assert len(reader.index().chunks) > 5
    assert list(reader.records(0, 3)) == records[:3]
    assert list(reader.records(17, 25)) == records[17:42]
    assert list(reader.records(95)) == records[95:]
    assert list(reader.records(99, 10)) == [b"99"]
    assert list(reader.records(100)) == []
    assert list(reader.records(5, 0)) == []
    assert reader.index().locate(17)[0] == next(
        n
        for n, c in enumerate(reader.index().chunks)
        if c.first_record <= 17 < c.first_record + c.num_records
    )
    with pytest.raises(IndexError):
        reader.index().locate(100)


def test_iterating_twice_reads_from_the_start() -> None:
    reader = Reader(io.BytesIO(write([b"a", b"b"], max_chunk_size=5)))
    assert list(reader) == [b"a", b"b"]
    assert list(reader) == [b"a", b"b"]


def test_reads_an_unseekable_stream() -> None:
    raw = write([b"a", b"b", b"c"], max_chunk_size=5)

    class Pipe(io.RawIOBase):
        def __init__(self) -> None:
            self.data = io.BytesIO(raw)

        def readable(self) -> bool:
            return True

        def readinto(self, b: bytearray) -> int:  # type: ignore[override]
            chunk = self.data.read(min(len(b), 3))  # short reads, like a pipe
            b[: len(chunk)] = chunk
            return len(chunk)

    assert list(Reader(Pipe())) == [b"a", b"b", b"c"]  # type: ignore[arg-type]


# -- corruption -------------------------------------------------------------------------

GOOD = chunk(records_payload(b"first"), 1)  # 29 bytes, so a second chunk starts at 29


@pytest.mark.parametrize(
    ("second", "problem"),
    [
        (b"\x04\x03\x02", "truncated chunk header: 3 of 20 bytes"),
        (chunk(records_payload(b"x"), 1)[:-1], "truncated payload"),
        (struct.pack("<5I", 0xDEADBEEF, 0, 0, 0, 0), "bad magic number 0xdeadbeef"),
        (chunk(records_payload(b"x"), 1, checksum=12345), "checksum mismatch"),
        (chunk(records_payload(b"x"), 1, compressor=7), "unknown compressor 7"),
        (chunk(b"\x10\x00\x00\x00abc", 1), "record 0 of length 16 runs past"),
        (
            chunk(records_payload(b"x"), 2),
            "record count mismatch: header says 2 records, the payload holds 1",
        ),
        (chunk(records_payload(b"x", b"y"), 1), "record count mismatch: header says 1 records"),
        (chunk(b"not gzip", 1, compressor=2), "cannot decompress gzip payload"),
        # mtime=0: the same bytes every run, so pytest-xdist's workers collect the same id.
        (
            chunk(gzip.compress(records_payload(b"x"), mtime=0)[:-6], 1, compressor=2),
            "cannot decompress gzip",
        ),
    ],
)
def test_corruption_is_a_recordio_error_naming_file_and_offset(
    second: bytes, problem: str, tmp_path: Path
) -> None:
    path = tmp_path / "bad.recordio"
    path.write_bytes(GOOD + second)
    with Reader(path) as reader, pytest.raises(RecordIOError) as info:
        list(reader)
    message = str(info.value)
    assert problem in message
    assert message.startswith(f"{path}: chunk at byte offset 29: ")
    assert info.value.offset == 29


def test_first_good_chunk_is_read_before_the_bad_one() -> None:
    reader = Reader(io.BytesIO(GOOD + b"\x00" * 20))
    records = iter(reader)
    assert next(records) == b"first"
    with pytest.raises(RecordIOError, match="bad magic"):
        next(records)


def test_index_detects_truncation_and_bad_magic_without_reading_payloads() -> None:
    with pytest.raises(RecordIOError, match="offset 29: truncated payload"):
        Reader(io.BytesIO(GOOD + chunk(b"abcdef", 1)[:-2])).index()
    with pytest.raises(RecordIOError, match="offset 0: bad magic"):
        Reader(io.BytesIO(b"PK\x03\x04" + bytes(30))).index()


def test_stream_without_a_name_says_so() -> None:
    err = error_of(b"\x01\x02")
    assert str(err) == "RecordIO stream: chunk at byte offset 0: truncated chunk header: 2 of 20 bytes"


def test_the_original_bindings_reader_and_writer(tmp_path: Path) -> None:
    """As the original docs use them: `writer(path).write(...)`, `reader(glob).read()` until None."""
    for name, records in (("record_0", ["1", "2", ""]), ("record_1", [b"3", b"4"])):
        w = recordio.writer(str(tmp_path / name))
        for record in records:
            w.write(record)
        w.close()
    r = recordio.reader(str(tmp_path / "record_*"))
    got = []
    while True:
        record = r.read()
        if record is None:
            break
        got.append(record)
    r.close()
    assert got == [b"1", b"2", b"", b"3", b"4"]  # an empty record is b"", the end is None
    assert r.read() is None
    both = f"{tmp_path / 'record_1'},{tmp_path / 'record_0'}"  # comma-separated, in the order given
    with recordio.reader(both) as r:
        assert list(r) == [b"3", b"4", b"1", b"2", b""]
    with pytest.raises(FileNotFoundError, match="no RecordIO file matches"):
        recordio.reader(str(tmp_path / "nothing-*"))
