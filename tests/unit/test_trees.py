"""The tree walker root uses on what users wrote: any depth, few descriptors, no symlink
followed, and a directory moved out from under it noticed rather than followed."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from paddlecloud.common import trees

DEPTH = 300  # far more levels than the walk keeps open (trees.WINDOW)


def chain(top: Path, depth: int) -> Path:
    path = top
    for _ in range(depth):
        path = path / "d"
    path.mkdir(parents=True)
    return path


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_walk_yields_each_entry_once_with_its_path_and_a_bounded_number_of_descriptors(
    tmp_path: Path,
) -> None:
    bottom = chain(tmp_path / "top", DEPTH)
    (bottom / "f").write_text("abc")
    for i in range(50):  # wide too: siblings are listed, not held open
        (tmp_path / "top" / f"s{i}" / "x").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("s")
    os.symlink(tmp_path / "outside", bottom / "link")
    expected = {str(p.relative_to(tmp_path / "top")) for p in (tmp_path / "top").rglob("*")}
    fd = trees.open_dir(tmp_path / "top")
    before, most = open_fds(), 0
    try:
        seen = []
        with contextlib.closing(trees.walk(fd)) as entries:
            for entry in entries:
                seen.append(entry.relative())
                assert entry.path_bytes == len(os.fsencode(entry.relative()))
                most = max(most, open_fds())
    finally:
        os.close(fd)
    assert sorted(seen) == sorted(expected) and len(seen) == len(set(seen))
    assert not any("secret" in s for s in seen)  # the symlink was not entered
    assert most - before <= trees.WINDOW + 2, (before, most)
    assert open_fds() == before - 1


def test_remove_tree_removes_any_depth_and_never_what_a_symlink_points_to(tmp_path: Path) -> None:
    bottom = chain(tmp_path / "top", DEPTH)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep").write_text("k")
    os.symlink(tmp_path / "outside", bottom / "link")
    (bottom / "file").write_text("x")
    before = open_fds()
    trees.remove_path(tmp_path / "top")
    assert sorted(os.listdir(tmp_path)) == ["outside"]
    assert (tmp_path / "outside" / "keep").read_text() == "k"
    assert open_fds() == before
    trees.remove_path(tmp_path / "top")  # gone already: nothing to do
    os.symlink(tmp_path / "outside", tmp_path / "top")
    trees.remove_path(tmp_path / "top")  # a symlink is unlinked, not followed
    assert (tmp_path / "outside" / "keep").exists() and not os.path.lexists(tmp_path / "top")


def test_a_directory_moved_out_during_a_walk_is_noticed_not_followed(tmp_path: Path) -> None:
    """Past the window the walk climbs back through `..`: had it trusted `..`, a directory
    moved elsewhere would lead it into the new parent, which it would then empty."""
    chain(tmp_path / "top", DEPTH)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("k")
    moved = tmp_path / "top" / Path(*["d"] * 100)
    fd = trees.open_dir(tmp_path / "top")
    try:
        with contextlib.closing(trees.walk(fd)) as entries, pytest.raises(trees.TreeChanged):
            for entry in entries:
                if entry.depth == 200 and moved.exists():
                    os.rename(moved, elsewhere / "d")  # level 100 now lives in `elsewhere`
    finally:
        os.close(fd)
    assert (elsewhere / "keep").read_text() == "k"
