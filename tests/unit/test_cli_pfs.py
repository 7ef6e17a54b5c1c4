"""The PFS client's pure parts: path rules, resume state, skip decisions, summaries, argument parsing."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import select
import stat
import struct
import termios
from pathlib import Path

import pytest

from paddlecloud import pfspaths
from paddlecloud.commands.pfs import ls_table, under_cwd
from paddlecloud.context import UsageError
from paddlecloud.main import EXIT_USAGE, build_parser, main
from paddlecloud.pfspaths import PfsPathError
from paddlecloud.progress import FALLBACK_COLUMNS, Progress, human_size, summary_text, terminal_shape
from paddlecloud.transfer import (
    DEFAULT_JOBS,
    STATE_MAX_AGE,
    FileResult,
    ResumeState,
    TransferFailed,
    TransferReport,
    Transfers,
    _walk,
    chunk_checksum,
    download_target,
    encode_metadata,
    has_trailing_slash,
    placement,
    skip_decision,
    upload_target,
)

HOME = "/pfs/dc1/home/alice"

# --- paths ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        ("/pfs/dc1/home/alice/data/x", "/pfs/dc1/home/alice/data/x"),
        ("/pfs/dc1/public/mnist", "/pfs/dc1/public/mnist"),
        ("/pfs/other/home/bob/y", "/pfs/other/home/bob/y"),  # another datacenter's: the server judges
        ("data/x", f"{HOME}/data/x"),
        ("./data/x", f"{HOME}/data/x"),
        ("data/", f"{HOME}/data/"),  # the trailing slash means "into" for cp, so it stays
        ("", HOME),
        (".", HOME),
        ("pfs:", HOME),
        ("pfs:data/x", f"{HOME}/data/x"),
        ("pfs:/pfs/dc1/public/x", "/pfs/dc1/public/x"),
        ("data/../../bob", f"{HOME}/data/../../bob"),  # not normalised away: the server refuses it
    ],
)
def test_relative_paths_are_in_your_home_and_absolute_ones_stay(arg: str, expected: str) -> None:
    assert pfspaths.resolve(arg, "dc1", "alice") == expected


@pytest.mark.parametrize("arg", ["/tmp/x", "pfs:/data/x", "/pfsx/dc1"])
def test_absolute_paths_outside_pfs_are_refused_with_the_rule(arg: str) -> None:
    with pytest.raises(PfsPathError, match="start with /pfs/"):
        pfspaths.resolve(arg, "dc1", "alice")


def test_a_relative_path_without_a_datacenter_says_to_give_the_full_path() -> None:
    with pytest.raises(PfsPathError, match=r"/pfs/<datacenter>/home/<user>/data"):
        pfspaths.resolve("data", None, "alice")
    assert pfspaths.resolve("/pfs/dc1/home/alice/x", None, None) == "/pfs/dc1/home/alice/x"


@pytest.mark.parametrize(
    ("arg", "remote"),
    [
        ("/pfs/dc1/home/alice/x", True),
        ("pfs:x", True),
        ("pfs:", True),
        ("/pfs", True),
        ("x", False),
        ("./pfs/x", False),
        ("/tmp/pfs/x", False),
        ("pfsdata/x", False),
    ],
)
def test_only_pfs_paths_and_the_pfs_prefix_are_remote_in_cp(arg: str, remote: bool) -> None:
    assert pfspaths.is_remote(arg) is remote


def test_path_helpers() -> None:
    assert pfspaths.is_area_root("/pfs/dc1/home/alice")
    assert pfspaths.is_area_root("/pfs/dc1/home/alice/")
    assert pfspaths.is_area_root("/pfs/dc1/public")
    assert not pfspaths.is_area_root("/pfs/dc1/home/alice/data")
    assert not pfspaths.is_area_root("/pfs/dc1/home")
    assert pfspaths.join(f"{HOME}/", "a/b") == f"{HOME}/a/b"
    assert pfspaths.join(HOME, "") == HOME
    assert pfspaths.relative_to(f"{HOME}/a/b", f"{HOME}/") == "a/b"
    assert pfspaths.relative_to(HOME, HOME) == ""
    with pytest.raises(ValueError):
        pfspaths.relative_to("/pfs/dc1/home/alicex/a", HOME)
    assert pfspaths.basename(f"{HOME}/data/") == "data"


@pytest.mark.parametrize(
    ("source", "dest", "several", "dest_is_dir", "source_is_dir", "where"),
    [
        ("data", "pfs:out/", False, False, True, "into"),  # a trailing slash on DEST: into, made if missing
        ("a.txt", "pfs:out", True, False, False, "into"),  # several sources
        ("data", ".", False, True, True, "into"),
        ("a.txt", "..", False, True, False, "into"),
        ("data", "out/.", False, True, True, "into"),
        ("a.txt", "pfs:out", False, True, False, "into"),  # a file onto a directory: into
        ("a.txt", "pfs:out", False, False, False, "as"),  # a file becomes dest
        ("data", "pfs:out", False, False, True, "as"),  # a directory becomes dest the first time...
        ("data", "pfs:out", False, True, True, "into"),  # ...and nests the second, as cp does
        ("data/", "pfs:out", False, True, True, "contents"),  # unless the source ends in a slash
        ("data/", "pfs:out", False, False, True, "contents"),
        ("data/", "pfs:out/", True, True, True, "contents"),
        (".", "pfs:out", False, True, True, "contents"),  # `.` is `./`
        ("/pfs/dc1/home/alice/data/", "out", False, True, True, "contents"),
        ("a.txt/", "pfs:out", False, True, False, "into"),  # a file: refused before this is asked
    ],
)
def test_placement_is_cps_with_rsyncs_trailing_slash(
    source: str, dest: str, several: bool, dest_is_dir: bool, source_is_dir: bool, where: str
) -> None:
    assert has_trailing_slash(source) is (source.endswith("/") or source == ".")
    assert (
        placement(source, dest, several=several, dest_is_dir=dest_is_dir, source_is_dir=source_is_dir)
        == where
    )


def test_targets(tmp_path: Path) -> None:
    assert upload_target("a.txt", f"{HOME}/data/", into=True) == f"{HOME}/data/a.txt"
    assert upload_target("a.txt", f"{HOME}/data/b.txt", into=False) == f"{HOME}/data/b.txt"
    assert download_target(f"{HOME}/data", tmp_path, into=True) == tmp_path / "data"
    assert download_target(f"{HOME}/data", tmp_path / "out", into=False) == tmp_path / "out"


# --- resume state --------------------------------------------------------------------------------


def test_resume_state_is_private_atomic_and_keyed_by_the_file_and_the_destination(tmp_path: Path) -> None:
    path = tmp_path / ".paddle" / "uploads.json"
    state = ResumeState(path)
    key = ResumeState.upload_key("http://gw:8080/", "alice", Path("/data/a.bin"), 10, 123, f"{HOME}/a.bin")
    state.put("uploads", key, {"url": "/api/v1/pfs/uploads/1", "sha256": "ab"})

    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["uploads.json"]  # no temporary left behind
    assert state.get("uploads", key)["url"] == "/api/v1/pfs/uploads/1"
    assert json.loads(key) == ["http://gw:8080", "alice", "/data/a.bin", 10, 123, f"{HOME}/a.bin"]
    # Each part of the key matters: a changed file, another user or destination is another upload.
    for other in [
        ResumeState.upload_key("http://gw:8080", "alice", Path("/data/a.bin"), 10, 124, f"{HOME}/a.bin"),
        ResumeState.upload_key("http://gw:8080", "alice", Path("/data/a.bin"), 11, 123, f"{HOME}/a.bin"),
        ResumeState.upload_key("http://gw:8080", "bob", Path("/data/a.bin"), 10, 123, f"{HOME}/a.bin"),
        ResumeState.upload_key("http://gw:8080", "alice", Path("/data/a.bin"), 10, 123, f"{HOME}/b.bin"),
        ResumeState.upload_key("http://other:8080", "alice", Path("/data/a.bin"), 10, 123, f"{HOME}/a.bin"),
    ]:
        assert state.get("uploads", other) is None

    state.drop("uploads", key)
    assert state.get("uploads", key) is None
    assert json.loads(path.read_text())["uploads"] == {}


def test_resume_state_finds_uploads_of_an_older_version_of_the_file(tmp_path: Path) -> None:
    state = ResumeState(tmp_path / "uploads.json")
    old = ResumeState.upload_key("http://gw", "alice", Path("/d/a"), 10, 1, f"{HOME}/a")
    new = ResumeState.upload_key("http://gw", "alice", Path("/d/a"), 12, 2, f"{HOME}/a")
    elsewhere = ResumeState.upload_key("http://gw", "alice", Path("/d/a"), 10, 1, f"{HOME}/b")
    for key in (old, new, elsewhere):
        state.put("uploads", key, {"url": key})
    assert state.stale_uploads("http://gw", "alice", Path("/d/a"), f"{HOME}/a", keep=new) == [old]


def test_resume_state_forgets_old_entries_and_survives_damage(tmp_path: Path) -> None:
    now = [1_000_000.0]
    path = tmp_path / "uploads.json"
    state = ResumeState(path, clock=lambda: now[0])
    state.put("downloads", "old", {"etag": '"1"'})
    now[0] += STATE_MAX_AGE + 1
    state.put("downloads", "new", {"etag": '"2"'})
    assert state.get("downloads", "old") is None
    assert state.get("downloads", "new") is not None

    path.write_text("{not json")
    assert state.get("downloads", "new") is None  # a cache: damage costs a restart, not a failure
    state.put("uploads", "k", {"url": "u"})
    assert state.get("uploads", "k") == {"url": "u", "updated": now[0]}


# --- decisions -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dest_size", "src_size", "dest_sha", "src_sha", "overwrite", "decision"),
    [
        (None, 10, None, None, False, "transfer"),
        (10, 10, "aa", "aa", False, "identical"),
        (10, 10, "aa", "aa", True, "identical"),  # identical is skipped even with --overwrite
        (10, 10, "aa", "bb", False, "conflict"),
        (10, 10, "aa", "bb", True, "transfer"),
        (9, 10, None, None, False, "conflict"),
        (9, 10, None, None, True, "transfer"),
        (10, 10, None, None, False, "conflict"),  # no checksum is never "equal"
        (0, 0, "e3", "e3", False, "identical"),
    ],
)
def test_skip_decisions(
    dest_size: int | None,
    src_size: int,
    dest_sha: str | None,
    src_sha: str | None,
    overwrite: bool,
    decision: str,
) -> None:
    assert skip_decision(dest_size, src_size, dest_sha, src_sha, overwrite) == decision


# --- protocol details ----------------------------------------------------------------------------


def test_tus_metadata_and_chunk_checksums() -> None:
    assert encode_metadata({"path": "/pfs/dc1/home/alice/a b", "overwrite": "1"}) == (
        "path L3Bmcy9kYzEvaG9tZS9hbGljZS9hIGI=,overwrite MQ=="
    )
    # CRC-32 (IEEE) of b"abc" is 0x352441C2; on the wire its four big-endian bytes in base64
    # (the tus checksum extension's encoding, not hex).
    assert chunk_checksum(b"abc") == "crc32 NSRBwg=="


def test_the_chunk_hook_hears_the_running_count_and_is_optional() -> None:
    progress = Progress.quiet(io.StringIO(), io.StringIO())
    state = ResumeState(Path("/nonexistent/uploads.json"))
    heard: list[int] = []
    hooked = Transfers(None, user="u", state=state, progress=progress, on_chunk=heard.append)  # type: ignore[arg-type]
    plain = Transfers(None, user="u", state=state, progress=progress)  # type: ignore[arg-type]
    for transfers in (hooked, hooked, plain):
        transfers._chunk_done()
    assert heard == [1, 2]
    with pytest.raises(ValueError, match="jobs"):
        Transfers(None, user="u", state=state, progress=progress, jobs=0)  # type: ignore[arg-type]


# --- summaries and output ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (int(1.2 * 2**30), "1.2 GiB")],
)
def test_human_sizes(size: int, text: str) -> None:
    assert human_size(size) == text


def test_summary_lines() -> None:
    assert (
        summary_text("uploaded", files=12, size=int(1.2 * 2**30), seconds=8.14, identical=3)
        == "uploaded 12 files (1.2 GiB) in 8.1s, 3 already identical"
    )
    assert summary_text("downloaded", files=1, size=5, seconds=0.01) == "downloaded 1 file (5 B) in 0.0s"
    assert (
        summary_text("uploaded", files=0, size=0, seconds=1, identical=2, resumed=1, failed=1, directories=2)
        == "uploaded 0 files (0 B) in 1.0s, 2 already identical, 1 resumed, 2 directories created, 1 failed"
    )


def test_a_report_counts_what_happened_and_a_failure_names_the_first() -> None:
    report = TransferReport("upload", seconds=2.0)
    report.files = [
        FileResult("a", "/pfs/dc1/home/u/a", 100, "uploaded", resumed_from=50),
        FileResult("b", "/pfs/dc1/home/u/b", 7, "identical"),
        FileResult("c", "/pfs/dc1/home/u/c", 9, "failed", error="c: boom"),
    ]
    assert report.summary() == "uploaded 1 file (100 B) in 2.0s, 1 already identical, 1 resumed, 1 failed"
    data = report.to_dict()
    assert (data["transferred"], data["bytes"], data["identical"], data["failed"]) == (1, 100, 1, 1)
    assert data["files"][0]["resumed_from"] == 50 and "exception" not in data["files"][0]
    assert str(TransferFailed(report)) == "1 of 3 files failed: c: boom"


def test_progress_lines_go_to_stdout_problems_to_stderr_and_quiet_is_silent() -> None:
    out, err = io.StringIO(), io.StringIO()
    shown = Progress(stdout=out, stderr=err, bars=False, lines=True, problem_prefix="paddlecloud: error: ")
    shown.note("uploaded a")
    shown.problem("b: boom")
    assert (out.getvalue(), err.getvalue()) == ("uploaded a\n", "paddlecloud: error: b: boom\n")
    out, err = io.StringIO(), io.StringIO()
    quiet = Progress.quiet(out, err)
    quiet.note("uploaded a")
    quiet.file("a", 10).update(10)
    quiet.problem("b: boom")  # the SDK's caller gets TransferFailed instead
    assert (out.getvalue(), err.getvalue()) == ("", "")


def test_progress_bars_draw_on_stderr_only() -> None:
    out, err = io.StringIO(), io.StringIO()
    progress = Progress(stdout=out, stderr=err, bars=True, lines=True)
    progress.expect(100)
    bar = progress.file("data/a.bin", 100)
    bar.update(100)
    bar.close()
    progress.note("uploaded data/a.bin")
    progress.close()
    assert "uploaded data/a.bin" in out.getvalue()
    assert "a.bin" in err.getvalue() and "%" not in out.getvalue()


def _drawn_on_a_terminal(columns: int, rows: int) -> str:
    """What a Progress draws on a pseudo-terminal that reports `columns` x `rows`."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    terminal = os.fdopen(slave, "w", encoding="utf-8", closefd=True)
    try:
        progress = Progress(stdout=io.StringIO(), stderr=terminal, bars=True, lines=False)
        progress.expect(1000)
        bar = progress.file("data/a.bin", 1000)
        bar.update(500)
        bar.close()
        progress.close()
        terminal.flush()
        drawn = b""
        while select.select([master], [], [], 0.2)[0]:
            drawn += os.read(master, 65536)
    finally:
        terminal.close()
        os.close(master)
    return drawn.decode("utf-8", "replace")


def test_progress_bars_show_on_a_terminal_that_reports_no_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
    # A terminal of 0x0 (a serial console, some containers): tqdm alone draws numbers, no bar.
    drawn = _drawn_on_a_terminal(0, 0)
    assert "data/a.bin:   0%|" in drawn and "| 0.00/0.98k" in drawn, drawn
    widest = max(len(line) for line in drawn.replace("\r", "\n").splitlines())
    assert widest <= FALLBACK_COLUMNS + len("\x1b[A")
    # A terminal that reports its width keeps it.
    narrow = _drawn_on_a_terminal(50, 10)
    assert "data/a.bin:   0%|" in narrow
    assert max(len(line) for line in narrow.replace("\x1b[A", "").replace("\r", "\n").splitlines()) <= 50


def test_terminal_shape_falls_back_to_the_environment_then_80x24(tmp_path: Path) -> None:
    with open(tmp_path / "f", "w") as not_a_terminal:
        assert terminal_shape(not_a_terminal, {}) == (80, 24)
        assert terminal_shape(not_a_terminal, {"COLUMNS": "132", "LINES": "0"}) == (132, 24)
    assert terminal_shape(io.StringIO(), {"COLUMNS": "x"}) == (80, 24)


def test_ls_table_shows_type_size_time_and_relative_paths() -> None:
    answer = {
        "path": f"{HOME}/data",
        "entries": [
            {
                "path": f"{HOME}/data/a.txt",
                "type": "file",
                "size": 2048,
                "mtime": "2026-11-22T14:00:00+00:00",
            },
            {"path": f"{HOME}/data/sub", "type": "dir", "size": 0, "mtime": "2026-11-22T14:00:00+00:00"},
            {"path": f"{HOME}/data/l", "type": "symlink", "size": 0, "mtime": "x", "target": "../a"},
        ],
    }
    lines = ls_table(answer).splitlines()
    assert lines[0].split() == ["TYPE", "SIZE", "MODIFIED", "PATH"]
    assert lines[1].split()[:2] == ["file", "2.0"] and lines[1].endswith("a.txt")
    assert lines[2].startswith("dir") and lines[2].endswith("sub/")
    assert lines[3].endswith("l@ -> ../a")
    assert ls_table({"path": HOME, "entries": []}) == f"{HOME} is empty.\n"


def test_walk_lists_nested_dirs_empty_dirs_and_skips_what_pfs_cannot_hold(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    (root / "a" / "b").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "top.txt").write_text("x")
    (root / "a" / "b" / "deep.bin").write_bytes(b"12345")
    (root / "a" / "zero").write_bytes(b"")
    os.symlink(root / "top.txt", root / "link-to-file")
    os.symlink(root / "a", root / "link-to-dir")
    os.symlink(root / "missing", root / "broken")
    os.mkfifo(root / "fifo")
    dirs, files, skipped = _walk(root)
    assert dirs == ["a", "a/b", "empty"]
    assert files == [("a/b/deep.bin", 5), ("a/zero", 0), ("link-to-file", 1), ("top.txt", 1)]
    assert len(skipped) == 3 and any("link-to-dir" in s for s in skipped)


# --- the command line ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["cp", "-r", "-j", "8", "-q", "--overwrite", "--no-verify", "./d", "pfs:data/"],
        ["cp", "-recursive", "-jobs", "8", "-quiet", "-overwrite", "--no-verify", "./d", "pfs:data/"],
        ["cp", "--recursive", "--jobs=8", "--quiet", "--overwrite", "--no-verify", "./d", "pfs:data/"],
        ["pfs", "cp", "-rq", "-j8", "-overwrite", "--no-verify", "./d", "pfs:data/"],
        ["file", "put", "-r", "-j", "8", "-q", "-overwrite", "--no-verify", "./d", "pfs:data/"],
    ],
)
def test_transfer_flags_in_go_and_gnu_style(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert (args.recursive, args.jobs, args.quiet, args.overwrite, args.verify) == (
        True,
        8,
        True,
        True,
        False,
    )
    assert (args.sources, args.dest) == (["./d"], "pfs:data/")


def test_transfer_defaults_and_several_sources() -> None:
    args = build_parser().parse_args(["cp", "a", "b", "c", "/pfs/dc1/home/alice/"])
    assert (args.recursive, args.jobs, args.quiet, args.overwrite, args.verify) == (
        False,
        4,
        False,
        False,
        True,
    )
    assert (args.sources, args.dest) == (["a", "b", "c"], "/pfs/dc1/home/alice/")
    args = build_parser().parse_args(["download", "-o", "json", "output", "."])
    assert (args.sources, args.dest, args.output) == (["output"], ".", "json")


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["rm", "-rf", "x"], ("recursive", "force")),
        (["pfs", "rm", "-r", "-f", "x", "y"], ("recursive", "force")),
        (["ls", "-r"], ("recursive",)),
        (["file", "ls", "-recursive", "data"], ("recursive",)),
        (["mkdir", "-p", "a/b"], ("parents",)),
        (["pfs", "mv", "-overwrite", "a", "b"], ("overwrite",)),
        (["pfs", "stat", "--checksum", "a"], ("checksum",)),
    ],
)
def test_other_pfs_commands_parse(argv: list[str], names: tuple[str, ...]) -> None:
    args = build_parser().parse_args(argv)
    assert all(getattr(args, name) is True for name in names)


def run(argv: list[str], tmp_path: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, env={"HOME": str(tmp_path)}, stdout=out, stderr=err, stdin=io.StringIO())
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cp", "/pfs/dc1/home/a/x", "pfs:y"], "both on PFS"),
        (["cp", "/pfs/dc1/home/a/x", "/pfs/dc1/home/a/y"], "pfs mv"),
        (["cp", "a", "b"], "neither side is a PFS path"),
        (["cp", "pfs:a", "b", "c"], "mix PFS paths and local ones"),
    ],
)
def test_cp_refuses_what_it_cannot_do_in_one_line_before_any_request(
    argv: list[str], message: str, tmp_path: Path
) -> None:
    code, _, err = run(argv, tmp_path)
    assert code == EXIT_USAGE
    assert message in err and len(err.strip().splitlines()) == 1 and err.startswith("paddlecloud: error: ")


@pytest.mark.parametrize(
    "argv",
    [["cp", "--bogus", "a", "pfs:b"], ["cp", "-j", "0", "a", "pfs:b"], ["cp", "a"], ["ls", "-x"]],
)
def test_bad_command_lines_are_usage_errors(argv: list[str], tmp_path: Path) -> None:
    code, out, err = run(argv, tmp_path)
    assert code == EXIT_USAGE and out == ""
    assert "error: " in err.strip().splitlines()[-1]


def test_help_shows_examples_and_the_path_rules(tmp_path: Path) -> None:
    for argv in (["cp", "--help"], ["pfs", "--help"], ["file", "--help"], ["ls", "--help"]):
        code, out, _ = run(argv, tmp_path)
        assert code == 0 and "examples:" in out and "/pfs/<datacenter>/home/<user>" in out


@pytest.mark.parametrize(
    ("argv", "src", "dest", "jobs", "quiet"),
    [
        (["file", "src", "dest"], "src", "dest", DEFAULT_JOBS, False),
        (["file", "src/", "pfs:dest"], "src/", "pfs:dest", DEFAULT_JOBS, False),
        (["file", "-q", "-j", "2", "src", "dest"], "src", "dest", 2, True),
        (["file", "--jobs=3", "src", "dest", "-o", "json"], "src", "dest", 3, False),
        (["-o", "json", "file", "-jobs", "3", "./ls", "dest"], "./ls", "dest", 3, False),
        (["pfs", "copy", "src", "dest"], "src", "dest", DEFAULT_JOBS, False),
    ],
)
def test_file_src_dest_is_the_original_form_of_pfs_copy(
    argv: list[str], src: str, dest: str, jobs: int, quiet: bool
) -> None:
    args = build_parser().parse_args(argv)
    assert args.handler.__name__ == "copy"
    assert (args.src, args.dest, args.jobs, args.quiet, args.recursive) == (src, dest, jobs, quiet, True)


@pytest.mark.parametrize(
    ("argv", "handler"),
    [(["file", "ls"], "ls"), (["file", "put", "a", "b"], "upload"), (["file", "-o", "json", "ls"], "ls")],
)
def test_file_with_a_subcommand_is_still_that_subcommand(argv: list[str], handler: str) -> None:
    assert build_parser().parse_args(argv).handler.__name__ == handler


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("../x", "'..' is refused"),
        ("a/../../x", "'..' is refused"),
        ("/etc", "is not under the current directory"),
        ("escape", "is not under the current directory"),  # a symlink leading out
    ],
)
def test_file_src_must_be_under_the_current_directory(path: str, message: str, tmp_path: Path) -> None:
    (tmp_path / "here").mkdir()
    os.symlink("/etc", tmp_path / "here" / "escape")
    with pytest.raises(UsageError, match=message):
        under_cwd(path, "SRC", tmp_path / "here")
    for fine in (".", "./", "data", "data/", str(tmp_path / "here" / "data")):
        under_cwd(fine, "SRC", tmp_path / "here")
