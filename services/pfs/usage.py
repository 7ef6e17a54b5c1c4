"""Storage used per home, for quotas: CephFS's recursive statistics or a walk, cached briefly."""

from __future__ import annotations

import asyncio
import errno
import os
import time

from paddlecloud.common.diskuse import DiskUse, walk_allocated
from paddlecloud.common.volume import Root

from . import cephfs

# A walk of a large home takes a while; quota checks may be this stale, and uploads in
# flight are counted separately by the caller (their sizes are reserved at creation).
# CephFS's recursive statistics cost two getxattr calls and are never cached here (they
# trail the tree by seconds themselves: the MDS propagates them lazily).
CACHE_SECONDS = 30.0


# What a home holds: allocated bytes and regular files (services/common/diskuse.py).
HomeUsage = DiskUse
_walk = walk_allocated


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
