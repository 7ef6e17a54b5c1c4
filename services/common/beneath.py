"""Root's file operations under a directory a sandboxed uid could write, never through a link.

The services run as root and sandbox user code as other uids; what that code can write
(a PFS home, a job's package and working directories, a build's virtualenv) may hold
symlinks aimed anywhere on the host, swapped in at any moment. So root never names a
path inside such a tree as a string: it opens the tree's top once (O_NOFOLLOW; its
parents are the platform's own), and everything below through `openat2` with
RESOLVE_BENEATH, or one component at a time with O_NOFOLLOW where openat2 is missing.
The functions here for root's own files refuse every symlink on the way (ELOOP), inside
the tree or out, and never replace what they find: a planted entry fails the operation,
which the caller reports, instead of being written through.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import stat
from pathlib import Path

from . import trees

_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437}.get(os.uname().machine)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
REFUSED = "a symlink is in the way, which root does not follow"
_EAGAIN_RETRIES = 1000
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def load_libc() -> ctypes.CDLL | None:
    """This process's C library, for the system calls Python's os module lacks."""
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - every Linux has a libc
        return None


_LIBC = load_libc()


def openat2(
    dirfd: int, relative: str, flags: int, mode: int, resolve: int = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS
) -> int:
    """openat2(2): `relative` opened beneath `dirfd`; an escape fails with EXDEV.

    With RESOLVE_BENEATH the kernel answers EAGAIN when a rename or mount anywhere on the
    system raced a ".." step of the walk (it cannot then prove the step stayed beneath), and
    openat2(2) says to retry: a busy machine renames all the time, so this retries, a bounded
    number of times."""
    assert _LIBC is not None and _SYS_OPENAT2 is not None
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, resolve)
    for _ in range(_EAGAIN_RETRIES):
        fd = int(_LIBC.syscall(_SYS_OPENAT2, dirfd, relative.encode(), ctypes.byref(how), ctypes.sizeof(how)))
        if fd >= 0:
            return fd
        code = ctypes.get_errno()
        if code != errno.EAGAIN:
            break
    raise OSError(code, os.strerror(code), relative)


def probe_openat2() -> bool:
    """Whether this kernel (and any seccomp filter around us) lets openat2 through."""
    if _LIBC is None or _SYS_OPENAT2 is None:
        return False
    root = os.open("/", os.O_PATH | os.O_DIRECTORY)
    try:
        os.close(openat2(root, ".", os.O_PATH | os.O_DIRECTORY, 0))
        return True
    except OSError as exc:
        if exc.errno in (errno.ENOSYS, errno.EPERM):  # old kernel, or a seccomp filter
            return False
        raise
    finally:
        os.close(root)


@functools.cache
def _have_openat2() -> bool:
    return probe_openat2()


def walk_nofollow(dirfd: int, relative: str, flags: int, mode: int) -> int:
    """The fallback: one component at a time, refusing every symlink (ELOOP), in or out."""
    names = [] if relative == "." else relative.split("/")
    current = os.dup(dirfd)
    try:
        for name in names[:-1]:
            try:
                nxt = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=current)
            except NotADirectoryError:
                if stat.S_ISLNK(os.stat(name, dir_fd=current, follow_symlinks=False).st_mode):
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), relative) from None
                raise
            os.close(current)
            current = nxt
        last = names[-1] if names else "."
        try:
            fd = os.open(last, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=current)
        except NotADirectoryError:
            # O_DIRECTORY on a final symlink: a symlink, as above, not a missing directory.
            if stat.S_ISLNK(os.stat(last, dir_fd=current, follow_symlinks=False).st_mode):
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), relative) from None
            raise
        # With O_PATH, O_NOFOLLOW opens a final symlink itself instead of failing.
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), relative)
        return fd
    finally:
        os.close(current)


class LinkRefused(PermissionError):
    """A symlink (or a way out) stood where root was to open, create or change a file."""


def open_beneath(dirfd: int, relative: str, flags: int, mode: int = 0o644) -> int:
    """`relative` opened beneath the directory `dirfd`, through no symlink at all.

    Stricter than PFS's resolution (which lets a link stay inside its area): root's own
    files have no reason to pass a link, so any link on the way is refused (LinkRefused),
    with openat2(RESOLVE_NO_SYMLINKS) or with the O_NOFOLLOW walk alike.
    """
    try:
        if _have_openat2():
            resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
            try:
                return openat2(dirfd, relative, flags | os.O_NOFOLLOW, mode, resolve)
            except NotADirectoryError:
                # O_DIRECTORY met a final symlink (ENOTDIR, not ELOOP): say it was a link.
                if flags & os.O_DIRECTORY and _is_link(dirfd, relative, resolve):
                    raise OSError(errno.ELOOP, REFUSED, relative) from None
                raise
        return walk_nofollow(dirfd, relative, flags, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EXDEV):
            raise LinkRefused(exc.errno, REFUSED, relative) from None
        raise


def _is_link(dirfd: int, relative: str, resolve: int) -> bool:
    try:
        fd = openat2(dirfd, relative, os.O_PATH | os.O_NOFOLLOW, 0, resolve)
    except OSError:
        return False
    try:
        return stat.S_ISLNK(os.fstat(fd).st_mode)
    finally:
        os.close(fd)


def open_top(path: Path | str) -> int:
    """The directory at the top of a tree a user could write, opened without following a
    final symlink. Its parents must be the platform's own (root's, not writable by users)."""
    try:
        return os.open(path, DIR_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and os.path.islink(path)):
            raise LinkRefused(errno.ELOOP, REFUSED, str(path)) from None
        raise


def write_new(dirfd: int, relative: str, data: bytes, mode: int = 0o644) -> None:
    """Create `relative` beneath `dirfd` with `data`, durably; FileExistsError if anything
    (a file, a dangling link) is there already: what a user left is never written through."""
    fd = open_beneath(dirfd, relative, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_regular(dirfd: int, relative: str, flags: int) -> int:
    # O_NONBLOCK: a FIFO planted at the name must not hang the service on open.
    fd = open_beneath(dirfd, relative, flags | os.O_NONBLOCK | os.O_NOCTTY)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LinkRefused(errno.EPERM, "not a regular file", relative)
    return fd


def read_file(dirfd: int, relative: str, limit: int = 1 << 20) -> bytes:
    """The first `limit` bytes of the regular file `relative` beneath `dirfd`."""
    fd = _open_regular(dirfd, relative, os.O_RDONLY)
    try:
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def touch(dirfd: int, relative: str) -> None:
    """Set the mtime of the regular file `relative` beneath `dirfd` to now (never creating it)."""
    fd = _open_regular(dirfd, relative, os.O_RDONLY)
    try:
        os.utime(fd)
    finally:
        os.close(fd)


def lstat(dirfd: int, relative: str) -> os.stat_result:
    """`relative`'s own status beneath `dirfd` (a final symlink described, not followed)."""
    head, _, name = relative.rpartition("/")
    if not head:
        return os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    parent = open_beneath(dirfd, head, os.O_PATH | os.O_DIRECTORY)
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    finally:
        os.close(parent)


def chown_tree(path: Path | str, uid: int, gid: int) -> None:
    """Give `path` and everything below it to uid:gid, never following a symlink, at any
    depth: the top is opened with O_NOFOLLOW and the rest walked through descriptors
    (`trees.chown_tree`), so a link swapped in at any moment has only itself changed."""
    top = open_top(path)
    try:
        trees.chown_tree(top, uid, gid)
    finally:
        os.close(top)
