"""`PageNames`: paging a huge POSIX directory reads it once per AHEAD_NAMES names, not once
per page, and never serves a page from names read before the directory changed."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from paddlecloud.common.storage import posix
from paddlecloud.common.storage.posix import PageNames


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The directory reads made (one item per os.scandir of a descriptor)."""
    made: list[int] = []
    real = os.scandir

    def counted(target: Any) -> Any:
        if isinstance(target, int):
            made.append(target)
        return real(target)

    monkeypatch.setattr(posix.os, "scandir", counted)
    monkeypatch.setattr(posix, "AHEAD_NAMES", 25)
    return made


@pytest.fixture
def directory(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    top = tmp_path / "big"
    top.mkdir()
    for i in range(100):
        (top / f"f{i:03d}").touch()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield top, fd
    finally:
        os.close(fd)


def every_page(names: PageNames, fd: int, limit: int) -> list[list[str]]:
    pages, after = [], None
    while True:
        page = names.page(fd, after, limit)
        pages.append(page)
        if len(page) < limit:
            return pages
        after = page[-1]


def test_pages_of_an_unchanged_directory_come_from_one_read_per_ahead(
    directory: tuple[Path, int], scans: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    top, fd = directory
    monkeypatch.setattr(posix, "RACY_NS", 0)
    time.sleep(0.01)  # the directory's last change is now in the past
    expected = sorted(os.listdir(top))
    for limit in (1, 7, 10, 25, 40, 100, 1000):
        scans.clear()
        pages = every_page(PageNames(), fd, limit)
        assert [n for page in pages for n in page] == expected, limit
        # Each read keeps 25 names (or `limit`, if more): pages smaller than that share reads.
        assert len(scans) < len(pages) if limit < 25 else len(scans) <= len(pages), limit
    scans.clear()
    pages = every_page(PageNames(), fd, 10)
    # 11 pages (the last one empty) from 5 reads: after none, f019, f039, f059 and f079 (a
    # page that runs past the names kept reads again from its start; the last read holds all
    # the rest).
    assert (len(pages), len(scans)) == (11, 5)


def test_a_change_between_pages_is_seen_and_a_fresh_change_not_remembered(
    directory: tuple[Path, int], scans: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    top, fd = directory
    names = PageNames()
    # Changed just now (within RACY_NS): its names are not kept, each page reads it again.
    assert names.page(fd, None, 10) == [f"f{i:03d}" for i in range(10)]
    assert names.page(fd, "f009", 10)[0] == "f010"
    assert len(scans) == 2

    monkeypatch.setattr(posix, "RACY_NS", 0)
    time.sleep(0.01)
    scans.clear()
    assert names.page(fd, None, 10)[-1] == "f009"
    assert names.page(fd, "f009", 10)[0] == "f010"
    assert len(scans) == 1  # the second page came from the names kept
    # A name added after the cursor, and one removed: the next page reads the directory again.
    (top / "f0105").touch()
    (top / "f011").unlink()
    assert names.page(fd, "f019", 3) == ["f020", "f021", "f022"]
    assert len(scans) == 2
    assert names.page(fd, "f010", 3) == ["f0105", "f012", "f013"]
