"""Root's operations under a tree a user could write: each one meets a planted symlink
aimed at a canary outside the tree, refuses it, and leaves the canary as it was."""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from pathlib import Path

import pytest

from paddlecloud.common import beneath


@pytest.fixture(params=[True, False], ids=["openat2", "nofollow-walk"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    if request.param and not beneath.probe_openat2():
        pytest.skip("this kernel has no openat2")
    monkeypatch.setattr(beneath, "_have_openat2", lambda: request.param)
    return bool(request.param)


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    secret = tmp_path / "outside"
    secret.mkdir(mode=0o700)
    path = secret / "canary"
    path.write_bytes(b"root's own\n")
    os.utime(path, (1, 1))
    return path


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    top = tmp_path / "tree"
    (top / "sub").mkdir(parents=True)
    return top


def unchanged(canary: Path) -> bool:
    same = canary.read_bytes() == b"root's own\n" and canary.stat().st_mtime == 1
    return same and os.listdir(canary.parent) == ["canary"]


def call(tree: Path, what: str, relative: str) -> None:
    fd = beneath.open_top(tree)
    try:
        if what == "write_new":
            beneath.write_new(fd, relative, b"pwned\n")
        elif what == "touch":
            beneath.touch(fd, relative)
        else:
            beneath.read_file(fd, relative)
    finally:
        os.close(fd)


@pytest.mark.parametrize("what", ["write_new", "touch", "read_file"])
def test_a_final_link_is_refused(resolver: bool, canary: Path, tree: Path, what: str) -> None:
    (tree / "sub" / "file").symlink_to(canary)
    with pytest.raises(OSError):  # LinkRefused, or FileExistsError for a create
        call(tree, what, "sub/file")
    assert unchanged(canary)


@pytest.mark.parametrize("what", ["write_new", "touch", "read_file"])
def test_a_link_on_the_way_is_refused(resolver: bool, canary: Path, tree: Path, what: str) -> None:
    (tree / "sub").rmdir()
    (tree / "sub").symlink_to(canary.parent)
    with pytest.raises(beneath.LinkRefused):
        call(tree, what, "sub/canary")
    assert unchanged(canary)


def test_a_link_inside_the_tree_is_refused_too(resolver: bool, tree: Path) -> None:
    (tree / "elsewhere").symlink_to("sub")
    with pytest.raises(beneath.LinkRefused):
        call(tree, "write_new", "elsewhere/file")
    assert not (tree / "sub" / "file").exists()


def test_a_dangling_link_is_not_created_through(resolver: bool, canary: Path, tree: Path) -> None:
    (tree / "new").symlink_to(canary.parent / "created")
    with pytest.raises(FileExistsError):
        call(tree, "write_new", "new")
    assert unchanged(canary)


def test_a_planted_fifo_is_refused_without_waiting(resolver: bool, tree: Path) -> None:
    os.mkfifo(tree / "stamp")
    with pytest.raises(beneath.LinkRefused, match="not a regular file"):
        call(tree, "touch", "stamp")


def test_the_top_of_the_tree_itself_is_not_followed(canary: Path, tmp_path: Path) -> None:
    (tmp_path / "top").symlink_to(canary.parent)
    with pytest.raises(beneath.LinkRefused):
        beneath.open_top(tmp_path / "top")
    with pytest.raises(beneath.LinkRefused):
        beneath.chown_tree(tmp_path / "top", 4242, 4242)
    assert canary.parent.stat().st_uid == os.geteuid()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root gives files away")
def test_chown_tree_changes_links_never_what_they_point_at(canary: Path, tree: Path) -> None:
    (tree / "sub" / "file").write_text("mine\n")
    (tree / "sub" / "to-file").symlink_to(canary)
    (tree / "to-dir").symlink_to(canary.parent)
    beneath.chown_tree(tree, 4242, 4243)
    for path in (tree, tree / "sub", tree / "sub" / "file", tree / "sub" / "to-file", tree / "to-dir"):
        st = path.lstat()
        assert (st.st_uid, st.st_gid) == (4242, 4243), path
    for path in (canary, canary.parent):
        assert (path.stat().st_uid, path.stat().st_gid) == (0, 0)
    assert unchanged(canary)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root gives files away")
def test_chown_tree_walks_a_deep_tree_with_two_descriptors(tree: Path) -> None:
    fd = beneath.open_top(tree)
    depth = 1500  # deeper than Python's recursion and than 1024 descriptors
    try:
        current = os.dup(fd)
        for _ in range(depth):
            os.mkdir("d", dir_fd=current)
            nxt = os.open("d", beneath.DIR_FLAGS, dir_fd=current)
            os.close(current)
            current = nxt
        os.close(os.open("leaf", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=current))
        beneath.chown_tree(tree, 4242, 4242)
        leaf = os.stat("leaf", dir_fd=current, follow_symlinks=False)
        assert leaf.st_uid == 4242 and stat.S_ISREG(leaf.st_mode)
        # Removed here from the bottom up: a recursive rmtree of tmp_path would not manage.
        os.unlink("leaf", dir_fd=current)
        for _ in range(depth):
            parent = os.open("..", beneath.DIR_FLAGS, dir_fd=current)
            os.close(current)
            current = parent
            os.rmdir("d", dir_fd=current)
        os.close(current)
    finally:
        os.close(fd)


def test_a_directory_swapped_for_a_link_is_refused(resolver: bool, canary: Path, tree: Path) -> None:
    (tree / "sub").rmdir()
    (tree / "sub").symlink_to(canary.parent)
    fd = beneath.open_top(tree)
    try:
        with pytest.raises(beneath.LinkRefused):
            beneath.open_beneath(fd, "sub", os.O_RDONLY | os.O_DIRECTORY)
    finally:
        os.close(fd)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root gives files away")
def test_a_set_uid_file_given_back_to_root_loses_its_set_uid_bits(tree: Path) -> None:
    # What a build leaves becomes root's: a set-uid program in it must not become root's set-uid.
    program = tree / "sub" / "program"
    program.write_bytes(b"#!/bin/sh\n")
    os.chown(program, 4242, 4242)
    program.chmod(0o6755)
    beneath.chown_tree(tree, 0, 0)
    st = program.lstat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)


def test_an_open_the_kernel_asks_to_retry_is_retried(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RESOLVE_BENEATH answers EAGAIN when any rename or mount on the machine races a ".."
    step of the walk, and openat2(2) says to retry. A pfs request once answered 500 so,
    during a parallel test run; the race is too narrow to provoke on demand, so the kernel's
    first three answers here are EAGAIN, then it walks for real."""
    if not beneath.probe_openat2():
        pytest.skip("this kernel has no openat2")
    (tree / "sub" / "file").write_bytes(b"x")
    libc = beneath._LIBC
    answers = iter([errno.EAGAIN] * 3)

    class Racing:
        def syscall(self, *args: object) -> int:
            code = next(answers, None)
            if code is None:
                return int(libc.syscall(*args))
            ctypes.set_errno(code)
            return -1

    monkeypatch.setattr(beneath, "_LIBC", Racing())
    top = os.open(tree, os.O_PATH | os.O_DIRECTORY)
    try:
        fd = beneath.openat2(top, "sub/../sub/file", os.O_RDONLY, 0)
        assert os.read(fd, 1) == b"x"
        os.close(fd)
        # Anything else the kernel answers is an error at once, with its own errno.
        with pytest.raises(FileNotFoundError):
            beneath.openat2(top, "sub/missing", os.O_RDONLY, 0)
    finally:
        os.close(top)
