"""Paged listings (docs/pfs.md, "Listing a large directory"): the cursor a page ends with, and
the walk that serves the next page from it in bounded memory on any volume.

A page is `limit` entries in tree order, the order of their path components: a directory's
entries by name (code points, which is UTF-8 byte order), and with `recursive` each directory
followed by everything beneath it before its next sibling. The cursor names the last entry
served, relative to the listed directory, plus a digest of what was listed; the next page
starts after that name wherever it now sorts. It is only ever compared with names, never
opened, so it cannot reach outside the listed directory, and a cursor made for another
listing (another directory, another user's home, or recursive where it was not) is refused.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import errno
import hashlib
import json
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from paddlecloud.common.storage.base import Children, Entry
from paddlecloud.common.volume import MAX_PATH_BYTES, PfsPath

# The most entries one page holds: about 3 MB of JSON, which the service builds and the
# gateway passes on whole. A POSIX directory's page reads every name in it, keeping the names
# of the pages after it while it is unchanged (posix.PageNames).
MAX_LIMIT = 10_000

ChildrenOf = Callable[[PfsPath, str | None, int], Awaitable[Children | Entry]]


class BadCursor(ValueError):
    """A cursor this listing did not make: its text says why."""


def _digest(path: PfsPath, recursive: bool) -> str:
    return hashlib.sha256(f"{path.text}\0{int(recursive)}".encode(errors="surrogateescape")).hexdigest()[:16]


def make_cursor(path: PfsPath, recursive: bool, last: tuple[str, ...]) -> str:
    """The cursor that resumes the listing of `path` after the entry at `last` (beneath it)."""
    text = json.dumps([_digest(path, recursive), list(last)], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode(errors="surrogateescape")).decode().rstrip("=")


def read_cursor(cursor: str, path: PfsPath, recursive: bool) -> tuple[str, ...]:
    """The components of the entry a cursor resumes after; BadCursor if this listing did not make it."""
    if len(cursor) > 2 * MAX_PATH_BYTES:
        raise BadCursor("too long to be a cursor of this listing")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        digest, last = json.loads(raw.decode(errors="surrogateescape"))
    except (binascii.Error, ValueError, TypeError):
        raise BadCursor("not a cursor (pass the `next` of the previous page as it came)") from None
    if digest != _digest(path, recursive):
        raise BadCursor("made for another listing (another path, or recursive where this is not)")
    if (
        not isinstance(last, list)
        or not last
        or (len(last) > 1 and not recursive)
        or not all(isinstance(n, str) and _one_component(n) for n in last)
    ):
        raise BadCursor("names no entry of this listing")
    return tuple(last)


def _one_component(name: str) -> bool:
    return name not in ("", ".", "..") and "/" not in name and "\0" not in name


def _bytes(path: PfsPath) -> int:
    return len(path.text.encode(errors="surrogateescape"))


@dataclass(frozen=True)
class Page:
    """A page's entries and the cursor of the next (None: this was the last)."""

    entries: list[Entry]
    next: str | None


@dataclass
class _Level:
    """One directory of the walk: the next of its entries to serve, and where to read on."""

    directory: PfsPath
    rel: tuple[str, ...]
    start: str | None
    more: bool = True
    loaded: deque[Entry] = field(default_factory=deque)


def _under(directory: PfsPath, name: str) -> PfsPath:
    # Not PfsPath.child: names come from the disk (any a job made) or from a cursor that
    # read_cursor checked to be one component; the volume resolves them beneath its root.
    return dataclasses.replace(directory, parts=(*directory.parts, name))


def _levels(path: PfsPath, recursive: bool, after: tuple[str, ...]) -> list[_Level]:
    """The walk's stack to resume after the entry `after` names: first what is beneath that
    entry (if it is still a directory), then its later siblings, then its parent's, up to `path`."""
    if not after:
        return [_Level(path, (), None)]
    if not recursive:
        return [_Level(path, (), after[0])]
    levels, directory = [], path
    for depth, name in enumerate(after):
        levels.append(_Level(directory, after[:depth], name))
        directory = _under(directory, name)
    levels.append(_Level(directory, after, None))
    return levels


async def _children_or_nothing(
    children: ChildrenOf, directory: PfsPath, start: str | None, batch: int
) -> Children:
    """A page of `directory`'s entries; none where it went away or is no longer a directory
    (its own entry was served as what it was then)."""
    try:
        found = await children(directory, start, batch)
    except (FileNotFoundError, NotADirectoryError):
        return Children([], None)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # swapped for a symlink between pages: never entered
            return Children([], None)
        raise
    return found if isinstance(found, Children) else Children([], None)


async def page(
    children: ChildrenOf, path: PfsPath, *, recursive: bool, after: tuple[str, ...], limit: int
) -> Page:
    """`limit` entries of the listing of the directory `path` after `after`, and the next cursor.

    Iterative, with one level per directory entered (a tree may be 2,048 levels deep), each
    holding at most one batch of its entries. One entry more than `limit` is read so that
    the last page says it is the last.
    """
    batch = limit + 1
    stack = _levels(path, recursive, after)
    out: list[tuple[tuple[str, ...], Entry]] = []
    while stack and len(out) <= limit:
        level = stack[-1]
        if not level.loaded:
            if not level.more:
                stack.pop()
                continue
            found = await _children_or_nothing(children, level.directory, level.start, batch)
            level.loaded.extend(found.entries)
            level.start, level.more = found.resume, found.resume is not None
            continue
        entry = level.loaded.popleft()
        rel = (*level.rel, entry.name)
        out.append((rel, entry))
        if recursive and entry.stat.kind == "dir":
            below = _under(level.directory, entry.name)
            if _bytes(below) < MAX_PATH_BYTES:
                stack.append(_Level(below, rel, None))
    more = len(out) > limit
    del out[limit:]
    return Page([entry for _, entry in out], make_cursor(path, recursive, out[-1][0]) if more else None)
