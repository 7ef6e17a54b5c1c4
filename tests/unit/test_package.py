"""Job packages: reproducible archives, ignore rules, symlinks, big-package notes."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from paddlecloud import package
from paddlecloud.common.manifest import identity_of_archive
from paddlecloud.package import (
    DEFAULT_IGNORES,
    IgnoreRules,
    PackageError,
    collect,
    existing_archive,
    largest_paths,
    pack,
    prepare,
)


def write(root: Path, files: dict[str, str | bytes]) -> None:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "fit_a_line"
    write(
        root,
        {
            "train.py": "print('hello')\n",
            "model/net.py": "W = 1\n",
            "model/__init__.py": "",
            "README.md": "# fit a line\n",
        },
    )
    (root / "empty").mkdir()
    return root


def members(archive: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(archive, "r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


def names(archive: Path) -> list[str]:
    with tarfile.open(archive, "r:gz") as tar:
        return tar.getnames()


def packed(root: Path, tmp_path: Path, tag: str = "out") -> package.Package:
    workdir = tmp_path / tag
    workdir.mkdir(exist_ok=True)
    return pack(root, workdir)


# --- reproducibility ------------------------------------------------------------------------------


def test_the_same_directory_packs_to_the_same_bytes_named_by_their_manifest(
    project: Path, tmp_path: Path
) -> None:
    first = packed(project, tmp_path, "a")
    second = packed(project, tmp_path, "b")
    assert first.archive is not None and second.archive is not None
    assert first.sha256 == second.sha256
    assert first.archive.read_bytes() == second.archive.read_bytes()
    # The name is what pfs recomputes from the archive's members, not the archive's own sha256.
    with open(first.archive, "rb") as archive:
        assert first.sha256 == identity_of_archive(archive)
    assert first.sha256 != hashlib.sha256(first.archive.read_bytes()).hexdigest()
    assert first.archive.name == first.filename == f"{first.sha256}.tar.gz"
    assert first.size == first.archive.stat().st_size
    assert (first.files, first.bytes) == (
        4,
        sum(len(p.read_bytes()) for p in project.rglob("*") if p.is_file()),
    )


def test_mtimes_owners_and_umask_do_not_change_the_package_but_content_and_exec_bits_do(
    project: Path, tmp_path: Path
) -> None:
    before = packed(project, tmp_path, "a").sha256
    os.utime(project / "train.py", (1, 1))
    os.utime(project / "model", (2, 2))
    (project / "README.md").chmod(0o600)  # another umask, not another package
    assert packed(project, tmp_path, "b").sha256 == before

    (project / "train.py").chmod(0o755)
    executable = packed(project, tmp_path, "c").sha256
    assert executable != before
    (project / "train.py").chmod(0o644)
    (project / "train.py").write_text("print('changed')\n")
    assert packed(project, tmp_path, "d").sha256 not in (before, executable)


def test_entries_are_sorted_with_nothing_of_the_machine_in_them(project: Path, tmp_path: Path) -> None:
    pkg = packed(project, tmp_path)
    listed = members(pkg.archive)
    assert list(listed) == sorted(listed)
    assert list(listed) == ["README.md", "empty", "model", "model/__init__.py", "model/net.py", "train.py"]
    for member in listed.values():
        assert (member.mtime, member.uid, member.gid, member.uname, member.gname) == (0, 0, 0, "", "")
    assert listed["empty"].isdir() and listed["empty"].mode == 0o755
    assert listed["train.py"].mode == 0o644
    raw = pkg.archive.read_bytes()
    # gzip header: no FNAME flag (no file name in it) and MTIME 0.
    assert raw[:2] == b"\x1f\x8b" and raw[3] & 0x08 == 0 and raw[4:8] == b"\0\0\0\0"
    with gzip.open(pkg.archive) as plain:
        assert plain.read()  # a valid gzip stream all the way through


# --- what goes in -----------------------------------------------------------------------------------


def test_version_control_environments_and_caches_are_left_out_by_default(
    project: Path, tmp_path: Path
) -> None:
    write(
        project,
        {
            ".git/HEAD": "ref: refs/heads/main\n",
            ".venv/bin/python": "#!",
            "__pycache__/train.cpython-311.pyc": b"\0",
            "model/__pycache__/net.cpython-311.pyc": b"\0",
            "model/old.pyc": b"\0",
            ".gitignore": "*.log\n",  # not .git itself: kept
        },
    )
    pkg = packed(project, tmp_path)
    listed = names(pkg.archive)
    assert ".gitignore" in listed
    assert not [
        n for n in listed if n.startswith((".git/", ".venv")) or "__pycache__" in n or n.endswith(".pyc")
    ]
    assert ".git" not in listed
    assert pkg.ignored == 5  # .git, .venv, __pycache__, model/__pycache__, model/old.pyc
    assert pkg.sha256 == packed(project, tmp_path, "again").sha256


def test_paddlecloudignore_is_honoured_with_gitignore_rules(project: Path, tmp_path: Path) -> None:
    write(
        project,
        {
            ".paddlecloudignore": (
                "# data lives on PFS\ndata/\n*.log\n!keep.log\n/build\ndocs/**/*.md\n\n   \n"
            ),
            "data/train.csv": "x\n",
            "sub/data/nested.csv": "x\n",  # `data/` matches at any depth
            "run.log": "x\n",
            "sub/run.log": "x\n",
            "keep.log": "kept\n",
            "build/out.o": "x\n",
            "sub/build/kept.o": "anchored pattern: only the top build/ goes\n",
            "docs/a/b/c.md": "x\n",
            "docs/a/keep.txt": "x\n",
        },
    )
    listed = set(names(packed(project, tmp_path).archive))
    assert {"keep.log", "sub/build/kept.o", "docs/a/keep.txt", ".paddlecloudignore"} <= listed
    for gone in ("data", "data/train.csv", "sub/data", "run.log", "sub/run.log", "build", "docs/a/b/c.md"):
        assert gone not in listed


def test_a_negation_cannot_reinclude_what_an_excluded_directory_holds_but_can_reinclude_defaults(
    project: Path, tmp_path: Path
) -> None:
    write(
        project,
        {
            ".paddlecloudignore": "data/\n!data/keep.csv\nlogs/*\n!logs/keep.txt\n!.venv\n",
            "data/keep.csv": "x\n",
            "logs/a.txt": "x\n",
            "logs/keep.txt": "x\n",
            ".venv/marker": "wanted\n",
        },
    )
    listed = set(names(packed(project, tmp_path).archive))
    assert "data/keep.csv" not in listed  # as in git: data/ itself is excluded
    assert "logs/keep.txt" in listed and "logs/a.txt" not in listed
    assert ".venv/marker" in listed


@pytest.mark.parametrize(
    ("patterns", "path", "is_dir", "ignored"),
    [
        (["*.log"], "a/b/x.log", False, True),
        (["*.log"], "x.logs", False, False),
        (["build/"], "build", False, False),  # directories only
        (["build/"], "a/build", True, True),
        (["/build"], "a/build", True, False),
        (["a/*.py"], "a/x.py", False, True),
        (["a/*.py"], "a/b/x.py", False, False),  # `*` does not cross `/`
        (["**/x"], "a/b/x", False, True),
        (["a/**"], "a/b/c", False, True),
        (["a/**/z"], "a/z", False, True),
        (["a/**/z"], "a/b/c/z", False, True),
        (["x?.txt"], "x1.txt", False, True),
        (["x[0-9].txt"], "x7.txt", False, True),
        (["x[!0-9].txt"], "x7.txt", False, False),
        (["\\#literal"], "#literal", False, True),
        (["\\!bang"], "!bang", False, True),
        (["*.txt", "!keep.txt"], "keep.txt", False, False),
        (["trailing\\ "], "trailing ", False, True),
        (["# a comment"], "# a comment", False, False),
    ],
)
def test_ignore_patterns(patterns: list[str], path: str, is_dir: bool, ignored: bool) -> None:
    assert IgnoreRules(patterns).ignored(path, is_dir) is ignored


def test_defaults_are_the_documented_ones() -> None:
    rules = IgnoreRules(DEFAULT_IGNORES)
    for path, is_dir in ((".git", True), (".venv", True), ("a/__pycache__", True), ("a/b.pyc", False)):
        assert rules.ignored(path, is_dir)
    assert not rules.ignored("__pycache__", False)  # a file of that name is not a cache directory


# --- symlinks and special files --------------------------------------------------------------------


def test_links_inside_the_package_are_kept_as_relative_links_and_links_out_are_left_out(
    project: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("not for the cluster\n")
    (project / "conf").mkdir()
    (project / "conf" / "net.py").symlink_to(project / "model" / "net.py")  # absolute, inside
    (project / "alias").symlink_to("model")  # a directory, inside: kept as a link, not followed
    (project / "leak.txt").symlink_to(outside)
    (project / "up").symlink_to("..")
    (project / "dangling").symlink_to("nowhere")
    (project / "loop").symlink_to("loop")
    os.mkfifo(project / "pipe")

    pkg = packed(project, tmp_path)
    listed = members(pkg.archive)
    assert listed["conf/net.py"].issym() and listed["conf/net.py"].linkname == "../model/net.py"
    assert listed["alias"].issym() and listed["alias"].linkname == "model"
    assert "alias/net.py" not in listed
    for gone in ("leak.txt", "up", "dangling", "loop", "pipe"):
        assert gone not in listed
    notes = "\n".join(pkg.notes)
    assert "leak.txt: a symlink to" in notes and "outside the package" in notes
    assert "up: a symlink to .., outside the package" in notes
    assert "dangling: a symlink to nowhere, which does not exist" in notes
    assert "pipe: not a regular file" in notes

    # What a server unpacking with tarfile's safe `data` filter gets: the links work.
    unpacked = tmp_path / "unpacked"
    with tarfile.open(pkg.archive, "r:gz") as tar:
        tar.extractall(unpacked, filter="data")
    assert (unpacked / "conf" / "net.py").read_text() == "W = 1\n"
    assert (unpacked / "alias" / "net.py").read_text() == "W = 1\n"


def test_a_package_reached_through_a_symlink_is_packed_like_the_real_one(
    project: Path, tmp_path: Path
) -> None:
    (project / "link").symlink_to("train.py")
    via = tmp_path / "via"
    via.symlink_to(project)
    assert packed(via, tmp_path, "a").sha256 == packed(project, tmp_path, "b").sha256


# --- sizes, notes, errors -----------------------------------------------------------------------------


def test_big_packages_name_their_largest_paths(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(project, {"data/a.bin": b"a" * 5000, "data/b.bin": b"b" * 3000, "weights.bin": b"w" * 4000})
    monkeypatch.setattr(package, "BIG_PACKAGE", 1000)
    pkg = packed(project, tmp_path)
    assert pkg.big
    assert pkg.largest[:4] == (
        ("data/", 8000),
        ("data/a.bin", 5000),
        ("weights.bin", 4000),
        ("data/b.bin", 3000),
    )
    monkeypatch.setattr(package, "BIG_PACKAGE", 10**9)
    assert not pkg.big


def test_largest_paths_counts_files_only() -> None:
    entries = [
        package.Entry("d", "dir"),
        package.Entry("d/x", "file", 10),
        package.Entry("d/y", "symlink", target="x"),
        package.Entry("z", "file", 3),
    ]
    assert largest_paths(entries, 2) == [("d/", 10), ("d/x", 10)]


def test_an_empty_package_is_allowed_with_a_note(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    pkg = packed(tmp_path / "empty", tmp_path)
    assert pkg.files == 0 and "the package holds no files" in pkg.notes
    assert names(pkg.archive) == []


def test_local_paths_that_are_no_package_are_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(PackageError, match="no such directory"):
        prepare(tmp_path / "missing", cache=False)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(PackageError, match=r"a package is a directory, or a \.tar\.gz"):
        prepare(tmp_path / "notes.txt", cache=False)
    with pytest.raises(PackageError, match="not a directory"):
        collect(tmp_path / "notes.txt")


def test_a_ready_archive_is_taken_as_is_and_named_by_its_sha256(project: Path, tmp_path: Path) -> None:
    built = packed(project, tmp_path)
    tgz = tmp_path / "mine.tgz"
    tgz.write_bytes(built.archive.read_bytes())
    pkg = prepare(tgz, cache=False)
    named = hashlib.sha256(tgz.read_bytes()).hexdigest()
    assert (pkg.sha256, pkg.filename, pkg.archive) == (named, f"{named}.tar.gz", tgz)
    archive = tmp_path / "pkg.ZIP"
    archive.write_bytes(b"PK\x05\x06" + b"\0" * 18)
    assert existing_archive(archive).filename.endswith(".zip")


def test_a_file_that_changes_while_packing_is_an_error(project: Path, tmp_path: Path) -> None:
    collected = collect(project)
    (project / "train.py").write_text("print('much longer than before')\n")
    with pytest.raises(PackageError, match=r"train\.py changed while the package was being made"):
        package.write_archive(collected, io.BytesIO())


def test_a_file_rewritten_between_naming_and_archiving_is_an_error_not_a_wrong_package(
    project: Path, tmp_path: Path
) -> None:
    pkg = package.identify(project)
    (project / "train.py").write_text("print('HELLO')\n")  # the same size, other bytes
    with pytest.raises(PackageError, match=r"train\.py changed while the package was being made"):
        package.build(pkg, tmp_path)
    assert list(tmp_path.glob("*.tar.gz")) == []
