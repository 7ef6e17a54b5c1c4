"""PFS path parsing and confinement: every spelling of traversal is refused before any I/O."""

from __future__ import annotations

import os

import pytest

from paddlecloud.common.errors import ProblemError
from paddlecloud.common.internal_auth import Identity
from paddlecloud.common.volume import Root, authorize, parse_path
from support import PFS_TRAVERSALS

DC = "dc1"
ALICE = Identity("alice")

TRAVERSALS = PFS_TRAVERSALS


@pytest.mark.parametrize("text", TRAVERSALS)
def test_traversal_spellings_are_bad_paths(text: str) -> None:
    with pytest.raises(ProblemError) as info:
        parse_path(text, DC)
    assert info.value.kind.status == 400, info.value.detail


@pytest.mark.parametrize(
    ("text", "status"),
    [("/pfs/dc2/home/alice/x", 404), ("/pfs/dc1", 403), ("/pfs/dc1/home", 403), ("/pfs/dc1/etc/x", 404)],
)
def test_outside_the_areas(text: str, status: int) -> None:
    with pytest.raises(ProblemError) as info:
        parse_path(text, DC)
    assert info.value.kind.status == status


def test_good_paths_parse_and_print_back() -> None:
    path = parse_path("/pfs/dc1/home/alice/data/train-00.txt", DC)
    assert (path.area, path.owner, path.parts) == ("home", "alice", ("data", "train-00.txt"))
    assert path.text == "/pfs/dc1/home/alice/data/train-00.txt"
    assert parse_path("/pfs/dc1/home/alice/", DC).is_area_root
    assert parse_path("/pfs/dc1/public/100% real.txt", DC).parts == ("100% real.txt",)
    assert parse_path("/pfs/dc1/home/alice/名前.txt", DC).name == "名前.txt"


def test_authorization() -> None:
    own = parse_path("/pfs/dc1/home/alice/x", DC)
    other = parse_path("/pfs/dc1/home/bob/x", DC)
    public = parse_path("/pfs/dc1/public/x", DC)
    authorize(own, ALICE, write=True)
    authorize(public, ALICE, write=False)
    for path, write in ((other, False), (other, True), (public, True)):
        with pytest.raises(ProblemError) as info:
            authorize(path, ALICE, write=write)
        assert info.value.kind.status == 403
    authorize(other, Identity("root", admin=True), write=True)
    authorize(public, Identity("root", admin=True), write=True)


@pytest.fixture(params=[True, False], ids=["openat2", "nofollow-walk"])
def root(tmp_path, request) -> Root:
    root = Root(tmp_path / "pfs", use_openat2=request.param)
    if request.param and not root.use_openat2:
        pytest.skip("openat2 is not available on this kernel")
    root.ensure_home("alice")
    root.ensure_home("bob")
    home = tmp_path / "pfs" / "home" / "alice"
    (home / "sub").mkdir()
    (home / "sub" / "f").write_text("mine")
    (tmp_path / "pfs" / "home" / "bob" / "secret").write_text("bob's")
    (tmp_path / "outside").write_text("not pfs")
    os.symlink("../bob/secret", home / "to-bob")
    os.symlink(str(tmp_path / "outside"), home / "to-outside")
    os.symlink("../../..", home / "up")
    os.symlink("/proc/self/root/etc/passwd", home / "magic")
    return root


@pytest.mark.parametrize("name", ["to-bob", "to-outside", "up/outside", "magic"])
def test_symlinks_out_of_the_home_are_refused(root: Root, name: str) -> None:
    path = parse_path(f"/pfs/dc1/home/alice/{name}", DC)
    with pytest.raises(PermissionError):
        os.close(root.open(path))


def test_files_inside_the_home_open(root: Root) -> None:
    fd = root.open(parse_path("/pfs/dc1/home/alice/sub/f", DC))
    try:
        assert os.read(fd, 10) == b"mine"
    finally:
        os.close(fd)


def test_missing_home_is_not_found(root: Root) -> None:
    with pytest.raises(ProblemError) as info:
        root.open(parse_path("/pfs/dc1/home/carol/x", DC))
    assert info.value.kind.status == 404


@pytest.mark.usefixtures("remove_tmp_path_after")
def test_usage_walks_deep_trees_and_ignores_symlinks(tmp_path) -> None:
    from paddlecloud.common.storage.posix import Usage

    root = Root(tmp_path / "pfs")
    root.ensure_home("deep")
    home = tmp_path / "pfs" / "home" / "deep"
    fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(1500):  # deeper than Python's recursion limit allows a recursive walk
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(leaf, b"12345")
        os.close(leaf)
    finally:
        os.close(fd)
    (home / "top").write_bytes(b"x" * 100)
    os.symlink("/etc/passwd", home / "link")
    usage = Usage._measure(home)
    # Allocated blocks (what the files hold on the disk), the link neither counted nor followed.
    allocated = sum(os.lstat(p).st_blocks * 512 for p in (home / "top", home.joinpath(*["d"] * 1500, "leaf")))
    assert (usage.bytes, usage.files) == (allocated, 2)
