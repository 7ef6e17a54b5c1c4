"""The job spec of DESIGN §4: every field with its default, validated with the field and the rule named.

`POST /api/v1/jobs` takes either this spec or the original PaddleCloud body, which
spelled `package` as `job_package` and `trainers` as `parallelism`; `parse_submission`
(or `JobSpec.model_validate`, which it calls) accepts both. Errors are pydantic
`ValidationError`s whose `loc` is the field *as the user spelled it* (`parallelism` when
they sent `parallelism`), so `paddlecloud.common.web.validation_problem` names what the
user actually wrote. Stored specs (`JobSpec.to_dict`) use the canonical names only.

Types are strict: the CLI sends integers as JSON integers, so `"trainers": "2"` is
refused rather than guessed at, and `env` values must be strings.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Annotated, Any, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from paddlecloud.common.quantity import QuantityError, parse_bytes, parse_cpu_milli
from paddlecloud.jobs.contract import RESERVED_ENV as CONTRACT_ENV

# --- Names -----------------------------------------------------------------------------
#
# The Kubernetes backend derives these objects from a job's name (DESIGN §4):
#   StatefulSet `<name>-pserver`: the controller labels each pod with
#     `controller-revision-hash: <statefulset>-<hash of up to 10 chars>`, a label value
#     of at most 63, so the StatefulSet's name is at most 63 - 1 - 10 = 52, and
#     name ≤ 52 - len("-pserver") = 52 - 8 = 44.                          <- binding
#   headless Service `<name>-pserver`: a DNS-1035 label, ≤ 63 → name ≤ 55; it must
#     start with a letter, hence names start with a letter (not a digit).
#   pserver pods `<name>-pserver-<i>` (i ≤ 999) are hostnames (DNS labels, ≤ 63)
#     → name ≤ 63 - 8 - 4 = 51.
#   Indexed Job `<name>-trainer`: ≤ 63 → name ≤ 55; its pods' hostnames are
#     `<job>-<index>` (index ≤ 999) → name ≤ 63 - 8 - 4 = 51; pod names add
#     `-<5 random chars>` but are DNS subdomains (≤ 253), so they do not bind.
#   Labels `job: <name>` on every object: ≤ 63 → name ≤ 63.
# So a name is at most 44 characters, and a per-job object the backend adds later
# (the owner of the rest, say) has 63 - 44 = 19 characters for its suffix as a DNS
# label, or 8 as a StatefulSet.
MAX_NAME_LENGTH = 44
_NAME_RULE = (
    "may contain only lowercase letters, digits, '-' and '.', starting with a letter and "
    f"ending with a letter or digit (at most {MAX_NAME_LENGTH} characters)"
)
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-.")

MAX_TRAINERS = 1000
MAX_PSERVERS = 1000
# Restarts beyond this are a crash loop, not fault tolerance.
MAX_RESTARTS = 100

# --- Environment -----------------------------------------------------------------------

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Set by the platform on every process (DESIGN §4, runtime contract; PADDLE_CLOUD_INPUT
# where a job has an input); a user's value would silently break the job's wiring, so it
# is refused rather than overridden. Any other name, PADDLE_* included, is the user's:
# Paddle reads settings such as PADDLE_DISTRI_BACKEND that only the user can choose.
RESERVED_ENV = CONTRACT_ENV | {"PADDLE_CLOUD_INPUT"}
# Linux refuses to exec with any single "KEY=value" string of 32 pages (MAX_ARG_STRLEN)
# or more; refusing here beats a job that fails with E2BIG when it starts.
_MAX_ENV_STRING = 131072

# --- Quantities ------------------------------------------------------------------------

DEFAULT_CPU = "1"
DEFAULT_MEMORY = "1Gi"
# The scratch space of each worker (pservers too): its working directory (the unpacked
# package included) and whatever it writes outside PFS, its logs on a node included. As
# much as the local backend lets a job add by default (jobs.scratch_max_bytes); outputs
# belong in PFS.
DEFAULT_DISK = "1Gi"
# Container runtimes refuse memory limits under about 6MB and a Python trainer needs
# more than that to start; a smaller value is nearly always a bare number meant as Mi.
MIN_MEMORY_BYTES = 16 * 2**20
# What one worker may ask for: far beyond any machine, near enough to catch a typo.
MAX_WORKER_CPU_MILLI = 10_000 * 1000
MAX_WORKER_MEMORY_BYTES = 2**50  # 1Pi
MAX_WORKER_GPUS = 1024
# Passes of the data: a bound only so that a number nobody means (10^30) is refused.
MAX_PASSES = 10**6
# The environment goes to execve with the arguments: Linux allows 2 MiB for both
# together, and 128 KiB for one string (checked per variable below).
MAX_ENV_VARS = 1000
MAX_ENTRY_BYTES = 64 * 1024
MAX_ENV_BYTES = 256 * 1024

# --- Strings ---------------------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_TOKEN = re.compile(r"^[^\s\x00-\x1f\x7f]+$")
_DATACENTER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
MAX_PATH_LENGTH = 4096

# The original body's spellings: original name → canonical name.
ORIGINAL_NAMES = {"job_package": "package", "parallelism": "trainers"}

_Count = Annotated[int, Field(strict=True)]


def _error(kind: str, message: str) -> PydanticCustomError:
    # No context: the message is final, and braces a user typed stay literal.
    return PydanticCustomError(kind, message)


class JobSpec(BaseModel):
    """A validated job spec; frozen, and equal to itself after `to_dict` and back.

    Quantities keep the user's spelling (`cpu="500m"`) for display; `cpu_milli`,
    `memory_bytes`, `pscpu_milli`, `psmemory_bytes` and `disk_bytes` give their values.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: str
    # A PFS path: absolute (`/pfs/<dc>/...`) or relative to the user's home; resolved
    # and authorised when the job is submitted, not here.
    package: str
    entry: str = "python train.py"
    # What parameter servers run; None: the same entry, told TRAINING_ROLE=PSERVER (as
    # Paddle's fleet does). The original product's `-psentry`.
    psentry: str | None = None
    image: str | None = None
    registry: str | None = None  # the name of saved registry credentials
    trainers: Annotated[_Count, Field(ge=1, le=MAX_TRAINERS)] = 1
    pservers: Annotated[_Count, Field(ge=0, le=MAX_PSERVERS)] = 0
    cpu: str | int | float = DEFAULT_CPU  # per trainer
    gpu: Annotated[_Count, Field(ge=0, le=MAX_WORKER_GPUS)] = 0  # per trainer
    memory: str | int = DEFAULT_MEMORY  # per trainer
    pscpu: str | int | float = DEFAULT_CPU  # per parameter server
    psmemory: str | int = DEFAULT_MEMORY  # per parameter server
    disk: str | int = DEFAULT_DISK  # per worker, parameter servers included
    passes: Annotated[_Count, Field(ge=1, le=MAX_PASSES)] | None = None
    # The original's entry script within the package: a submission with it and no entry
    # runs `python <topology>` (parse_submission); kept as sent, for display.
    topology: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    datacenter: str | None = None
    input: str | None = None
    output: str | None = None
    # 0: a failing trainer fails the job at once, with the exit reason. Most failures
    # (a bug, out of memory, a bad path) fail again on every retry and only delay the
    # answer while holding the cluster; a job that checkpoints opts in.
    max_restarts: Annotated[_Count, Field(ge=0, le=MAX_RESTARTS)] = 0

    @model_validator(mode="wrap")
    @classmethod
    def _original_body(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        """Accept the original body's spellings, and report errors under the name sent."""
        if not isinstance(data, dict):
            return handler(data)
        data = dict(data)
        sent_as: dict[str, str] = {}  # canonical → original, for names the user sent
        conflicts: list[InitErrorDetails] = []
        for original, canonical in ORIGINAL_NAMES.items():
            if original not in data:
                continue
            if canonical in data:
                conflicts.append(
                    InitErrorDetails(
                        type=_error(
                            "conflicting_fields",
                            f"give either {canonical!r} or {original!r} (its original name), not both",
                        ),
                        loc=(original,),
                        input=data.pop(original),
                    )
                )
            else:
                data[canonical] = data.pop(original)
                sent_as[canonical] = original
        try:
            spec = handler(data)
        except ValidationError as exc:
            if not (conflicts or sent_as):
                raise
            found = [_relocated(error, sent_as) for error in exc.errors()]
            raise ValidationError.from_exception_data(exc.title, [*conflicts, *found]) from None
        if conflicts:
            raise ValidationError.from_exception_data(cls.__name__, conflicts)
        return spec

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        problem = _name_problem(value)
        if problem:
            raise _error("job_name", f"{value!r} {_NAME_RULE}; {problem}")
        return value

    @field_validator("package")
    @classmethod
    def _package(cls, value: str) -> str:
        return _pfs_path(value)

    @field_validator("input", "output")
    @classmethod
    def _optional_path(cls, value: str | None) -> str | None:
        return None if value is None else _pfs_path(value)

    @field_validator("entry")
    @classmethod
    def _entry(cls, value: str) -> str:
        if not value.strip():
            raise _error("entry", "the command to run must not be empty (the default is 'python train.py')")
        return _command("entry", value)

    @field_validator("psentry")
    @classmethod
    def _psentry(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise _error("psentry", "the parameter servers' command must not be empty (leave it out)")
        return None if value is None else _command("psentry", value)

    @field_validator("image", "registry")
    @classmethod
    def _token(cls, value: str | None) -> str | None:
        if value is not None and not _TOKEN.match(value):
            raise _error("token", f"{value!r} must be non-empty, without spaces or control characters")
        return value

    @field_validator("topology")
    @classmethod
    def _topology(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise _error("topology", "must not be empty; leave it out instead")
        return value

    @field_validator("datacenter")
    @classmethod
    def _datacenter(cls, value: str | None) -> str | None:
        if value is not None and not _DATACENTER.match(value):
            raise _error(
                "datacenter",
                f"{value!r} may contain only letters, digits, '.', '_' and '-', starting with a "
                "letter or digit (at most 63 characters)",
            )
        return value

    # `before`: a wrong type gets one message naming the field, not one per union member.
    @field_validator("cpu", "pscpu", mode="before")
    @classmethod
    def _cpu(cls, value: Any) -> Any:
        milli = _quantity(parse_cpu_milli, value, "such as 500m or 2")
        if milli <= 0:
            raise _error("quantity", f"{value!r} must be more than 0 (such as 500m or 2)")
        if milli > MAX_WORKER_CPU_MILLI:
            raise _error("quantity", f"{value!r} is more than a worker may ask for (at most 10000 CPUs)")
        return value

    # disk too: the unpacked package alone needs some, and a bare number is bytes.
    @field_validator("memory", "psmemory", "disk", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> Any:
        if isinstance(value, float):
            raise _error("quantity", f"{value!r}: give a whole number of bytes or a string such as '1Gi'")
        size = _quantity(parse_bytes, value, "such as 512Mi or 1Gi")
        if size < MIN_MEMORY_BYTES:
            bare = isinstance(value, int) or value.strip().isdigit()
            hint = f"; a bare number is bytes: did you mean '{value}Mi'?" if bare and size > 0 else ""
            raise _error("quantity", f"{value!r} is too small: at least 16Mi{hint}")
        if size > MAX_WORKER_MEMORY_BYTES:
            raise _error("quantity", f"{value!r} is more than a worker may ask for (at most 1Pi)")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > MAX_ENV_VARS:
            raise _error("env", f"{len(value)} variables: at most {MAX_ENV_VARS} may be set")
        total = sum(len(f"{k}={v}".encode(errors="surrogatepass")) + 1 for k, v in value.items())
        if total > MAX_ENV_BYTES:
            raise _error("env", f"{total} bytes in all: at most {MAX_ENV_BYTES // 1024} KiB may be set")
        problems = [p for key, val in value.items() if (p := _env_problem(key, val))]
        if problems:
            raise _error("env", "; ".join(problems))
        return value

    @property
    def cpu_milli(self) -> int:
        return parse_cpu_milli(self.cpu)

    @property
    def memory_bytes(self) -> int:
        return parse_bytes(self.memory)

    @property
    def pscpu_milli(self) -> int:
        return parse_cpu_milli(self.pscpu)

    @property
    def psmemory_bytes(self) -> int:
        return parse_bytes(self.psmemory)

    @property
    def disk_bytes(self) -> int:
        return parse_bytes(self.disk)

    def to_dict(self) -> dict[str, Any]:
        """Every field under its canonical name, defaults included, as JSON-able values.

        Defaults are written out so a stored job keeps what it ran with if they change.
        """
        return self.model_dump(mode="json")


_REGISTRY_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9._-]{0,62}$")


class RegistrySpec(BaseModel):
    """`POST /api/v1/registries`: credentials for one container registry, saved by name
    (`paddlecloud registry -username U -password P -server S -name N`)."""

    model_config = ConfigDict(extra="forbid", strict=True, hide_input_in_errors=True)

    name: str
    server: str
    username: str
    password: str = Field(repr=False, min_length=1, max_length=4096)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        # Looser than a job's name: the original docs write `-name N`. A Kubernetes backend
        # derives its Secret's name (lowercase, DNS-1123) from it, never uses it as is.
        if not _REGISTRY_NAME.match(value):
            raise _error(
                "name",
                f"{value[:80]!r} is not a registry name: use letters, digits, '-', '_' and '.', "
                "starting with a letter (at most 63 characters)",
            )
        return value

    @field_validator("server", "username")
    @classmethod
    def _word(cls, value: str) -> str:
        if not _TOKEN.match(value) or len(value) > 512:
            raise _error("token", f"{value[:80]!r} must be non-empty, without spaces or control characters")
        return value

    def view(self) -> dict[str, Any]:
        """What the API shows of a saved registry: never the password."""
        return {"name": self.name, "server": self.server, "username": self.username}


def parse_submission(data: Any) -> JobSpec:
    """The spec of a `POST /api/v1/jobs` body, in the current or the original spelling.

    The original body's `job_package` and `parallelism` stand for `package` and
    `trainers`; a body giving both spellings of one field is refused, naming both. A
    `topology` without an `entry` runs `python <topology>`.
    Raises `ValidationError`, with each error's `loc` the field name the user sent.
    """
    if isinstance(data, dict) and isinstance(data.get("topology"), str) and data["topology"].strip():
        data = _topology_entry(data)
    return JobSpec.model_validate(data)


def _topology_entry(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with the entry its `topology` names: the original PaddleCloud's `-topology`
    is the script each worker runs, within the package. Accepted and left unused, it would
    run `python train.py` instead, so a topology that cannot be run so is refused."""
    topology: str = data["topology"]
    runs = f"python {shlex.quote(topology)}"
    path = PurePosixPath(topology)
    problem = None
    if path.is_absolute() or ".." in path.parts:
        problem = (
            f"{topology!r} must be a path within the package, such as modules/train.py: "
            "the topology is the script each worker runs (python FILE, in the package)"
        )
    elif data.get("entry") not in (None, runs):
        problem = (
            "give either 'entry' or 'topology' (the script to run as python FILE), not both: "
            f"the topology would run {runs!r}, the entry {data['entry']!r}"
        )
    if problem is not None:
        details = InitErrorDetails(type=_error("topology", problem), loc=("topology",), input=topology)
        raise ValidationError.from_exception_data(JobSpec.__name__, [details])
    return {**data, "entry": runs}


def _relocated(error: Any, sent_as: dict[str, str]) -> InitErrorDetails:
    loc = tuple(error["loc"])
    if loc and loc[0] in sent_as:
        loc = (sent_as[loc[0]], *loc[1:])
    # The message is already rendered; keeping the type keeps `extra_forbidden` & co.
    return InitErrorDetails(type=_error(error["type"], error["msg"]), loc=loc, input=error["input"])


# Kubernetes puts kube-root-ca.crt in every namespace, and the namespace's own objects are
# paddlecloud-*: a job's owner ConfigMap, named after the job, must not meet them.
RESERVED_NAME_PREFIXES = ("kube-", "paddlecloud-")


def _name_problem(value: str) -> str | None:
    if not value:
        return "it is empty"
    bad = sorted(set(value) - _NAME_CHARS)
    if bad:
        shown = ", ".join(repr(c) for c in bad)
        upper = " (names are lowercase)" if any(c.isupper() for c in bad) else ""
        return f"{shown} {'is' if len(bad) == 1 else 'are'} not allowed{upper}"
    if len(value) > MAX_NAME_LENGTH:
        return (
            f"it is {len(value)} characters long, and Kubernetes names such as "
            f"'<name>-pserver' must fit in 63 characters with a hash added"
        )
    if not value[0].isalpha():
        return (
            f"it starts with {value[0]!r}: the job's Kubernetes Service is named after it "
            "and must start with a letter"
        )
    for part in value.split("."):
        if not (part and part[0].isalnum() and part[-1].isalnum()):
            return "each part between dots must start and end with a letter or digit"
    if value.startswith(RESERVED_NAME_PREFIXES):
        return (
            f"names starting with {' or '.join(map(repr, RESERVED_NAME_PREFIXES))} are Kubernetes' "
            "and PaddleCloud's own (kube-root-ca.crt is in every namespace)"
        )
    return None


def _pfs_path(value: str) -> str:
    if not value:
        raise _error(
            "pfs_path", "a PFS path is required: /pfs/<datacenter>/home/<user>/... or relative to your home"
        )
    if _CONTROL.search(value):
        raise _error("pfs_path", f"{value!r} must not contain control characters")
    if len(value) > MAX_PATH_LENGTH:
        raise _error("pfs_path", f"is {len(value)} characters long; a PFS path is at most {MAX_PATH_LENGTH}")
    if value.startswith("/") and not value.startswith("/pfs/"):
        raise _error(
            "pfs_path",
            f"{value!r}: absolute PFS paths start with /pfs/<datacenter>/; "
            "a path without a leading '/' is relative to your home",
        )
    return value


def _quantity(parse: Callable[[Any], int], value: Any, example: str) -> int:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise _error("quantity", f"expected a quantity {example}, as a string or a number")
    try:
        return parse(value)
    except QuantityError as exc:
        raise _error("quantity", str(exc)) from None


def _command(kind: str, value: str) -> str:
    """A command for /bin/sh -c, passed in the environment too (ENTRY)."""
    if "\x00" in value:
        raise _error(kind, "must not contain a NUL character (it is passed in the environment)")
    if len(value.encode(errors="surrogatepass")) > MAX_ENTRY_BYTES:
        # One argument to /bin/sh -c and the value of ENTRY: Linux takes 128 KiB.
        raise _error(kind, f"is longer than {MAX_ENTRY_BYTES // 1024} KiB; put the command in a script")
    return value


def _env_problem(key: str, value: str) -> str | None:
    if not ENV_NAME.match(key):
        return (
            f"{key!r} is not an environment variable name: use letters, digits and '_', "
            "not starting with a digit"
        )
    if key in RESERVED_ENV:
        return f"{key!r} cannot be set: it is set by PaddleCloud for every process of a job"
    if "\x00" in value:
        return f"the value of {key!r} must not contain a NUL character"
    if len(f"{key}={value}".encode()) >= _MAX_ENV_STRING:
        return f"the value of {key!r} is too long: '{key}=value' must be under {_MAX_ENV_STRING} bytes"
    return None
