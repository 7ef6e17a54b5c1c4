"""The SDK's answers as typed objects: `Job`, `Worker`, `Event`, `Quota`, `Entry` and the rest.

Each is a frozen dataclass read from the server's JSON object: fields named as the API names
them (docs/api.md), nested objects typed too, a field the server left out or sent with another
type is None (an empty list or map for collections). `to_dict()` gives the object exactly as
the server sent it, which is what `-o json` prints. Each also reads as a read-only mapping
(`job["state"]`, `job.get("reason")`, `job == {...}`), so code written against the plain
dicts the SDK used to return goes on working.
"""

from __future__ import annotations

import copy
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any, ClassVar, TypeVar

A = TypeVar("A", bound="Answer")

ACTIVE_STATES = ("PENDING", "BUILDING", "RUNNING")
FINAL_STATES = ("SUCCEEDED", "FAILED", "KILLED")


@dataclass(frozen=True, eq=False)
class Answer(Mapping[str, Any]):
    """The base of every answer: the server's object (`to_dict()`), also read as a mapping."""

    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_dict(cls: type[A], data: Mapping[str, Any]) -> A:
        """Read `data`; fields it lacks or holds with another type become None (or empty)."""
        values = {name: convert(data.get(name)) for name, convert in _converters(cls)}
        return cls(raw=dict(data), **values)

    def to_dict(self) -> dict[str, Any]:
        """The object as the server sent it (a copy)."""
        return copy.deepcopy(self.raw)

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    # A frozen dataclass would hash its fields, and `raw` is a dict; mappings compare by items.
    __hash__: ClassVar[None] = None  # type: ignore[assignment]


@cache
def _converters(cls: type) -> tuple[tuple[str, Callable[[Any], Any]], ...]:
    """Each field's name and the function that reads its value, worked out once per class from
    its type hints (a listing converts every entry: the hints are not read again for each)."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, _converter(hints[f.name])) for f in fields(cls) if f.name != "raw")


def _converter(hint: Any) -> Callable[[Any], Any]:
    origin = typing.get_origin(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        if isinstance(item, type) and issubclass(item, Answer):
            answer = item
            return lambda v: (
                [answer.from_dict(x) for x in v if isinstance(x, Mapping)] if isinstance(v, list) else []
            )
        return lambda v: list(v) if isinstance(v, list) else []
    if origin is dict:
        return lambda v: dict(v) if isinstance(v, Mapping) else {}
    choices = typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)
    default = False if hint is bool else None
    # In the hint's order: (an Answer class, read from a mapping), (Any), (a type the value has).
    steps: list[tuple[int, Any]] = []
    for choice in choices:
        if isinstance(choice, type) and issubclass(choice, Answer):
            steps.append((0, choice))
        elif choice is Any:
            steps.append((1, choice))
        elif isinstance(choice, type):
            steps.append((2, choice))

    def convert(value: Any) -> Any:
        for kind, choice in steps:
            if kind == 0:
                if isinstance(value, Mapping):
                    return choice.from_dict(value)
            elif kind == 1 or (isinstance(value, choice) and not (choice is int and isinstance(value, bool))):
                return value
        return default

    return convert


# --- who and what ------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Token(Answer):
    """A login's answer: the token, when it expires, and whose it is."""

    token: str | None = None
    expires_at: str | None = None
    user: str | None = None
    admin: bool = False


@dataclass(frozen=True, eq=False)
class Whoami(Answer):
    """Who the token in use belongs to; `home` is `/pfs/<datacenter>/home/<user>`."""

    user: str | None = None
    admin: bool = False
    expires_at: str | None = None
    datacenter: str | None = None
    home: str | None = None


@dataclass(frozen=True, eq=False)
class Version(Answer):
    """The server's version and its API's (`v1`)."""

    version: str | None = None
    api: str | None = None


@dataclass(frozen=True, eq=False)
class User(Answer):
    """A user as an admin sees it; `quota` values in Kubernetes syntax, None for unlimited."""

    name: str | None = None
    admin: bool = False
    created_at: str | None = None
    quota: dict[str, str | int | None] = field(default_factory=dict)


# --- PFS -----------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Entry(Answer):
    """A PFS file, directory or symlink (with its `target`); `sha256` only when asked for."""

    path: str | None = None
    name: str | None = None
    type: str | None = None
    size: int | None = None
    mtime: str | None = None
    mode: str | int | None = None
    target: str | None = None
    sha256: str | None = None

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"


@dataclass(frozen=True, eq=False)
class Listing(Answer):
    """`pfs_ls`: the path listed and its entries; a page of a paged listing also has the
    cursor of the `next` page (None: the last)."""

    path: str | None = None
    entries: list[Entry] = field(default_factory=list)
    next: str | None = None


@dataclass(frozen=True, eq=False)
class Usage(Answer):
    """A PFS home's bytes and files, and its limit (None: unlimited)."""

    user: str | None = None
    bytes: int | None = None
    files: int | None = None
    limit: int | str | None = None


# --- jobs ----------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Worker(Answer):
    """A parameter server or trainer of a job; `devices` are the GPUs it holds."""

    name: str | None = None
    role: str | None = None
    index: int | None = None
    state: str | None = None
    restarts: int | None = None
    started_at: str | None = None
    exit_code: int | None = None
    host: str | None = None
    devices: list[str] = field(default_factory=list)


@dataclass(frozen=True, eq=False)
class Event(Answer):
    """Something that happened to a job; `type` `state` for a transition, to `state`."""

    time: str | None = None
    type: str | None = None
    reason: str | None = None
    message: str | None = None
    state: str | None = None


@dataclass(frozen=True, eq=False)
class Job(Answer):
    """A job: its spec, where it stands and why; `workers` and `events` where the call gives them."""

    name: str | None = None
    owner: str | None = None
    state: str | None = None
    reason: str | None = None
    created_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    spec: dict[str, Any] = field(default_factory=dict)
    workers: list[Worker] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    # The peak of each resource figure per worker (docs/metrics.md §1.2); empty: none sampled.
    resources: dict[str, Any] = field(default_factory=dict)

    @property
    def final(self) -> bool:
        """SUCCEEDED, FAILED or KILLED: nothing about it will change any more."""
        return self.state in FINAL_STATES


@dataclass(frozen=True, eq=False)
class LogEntry(Answer):
    """One log line of a job (without its newline), the worker that wrote it, and its cursor."""

    worker: str | None = None
    line: str | None = None
    cursor: str | None = None

    @property
    def text(self) -> str:
        """The line as the text stream shows it: `[trainer-0] text`."""
        line = self.line or ""
        return f"[{self.worker}] {line}" if self.worker else line


@dataclass(frozen=True, eq=False)
class PlannedWorker(Answer):
    """A worker a dry run would start, with what it would ask for."""

    name: str | None = None
    role: str | None = None
    index: int | None = None
    cpu: str | None = None
    memory: str | None = None
    gpu: int | None = None


@dataclass(frozen=True, eq=False)
class PackagePlan(Answer):
    """The package a dry run looked for; `found` False when it is not on PFS yet."""

    path: str | None = None
    kind: str | None = None
    found: bool | None = None


@dataclass(frozen=True, eq=False)
class BuildPlan(Answer):
    """The environment a dry run would build for requirements.txt: its key, and whether it is built."""

    key: str | None = None
    cached: bool = False


@dataclass(frozen=True, eq=False)
class DryRun(Answer):
    """What a submit would do: the job, its workers, its package and its environment build."""

    dry_run: bool = True
    job: Job | None = None
    workers: list[PlannedWorker] = field(default_factory=list)
    package: PackagePlan | None = None
    build: BuildPlan | None = None
    # The Kubernetes objects the job would create (the kubernetes backend only).
    objects: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, eq=False)
class Limit(Answer):
    """One resource of a quota: what is in use, and the limit (None: unlimited)."""

    used: str | int | None = None
    limit: str | int | None = None


@dataclass(frozen=True, eq=False)
class Quota(Answer):
    """Your usage against your limits, the GPUs your jobs hold and what the machine has free."""

    RESOURCES: ClassVar[tuple[str, ...]] = ("cpu", "gpu", "memory", "jobs", "storage", "disk")

    user: str | None = None
    cpu: Limit | None = None
    gpu: Limit | None = None
    memory: Limit | None = None
    jobs: Limit | None = None
    storage: Limit | None = None
    disk: Limit | None = None
    devices: list[dict[str, Any]] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)

    def limits(self) -> dict[str, Limit]:
        """The resources the server reported, in the order the table shows them."""
        found = {name: getattr(self, name) for name in self.RESOURCES}
        return {name: limit for name, limit in found.items() if limit is not None}
