"""Walking and removing trees a user could have written, at any depth, with a bounded
number of open descriptors and never following a symlink.

Root walks and removes trees that sandboxed jobs and builds wrote (a job's `/tmp` and
package, a deleted user's home, a build's environment), so every step is relative to a
directory descriptor and opened with O_NOFOLLOW: a symlink planted before or during the
walk is seen as a symlink (listed, chowned or unlinked itself), never entered.

Depth costs neither stack nor descriptors. Python 3.11's `shutil.rmtree` and `os.walk`
recurse (a 1,000-deep chain raises RecursionError, which `ignore_errors` does not catch),
and a walk that keeps one descriptor per level runs out of them (EMFILE) on a chain a
job makes in seconds. Here only the deepest `WINDOW` levels stay open; going back up
past them reopens the parent as `..` of the child and checks that it is the same
directory (device and inode) as on the way down, the check `fts(3)` makes: `..` is never
a symlink, and a directory moved during the walk is noticed (`TreeChanged`), not
followed to wherever it went. A walk holds at most WINDOW + 2 descriptors.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

# Levels whose descriptors a walk keeps open; deeper ones are reopened through `..`.
WINDOW = 16
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class TreeChanged(OSError):
    """A directory was moved or replaced while the walk was below it."""

    def __init__(self, where: str) -> None:
        super().__init__(errno.ESTALE, f"{where}: the tree changed while it was walked; try again")


@dataclass
class _Level:
    name: str  # its name in the level above ('' for the top)
    ident: tuple[int, int]  # (st_dev, st_ino), to recognise it when reopened through `..`
    fd: int | None  # open while within the window
    pending: Iterator[tuple[str, os.stat_result]]  # what remains of its listing
    path_bytes: int  # length of its path below the top, in bytes ('a/b' is 3)


@dataclass
class Entry:
    """One thing found by `walk`. `dir_fd` is its directory's descriptor, valid only until
    the walk moves on; `depth` is 1 for what is directly in the top directory."""

    dir_fd: int
    name: str
    st: os.stat_result
    depth: int
    path_bytes: int  # length of its path below the top ('a/b' is 3)
    _walk: _Walk = field(repr=False)

    def relative(self) -> str:
        """Its path below the top directory (costs its depth: call it when needed)."""
        return "/".join([*(level.name for level in self._walk.levels[1:]), self.name])


def _listing(fd: int) -> list[tuple[str, os.stat_result]]:
    """The directory's names with their lstat, read at once (so the descriptor may close)."""
    found = []
    with os.scandir(fd) as entries:
        for item in entries:
            try:
                found.append((item.name, item.stat(follow_symlinks=False)))
            except FileNotFoundError:
                continue  # removed while we read
    return found


class _Walk:
    """The stack of directories from the top to where a walk is, with the window of
    descriptors; `close` releases them whatever happened."""

    def __init__(self, top: int, listed: bool = True) -> None:
        """Takes ownership of `top`, a directory descriptor."""
        st = os.fstat(top)
        self.levels: list[_Level] = [_Level("", (st.st_dev, st.st_ino), top, iter(()), 0)]
        self._first_open = 0  # levels[_first_open:] hold descriptors
        if listed:
            self.levels[0].pending = iter(_listing(top))

    @property
    def here(self) -> _Level:
        return self.levels[-1]

    @property
    def fd(self) -> int:
        fd = self.here.fd
        assert fd is not None
        return fd

    def descend(self, name: str, listed: bool = True) -> bool:
        """Go into the directory `name` of the current one; False if it is not (any more)
        a directory there (gone, a symlink, a file swapped in)."""
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=self.fd)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return False
            raise
        try:
            st = os.fstat(fd)
            pending = iter(_listing(fd)) if listed else iter(())
        except BaseException:
            os.close(fd)
            raise
        size = _child_bytes(self.here, name)
        self.levels.append(_Level(name, (st.st_dev, st.st_ino), fd, pending, size))
        if len(self.levels) - self._first_open > WINDOW:
            oldest = self.levels[self._first_open]
            assert oldest.fd is not None
            os.close(oldest.fd)
            oldest.fd = None
            self._first_open += 1
        return True

    def ascend(self) -> str:
        """Leave the current directory for its parent; the name it had there."""
        child = self.levels.pop()
        parent = self.here
        try:
            if parent.fd is None:
                assert child.fd is not None
                fd = os.open("..", _DIR_FLAGS, dir_fd=child.fd)
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) != parent.ident:
                    os.close(fd)
                    raise TreeChanged(child.name)
                parent.fd = fd
                self._first_open = len(self.levels) - 1
        finally:
            if child.fd is not None:
                os.close(child.fd)
        return child.name

    def close(self) -> None:
        for level in self.levels:
            if level.fd is not None:
                os.close(level.fd)
                level.fd = None
        self.levels.clear()


def walk(top: int) -> Generator[Entry, None, None]:
    """Everything below the directory open at `top` (which stays the caller's), depth
    first, each directory before what is in it; symlinks are yielded, never entered.

    Use it closed (`with contextlib.closing(walk(fd)) as entries:`) so that a caller
    that stops early releases the descriptors at once.
    """
    state = _Walk(os.dup(top))
    try:
        while state.levels:
            here = state.here
            for name, st in here.pending:
                yield Entry(state.fd, name, st, len(state.levels), _child_bytes(here, name), state)
                if stat.S_ISDIR(st.st_mode) and state.descend(name):
                    break
            else:
                if len(state.levels) == 1:
                    break
                state.ascend()
    finally:
        state.close()


def _child_bytes(level: _Level, name: str) -> int:
    return level.path_bytes + len(os.fsencode(name)) + (1 if level.path_bytes else 0)


def remove_tree(parent: int, name: str) -> None:
    """`rm -r` of `name` in the directory `parent`, at any depth: a file or symlink is
    unlinked (never what it points to), a directory emptied and removed. Gone already is
    fine. OSError if something cannot be removed (ENOTEMPTY when entries keep appearing),
    TreeChanged if a directory was moved out from under the walk.
    """
    try:
        top = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=parent)
        return
    state = _Walk(top)
    try:
        while state.levels:
            for child, st in state.here.pending:
                if stat.S_ISDIR(st.st_mode) and state.descend(child):
                    break
                try:
                    os.unlink(child, dir_fd=state.fd)
                except FileNotFoundError:
                    pass
                except IsADirectoryError:
                    # Listed as something else, a directory now: empty it like the rest.
                    if state.descend(child):
                        break
            else:
                if len(state.levels) == 1:
                    state.close()
                    os.rmdir(name, dir_fd=parent)
                    return
                gone = state.ascend()
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(gone, dir_fd=state.fd)
    finally:
        state.close()


def remove_path(path: Path) -> None:
    """`remove_tree` of `path`, whose parent directories are the platform's own (its data
    and work directories), never a user's: only the last component and what is below it
    are treated as a user's."""
    try:
        parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        remove_tree(parent, path.name)
    finally:
        os.close(parent)


def chown_tree(top: int, uid: int, gid: int) -> None:
    """Give the directory open at `top` and everything below it to uid:gid, never
    following a symlink (a symlink itself is given, as lchown does)."""
    os.fchown(top, uid, gid)
    with contextlib.closing(walk(top)) as entries:
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                os.chown(entry.name, uid, gid, dir_fd=entry.dir_fd, follow_symlinks=False)


def open_dir(path: Path) -> int:
    """A descriptor of the directory `path`, its last component not followed if a symlink."""
    return os.open(path, _DIR_FLAGS)
