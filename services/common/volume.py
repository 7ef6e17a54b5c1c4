"""The PFS volume: paths parsed strictly and authorised per user (the grammar every service
shares), and the datacenter's root on this host, opened only beneath each area's root.

A PFS path is `/pfs/<datacenter>/home/<user>/...` or `/pfs/<datacenter>/public/...`.
Parsing refuses every spelling of traversal before the filesystem is touched; opening
then resolves beneath the area's directory with the kernel's help (`openat2` with
RESOLVE_BENEATH, or a per-component O_NOFOLLOW walk where that is missing), so a
symlink a user's job planted cannot lead out of their home either.

Refusals are domain errors (`BadPath`, `PathForbidden`, `PathNotFound`), which pfs's domain
raises as they are (`PfsPath.parse`, `check_access`, `Volume`). Jobs and the builder, which
show or quote them as problems, use the problem face: `parse_path`, `authorize`,
`resolve_for` and `Root` raise the problems `PATH_PROBLEMS` names.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar, overload
from urllib.parse import unquote

from . import beneath, errors, trees
from .config import Config
from .internal_auth import Identity

MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255
# Names the kernel or a shell would read as something else.
_FORBIDDEN_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")
# What a "look-alike" may turn into under compatibility normalisation.
_DANGEROUS_NFKC = ("/", "\\", "\x00")
# Separators that no normalisation maps to '/', but that other systems' "best fit"
# conversions do: division and fraction slashes, solidus and reverse-solidus variants.
_SEPARATOR_LOOKALIKES = frozenset("\u2215\u2044\u29f8\u29f9\u29f5\u2216\uff0f\uff3c\ufe68")
# Bidirectional controls (marks, embeddings, overrides, isolates): an RLO makes
# `gpj.exe` show as `exe.jpg`, so a name with one shows as something it is not.
_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")

BAD_PATH = errors.ErrorKind("ERR_BAD_PATH", 400, "Bad PFS path")
PATH_FORBIDDEN = errors.ErrorKind("ERR_PATH_FORBIDDEN", 403, "Not allowed on this path")
PATH_NOT_FOUND = errors.ErrorKind("ERR_PATH_NOT_FOUND", 404, "No such file or directory")


class BadPath(errors.Invalid):
    """A PFS path, or a name in one, that the grammar refuses."""


class PathForbidden(errors.Forbidden):
    """A path the caller may not use this way, or one that leads outside its area."""


class PathNotFound(errors.NotFound):
    """A path that names nothing here: another datacenter, no such area, home or file."""


# How the grammar's refusals are shown: pfs's table holds these, and so does the problem
# face below, for the services that show or quote them as problems (jobs, the builder).
PATH_PROBLEMS: errors.ProblemTable = {
    BadPath: BAD_PATH,
    PathForbidden: PATH_FORBIDDEN,
    PathNotFound: PATH_NOT_FOUND,
}


def as_problem(refusal: errors.DomainError) -> errors.ProblemError:
    """A refusal of the grammar or the volume as the problem `PATH_PROBLEMS` names."""
    return errors.problem_for_domain(refusal, PATH_PROBLEMS)


@contextmanager
def path_problems() -> Iterator[None]:
    """The grammar's refusals inside the block raised as problems (`as_problem`)."""
    try:
        yield
    except (BadPath, PathForbidden, PathNotFound) as exc:
        raise as_problem(exc) from None


Area = Literal["home", "public"]


@dataclass(frozen=True)
class PfsPath:
    """A parsed, normalised PFS path."""

    datacenter: str
    area: Area
    owner: str | None  # the home's user; None for public
    parts: tuple[str, ...]  # components beneath the area's root (the home or public)

    @property
    def text(self) -> str:
        base = f"/pfs/{self.datacenter}/{self.area}"
        if self.owner is not None:
            base += f"/{self.owner}"
        return "/".join((base, *self.parts))

    @property
    def name(self) -> str:
        return self.parts[-1] if self.parts else (self.owner or self.area)

    @property
    def is_area_root(self) -> bool:
        return not self.parts

    def parent(self) -> PfsPath:
        return PfsPath(self.datacenter, self.area, self.owner, self.parts[:-1])

    def child(self, name: str) -> PfsPath:
        name = unicodedata.normalize("NFC", name)
        check_name(name, self.text)
        return PfsPath(self.datacenter, self.area, self.owner, (*self.parts, name))

    def relative(self) -> str:
        """The path beneath the area's root, as openat2 takes it ('.' for the root)."""
        return "/".join(self.parts) or "."

    def __str__(self) -> str:
        return self.text

    @classmethod
    def parse(cls, text: str, datacenter: str) -> PfsPath:
        """Parse an absolute PFS path; BadPath for a malformed one, PathNotFound for an unknown
        datacenter or area, PathForbidden for what names no area.

        Names are taken in Unicode's composed form (NFC), whichever form the client sent: `é`
        typed on one machine and `e` + a combining accent sent by another (macOS's file names)
        are one file, as a user reading them expects, not two look-alikes."""
        if not isinstance(text, str) or not text:
            raise BadPath("a PFS path is required, such as /pfs/<datacenter>/home/<user>/file")
        text = unicodedata.normalize("NFC", text)  # a lone surrogate stays, and is refused below
        shown = text if len(text) <= 200 else text[:200] + "…"
        if len(text.encode(errors="surrogatepass")) > MAX_PATH_BYTES:
            raise BadPath(f"{shown}: a path may be at most {MAX_PATH_BYTES} bytes")
        if not text.startswith("/pfs/"):
            raise BadPath(f"{shown}: PFS paths are absolute and start with /pfs/<datacenter>/")
        # A trailing slash is harmless (`ls /pfs/dc/home/alice/`); empty middle components are not.
        parts = text[len("/pfs/") :].removesuffix("/").split("/")
        for part in parts:
            check_name(part, shown)
        dc, rest = parts[0], parts[1:]
        if dc != datacenter:
            raise PathNotFound(f"{shown}: there is no datacenter {dc!r} here (this is {datacenter!r})")
        if not rest:
            raise PathForbidden(f"{shown}: use /pfs/{dc}/home/<user> or /pfs/{dc}/public")
        if rest[0] == "public":
            return cls(dc, "public", None, tuple(rest[1:]))
        if rest[0] == "home":
            if len(rest) < 2:
                raise PathForbidden(f"{shown}: name a home, /pfs/{dc}/home/<user>")
            return cls(dc, "home", rest[1], tuple(rest[2:]))
        raise PathNotFound(f"{shown}: only /pfs/{dc}/home/<user> and /pfs/{dc}/public exist")


def check_name(name: str, where: str) -> None:
    """Refuse (BadPath) a path component that is empty, special, too long or a traversal in disguise."""
    if name in ("", ".", ".."):
        raise BadPath(f"{where}: empty, '.' and '..' components are not allowed")
    if _FORBIDDEN_CHARS.search(name):
        raise BadPath(f"{where}: control characters and backslashes are not allowed in names")
    if _SEPARATOR_LOOKALIKES.intersection(name):
        raise BadPath(f"{where}: {name!r} contains a character that looks like a path separator")
    if _BIDI_CONTROLS.intersection(name):
        raise BadPath(f"{where}: {name!r} contains a bidirectional control character (such as U+202E)")
    if "\ufffd" in name or not _encodes(name):
        # A lone surrogate (JSON may spell one as "\udc80") is no UTF-8 name either.
        raise BadPath(f"{where}: the path is not valid UTF-8")
    if len(name.encode()) > MAX_NAME_BYTES:
        raise BadPath(f"{where}: a name may be at most {MAX_NAME_BYTES} bytes")
    # Encoded or look-alike traversal: whatever another layer might decode this name to
    # (percent-decoding, once or twice; Unicode compatibility forms such as fullwidth
    # dots or a division slash) must still be a plain name.
    candidates = {unquote(name), unquote(unquote(name)), unicodedata.normalize("NFKC", name)}
    candidates |= {unicodedata.normalize("NFKC", c) for c in list(candidates)}
    for candidate in candidates:
        if candidate in (".", "..") or any(ch in candidate for ch in _DANGEROUS_NFKC):
            raise BadPath(f"{where}: {name!r} spells a path separator or traversal in disguise")


def _encodes(name: str) -> bool:
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


def parse_path(text: str, datacenter: str) -> PfsPath:
    """`PfsPath.parse`, its refusal a problem: 400 for a malformed path, 404 for an unknown
    datacenter (for the services that show or quote it as one: jobs, the builder)."""
    with path_problems():
        return PfsPath.parse(text, datacenter)


def check_access(path: PfsPath, identity: Identity, *, write: bool) -> None:
    """Owners read and write their home; everyone reads public; admins do anything (else PathForbidden)."""
    if identity.admin:
        return
    if path.area == "public":
        if write:
            raise PathForbidden(f"{path}: /pfs/{path.datacenter}/public is read-only for users")
        return
    if path.owner != identity.user:
        # Say as little as possible about other users' homes.
        raise PathForbidden(
            f"{path}: you may only use your own home, /pfs/{path.datacenter}/home/{identity.user}"
        )


def authorize(path: PfsPath, identity: Identity, *, write: bool) -> None:
    """`check_access`, its refusal a problem (403)."""
    with path_problems():
        check_access(path, identity, write=write)


def resolve_for(identity: Identity, text: str, datacenter: str, *, write: bool) -> PfsPath:
    """A path a user names in a request (absolute, or relative to their home), parsed and
    checked to be theirs to read, or to write: the problem says why not."""
    if not text.startswith("/"):
        text = f"/pfs/{datacenter}/home/{identity.user}/{text}"
    path = parse_path(text, datacenter)
    authorize(path, identity, write=write)
    return path


# openat2(2) and the O_NOFOLLOW walk live in beneath.py, shared with the builder and jobs.


class Root:
    """A datacenter's root directory: `home/<user>/`, `public/`, and `.uploads/` for staging."""

    def __init__(self, root: Path, *, use_openat2: bool | None = None) -> None:
        self.root = root
        self.use_openat2 = beneath.probe_openat2() if use_openat2 is None else use_openat2
        for sub in ("home", "public", ".uploads"):
            (root / sub).mkdir(parents=True, exist_ok=True)

    def _refused(self, refusal: errors.DomainError) -> Exception:
        """How this root raises a refusal (a missing home, an area's root changed, a bad home
        name): as the problem it is shown as, which jobs and the builder show or quote as it
        is. pfs's `Volume` raises the domain error itself."""
        return as_problem(refusal)

    def _check_home(self, user: str) -> None:
        try:
            check_name(user, f"home {user!r}")
        except BadPath as exc:
            raise self._refused(exc) from None

    def area_dir(self, path: PfsPath) -> Path:
        return self.root / "public" if path.area == "public" else self.root / "home" / str(path.owner)

    def ensure_home(self, user: str) -> None:
        """Create a user's home on first use (their own writes, or an admin's)."""
        self._check_home(user)
        home = self.root / "home" / user
        if not home.is_dir():
            home.mkdir(mode=0o755, exist_ok=True)

    def area_owner(self, path: PfsPath) -> tuple[int, int] | None:
        """Who what the service creates in `path`'s area must belong to, if not to itself.

        A home belongs to its user's sandbox uid once that user ran a job (the local jobs
        backend gives it so), and what the service adds there must stay writable by that
        user's jobs. Only a service running as root can give files away; elsewhere None.
        """
        if os.geteuid() != 0:
            return None
        with self.area_fd(path) as area:
            owner = os.fstat(area)
        return None if (owner.st_uid, owner.st_gid) == (0, 0) else (owner.st_uid, owner.st_gid)

    def adopt(self, path: PfsPath, parent: int, name: str) -> None:
        """Give `name` in `parent`, just created in `path`'s area, to the area's owner
        (never following a symlink that may have replaced it since)."""
        owner = self.area_owner(path)
        if owner is not None:
            os.chown(name, *owner, dir_fd=parent, follow_symlinks=False)

    def retire_home(self, user: str, *, archive: bool, stamp: str) -> str | None:
        """Take a deleted user's home out of `home/`: renamed into `archive/<user>.<stamp>`
        (one rename on the same filesystem), or removed. Where it went, or None if there
        was no home or it was removed."""
        self._check_home(user)
        home = self.root / "home" / user
        if not home.is_dir() or home.is_symlink():
            return None
        if not archive:
            # What the user's jobs left there may be any depth and hold any symlink.
            trees.remove_path(home)
            return None
        target = self.root / "archive" / f"{user}.{stamp}"
        target.parent.mkdir(mode=0o700, exist_ok=True)
        os.rename(home, target)
        return str(target)

    @contextmanager
    def area_fd(self, path: PfsPath) -> Iterator[int]:
        """An O_PATH descriptor of the area's root; not found if a home does not exist yet."""
        try:
            fd = os.open(self.area_dir(path), os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise self._refused(PathNotFound(f"{path}: no such file or directory")) from None
        try:
            yield fd
        finally:
            os.close(fd)

    def open(self, path: PfsPath, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
        """A descriptor for `path`, resolved beneath its area; OSError as the kernel says.

        An escape (a symlink out of the area, or any symlink on the fallback) is
        refused as PermissionError(EXDEV or ELOOP), never followed.
        """
        with self.area_fd(path) as base:
            try:
                if self.use_openat2:
                    return beneath.openat2(base, path.relative(), flags, mode)
                return beneath.walk_nofollow(base, path.relative(), flags, mode)
            except OSError as exc:
                if exc.errno in (errno.EXDEV, errno.ELOOP):
                    raise PermissionError(exc.errno, "the path leads outside its area", path.text) from None
                raise

    @contextmanager
    def parent_fd(self, path: PfsPath) -> Iterator[tuple[int, str]]:
        """The directory holding `path`, opened beneath the area, and `path`'s own name.

        Creating, renaming and removing go through `*at` calls on this pair, so the last
        component is never resolved through a symlink.
        """
        if path.is_area_root:
            raise self._refused(
                PathForbidden(f"{path}: the root of a home or of public cannot be changed itself")
            )
        fd = self.open(path.parent(), os.O_PATH | os.O_DIRECTORY)
        try:
            yield fd, path.parts[-1]
        finally:
            os.close(fd)

    def lstat(self, path: PfsPath) -> os.stat_result:
        if path.is_area_root:
            with self.area_fd(path) as fd:
                return os.fstat(fd)
        with self.parent_fd(path) as (fd, name):
            return os.stat(name, dir_fd=fd, follow_symlinks=False)


class Volume(Root):
    """The root as pfs's domain uses it: its refusals are the domain errors themselves
    (`BadPath`, `PathForbidden`, `PathNotFound`), which pfs's table shows."""

    def _refused(self, refusal: errors.DomainError) -> Exception:
        return refusal


R = TypeVar("R", bound=Root)


@overload
def open_volume(config: Config) -> Root: ...
@overload
def open_volume(config: Config, kind: type[R]) -> R: ...
def open_volume(config: Config, kind: type[Root] = Root) -> Root:
    """The datacenter's root as `pfs.root` names it: the one way every service builds it
    (a `Root`, or pfs's `Volume`)."""
    return kind(config.pfs.root.expanduser().resolve())


def kind(st: os.stat_result) -> str:
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISREG(st.st_mode):
        return "file"
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    return "other"
