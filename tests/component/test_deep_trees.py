"""Trees thousands of levels deep, as a job makes them in seconds: a job's end, `kill -rm`
and deleting its user remove them; pfs lists and removes them with a bounded number of
descriptors, and refuses a listing deeper than it can name with a 4xx, never a 500."""

from __future__ import annotations

import contextlib
import os
import resource
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_jobs_api import Jobs, start_jobs
from test_pfs_files import start_pfs
from test_user_deletion import add_account

from paddlecloud.common import trees

# Every level of a deep chain is one rmdir: on a disk mounted with `discard` that costs
# a millisecond or more, on tmpfs microseconds. The trees are made there when it exists.
FAST_DISK = Path("/dev/shm")

DEEP_JOB = """\
import os
DEPTH = 5000
def chain(top):
    os.makedirs(top, exist_ok=True)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(DEPTH):
        os.mkdir("d", dir_fd=fd)
        below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = below
    os.symlink("/etc", "to-etc", dir_fd=fd)  # followed by nothing that removes it
    os.close(fd)
chain(os.path.join(os.environ["TRAINER_PACKAGE"], "deep"))  # the unpacked copy, removed at the end
chain(os.path.join(os.getcwd(), "deep"))
chain(os.path.join(os.environ["PADDLE_CLOUD_PFS_HOME"], "deep-" + os.environ["PADDLE_JOB_NAME"]))
print("made", DEPTH, "levels three times", flush=True)
"""


@pytest.fixture
def fast_path(tmp_path: Path) -> Iterator[Path]:
    """A directory on tmpfs where this machine has one (else `tmp_path`)."""
    if not (FAST_DISK.is_dir() and os.access(FAST_DISK, os.W_OK)):
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(dir=FAST_DISK, prefix="paddlecloud-deep-"))
    try:
        yield path
    finally:
        trees.remove_path(path)  # shutil.rmtree would raise RecursionError here


def archive_package(jobs: Jobs, train: str) -> str:
    """A .tar.gz package in alice's home: unpacked into the job's directory, writable by it."""
    jobs.home().mkdir(parents=True, exist_ok=True)
    source = jobs.home() / "train.py"
    source.write_text(train)
    with tarfile.open(jobs.home() / "deep.tar.gz", "w:gz") as tar:
        tar.add(source, arcname="train.py")
    return "/pfs/dc1/home/alice/deep.tar.gz"


async def test_a_job_that_leaves_5000_deep_trees_succeeds_and_kill_rm_and_user_deletion_remove_them(
    fast_path: Path, aiohttp_server: Any, aiohttp_client: Any
) -> None:
    jobs = await start_jobs(fast_path, aiohttp_server, aiohttp_client)
    await add_account(jobs, "root", admin=True)
    package = archive_package(jobs, DEEP_JOB)
    for name in ("killed", "kept"):
        await jobs.submit({"name": name, "package": package})
    for name in ("killed", "kept"):
        job = await jobs.wait(name, ("SUCCEEDED", "FAILED", "KILLED"))
        # The supervisor removed its unpacked package (5,000 levels) and recorded the end the program had.
        assert job["state"] == "SUCCEEDED", job
        assert "made 5000 levels three times" in await jobs.logs(name)
    job_dirs = sorted((jobs.work_dir / "alice").iterdir())
    assert len(job_dirs) == 2 and all(not (d / "package").exists() for d in job_dirs)
    assert all((d / "work" / "trainer-0" / "deep" / "d" / "d").is_dir() for d in job_dirs)

    resp = await jobs.call("DELETE", "jobs/killed", params={"rm": "1"})
    assert resp.status in (200, 204), await resp.text()
    assert len(list((jobs.work_dir / "alice").iterdir())) == 1
    assert Path("/etc/passwd").exists()  # the symlink at the bottom was removed, not followed

    # Her other job's directory and her home, each holding 5,000 levels, go with her.
    resp = await jobs.call("DELETE", "users/alice", "root", params={"home": "remove"})
    assert resp.status == 204, await resp.text()
    assert not jobs.home().exists()
    assert not list((jobs.work_dir / "alice").iterdir())


def make_chain(top: Path, depth: int) -> None:
    """`depth` directories one inside the other below `top`, each made relative to its
    parent's descriptor (no path is ever longer than one name): a few seconds for 50,000."""
    top.mkdir(parents=True, exist_ok=True)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
        os.symlink("/etc", "to-etc", dir_fd=fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def descriptors_at_most(extra: int) -> Iterator[None]:
    """No descriptor above the highest one now open plus `extra` can be opened in this
    process (the in-process services included) until the block ends."""
    highest = max(int(name) for name in os.listdir("/proc/self/fd"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_pfs_refuses_to_list_a_50000_deep_tree_and_removes_it_with_few_descriptors(
    fast_path: Path, aiohttp_server: Any, aiohttp_client: Any
) -> None:
    pfs = await start_pfs(fast_path, aiohttp_server, aiohttp_client)
    make_chain(pfs.home("alice") / "deep", 50_000)
    (pfs.home("alice") / "x.txt").write_text("x")
    with descriptors_at_most(200):
        for path in ("/pfs/dc1/home/alice", "/pfs/dc1/home/alice/deep"):
            resp = await pfs.get("ls", path=path, recursive="1")
            assert resp.status == 422, await resp.text()
            problem = await resp.json()
            assert problem["code"] == "ERR_TREE_TOO_DEEP" and "4096 bytes" in problem["detail"], problem
        listed = await pfs.ok_json("ls", path="/pfs/dc1/home/alice")  # one level: fine
        assert sorted(e["name"] for e in listed["entries"]) == ["deep", "x.txt"]
        usage = await pfs.ok_json("usage")
        # Counted in allocated blocks: the one-byte file's block, whatever the depth beside it.
        x_blocks = (pfs.home("alice") / "x.txt").stat().st_blocks * 512
        assert (usage["bytes"], usage["files"]) == (x_blocks, 1), usage
        deep = {"path": "/pfs/dc1/home/alice/deep", "recursive": "1"}
        resp = await pfs.call("DELETE", "files", params=deep)
        assert resp.status in (200, 204), await resp.text()
    assert sorted(os.listdir(pfs.home("alice"))) == ["x.txt"]
    assert Path("/etc/passwd").exists()


async def test_pfs_lists_a_tree_as_deep_as_a_path_may_be(
    fast_path: Path, aiohttp_server: Any, aiohttp_client: Any
) -> None:
    pfs = await start_pfs(fast_path, aiohttp_server, aiohttp_client)
    # /pfs/dc1/home/alice/deep is 24 bytes, each level adds 2 ("/d"), the symlink at the
    # bottom 7 ("/to-etc"): the deepest chain whose every path fits in 4,096 bytes.
    top = "/pfs/dc1/home/alice/deep"
    depth = (4096 - len(top) - len("/to-etc")) // 2
    make_chain(pfs.home("alice") / "deep", depth)
    with descriptors_at_most(200):
        listed = await pfs.ok_json("ls", path=top, recursive="1")
    entries = listed["entries"]
    assert len(entries) == depth + 1 and max(len(e["path"]) for e in entries) <= 4096
    link = entries[-1]
    assert link["path"] == top + "/d" * depth + "/to-etc" and link["target"] == "/etc", link
