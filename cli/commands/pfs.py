"""PFS commands: `pfs cp|ls|rm|mkdir|mv|stat|usage|upload|download`, `file` and the top-level aliases."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import textwrap
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from ..config import DEFAULT_JOBS, paddle_home
from ..context import Context, Handler, UsageError
from ..errors import ApiError, PaddleCloudError
from ..flags import Deferred, add_flag
from ..output import Column, render_record, render_rows, render_table, render_yaml
from ..pfspaths import is_remote, relative_to, strip_slash
from ..progress import Progress, human_size
from . import CommandTree

if TYPE_CHECKING:
    from ..answers import Listing
    from ..client import AsyncClient
    from ..transfer import TransferReport

ORDER = 40

PATHS_HELP = """\
PFS paths: /pfs/<datacenter>/home/<user>/... (your home; read-write) and
/pfs/<datacenter>/public/... (read-only). A relative path is in your home: data/x means
/pfs/<datacenter>/home/<user>/data/x, where <datacenter> is the config's datacenter name and
<user> its username. In cp, only /pfs/... and pfs:... name PFS paths (pfs:data/x, pfs: for
your home); everything else there is local."""

TRANSFER_NOTES = """\
Placement is cp's: with several sources, a trailing slash on DEST (or DEST . or ..), or an
existing directory DEST, each source is copied into DEST under its own name; otherwise the
source becomes DEST. A directory given with a trailing slash (data/, or .) is rsync's: what
it holds goes into DEST, made if missing. So `cp -r data pfs:data` makes pfs:data, and run
again makes pfs:data/data; `cp -r data/ pfs:data` copies into pfs:data every time, which is
how to resume or update a copy. A local DEST's missing parent directories are refused
unless -p. Files already
identical at the destination (same size and sha256) are skipped; a different existing file
is an error unless --overwrite. Every transfer is verified end to end by sha256 unless
--no-verify. An interrupted transfer resumes where it stopped when run again (uploads
remember their tus URL in ~/.paddle/uploads.json; downloads keep DEST.paddlecloud-part).
Progress bars appear on a terminal; -q prints only the summary line."""

CP_EPILOG = f"""\
examples:
  paddlecloud cp train.csv /pfs/datacenter1/home/alice/data/
  paddlecloud cp -r ./dataset pfs:data/          # pfs:data/ is data/ in your home
  paddlecloud cp -r -j 8 pfs:output ./output     # download a tree, 8 files at once
  paddlecloud cp --overwrite model.tar.gz pfs:models/model.tar.gz

{TRANSFER_NOTES}

{PATHS_HELP}
"""

LS_EPILOG = f"""\
examples:
  paddlecloud ls                       # your home
  paddlecloud ls data
  paddlecloud ls -r /pfs/datacenter1/home/alice/data -o json

{PATHS_HELP}
"""

TYPE_SUFFIX = {"dir": "/", "symlink": "@"}


def _client(ctx: Context) -> AsyncClient:
    """The context's client, told which datacenter relative PFS paths are in."""
    client = ctx.client()
    if client.datacenter is None:
        client.datacenter = ctx.datacenter().name
    return client


def _progress(ctx: Context, args: argparse.Namespace) -> Progress:
    quiet = bool(getattr(args, "quiet", False))
    isatty = getattr(ctx.stderr, "isatty", None)
    bars = not quiet and callable(isatty) and bool(isatty())
    return Progress(
        stdout=ctx.stdout,
        stderr=ctx.stderr,
        bars=bars,
        lines=not quiet and ctx.output == "table",
        slots=args.jobs,
        problem_prefix=f"{ctx.prog}: error: ",
    )


# --- transfers -------------------------------------------------------------------------------


async def _transfer(
    ctx: Context, args: argparse.Namespace, *, upload: bool, sources: Sequence[str], dest: str
) -> int:
    from ..transfer import STATE_FILE, TransferFailed

    client = _client(ctx)
    progress = _progress(ctx, args)
    state_file = paddle_home(ctx.env) / STATE_FILE
    failure: TransferFailed | None = None
    options: dict[str, Any] = {
        "jobs": args.jobs,
        "overwrite": args.overwrite,
        "verify": args.verify,
        "progress": progress,
        "state_file": state_file,
    }
    try:
        if upload:
            report = await client.upload(list(sources), dest, args.recursive, **options)
        else:
            options["parents"] = args.parents
            report = await client.download(list(sources), dest, args.recursive, **options)
    except TransferFailed as exc:
        report, failure = exc.report, exc
    finally:
        progress.close()
    _emit_report(ctx, report)
    if failure is not None:
        raise failure
    return 0


def _emit_report(ctx: Context, report: TransferReport) -> None:
    ctx.emit(report.to_dict(), report.summary)


async def cp(ctx: Context, args: argparse.Namespace) -> int:
    sources: list[str] = args.sources
    dest: str = args.dest
    remote_sources = [s for s in sources if is_remote(s)]
    if is_remote(dest):
        if remote_sources:
            raise UsageError(
                f"cp: {remote_sources[0]} and {dest} are both on PFS; cp copies between this machine "
                f"and PFS (to move or rename within PFS: {ctx.prog} pfs mv SRC DST)"
            )
        return await _transfer(ctx, args, upload=True, sources=sources, dest=dest)
    if not remote_sources:
        raise UsageError(
            "cp: neither side is a PFS path; PFS paths start with /pfs/, or pfs: for a path in "
            "your home (pfs:data/x)"
        )
    if len(remote_sources) != len(sources):
        local = next(s for s in sources if not is_remote(s))
        raise UsageError(f"cp: the sources mix PFS paths and local ones ({local}); copy them separately")
    return await _transfer(ctx, args, upload=False, sources=sources, dest=dest)


async def upload(ctx: Context, args: argparse.Namespace) -> int:
    return await _transfer(ctx, args, upload=True, sources=args.sources, dest=args.dest)


async def download(ctx: Context, args: argparse.Namespace) -> int:
    return await _transfer(ctx, args, upload=False, sources=args.sources, dest=args.dest)


# --- `file SRC DEST`, the original client's form --------------------------------------------


def under_cwd(path: str, role: str, cwd: Path | None = None) -> None:
    """Refuse a local path that is not under the current directory, or that climbs with `..`.

    `..` is refused by name, not resolved away (reject, do not sanitize); a path that leaves
    through a symlink is refused by where it resolves to.
    """
    if ".." in PurePath(path).parts:
        raise UsageError(f"file: {role} {path}: '..' is refused; {role} must be under the current directory")
    here = (cwd or Path.cwd()).resolve()
    resolved = (here / path).resolve()
    if resolved != here and here not in resolved.parents:
        raise UsageError(f"file: {role} {path} is not under the current directory ({here})")


async def in_home(client: AsyncClient, path: str, role: str) -> str:
    """The absolute PFS path `path` names, refused unless it is inside your home."""
    if ".." in path.removeprefix("pfs:").split("/"):
        raise UsageError(f"file: {role} {path}: '..' is refused; {role} must be inside your home")
    resolved = await client.pfs_path(path)
    home = await client.pfs_home()
    if strip_slash(resolved) != home and not resolved.startswith(home + "/"):
        raise UsageError(f"file: {role} {path} is not inside your home {home} (cp copies elsewhere)")
    return resolved


def nest(dest: str) -> str:
    """DEST with a trailing slash: a source without one becomes a directory under DEST (rsync's rule)."""
    return dest if dest.endswith(("/", os.sep)) else dest + "/"


async def copy(ctx: Context, args: argparse.Namespace) -> int:
    """`file SRC DEST`: SRC under the current directory to DEST inside your home (or back)."""
    src: str = args.src
    dest: str = args.dest
    from ..transfer import has_trailing_slash

    client = _client(ctx)
    # Without a trailing slash SRC itself becomes a directory under DEST, whether DEST exists or
    # not; with one, what SRC holds goes into DEST: rsync's rule, which `placement` follows
    # once DEST ends in a slash.
    target = dest if has_trailing_slash(src) else nest(dest)
    if is_remote(src):
        if is_remote(dest):
            raise UsageError(f"file: {src} and {dest} are both on PFS; one side must be local")
        await in_home(client, src, "SRC")
        under_cwd(dest, "DEST")
        return await _transfer(ctx, args, upload=False, sources=[src], dest=target)
    under_cwd(src, "SRC")
    await in_home(client, dest, "DEST")
    return await _transfer(ctx, args, upload=True, sources=[src], dest=target)


def original_file_form(
    subcommands: Callable[[], Sequence[str]], takes_value: Callable[[str], bool]
) -> Callable[[list[str]], list[str]]:
    """`prepare_args` for `file`: `file SRC DEST` (the original's form) is `file copy SRC DEST`;
    `file ls ...`, `file put ...` and the other subcommands are left alone.

    The first word that is not a flag (nor a flag's value) decides: a subcommand's name, or
    else SRC. A local directory named like a subcommand is given as `./ls`.
    """

    def prepare(words: list[str]) -> list[str]:
        index = 0
        while index < len(words):
            word = words[index]
            if word == "--" or not word.startswith("-"):
                if word == "--" or word in subcommands():
                    return words
                return ["copy", *words]
            index += 2 if "=" not in word and takes_value(word) else 1
        return words

    return prepare


# --- listing and housekeeping --------------------------------------------------------------


def _mtime(entry: Mapping[str, Any]) -> str:
    """The entry's mtime in local time to the second; what the server said if unreadable."""
    value = entry.get("mtime")
    if not isinstance(value, str):
        return "-"
    try:
        return datetime.fromisoformat(value).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return value


def _size(entry: Mapping[str, Any]) -> str:
    size = entry.get("size")
    return human_size(size) if entry.get("type") == "file" and isinstance(size, int) else "-"


def _shown_path(base: str) -> Any:
    """A listing's paths beneath the listed directory, relative to it; others in full."""

    def get(entry: Mapping[str, Any]) -> str:
        path = str(entry.get("path", ""))
        try:
            shown = relative_to(path, base) or path
        except ValueError:
            shown = path
        shown += TYPE_SUFFIX.get(str(entry.get("type")), "")
        if entry.get("type") == "symlink" and entry.get("target"):
            shown += f" -> {entry['target']}"
        return shown

    return get


def _ls_columns(base: str) -> list[Column]:
    return [("TYPE", "type"), ("SIZE", _size), ("MODIFIED", _mtime), ("PATH", _shown_path(base))]


def ls_table(answer: Mapping[str, Any]) -> str:
    """A listing as TYPE, SIZE, MODIFIED, PATH rows, paths relative to the listed directory."""
    base = strip_slash(str(answer.get("path", "")))
    entries = [e for e in answer.get("entries") or [] if isinstance(e, Mapping)]
    return render_table(entries, _ls_columns(base), empty=f"{base} is empty.")


async def ls(ctx: Context, args: argparse.Namespace) -> int:
    """Each listing printed a page at a time as the pages come (docs/pfs.md): never held whole."""
    client = _client(ctx)
    paths: list[str] = args.paths or [""]
    many = len(paths) > 1
    if ctx.output == "table":
        for i, path in enumerate(paths):
            await _ls_table(ctx, client.pfs_ls_pages(path, recursive=args.recursive), many, i == 0)
        return 0
    streams: type[_JsonListing | _YamlListing] = _JsonListing if ctx.output == "json" else _YamlListing
    if many:
        ctx.stdout.write("[\n" if ctx.output == "json" else "")
    for i, path in enumerate(paths):
        writer = streams(ctx, nested=many, first=i == 0)
        async with contextlib.aclosing(client.pfs_ls_pages(path, recursive=args.recursive)) as pages:
            async for page in pages:
                writer.page(page)
        writer.close()
    if many and ctx.output == "json":
        ctx.out("\n]")
    return 0


async def _ls_table(ctx: Context, pages: AsyncGenerator[Listing], heading: bool, first: bool) -> None:
    """One listing as a table whose column widths are its first page's."""
    widths: list[int] | None = None
    columns: list[Column] = []
    async with contextlib.aclosing(pages) as listing:
        async for page in listing:
            entries = [e for e in page.entries if isinstance(e, Mapping)]
            if widths is None:
                base = strip_slash(str(page.path or ""))
                if heading:
                    ctx.stdout.write(f"{'' if first else chr(10)}{page.path}:\n")
                if not entries and page.next is None:
                    ctx.out(f"{base} is empty.")
                    return
                columns = _ls_columns(base)
            text, widths = render_rows(entries, columns, widths)
            ctx.stdout.write(text)
            ctx.stdout.flush()


class _JsonListing:
    """One listing as the JSON document `ls -o json` always printed ({"path", "entries"}),
    written a page at a time."""

    def __init__(self, ctx: Context, *, nested: bool, first: bool) -> None:
        self.ctx, self.pad, self.first, self.started, self.any = (
            ctx,
            "  " if nested else "",
            first,
            False,
            False,
        )

    def _dump(self, value: Any, indent: int) -> str:
        return textwrap.indent(json.dumps(value, indent=2, ensure_ascii=False), " " * indent)

    def page(self, page: Listing) -> None:
        out = []
        if not self.started:
            out.append(f"{'' if self.first else ','}{chr(10) if not self.first else ''}")
            out.append(f'{self.pad}{{\n{self.pad}  "path": {json.dumps(page.path, ensure_ascii=False)},')
            out.append(f'\n{self.pad}  "entries": [')
            self.started = True
        for entry in page.entries:
            out.append(("\n" if not self.any else ",\n") + self._dump(entry.to_dict(), len(self.pad) + 4))
            self.any = True
        self.ctx.stdout.write("".join(out))
        self.ctx.stdout.flush()

    def close(self) -> None:
        end = f"\n{self.pad}  ]" if self.any else "]"
        self.ctx.stdout.write(f"{end}\n{self.pad}}}" + ("" if self.pad else "\n"))
        self.ctx.stdout.flush()


class _YamlListing:
    """One listing as the YAML `ls -o yaml` always printed, written a page at a time."""

    def __init__(self, ctx: Context, *, nested: bool, first: bool) -> None:
        self.ctx, self.nested, self.started, self.any = ctx, nested, False, False

    def _write(self, text: str) -> None:
        if self.nested:  # an item of the list of listings
            lines = text.splitlines(keepends=True)
            text = "".join(
                ("- " if not self.started and i == 0 else "  ") + line for i, line in enumerate(lines)
            )
        self.ctx.stdout.write(text)
        self.ctx.stdout.flush()

    def page(self, page: Listing) -> None:
        text = "" if self.started else render_yaml({"path": page.path})
        if page.entries:
            text += ("" if self.any else "entries:\n") + render_yaml([e.to_dict() for e in page.entries])
            self.any = True
        if text:
            self._write(text)
        self.started = True

    def close(self) -> None:
        if not self.any:
            self._write("entries: []\n")


async def rm(ctx: Context, args: argparse.Namespace) -> int:
    client = _client(ctx)
    removed: list[str] = []
    for path in args.paths:
        resolved = await client.pfs_path(path)
        try:
            await client.pfs_rm(resolved, recursive=args.recursive)
        except ApiError as exc:
            if exc.status == 404 and args.force:
                continue
            if exc.status == 409 and not args.recursive:
                raise PaddleCloudError(
                    f"{resolved} is a directory that is not empty; use -r to remove it and everything in it"
                ) from exc
            raise
        removed.append(resolved)
    ctx.emit({"removed": removed}, lambda: "\n".join(f"removed {p}" for p in removed) or "nothing removed")
    return 0


async def mkdir(ctx: Context, args: argparse.Namespace) -> int:
    client = _client(ctx)
    entries = [await client.pfs_mkdir(path, parents=True) for path in args.paths]
    ctx.emit(
        entries[0] if len(entries) == 1 else entries,
        lambda: "\n".join(f"{e.path}/" for e in entries),
    )
    return 0


async def mv(ctx: Context, args: argparse.Namespace) -> int:
    client = _client(ctx)
    src = await client.pfs_path(args.src)
    entry = await client.pfs_mv(src, args.dst, overwrite=args.overwrite)
    ctx.emit(entry, lambda: f"moved {src} -> {entry.path}")
    return 0


STAT_FIELDS: list[Column] = [
    ("Path", "path"),
    ("Type", "type"),
    (
        "Size",
        lambda e: f"{human_size(e['size'])} ({e['size']} bytes)" if isinstance(e.get("size"), int) else "-",
    ),
    ("Modified", _mtime),
    ("Mode", "mode"),
]


async def stat(ctx: Context, args: argparse.Namespace) -> int:
    entry = await _client(ctx).pfs_stat(args.path, checksum=args.checksum)
    fields = list(STAT_FIELDS)
    if "target" in entry:
        fields.append(("Target", "target"))
    if "sha256" in entry:
        fields.append(("SHA256", "sha256"))
    ctx.emit(entry, lambda: render_record(entry, fields))
    return 0


def _limit(row: Mapping[str, Any]) -> str:
    limit = row.get("limit")
    return "unlimited" if limit is None else f"{human_size(limit)} ({limit} bytes)"


USAGE_FIELDS: list[Column] = [
    ("User", "user"),
    ("Used", lambda u: f"{human_size(u.get('bytes') or 0)} ({u.get('bytes')} bytes)"),
    ("Files", "files"),
    ("Limit", _limit),
]


async def usage(ctx: Context, args: argparse.Namespace) -> int:
    answer = await _client(ctx).pfs_usage(args.user)
    ctx.emit(answer, lambda: render_record(answer, USAGE_FIELDS))
    return 0


# --- the command line ------------------------------------------------------------------------


def _jobs(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if not 1 <= number <= 64:
        raise argparse.ArgumentTypeError(f"must be between 1 and 64, got {number}")
    return number


def add_transfer_flags(parser: Deferred) -> None:
    add_flag(parser, "recursive", short="-r", action="store_true", help="copy directories and all they hold")
    add_flag(
        parser,
        "jobs",
        short="-j",
        type=_jobs,
        default=DEFAULT_JOBS,
        metavar="N",
        help="files to transfer at once (default: %(default)s)",
    )
    add_flag(parser, "quiet", short="-q", action="store_true", help="no progress bars or per-file lines")
    add_flag(
        parser,
        "parents",
        short="-p",
        action="store_true",
        help="make a local DEST's missing parent directories (on PFS they are always made)",
    )
    add_flag(parser, "overwrite", action="store_true", help="replace destination files that differ")
    add_flag(
        parser,
        "no-verify",
        dest="verify",
        action="store_false",
        help="skip the end-to-end sha256 comparison (chunks are still checksummed)",
    )


def _register_cp(tree: CommandTree) -> None:
    parser = tree.command(
        "cp",
        cp,
        help="copy files and trees between this machine and PFS",
        description=(
            "Copy files (and with -r, directory trees) to PFS or from it: the side that is a PFS\n"
            "path decides the direction. Several files move at once (-j)."
        ),
        epilog=CP_EPILOG,
    )
    parser.add_argument("sources", nargs="+", metavar="SRC", help="what to copy")
    parser.add_argument("dest", metavar="DEST", help="where to")
    add_transfer_flags(parser)


def _epilog(name: str, examples: Sequence[str], *notes: str) -> str:
    """A command's epilog: a `paddlecloud NAME EXAMPLE` line for each example, then the notes."""
    lines = "".join(f"  paddlecloud {name} {example}\n" for example in examples)
    return f"examples:\n{lines}" + "".join(f"\n{note}\n" for note in notes)


def _register_upload(tree: CommandTree, *, aliases: Sequence[str] = ()) -> None:
    _register_one_way(
        tree,
        upload,
        "upload local files and trees to PFS",
        "Upload local files (and with -r, directory trees) to PFS; REMOTE may be relative\nto your home.",
        ["train.csv data/", "-r ./dataset /pfs/datacenter1/home/alice/dataset"],
        ("LOCAL", "local files or directories"),
        ("REMOTE", "PFS destination"),
        aliases,
    )


def _register_download(tree: CommandTree, *, aliases: Sequence[str] = ()) -> None:
    _register_one_way(
        tree,
        download,
        "download PFS files and trees to this machine",
        "Download PFS files (and with -r, directory trees); REMOTE may be relative to\nyour home.",
        ["output/model.tar.gz .", "-r /pfs/datacenter1/home/alice/output ./output"],
        ("REMOTE", "PFS files or directories"),
        ("LOCAL", "local destination"),
        aliases,
    )


def _register_one_way(
    tree: CommandTree,
    handler: Handler,
    help: str,
    description: str,
    examples: Sequence[str],
    sources: tuple[str, str],
    dest: tuple[str, str],
    aliases: Sequence[str],
) -> None:
    """`upload` or `download` (the handler's name): SOURCES... DEST, each a metavar and its help."""
    name = handler.__name__
    parser = tree.command(
        name,
        handler,
        help=help,
        description=description,
        epilog=_epilog(name, examples, TRANSFER_NOTES, PATHS_HELP),
        aliases=aliases,
    )
    parser.add_argument("sources", nargs="+", metavar=sources[0], help=sources[1])
    parser.add_argument("dest", metavar=dest[0], help=dest[1])
    add_transfer_flags(parser)


def _register_ls(tree: CommandTree) -> None:
    parser = tree.command(
        "ls",
        ls,
        help="list PFS directories",
        description="List PFS directories (a file lists itself): type, size, modification time and path.",
        epilog=LS_EPILOG,
    )
    parser.add_argument("paths", nargs="*", metavar="PATH", help="what to list (default: your home)")
    add_flag(parser, "recursive", short="-r", action="store_true", help="list everything beneath, too")


def _register_rm(tree: CommandTree) -> None:
    parser = tree.command(
        "rm",
        rm,
        help="remove PFS files and directories",
        description="Remove PFS files, empty directories, and with -r directories with all they hold.",
        epilog=_epilog("rm", ["data/old.csv", "-r /pfs/datacenter1/home/alice/tmp"], PATHS_HELP),
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="what to remove")
    add_flag(
        parser, "recursive", short="-r", action="store_true", help="remove directories and all they hold"
    )
    add_flag(parser, "force", short="-f", action="store_true", help="no error for paths that do not exist")


def _register_mkdir(tree: CommandTree) -> None:
    parser = tree.command(
        "mkdir",
        mkdir,
        help="make PFS directories",
        description="Make PFS directories, with their parents; existing ones are fine.",
        epilog=_epilog("mkdir", ["data/raw data/clean", "/pfs/datacenter1/home/alice/output"], PATHS_HELP),
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="directories to make")
    add_flag(parser, "parents", short="-p", action="store_true", help="accepted for habit's sake: always on")


FILE_EPILOG = f"""\
examples:
  paddlecloud file ./dataset data          # makes <home>/data/dataset
  paddlecloud file ./dataset/ data         # what dataset holds goes into <home>/data
  paddlecloud file pfs:output/ ./output    # and back: <home>/output's contents into ./output

The original client's form: SRC must be under the current directory ('..' is refused) and
DEST inside your home (DEST alone is <home>/DEST); a PFS SRC copies the other way, with the
local DEST under the current directory. Always recursive. Without a trailing slash SRC
itself becomes a directory under DEST; with one, what SRC holds goes into DEST (rsync's
rule, whether or not DEST exists yet). Files already identical are skipped, so running it
again resumes.

{PATHS_HELP}
"""


def _register_copy(pfs: CommandTree) -> Deferred:
    parser = pfs.command(
        "copy",
        copy,
        help="copy SRC under this directory into your home, as `file SRC DEST` (rsync's slash rule)",
        description=(
            "Copy a file or tree from under the current directory to DEST inside your home, or\n"
            "back, as the original `paddlectl file SRC DEST` did. `file SRC DEST` is this command."
        ),
        epilog=FILE_EPILOG,
    )
    parser.add_argument("src", metavar="SRC", help="under the current directory (or pfs:... in your home)")
    parser.add_argument("dest", metavar="DEST", help="inside your home (or local, under this directory)")
    add_transfer_flags(parser)
    parser.set_defaults(recursive=True)
    return parser


def register(tree: CommandTree) -> None:
    copy_parser: Deferred | None = None

    def subcommands() -> Sequence[str]:
        return pfs.names

    def takes_value(flag: str) -> bool:
        action = copy_parser.built()._option_string_actions.get(flag) if copy_parser is not None else None
        return action is not None and action.nargs != 0

    pfs = tree.group(
        "pfs",
        help="files on PFS: cp, ls, rm, mkdir, mv, stat, usage, upload, download",
        description=(
            "Files on PFS, the platform's file system that jobs read their data from and write\n"
            "their output to. `paddlecloud file ...` is the same group (with put and get, as the\n"
            "original client had them), and `paddlecloud file SRC DEST` is its `copy`; cp, ls,\n"
            "rm, mkdir, upload and download also work at the top level."
        ),
        epilog=(
            "examples:\n"
            "  paddlecloud pfs cp -r ./dataset pfs:data/\n"
            "  paddlecloud pfs ls -r data\n"
            "  paddlecloud file put train.csv /pfs/datacenter1/home/alice/data/\n"
            "  paddlecloud file ./dataset data         # <home>/data/dataset (see pfs copy --help)\n"
            "  paddlecloud pfs usage\n"
            f"\n{PATHS_HELP}\n"
        ),
        aliases=["file"],
        prepare_args=original_file_form(subcommands, takes_value),
    )
    copy_parser = _register_copy(pfs)
    for level in (pfs, tree):
        _register_cp(level)
        _register_ls(level)
        _register_rm(level)
        _register_mkdir(level)
    # `file put|get` are the original client's spellings of upload and download.
    _register_upload(pfs, aliases=["put"])
    _register_download(pfs, aliases=["get"])
    _register_upload(tree)
    _register_download(tree)

    move = pfs.command(
        "mv",
        mv,
        help="move or rename within PFS",
        epilog="examples:\n  paddlecloud pfs mv data/raw data/archive/raw-2026\n",
    )
    move.add_argument("src", metavar="SRC")
    move.add_argument("dst", metavar="DST")
    add_flag(move, "overwrite", action="store_true", help="replace an existing file at DST")

    info = pfs.command(
        "stat",
        stat,
        help="show one PFS entry",
        epilog="examples:\n  paddlecloud pfs stat data/train.csv --checksum\n",
    )
    info.add_argument("path", metavar="PATH")
    add_flag(info, "checksum", action="store_true", help="also show a file's sha256")

    used = pfs.command(
        "usage",
        usage,
        help="show the storage your home uses, and its limit",
        epilog="examples:\n  paddlecloud pfs usage\n  paddlecloud pfs usage bob   # admins only\n",
    )
    used.add_argument("user", nargs="?", metavar="USER", help="another user's home (admins only)")
