"""Where this training process stands in its PaddleCloud job, read from the runtime environment.

Every process of a job gets the variables of the runtime contract (DESIGN.md §4). The
functions here read them at call time; `info()` takes a snapshot, and every function
accepts an explicit `environ` mapping so tests need not touch `os.environ`.

A program is "under PaddleCloud" when `PADDLE_JOB_NAME` is set. Run by hand, outside
PaddleCloud, it is the only trainer of a job without parameter servers: `trainer_id()`
is 0, `trainer_count()` 1, `role()` TRAINER, `pserver_endpoints()` empty — so a
training script can be tried locally unchanged. Values that have no honest local
default (job name, user, datacenter, PFS home, output directory) raise `RuntimeError`
saying the program is not running under PaddleCloud and which variable is missing.
Under PaddleCloud a missing variable is an error, never a default.

Each value is looked up under the PaddleCloud name first and then under the Paddle
fleet and v1/v2 names of the contract, so code run by other launchers works too.
Note that `PADDLE_INIT_TRAINER_COUNT` is *not* the number of trainers — in Paddle v1 it
is the number of threads per trainer — so it is never used for `trainer_count()`.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "Role",
    "RuntimeInfo",
    "current_endpoint",
    "datacenter",
    "in_paddlecloud",
    "info",
    "job_name",
    "output_dir",
    "passes",
    "pfs_home",
    "pserver_endpoints",
    "role",
    "trainer_count",
    "trainer_id",
    "user",
]

_JOB_NAME = ("PADDLE_JOB_NAME",)
_TRAINER_ID = ("TRAINER_ID", "PADDLE_TRAINER_ID", "PADDLE_INIT_TRAINER_ID")
_TRAINER_COUNT = ("TRAINERS", "PADDLE_TRAINERS_NUM", "PADDLE_INIT_NUM_GRADIENT_SERVERS")
_ROLE = ("TRAINING_ROLE",)
_PSERVER_COUNT = ("PSERVERS",)
_PSERVER_LIST = ("PADDLE_PSERVERS_IP_PORT_LIST",)
_CURRENT_ENDPOINT = ("PADDLE_CURRENT_ENDPOINT",)
_DATACENTER = ("PADDLE_CLOUD_CURRENT_DATACENTER",)
_USER = ("PADDLE_CLOUD_USER",)
_PFS_HOME = ("PADDLE_CLOUD_PFS_HOME",)
_OUTPUT = ("PADDLE_CLOUD_OUTPUT",)
_PASSES = ("PADDLE_INIT_NUM_PASSES",)


class Role(enum.StrEnum):
    """What a process of a job does."""

    PSERVER = "PSERVER"
    TRAINER = "TRAINER"


@dataclass(frozen=True)
class RuntimeInfo:
    """A snapshot of the runtime environment; None where a variable is absent.

    `trainer_id` is None for a parameter server (it has no trainer id). The
    module-level functions are the strict interface: they raise where this holds None.
    """

    in_paddlecloud: bool
    job_name: str | None
    role: Role
    trainer_id: int | None
    trainer_count: int
    pserver_endpoints: tuple[str, ...]
    current_endpoint: str | None
    datacenter: str | None
    user: str | None
    pfs_home: str | None
    output_dir: str | None
    passes: int | None


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def _lookup(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return name, value
    return None


def _missing(env: Mapping[str, str], names: tuple[str, ...]) -> RuntimeError:
    wanted = " or ".join(names)
    job = env.get("PADDLE_JOB_NAME", "").strip()
    if job:
        return RuntimeError(f"{wanted} is not set in the runtime environment of PaddleCloud job {job!r}")
    return RuntimeError(f"this program is not running under PaddleCloud: {wanted} is not set")


def _int(env: Mapping[str, str], names: tuple[str, ...], minimum: int) -> int | None:
    found = _lookup(env, names)
    if found is None:
        return None
    name, value = found
    try:
        number = int(value)
    except ValueError:
        raise RuntimeError(f"{name}={value!r} is not an integer") from None
    if number < minimum:
        raise RuntimeError(f"{name}={value!r} must be at least {minimum}")
    return number


def _str(env: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    found = _lookup(env, names)
    return None if found is None else found[1]


def _required(env: Mapping[str, str], names: tuple[str, ...]) -> str:
    value = _str(env, names)
    if value is None:
        raise _missing(env, names)
    return value


def _endpoint(name: str, text: str) -> str:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RuntimeError(f"{name} holds {text!r}, which is not a host:port endpoint")
    return f"{host}:{port}"


def in_paddlecloud(environ: Mapping[str, str] | None = None) -> bool:
    """True when this process was started by PaddleCloud (`PADDLE_JOB_NAME` is set)."""
    return _lookup(_env(environ), _JOB_NAME) is not None


def job_name(environ: Mapping[str, str] | None = None) -> str:
    """The job's name; raises RuntimeError outside PaddleCloud."""
    return _required(_env(environ), _JOB_NAME)


def role(environ: Mapping[str, str] | None = None) -> Role:
    """PSERVER or TRAINER; TRAINER when run by hand."""
    env = _env(environ)
    found = _lookup(env, _ROLE)
    if found is None:
        if in_paddlecloud(env):
            raise _missing(env, _ROLE)
        return Role.TRAINER
    name, value = found
    try:
        return Role(value.upper())
    except ValueError:
        raise RuntimeError(f"{name}={value!r} is neither PSERVER nor TRAINER") from None


def trainer_count(environ: Mapping[str, str] | None = None) -> int:
    """How many trainers the job has; 1 when run by hand."""
    env = _env(environ)
    count = _int(env, _TRAINER_COUNT, minimum=1)
    if count is None:
        if in_paddlecloud(env):
            raise _missing(env, _TRAINER_COUNT)
        return 1
    return count


def trainer_id(environ: Mapping[str, str] | None = None) -> int:
    """This trainer's index in [0, trainer_count()), stable across restarts; 0 when run by hand.

    Raises RuntimeError in a parameter server, which has no trainer id.
    """
    env = _env(environ)
    tid = _int(env, _TRAINER_ID, minimum=0)
    if tid is None:
        if in_paddlecloud(env):
            raise _missing(env, _TRAINER_ID)
        return 0
    count = trainer_count(env)
    if tid >= count:
        raise RuntimeError(f"trainer id {tid} is out of range for {count} trainers")
    return tid


def pserver_endpoints(environ: Mapping[str, str] | None = None) -> list[str]:
    """The parameter servers as "host:port" strings, in index order; empty if there are none.

    Read from `PADDLE_PSERVERS_IP_PORT_LIST`, else built from `PADDLE_INIT_PSERVERS`
    (hosts) and `PADDLE_INIT_PORT`. Raises RuntimeError when `PSERVERS` says the job has
    parameter servers but neither list is set.
    """
    env = _env(environ)
    found = _lookup(env, _PSERVER_LIST)
    if found is not None:
        name, value = found
        return [_endpoint(name, item) for item in value.split(",") if item.strip()]
    hosts = _str(env, ("PADDLE_INIT_PSERVERS",))
    port = _str(env, ("PADDLE_INIT_PORT",))
    if hosts is not None and port is not None:
        return [
            _endpoint("PADDLE_INIT_PSERVERS", f"{h.strip()}:{port}") for h in hosts.split(",") if h.strip()
        ]
    if _int(env, _PSERVER_COUNT, minimum=0):
        raise _missing(env, _PSERVER_LIST)
    return []


def current_endpoint(environ: Mapping[str, str] | None = None) -> str | None:
    """This process's own "host:port" (`PADDLE_CURRENT_ENDPOINT`), or None if it has none."""
    env = _env(environ)
    found = _lookup(env, _CURRENT_ENDPOINT)
    return None if found is None else _endpoint(*found)


def datacenter(environ: Mapping[str, str] | None = None) -> str:
    """The datacenter the job runs in; raises RuntimeError outside PaddleCloud."""
    return _required(_env(environ), _DATACENTER)


def user(environ: Mapping[str, str] | None = None) -> str:
    """The user who submitted the job; raises RuntimeError outside PaddleCloud."""
    return _required(_env(environ), _USER)


def pfs_home(environ: Mapping[str, str] | None = None) -> str:
    """The user's PFS home, `/pfs/<datacenter>/home/<user>`; raises RuntimeError outside PaddleCloud."""
    return _required(_env(environ), _PFS_HOME)


def output_dir(environ: Mapping[str, str] | None = None) -> str:
    """Where the job should write its output; raises RuntimeError outside PaddleCloud."""
    return _required(_env(environ), _OUTPUT)


def passes(environ: Mapping[str, str] | None = None) -> int | None:
    """The number of passes the job was submitted with (`PADDLE_INIT_NUM_PASSES`), or None."""
    return _int(_env(environ), _PASSES, minimum=0)


def info(environ: Mapping[str, str] | None = None) -> RuntimeInfo:
    """Snapshot the runtime environment; malformed values raise RuntimeError, absent ones are None."""
    env = dict(_env(environ))
    under = in_paddlecloud(env)
    the_role = role(env)
    return RuntimeInfo(
        in_paddlecloud=under,
        job_name=_str(env, _JOB_NAME),
        role=the_role,
        trainer_id=None if the_role is Role.PSERVER else trainer_id(env),
        trainer_count=trainer_count(env),
        pserver_endpoints=tuple(pserver_endpoints(env)),
        current_endpoint=current_endpoint(env),
        datacenter=_str(env, _DATACENTER),
        user=_str(env, _USER),
        pfs_home=_str(env, _PFS_HOME),
        output_dir=_str(env, _OUTPUT),
        passes=passes(env),
    )
