"""Storage used per home, for quotas: CephFS's recursive statistics or a walk, cached briefly."""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import time
from dataclasses import dataclass

from paddlecloud.common.volume import Root

from . import cephfs

# A walk of a large home takes a while; quota checks may be this stale, and uploads in
# flight are counted separately by the caller (their sizes are reserved at creation).
# CephFS's recursive statistics cost two getxattr calls and are never cached here (they
# trail the tree by seconds themselves: the MDS propagates them lazily).
CACHE_SECONDS = 30.0


@dataclass(frozen=True)
class HomeUsage:
    bytes: int
    files: int


def _walk(top: int) -> HomeUsage:
    """Sum regular files' allocated bytes beneath the directory `top`, never following symlinks.

    Allocated, not apparent: st_blocks * 512, what the file takes on the disk, so a sparse
    file of 1 TiB counts the blocks it holds (as `du` counts it, and as filesystem quotas
    do), while a file that is really written counts whole blocks. A file with several hard
    links in the home counts once.

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
    return HomeUsage(total, files)


class Usage:
    """Bytes and files per user's home, cached for CACHE_SECONDS."""

    def __init__(self, root: Root) -> None:
        self._root = root
        self._cache: dict[str, tuple[float, HomeUsage]] = {}
        self._cached = not cephfs.is_cephfs(root.root)

    def forget(self, user: str) -> None:
        """Drop the cached figure after a change this service made (upload, rm, mv)."""
        self._cache.pop(user, None)

    async def of(self, user: str) -> HomeUsage:
        cached = self._cache.get(user)
        if cached is not None and time.monotonic() - cached[0] < CACHE_SECONDS:
            return cached[1]
        home = self._root.root / "home" / user
        usage = await asyncio.to_thread(self._measure, home)
        if self._cached:
            self._cache[user] = (time.monotonic(), usage)
        return usage

    @staticmethod
    def _measure(home: os.PathLike[str]) -> HomeUsage:
        try:
            fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return HomeUsage(0, 0)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a home replaced by a symlink holds nothing of its own
                return HomeUsage(0, 0)
            raise
        try:
            # CephFS keeps recursive statistics per directory: no walk, at any size.
            stats = cephfs.rstats(fd)
            return HomeUsage(*stats) if stats is not None else _walk(fd)
        finally:
            os.close(fd)
