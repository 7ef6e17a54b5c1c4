"""PFS path rules on the client: which arguments are remote, and relative paths made absolute.

A full PFS path is `/pfs/<datacenter>/home/<user>/...` or `/pfs/<datacenter>/public/...`.
As a convenience, a relative path names a place in your own home: `data/x` means
`/pfs/<datacenter>/home/<user>/data/x`, where `<datacenter>` is the name of the client
config's datacenter and `<user>` the user logged in. Where a command takes both local and
remote paths (`cp`), only `/pfs/...` and the `pfs:` prefix (`pfs:data/x`, `pfs:` alone for
your home) mark a remote path; everything else there is a local path.

Nothing here normalises `..` or `.` away: the server refuses traversal in every spelling,
and a client that quietly rewrote the path would hide the mistake (reject, do not sanitize).
Names are put in Unicode's composed form (NFC), as the server keeps them: a name read from
a Mac's disk (decomposed, NFD) then matches the same name in a listing.
"""

from __future__ import annotations

import posixpath
import unicodedata

from .errors import PaddleCloudError

PFS_ROOT = "/pfs/"
REMOTE_PREFIX = "pfs:"


class PfsPathError(PaddleCloudError):
    """A path argument that cannot name a PFS file, said in one line."""


def is_remote(arg: str) -> bool:
    """Whether a `cp` argument names the PFS side: `/pfs/...` or `pfs:...`."""
    return arg == "/pfs" or arg.startswith(PFS_ROOT) or arg.startswith(REMOTE_PREFIX)


def home_of(datacenter: str, user: str) -> str:
    return f"/pfs/{datacenter}/home/{user}"


def needs_home(arg: str) -> bool:
    """Whether resolving `arg` needs the datacenter and user (it is relative to the home)."""
    text = arg.removeprefix(REMOTE_PREFIX)
    return not text.startswith("/")


def resolve(arg: str, datacenter: str | None, user: str | None) -> str:
    """The absolute PFS path an argument names, in composed form (NFC); `PfsPathError`
    when it names none (see `_resolve`)."""
    return _composed(_resolve(arg, datacenter, user))


def _composed(path: str) -> str:
    return unicodedata.normalize("NFC", path)


def _resolve(arg: str, datacenter: str | None, user: str | None) -> str:
    """The absolute PFS path an argument names; `PfsPathError` when it names none.

    A trailing slash is kept: for `cp` it says "into this directory". A leading `./` of a
    relative path is dropped (the shell's completion adds it); other `.` and `..` are left
    for the server to refuse.
    """
    text = arg.removeprefix(REMOTE_PREFIX)
    if text.startswith("/"):
        if text == "/pfs" or text.startswith(PFS_ROOT):
            return text
        raise PfsPathError(
            f"{arg}: not a PFS path; PFS paths start with /pfs/<datacenter>/, "
            f"or are relative to your home (data/x, pfs:data/x)"
        )
    while text.startswith("./"):
        text = text[2:]
    if not datacenter or not user:
        raise PfsPathError(
            f"{arg}: a relative PFS path needs a datacenter and a user to name your home; "
            f"give the full path /pfs/<datacenter>/home/<user>/{text}"
        )
    home = home_of(datacenter, user)
    if text in ("", "."):
        return home
    return f"{home}/{text}"


def is_area_root(path: str) -> bool:
    """Whether `path` is a home (`/pfs/dc/home/alice`) or public itself: always a directory,
    even before the home's first write has created it."""
    parts = strip_slash(path).split("/")
    return (len(parts) == 5 and parts[3] == "home") or (len(parts) == 4 and parts[3] == "public")


def strip_slash(path: str) -> str:
    """`path` without trailing slashes (the root `/` stays)."""
    stripped = path.rstrip("/")
    return stripped or "/"


def basename(path: str) -> str:
    """The last component, ignoring a trailing slash (`/pfs/dc/home/u/data/` → `data`)."""
    return posixpath.basename(strip_slash(path))


def join(base: str, relative: str) -> str:
    """`base/relative` for a PFS path and a `/`-separated relative path ('' gives `base`)."""
    base = strip_slash(base)
    return _composed(f"{base}/{relative}") if relative else base


def relative_to(path: str, base: str) -> str:
    """`path` beneath `base` as a relative `/`-separated path ('' when they are the same)."""
    path, base = strip_slash(path), strip_slash(base)
    if path == base:
        return ""
    if not path.startswith(base + "/"):
        raise ValueError(f"{path} is not beneath {base}")
    return path[len(base) + 1 :]
