"""Dataset sharding for training code: split a reader into files, read a trainer's share, convert to RecordIO.

These follow `paddle.v2.dataset.common.split`, `cluster_files_reader` and `convert`,
with the same positional signatures. A *reader creator* is a zero-argument callable
returning an iterator of samples, as in Paddle v2.

Differences from Paddle v2, all deliberate:

- `split` and `convert` put exactly `line_count` samples in every file but the last.
  (Paddle v2's test `i >= line_count and i % line_count == 0` put `line_count + 1`
  samples in the first file.) They return the paths they wrote, and never write an
  empty file.
- `convert` writes `<output_path>/<name_prefix>-00000-of-00009`, ... (the shard's number and
  how many there are, as the original PaddleCloud docs list data sets; Paddle v2 wrote
  `-00000` alone) with this package's RecordIO writer; each record is a pickled sample.
  It shuffles the samples within each file as Paddle v2 did, unless `shuffle=False`.
- Files are opened in binary mode, as pickle requires on Python 3.
- `cluster_files_reader`'s `trainer_count` and `trainer_id` default to this process's
  values from `paddlecloud.runtime` (read when the reader is created); `train_id` is
  accepted for `trainer_id`, as the original PaddleCloud docs spell it.
- `load_recordio` is a `loader` for `cluster_files_reader` that reads `convert`'s output.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pickle
import random
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from . import recordio, runtime

__all__ = ["cluster_files_reader", "convert", "load_recordio", "split"]

ReaderCreator = Callable[[], Iterable[Any]]


def _batches(reader: ReaderCreator, line_count: int) -> Iterator[list[Any]]:
    if line_count <= 0:
        raise ValueError(f"line_count must be positive, not {line_count}")
    batch: list[Any] = []
    for sample in reader():
        batch.append(sample)
        if len(batch) == line_count:
            yield batch
            batch = []
    if batch:
        yield batch


def split(
    reader: ReaderCreator,
    line_count: int,
    suffix: str = "%05d.pickle",
    dumper: Callable[[Any, IO[bytes]], Any] = pickle.dump,
) -> list[str]:
    """Write the samples of `reader` into files of `line_count` samples each.

    File number i is named `suffix % i` (a path, relative to the working directory
    unless absolute) and holds the list of its samples as written by `dumper(list,
    file)`. Returns the paths written, in order.
    """
    if not callable(dumper):
        raise TypeError("dumper must be callable")
    paths = []
    for number, batch in enumerate(_batches(reader, line_count)):
        path = suffix % number
        with open(path, "wb") as f:
            dumper(batch, f)
        paths.append(path)
    return paths


def cluster_files_reader(
    files_pattern: str,
    trainer_count: int | None = None,
    trainer_id: int | None = None,
    loader: Callable[[IO[bytes]], Iterable[Any]] = pickle.load,
    *,
    train_id: int | None = None,
) -> Callable[[], Iterator[Any]]:
    """Return a reader creator yielding the samples of this trainer's share of the files.

    The files matching the glob `files_pattern` are sorted by name, and trainer
    `trainer_id` takes every file whose position in that order is congruent to
    `trainer_id` modulo `trainer_count`, so each file is read by exactly one trainer.
    `loader(file)` turns an open file into its samples. The glob runs each time the
    reader is called, so files written after the reader was created are seen.
    `train_id` is the original PaddleCloud docs' spelling of `trainer_id`.
    """
    if not callable(loader):
        raise TypeError("loader must be callable")
    if train_id is not None:
        if trainer_id is not None and trainer_id != train_id:
            raise TypeError(f"trainer_id={trainer_id} and train_id={train_id} disagree; give one")
        trainer_id = train_id
    count = runtime.trainer_count() if trainer_count is None else trainer_count
    tid = runtime.trainer_id() if trainer_id is None else trainer_id
    if count <= 0:
        raise ValueError(f"trainer_count must be positive, not {count}")
    if not 0 <= tid < count:
        raise ValueError(f"trainer_id must be in [0, {count}), not {tid}")

    def reader() -> Iterator[Any]:
        files = sorted(glob.glob(files_pattern))
        for path in files[tid::count]:
            with open(path, "rb") as f:
                yield from loader(f)

    return reader


def load_recordio(file: IO[bytes]) -> Iterator[Any]:
    """Yield the unpickled records of an open RecordIO file, as `convert` writes them.

    Only unpickle files you trust: pickle runs code.
    """
    for record in recordio.Reader(file):
        yield pickle.loads(record)  # noqa: S301 - the job's own data set, as in Paddle v2


def convert(
    output_path: str | os.PathLike[str],
    reader: ReaderCreator,
    line_count: int,
    name_prefix: str,
    *,
    shuffle: bool = True,
    compressor: recordio.Compressor | int = recordio.Compressor.NONE,
) -> list[str]:
    """Write the samples of `reader` as RecordIO files of `line_count` pickled samples each.

    Files are `<output_path>/<name_prefix>-%05d-of-%05d` (`housing-00000-of-00009` is the
    first of nine); `output_path` must exist. Returns the paths written, in order. Read them
    back with `cluster_files_reader(f"{output_path}/{name_prefix}-*", loader=load_recordio)`
    or `recordio.reader(f"{output_path}/{name_prefix}-*")`.

    How many files there are is known only once the reader is exhausted, so each is
    written under a hidden temporary name first and renamed when all are complete: a
    conversion that fails half-way leaves no shard that looks finished.
    """
    directory = os.fspath(output_path)
    written: list[str] = []
    try:
        for number, batch in enumerate(_batches(reader, line_count)):
            if shuffle:
                random.shuffle(batch)
            path = os.path.join(directory, f".{name_prefix}-{number:05d}.partial")
            written.append(path)
            with recordio.Writer(path, compressor=compressor) as writer:
                for sample in batch:
                    writer.write(pickle.dumps(sample))
    except BaseException:
        for path in written:
            with contextlib.suppress(OSError):
                os.unlink(path)
        raise
    total = len(written)
    paths = []
    for number, partial in enumerate(written):
        path = os.path.join(directory, f"{name_prefix}-{number:05d}-of-{total:05d}")
        os.replace(partial, path)
        paths.append(path)
    return paths
