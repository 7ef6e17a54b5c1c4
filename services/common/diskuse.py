"""What a directory tree takes on the disk: its regular files' allocated blocks, walked by descriptors."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path


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
    links in the tree counts once.

    Iterative, with one open descriptor per directory on the stack, so trees thousands of
    levels deep (which `mkdir -p` of a 4 KiB path can make) are measured, not a crash.
    """
    total, files = 0, 0
    linked: set[tuple[int, int]] = set()
    stack = [os.dup(top)]
    try:
        while stack:
            dirfd = stack.pop()
            try:
                with os.scandir(dirfd) as entries:
                    for entry in entries:
                        st = entry.stat(follow_symlinks=False)
                        if stat.S_ISREG(st.st_mode):
                            if st.st_nlink > 1:
                                if (st.st_dev, st.st_ino) in linked:
                                    continue
                                linked.add((st.st_dev, st.st_ino))
                            total += st.st_blocks * 512
                            files += 1
                        elif stat.S_ISDIR(st.st_mode):
                            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
                            try:
                                stack.append(os.open(entry.name, flags, dir_fd=dirfd))
                            except FileNotFoundError:
                                pass  # removed while we walked
            finally:
                os.close(dirfd)
    finally:
        for fd in stack:
            os.close(fd)
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
