"""Launch plans for the local backend: which processes a job runs, with which environment.

`build_plan` is pure: it turns a job's launch (what the job asked) and a `HostPlan` (what
this machine decided for it: paths as the workers see them, ports, GPUs, sandbox,
cgroups, Python) into a `Plan` that the supervisor (`paddlecloud.jobs.local.supervisor`)
reads from `JOB_DIR/plan.json`.

How the runtime contract (DESIGN §4) maps onto one machine:

- Every host is `host` (127.0.0.1); parameter servers differ by port. A sandboxed job's
  127.0.0.1 is its own namespace's loopback (`Plan.network`), shared by its workers and
  its supervisor alone, so the endpoints below mean the same inside it. The fleet-style
  `PADDLE_PSERVERS_IP_PORT_LIST` (`127.0.0.1:p0,127.0.0.1:p1`) is the reliable endpoint
  list here.
- Paddle v1/v2 names a list of hosts sharing one port. A v1 *trainer* therefore sees
  the same host repeated (`PADDLE_INIT_PSERVERS=127.0.0.1,127.0.0.1`) and the port of
  pserver-0 in `PADDLE_INIT_PORT`: with more than one parameter server it can reach only
  the first. A v1 *parameter server* gets its own port in `PADDLE_INIT_PORT`, so it
  listens where the supervisor waits for it; without parameter servers it is empty.
  `PADDLE_INIT_PORTS_NUM` is 1 and
  `PADDLE_INIT_PORTS_NUM_FOR_SPARSE` is 0: one port per server is all that is allocated.
- `PADDLE_INIT_TRAINER_COUNT` keeps its v1 meaning, threads or devices per trainer
  process (the spec's `gpu`, at least 1), not the number of trainers (that is `TRAINERS`).
- `NAMESPACE` is set and empty: there is no Kubernetes namespace on this backend, and a
  program that tests it learns exactly that.
- `TRAINER_ID`, `PADDLE_INIT_TRAINER_ID` and `PADDLE_TRAINER_ID` are the worker's index
  within its role, for parameter servers too (as Kubeflow's PaddleJob does); a trainer's
  id never changes across restarts because the plan, not the launch order, fixes it.
- The PyTorch names are given to trainers only (a parameter server with `WORLD_SIZE`
  would join a process group it is not part of). Every trainer is on this one machine,
  so `LOCAL_RANK` = `RANK` and `LOCAL_WORLD_SIZE` = `WORLD_SIZE`, except for trainers
  that hold GPUs: each sees only its own devices, so it gets `LOCAL_RANK` 0 and
  `LOCAL_WORLD_SIZE` 1, as in a pod, and `cuda:LOCAL_RANK` is its own first GPU.
- `PADDLE_NNODES` counts trainer processes and `PADDLE_MASTER` is the same rendezvous
  endpoint as `MASTER_ADDR:MASTER_PORT`; `PADDLE_JOB_ID` is the job's name.
- The user's `env` may not redefine a contract variable (`RESERVED_ENV`): the platform's
  values are what the training program must be able to rely on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paddlecloud.common.cgroups import Hierarchy
from paddlecloud.common.sandbox import Bind

from ..contract import RESERVED_ENV, JobContract, contract_env

if TYPE_CHECKING:
    # For the annotations only: every supervisor imports this module, and needs neither
    # the store nor pydantic, which these would bring in.
    from ..backend import Launch
    from ..spec import JobSpec

DEFAULT_GRACE_SECONDS = 10.0
# The file in a job's directory where the jobs service says why it stops the job (who, when).
STOP_REASON = "stop-reason"
DEFAULT_PORT_TIMEOUT_SECONDS = 120.0
DEFAULT_RESTART_DELAY_SECONDS = 1.0


class Role(StrEnum):
    PSERVER = "PSERVER"
    TRAINER = "TRAINER"


@dataclass(frozen=True)
class Worker:
    """One process of the job. `cwd` is the job package; the supervisor runs the worker in
    its own mirror of it (see the supervisor's module docstring)."""

    name: str
    role: Role
    index: int
    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    host: str = "127.0.0.1"
    port: int | None = None  # parameter servers: where the supervisor waits for them
    memory_bytes: int | None = None  # enforced with cgroups where the plan has them
    cpu_milli: int | None = None
    devices: tuple[str, ...] = ()  # the GPUs this worker holds

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["role"] = self.role.value
        data["argv"] = list(self.argv)
        data["env"] = dict(self.env)
        data["devices"] = list(self.devices)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Worker:
        return cls(
            name=str(data["name"]),
            role=Role(data["role"]),
            index=int(data["index"]),
            argv=tuple(str(a) for a in data["argv"]),
            cwd=str(data["cwd"]),
            env={str(k): str(v) for k, v in data["env"].items()},
            host=str(data.get("host", "127.0.0.1")),
            port=None if data.get("port") is None else int(data["port"]),
            memory_bytes=_opt_int(data.get("memory_bytes")),
            cpu_milli=_opt_int(data.get("cpu_milli")),
            devices=tuple(str(d) for d in data.get("devices", ())),
        )


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class SandboxPlan:
    """How the supervisor sandboxes every worker (services/common/sandbox.py): as `uid`,
    seeing `binds` (the user's PFS home and public, the unpacked package) besides the
    system and the Python environment. `package_host` is where the package really is,
    for the supervisor's own work; the workers see it at their `cwd`."""

    uid: int
    gid: int
    binds: tuple[Bind, ...]
    package_host: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "gid": self.gid,
            "binds": [b.to_dict() for b in self.binds],
            "package_host": self.package_host,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SandboxPlan:
        return cls(
            uid=int(data["uid"]),
            gid=int(data["gid"]),
            binds=tuple(Bind.from_dict(b) for b in data["binds"]),
            package_host=str(data["package_host"]),
        )


@dataclass(frozen=True)
class CgroupPlan:
    """Where the supervisor makes each worker's group: `<root>/<parent>/<job>/<worker>`."""

    version: int
    root: str
    parent: str
    job: str
    pids_max: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def hierarchy(self) -> Hierarchy:
        return Hierarchy(2 if self.version == 2 else 1, Path(self.root), self.parent)

    def group_of(self, worker: str) -> str:
        """The worker's group, relative to the hierarchy's parent."""
        return f"{self.job}/{worker}"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CgroupPlan:
        return cls(
            int(data["version"]),
            str(data["root"]),
            str(data["parent"]),
            str(data["job"]),
            int(data["pids_max"]),
        )


@dataclass(frozen=True)
class Plan:
    """Everything the supervisor needs to run one job; round-trips through JSON."""

    job_name: str
    workers: tuple[Worker, ...]
    max_restarts: int
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    port_timeout_seconds: float = DEFAULT_PORT_TIMEOUT_SECONDS
    restart_delay_seconds: float = DEFAULT_RESTART_DELAY_SECONDS
    # None: workers run unsandboxed, as the supervisor's user, with no limits.
    sandbox: SandboxPlan | None = None
    cgroups: CgroupPlan | None = None
    # The interpreter `python` means for the workers (first on their PATH): a built
    # environment's, or None for the platform's own.
    python: str | None = None
    # The jobs service's datagram socket, told the job's id whenever state.json changes
    # (a hint: the service polls too), or None.
    notify: str | None = None
    # The most each worker's log keeps (its newest bytes; caplog.py); None: no cap.
    log_max_bytes: int | None = None
    # The most the job may add to its package and working directories while it runs
    # (the supervisor checks every DISK_CHECK_SECONDS); None: no bound.
    scratch_max_bytes: int | None = None
    # The job's network namespace (services/common/netns.py), which the supervisor enters
    # before it starts a worker: "none" (its own loopback only), "outbound" (and other
    # hosts through pasta), or None: the host's network (unsandboxed jobs).
    network: str | None = None

    @property
    def pservers(self) -> tuple[Worker, ...]:
        return tuple(w for w in self.workers if w.role is Role.PSERVER)

    @property
    def trainers(self) -> tuple[Worker, ...]:
        return tuple(w for w in self.workers if w.role is Role.TRAINER)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_name": self.job_name,
            "workers": [w.to_dict() for w in self.workers],
            "max_restarts": self.max_restarts,
            "grace_seconds": self.grace_seconds,
            "port_timeout_seconds": self.port_timeout_seconds,
            "restart_delay_seconds": self.restart_delay_seconds,
            "sandbox": None if self.sandbox is None else self.sandbox.to_dict(),
            "cgroups": None if self.cgroups is None else self.cgroups.to_dict(),
            "python": self.python,
            "notify": self.notify,
            "log_max_bytes": self.log_max_bytes,
            "scratch_max_bytes": self.scratch_max_bytes,
            "network": self.network,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        return cls(
            job_name=str(data["job_name"]),
            workers=tuple(Worker.from_dict(w) for w in data["workers"]),
            max_restarts=int(data["max_restarts"]),
            grace_seconds=float(data.get("grace_seconds", DEFAULT_GRACE_SECONDS)),
            port_timeout_seconds=float(data.get("port_timeout_seconds", DEFAULT_PORT_TIMEOUT_SECONDS)),
            restart_delay_seconds=float(data.get("restart_delay_seconds", DEFAULT_RESTART_DELAY_SECONDS)),
            sandbox=None if data.get("sandbox") is None else SandboxPlan.from_dict(data["sandbox"]),
            cgroups=None if data.get("cgroups") is None else CgroupPlan.from_dict(data["cgroups"]),
            python=None if data.get("python") is None else str(data["python"]),
            notify=None if data.get("notify") is None else str(data["notify"]),
            log_max_bytes=_opt_int(data.get("log_max_bytes")),
            scratch_max_bytes=_opt_int(data.get("scratch_max_bytes")),
            network=None if data.get("network") is None else str(data["network"]),
        )


@dataclass(frozen=True)
class Ports:
    """The ports this machine found free for one job: one per parameter server, one per
    trainer (its fleet endpoint), and the PyTorch/Kubeflow rendezvous (`master`)."""

    pservers: tuple[int, ...]
    trainers: tuple[int, ...]
    master: int

    @classmethod
    def split(cls, ports: Sequence[int], pservers: int) -> Ports:
        """One list of ports, as `free_ports` gives them, shared out: the servers' first,
        then the trainers', the master's last."""
        return cls(tuple(ports[:pservers]), tuple(ports[pservers:-1]), ports[-1])


@dataclass(frozen=True)
class WorkerPaths:
    """The job's paths as its workers see them: PFS paths inside a sandbox, which binds
    them there; the real directories without one."""

    pfs_home: str
    output: str
    package: str  # TRAINER_PACKAGE, and every worker's cwd
    input: str | None = None  # None: the job has no input


@dataclass(frozen=True)
class HostPlan:
    """What this machine decided for one job, where the launch says what the job asked:
    where its workers see its paths, the ports and GPUs it holds, how it is sandboxed and
    limited, its Python, and the service's settings for it."""

    paths: WorkerPaths
    ports: Ports
    # A worker's name → the GPUs it holds, which it sees in CUDA_VISIBLE_DEVICES (every
    # other worker sees none).
    devices: Mapping[str, Sequence[str]] = field(default_factory=dict)
    sandbox: SandboxPlan | None = None
    cgroups: CgroupPlan | None = None
    python: str | None = None
    network: str | None = None
    notify: str | None = None
    log_max_bytes: int | None = None
    scratch_max_bytes: int | None = None
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    port_timeout_seconds: float = DEFAULT_PORT_TIMEOUT_SECONDS
    restart_delay_seconds: float = DEFAULT_RESTART_DELAY_SECONDS
    host: str = "127.0.0.1"  # where every worker is reached
    socket_ifname: str = "lo"  # the interface `host` is on (gloo and NCCL bind there)


def build_plan(launch: Launch, host: HostPlan) -> Plan:
    """The launch plan for a job: parameter servers first, then trainers, each with the
    complete runtime contract of DESIGN §4 plus the user's `env`.

    The job (its spec, owner and datacenter) comes from `launch`; where it runs on this
    machine from `host`. Parameter servers run the spec's `psentry` when given, else its
    `entry` (with TRAINING_ROLE=PSERVER); each worker's memory and cpu are its role's in
    the spec. Raises ValueError on inconsistent counts or on a user variable that would
    override the contract.
    """
    spec = launch.spec
    _check(spec, host.ports)
    ports = host.ports
    contract = JobContract(
        job_name=spec.name,
        user=launch.job.owner,
        datacenter=launch.datacenter,
        pfs_home=host.paths.pfs_home,
        output=host.paths.output,
        entry=spec.entry,
        package_dir=host.paths.package,
        namespace="",
        passes=spec.passes,
        use_gpu=spec.gpu > 0,
        devices_per_trainer=max(spec.gpu, 1),
        pservers=[(host.host, port) for port in ports.pservers],
        trainers=[(host.host, port) for port in ports.trainers],
        master=(host.host, ports.master),
        socket_ifname=host.socket_ifname,
        user_env=spec.env,
        input=host.paths.input,
    )
    commands = {Role.TRAINER: spec.entry, Role.PSERVER: spec.psentry or spec.entry}
    resources = {
        Role.PSERVER: (spec.psmemory_bytes, spec.pscpu_milli),
        Role.TRAINER: (spec.memory_bytes, spec.cpu_milli),
    }

    def worker(role: Role, index: int, own_port: int) -> Worker:
        name = f"{role.value.lower()}-{index}"
        held = tuple(host.devices.get(name, ()))
        # Every trainer is on this one machine: its local rank is its rank. A trainer
        # holding GPUs sees only its own, so there it is alone, as in a pod: programs that
        # pick `cuda:LOCAL_RANK` must get device 0, not another trainer's index.
        alone = role is Role.TRAINER and bool(held)
        worker_env = contract_env(
            contract,
            role=role.value,
            index=str(index),
            host=host.host,
            port=own_port,
            local_rank="0" if alone else str(index),
            local_world_size=1 if alone else spec.trainers,
            devices=held,
        )
        memory, cpu = resources[role]
        return Worker(
            name=name,
            role=role,
            index=index,
            argv=("/bin/sh", "-c", commands[role]),
            cwd=host.paths.package,
            env=worker_env,
            host=host.host,
            port=own_port if role is Role.PSERVER else None,
            memory_bytes=memory,
            cpu_milli=cpu,
            devices=held,
        )

    workers = [worker(Role.PSERVER, i, port) for i, port in enumerate(ports.pservers)]
    workers += [worker(Role.TRAINER, i, port) for i, port in enumerate(ports.trainers)]
    return Plan(
        job_name=spec.name,
        workers=tuple(workers),
        max_restarts=spec.max_restarts,
        grace_seconds=host.grace_seconds,
        port_timeout_seconds=host.port_timeout_seconds,
        restart_delay_seconds=host.restart_delay_seconds,
        sandbox=host.sandbox,
        cgroups=host.cgroups,
        python=host.python,
        notify=host.notify,
        log_max_bytes=host.log_max_bytes,
        scratch_max_bytes=host.scratch_max_bytes,
        network=host.network,
    )


def _check(spec: JobSpec, ports: Ports) -> None:
    """ValueError if the spec and the ports do not make one job. The spec was validated at
    submit; this guards the plan itself, whoever builds it."""
    if spec.trainers < 1:
        raise ValueError(f"trainers must be at least 1, not {spec.trainers}")
    if spec.pservers < 0:
        raise ValueError(f"pservers must not be negative, not {spec.pservers}")
    if len(ports.pservers) != spec.pservers:
        raise ValueError(
            f"need one port per parameter server: {spec.pservers} pservers, {len(ports.pservers)} ports"
        )
    if len(ports.trainers) != spec.trainers:
        raise ValueError(f"need one port per trainer: {spec.trainers} trainers, {len(ports.trainers)} ports")
    clashes = sorted(RESERVED_ENV & spec.env.keys())
    if clashes:
        raise ValueError(f"env may not set variables of the runtime contract: {', '.join(clashes)}")
    if spec.max_restarts < 0:
        raise ValueError(f"max_restarts must not be negative, not {spec.max_restarts}")
