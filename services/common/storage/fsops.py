"""POSIX file operations a volume and its staging share: renameat2 NOREPLACE and the sha256 xattr."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import stat

from ..beneath import load_libc

# A file's sha256 is remembered with the size and mtime it describes, so a later stat
# (or an upload's completion after a restart) need not read the file again.
SHA256_XATTR = "user.paddlecloud.sha256"
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# Filesystems without user xattrs (tmpfs before 6.6, some network filesystems) say so
# with one of these; there is then simply nothing remembered.
_NO_XATTR = frozenset(
    {
        errno.ENODATA,
        errno.ENOTSUP,
        errno.EOPNOTSUPP,
        errno.ERANGE,
        errno.EPERM,
        errno.EACCES,
        errno.ENOSPC,
        errno.EDQUOT,
        errno.E2BIG,
    }
)


def remembered_sha256(fd: int, st: os.stat_result | None = None) -> str | None:
    """The sha256 recorded with the file, if it still describes its size and mtime."""
    try:
        raw = os.getxattr(fd, SHA256_XATTR)
    except OSError as exc:
        if exc.errno in _NO_XATTR:
            return None
        raise
    try:
        record = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(record, dict):
        return None
    digest = record.get("sha256")
    if not (isinstance(digest, str) and _SHA256_HEX.fullmatch(digest)):
        return None
    st = st or os.fstat(fd)
    if (record.get("size"), record.get("mtime_ns")) != (st.st_size, st.st_mtime_ns):
        return None
    return digest


def remember_sha256(fd: int, digest: str, st: os.stat_result | None = None) -> None:
    """Record `digest` with the file's size and mtime, where the filesystem has user xattrs.

    Best effort: setting an xattr changes ctime, never mtime, so the record stays valid
    until the content changes; where xattrs are refused the next reader hashes again.
    """
    st = st or os.fstat(fd)
    record = json.dumps({"sha256": digest, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    with contextlib.suppress(OSError):
        os.setxattr(fd, SHA256_XATTR, record.encode())


RENAME_NOREPLACE = 1
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276}.get(os.uname().machine)


_LIBC = load_libc()


def renameat2(src_dir: int, src: str, dst_dir: int, dst: str, flags: int) -> None:
    """renameat2(2); OSError(ENOSYS) where this platform has no such call."""
    if _LIBC is None or _SYS_RENAMEAT2 is None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS), dst)
    result = _LIBC.syscall(
        ctypes.c_long(_SYS_RENAMEAT2),
        ctypes.c_int(src_dir),
        ctypes.c_char_p(os.fsencode(src)),
        ctypes.c_int(dst_dir),
        ctypes.c_char_p(os.fsencode(dst)),
        ctypes.c_uint(flags),
    )
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), dst)


def rename_noreplace(src_dir: int, src: str, dst_dir: int, dst: str, *, is_dir: bool = False) -> None:
    """Move `src` to `dst` unless `dst` exists (FileExistsError), atomically where possible.

    renameat2(RENAME_NOREPLACE) where the kernel and filesystem have it. Otherwise a file
    is hard-linked (link(2) never replaces, so this stays atomic; a link left by a crash
    between link and unlink is recognised as ours and the move finished), and a directory
    falls back to check-then-rename, which is RACY: something created at the destination
    in between is replaced. Only kernels before 3.15 or filesystems without the flag.
    """
    try:
        renameat2(src_dir, src, dst_dir, dst, RENAME_NOREPLACE)
        return
    except OSError as exc:
        # ENOSYS: no renameat2 here; EINVAL/ENOTSUP: this filesystem takes no flags (EINVAL
        # is also a directory into itself, which the fallback's rename reports again).
        if exc.errno not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise
    if is_dir:
        try:
            os.stat(dst, dir_fd=dst_dir, follow_symlinks=False)
        except FileNotFoundError:
            os.rename(src, dst, src_dir_fd=src_dir, dst_dir_fd=dst_dir)
            return
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
    try:
        os.link(src, dst, src_dir_fd=src_dir, dst_dir_fd=dst_dir, follow_symlinks=False)
    except FileExistsError:
        if not _same_file(src_dir, src, dst_dir, dst):
            raise
    os.unlink(src, dir_fd=src_dir)


def _same_file(src_dir: int, src: str, dst_dir: int, dst: str) -> bool:
    a = os.stat(src, dir_fd=src_dir, follow_symlinks=False)
    b = os.stat(dst, dir_fd=dst_dir, follow_symlinks=False)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) and stat.S_ISREG(b.st_mode)
