"""The per-job supervisor of the local backend: `python -m paddlecloud.jobs.local.supervisor JOB_DIR`.

It reads `JOB_DIR/plan.json` (a `Plan`), starts the parameter servers, waits until each
accepts TCP connections, starts the trainers, restarts failed workers up to
`max_restarts` each, and exits once the job is final. What it leaves behind:

- `state.json`: the job's and every worker's state, replaced atomically on each change;
- `events.jsonl`: one line per notable event (`time`, `type`, `reason`, `message`);
- `logs/<worker>.log`: the worker's stdout and stderr, restarts marked by a line, copied
  there from a pipe by the supervisor and capped (`caplog.py`);
- `supervisor.log`: its own output (its stdout and stderr are redirected there, so it
  outlives a jobs service that started it with pipes).

Working directories. DESIGN §4 wants the job package as the working directory *and*
per-trainer `trainer_id`/`trainer_count` files in it; several trainers on one machine
cannot share one directory for that. Each worker therefore runs in
`JOB_DIR/work/<worker>/`, filled with a symlink to every top-level entry of the package
plus its own two files (a package's own `trainer_id`/`trainer_count` are shadowed).
Relative paths into the package, `python train.py` and sibling imports work as before.
Trade-offs: a new top-level file a worker creates stays private to it, whereas writes
into existing package entries go through the symlinks to the shared package (as with
a shared volume on Kubernetes); `os.getcwd()` is the worker directory, not
`TRAINER_PACKAGE`; entries added to the package after the start are not seen. A copy
would isolate writes completely, at the cost of copying data sets once per worker.

Processes. Each worker is its own session and process group, led by
`paddlecloud.jobs.local.launch`, which stays the parent of everything the worker runs
and SIGKILLs the group if the supervisor dies, even by SIGKILL (PR_SET_PDEATHSIG). A
worker is stopped with SIGTERM to its group, `grace_seconds`, then SIGKILL to the group;
once a worker has finished on its own, whatever it left in its group is SIGKILLed.
Workers get the plan's environment over a short list of the supervisor's own variables
(`PATH`, `HOME`, locale...), never the rest of it, which belongs to the jobs service.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from paddlecloud.common import beneath, netns, sandbox, trees
from paddlecloud.common.cgroups import CGROUP_ROOT, Hierarchy, Limits
from paddlecloud.common.diskuse import allocated_beneath
from paddlecloud.common.quantity import format_bytes, readable_bytes
from paddlecloud.common.sandbox import Bind, Command, View
from paddlecloud.common.seccomp import SeccompUnavailable, filter_program

from ..exits import WORKER_STOPPED, describe_exit, exit_status
from . import claim
from .caplog import CappedLog, LogClock
from .launch import fork_launcher
from .plan import STOP_REASON, Plan, Role, Worker

PORT_POLL_SECONDS = 0.1
# Where a sandboxed worker finds its own working directory (the package mirrored).
WORKDIR = "/job/work"
# Device nodes a worker with GPUs needs besides its own: the driver's control nodes.
NVIDIA_SHARED_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
MAX_RESTART_DELAY_SECONDS = 30.0
# How long a worker's output pipe may stay open once its group is gone (only a process that
# left the group holds it then): what it writes later is not read.
PIPE_DRAIN_SECONDS = 1.0
# How often a job's package and working directories are measured against their bound.
DISK_CHECK_SECONDS = 2.0
# The size of a sandboxed worker's /tmp when its plan gives it no memory limit.
DEFAULT_TMP_BYTES = 2**30
INHERITED_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")


class JobState(StrEnum):
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    KILLED = "KILLED"


class WorkerState(StrEnum):
    PENDING = "PENDING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    KILLED = "KILLED"
    STOPPED = WORKER_STOPPED  # a parameter server stopped once every trainer exited 0


_FINAL_WORKER_STATES = {WorkerState.SUCCEEDED, WorkerState.FAILED, WorkerState.KILLED, WorkerState.STOPPED}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class WorkerStatus:
    """What state.json says about one worker."""

    name: str
    role: Role
    index: int
    host: str
    state: WorkerState = WorkerState.PENDING
    restarts: int = 0
    pid: int | None = None
    started_at: str | None = None
    exit_code: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role.value,
            "index": self.index,
            "state": self.state.value,
            "restarts": self.restarts,
            "pid": self.pid,
            "started_at": self.started_at,
            "exit_code": self.exit_code,
            "host": self.host,
        }


def write_atomically(path: Path, text: str, *, durable: bool = True) -> None:
    """Replace `path` with `text`: temporary file, rename; `durable` adds an fsync of both
    the file and the directory, so the new text survives a crash of the machine too."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if not durable:
        return
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def prepare_workdir(
    workdir: Path,
    package: Path,
    *,
    trainer_id: int,
    trainer_count: int,
    seen_at: str | None = None,
    within: Path | None = None,
) -> None:
    """Mirror `package` in `workdir` with symlinks and add the worker's own id files.

    The links point into `seen_at`, where the worker sees the package (its sandbox's
    path for it), or into `package` itself. `within` is the directory a user could write
    that holds the package (their home): the package is then listed through a descriptor
    opened beneath it, through no symlink, so that a job which swapped a directory on the
    way for a link does not have root list a directory of root's for it (LinkRefused)."""
    workdir.mkdir(parents=True, exist_ok=True)
    own = {"trainer_id": str(trainer_id), "trainer_count": str(trainer_count)}
    target = Path(seen_at) if seen_at is not None else package.absolute()
    for name in _package_names(package, within):
        link = workdir / name
        if name not in own and not link.is_symlink():
            link.symlink_to(target / name)
    for name, value in own.items():
        # Remade with the workers; a crash of the machine ends the job anyway.
        write_atomically(workdir / name, value + "\n", durable=False)


def _package_names(package: Path, within: Path | None) -> list[str]:
    if within is None:
        return os.listdir(package)
    top = beneath.open_top(within)
    try:
        fd = beneath.open_beneath(top, os.path.relpath(package, within), os.O_RDONLY | os.O_DIRECTORY)
    finally:
        os.close(top)
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def _bind_holding(path: str, binds: Iterable[Bind]) -> Path | None:
    """The source of the bind that `path` lies in (the deepest), if any."""
    holding = [b.source for b in binds if path == b.source or path.startswith(b.source.rstrip("/") + "/")]
    return Path(max(holding, key=len)) if holding else None


class JobSupervisor:
    """Runs one job's plan to a final state; `run()` returns that state."""

    def __init__(
        self,
        job_dir: Path,
        plan: Plan,
        first_groups: dict[str, list[Path]] | None = None,
        warnings: Iterable[tuple[str, str]] = (),
    ) -> None:
        self._job_dir = job_dir
        self._warnings = list(warnings)  # (reason, message): Warning events at the start
        self._plan = plan
        self._logs = job_dir / "logs"
        self._state = JobState.RUNNING
        self._reason = "starting"
        self._started_at = _now()
        self._finished_at: str | None = None
        self._workers = {
            w.name: WorkerStatus(name=w.name, role=w.role, index=w.index, host=w.host) for w in plan.workers
        }
        self._ready = {w.name: asyncio.Event() for w in plan.pservers}
        self._port_deadline = 0.0
        # Where a worker that is stopped, not failed, ends: KILLED unless the job succeeded.
        self._stopped_as = WorkerState.KILLED
        self._sandbox = sandbox.detect("required", "jobs") if plan.sandbox is not None else None
        self._hierarchy = hierarchy_of(plan)
        self._oom: dict[str, str | None] = {}
        # Each worker's groups for its first run, where the zygote made them (`zygote`);
        # a run without them makes its own as it starts.
        self._first_groups = dict(first_groups or {})
        self._trainers_started = False
        self._log_files: dict[str, CappedLog] = {}
        self._log_clock = LogClock()  # one for all the job's logs: their lines merge by it
        self._pumps: dict[str, _Pump] = {}
        self._notifier: socket.socket | None = None
        if plan.notify is not None:
            self._notifier = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._notifier.setblocking(False)

    # -- the job ---------------------------------------------------------------------

    async def run(self) -> JobState:
        """Run the job until it is final or SIGTERM/SIGINT arrives; no worker survives it."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        self._logs.mkdir(parents=True, exist_ok=True)
        self._event("Normal", "JobRunning", f"supervisor {os.getpid()} started the job")
        for reason, message in self._warnings:
            self._event("Warning", reason, message)
        self._write_state()
        job = asyncio.create_task(self._run_job(), name="local-job")
        stopping = asyncio.create_task(stop.wait(), name="local-job-stop-signal")
        disk = asyncio.create_task(self._watch_disk(), name="local-job-disk")
        await asyncio.wait({job, stopping, disk}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        disk.cancel()
        if job.done():
            try:
                state, reason = job.result()
            except Exception as exc:  # a bug here must still end the job cleanly, and say so
                state, reason = JobState.FAILED, f"supervisor error: {exc!r}"
        else:
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job
            state, reason = JobState.KILLED, self._stop_reason()
            if disk.done() and not disk.cancelled() and disk.exception() is None:
                state, reason = JobState.FAILED, disk.result()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        self._remove_unused_cgroups()
        # An archive unpacked for the job goes with it (the archive stays in PFS); logs and
        # output stay. Whatever a job left there (any depth, any symlink), its end is
        # recorded: a leftover is only said.
        try:
            trees.remove_path(self._job_dir / "package")
        except OSError as exc:
            print(f"paddlecloud supervisor: cannot remove the job's package: {exc}", file=sys.stderr)
        self._finish(state, reason)
        for log in self._log_files.values():
            log.close()
        if self._notifier is not None:
            self._notifier.close()
        return state

    async def _run_job(self) -> tuple[JobState, str]:
        """Parameter servers, then trainers once every server accepts connections."""
        for worker in self._plan.workers:
            try:
                self._prepare(worker)
            except beneath.LinkRefused as exc:
                return JobState.FAILED, f"the package cannot be read: {exc.filename}: {exc.strerror}"
        loop = asyncio.get_running_loop()
        self._port_deadline = loop.time() + self._plan.port_timeout_seconds
        tasks: dict[asyncio.Task[str | None], Worker] = {}
        stopped_as = WorkerState.KILLED
        try:
            failure = await self._start_pservers(tasks)
            if failure is None:
                failure = await self._run_trainers(tasks)
            if failure is not None:
                return JobState.FAILED, failure
            stopped_as = WorkerState.STOPPED
            return JobState.SUCCEEDED, "every trainer exited 0"
        finally:
            self._stopped_as = stopped_as
            await self._stop_all(tasks)

    async def _start_pservers(self, tasks: dict[asyncio.Task[str | None], Worker]) -> str | None:
        """Start every parameter server (its task into `tasks`) and wait until each accepts
        connections: None then, else why the job fails (a server stopped first)."""
        for worker in self._plan.pservers:
            tasks[asyncio.create_task(self._supervise(worker), name=f"local-{worker.name}")] = worker
        if not tasks:
            return None
        self._set_reason("waiting for parameter servers to accept connections")
        ready = asyncio.create_task(self._pservers_ready(), name="local-pservers-ready")
        try:
            await asyncio.wait({ready, *tasks}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        for task in tasks:
            if task.done():
                return task.result() or f"{tasks[task].name} stopped"
        self._event("Normal", "PserversReady", "every parameter server accepts connections")
        return None

    async def _run_trainers(self, tasks: dict[asyncio.Task[str | None], Worker]) -> str | None:
        """Start every trainer (its task into `tasks`, beside the servers') and wait: None
        once each has exited 0, else why the job fails (a trainer failed for good, or a
        server stopped)."""
        trainers = set()
        for worker in self._plan.trainers:
            task = asyncio.create_task(self._supervise(worker), name=f"local-{worker.name}")
            tasks[task] = worker
            trainers.add(task)
        self._trainers_started = True
        self._set_reason("trainers running")
        while trainers:
            done, _ = await asyncio.wait(
                [t for t in tasks if not t.done()], return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                failure = task.result()
                if task not in trainers or failure is not None:
                    return failure or f"{tasks[task].name} stopped"
                trainers.discard(task)
        return None

    async def _watch_disk(self) -> str:
        """Why the job must stop, once what it added to its package and working directories
        (on the platform's disk) passes the plan's bound; checked every DISK_CHECK_SECONDS,
        as the kubelet checks a pod's ephemeral storage. Never returns without a bound."""
        limit = self._plan.scratch_max_bytes
        if limit is None:
            await asyncio.Event().wait()
        assert limit is not None
        start = await asyncio.to_thread(self._scratch_bytes)
        while True:
            await asyncio.sleep(DISK_CHECK_SECONDS)
            added = await asyncio.to_thread(self._scratch_bytes) - start
            if added > limit:
                return (
                    f"the job wrote {readable_bytes(added)} into its package and working "
                    f"directories, more than the {format_bytes(limit)} a job may add to them on "
                    "this machine (its -disk per worker, at most jobs.scratch_max_bytes): write "
                    "outputs to PADDLE_CLOUD_OUTPUT"
                )

    def _scratch_bytes(self) -> int:
        """What the job's unpacked package and its workers' working directories hold."""
        return sum(allocated_beneath(self._job_dir / name).bytes for name in ("package", "work"))

    async def _pservers_ready(self) -> None:
        for event in self._ready.values():
            await event.wait()

    async def _stop_all(self, tasks: Iterable[asyncio.Task[str | None]]) -> None:
        """Stop every worker still running, all at once so their grace periods overlap."""
        running = [t for t in tasks if not t.done()]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    # -- one worker ------------------------------------------------------------------

    async def _supervise(self, worker: Worker) -> str | None:
        """Keep `worker` running: None when a trainer exits 0, else why it failed for good.

        A parameter server never succeeds by exiting; it runs until it is cancelled.
        Cancelling stops the worker's process group (grace, then SIGKILL).
        """
        status = self._workers[worker.name]
        try:
            while True:
                returncode, failure = await self._run_once(worker, status)
                if failure is not None:
                    self._worker_failed(status, failure)
                    return failure
                code = exit_status(returncode)
                status.exit_code = code
                if code == 0 and worker.role is Role.TRAINER:
                    self._update(status, WorkerState.SUCCEEDED)
                    self._event("Normal", "WorkerSucceeded", f"{worker.name} exited 0")
                    return None
                how = describe_exit(code, self._oom.get(worker.name))
                if worker.role is Role.PSERVER and code == 0:
                    how += " while the job was running"
                    if not self._trainers_started and status.restarts >= self._plan.max_restarts:
                        # The usual cause: one entry for both roles that ignores TRAINING_ROLE.
                        failure = (
                            f"{worker.name} exited before the trainers started: does your entry "
                            "handle TRAINING_ROLE=PSERVER, or should you set --pserver-entry?"
                        )
                        self._worker_failed(status, failure)
                        return failure
                if status.restarts >= self._plan.max_restarts:
                    plural = "" if status.restarts == 1 else "s"
                    failure = f"{worker.name} {how} after {status.restarts} restart{plural}"
                    self._worker_failed(status, failure)
                    return failure
                status.restarts += 1
                self._event(
                    "Warning",
                    "WorkerRestarting",
                    f"{worker.name} {how}; restart {status.restarts} of {self._plan.max_restarts}",
                )
                marker = f"--- restart {status.restarts} of {self._plan.max_restarts} after exit {code} ---"
                self._append_log(worker, marker)
                self._update(status, WorkerState.STARTING)
                await asyncio.sleep(self._restart_delay(status.restarts))
        except asyncio.CancelledError:
            if status.state not in _FINAL_WORKER_STATES:
                if self._stopped_as is WorkerState.STOPPED:
                    ended = "" if status.exit_code is None else f" (it exited with {status.exit_code})"
                    message = f"{worker.name} stopped by the platform: every trainer exited 0{ended}"
                    self._event("Normal", "WorkerStopped", message)
                self._update(status, self._stopped_as)
            raise

    async def _run_once(self, worker: Worker, status: WorkerStatus) -> tuple[int, str | None]:
        """Start the worker and wait for it: (its return code, None) or (-1, why it cannot run)."""
        proc = await self._spawn(worker)
        status.pid = proc.pid
        status.started_at = _now()
        status.exit_code = None
        self._update(status, WorkerState.STARTING)
        self._event("Normal", "WorkerStarted", f"{worker.name} started as pid {proc.pid}")
        try:
            if worker.port is not None and not self._ready[worker.name].is_set():
                failure = await self._wait_for_port(worker, proc)
                if failure is not None:
                    return -1, failure
            if proc.returncode is None:
                self._update(status, WorkerState.RUNNING)
            return await proc.wait(), None
        finally:
            try:
                await self._stop_process(worker, proc)
            finally:
                pump = self._pumps.pop(worker.name, None)
                if pump is not None:
                    await pump.finish()
            if proc.returncode is not None:  # also when stopped: how it ended is shown
                status.exit_code = exit_status(proc.returncode)
            self._oom[worker.name] = self._out_of_memory(worker)
            if self._hierarchy is not None:
                self._hierarchy.remove(self._cgroup_of(worker))

    async def _wait_for_port(self, worker: Worker, proc: Child) -> str | None:
        """Poll the server's port until it accepts, the process exits, or the deadline passes."""
        assert worker.port is not None
        loop = asyncio.get_running_loop()
        while proc.returncode is None:
            if await _accepts(worker.host, worker.port):
                self._ready[worker.name].set()
                message = f"{worker.name} accepts connections on port {worker.port}"
                self._event("Normal", "PserverReady", message)
                return None
            remaining = self._port_deadline - loop.time()
            if remaining <= 0:
                return (
                    f"{worker.name} did not accept connections on {worker.host}:{worker.port} "
                    f"within {self._plan.port_timeout_seconds:g} s"
                )
            await asyncio.sleep(min(PORT_POLL_SECONDS, remaining))
        return None  # it exited: the caller's wait() returns at once and decides on a restart

    async def _spawn(self, worker: Worker) -> Child:
        env = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}
        env["PYTHONUNBUFFERED"] = "1"  # log lines as they happen; the user's env may say otherwise
        # `python` in an entry is the job's built environment or the platform's Python
        # (with paddlecloud's helpers), not whichever one comes first on the PATH of the
        # shell that started the server.
        python = self._plan.python or sys.executable
        env["PATH"] = os.pathsep.join(filter(None, (os.path.dirname(python), env.get("PATH"))))
        if self._plan.python is not None:
            env["VIRTUAL_ENV"] = os.path.dirname(os.path.dirname(python))
        command = Command(list(worker.argv))
        if self._plan.sandbox is not None:
            # Inside, home is the private /tmp: the supervisor's own HOME is not there.
            user = worker.env.get("PADDLE_CLOUD_USER", "paddlecloud")
            env.update(HOME="/tmp", TMPDIR="/tmp", USER=user, LOGNAME=user)  # noqa: S108 - the sandbox's private /tmp
            assert self._sandbox is not None
            # Not tied to bwrap's own process, which the stop's SIGTERM kills at once: the
            # program must have its grace to end, and the launcher waits for it (launch.py).
            command = self._sandbox.wrap(self._view(worker), command.argv, die_with_parent=False)
        env.update(worker.env)
        groups = [str(group) for group in self._cgroups_for(worker)]
        # The worker writes into a pipe, and only this process writes its log (caplog.py):
        # the child gets its own copy of the pipe's end; ours is closed once it exists.
        try:
            out, into = os.pipe2(os.O_CLOEXEC)
            try:
                pid = fork_launcher(groups, command.argv, env, str(self._workdir(worker)), into, command.fds)
            except BaseException:
                os.close(out)
                raise
            finally:
                os.close(into)
        finally:
            command.close()
        self._pumps[worker.name] = _Pump(out, self._log(worker))
        return Child(pid)

    def _view(self, worker: Worker) -> View:
        """What a sandboxed worker sees: the plan's binds, its own working directory at
        WORKDIR, its id files at the root, its own /tmp, and its GPUs' device nodes."""
        boxed = self._plan.sandbox
        assert boxed is not None
        workdir = self._workdir(worker)
        binds = [
            *boxed.binds,
            Bind(str(workdir), WORKDIR, writable=True),
            Bind(str(workdir / "trainer_id"), "/trainer_id"),
            Bind(str(workdir / "trainer_count"), "/trainer_count"),
        ]
        if worker.devices:
            binds += [Bind(node, node, writable=True, device=True) for node in nvidia_nodes()]
        # /tmp (and /dev/shm) is a tmpfs as large as the worker's memory: what it holds is
        # memory, charged to the worker's cgroup, and bounded even where cgroups are not.
        tmp_size = worker.memory_bytes or DEFAULT_TMP_BYTES
        return View(uid=boxed.uid, gid=boxed.gid, binds=tuple(binds), cwd=WORKDIR, tmp_size=tmp_size)

    def _cgroups_for(self, worker: Worker) -> list[Path]:
        """Fresh groups for this run of `worker`: on its first run, the ones made beforehand."""
        made = self._first_groups.pop(worker.name, None)
        if made is not None:
            return made
        if self._hierarchy is None:
            return []
        return make_worker_cgroup(self._hierarchy, self._plan, worker)

    def _remove_unused_cgroups(self) -> None:
        """Remove the groups made for workers that never started (the job ended first)."""
        remove_worker_cgroups(self._plan, self._first_groups)

    def _cgroup_of(self, worker: Worker) -> str:
        return cgroup_of(self._plan, worker)

    def _out_of_memory(self, worker: Worker) -> str | None:
        """'out of memory: used X of Y; raise -memory' if the worker's group saw an OOM kill."""
        if self._hierarchy is None:
            return None
        usage = self._hierarchy.usage(self._cgroup_of(worker))
        if not usage.oom_kills:
            return None
        flag = "-psmemory" if worker.role is Role.PSERVER else "-memory"
        limit = usage.limit_bytes or worker.memory_bytes
        used = format_bytes(usage.peak_bytes) if usage.peak_bytes is not None else "all"
        of = f" of {format_bytes(limit)}" if limit is not None else ""
        return f"out of memory: used {used}{of}; raise {flag}"

    async def _stop_process(self, worker: Worker, proc: Child) -> None:
        """SIGTERM the worker's group, SIGKILL it after the grace; then sweep what is left in it."""
        if proc.returncode is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), self._plan.grace_seconds)
            except TimeoutError:
                grace = f"{self._plan.grace_seconds:g} s"
                self._event("Warning", "WorkerKilled", f"{worker.name} ignored SIGTERM for {grace}: SIGKILL")
                _signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()
            except asyncio.CancelledError:
                # Told to stop while already stopping (a SIGTERM during teardown): no more grace.
                _signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()
                raise
        # The group id stays the worker's pid while any member lives, so this reaches
        # helpers the worker left behind and, with no members left, nobody.
        _signal_group(proc.pid, signal.SIGKILL)

    def _restart_delay(self, restarts: int) -> float:
        return min(self._plan.restart_delay_seconds * 2 ** (restarts - 1), MAX_RESTART_DELAY_SECONDS)

    # -- records ---------------------------------------------------------------------

    def _prepare(self, worker: Worker) -> None:
        """The worker's working directory, made before any of its code runs."""
        boxed = self._plan.sandbox
        prepare_workdir(
            self._workdir(worker),
            Path(boxed.package_host if boxed else worker.cwd),
            trainer_id=worker.index,
            trainer_count=len(self._plan.trainers),
            seen_at=worker.cwd if boxed else None,
            within=_bind_holding(boxed.package_host, boxed.binds) if boxed else None,
        )
        if boxed is not None:
            os.lchown(self._workdir(worker), boxed.uid, boxed.gid)

    def _workdir(self, worker: Worker) -> Path:
        return self._job_dir / "work" / worker.name

    def _log(self, worker: Worker) -> CappedLog:
        """The worker's log, opened at its first run and kept for its restarts."""
        if worker.name not in self._log_files:
            path = self._logs / f"{worker.name}.log"
            self._log_files[worker.name] = CappedLog(path, self._plan.log_max_bytes, self._log_clock)
        return self._log_files[worker.name]

    def _append_log(self, worker: Worker, line: str) -> None:
        self._log(worker).line(line)

    def _worker_failed(self, status: WorkerStatus, failure: str) -> None:
        self._update(status, WorkerState.FAILED)
        self._event("Warning", "WorkerFailed", failure)

    def _update(self, status: WorkerStatus, state: WorkerState) -> None:
        status.state = state
        self._write_state()

    def _set_reason(self, reason: str) -> None:
        self._reason = reason
        self._write_state()

    def _stop_reason(self) -> str:
        """Why the job was stopped: who killed it and when, as the jobs service left it in
        STOP_REASON; else a signal from elsewhere (an operator, the machine going down)."""
        try:
            reason = (self._job_dir / STOP_REASON).read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            reason = ""
        elsewhere = f"killed: the job's supervisor got a stop signal at {_now()}, not from paddlecloud kill"
        return reason[:500] or elsewhere

    def _finish(self, state: JobState, reason: str) -> None:
        self._state, self._reason, self._finished_at = state, reason, _now()
        kind = "Normal" if state is JobState.SUCCEEDED else "Warning"
        self._event(kind, f"Job{state.value.capitalize()}", reason)
        self._write_state()

    def _event(self, kind: str, reason: str, message: str) -> None:
        line = json.dumps({"time": _now(), "type": kind, "reason": reason, "message": message})
        with open(self._job_dir / "events.jsonl", "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _write_state(self) -> None:
        # Small synchronous writes: a state file of a few workers costs less than a thread hop.
        state = {
            "state": self._state.value,
            "reason": self._reason,
            "started_at": self._started_at,
            "finished_at": self._finished_at,
            "supervisor_pid": os.getpid(),
            "workers": [w.to_dict() for w in self._workers.values()],
        }
        # Only the end must outlive a crash of the machine: after one, a job found running
        # is failed whatever it last said, but one that had ended keeps its end.
        durable = self._state is not JobState.RUNNING
        write_atomically(self._job_dir / "state.json", json.dumps(state, indent=2) + "\n", durable=durable)
        if self._notifier is not None and self._plan.notify is not None:
            # A hint, never waited for: a service that is down or busy polls the file anyway.
            with contextlib.suppress(OSError):
                self._notifier.sendto(self._job_dir.name.encode(), self._plan.notify)


class _Pump:
    """Copies what one run of a worker writes into its pipe to the worker's capped log."""

    def __init__(self, fd: int, log: CappedLog) -> None:
        os.set_blocking(fd, False)
        self._fd = fd
        self._log = log
        self._loop = asyncio.get_running_loop()
        self._ended = self._loop.create_future()
        self._loop.add_reader(fd, self._read)

    def _read(self) -> None:
        for _ in range(16):  # a bounded share of the loop per wake-up: other workers go on
            try:
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._close()
                return
            try:
                self._log.write(data)
            except OSError as exc:  # a full disk: the output is lost, the worker goes on
                print(f"paddlecloud supervisor: cannot write a log: {exc}", file=sys.stderr)

    def _close(self) -> None:
        if not self._ended.done():
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._ended.set_result(None)

    async def finish(self) -> None:
        """Copy what is left, until every writer has closed the pipe or PIPE_DRAIN_SECONDS passed."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._ended), PIPE_DRAIN_SECONDS)
        if not self._ended.done():
            self._read()
            self._close()


class Child:
    """A forked launcher, awaited through a pidfd: what asyncio's Process offers (`pid`,
    `returncode`, `wait()`) for a child that was forked without exec."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._loop = asyncio.get_running_loop()
        self._exited = self._loop.create_future()
        self._pidfd = os.pidfd_open(pid)
        self._loop.add_reader(self._pidfd, self._reap)

    def _reap(self) -> None:
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid == 0:
            return  # not yet: the pidfd says readable only once it has exited
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self.returncode = os.waitstatus_to_exitcode(status)  # -N for death by signal N
        self._exited.set_result(self.returncode)

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)


def hierarchy_of(plan: Plan) -> Hierarchy | None:
    """Where the plan's workers get their groups; None without cgroups."""
    return None if plan.cgroups is None else plan.cgroups.hierarchy()


def cgroup_of(plan: Plan, worker: Worker) -> str:
    """The worker's group, relative to the hierarchy's parent."""
    assert plan.cgroups is not None
    return plan.cgroups.group_of(worker.name)


def remove_worker_cgroups(plan: Plan, groups: dict[str, list[Path]]) -> None:
    """Remove the groups in `groups` (by worker name), made by `make_worker_cgroup` and
    never joined, and forget them."""
    hierarchy = hierarchy_of(plan)
    for worker in plan.workers:
        if groups.pop(worker.name, None) is not None and hierarchy is not None:
            hierarchy.remove(cgroup_of(plan, worker), timeout=0)


def make_worker_cgroup(hierarchy: Hierarchy, plan: Plan, worker: Worker) -> list[Path]:
    """A fresh group with the worker's limits for one run of it; OSError if the kernel refuses."""
    limits = Limits(worker.memory_bytes, worker.cpu_milli, plan.cgroups.pids_max if plan.cgroups else None)
    relative = cgroup_of(plan, worker)
    hierarchy.remove(relative, timeout=0)  # a previous run's, if the kernel still had it
    return hierarchy.create(relative, limits)


def nvidia_nodes() -> list[str]:
    """The NVIDIA device nodes on this machine. All GPUs' nodes are bound: CUDA numbers
    devices by what it can open, so a worker keeps the machine's numbering, and
    CUDA_VISIBLE_DEVICES narrows it to the worker's own."""
    try:
        names = os.listdir("/dev")
    except OSError:
        return []
    nodes = [n for n in names if n.startswith("nvidia") and (n[6:].isdigit() or n in NVIDIA_SHARED_NODES)]
    return [f"/dev/{n}" for n in sorted(nodes)]


async def _accepts(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), PORT_POLL_SECONDS * 10)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _detach_output(job_dir: Path) -> None:
    """Send our own stdout/stderr to JOB_DIR/supervisor.log: the pipes of a jobs service
    that started us may close when it dies, and a write to them would then kill us."""
    fd = os.open(job_dir / "supervisor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def main(argv: list[str] | None = None) -> int:
    """Run the job in JOB_DIR to its end; 0 when it succeeded, 1 when not, 2 on a bad plan, 3
    when another supervisor runs, or ran, it."""
    parser = argparse.ArgumentParser(
        prog="python -m paddlecloud.jobs.local.supervisor",
        description="Run one PaddleCloud job on this machine from JOB_DIR/plan.json.",
    )
    parser.add_argument("job_dir", type=Path, metavar="JOB_DIR", nargs="?")
    parser.add_argument(
        "--zygote", action="store_true", help="start a supervisor for each job directory read from stdin"
    )
    parser.add_argument(
        "--warm-cgroup-moves", action="store_true", help="with --zygote: when the jobs' workers get cgroups"
    )
    args = parser.parse_args(argv)
    if args.zygote == (args.job_dir is not None):
        parser.error("give either JOB_DIR or --zygote")
    if args.zygote:
        return zygote(own_cgroup_procs() if args.warm_cgroup_moves else None)
    return run_job_dir(args.job_dir.absolute())


def read_plan(job_dir: Path) -> Plan:
    """The job's plan.json; KeyError for a missing field, OSError, ValueError or TypeError."""
    return Plan.from_dict(json.loads((job_dir / "plan.json").read_text(encoding="utf-8")))


class _Refused(Exception):
    """The job cannot start at all; the message says why, and is recorded as its end."""


def run_job_dir(job_dir: Path, ready: _Ready | None = None, base: str | Path | None = None) -> int:
    """Run the job in `job_dir` (absolute), with what the zygote made `ready` for it; main's
    exit status. `base`: the directory this process was born in (the zygote's copies)."""
    # First of all, before a byte is written there: is this job ours to run (`claim.py`)?
    # The descriptor stays open, and the lock held, until this process exits.
    if claim.claim(job_dir, base if base is not None else job_dir) is None:
        if ready is not None:
            ready.remove()
        print(f"paddlecloud supervisor: {job_dir} is, or was, run by another supervisor", file=sys.stderr)
        return 3
    _detach_output(job_dir)
    try:
        plan = ready.plan if ready is not None else _read_plan_or_refuse(job_dir)
        if plan.sandbox is not None:
            try:
                sandbox.detect("required", "jobs")
            except sandbox.SandboxUnavailable as exc:
                raise _Refused(str(exc)) from None
        pasta, warnings = _enter_network(plan)
    except _Refused as exc:
        if ready is not None:
            ready.remove()
        return _refuse(job_dir, str(exc))
    first_groups = ready.groups if ready is not None else None
    try:
        state = asyncio.run(JobSupervisor(job_dir, plan, first_groups, warnings).run())
    finally:
        netns.stop(pasta)
    print(f"paddlecloud supervisor: job {plan.job_name} {state.value}", file=sys.stderr)
    return 0 if state is JobState.SUCCEEDED else 1


def _read_plan_or_refuse(job_dir: Path) -> Plan:
    """The job's plan.json; _Refused, saying what is wrong with it, if it cannot be read."""
    try:
        return read_plan(job_dir)
    except KeyError as exc:
        raise _Refused(f"plan.json lacks the field {exc}") from None
    except (OSError, ValueError, TypeError) as exc:
        raise _Refused(f"cannot read plan.json: {exc}") from None


def _enter_network(plan: Plan) -> tuple[subprocess.Popen[bytes] | None, list[tuple[str, str]]]:
    """Enter the job's own network namespace, before any worker (or the event loop's
    threads) exists: every worker inherits it, and the supervisor's own probe of the
    parameter servers' ports looks at the loopback the workers share. Returns pasta's
    process where the job has outbound traffic, and the warnings to record; _Refused if
    the namespace cannot be made. Nothing for a job on the host's network."""
    if plan.network is None:
        return None, []
    try:
        host = netns.isolate()
    except (netns.NetworkUnavailable, OSError) as exc:
        raise _Refused(f"cannot make the job's network: {exc}") from None
    try:
        return (netns.outbound(host) if plan.network == "outbound" else None), []
    except (netns.NetworkUnavailable, OSError) as exc:
        # The job runs, isolated, without outbound traffic: never on the host's network.
        return None, [("NoOutboundNetwork", f"the job has no outbound network: {exc}")]
    finally:
        os.close(host)


def zygote(warm: Path | None = None) -> int:
    """`--zygote`: start supervisors by forking this process, which has imported them.

    The local backend starts one. Each line on stdin names a job directory; the answer on
    stdout is the pid of a copy of this process that runs that job's supervisor in it (its
    working directory, which is how the service knows it), or `error: why`. A supervisor
    started as a new interpreter spends ~90 ms of CPU on imports before it does anything;
    a fork of one that has, about 1 ms. Each copy leads its own session, so it outlives
    the zygote and the service as a directly started supervisor does. The zygote exits at
    the end of stdin: the service closed it, or died.

    `warm`: the zygote's own cgroup.procs. Moving a process between cgroups waits for an
    RCU grace period (6-14 ms measured here) unless another move finished within the last
    few tens of milliseconds (the kernel's cgroup_threadgroup_rwsem: 0.2 ms then). After
    each fork the zygote moves itself into the group it is already in, which changes
    nothing but pays that wait while the new supervisor prepares the job, so the first
    worker's move into its own cgroup, on the way to the program, is quick.
    """
    signal.signal(signal.SIGCHLD, _reap_children)
    # Worked out once here rather than in every copy (each the same for all jobs).
    sandbox.system_binds()
    sandbox.python_paths()
    with contextlib.suppress(SeccompUnavailable):  # a job that needs it says why it cannot start
        filter_program()
    sandbox.hosts_text()
    # What is imported by now is shared with every fork: kept out of the collector's
    # sweeps, so that they do not touch (and copy) every page of it in each copy.
    gc.freeze()
    # Answers go to the service on our stdout, and only answers: anything else that would
    # print (a warning logged while making a job's groups) goes to stderr instead.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    for line in sys.stdin.buffer:
        job_dir = os.fsdecode(line.rstrip(b"\n"))
        ready = _Ready.make(Path(job_dir))
        try:
            # The copy is born in the job's directory: the service may look at its pid
            # before the copy has run a single line.
            os.chdir(job_dir)
            pid = os.fork()
        except OSError as exc:
            answer = f"error: cannot fork a supervisor: {exc}"
            if ready is not None:
                ready.remove()
        else:
            if pid == 0:
                _become_supervisor(job_dir, ready)
            answer = str(pid)
        finally:
            os.chdir("/")
        answers.write(answer.encode() + b"\n")
        answers.flush()
        if warm is not None:
            with contextlib.suppress(OSError):
                warm.write_text(str(os.getpid()))
    return 0


def own_cgroup_procs() -> Path | None:
    """This process's cgroup.procs: the memory controller's on cgroup v1, the unified one
    on v2; None where it cannot tell."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    groups = dict(line.split(":", 2)[1:] for line in lines if line.count(":") >= 2)
    if "memory" in groups:
        return CGROUP_ROOT / "memory" / groups["memory"].lstrip("/") / "cgroup.procs"
    if "" in groups:
        return CGROUP_ROOT / groups[""].lstrip("/") / "cgroup.procs"
    return None


def _reap_children(signum: int, frame: FrameType | None) -> None:
    """The zygote reaps the supervisors it forked (their CPU time counts as its children's)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


@dataclass
class _Ready:
    """What the zygote prepares for a job before forking its supervisor: the plan, read,
    and each worker's groups for its first run.

    The groups are made here, before the fork: made by the supervisor right after it, they
    took 2.5-11 ms (0.34 ms in a quiet process), most likely waiting for the kernel's cgroup
    lock, which the zygote's warm move below holds through an RCU grace period.
    """

    plan: Plan
    groups: dict[str, list[Path]]

    @classmethod
    def make(cls, job_dir: Path) -> _Ready | None:
        """None when the plan cannot be read or a group cannot be made: the supervisor then
        does it all itself, and says what is wrong the way it always has."""
        try:
            plan = read_plan(job_dir)
        except (KeyError, OSError, ValueError, TypeError):
            return None
        ready = cls(plan, {})
        hierarchy = hierarchy_of(plan)
        if hierarchy is None:
            return ready
        try:
            for worker in plan.workers:
                ready.groups[worker.name] = make_worker_cgroup(hierarchy, plan, worker)
        except OSError:
            ready.remove()
            return None
        return ready

    def remove(self) -> None:
        """Remove the groups again (no supervisor will use them)."""
        remove_worker_cgroups(self.plan, self.groups)


def _become_supervisor(job_dir: str, ready: _Ready | None) -> NoReturn:
    """In a fork of the zygote: leave its session and descriptors, and run the job."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        code = run_job_dir(Path(job_dir), ready, base=".")
    except BaseException as exc:  # the copy must reach _exit, whatever happened
        with contextlib.suppress(Exception):
            os.write(2, f"paddlecloud supervisor: {exc!r}\n".encode())
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _refuse(job_dir: Path, reason: str) -> int:
    """Record a job that cannot even start as FAILED, with why."""
    print(f"paddlecloud supervisor: {reason}", file=sys.stderr)
    now = _now()
    record = {
        "state": JobState.FAILED.value,
        "reason": reason,
        "started_at": now,
        "finished_at": now,
        "supervisor_pid": os.getpid(),
        "workers": [],
    }
    write_atomically(job_dir / "state.json", json.dumps(record, indent=2) + "\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
