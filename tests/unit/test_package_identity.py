"""A package's identity (the sha256 of its manifest) and the stat cache that spares re-reading
unchanged files: what changes the identity, what is read again and when, a cache that is
corrupt, foreign, racy or too big."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from paddlecloud import package
from paddlecloud.common import manifest
from paddlecloud.common.manifest import HEADER, Member, NotAPackage, identity, identity_of_archive, serialise
from paddlecloud.package import StatCache, identify, prepare

# Files are remembered only once older than the racy window; the tests wait that long.
SETTLE = package.RACY_WINDOW_NS / 1e9 * 2


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "model").mkdir(parents=True)
    (root / "train.py").write_text("print('hello')\n")
    (root / "model/net.py").write_text("W = 1\n")
    (root / "data.bin").write_bytes(os.urandom(4096))
    (root / "link.py").symlink_to("train.py")
    time.sleep(SETTLE)
    return root


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"XDG_CACHE_HOME": str(tmp_path / "cache")}


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch, project: Path) -> list[str]:
    """The package's files that `paddlecloud.package` opens, by relative path."""
    seen: list[str] = []
    real_open: Callable[..., Any] = open

    def counting_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(path, Path) and project in path.parents:
            seen.append(path.relative_to(project).as_posix())
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(package, "open", counting_open, raising=False)
    return seen


def name(root: Path) -> str:
    return identify(root).sha256


def test_a_changed_byte_mode_name_or_link_changes_the_identity(project: Path) -> None:
    first = name(project)
    assert name(project) == first
    os.utime(project / "train.py", (1, 1))  # times are not part of a package
    assert name(project) == first

    (project / "train.py").write_text("print('hellO')\n")
    assert name(project) not in (first,)
    (project / "train.py").write_text("print('hello')\n")
    assert name(project) == first

    (project / "train.py").chmod(0o755)
    executable = name(project)
    assert executable != first
    (project / "train.py").chmod(0o644)

    (project / "model/net.py").rename(project / "model/nets.py")
    assert name(project) not in (first, executable)
    (project / "model/nets.py").rename(project / "model/net.py")
    assert name(project) == first

    (project / "link.py").unlink()
    (project / "link.py").symlink_to("model/net.py")
    assert name(project) != first
    (project / "link.py").unlink()
    (project / "link.py").symlink_to("train.py")
    (project / "model/empty").mkdir()  # an empty directory is a member too
    assert name(project) != first


def test_the_identity_is_the_manifest_that_pfs_recomputes_from_the_archive(
    project: Path, tmp_path: Path
) -> None:
    pkg = package.pack(project, tmp_path)
    assert pkg.archive is not None and pkg.collected is not None
    lines = serialise(e.member() for e in pkg.collected.entries).splitlines()
    assert lines[0] + b"\n" == HEADER
    assert json.loads(lines[1]) == ["data.bin", "file", 0o644, 4096, json.loads(lines[1])[4], ""]
    assert json.loads(lines[2]) == ["link.py", "symlink", 0o777, 0, "", "train.py"]
    assert json.loads(lines[3]) == ["model", "dir", 0o755, 0, "", ""]
    with open(pkg.archive, "rb") as archive:
        assert identity_of_archive(archive) == pkg.sha256
    # The order members are given in does not matter; a path written twice is refused.
    members = [Member("b", "file", 0o644, 1, "0" * 64), Member("a", "dir", 0o755)]
    assert identity(members) == identity(reversed(members))
    with open(project / "train.py", "rb") as text, pytest.raises(NotAPackage, match="not a readable"):
        identity_of_archive(text)


def test_large_incompressible_files_are_stored_in_gzip_members_every_reader_reads(
    project: Path, tmp_path: Path
) -> None:
    mib = 1024 * 1024
    weights = os.urandom(2 * mib)  # deflate cannot shrink it: stored at level 0
    (project / "weights.bin").write_bytes(weights)
    (project / "zeros.bin").write_bytes(bytes(2 * mib))  # shrinks: compressed as before
    (tmp_path / "out").mkdir()
    (tmp_path / "again").mkdir()
    pkg = package.pack(project, tmp_path / "out")
    assert pkg.archive is not None
    raw = pkg.archive.read_bytes()
    # Several gzip members: the compressed run, the stored file, the compressed run again.
    assert raw.count(b"\x1f\x8b\x08\x00\x00\x00\x00\x00") >= 3
    assert 2 * mib < len(raw) < 2 * mib + 64 * 1024  # the zeros shrank, the weights did not grow much
    # The same bytes again: still reproducible.
    assert package.pack(project, tmp_path / "again").archive.read_bytes() == raw  # type: ignore[union-attr]
    # pfs's check, Python's tarfile (the jobs service) and GNU tar (the kube init container).
    with open(pkg.archive, "rb") as archive:
        assert identity_of_archive(archive) == pkg.sha256
    with tarfile.open(pkg.archive, "r:*") as tar:
        member = tar.extractfile("weights.bin")
        assert member is not None and member.read() == weights
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    subprocess.run(["tar", "-xzf", str(pkg.archive), "-C", str(unpacked)], check=True)
    assert (unpacked / "weights.bin").read_bytes() == weights
    assert (unpacked / "zeros.bin").read_bytes() == bytes(2 * mib)
    assert (unpacked / "model/net.py").read_text() == "W = 1\n"


def test_an_untouched_tree_is_not_read_again(project: Path, env: dict[str, str], opened: list[str]) -> None:
    first = prepare(project, env=env)
    assert sorted(opened) == ["data.bin", "model/net.py", "train.py"]
    opened.clear()
    again = prepare(project, env=env)
    assert again.sha256 == first.sha256
    assert opened == []
    # Without the cache every file is read each time: the cache is what spared the reads.
    assert prepare(project, cache=False).sha256 == first.sha256
    assert sorted(opened) == ["data.bin", "model/net.py", "train.py"]


def test_a_touched_file_is_read_once_more_and_keeps_its_identity(
    project: Path, env: dict[str, str], opened: list[str]
) -> None:
    first = prepare(project, env=env)
    opened.clear()
    (project / "train.py").touch()  # mtime and ctime change, the bytes do not
    time.sleep(SETTLE)
    assert prepare(project, env=env).sha256 == first.sha256
    assert opened == ["train.py"]
    opened.clear()
    assert prepare(project, env=env).sha256 == first.sha256
    assert opened == []


def test_a_file_changed_just_before_it_was_hashed_is_not_remembered(
    project: Path, env: dict[str, str], opened: list[str]
) -> None:
    prepare(project, env=env)
    (project / "train.py").write_text("print('again')\n")  # then hashed at once, within the window
    prepare(project, env=env)
    opened.clear()
    prepare(project, env=env)
    assert opened == ["train.py"]


def cache_file(env: dict[str, str]) -> Path:
    (found,) = (Path(env["XDG_CACHE_HOME"]) / package.STAT_CACHE_DIR).glob("*.json")
    return found


def test_a_file_rewritten_within_the_caches_timestamp_is_hashed_again(
    project: Path, env: dict[str, str]
) -> None:
    """Racy git: on a filesystem whose stamps are coarse, a rewrite in the tick the cache was
    written in leaves the file's stat as the cache has it. Simulated: the cache is made to
    hold the new stat, and its own mtime is that same tick."""
    first = prepare(project, env=env).sha256
    (project / "train.py").write_text("print('HELLO')\n")  # same size, other bytes
    after = cache_file(env)
    data = json.loads(after.read_bytes())
    info = os.stat(project / "train.py")
    data["entries"]["train.py"][:5] = [
        info.st_size,
        info.st_mtime_ns,
        info.st_ctime_ns,
        info.st_ino,
        info.st_dev,
    ]
    after.write_text(json.dumps(data))
    tick = max(info.st_mtime_ns, info.st_ctime_ns)
    os.utime(after, ns=(tick, tick))
    changed = prepare(project, env=env).sha256
    assert changed != first and changed == prepare(project, cache=False).sha256

    # The same forged entry in a cache written a second later is trusted: the rule is what saved it.
    (project / "train.py").write_text("print('hello')\n")
    info = os.stat(project / "train.py")
    data = json.loads(after.read_bytes())
    data["entries"]["train.py"] = [
        info.st_size,
        info.st_mtime_ns,
        info.st_ctime_ns,
        info.st_ino,
        info.st_dev,
        "f" * 64,
    ]
    after.write_text(json.dumps(data))
    os.utime(after, ns=(tick + 10**9, tick + 10**9))
    assert prepare(project, env=env).sha256 != first


@pytest.mark.parametrize(
    "content",
    [
        b"\x00\xffnot json",
        b"[]",
        b'{"version": 99, "root": "ROOT", "entries": {}}',
        b'{"version": 1, "root": "/somewhere/else", "entries": {}}',
        b'{"version": 1, "root": "ROOT", "entries": {"train.py": [1, 2, "x", 4, 5, "ab"]}}',
        b'{"version": 1, "root": "ROOT", "entries": []}',
    ],
)
def test_a_corrupt_or_foreign_cache_is_ignored(
    project: Path, env: dict[str, str], opened: list[str], content: bytes
) -> None:
    first = prepare(project, env=env).sha256
    cache_file(env).write_bytes(content.replace(b"ROOT", str(project.resolve()).encode()))
    os.utime(cache_file(env), ns=(time.time_ns() + 10**9,) * 2)
    opened.clear()
    assert prepare(project, env=env).sha256 == first
    assert sorted(opened) == ["data.bin", "model/net.py", "train.py"]
    # ... and it is replaced by a good one.
    opened.clear()
    assert prepare(project, env=env).sha256 == first
    assert opened == []


def test_an_unwritable_cache_dir_is_not_fatal(project: Path, tmp_path: Path) -> None:
    (tmp_path / "not-a-dir").write_text("")
    env = {"XDG_CACHE_HOME": str(tmp_path / "not-a-dir")}
    assert prepare(project, env=env).sha256 == name(project)


def test_the_cache_is_bounded_and_written_atomically(
    project: Path, env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(package, "STAT_CACHE_MAX_FILES", 2)
    for tag in "abc":
        other = tmp_path / tag
        other.mkdir()
        (other / "x").write_text(tag)
        time.sleep(SETTLE)
        prepare(other, env=env)
    directory = Path(env["XDG_CACHE_HOME"]) / package.STAT_CACHE_DIR
    assert len(list(directory.iterdir())) == 2  # the oldest forgotten, no temporary left
    monkeypatch.setattr(package, "STAT_CACHE_MAX_ENTRIES", 2)
    prepare(project, env=env)  # three files: too many to remember
    assert len(list(directory.iterdir())) == 2
    assert StatCache.for_directory(project.resolve(), env).lookup("train.py", (0, 0, 0, 0, 0)) is None


def test_an_archive_with_more_members_than_the_bound_is_no_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pfs holds an uploaded archive's manifest whole to sort it: the members are bounded.
    monkeypatch.setattr(manifest, "MAX_MEMBERS", 3)
    for count, refused in ((3, False), (4, True)):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            for i in range(count):
                tar.addfile(tarfile.TarInfo(f"d{i}"), io.BytesIO(b""))
        buffer.seek(0)
        if refused:
            with pytest.raises(NotAPackage, match="more than 3 members"):
                identity_of_archive(buffer)
        else:
            assert len(identity_of_archive(buffer)) == 64
