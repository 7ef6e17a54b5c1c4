"""One unprivileged uid per platform user, for the local backend's sandboxes.

The map lives in `<jobs.work_dir>/uids.json` and only grows: a user's uid never changes,
so the files their jobs wrote stay theirs. Allocation takes an exclusive `flock` on the
file, so two processes on one machine never hand out one uid twice. The uid is also
the user's gid (a group of their own); neither is in /etc/passwd, which nothing needs.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path


class UidsExhausted(RuntimeError):
    """Every uid of the configured range is taken."""


class UidMap:
    def __init__(self, path: Path, base: int, count: int) -> None:
        self._path = path
        self._base = base
        self._count = count
        self._cache: dict[str, int] = {}

    def uid_for(self, user: str) -> int:
        """The user's uid, allocated the first time it is asked for."""
        if user in self._cache:
            return self._cache[user]
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "r+", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            text = f.read()
            table: dict[str, int] = json.loads(text) if text.strip() else {}
            if user not in table:
                taken = set(table.values())
                free = next((u for u in range(self._base, self._base + self._count) if u not in taken), None)
                if free is None:
                    raise UidsExhausted(f"all {self._count} uids from {self._base} are taken")
                table[user] = free
                f.seek(0)
                f.truncate()
                f.write(json.dumps(table, indent=1, sort_keys=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
            self._cache.update(table)
        return self._cache[user]
