"""The CLI's `cp -r` into an HDFS datacenter (Hadoop's minicluster) and back, also across a SIGKILL of pfs.

`paddlecloud server` runs with `pfs.hdfs` on the session's `real_hdfs`, a fresh root per
test, acting as each user (`proxy_users`). A tree with spaces and non-ASCII in its names,
an empty file, an empty directory and a file of several tus chunks goes up, is listed, is
skipped when identical and comes back byte for byte; and an upload whose pfs is killed with
SIGKILL is resumed by the next `cp -r`, with nothing half-written ever under a final name.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hdfs_cluster import PLATFORM_USER, RealHdfs
from test_pfs_cli import HOME, ok, run_cli, upload_offset

from paddlecloud.progress import human_size
from paddlecloud.transfer import CHUNK_SIZE, PART_SUFFIX

pytestmark = pytest.mark.slow

# A bound on each wait below; the waits end as soon as their condition holds.
WAIT = 60.0


def hdfs_server(server_factory: Any, real_hdfs: RealHdfs, tmp_path: Path) -> tuple[Any, str]:
    """A `paddlecloud server` whose datacenter lives in a fresh HDFS root; and that root."""
    root = real_hdfs.fresh_root()
    settings = {
        "namenode": real_hdfs.url,
        "root_path": root,
        "user": PLATFORM_USER,
        "replication": 1,
        "proxy_users": True,
    }
    config = tmp_path / "hdfs.yaml"
    config.write_text(yaml.safe_dump({"pfs": {"hdfs": settings}}))
    return server_factory("--server-config", str(config)), root


def write_tree(root: Path, big: int) -> dict[str, bytes]:
    """Nested directories, an empty file and an empty directory, small files, names with spaces
    and non-ASCII, and one file of several tus chunks (`big` bytes)."""
    files = {
        "top.txt": b"hello, hdfs\n",
        "empty.dat": b"",
        "with space/na\u00efve caf\u00e9.txt": "d\u00e9j\u00e0 vu\n".encode(),
        "donn\u00e9es/\u00fc ber/deep.bin": os.urandom(100_003),
        "donn\u00e9es/\u00fc ber/\u65e5\u672c.csv": b"x,y\n1,2\n" * 500,
        "big file.bin": os.urandom(big),
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / "donn\u00e9es" / "empty dir").mkdir()
    return files


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under `root`: a file's bytes, None for a directory."""
    found: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            found[os.path.relpath(os.path.join(dirpath, name), root)] = None
        for name in filenames:
            found[os.path.relpath(os.path.join(dirpath, name), root)] = Path(dirpath, name).read_bytes()
    return found


def listing(server: Any, remote: str) -> dict[str, dict[str, Any]] | None:
    """`ls -r -o json` of `remote` by relative path, or None where it does not exist (yet)."""
    result = run_cli(server, "ls", "-r", "-o", "json", remote)
    if result.returncode != 0:
        assert "no such file" in result.stderr.lower(), result.stderr
        return None
    entries = json.loads(result.stdout)["entries"]
    return {e["path"].removeprefix(f"{HOME}/{remote}/"): e for e in entries}


def test_a_tree_goes_into_hdfs_is_listed_is_skipped_when_identical_and_comes_back_identical(
    server_factory: Any, real_hdfs: RealHdfs, tmp_path: Path
) -> None:
    server, root = hdfs_server(server_factory, real_hdfs, tmp_path)
    tree = tmp_path / "tree"
    files = write_tree(tree, 3 * CHUNK_SIZE + 12_345)
    mine = snapshot(tree)

    up = ok(run_cli(server, "cp", "-r", str(tree), "pfs:tree"))
    assert f"uploaded {len(files)} files ({human_size(sum(map(len, files.values())))})" in up, up
    # In HDFS itself, under the user's home, owned by the user (doas), not by the platform.
    status = real_hdfs.status(f"{root}/home/admin/tree/big file.bin")
    assert status is not None and status["length"] == len(files["big file.bin"]), status
    assert status["owner"] == "admin", status

    entries = listing(server, "tree")
    assert entries is not None
    assert set(entries) == set(mine), sorted(entries)
    for name, data in mine.items():
        if data is None:
            assert entries[name]["type"] == "dir", entries[name]
        else:
            assert entries[name]["type"] == "file" and entries[name]["size"] == len(data), entries[name]

    # Again, what the tree holds into the same place: nothing is sent.
    again = ok(run_cli(server, "cp", "-r", f"{tree}/", "pfs:tree"))
    assert "uploaded 0 files (0 B)" in again and f"{len(files)} already identical" in again, again

    back = tmp_path / "back"
    down = ok(run_cli(server, "cp", "-r", "pfs:tree", str(back)))
    assert f"downloaded {len(files)} files" in down, down
    theirs = snapshot(back)
    assert set(theirs) == set(mine), sorted(set(theirs) ^ set(mine))
    differing = [name for name in mine if theirs[name] != mine[name]]
    assert not differing, differing
    assert not list(back.rglob(f"*{PART_SUFFIX}"))


def test_an_upload_survives_a_sigkill_of_pfs_and_the_rerun_resumes_it(
    server_factory: Any, real_hdfs: RealHdfs, tmp_path: Path
) -> None:
    server, root = hdfs_server(server_factory, real_hdfs, tmp_path)
    pfs_pid = int(server.wait_for_stderr("started pfs (pid").split("(pid ")[1].split(")")[0])
    tree = tmp_path / "tree"
    big = 4 * CHUNK_SIZE + 7
    files = write_tree(tree, big)
    final = f"{root}/home/admin/tree/big file.bin"
    state_file = server.home / ".paddle" / "uploads.json"

    def nothing_half_written() -> None:
        """The big file's final name, in HDFS itself and as pfs lists it: absent, or whole."""
        status = real_hdfs.status(final)
        assert status is None or status["length"] == big, status
        entries = listing(server, "tree")
        if entries is not None and "big file.bin" in entries:
            assert entries["big file.bin"]["size"] == big, entries["big file.bin"]

    # The home is made by this very copy, while the checks below look on: they must never meet
    # it before it is the user's (HdfsVolume.ensure_home renames it into place, owned).
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLECLOUD_", "PADDLE_"))}
    clean["HOME"] = str(server.home)
    cli = subprocess.Popen(
        [sys.executable, "-m", "paddlecloud", "cp", "-r", f"{tree}/", "pfs:tree"],
        env=clean,
        cwd=server.home.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Until pfs has a chunk of the big file in HDFS: its upload URL is in the CLI's state
        # file, and its part in the volume's staging (`<root>/.uploads/<id>.part`) holds a
        # chunk's bytes. Asked of HDFS, not of pfs: a tus HEAD on an upload takes it over from
        # the PATCH in flight (as tusd's locks do), and the CLI then gives the file up.
        url: str | None = None
        part: str | None = None
        staged = 0
        deadline = time.monotonic() + WAIT
        while staged < CHUNK_SIZE:
            assert cli.poll() is None, f"the upload ended before it could be interrupted: {cli.communicate()}"
            assert time.monotonic() < deadline, f"no chunk of the big file reached HDFS: {part} {staged}"
            nothing_half_written()
            if part is None and state_file.exists():
                records = json.loads(state_file.read_text())["uploads"].values()
                url = next((r["url"] for r in records if r["destination"].endswith("/big file.bin")), None)
                part = None if url is None else f"{root}/.uploads/{url.rsplit('/', 1)[1]}.part"
            if part is not None:
                status = real_hdfs.status(part)
                staged = 0 if status is None else int(status["length"])
            time.sleep(0.05)
        # The CLI is held where it is (its PATCH open, the rest of the file unsent) while pfs
        # is killed and restarted, so the upload cannot finish meanwhile.
        cli.send_signal(signal.SIGSTOP)
        os.kill(pfs_pid, signal.SIGKILL)
        server.wait_for_stderr("restarted pfs", timeout=WAIT)
        nothing_half_written()
        # What reached HDFS outlived pfs, and the restarted pfs offers it (the CLI is still held,
        # so this HEAD takes nothing over).
        assert url is not None
        kept = upload_offset(server, url)
        assert staged <= kept < big, (staged, kept)
    finally:
        # And the CLI dies too, as if its machine went down: the next run must pick the upload up.
        cli.kill()
        cli.communicate()
    nothing_half_written()

    resumed = ok(run_cli(server, "cp", "-r", f"{tree}/", "pfs:tree"))
    assert f"resuming tree/big file.bin at {human_size(kept)} of {human_size(big)}" in resumed, resumed
    # (A small file's upload may have been caught by the kill too, whole but not yet placed:
    # it is resumed at its end and placed, so the count of resumed files is not asserted.)
    status = real_hdfs.status(final)
    assert status is not None and status["length"] == big, status

    back = tmp_path / "back"
    ok(run_cli(server, "cp", "-r", "pfs:tree", str(back)))
    mine, theirs = snapshot(tree), snapshot(back)
    assert set(theirs) == set(mine), sorted(set(theirs) ^ set(mine))
    differing = [name for name in mine if theirs[name] != mine[name]]
    assert not differing, differing
    assert len(files) == sum(1 for data in theirs.values() if data is not None)
