"""The local backend: every job runs under its own supervisor process on this machine.

`start` prepares `<work_dir>/<owner>/<job id>/` (the package, unpacked if it is an
archive; `plan.json`) and has the zygote (`supervisor --zygote`, started with the first
job) fork a supervisor for it in a new session, in that directory, detached from the
service: a job keeps running while the jobs service is down, and everything the service
needs to re-attach is in the directory (`state.json` with the supervisor's pid,
`events.jsonl`, `logs/`). `observe`, `workers` and `logs` only read those files, so a
restarted service sees exactly what the supervisor recorded. Supervisors name their job
on `<work_dir>/notify.sock` whenever its state.json changes, so the reconcile loop looks
at once instead of at its next poll.

Sandboxes. Where bubblewrap is installed (`jobs.sandbox: auto`, the default) every worker
runs in a sandbox of its own (services/common/sandbox.py) as an unprivileged uid of the
user's own (`uids.py`), seeing the system and its Python read-only, its package, its
user's PFS home read-write at `/pfs/<dc>/home/<user>` and `/pfs/<dc>/public` read-only,
and nothing else of the machine: a program that reads `/pfs/<dc>/home/<user>/...` runs
unchanged. The user's home is given to that uid (the pfs service keeps new files so).
As root, each job also gets a network namespace of its own, which its supervisor makes
(`Plan.network`, `jobs.network`; services/common/netns.py).
With cgroups (`jobs.limits: auto`), each worker's memory, cpu and pids are limited
(`cgroups.py`). GPUs are handed out by `gpus.py`. Without a sandbox (`jobs.sandbox: off`,
or no bwrap) jobs run as the service's user and get the real directories in
`PADDLE_CLOUD_PFS_HOME` and `PADDLE_CLOUD_OUTPUT`: the service says so once at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import socket
import stat
import sys
import tarfile
import time
import zipfile
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from paddlecloud.common import cgroups, netns, trees
from paddlecloud.common import sandbox as sandboxes
from paddlecloud.common.beneath import chown_tree
from paddlecloud.common.config import Config
from paddlecloud.common.sandbox import Bind
from paddlecloud.common.store.models import FAILED, KILLED, PENDING, RUNNING, TERMINAL_STATES, utcnow
from paddlecloud.common.volume import PfsPath, Root

from ..backend import (
    Backend,
    JobUsage,
    Launch,
    LogLine,
    LogQuery,
    NotYet,
    Observation,
    ObservedEvent,
    StartFailed,
    WorkerInfo,
)
from ..exits import WORKER_STOPPED
from ..records import JobRecord
from ..spec import JobSpec
from . import claim
from .gpus import GpuPool, discover
from .loghub import LogHubs, follow
from .logmerge import LogMerge
from .plan import STOP_REASON, CgroupPlan, HostPlan, Plan, Ports, SandboxPlan, WorkerPaths, build_plan
from .uids import UidMap, UidsExhausted
from .unpack import unpack
from .usage import NO_CGROUPS, UsageReader
from .viewer import LocalViewer, ViewerLauncher, Wanted

log = structlog.get_logger(__name__)

SUPERVISOR_MODULE = "paddlecloud.jobs.local.supervisor"
# How long the zygote may take to fork a supervisor (about a millisecond when well).
ZYGOTE_TIMEOUT_SECONDS = 10.0
# Where a sandboxed worker sees a package that was an archive (unpacked for the job).
PACKAGE_TARGET = "/job/package"
# The least a worker's log keeps, however many workers share the job's cap.
MIN_LOG_BYTES = 256 * 1024


@dataclass
class _Seen:
    """What `observe` last read of a job's files, so unchanged files are not read again."""

    state_key: tuple[int, int] = (0, 0)
    state: dict[str, Any] | None = None
    plan: Plan | None = None  # for sampling its workers' usage


class Zygote:
    """The service's end of `supervisor --zygote`: started at the first job, asked for one
    supervisor per job, closed with the backend (the supervisors stay)."""

    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self.options: list[str] = []  # given to the zygote (`--warm-cgroup-moves`)

    async def fork(self, job_dir: Path) -> int:
        """The pid of a new supervisor running the job in `job_dir`; OSError if none started."""
        path = os.fsencode(job_dir)
        if b"\n" in path:
            raise OSError(f"a job directory may not contain a newline: {job_dir!r}")
        async with self._lock:
            for _ in range(2):  # a zygote that died is started again, once
                proc = await self._running()
                assert proc.stdin is not None and proc.stdout is not None
                try:
                    proc.stdin.write(path + b"\n")
                    await proc.stdin.drain()
                    answer = await asyncio.wait_for(proc.stdout.readline(), ZYGOTE_TIMEOUT_SECONDS)
                except (ConnectionError, TimeoutError) as exc:
                    log.warning("zygote_failed", error=repr(exc))
                    await self._stop()
                    continue
                except asyncio.CancelledError:
                    # Its answer would be read as the next job's: this zygote is done (the
                    # next fork starts another, `close` reaps this one).
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    raise
                if not answer:
                    log.warning("zygote_exited", code=await proc.wait())
                    self._proc = None
                    continue
                text = answer.decode(errors="replace").strip()
                if text.isdigit():
                    return int(text)
                raise OSError(text.removeprefix("error: "))
        raise OSError("the supervisor zygote does not answer")

    async def _running(self) -> asyncio.subprocess.Process:
        if self._proc is None or self._proc.returncode is not None:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                SUPERVISOR_MODULE,
                "--zygote",
                *self.options,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                start_new_session=True,  # our signals (Ctrl-C, the server stopping) are not its
                close_fds=True,  # asked for, not assumed: uvloop's default differs from subprocess's
                cwd="/",
            )
        return self._proc

    async def close(self) -> None:
        async with self._lock:
            await self._stop()

    async def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        assert proc.stdin is not None
        proc.stdin.close()  # its end of input: it exits
        try:
            await asyncio.wait_for(proc.wait(), ZYGOTE_TIMEOUT_SECONDS)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


class LocalBackend(Backend):
    name = "local"
    # A job recorded but not started when the service stopped is started at its restart
    # (`adopt` first tells a half-made start from one whose supervisor runs).
    resumes_unstarted = True

    def __init__(self, config: Config, root: Root) -> None:
        self._config = config
        self._root = root
        self._work_dir = config.jobs.work_dir.expanduser().absolute()
        self._log_poll = config.jobs.log_poll_seconds
        self._log_hubs = LogHubs(self._log_poll)  # by job id: the one reader of its followed logs
        self._sandbox = sandboxes.Sandbox(None, None, os.geteuid() == 0)
        self._network: str | None = None  # Plan.network: None, the host's
        self._hierarchy: cgroups.Hierarchy | None = None
        self._uids = UidMap(
            self._work_dir / "uids.json", config.jobs.sandbox_uid_base, config.jobs.sandbox_uid_count
        )
        self._gpus = GpuPool([])
        self._zygote = Zygote()
        self._notify: socket.socket | None = None
        self._changed: Callable[[str], None] | None = None
        self._seen: dict[str, _Seen] = {}
        self._usage = UsageReader()
        self._viewers = ViewerLauncher(root, config.jobs.viewers.start_timeout_seconds)

    @property
    def sandboxed(self) -> bool:
        return self._sandbox.enabled

    @property
    def limits_enforced(self) -> bool:
        return self._hierarchy is not None

    async def open(self) -> None:
        self._work_dir.mkdir(parents=True, exist_ok=True)
        # Job directories hold what the platform keeps about jobs; no job reads them whole.
        os.chmod(self._work_dir, 0o711)  # noqa: S103 - traversable, not listable
        jobs = self._config.jobs
        try:
            self._sandbox = sandboxes.detect(jobs.sandbox, "jobs")
        except sandboxes.SandboxUnavailable as exc:
            raise RuntimeError(f"jobs.sandbox is 'required': {exc}") from None
        self._network = self._choose_network()
        if jobs.limits != "off":
            self._hierarchy = await asyncio.to_thread(cgroups.detect)
            if self._hierarchy is None and jobs.limits == "required":
                raise RuntimeError("jobs.limits is 'required' but this service cannot make cgroups here")
        self._gpus = GpuPool(await asyncio.to_thread(discover, jobs.gpus))
        if self._hierarchy is not None:
            self._zygote.options = ["--warm-cgroup-moves"]
        self._notify = self._listen(self._work_dir / "notify.sock")
        if not self._sandbox.enabled:
            log.warning(
                "jobs_not_sandboxed",
                detail="jobs run as this service's user and can read what it can: install bubblewrap",
            )
        if self._hierarchy is None:
            self.usage_unavailable = NO_CGROUPS
            log.warning(
                "job_limits_advisory", detail="cpu, memory and pids limits are not enforced (no cgroups)"
            )
        log.info(
            "local_backend_ready",
            work_dir=str(self._work_dir),
            sandbox=self._sandbox.describe(),
            network=self._network or "host",
            limits=self._hierarchy.describe() if self._hierarchy else "advisory",
            gpus=self._gpus.devices,
        )

    def _choose_network(self) -> str | None:
        """Plan.network for every job: a namespace of its own where the sandbox switches
        uids (only root can make one for processes of another uid), else the host's.
        Where pasta cannot run, `outbound` becomes `none` (or, with `jobs.sandbox:
        required`, the service refuses to start): isolation is never traded for outbound
        traffic."""
        jobs = self._config.jobs
        if not self._sandbox.switches_uid:
            if self._sandbox.enabled:
                log.warning("jobs_share_host_network", detail="not root: jobs share this machine's network")
            return None
        reason = netns.no_outbound_reason() if jobs.network == "outbound" else None
        if reason is not None:
            if jobs.sandbox == "required":
                raise RuntimeError(f"jobs.network is 'outbound' and jobs.sandbox 'required', but {reason}")
            log.warning("jobs_no_outbound_network", detail=reason)
            return "none"
        return jobs.network

    async def close(self) -> None:
        # Only the zygote and the socket: the supervisors keep running. (Viewers are
        # stopped before, by the service's Viewers.)
        await self._zygote.close()
        self._viewers.close()
        await self._log_hubs.close()
        if self._notify is not None:
            asyncio.get_running_loop().remove_reader(self._notify.fileno())
            self._notify.close()
            self._notify = None

    # -- notifications ---------------------------------------------------------------

    def watch(self, changed: Callable[[str], None]) -> None:
        self._changed = changed

    def _listen(self, path: Path) -> socket.socket | None:
        """The socket supervisors name a job on whenever its state.json changed; None
        where it cannot be made (the service then learns of changes by polling alone)."""
        if len(os.fsencode(path)) >= 108:  # sun_path
            detail = f"the socket path {path} is too long; jobs are polled"
            log.warning("job_notifications_off", detail=detail)
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # a socket left by a service that stopped
            sock.bind(str(path))
            os.chmod(path, 0o600)  # the service's own supervisors; sandboxed workers are other uids
        except OSError as exc:
            sock.close()
            log.warning("job_notifications_off", detail=f"cannot listen on {path}: {exc}; jobs are polled")
            return None
        sock.setblocking(False)
        asyncio.get_running_loop().add_reader(sock.fileno(), self._notified, sock)
        return sock

    def _notified(self, sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(256)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("job_notification_failed", error=str(exc))
                return
            job_id = data.decode(errors="replace")
            if self._changed is not None and job_id.isalnum():
                self._changed(job_id)

    # -- resources -------------------------------------------------------------------

    def refusal(self, spec: JobSpec) -> tuple[str, str] | None:
        reason = self._gpus.refusal(spec.gpu, spec.trainers)
        return None if reason is None else ("gpu", reason)

    def capacity(self) -> dict[str, Any]:
        limits = "enforced" if self._hierarchy is not None else "advisory"
        return {
            "gpus": self._gpus.total,
            "gpus_free": len(self._gpus.free()),
            "limits": limits,
            "limits_detail": (
                f"cpu, memory and pids of each worker are limited ({self._hierarchy.describe()})"
                if self._hierarchy is not None
                else "cpu and memory are counted against your quota but not enforced on this machine"
            ),
            "sandbox": self._sandbox.describe(),
        }

    def devices(self, job: JobRecord) -> dict[str, list[str]]:
        return self._gpus.held_by(job.id)

    def attach(self, job: JobRecord) -> None:
        held = job.backend.get("gpus")
        if isinstance(held, dict) and held:
            self._gpus.hold(job.id, {str(w): [str(d) for d in ds] for w, ds in held.items()})

    # -- start -----------------------------------------------------------------------

    async def adopt(self, job: JobRecord) -> dict[str, Any] | None:
        """After a restart: the record of a job whose supervisor was forked although the
        store does not say so; None (a half-made directory taken away) if it never was."""
        info = await asyncio.to_thread(self._earlier_start, job)
        if info is not None:
            log.info("job_adopted", job=job.name, owner=job.owner, supervisor=info["supervisor_pid"])
        return info

    def _earlier_start(self, job: JobRecord) -> dict[str, Any] | None:
        """What `start` returned, or would have, for a job a supervisor has (`claim.py`);
        None when none has, after taking away whatever a start that stopped half-way made,
        so that the job starts afresh and runs once."""
        job_dir = self._work_dir / job.owner / job.id
        if claim.inspect(job_dir) is claim.Earlier.NOTHING:
            if os.path.lexists(job_dir):
                # Renamed first, so that a supervisor forked late finds no directory to claim.
                # Had that failed, the fresh start fails (the directory is in its way), saying so.
                aside = job_dir.with_name(f".{job.id}.abandoned")
                try:
                    trees.remove_path(aside)
                    os.rename(job_dir, aside)
                    trees.remove_path(aside)
                except OSError as exc:
                    log.warning("half_started_job_not_removed", job=job.name, error=str(exc))
                log.info("half_started_job_discarded", job=job.name, owner=job.owner)
            return None
        # Claimed: its state.json comes right after the claim, with the supervisor's pid.
        deadline = time.monotonic() + ZYGOTE_TIMEOUT_SECONDS
        state: dict[str, Any] = {}
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError, ValueError):
                state = json.loads((job_dir / "state.json").read_text(encoding="utf-8"))
                break
            time.sleep(0.05)
        gpus: dict[str, list[str]] = {}
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            plan = json.loads((job_dir / "plan.json").read_text(encoding="utf-8"))
            held = [w for w in plan["workers"] if w.get("devices")]
            gpus = {str(w["name"]): [str(d) for d in w["devices"]] for w in held}
        pid = state.get("supervisor_pid")
        return {"name": self.name, "job_dir": str(job_dir), "supervisor_pid": pid, "gpus": gpus}

    async def start(self, launch: Launch) -> dict[str, Any]:
        job, spec = launch.job, launch.spec
        # Started before, by a service that stopped before recording it: adopted, not run twice.
        try:
            earlier = await self.adopt(job)
        except OSError as exc:
            raise StartFailed(f"cannot look at the job's directory: {exc}") from exc
        if earlier is not None:
            self.attach(job.evolve(backend=earlier))
            return earlier
        wanted = {f"trainer-{i}": spec.gpu for i in range(spec.trainers)} if spec.gpu else {}
        given = self._gpus.take(job.id, wanted) if wanted else {}
        if given is None:
            free = len(self._gpus.free())
            raise NotYet(
                f"waiting for GPUs: the job needs {spec.gpu * spec.trainers}, "
                f"{free} of this machine's {self._gpus.total} are free"
            )
        job_dir = self._work_dir / job.owner / job.id
        try:
            plan = await asyncio.to_thread(self._prepare, launch, job_dir, given)
        except (OSError, tarfile.TarError, zipfile.BadZipFile, ValueError, UidsExhausted) as exc:
            self._gpus.release(job.id)
            raise StartFailed(f"cannot prepare the job: {exc}") from exc
        try:
            pid = await self._zygote.fork(job_dir)
        except OSError as exc:
            self._gpus.release(job.id)
            raise StartFailed(f"cannot start the job's supervisor: {exc}") from exc
        log.info(
            "job_started",
            job=job.name,
            owner=job.owner,
            supervisor=pid,
            job_dir=str(job_dir),
            sandboxed=plan.sandbox is not None,
        )
        return {"name": self.name, "job_dir": str(job_dir), "supervisor_pid": pid, "gpus": given}

    def _prepare(self, launch: Launch, job_dir: Path, devices: dict[str, list[str]]) -> Plan:
        job, spec = launch.job, launch.spec
        job_dir.mkdir(parents=True, exist_ok=False)
        package = self._package_dir(launch, job_dir)
        output = self._make_output(launch.output)
        python = launch.runtime.python if launch.runtime else None
        boxed: SandboxPlan | None = None
        if self._sandbox.enabled:
            paths, boxed, python = self._sandboxed(launch, package, python)
        else:
            paths = WorkerPaths(
                pfs_home=str(self._root.root / "home" / job.owner),
                output=str(output),
                package=str(package),
                input=None if launch.input is None else str(self._host_path(launch.input)),
            )
        limits = None
        if self._hierarchy is not None:
            h = self._hierarchy
            limits = CgroupPlan(h.version, str(h.root), h.parent, job.id, self._config.jobs.pids_max)
        workers = spec.pservers + spec.trainers
        host = HostPlan(
            paths=paths,
            ports=Ports.split(free_ports(workers + 1), spec.pservers),
            devices=devices,
            sandbox=boxed,
            cgroups=limits,
            python=python,
            network=self._network,
            notify=str(self._work_dir / "notify.sock") if self._notify is not None else None,
            # The job's cap, shared equally: each worker keeps the newest of its own output.
            log_max_bytes=max(self._config.jobs.log_max_bytes // workers, MIN_LOG_BYTES),
            # The job's `disk` per worker, as on Kubernetes, within the machine's own bound.
            scratch_max_bytes=min(self._config.jobs.scratch_max_bytes, workers * spec.disk_bytes),
            grace_seconds=self._config.jobs.grace_seconds,
        )
        plan = build_plan(launch, host)
        (job_dir / "plan.json").write_text(json.dumps(plan.to_dict(), indent=2) + "\n", encoding="utf-8")
        if spec.image is not None:
            # The first line of the job's events; the supervisor appends the rest.
            (note,) = self.notes(spec)
            event = {
                "time": utcnow().isoformat(),
                "type": "Warning",
                "reason": "ImageIgnored",
                "message": note,
            }
            (job_dir / "events.jsonl").write_text(json.dumps(event) + "\n", encoding="utf-8")
        return plan

    def _sandboxed(
        self, launch: Launch, package: Path, python: str | None
    ) -> tuple[WorkerPaths, SandboxPlan, str | None]:
        """How a sandboxed job's workers see its paths (the PFS paths, bound where they
        say), the sandbox that binds them, and `python` as the workers see it."""
        owner = launch.job.owner
        uid = self._uids.uid_for(owner) if self._sandbox.switches_uid else os.geteuid()
        home = self._root.root / "home" / owner
        self._root.ensure_home(owner)
        if self._sandbox.switches_uid:
            # The home becomes the user's uid's once; pfs keeps what it adds there so.
            if os.lstat(home).st_uid != uid:
                chown_tree(home, uid, uid)
            if launch.package_kind != "dir":
                chown_tree(package, uid, uid)
        dc = launch.datacenter
        binds = [
            Bind(str(home), f"/pfs/{dc}/home/{owner}", writable=True),
            Bind(str(self._root.root / "public"), f"/pfs/{dc}/public"),
        ]
        package_seen = launch.package.text
        if launch.package_kind != "dir":
            binds.append(Bind(str(package), PACKAGE_TARGET, writable=True))
            package_seen = PACKAGE_TARGET
        if python is not None:
            # A built environment, read-only at its real path (envs/<key> is a link).
            env_dir = os.path.realpath(os.path.dirname(os.path.dirname(python)))
            binds.append(Bind(env_dir, env_dir))
            python = os.path.join(env_dir, "bin", "python")
        boxed = SandboxPlan(uid=uid, gid=uid, binds=tuple(binds), package_host=str(package))
        input_seen = None if launch.input is None else launch.input.text
        paths = WorkerPaths(launch.pfs_home, launch.output.text, package_seen, input_seen)
        return paths, boxed, python

    def notes(self, spec: JobSpec) -> list[str]:
        if spec.image is None:
            return []
        return [f"image {spec.image} is not used: this backend runs jobs with the platform's Python"]

    def _package_dir(self, launch: Launch, job_dir: Path) -> Path:
        """The directory the workers run in: the PFS directory itself, or the archive unpacked."""
        if launch.package_kind == "dir":
            return self._host_path(launch.package)
        target = job_dir / "package"
        target.mkdir()
        fd = self._root.open(launch.package, os.O_RDONLY | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as archive:
            unpack(archive, launch.package_kind, target, self._config.jobs.package_max_bytes)
        return target

    def _host_path(self, path: PfsPath) -> Path:
        """Where a PFS path really is, resolved beneath its area by the kernel."""
        fd = self._root.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            return Path(os.readlink(f"/proc/self/fd/{fd}"))
        finally:
            os.close(fd)

    def _make_output(self, path: PfsPath) -> Path:
        """`mkdir -p` the output directory beneath the user's home, never through a symlink."""
        if path.owner is not None:
            self._root.ensure_home(path.owner)
        for n in range(1, len(path.parts) + 1):
            step = PfsPath(path.datacenter, path.area, path.owner, path.parts[:n])
            with self._root.parent_fd(step) as (parent, name):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=parent)
                    self._root.adopt(step, parent, name)
                if not stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                    raise NotADirectoryError(f"{step} is in the way of the output directory {path}")
        return self._host_path(path)

    async def start_viewer(
        self, job: JobRecord, kind: str, output: PfsPath, prefix: str, python: str
    ) -> LocalViewer:
        """The viewer runs as the job's user, as the job did (viewer.py)."""
        uid = self._uids.uid_for(job.owner) if self._sandbox.switches_uid else os.geteuid()
        return await self._viewers.start(self._sandbox, uid, Wanted(kind, output, prefix, python))

    # -- stop ------------------------------------------------------------------------

    async def stop(self, job: JobRecord, grace_seconds: float, reason: str | None = None) -> None:
        pid = self._supervisor_pid(job)
        if pid is None:
            return
        job_dir = self._job_dir(job)
        if reason and job_dir is not None:
            # The supervisor records the end, so it is told why before it is told to stop.
            _write_stop_reason(job_dir, reason)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 15)
        # The supervisor gives every worker the grace, then SIGKILLs their groups.
        deadline = asyncio.get_running_loop().time() + grace_seconds + 5.0
        while self._supervisor_pid(job) is not None:
            if asyncio.get_running_loop().time() > deadline:
                # Its workers' launchers die with it (PR_SET_PDEATHSIG) and take their groups.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
                log.warning("supervisor_sigkilled", job=job.name, pid=pid)
                break
            await asyncio.sleep(0.05)

    def _supervisor_pid(self, job: JobRecord) -> int | None:
        """The pid of the job's supervisor if it is still running (checked against its
        command line and working directory, so a reused pid is never mistaken for it)."""
        job_dir = job.backend.get("job_dir")
        pid = job.backend.get("supervisor_pid")
        state = self._read_state(job)
        if state is not None:
            pid = state.get("supervisor_pid", pid)
        if not isinstance(pid, int) or not job_dir:
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            status = Path(f"/proc/{pid}/stat").read_text()
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            return None
        if status.rsplit(")", 1)[-1].split()[0] == "Z":
            return None  # exited, not yet reaped
        # Forked by the zygote, it runs in the job's directory; started alone, it names it.
        in_dir = cwd == os.path.realpath(job_dir)
        ours = SUPERVISOR_MODULE.encode() in cmdline and (in_dir or os.fsencode(job_dir) in cmdline)
        return pid if ours else None

    # -- observe ---------------------------------------------------------------------

    def _job_dir(self, job: JobRecord) -> Path | None:
        job_dir = job.backend.get("job_dir")
        return Path(job_dir) if job_dir else None

    def _read_state(self, job: JobRecord) -> dict[str, Any] | None:
        job_dir = self._job_dir(job)
        if job_dir is None:
            return None
        seen = self._seen.setdefault(job.id, _Seen())
        try:
            st = os.stat(job_dir / "state.json")
        except FileNotFoundError:
            return None
        key = (st.st_mtime_ns, st.st_ino)
        if key != seen.state_key or seen.state is None:
            try:
                seen.state = json.loads((job_dir / "state.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return seen.state  # replaced atomically, so only a vanished file gets here
            seen.state_key = key
        return seen.state

    async def observe(self, job: JobRecord, cursor: str | None) -> Observation:
        job_dir = self._job_dir(job)
        if job_dir is None:
            return Observation(PENDING, job.reason or "not started", cursor=cursor)
        state = self._read_state(job)
        events, after = _read_events(job, job_dir, cursor)
        alive = self._supervisor_pid(job) is not None
        if not alive:
            # Read again: the supervisor may have written its end and exited since.
            state = self._read_state(job)

        def seen(current: str, reason: str, **times: Any) -> Observation:
            return Observation(current, reason, events=events, cursor=after, **times)

        if state is None:
            if alive:
                return seen(PENDING, "starting")
            output = _last_lines(job_dir / "supervisor.log")
            return seen(FAILED, f"the job's supervisor stopped before it started the job: {output}")
        current = str(state.get("state", RUNNING))
        if current not in TERMINAL_STATES and not alive:
            pid = state.get("supervisor_pid")
            reason = (
                f"the job's supervisor (pid {pid}) died without recording an end; its workers were stopped"
            )
            return seen(FAILED, reason, started_at=state.get("started_at"))
        if current == RUNNING and not any(w.get("state") == RUNNING for w in state.get("workers", ())):
            # The supervisor is up, but no worker runs yet (starting, or trainers waiting
            # for parameter servers): the job is still pending, and the reason says on what.
            return seen(PENDING, str(state.get("reason", "starting")))
        return seen(
            current,
            str(state.get("reason", "")),
            started_at=state.get("started_at"),
            finished_at=state.get("finished_at"),
        )

    def forget(self, job: JobRecord) -> None:
        """Drop what `observe` cached for a job that is final, and give back its GPUs."""
        self._seen.pop(job.id, None)
        self._usage.forget(job.id)
        self._gpus.release(job.id)

    async def workers(self, job: JobRecord) -> list[WorkerInfo]:
        recorded = {w["name"]: w for w in (self._read_state(job) or {}).get("workers", ())}
        result = []
        # A job that is final has no running worker, whatever its supervisor managed to record
        # before it died: those it left unfinished ended with it.
        ended_as = {FAILED: FAILED, KILLED: KILLED}.get(job.state, KILLED)
        for worker in self._plan(job).workers:
            w = recorded.get(worker.name, {})
            worker_state = str(w.get("state", "PENDING"))
            if job.state in TERMINAL_STATES and worker_state not in {*TERMINAL_STATES, WORKER_STOPPED}:
                worker_state = ended_as
            result.append(
                WorkerInfo(
                    name=worker.name,
                    role=worker.role.value,
                    index=worker.index,
                    state=worker_state,
                    restarts=int(w.get("restarts", 0)),
                    started_at=w.get("started_at"),
                    exit_code=w.get("exit_code"),
                    host=socket.gethostname(),
                    devices=worker.devices,
                )
            )
        return result

    async def usage(self, jobs: Sequence[JobRecord]) -> dict[str, JobUsage]:
        """The running workers' cgroups (and GPUs): those the supervisor's state calls RUNNING."""
        looked: dict[str, tuple[Plan, set[str]]] = {}
        for job in jobs:
            seen = self._seen.setdefault(job.id, _Seen())
            if seen.plan is None:
                plan = self._plan(job)
                if not plan.workers:
                    continue  # not written yet
                seen.plan = plan  # written once, before the supervisor starts
            state = self._read_state(job) or {}
            running = {str(w.get("name")) for w in state.get("workers", ()) if w.get("state") == RUNNING}
            looked[job.id] = (seen.plan, running)
        return await self._usage.read(looked)

    def _plan(self, job: JobRecord) -> Plan:
        job_dir = self._job_dir(job)
        if job_dir is None:
            return Plan(job_name=job.name, workers=(), max_restarts=0)
        try:
            return Plan.from_dict(json.loads((job_dir / "plan.json").read_text(encoding="utf-8")))
        except FileNotFoundError:
            return Plan(job_name=job.name, workers=(), max_restarts=0)

    # -- logs ------------------------------------------------------------------------

    async def logs(self, job: JobRecord, query: LogQuery) -> AsyncGenerator[list[LogLine], None]:
        """The workers' lines merged in the order they came (caplog.py's order files), live
        or long after: each pass reads what every worker's log has, and sends it merged."""
        job_dir = self._job_dir(job)
        names = [w.name for w in self._plan(job).workers]
        if job_dir is None or not names:
            return
        reader = LogMerge.start(job_dir / "logs", names, query)
        shared = not query.workers and not query.roles  # every worker's lines: the hub's
        is_final = functools.partial(self._is_final, job)
        hub = functools.partial(self._log_hubs.join, job.id, is_final) if shared else None
        async for batch in follow(reader, is_final, self._log_poll, query.follow, hub):
            yield batch

    def _is_final(self, job: JobRecord) -> bool:
        """No more log lines can come: the job is final, or its supervisor is gone."""
        state = self._read_state(job)
        if state is not None and state.get("state") in TERMINAL_STATES:
            return True
        return self._supervisor_pid(job) is None

    async def remove(self, job: JobRecord) -> None:
        self.forget(job)
        job_dir = self._job_dir(job)
        if job_dir is not None:
            try:
                # Its package and /tmp hold what the job wrote: any depth, any symlink.
                await asyncio.to_thread(trees.remove_path, job_dir)
            except OSError as exc:
                log.warning("job_dir_not_removed", job=job.name, job_dir=str(job_dir), error=str(exc))


def _read_events(job: JobRecord, job_dir: Path, cursor: str | None) -> tuple[tuple[ObservedEvent, ...], str]:
    """The events the supervisor appended after `cursor` (`e<byte offset>` in
    events.jsonl), and the cursor after them: whole lines only, the rest next time."""
    offset = int(cursor[1:]) if cursor and cursor[0] == "e" and cursor[1:].isdigit() else 0
    try:
        with open(job_dir / "events.jsonl", "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return (), f"e{offset}"
    end = data.rfind(b"\n") + 1
    events = []
    for raw in data[:end].splitlines():
        try:
            item = json.loads(raw)
            events.append(ObservedEvent(*(str(item[k]) for k in ("time", "type", "reason", "message"))))
        except (ValueError, KeyError, TypeError):
            log.warning("unreadable_event_line", job=job.name, line=raw[:200])
    return tuple(events), f"e{offset + end}"


def _write_stop_reason(job_dir: Path, reason: str) -> None:
    """Leave `reason` in the job's directory (STOP_REASON) for its supervisor: written beside
    and renamed into place, never following a link, so it reads all of it or none."""
    dir_fd = os.open(job_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        tmp = f".{STOP_REASON}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o644, dir_fd=dir_fd)
        try:
            os.write(fd, reason.encode())
        finally:
            os.close(fd)
        os.rename(tmp, STOP_REASON, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def free_ports(count: int) -> list[int]:
    """`count` distinct ports the kernel says are free now (bound and released together)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _last_lines(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return "no output"
    return " | ".join(text[-lines:]) or "no output"
