"""Storage used per home, for quotas: walked off the event loop and cached briefly."""

from __future__ import annotations

import asyncio
import os
import stat
import time
from dataclasses import dataclass

from .paths import Root

# A walk of a large home takes a while; quota checks may be this stale, and uploads in
# flight are counted separately by the caller (their sizes are reserved at creation).
CACHE_SECONDS = 30.0


@dataclass(frozen=True)
class HomeUsage:
    bytes: int
    files: int


def _walk(dirfd: int) -> HomeUsage:
    """Sum regular files' allocated sizes beneath `dirfd`, never following symlinks."""
    total, files = 0, 0
    with os.scandir(dirfd) as entries:
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
                files += 1
            elif stat.S_ISDIR(st.st_mode):
                child = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dirfd)
                try:
                    sub = _walk(child)
                finally:
                    os.close(child)
                total += sub.bytes
                files += sub.files
    return HomeUsage(total, files)


class Usage:
    """Bytes and files per user's home, cached for CACHE_SECONDS."""

    def __init__(self, root: Root) -> None:
        self._root = root
        self._cache: dict[str, tuple[float, HomeUsage]] = {}

    def forget(self, user: str) -> None:
        """Drop the cached figure after a change this service made (upload, rm, mv)."""
        self._cache.pop(user, None)

    async def of(self, user: str) -> HomeUsage:
        cached = self._cache.get(user)
        if cached is not None and time.monotonic() - cached[0] < CACHE_SECONDS:
            return cached[1]
        home = self._root.root / "home" / user
        usage = await asyncio.to_thread(self._measure, home)
        self._cache[user] = (time.monotonic(), usage)
        return usage

    @staticmethod
    def _measure(home: os.PathLike[str]) -> HomeUsage:
        try:
            fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return HomeUsage(0, 0)
        try:
            return _walk(fd)
        finally:
            os.close(fd)
