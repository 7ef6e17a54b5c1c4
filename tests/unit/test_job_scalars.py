"""Reading a job's training curves off a real POSIX volume (services/jobs/scalars.py): the SDK's lines,
TensorBoard's event files from a real writer, malformed input skipped, links refused, the caps."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from paddlecloud import metrics
from paddlecloud.common.storage.posix import PosixVolume
from paddlecloud.common.volume import PfsPath
from paddlecloud.jobs import scalars
from paddlecloud.jobs.scalars import read_scalars

OUTPUT = PfsPath("dc1", "home", "alice", ("jobs", "mnist", "output"))


@pytest.fixture
async def volume(tmp_path: Path) -> AsyncIterator[PosixVolume]:
    posix = PosixVolume(tmp_path / "pfs")
    await posix.ensure_home("alice")
    yield posix
    await posix.close()


@pytest.fixture
def output(tmp_path: Path) -> Path:
    path = tmp_path / "pfs" / "home" / "alice" / "jobs" / "mnist" / "output"
    path.mkdir(parents=True)
    return path


def log_with_the_sdk(output: Path, worker: str, steps: range, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines written by the SDK itself, as a worker of the job writes them."""
    role, index = worker.split("-")
    monkeypatch.setenv("PADDLE_CLOUD_OUTPUT", str(output))
    monkeypatch.setenv("TRAINING_ROLE", role.upper())
    monkeypatch.setenv("TRAINER_ID", index)
    for step in steps:
        metrics.log(step=step, loss=1.0 / (step + 1), acc=step / 100)


async def test_the_sdks_lines_make_one_series_per_worker_and_tag_and_bad_lines_are_skipped(
    volume: PosixVolume, output: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_with_the_sdk(output, "trainer-0", range(5), monkeypatch)
    log_with_the_sdk(output, "trainer-1", range(3), monkeypatch)
    with open(output / "metrics" / "trainer-1.jsonl", "a") as f:
        f.write("not json\n")
        f.write('["a list"]\n')
        f.write('{"step": true, "time": 1.0, "scalars": {"loss": 1}}\n')
        f.write('{"step": 9, "time": 1.0, "scalars": {"loss": NaN}}\n')
        f.write('{"step": 9, "time": 1.0, "scalars": {"loss": "low"}}\n')
        f.write('{"step": 9, "time": 1.0, "scal')  # a line being written: left for later
    found = await read_scalars(volume, OUTPUT)
    keys = [(s.source, s.worker, s.tag, len(s.step)) for s in found.series]
    assert keys == [
        ("sdk", "trainer-0", "acc", 5),
        ("sdk", "trainer-0", "loss", 5),
        ("sdk", "trainer-1", "acc", 3),
        ("sdk", "trainer-1", "loss", 3),
    ]
    loss = found.series[1]
    assert loss.step == [0, 1, 2, 3, 4]
    assert loss.value == [1.0, 0.5, 1 / 3, 0.25, 0.2]
    assert all(t > 1e9 for t in loss.wall_time)
    assert found.warnings == ["metrics/trainer-1.jsonl: 5 malformed records skipped"]
    only = await read_scalars(volume, OUTPUT, ("loss",))
    assert {s.tag for s in only.series} == {"loss"}


async def test_a_restarted_worker_replaces_its_points_from_the_step_it_went_back_to(
    volume: PosixVolume, output: Path
) -> None:
    (output / "metrics").mkdir()
    steps = (0, 1, 2, 3, 2, 3, 4)  # restarted from the checkpoint of step 1
    lines = [{"step": s, "time": 1.0 + n, "scalars": {"loss": float(s)}} for n, s in enumerate(steps)]
    (output / "metrics" / "trainer-0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (series,) = (await read_scalars(volume, OUTPUT)).series
    assert series.step == [0, 1, 2, 3, 4]
    assert series.wall_time == [1.0, 2.0, 5.0, 6.0, 7.0]


async def test_a_symlink_in_place_of_metrics_or_of_a_file_is_not_followed(
    volume: PosixVolume, output: Path, tmp_path: Path
) -> None:
    # Another user's curves (or any file of the machine's) that a link would lead to.
    elsewhere = tmp_path / "pfs" / "home" / "bob" / "metrics"
    elsewhere.mkdir(parents=True)
    (elsewhere / "trainer-0.jsonl").write_text('{"step": 0, "time": 1.0, "scalars": {"secret": 42}}\n')
    os.symlink(elsewhere, output / "metrics")
    found = await read_scalars(volume, OUTPUT)
    assert found.series == []
    assert found.warnings == ["metrics in the job's output is a symbolic link: not followed"]

    (output / "metrics").unlink()
    (output / "metrics").mkdir()
    os.symlink(elsewhere / "trainer-0.jsonl", output / "metrics" / "trainer-0.jsonl")
    found = await read_scalars(volume, OUTPUT)
    assert found.series == []
    assert found.warnings == ["metrics/trainer-0.jsonl is a symbolic link: not followed"]


async def test_the_caps_bound_what_is_read_and_say_so(
    volume: PosixVolume, output: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (output / "metrics").mkdir()
    line = '{{"step": {}, "time": 1.0, "scalars": {{"loss": 0.5}}}}\n'
    text = "".join(line.format(s) for s in range(5000))
    (output / "metrics" / "trainer-0.jsonl").write_text(text)
    for n in range(1, 4):
        (output / "metrics" / f"trainer-{n}.jsonl").write_text(line.format(0))
    monkeypatch.setattr(scalars, "MAX_FILE_BYTES", 1000)
    monkeypatch.setattr(scalars, "MAX_FILES", 3)
    found = await read_scalars(volume, OUTPUT)
    assert [s.worker for s in found.series] == ["trainer-0", "trainer-1", "trainer-2"]
    newest = found.series[0]
    # The newest whole lines of its last 1000 bytes: from a line's start, up to step 4999.
    assert newest.step[-1] == 4999 and 0 < len(newest.step) <= 1000 // len(line.format(4999))
    assert newest.step == list(range(newest.step[0], 5000))
    assert found.warnings == [
        f"metrics/trainer-0.jsonl: only its last 1000 of {len(text)} bytes were read",
        "more than 3 files hold scalars: the rest were not read",
    ]

    # A long series comes downsampled to MAX_POINTS, its first and last point kept.
    monkeypatch.setattr(scalars, "MAX_FILE_BYTES", 2**20)
    (long,) = (await read_scalars(volume, OUTPUT, ("loss",))).series[:1]
    assert len(long.step) == scalars.MAX_POINTS
    assert long.step[0] == 0 and long.step[-1] == 4999
    assert long.step == sorted(long.step)

    # As many series as the answer may hold, and a word about the rest.
    monkeypatch.setattr(scalars, "MAX_SERIES", 2)
    found = await read_scalars(volume, OUTPUT)
    assert [s.worker for s in found.series] == ["trainer-0", "trainer-1"]
    assert found.warnings[-1] == "3 series: only the first 2 are shown (ask for some with tag)"  # of 3 files


async def test_tensorboard_scalars_of_a_real_writer_are_read_per_run(
    volume: PosixVolume, output: Path
) -> None:
    torch = pytest.importorskip("torch")
    tensorboard = pytest.importorskip("torch.utils.tensorboard")
    for run, new_style in (("runs/simple", False), ("runs/tensor", True)):
        writer = tensorboard.SummaryWriter(log_dir=str(output / run))
        for step in range(50):
            writer.add_scalar("train/loss", 2.0 / (step + 1), step, new_style=new_style)
        writer.add_text("notes", "not a scalar", 0)
        writer.add_histogram("weights", torch.tensor([0.1, 0.2, 0.3]), 0)
        writer.close()
    found = await read_scalars(volume, OUTPUT)
    assert [(s.source, s.worker, s.tag) for s in found.series] == [
        ("tensorboard", "runs/simple", "train/loss"),
        ("tensorboard", "runs/tensor", "train/loss"),
    ]
    for series in found.series:
        assert series.step == list(range(50))
        assert series.value == pytest.approx([2.0 / (s + 1) for s in range(50)], rel=1e-6)
    assert found.warnings == []

    # A file cut short (being written) gives what it holds whole; a record with a length
    # no event has (garbage) ends the file, said in a warning; never an error.
    (event,) = (output / "runs" / "simple").glob("events.out.tfevents.*")
    data = event.read_bytes()
    half = 0  # the first record boundary past the middle (TFRecord: u64 length, u32, data, u32)
    while half < len(data) // 2:
        half += 16 + int.from_bytes(data[half : half + 8], "little")
    event.write_bytes(data[: half - 5])
    (cut, _) = (await read_scalars(volume, OUTPUT)).series
    assert cut.worker == "runs/simple" and 10 < len(cut.step) < 50
    event.write_bytes(data[:half] + (2**40).to_bytes(8, "little") + b"\xff" * 40)
    found = await read_scalars(volume, OUTPUT)
    assert found.series[0].step[: len(cut.step)] == cut.step
    assert found.warnings == [f"runs/simple/{event.name}: 1 malformed records skipped"]
