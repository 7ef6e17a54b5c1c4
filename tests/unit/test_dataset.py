"""Dataset helpers: every sample reaches exactly one trainer, and convert writes readable RecordIO."""

from __future__ import annotations

import pickle
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from paddlecloud import dataset, recordio
from paddlecloud.recordio import Reader


def unpickle(data: bytes) -> Any:
    return pickle.loads(data)  # noqa: S301 - data this test wrote


def samples(n: int) -> Callable[[], Iterator[tuple[int, str]]]:
    def reader() -> Iterator[tuple[int, str]]:
        for i in range(n):
            yield i, f"sample-{i}"

    return reader


def test_split_writes_files_of_line_count_samples(tmp_path: Path) -> None:
    paths = dataset.split(samples(23), 5, suffix=str(tmp_path / "part-%05d.pickle"))
    assert [Path(p).name for p in paths] == [f"part-{i:05d}.pickle" for i in range(5)]
    sizes = [len(unpickle(Path(p).read_bytes())) for p in paths]
    assert sizes == [5, 5, 5, 5, 3]
    assert dataset.split(samples(0), 5, suffix=str(tmp_path / "none-%05d")) == []
    assert not list(tmp_path.glob("none-*"))


@pytest.mark.parametrize("trainers", [1, 2, 3, 7])
def test_every_sample_is_read_by_exactly_one_trainer(trainers: int, tmp_path: Path) -> None:
    dataset.split(samples(53), 4, suffix=str(tmp_path / "%05d.pickle"))  # 14 files
    seen: Counter[tuple[int, str]] = Counter()
    for tid in range(trainers):
        share = list(dataset.cluster_files_reader(str(tmp_path / "*.pickle"), trainers, tid)())
        if trainers > 1:
            assert 0 < len(share) < 53
        seen.update(share)
    assert seen == Counter(samples(53)())


def test_files_are_dealt_in_sorted_order(tmp_path: Path) -> None:
    for i in (2, 0, 1, 3):
        (tmp_path / f"f{i}").write_bytes(pickle.dumps([i]))
    reader = dataset.cluster_files_reader(str(tmp_path / "f*"), 2, 1)
    assert list(reader()) == [1, 3]


def test_cluster_files_reader_defaults_to_the_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(4):
        (tmp_path / f"f{i}").write_bytes(pickle.dumps([i]))
    monkeypatch.delenv("PADDLE_JOB_NAME", raising=False)
    for name in ("TRAINER_ID", "PADDLE_TRAINER_ID", "PADDLE_INIT_TRAINER_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRAINERS", "2")
    assert list(dataset.cluster_files_reader(str(tmp_path / "f*"))()) == [0, 2]
    monkeypatch.setenv("TRAINER_ID", "1")
    assert list(dataset.cluster_files_reader(str(tmp_path / "f*"))()) == [1, 3]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="trainer_id"):
        dataset.cluster_files_reader("*", 2, 2)
    with pytest.raises(ValueError, match="line_count"):
        dataset.split(samples(3), 0)
    with pytest.raises(TypeError, match="loader"):
        dataset.cluster_files_reader("*", 1, 0, loader=None)  # type: ignore[arg-type]


def test_convert_writes_readable_recordio(tmp_path: Path) -> None:
    paths = dataset.convert(tmp_path, samples(25), 10, "mnist-train")
    assert [Path(p).name for p in paths] == [
        "mnist-train-00000-of-00003",
        "mnist-train-00001-of-00003",
        "mnist-train-00002-of-00003",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [Path(p).name for p in paths]  # nothing else
    with Reader(paths[0]) as r:
        first = [unpickle(record) for record in r]
    assert sorted(first) == [(i, f"sample-{i}") for i in range(10)]
    seen: Counter[tuple[int, str]] = Counter()
    for tid in range(2):
        reader = dataset.cluster_files_reader(
            str(tmp_path / "mnist-train-*"), 2, tid, loader=dataset.load_recordio
        )
        seen.update(reader())
    assert seen == Counter(samples(25)())


def test_convert_without_shuffle_keeps_order(tmp_path: Path) -> None:
    (path,) = dataset.convert(str(tmp_path), samples(4), 10, "x", shuffle=False)
    with Reader(path) as r:
        assert [unpickle(rec)[0] for rec in r] == [0, 1, 2, 3]


def test_the_original_docs_shards_and_reader(tmp_path: Path) -> None:
    """As the original docs show a data set: `<prefix>-00000-of-00009`, read back with
    `recordio.reader(glob)` whose `read()` is None at the end, and dealt with `train_id`."""
    paths = dataset.convert(tmp_path, samples(45), 5, "uci_housing_train")
    assert Path(paths[0]).name == "uci_housing_train-00000-of-00009"
    assert Path(paths[-1]).name == "uci_housing_train-00008-of-00009"
    r = recordio.reader(str(tmp_path / "uci_housing_train-*"))
    read = []
    while True:
        record = r.read()
        if not record:
            break
        read.append(unpickle(record))
    r.close()
    assert r.read() is None and Counter(read) == Counter(samples(45)())
    shares = [
        list(
            dataset.cluster_files_reader(
                str(tmp_path / "uci_housing_train-*"), 3, train_id=t, loader=dataset.load_recordio
            )()
        )
        for t in range(3)
    ]
    assert [len(share) for share in shares] == [15, 15, 15]
    assert Counter(x for share in shares for x in share) == Counter(samples(45)())


def test_train_id_is_trainer_id(tmp_path: Path) -> None:
    dataset.split(samples(6), 1, suffix=str(tmp_path / "%05d.pickle"))
    pattern = str(tmp_path / "*.pickle")
    assert list(dataset.cluster_files_reader(pattern, 3, train_id=1)()) == list(
        dataset.cluster_files_reader(pattern, 3, 1)()
    )
    assert list(dataset.cluster_files_reader(pattern, 3, 1, train_id=1)()) == [
        (1, "sample-1"),
        (4, "sample-4"),
    ]
    with pytest.raises(TypeError, match="disagree"):
        dataset.cluster_files_reader(pattern, 3, 0, train_id=1)


def test_a_conversion_that_fails_leaves_no_shard(tmp_path: Path) -> None:
    def broken() -> Iterator[int]:
        yield from range(7)
        raise OSError("the source went away")

    with pytest.raises(OSError, match="went away"):
        dataset.convert(tmp_path, broken, 3, "part")
    assert list(tmp_path.iterdir()) == []
