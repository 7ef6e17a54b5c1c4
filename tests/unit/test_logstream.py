"""The log-batch reader the jobs and builder services share."""

from __future__ import annotations

from pathlib import Path

from paddlecloud.common.logstream import LOG_READ_SIZE, read_lines


def test_whole_lines_come_with_their_sizes_and_a_last_partial_line_waits_unless_final(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.write_bytes(b"one\n\ntwo\xff\nthree")
    lines, more = read_lines(log, 0, final=False)
    assert lines == [("one", 4), ("", 1), ("two\ufffd", 5)] and more is False
    assert read_lines(log, 10, final=False) == ([], False)
    assert read_lines(log, 10, final=True) == ([("three", 5)], False)
    assert read_lines(tmp_path / "missing.log", 0, final=True) == ([], False)


def test_an_endless_line_is_cut_into_pieces_that_account_for_every_byte(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.write_bytes(b"x" * (2 * LOG_READ_SIZE + 3) + b"\nend\n")
    lines, _ = read_lines(log, 0, final=False)
    assert [len(text) for text, _ in lines] == [LOG_READ_SIZE, LOG_READ_SIZE, 3, 3]
    assert sum(size for _, size in lines) == log.stat().st_size
