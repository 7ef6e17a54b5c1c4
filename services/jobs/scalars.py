"""A job's training curves off its output on PFS: the SDK's `metrics/*.jsonl` and TensorBoard's event files.

What is read (docs/metrics.md §2.2), always through the datacenter's `ReadVolume`, which
never follows a symlink (a job's owner controls everything beneath the output):

- `metrics/<worker>.jsonl`, the lines `paddlecloud.metrics.log` appends (cli/metrics.py);
- `events.out.tfevents.*` anywhere up to `MAX_DEPTH` directories below the output,
  TensorBoard's files (TFRecord framing around `Event` protobufs), whose scalars are
  `summary.value[].simple_value` (torch.utils.tensorboard, tensorboardX) or a rank-0
  float tensor (TensorFlow 2's `tf.summary.scalar`). The run is the file's directory
  relative to the output (`.` for the output itself).

Everything a job wrote is untrusted input to this root service. The protobuf is decoded
here by a few lines of wire-format reading rather than by the `tensorboard` or `protobuf`
packages: pure Python over bytes cannot overrun memory, every length is checked against
what is left, and the whole read is bounded (`MAX_FILES` files, `MAX_FILE_BYTES` from
each, `MAX_TOTAL_BYTES` in all, `MAX_DIRS` directories listed, `MAX_SERIES` series). What
is cut or skipped is said in the answer's `warnings`, never a failure. A malformed line or
record is skipped; a symlink is never followed (a `metrics` that is one is refused). CRCs
of TFRecords are not checked (crc32c is not in the standard library); a record's length is.
VisualDL's `vdlrecords.*.log` are not read here: docs/metrics.md says why.

Points are kept in the order they were written, and a step at or below the last one read
for the same series (a worker restarted from an earlier checkpoint, or from scratch)
replaces the points from that step on, as TensorBoard does: every series' steps ascend.
A series longer than `MAX_POINTS` is downsampled to that many points, evenly spaced by
index, its first and last point kept.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import math
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from paddlecloud.common import errors
from paddlecloud.common.storage.base import Entry, ReadVolume
from paddlecloud.common.volume import MAX_PATH_BYTES, PfsPath

log = structlog.get_logger(__name__)

METRICS_DIR = "metrics"
SDK_SUFFIX = ".jsonl"
TFEVENTS_PREFIX = "events.out.tfevents."
MAX_FILES = 64
MAX_FILE_BYTES = 8 * 2**20
MAX_TOTAL_BYTES = 32 * 2**20
MAX_POINTS = 2000
# The answer's size: at most this many series (by source, worker, tag), of MAX_POINTS each.
MAX_SERIES = 500
# How far below the output TensorBoard's files are looked for, and how many directories.
MAX_DEPTH = 3
MAX_DIRS = 200
# A TFRecord longer than this is taken for garbage: a scalar event is a few dozen bytes.
MAX_RECORD_BYTES = 2**20


@dataclass
class Series:
    """One curve: a tag of one worker (SDK) or run (TensorBoard)."""

    worker: str
    source: str  # sdk | tensorboard
    tag: str
    step: list[int] = field(default_factory=list)
    wall_time: list[float] = field(default_factory=list)
    value: list[float] = field(default_factory=list)

    def add(self, step: int, wall_time: float, value: float) -> None:
        if self.step and step <= self.step[-1]:
            # Restarted: what was logged from this step on is replaced (steps stay ascending).
            cut = bisect.bisect_left(self.step, step)
            del self.step[cut:], self.wall_time[cut:], self.value[cut:]
        self.step.append(step)
        self.wall_time.append(wall_time)
        self.value.append(value)

    def downsampled(self, limit: int = MAX_POINTS) -> Series:
        count = len(self.step)
        if count <= limit:
            return self
        picks = sorted({round(i * (count - 1) / (limit - 1)) for i in range(limit)})
        return Series(
            self.worker,
            self.source,
            self.tag,
            [self.step[i] for i in picks],
            [self.wall_time[i] for i in picks],
            [self.value[i] for i in picks],
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "source": self.source,
            "tag": self.tag,
            "step": self.step,
            "wall_time": self.wall_time,
            "value": self.value,
        }


@dataclass
class Scalars:
    """What was read: the series (sorted by source, worker, tag) and what was cut or refused."""

    series: list[Series] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass
class _Budget:
    files: int
    bytes: int


async def read_scalars(volume: ReadVolume, output: PfsPath, tags: Sequence[str] = ()) -> Scalars:
    """The job's curves beneath `output` (only `tags`, when given), bounded as the module says."""
    found = Scalars()
    budget = _Budget(MAX_FILES, MAX_TOTAL_BYTES)
    series: dict[tuple[str, str, str], Series] = {}
    for path, source, worker in await _files(volume, output, found.warnings):
        if budget.files <= 0:
            found.warnings.append(f"more than {MAX_FILES} files hold scalars: the rest were not read")
            break
        budget.files -= 1
        data = await _read(volume, path, _relative(path, output), budget, found.warnings)
        if data is None:
            continue
        parse = _parse_sdk if source == "sdk" else _parse_tfevents
        points, skipped = await asyncio.to_thread(parse, data)
        if skipped:
            found.warnings.append(f"{_relative(path, output)}: {skipped} malformed records skipped")
        for tag, step, wall_time, value in points:
            if tags and tag not in tags:
                continue
            key = (source, worker, tag)
            if key not in series:
                series[key] = Series(worker, source, tag)
            series[key].add(step, wall_time, value)
    kept = sorted(series)[:MAX_SERIES]
    if len(series) > MAX_SERIES:
        found.warnings.append(
            f"{len(series)} series: only the first {MAX_SERIES} are shown (ask for some with tag)"
        )
    found.series = [series[key].downsampled() for key in kept]
    return found


async def _files(volume: ReadVolume, output: PfsPath, warnings: list[str]) -> list[tuple[PfsPath, str, str]]:
    """(path, source, worker or run) of every file to read: the SDK's, then TensorBoard's."""
    out: list[tuple[PfsPath, str, str]] = []
    metrics = output.child(METRICS_DIR)
    kind = await _kind(volume, metrics)
    if kind == "symlink":
        warnings.append(f"{METRICS_DIR} in the job's output is a symbolic link: not followed")
    elif kind == "dir":
        for entry in await _listing(volume, metrics):
            if not entry.name.endswith(SDK_SUFFIX) or entry.name == SDK_SUFFIX:
                continue
            if entry.stat.kind == "file":
                out.append((metrics.child(entry.name), "sdk", entry.name.removesuffix(SDK_SUFFIX)))
            elif entry.stat.kind == "symlink":
                warnings.append(f"{METRICS_DIR}/{entry.name} is a symbolic link: not followed")
    if await _kind(volume, output) == "dir":
        out += await _tfevents(volume, output, warnings)
    return out


async def _tfevents(
    volume: ReadVolume, output: PfsPath, warnings: list[str]
) -> list[tuple[PfsPath, str, str]]:
    """TensorBoard's event files up to MAX_DEPTH below `output`, breadth first, in name order."""
    out: list[tuple[PfsPath, str, str]] = []
    level, listed = [output], 0
    for depth in range(MAX_DEPTH + 1):
        below: list[PfsPath] = []
        for directory in level:
            if listed >= MAX_DIRS:
                warnings.append(
                    f"more than {MAX_DIRS} directories in the output: only the first were looked in"
                )
                return out
            listed += 1
            for entry in await _listing(volume, directory):
                if entry.stat.kind == "file" and entry.name.startswith(TFEVENTS_PREFIX):
                    out.append((directory.child(entry.name), "tensorboard", _relative(directory, output)))
                elif (
                    entry.stat.kind == "dir"
                    and depth < MAX_DEPTH
                    and not (depth == 0 and entry.name == METRICS_DIR)
                ):
                    below.append(directory.child(entry.name))
        level = below
    return out


async def _kind(volume: ReadVolume, path: PfsPath) -> str | None:
    """What is at `path` (file, dir, symlink, other), never following a link; None for nothing."""
    try:
        return (await volume.stat(path)).kind
    except (OSError, errors.DomainError, errors.ProblemError):
        return None


async def _listing(volume: ReadVolume, path: PfsPath) -> list[Entry]:
    try:
        entries = await volume.list(path, recursive=False, max_path_bytes=MAX_PATH_BYTES)
    except (OSError, errors.DomainError, errors.ProblemError) as exc:
        # A directory removed or replaced while it was read (the job is running): skipped.
        log.info("scalars_listing_skipped", path=path.text, error=str(exc))
        return []
    # A directory lists itself first (a file or link, its own entry): only what is inside.
    return sorted((e for e in entries if e.path != path.text), key=lambda e: e.name)


async def _read(
    volume: ReadVolume, path: PfsPath, shown: str, budget: _Budget, warnings: list[str]
) -> bytes | None:
    """The file's bytes within the budget, None if it cannot be read. An SDK file too long is
    read from its end (the newest points), from its first whole line; a TensorBoard file from
    its start, since a record cut at its front has no marker to find the next one by."""
    try:
        download = await volume.open(path)
    except (OSError, errors.DomainError, errors.ProblemError) as exc:
        log.info("scalars_file_skipped", path=path.text, error=str(exc))
        return None
    if download is None:
        return None
    try:
        if download.stat.kind != "file":
            return None
        size = download.stat.size
        length = min(size, MAX_FILE_BYTES, budget.bytes)
        if length == 0 and size:
            warnings.append(f"{shown}: not read, {MAX_TOTAL_BYTES} bytes were read already")
            return None
        tail = not path.name.startswith(TFEVENTS_PREFIX)
        if length < size:
            part = "last" if tail else "first"
            warnings.append(f"{shown}: only its {part} {length} of {size} bytes were read")
        budget.bytes -= length
        out = bytearray()
        async for chunk in download.chunks(size - length if tail else 0, length):
            out += chunk
    except OSError as exc:
        log.info("scalars_file_skipped", path=path.text, error=str(exc))
        return None
    finally:
        await download.close()
    if tail and length < size:
        newline = out.find(b"\n")
        return b"" if newline < 0 else bytes(out[newline + 1 :])
    return bytes(out)


def _relative(path: PfsPath, output: PfsPath) -> str:
    if path.text == output.text:
        return "."
    return path.text.removeprefix(output.text + "/")


Point = tuple[str, int, float, float]  # tag, step, wall time, value


# --- The SDK's lines -------------------------------------------------------------------


def _parse_sdk(data: bytes) -> tuple[list[Point], int]:
    """Points of every well-formed line, and how many lines were not (a last line without
    its newline is being written: left for the next read, not counted)."""
    points: list[Point] = []
    skipped = 0
    lines = data.split(b"\n")
    for line in lines[:-1]:
        if not line.strip():
            continue
        read = _sdk_line(line)
        if read is None:
            skipped += 1
        else:
            points.extend(read)
    return points, skipped


def _sdk_line(line: bytes) -> list[Point] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    step, wall_time, scalars = record.get("step"), record.get("time"), record.get("scalars")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return None
    if not isinstance(wall_time, int | float) or not _is_number(wall_time) or not isinstance(scalars, dict):
        return None
    points = [(str(tag), step, float(wall_time), float(v)) for tag, v in scalars.items() if _is_number(v)]
    return points if points and len(points) == len(scalars) else None


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# --- TensorBoard's event files ---------------------------------------------------------


class _Malformed(ValueError):
    pass


_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64, _DT_HALF = 1, 2, 3, 9, 19
_TENSOR_FORMATS = {_DT_FLOAT: "<f", _DT_DOUBLE: "<d", _DT_INT32: "<i", _DT_INT64: "<q", _DT_HALF: "<e"}


def _parse_tfevents(data: bytes) -> tuple[list[Point], int]:
    """Scalar points of every Event record (TFRecord: u64 length, u32 length CRC, data,
    u32 data CRC); a record that does not decode is skipped; a bad length ends the file."""
    points: list[Point] = []
    skipped = 0
    plugins: dict[str, str] = {}  # a tag's plugin, said only in its first value (TF2)
    at = 0
    while at + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        start = at + 12
        if length > MAX_RECORD_BYTES:
            skipped += 1  # garbage, not a length: nothing after it can be found
            break
        if start + length + 4 > len(data):
            break  # being written (or cut by the cap): the rest comes with a later read
        try:
            points.extend(_event(data[start : start + length], plugins))
        except _Malformed:
            skipped += 1
        at = start + length + 4
    return points, skipped


def _event(record: bytes, plugins: dict[str, str]) -> list[Point]:
    """The scalars of one `Event` (wall_time = 1, step = 2, summary = 5)."""
    fields = _by_field(record)
    wall_time = struct.unpack("<d", fields[1, 1][-1])[0] if (1, 1) in fields else 0.0
    step = fields[2, 0][-1] if (2, 0) in fields else 0
    if not math.isfinite(wall_time) or not 0 <= step < 2**63:
        return []
    # Summary.value (1), each a Summary.Value.
    values = [v for summary in fields.get((5, 2), []) for n, w, v in _fields(summary) if (n, w) == (1, 2)]
    points = []
    for item in values:
        read = _summary_value(item, plugins)
        if read is not None and math.isfinite(read[1]):
            points.append((read[0], step, wall_time, read[1]))
    return points


def _summary_value(item: bytes, plugins: dict[str, str]) -> tuple[str, float] | None:
    """(tag, value) of a `Summary.Value` holding a scalar (tag = 1, simple_value = 2,
    tensor = 8, metadata = 9); None for anything else (images, histograms, text)."""
    fields = _by_field(item)
    if (1, 2) not in fields:
        return None
    tag = _text(fields[1, 2][-1])
    for metadata in fields.get((9, 2), []):
        plugin = _plugin_name(metadata)
        if plugin is not None:
            plugins.setdefault(tag, plugin)
    if (2, 5) in fields:
        return tag, float(struct.unpack("<f", fields[2, 5][-1])[0])
    if (8, 2) in fields and plugins.get(tag, "scalars") == "scalars":
        scalar = _scalar_tensor(fields[8, 2][-1])
        return None if scalar is None else (tag, scalar)
    return None


def _plugin_name(metadata: bytes) -> str | None:
    """SummaryMetadata.plugin_data (1) .plugin_name (1)."""
    for data in _by_field(metadata).get((1, 2), []):
        names = _by_field(data).get((1, 2))
        if names:
            return _text(names[-1])
    return None


def _scalar_tensor(tensor: bytes) -> float | None:
    """The one number of a rank-0 (or one-element) numeric `TensorProto`: dtype = 1,
    tensor_shape = 2 (its dims = 2, each with size = 1), tensor_content = 4, float_val = 5,
    double_val = 6, int64_val = 10 (packed or not)."""
    fields = _by_field(tensor)
    dtype = fields[1, 0][-1] if (1, 0) in fields else 0
    if dtype not in _TENSOR_FORMATS:
        return None
    dims = [dim for shape in fields.get((2, 2), []) for n, w, dim in _fields(shape) if (n, w) == (2, 2)]
    if any(_dim_size(dim) != 1 for dim in dims):
        return None  # a dimension other than 1: not a scalar
    if (4, 2) in fields:
        content, fmt = fields[4, 2][-1], _TENSOR_FORMATS[dtype]
        if len(content) != struct.calcsize(fmt):
            return None
        return float(struct.unpack(fmt, content)[0])
    numbers = _tensor_numbers(fields)
    return numbers[0] if len(numbers) == 1 else None


def _tensor_numbers(fields: dict[tuple[int, int], list[Any]]) -> list[float]:
    numbers: list[float] = []
    for number, fmt in ((5, "<f"), (6, "<d")):
        size = struct.calcsize(fmt)
        for packed in fields.get((number, 2), []):
            numbers += [x for (x,) in struct.iter_unpack(fmt, packed[: len(packed) // size * size])]
    numbers += [struct.unpack("<f", v)[0] for v in fields.get((5, 5), [])]
    numbers += [struct.unpack("<d", v)[0] for v in fields.get((6, 1), [])]
    numbers += [float(_signed(v)) for v in fields.get((10, 0), [])]
    return numbers


def _by_field(message: bytes) -> dict[tuple[int, int], list[Any]]:
    """A message's values by (field number, wire type), in the order they came."""
    out: dict[tuple[int, int], list[Any]] = {}
    for number, wire, value in _fields(message):
        out.setdefault((number, wire), []).append(value)
    return out


def _dim_size(dim: bytes) -> int:
    return next((_signed(v) for n, w, v in _fields(dim) if n == 1 and w == 0), 0)


def _signed(value: int) -> int:
    return value - 2**64 if value >= 2**63 else value


def _text(value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise _Malformed("a tag that is not UTF-8") from None


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of each field of one protobuf message: an int for
    varints, bytes otherwise; _Malformed where a length runs past the end."""
    at, end = 0, len(buf)
    while at < end:
        key, at = _varint(buf, at)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, at = _varint(buf, at)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, at = buf[at : at + size], at + size
        elif wire == 2:
            size, at = _varint(buf, at)
            value, at = buf[at : at + size], at + size
        else:
            raise _Malformed(f"wire type {wire}")
        if at > end:
            raise _Malformed("a field runs past its message")
        yield number, wire, value


def _varint(buf: bytes, at: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if at >= len(buf) or shift > 63:
            raise _Malformed("a varint runs past its message")
        byte = buf[at]
        at += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, at
        shift += 7
