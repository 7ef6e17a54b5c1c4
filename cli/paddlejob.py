"""Jobs from Python: `PaddleJob` submits, follows and kills a job; the job states the SDK knows.

Quick start::

    from paddlecloud import Client, PaddleJob

    with Client("http://127.0.0.1:8080", "alice", "secret") as client:
        job = PaddleJob(
            "fit-a-line",
            package="./examples/fit_a_line",  # a local directory: packed and uploaded if new
            entry="python train.py",
            trainers=2,
            pservers=2,
            memory="1Gi",
            env={"LEARNING_RATE": "0.01"},
        )
        job.submit(client)
        for entry in job.logs(follow=True):
            print(entry.text)  # [trainer-0] ...
        print(job.wait().state)  # SUCCEEDED, FAILED or KILLED

Answers are typed (`paddlecloud.answers`: `Job` with its `Worker`s and `Event`s, `LogEntry`),
and read as the server's dicts too (`job.wait()["state"]`). `AsyncClient` has the same calls
as coroutines (`submit_package`, `job`, `jobs`, `logs`, `wait`, `kill`, `package`) for code
that already runs an event loop.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from .answers import ACTIVE_STATES, FINAL_STATES, DryRun, Job, LogEntry
from .errors import PaddleCloudError
from .pfspaths import is_remote

if TYPE_CHECKING:
    from .client import Client

__all__ = [
    "ACTIVE_STATES",
    "FINAL_STATES",
    "JobWaitTimeout",
    "LogStreamLost",
    "PaddleJob",
    "log_text",
    "pfs_package",
]

# The spec's optional fields (DESIGN §4), in the order `get job` shows them. `name` and
# `package` are always sent; everything else only when given, so the server's defaults apply.
SPEC_FIELDS = (
    "entry",
    "psentry",
    "image",
    "registry",
    "trainers",
    "pservers",
    "cpu",
    "gpu",
    "memory",
    "pscpu",
    "psmemory",
    "disk",
    "passes",
    "topology",
    "env",
    "datacenter",
    "input",
    "output",
    "max_restarts",
)


class JobWaitTimeout(PaddleCloudError):
    """`wait` gave up before the job reached a final state; `job` is its last known document."""

    def __init__(self, name: str, timeout: float, job: Mapping[str, Any]) -> None:
        self.job = dict(job)
        super().__init__(
            f"job {name} is still {job.get('state', 'unknown')} after {timeout:g}s "
            f"({job.get('reason') or 'no reason given'})"
        )


class LogStreamLost(PaddleCloudError):
    """A log stream broke and could not be resumed in time; `cursor` is the last line received."""

    def __init__(self, name: str, seconds: float, reason: str, cursor: str | None) -> None:
        self.cursor = cursor
        super().__init__(
            f"lost the log stream of job {name} and could not reconnect for {seconds:g}s: {reason}"
        )


def log_text(entry: Mapping[str, Any]) -> str:
    """One log entry as the text stream shows it: `[trainer-0] text` (see `LogEntry.text`)."""
    return (entry if isinstance(entry, LogEntry) else LogEntry.from_dict(entry)).text


def pfs_package(package: str) -> str | None:
    """The PFS path a package argument names (`/pfs/...`, `pfs:x` → `x`), or None for a local path."""
    if not is_remote(package):
        return None
    return package.removeprefix("pfs:")


@dataclass
class PaddleJob:
    """A job to submit from Python, made of the fields `paddlecloud submit` takes.

    `package` is a local directory (packed reproducibly and uploaded only if PFS does not
    hold that exact package yet), a local `.tar.gz`/`.zip`, or a PFS path (`/pfs/...`, or
    `pfs:x` for `x` in your home). Fields left as None are not sent: the server's defaults
    apply (one trainer, no parameter servers, 1 CPU, 1Gi, `python train.py`; DESIGN §4).

    After `submit(client)` the job remembers its client: `wait()`, `logs()`, `status()` and
    `kill()` need no arguments. See the module's docstring for an example.
    """

    name: str
    package: str | os.PathLike[str]
    entry: str | None = None
    trainers: int | None = None
    pservers: int | None = None
    cpu: str | int | float | None = None
    gpu: int | None = None
    memory: str | None = None
    pscpu: str | int | float | None = None
    psmemory: str | None = None
    disk: str | None = None
    passes: int | None = None
    image: str | None = None
    registry: str | None = None
    topology: str | None = None
    env: dict[str, str] | None = None
    datacenter: str | None = None
    input: str | None = None
    output: str | None = None
    max_restarts: int | None = None
    # What parameter servers run; None: the entry, told TRAINING_ROLE=PSERVER.
    psentry: str | None = None
    # The server's last word on the job, and the client it was submitted with.
    job: Job | None = field(default=None, init=False, repr=False)
    _client: Client | None = field(default=None, init=False, repr=False)

    def spec(self, package_path: str | None = None) -> dict[str, Any]:
        """The spec `submit` sends: name, package, and each field that is not None."""
        given = {f.name: getattr(self, f.name) for f in fields(self)}
        spec: dict[str, Any] = {"name": self.name, "package": package_path or os.fspath(self.package)}
        spec.update({key: given[key] for key in SPEC_FIELDS if given.get(key) is not None})
        return spec

    def submit(self, client: Client, *, dry_run: bool = False) -> Job | DryRun:
        """Upload the package if needed and start the job; returns the server's `Job`.

        With `dry_run` nothing is uploaded or started: the server checks the spec and the
        quota and returns the plan (`DryRun`); a local package not uploaded yet is then
        reported missing by the server, which is expected. See `Client.submit_package`.
        """
        answer = client.submit_package(self.spec(), self.package, dry_run=dry_run)
        self._client = client
        if isinstance(answer, Job):
            self.job = answer
        return answer

    @property
    def client(self) -> Client:
        if self._client is None:
            raise PaddleCloudError(f"job {self.name} was not submitted from here: call submit(client) first")
        return self._client

    def attach(self, client: Client) -> PaddleJob:
        """Use `client` for a job submitted earlier (by the CLI, say); returns self."""
        self._client = client
        return self

    def status(self) -> Job:
        """The job now, with its `events` and `workers`."""
        job = self.job = self.client.job(self.name)
        return job

    def wait(self, timeout: float | None = None) -> Job:
        """Block until the job is SUCCEEDED, FAILED or KILLED and return it; `JobWaitTimeout` if
        `timeout` seconds pass first."""
        job = self.job = self.client.wait(self.name, timeout=timeout)
        return job

    def logs(
        self,
        *,
        follow: bool = False,
        tail: int | None = None,
        role: str | None = None,
        worker: str | list[str] | None = None,
    ) -> Iterator[LogEntry]:
        """Log entries (worker, line, cursor); with `follow`, until the job ends."""
        return self.client.logs(self.name, tail=tail, follow=follow, role=role, worker=worker)

    def kill(self, rm: bool = False) -> Job | None:
        """Stop the job (KILLED); with `rm` also forget it and its logs (returns None then)."""
        answer = self.client.kill(self.name, rm=rm)
        self.job = answer
        return answer
