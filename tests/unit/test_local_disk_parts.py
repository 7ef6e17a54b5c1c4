"""The pure parts of local jobs' disk bounds: bounded unpacking, capped logs and readers, /tmp's size."""

from __future__ import annotations

import io
import os
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from paddlecloud.common.logstream import read_lines, tail_offset
from paddlecloud.common.sandbox import View, bwrap_args
from paddlecloud.jobs.backend import LogQuery
from paddlecloud.jobs.local.caplog import CappedLog, LogClock, LogTimes, order_path, read_dropped
from paddlecloud.jobs.local.logmerge import LogMerge
from paddlecloud.jobs.local.unpack import PackageTooLarge, unpack
from support import tar_of, zeros_tar_gz

MiB = 2**20


def written(target: Path) -> int:
    return sum(p.stat().st_size for p in target.rglob("*") if p.is_file())


def test_a_2mib_archive_declaring_2gib_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    bomb = zeros_tar_gz(2 * 2**30)
    assert len(bomb) < 3 * MiB
    target = tmp_path / "package"
    target.mkdir()
    with pytest.raises(PackageTooLarge) as caught:
        unpack(io.BytesIO(bomb), "tar", target, 2**30)
    assert "at least 2.0 GiB" in str(caught.value) and "1Gi (jobs.package_max_bytes)" in str(caught.value)
    assert list(target.iterdir()) == []


def test_many_small_members_count_as_whole_blocks(tmp_path: Path) -> None:
    # 300 one-byte files take 300 blocks on the disk, not 300 bytes.
    files = {f"f{i}": b"x" for i in range(300)}
    target = tmp_path / "package"
    target.mkdir()
    with pytest.raises(PackageTooLarge):
        unpack(io.BytesIO(tar_of(files)), "tar", target, 299 * 4096)
    assert list(target.iterdir()) == []
    assert unpack(io.BytesIO(tar_of(files)), "tar", target, 300 * 4096) == 300 * 4096
    assert len(list(target.iterdir())) == 300


class Swapping(io.BytesIO):
    """An archive that changes once it has been read through: what a user's job could do
    to a package in its home between the check of its headers and the unpacking."""

    def __init__(self, first: bytes, then: bytes) -> None:
        super().__init__(first)
        self._then = then
        self._swapped = False

    def seek(self, offset: int, whence: int = 0) -> int:
        # Far into it: the pass over the headers is done (tarfile's probing reads less).
        if offset == 0 and whence == 0 and self.tell() > 64 * 1024 and not self._swapped:
            self._swapped = True
            position = super().seek(0)
            self.truncate()
            self.write(self._then)
            return super().seek(position)
        return super().seek(offset, whence)


def test_an_archive_that_grows_between_check_and_unpacking_stops_at_the_limit(tmp_path: Path) -> None:
    small = tar_of({"a": bytes(100 * 1024)})
    large = tar_of({"a": bytes(100 * 1024), "b": bytes(MiB), "c": bytes(MiB)})
    limit = 100 * 1024 + MiB + 4096
    target = tmp_path / "package"
    target.mkdir()
    with pytest.raises(PackageTooLarge, match="its members reached"):
        unpack(Swapping(small, large), "tar", target, limit)
    assert written(target) <= limit
    assert not (target / "c").exists()


def test_a_zip_member_is_cut_at_the_size_its_header_declares(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("big.bin", bytes(8 * MiB))
    data = bytearray(buffer.getvalue())
    # Both headers lie: 1 KiB, for 8 MiB of deflated zeros.
    declared = (8 * MiB).to_bytes(4, "little")
    for at in [i for i in range(len(data) - 3) if data[i : i + 4] == declared]:
        data[at : at + 4] = (1024).to_bytes(4, "little")
    target = tmp_path / "package"
    target.mkdir()
    with pytest.raises(zipfile.BadZipFile):
        unpack(io.BytesIO(bytes(data)), "zip", target, MiB)
    assert written(target) <= 1024


def test_zip_archives_declaring_more_than_the_limit_are_refused_unwritten(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("train.py", "print(1)\n")
        z.writestr("big.bin", bytes(4 * MiB))
    target = tmp_path / "package"
    target.mkdir()
    with pytest.raises(PackageTooLarge, match=r"at least 4\.0 MiB, the limit is 1Mi"):
        unpack(io.BytesIO(buffer.getvalue()), "zip", target, MiB)
    assert list(target.iterdir()) == []


def test_tar_members_still_may_not_leave_the_package(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        link = tarfile.TarInfo("out")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc"
        tar.addfile(link)
    target = tmp_path / "package"
    target.mkdir()
    with pytest.raises(tarfile.FilterError):
        unpack(io.BytesIO(buffer.getvalue()), "tar", target, MiB)
    assert not (target / "out").is_symlink()


def allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def lines_from(path: Path, offset: int) -> list[str]:
    """Every line a reader gets from `offset` on, honouring what the log dropped."""
    out: list[str] = []
    gone = read_dropped(path)
    if gone.offset > offset:
        out.append(gone.marker(offset))
        offset = gone.offset
    while True:
        lines, more = read_lines(path, offset, True)
        out += [text for text, _ in lines]
        offset += sum(size for _, size in lines)
        if not more:
            return out


def test_a_capped_log_keeps_its_newest_bytes_and_says_what_it_dropped(tmp_path: Path) -> None:
    path = tmp_path / "trainer-0.log"
    log = CappedLog(path, MiB)
    line = b"x" * 99 + b"\n"
    for i in range(40_000):  # 4 MB of lines, in writes of varying size
        log.write(b"%08d" % i + line[8:])
    log.line("--- the end ---")
    log.close()
    assert path.stat().st_size > 3 * MiB  # offsets never move...
    assert allocated(path) <= MiB + 64 * 1024  # ...but the blocks went back
    gone = read_dropped(path)
    assert gone.offset % len(line) == 0  # the kept part starts at a line
    got = lines_from(path, 0)
    assert got[0].startswith("--- 2.") and got[0].endswith(
        "dropped: each worker's log keeps its newest 1Mi (jobs.log_max_bytes) ---"
    )
    assert got[1] == f"{gone.offset // len(line):08d}" + "x" * 91
    assert got[-2].startswith("00039999") and got[-1] == "--- the end ---"
    # A reader that was at offset 1000 hears how much it lost from there.
    assert lines_from(path, 1000)[0].startswith(f"--- {(gone.offset - 1000) / MiB:.1f} MiB of older output")
    # A tail stops where the kept bytes begin, and a reopened log goes on where it was.
    assert tail_offset(path, 10**9, gone.offset) == gone.offset
    again = CappedLog(path, MiB)
    again.write(line * 20_000)
    again.close()
    assert read_dropped(path).offset > gone.offset and allocated(path) <= MiB + 64 * 1024


def test_two_logs_of_one_clock_say_which_bytes_came_first_and_a_trim_keeps_it_small(tmp_path: Path) -> None:
    clock = LogClock()
    a, b = CappedLog(tmp_path / "a.log", MiB, clock), CappedLog(tmp_path / "b.log", MiB, clock)
    line = b"y" * 99 + b"\n"
    for _ in range(3):  # a's bytes, b's, a's again (twice in a row: one run), b's
        a.write(line)
        a.write(line)
        b.write(line)
    times_a, times_b = LogTimes().refresh(tmp_path / "a.log"), LogTimes().refresh(tmp_path / "b.log")
    assert times_a.starts == [0, 200, 400] and times_b.starts == [0, 100, 200]  # one record per run
    merged = sorted(
        [(times_a.at(o), "a", o) for o in range(0, 600, 100)]
        + [(times_b.at(o), "b", o) for o in range(0, 300, 100)]
    )
    assert [who for _, who, _ in merged] == ["a", "a", "b"] * 3
    assert LogTimes().at(0) == 0  # a log without an order file (an older release's)

    # Written past its cap, a's order file keeps the record its first kept byte is in.
    for _ in range(20_000):
        a.write(line)
        b.write(line)
    a.close()
    b.close()
    gone = read_dropped(tmp_path / "a.log")
    again = LogTimes().refresh(tmp_path / "a.log")
    assert again.starts[0] == gone.offset and again.starts == sorted(again.starts)
    assert order_path(tmp_path / "a.log").stat().st_size < 20_000 * 16  # the dropped runs' records went
    assert again.at(gone.offset) > times_b.at(200)  # still later than what came before


def test_merged_lines_come_in_the_order_written_and_every_cursor_resumes_exactly_after_its_line(
    tmp_path: Path,
) -> None:
    clock = LogClock()
    logs = {n: CappedLog(tmp_path / f"{n}.log", None, clock) for n in ("trainer-0", "trainer-1")}
    # Runs of several lines, a line written in two parts with the other worker between
    # (it stays where it began), and a worker writing twice in a row (one run).
    writes = [("trainer-0", b"a1\na2\n"), ("trainer-1", b"b1\nb2\nb3"), ("trainer-0", b"a3\n")]
    writes += [("trainer-1", b" end\n"), ("trainer-1", b"b4\n"), ("trainer-0", b"a4\na5\n")]
    for name, data in writes:
        logs[name].write(data)
    for log in logs.values():
        log.close()
    names = list(logs)
    expected = ["a1", "a2", "b1", "b2", "b3 end", "a3", "b4", "a4", "a5"]
    lines, more = LogMerge.start(tmp_path, names, LogQuery()).read(final=True)
    assert [x.line for x in lines] == expected and not more
    assert [x.worker[-1] for x in lines] == [{"a": "0", "b": "1"}[t[0]] for t in expected]
    for i, line in enumerate(lines):  # no gap and no repeat after any cursor
        rest, _ = LogMerge.start(tmp_path, names, LogQuery(cursor=line.cursor)).read(final=True)
        assert [x.line for x in rest] == expected[i + 1 :]
    only, _ = LogMerge.start(tmp_path, names, LogQuery(workers={"trainer-1"})).read(final=True)
    assert [x.line for x in only] == ["b1", "b2", "b3 end", "b4"]


def test_without_a_cap_a_log_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "w.log"
    log = CappedLog(path, None)
    log.write(b"a\n" * MiB)
    log.close()
    assert path.stat().st_size == 2 * MiB and read_dropped(path).offset == 0


def test_a_sandbox_tmp_and_shm_are_tmpfs_of_the_given_size() -> None:
    args: list[Any] = bwrap_args(View(uid=1, gid=1, tmp_size=64 * MiB), [("usr", None)], [])
    for target in ("/tmp", "/dev/shm"):
        at = args.index(target) - 5
        assert args[at : at + 6] == ["--size", str(64 * MiB), "--perms", "1777", "--tmpfs", target]
