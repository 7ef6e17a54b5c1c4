"""`paddlecloud cp|ls|rm|...` against a real `paddlecloud server`: trees both ways, skips, resume, errors."""

from __future__ import annotations

import filecmp
import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import exit_after_chunks
import pytest

from paddlecloud.config import TokenCache
from paddlecloud.progress import human_size
from paddlecloud.transfer import CHUNK_SIZE, PART_SUFFIX

pytestmark = pytest.mark.slow

DC = "datacenter1"
HOME = f"/pfs/{DC}/home/admin"
BIG = 64 * 1024 * 1024
CLI_TIMEOUT = 120


def run_cli(server: Any, *args: str, exit_after: int | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI as its own process, like `server.cli`; with `exit_after`, one that stops for good
    after that many chunks of its transfer (tests/exit_after_chunks.py)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLECLOUD_", "PADDLE_"))}
    clean["HOME"] = str(server.home)
    command = ["-m", "paddlecloud"] if exit_after is None else [exit_after_chunks.__file__, str(exit_after)]
    return subprocess.run(
        [sys.executable, *command, *args],
        env=clean,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        cwd=server.home.parent,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    return result.stdout


def one_error_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("paddlecloud: error: ")
    return lines[0]


def write_tree(root: Path) -> dict[str, bytes]:
    files = {
        "top.txt": b"hello, pfs\n",
        "empty.dat": b"",
        "a/mid.csv": b"x,y\n1,2\n" * 1000,
        "a/b/c/deep.bin": os.urandom(3 * 1024 * 1024 + 5),
        "a/b/c/twin.bin": os.urandom(3 * 1024 * 1024 + 5),  # same size as deep.bin: skips must hash
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / "a" / "nothing").mkdir()
    return files


def upload_offset(server: Any, url: str) -> int:
    """What the server holds of an unfinished upload: a tus HEAD with the CLI's cached token."""
    cached = TokenCache(server.home / ".paddle" / "tokens.json").get(DC, "admin", server.endpoint)
    assert cached is not None
    request = urllib.request.Request(  # noqa: S310 - loopback test server
        server.endpoint + url,
        method="HEAD",
        headers={"Authorization": f"Bearer {cached.token}", "Tus-Resumable": "1.0.0"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
        return int(response.headers["Upload-Offset"])


def test_a_tree_goes_up_is_listed_is_skipped_when_identical_and_comes_back(server_factory, tmp_path) -> None:
    server = server_factory()
    tree = tmp_path / "dataset"
    files = write_tree(tree)

    up = ok(run_cli(server, "cp", "-r", "-j", "3", str(tree), "pfs:data/dataset"))
    assert f"uploaded 5 files ({human_size(sum(map(len, files.values())))})" in up
    assert "uploaded dataset/a/b/c/deep.bin -> " in up

    listing = json.loads(ok(run_cli(server, "ls", "-r", "-o", "json", "data/dataset")))
    entries = {e["path"].removeprefix(f"{HOME}/data/dataset/"): e for e in listing["entries"]}
    assert set(entries) == {*files, "a", "a/b", "a/b/c", "a/nothing"}
    assert entries["empty.dat"]["type"] == "file" and entries["empty.dat"]["size"] == 0
    assert entries["a/nothing"]["type"] == "dir"
    assert entries["a/b/c/deep.bin"]["size"] == len(files["a/b/c/deep.bin"])
    table = ok(run_cli(server, "ls", "-r", "data/dataset"))
    assert table.splitlines()[0].split() == ["TYPE", "SIZE", "MODIFIED", "PATH"]
    assert any(line.startswith("file") and line.endswith("a/b/c/deep.bin") for line in table.splitlines())

    # Again into the same place (a trailing slash: what the tree holds, as rsync's): nothing is
    # sent, and the output says why.
    again = ok(run_cli(server, "cp", "-r", f"{tree}/", "pfs:data/dataset"))
    assert "uploaded 0 files (0 B)" in again and "5 already identical" in again
    assert "skipped dataset/top.txt: already identical" in again
    # One changed file is refused without --overwrite, naming it, and sent with it.
    (tree / "a" / "b" / "c" / "twin.bin").write_bytes(os.urandom(3 * 1024 * 1024 + 5))
    refused = run_cli(server, "cp", "-r", f"{tree}/", "pfs:data/dataset")
    assert refused.returncode == 1
    assert f"{HOME}/data/dataset/a/b/c/twin.bin exists and differs" in refused.stderr
    assert "4 already identical, 1 failed" in refused.stdout
    files["a/b/c/twin.bin"] = (tree / "a" / "b" / "c" / "twin.bin").read_bytes()
    replaced = ok(run_cli(server, "cp", "-r", "--overwrite", f"{tree}/", "pfs:data/dataset"))
    assert "uploaded 1 file" in replaced and "4 already identical" in replaced

    # Back down, Go-style flags, into a directory that does not exist yet.
    back = tmp_path / "back"
    down = ok(run_cli(server, "download", "-recursive", "-jobs", "2", "data/dataset", str(back)))
    assert "downloaded 5 files" in down
    compared = filecmp.dircmp(tree, back)
    assert not (compared.left_only or compared.right_only or compared.diff_files)
    for name, data in files.items():
        assert (back / name).read_bytes() == data
    assert (back / "a" / "nothing").is_dir() and not list(back.rglob(f"*{PART_SUFFIX}"))
    assert "5 already identical" in ok(run_cli(server, "cp", "-r", f"{HOME}/data/dataset/", str(back)))

    # The other file commands, on what is there now.
    record = json.loads(
        ok(run_cli(server, "-o", "json", "pfs", "stat", "--checksum", "data/dataset/top.txt"))
    )
    assert record["size"] == len(files["top.txt"]) and len(record["sha256"]) == 64
    # At once on a local disk; on CephFS once its recursive statistics have propagated up the
    # tree, which the MDS does lazily (seconds a level; a bound here, not a timing).
    deadline = time.monotonic() + 120
    while (usage := json.loads(ok(run_cli(server, "-o", "json", "pfs", "usage"))))["bytes"] < sum(
        map(len, files.values())
    ) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert usage["bytes"] >= sum(map(len, files.values()))
    ok(run_cli(server, "mkdir", "scratch/x"))
    ok(run_cli(server, "file", "put", str(tree / "top.txt"), "scratch/x/"))
    ok(run_cli(server, "pfs", "mv", "scratch/x/top.txt", "scratch/moved.txt"))
    got = ok(run_cli(server, "file", "get", "scratch/moved.txt", str(tmp_path / "moved.txt")))
    assert "downloaded 1 file (11 B)" in got
    assert (tmp_path / "moved.txt").read_bytes() == files["top.txt"]
    not_empty = run_cli(server, "rm", "scratch")
    assert "not empty; use -r" in one_error_line(not_empty, 1)
    ok(run_cli(server, "rm", "-r", "scratch"))
    assert run_cli(server, "ls", "scratch").returncode == 1


def test_interrupted_transfers_resume_without_resending(server_factory, tmp_path) -> None:
    server = server_factory()
    big = tmp_path / "big.bin"
    with open(big, "wb") as out:
        for _ in range(BIG // (1024 * 1024)):
            out.write(os.urandom(1024 * 1024))

    # The upload stops for good after two acknowledged chunks, as if killed.
    stopped = run_cli(server, "cp", str(big), "pfs:big.bin", exit_after=2)
    assert stopped.returncode == exit_after_chunks.EXIT_STATUS, stopped.stderr
    state = json.loads((server.home / ".paddle" / "uploads.json").read_text())
    assert oct((server.home / ".paddle" / "uploads.json").stat().st_mode & 0o777) == "0o600"
    [record] = state["uploads"].values()
    offset = upload_offset(server, record["url"])
    assert offset == 2 * CHUNK_SIZE
    assert run_cli(server, "ls", "big.bin").returncode == 1  # nothing at the destination until complete

    resumed = ok(run_cli(server, "cp", str(big), "pfs:big.bin"))
    assert f"resuming big.bin at {human_size(offset)} of {human_size(BIG)}" in resumed
    assert "uploaded 1 file (64.0 MiB)" in resumed and "1 resumed" in resumed
    assert json.loads((server.home / ".paddle" / "uploads.json").read_text())["uploads"] == {}
    sha = json.loads(ok(run_cli(server, "-o", "json", "pfs", "stat", "--checksum", "big.bin")))["sha256"]
    assert sha == hashlib.sha256(big.read_bytes()).hexdigest()

    # The download stops after three chunks' worth of bytes reached the part file.
    dest = tmp_path / "down" / "big.bin"
    part = dest.with_name(dest.name + PART_SUFFIX)
    stopped = run_cli(server, "cp", "-p", "pfs:big.bin", str(dest), exit_after=3)  # -p: makes down/
    assert stopped.returncode == exit_after_chunks.EXIT_STATUS, stopped.stderr
    kept = part.stat().st_size
    assert 3 * CHUNK_SIZE <= kept < BIG and not dest.exists()

    resumed = ok(run_cli(server, "cp", "pfs:big.bin", str(dest)))
    assert f"resuming big.bin at {human_size(kept)} of {human_size(BIG)}" in resumed
    assert "downloaded 1 file (64.0 MiB)" in resumed and "1 resumed" in resumed
    assert filecmp.cmp(big, dest, shallow=False) and not part.exists()


def test_mistakes_get_one_line_and_a_non_zero_exit(server_factory, tmp_path) -> None:
    server = server_factory()
    server.cli("users", "create", "alice", "--password-stdin", stdin="alice-password\n")
    server.add_datacenter("as-alice", "alice", "alice-password")
    local = tmp_path / "a.txt"
    local.write_text("a")

    missing = one_error_line(run_cli(server, "cp", str(tmp_path / "missing.txt"), "pfs:x"), 1)
    assert "missing.txt: no such file or directory" in missing

    as_alice = ("--datacenter", "as-alice")
    forbidden = one_error_line(run_cli(server, *as_alice, "cp", str(local), f"{HOME}/stolen.txt"), 1)
    assert "Not allowed on this path" in forbidden and "request id" in forbidden
    forbidden = one_error_line(run_cli(server, *as_alice, "cp", f"{HOME}/a.txt", str(tmp_path / "b")), 1)
    assert "Not allowed on this path" in forbidden
    mine = ok(run_cli(server, *as_alice, "cp", str(local), f"/pfs/{DC}/home/alice/a.txt"))
    assert "uploaded 1 file (1 B)" in mine

    both = one_error_line(run_cli(server, "cp", "pfs:a", f"{HOME}/b"), 2)
    assert "both on PFS" in both and "pfs mv" in both
    assert "is a directory (use -r" in one_error_line(run_cli(server, "cp", str(tmp_path), "pfs:t"), 1)
    assert "no such file" in one_error_line(run_cli(server, "ls", "nothing/here"), 1).lower()

    # argparse prints the command's usage first; the error itself is still one line, and the
    # exit status 2. Nothing is like --bogus, so nothing is suggested.
    unknown = run_cli(server, "cp", "--bogus", str(local), "pfs:x")
    assert unknown.returncode == 2 and unknown.stderr.startswith("usage: paddlecloud cp ")
    assert unknown.stderr.strip().splitlines()[-1] == "paddlecloud cp: error: unrecognized arguments: --bogus"
