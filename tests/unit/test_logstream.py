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


def test_short_lines_split_at_once_match_the_piece_by_piece_reading(tmp_path: Path) -> None:
    # ASCII and not, an invalid byte, an empty line, and a batch with a long line (read
    # piece by piece): the same lines and sizes either way, and every byte accounted for.
    for data in (
        b"a\nbb\n\nccc\npart",
        "é\n✓ done\nx".encode() + b"\xfe\n",
        b"short\n" + b"y" * LOG_READ_SIZE + b"\nshort again\n",
    ):
        log = tmp_path / "w.log"
        log.write_bytes(data)
        waiting, _ = read_lines(log, 0, final=False)
        final, _ = read_lines(log, 0, final=True)
        assert sum(size for _, size in final) == len(data)
        assert waiting == final[: len(waiting)]
        texts = [text for text, _ in final]
        if len(data) < LOG_READ_SIZE:
            assert texts == data.decode("utf-8", errors="replace").split("\n")[: len(texts)]
        else:
            assert texts == ["short", "y" * LOG_READ_SIZE, "", "short again"]  # its newline comes alone
