"""Who runs a job's directory: at most one supervisor, once, even across a crash of the
jobs service between forking a supervisor and recording that it did.

A supervisor claims `JOB_DIR` before it does anything: an exclusive `flock` on
`JOB_DIR/supervisor.lock`, held for its whole life, and then neither `state.json` (a
supervisor ran here already) nor `abandoned` (a restarted service gave the directory
up) may exist. A restarted service that finds a job recorded but not started looks at
the same lock (`inspect`): held, or a `state.json` there, and the job has a supervisor,
which it adopts; neither, and nobody runs it or ever did, so it marks the directory
`abandoned` under the lock, takes it away and starts the job afresh. A supervisor forked
late (the zygote read the request after the service died) then finds the mark, or a
directory that is not the one it was born in, and leaves without running anything.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from enum import Enum
from pathlib import Path

LOCK = "supervisor.lock"
ABANDONED = "abandoned"
STATE = "state.json"


class Earlier(Enum):
    """What an earlier start of a job left in its directory."""

    NOTHING = "nothing"  # no directory, or one nobody ran, now given up
    SUPERVISED = "supervised"  # a supervisor runs the job, or ran it to its end


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _lock(dir_fd: int) -> int | None:
    """The lock file's descriptor, locked; None if another process holds it."""
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def claim(job_dir: Path, base: str | Path) -> int | None:
    """For a supervisor: the held lock's descriptor (keep it open for life), or None if
    this job is not ours to run. `base` is the directory the supervisor was born in (the
    zygote forks it there): it must still be `job_dir`, not one that replaced it."""
    dir_fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        here = os.fstat(dir_fd)
        try:
            there = os.stat(job_dir, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if (here.st_dev, here.st_ino) != (there.st_dev, there.st_ino):
            return None
        fd = _lock(dir_fd)
        if fd is None:
            return None
        if _exists(STATE, dir_fd) or _exists(ABANDONED, dir_fd):
            os.close(fd)
            return None
        return fd
    finally:
        os.close(dir_fd)


def inspect(job_dir: Path) -> Earlier:
    """For the service, before (re)starting a job recorded as not started: whether a
    supervisor has it. If none has and none had, the directory is marked abandoned
    (under the lock, so no supervisor can claim it from now on) and left for the caller
    to take away."""
    try:
        dir_fd = os.open(job_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return Earlier.NOTHING
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        return Earlier.NOTHING  # not a directory the service made: nothing to adopt
    try:
        fd = _lock(dir_fd)
        if fd is None:
            return Earlier.SUPERVISED
        try:
            if _exists(STATE, dir_fd):
                return Earlier.SUPERVISED
            with contextlib.suppress(FileExistsError):
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
                os.close(os.open(ABANDONED, flags, 0o600, dir_fd=dir_fd))
            return Earlier.NOTHING
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)
