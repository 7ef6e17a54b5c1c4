"""PFS's file operations (docs/pfs.md): list, stat, mkdir, rm, mv and a file's sha256,
beneath a datacenter's root; the endpoints in api.py call these.

Every path is resolved beneath its area by `volume.Root`; changes go through `*at`
calls on the parent's descriptor, so a symlink is never followed out of a home, and
nothing here builds a host path from a string.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import structlog

from paddlecloud.common import errors, trees
from paddlecloud.common.volume import (
    MAX_PATH_BYTES,
    PATH_FORBIDDEN,
    PfsPath,
    Root,
    kind,
    problem_for,
)

from .errors import TREE_TOO_DEEP
from .fsops import remember_sha256, remembered_sha256, rename_noreplace

log = structlog.get_logger()

HASH_CHUNK = 1024 * 1024
# The uploads service records a completed file's sha256 here (JSON: sha256, size, mtime_ns).


# Parsing --------------------------------------------------------------------------


def prepare_write(root: Root, path: PfsPath) -> None:
    """A user's home appears on their first write; `authorize` let only its owner or an admin here."""
    if path.area == "home" and path.owner is not None:
        with fs_problems(path):
            root.ensure_home(path.owner)


@contextlib.contextmanager
def fs_problems(path: PfsPath | str) -> Iterator[None]:
    """Filesystem errors as the client should see them (`paths.problem_for`)."""
    try:
        yield
    except OSError as exc:
        if exc.errno == errno.ELOOP and not isinstance(exc, PermissionError):
            # Our own O_NOFOLLOW met a symlink swapped in since we looked.
            raise PATH_FORBIDDEN(f"{path}: is a symlink, which this call does not follow") from exc
        raise problem_for(exc, path) from exc


# Entries --------------------------------------------------------------------------


def _mtime(ns: int) -> str:
    seconds, rest = divmod(ns, 10**9)
    moment = datetime.fromtimestamp(seconds, UTC).replace(microsecond=rest // 1000)
    return moment.isoformat(timespec="microseconds")


def entry_of(text: str, name: str, st: os.stat_result, target: str | None = None) -> dict[str, Any]:
    what = kind(st)
    entry: dict[str, Any] = {
        "path": text,
        "name": name,
        "type": what,
        "size": st.st_size if what == "file" else 0,
        "mtime": _mtime(st.st_mtime_ns),
        "mode": format(stat.S_IMODE(st.st_mode), "04o"),
    }
    if target is not None:
        entry["target"] = target
    return entry


def lstat_entry(root: Root, path: PfsPath) -> dict[str, Any]:
    """`path`'s entry, describing a symlink rather than what it points to."""
    if path.is_area_root:
        return entry_of(path.text, path.name, root.lstat(path))
    with root.parent_fd(path) as (fd, name):
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        target = os.readlink(name, dir_fd=fd) if stat.S_ISLNK(st.st_mode) else None
    return entry_of(path.text, path.name, st, target)


def _read_dir(fd: int, text: str) -> list[dict[str, Any]]:
    """The entries of the directory open at `fd`."""
    found = []
    with os.scandir(fd) as it:
        for item in it:
            try:
                st = item.stat(follow_symlinks=False)
                target = os.readlink(item.name, dir_fd=fd) if stat.S_ISLNK(st.st_mode) else None
            except FileNotFoundError:
                continue  # removed while we read
            # Names come from the disk (a job may have made any name): shown, not re-validated.
            found.append(entry_of(f"{text}/{item.name}", item.name, st, target))
    return found


def _walk(fd: int, text: str, recursive: bool) -> list[dict[str, Any]]:
    """Every entry beneath the directory open at `fd` (which this closes), never following symlinks.

    Recursively through `trees.walk`: a bounded number of descriptors at any depth. A
    tree holding a path longer than a PFS path may be (MAX_PATH_BYTES: 2,048 levels of
    one-letter names at most) is refused with TREE_TOO_DEEP: such paths could not be
    named in a later call, and their listing would grow with the square of the depth.
    """
    try:
        if not recursive:
            out = _read_dir(fd, text)
        else:
            out = []
            room = MAX_PATH_BYTES - len(os.fsencode(text)) - 1
            with contextlib.closing(trees.walk(fd)) as found:
                for item in found:
                    if item.path_bytes > room:
                        raise TREE_TOO_DEEP(
                            f"{text}: holds paths longer than {MAX_PATH_BYTES} bytes ({item.depth} levels "
                            "down and deeper), which PFS cannot name; list a directory further down, "
                            "or remove the tree with rm -r"
                        )
                    target = None
                    if stat.S_ISLNK(item.st.st_mode):
                        try:
                            target = os.readlink(item.name, dir_fd=item.dir_fd)
                        except FileNotFoundError:
                            continue  # removed while we read
                    out.append(entry_of(f"{text}/{item.relative()}", item.name, item.st, target))
    finally:
        os.close(fd)
    out.sort(key=lambda e: e["path"])
    return out


def list_tree(root: Root, path: PfsPath, recursive: bool) -> list[dict[str, Any]]:
    if path.is_area_root:
        fd = root.open(path, os.O_RDONLY | os.O_DIRECTORY)
        return _walk(fd, path.text, recursive)
    with root.parent_fd(path) as (parent, name):
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            # A file's listing is that file; a symlink's is the link itself, never its target.
            target = os.readlink(name, dir_fd=parent) if stat.S_ISLNK(st.st_mode) else None
            return [entry_of(path.text, path.name, st, target)]
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    return _walk(fd, path.text, recursive)


# Downloads ------------------------------------------------------------------------


# Listing and stat -----------------------------------------------------------------


def file_sha256(root: Root, path: PfsPath, *, compute: bool) -> tuple[os.stat_result, str | None] | None:
    """The file's stat and sha256 (remembered, or computed if `compute`); None if not a file.

    The descriptor is opened and closed here, in the thread that reads it.
    """
    with root.parent_fd(path) as (parent, name):
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return None
            raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        remembered = remembered_sha256(fd, st)
        if remembered is not None or not compute:
            return st, remembered
        digest = hashlib.sha256()
        while block := os.read(fd, HASH_CHUNK):
            digest.update(block)
        after = os.fstat(fd)
        if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
            raise errors.CONFLICT(f"{path}: the file changed while it was being hashed; try again")
        hexdigest = digest.hexdigest()
        remember_sha256(fd, hexdigest, st)
        return st, hexdigest
    finally:
        os.close(fd)


# Changes --------------------------------------------------------------------------


def make_dirs(root: Root, path: PfsPath, parents: bool) -> tuple[bool, dict[str, Any]]:
    if path.is_area_root:
        if not parents:
            raise errors.ALREADY_EXISTS(f"{path}: already exists")
        return False, lstat_entry(root, path)
    steps = [
        PfsPath(path.datacenter, path.area, path.owner, path.parts[:n]) for n in range(1, len(path.parts) + 1)
    ]
    created = False
    for step in steps if parents else [path]:
        with root.parent_fd(step) as (parent, name):
            try:
                os.mkdir(name, 0o755, dir_fd=parent)
                root.adopt(step, parent, name)
                created = step == path
            except FileExistsError:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    # A symlink counts as in the way too: mkdir -p does not follow it.
                    raise errors.CONFLICT(f"{step}: a {kind(st)} is in the way") from None
                if not parents:
                    raise errors.ALREADY_EXISTS(f"{path}: already exists") from None
    return created, lstat_entry(root, path)


def remove_path(root: Root, path: PfsPath, recursive: bool) -> None:
    with root.parent_fd(path) as (parent, name):
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=parent)  # a symlink goes, never what it points to
        elif recursive:
            # Any depth, a bounded number of descriptors, never into a symlink.
            trees.remove_tree(parent, name)
        else:
            os.rmdir(name, dir_fd=parent)


def move_path(root: Root, src: PfsPath, dst: PfsPath, overwrite: bool) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        with fs_problems(src):
            src_dir, src_name = stack.enter_context(root.parent_fd(src))
            src_st = os.stat(src_name, dir_fd=src_dir, follow_symlinks=False)
        with fs_problems(dst):
            dst_dir, dst_name = stack.enter_context(root.parent_fd(dst))
            try:
                dst_st: os.stat_result | None = os.stat(dst_name, dir_fd=dst_dir, follow_symlinks=False)
            except FileNotFoundError:
                dst_st = None
        moving_dir = stat.S_ISDIR(src_st.st_mode)
        both = f"{src} → {dst}"
        with fs_problems(both):
            try:
                if dst_st is None:
                    rename_noreplace(src_dir, src_name, dst_dir, dst_name, is_dir=moving_dir)
                elif stat.S_ISDIR(dst_st.st_mode):
                    raise errors.ALREADY_EXISTS(f"{dst}: is a directory, and mv never replaces a directory")
                elif not overwrite:
                    raise errors.ALREADY_EXISTS(f"{dst}: already exists (set overwrite to replace it)")
                elif moving_dir:
                    raise errors.CONFLICT(f"{both}: a directory cannot replace a {kind(dst_st)}")
                else:
                    # rename(2) replaces a non-directory atomically; had a directory
                    # appeared there since, it fails with EISDIR rather than replace it.
                    os.rename(src_name, dst_name, src_dir_fd=src_dir, dst_dir_fd=dst_dir)
            except OSError as exc:
                if exc.errno == errno.EINVAL:
                    # The kernel's own check, which also sees through symlinks inside the home.
                    raise errors.BAD_REQUEST(f"{src} cannot be moved into itself ({dst})") from exc
                if exc.errno in (errno.EXDEV, errno.EBUSY) and not isinstance(exc, PermissionError):
                    raise errors.CONFLICT(
                        f"{both}: cannot be moved there (another filesystem or in use)"
                    ) from exc
                raise
        with fs_problems(dst):
            entry = lstat_entry(root, dst)
    return entry


# Usage ----------------------------------------------------------------------------
