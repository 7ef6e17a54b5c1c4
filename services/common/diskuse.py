"""What a directory tree takes on the disk: its regular files' allocated blocks, walked by descriptors."""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from . import trees


@dataclass(frozen=True)
class DiskUse:
    """Bytes allocated to a tree's regular files, and how many there are."""

    bytes: int
    files: int


def walk_allocated(top: int) -> DiskUse:
    """Sum regular files' allocated bytes beneath the directory `top`, never following symlinks.

    Allocated, not apparent: st_blocks * 512, what the file takes on the disk, so a sparse
    file of 1 TiB counts the blocks it holds (as `du` counts it, and as filesystem quotas
    do), while a file that is really written counts whole blocks. A file with several hard
    links in the tree counts once. Any depth, with a bounded number of descriptors
    (`trees.walk`).
    """
    total, files = 0, 0
    linked: set[tuple[int, int]] = set()
    with contextlib.closing(trees.walk(top)) as entries:
        for entry in entries:
            st = entry.st
            if not stat.S_ISREG(st.st_mode):
                continue
            if st.st_nlink > 1:
                if (st.st_dev, st.st_ino) in linked:
                    continue
                linked.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
            files += 1
    return DiskUse(total, files)


def allocated_beneath(path: Path) -> DiskUse:
    """What the directory at `path` holds (nothing if it is missing, or is not a directory
    of its own: a symlink there is not followed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return DiskUse(0, 0)
    try:
        return walk_allocated(fd)
    finally:
        os.close(fd)
