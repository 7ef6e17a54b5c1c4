"""The runtime contract (DESIGN §4): its variable names, and the one function that gives a worker its values.

Every backend builds a worker's environment with `contract_env`, so a program sees the
same variables with the same meanings wherever it runs; backends differ only in the
hosts, ports and per-process references they pass in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# Every variable the platform sets; the PyTorch ones only for trainers, and
# PADDLE_INIT_NUM_PASSES only for a job that gives `passes` (INPUT_ENV, below, only for
# a job that gives `input`).
PADDLECLOUD_ENV = (
    "PADDLE_JOB_NAME",
    "PADDLE_CLOUD_CURRENT_DATACENTER",
    "PADDLE_CLOUD_USER",
    "PADDLE_CLOUD_PFS_HOME",
    "PADDLE_CLOUD_OUTPUT",
    "TRAINING_ROLE",
    "TRAINER_ID",
    "TRAINERS",
    "PSERVERS",
    "ENTRY",
    "TRAINER_PACKAGE",
    "NAMESPACE",
)
PADDLE_V1_ENV = (
    "PADDLE_INIT_TRAINER_ID",
    "PADDLE_INIT_NUM_GRADIENT_SERVERS",
    "PADDLE_INIT_PSERVERS",
    "PADDLE_INIT_PORT",
    "PADDLE_INIT_PORTS_NUM",
    "PADDLE_INIT_PORTS_NUM_FOR_SPARSE",
    "PADDLE_INIT_TRAINER_COUNT",
    "PADDLE_INIT_NUM_PASSES",
    "PADDLE_INIT_USE_GPU",
)
FLEET_ENV = (
    "PADDLE_PSERVERS_IP_PORT_LIST",
    "PADDLE_TRAINER_ENDPOINTS",
    "PADDLE_TRAINERS_NUM",
    "PADDLE_TRAINER_ID",
    "PADDLE_CURRENT_ENDPOINT",
    "PADDLE_PORT",
    "POD_IP",
)
PYTORCH_ENV = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
KUBEFLOW_ENV = ("PADDLE_JOB_ID", "PADDLE_NNODES", "PADDLE_SERVER_NUM", "PADDLE_TRAINER_NUM", "PADDLE_MASTER")
# Where the job's input is, in the worker's view; set only for a job that gives `input`.
# A user's `env` may not set it either: spec.py adds it to the names it refuses there.
INPUT_ENV = "PADDLE_CLOUD_INPUT"
# The devices a worker was given; set by the platform so that no job reaches another's GPUs.
DEVICE_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
RESERVED_ENV = frozenset(
    PADDLECLOUD_ENV + PADDLE_V1_ENV + FLEET_ENV + PYTORCH_ENV + KUBEFLOW_ENV + DEVICE_ENV
)
# What Paddle's collective mode needs and `paddle.distributed.launch` would have set:
# the interface gloo and NCCL bind their sockets to (without it gloo picks by the host
# name and crashes where that resolves elsewhere) and the backend, gloo on CPU, nccl on
# GPUs. Defaults only: a user's `env` may set each (docs/paddle.md).
COLLECTIVE_ENV = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "PADDLE_DISTRI_BACKEND")


@dataclass(frozen=True)
class JobContract:
    """What the runtime contract says about a whole job, the same for each of its workers.

    Endpoints are `(host, port)` pairs in index order; `master` is the PyTorch/Kubeflow
    rendezvous (`MASTER_ADDR:MASTER_PORT`, `PADDLE_MASTER`). A backend that fills some
    values in per process (Kubernetes expands `$(VAR)` references) passes them in the
    form it wants them to reach the environment in: `contract_env` only places and joins
    what it is given, so references and escapes pass through unchanged.
    """

    job_name: str
    user: str
    datacenter: str
    pfs_home: str
    output: str
    entry: str
    package_dir: str  # TRAINER_PACKAGE
    namespace: str  # "" where there is none
    passes: int | None  # None: the job did not ask, and PADDLE_INIT_NUM_PASSES is not set
    use_gpu: bool
    devices_per_trainer: int  # PADDLE_INIT_TRAINER_COUNT, v1's threads or devices per trainer
    pservers: Sequence[tuple[str, int]]
    trainers: Sequence[tuple[str, int]]
    master: tuple[str, int]
    socket_ifname: str  # the network interface workers reach each other on (lo, eth0)
    user_env: Mapping[str, str] = field(default_factory=dict)
    input: str | None = None  # INPUT_ENV; None: the job has no input, and it is not set


def contract_env(
    job: JobContract,
    *,
    role: str,
    index: str,
    host: str,
    port: int,
    local_rank: str,
    local_world_size: int,
    devices: Sequence[str] | None,
) -> dict[str, str]:
    """The environment of one worker: the defaults of COLLECTIVE_ENV, then the user's
    `env` (which wins over those), then every other variable of the contract (which wins
    over a user's value of the same name), PADDLE_CLOUD_INPUT among them for a job that
    has an input.

    `role` is PSERVER or TRAINER; `index` the worker's index within its role (its
    TRAINER_ID, also for parameter servers, as Kubeflow's PaddleJob does); `host` and
    `port` where it is reached (POD_IP, PADDLE_CURRENT_ENDPOINT, PADDLE_PORT). A v1
    parameter server is told its own port in PADDLE_INIT_PORT, a v1 trainer the first
    server's (v1 lists hosts that share one port); without servers it is empty.
    `local_rank`/`local_world_size` say where a trainer stands among those on its own
    machine. `devices` are the GPUs it may use (CUDA_VISIBLE_DEVICES, and
    NVIDIA_VISIBLE_DEVICES, "void" for none); None leaves both to the platform (the
    Kubernetes device plugin). The PyTorch names are a trainer's only: a parameter
    server with WORLD_SIZE would join a process group it is not part of.
    """
    if role not in ("PSERVER", "TRAINER"):
        raise ValueError(f"role must be PSERVER or TRAINER, not {role!r}")
    trainers, pservers = len(job.trainers), len(job.pservers)
    master_host, master_port = job.master
    if role == "PSERVER":
        v1_port = str(port)
    else:
        v1_port = str(job.pservers[0][1]) if job.pservers else ""
    env = {
        "GLOO_SOCKET_IFNAME": job.socket_ifname,
        "NCCL_SOCKET_IFNAME": job.socket_ifname,
        "PADDLE_DISTRI_BACKEND": "nccl" if job.use_gpu else "gloo",
    }
    env |= job.user_env
    if job.input is not None:
        env[INPUT_ENV] = job.input
    env |= {
        "PADDLE_JOB_NAME": job.job_name,
        "PADDLE_CLOUD_CURRENT_DATACENTER": job.datacenter,
        "PADDLE_CLOUD_USER": job.user,
        "PADDLE_CLOUD_PFS_HOME": job.pfs_home,
        "PADDLE_CLOUD_OUTPUT": job.output,
        "TRAINERS": str(trainers),
        "PSERVERS": str(pservers),
        "ENTRY": job.entry,
        "TRAINER_PACKAGE": job.package_dir,
        "NAMESPACE": job.namespace,
        "PADDLE_INIT_NUM_GRADIENT_SERVERS": str(trainers),
        "PADDLE_INIT_PSERVERS": ",".join(h for h, _ in job.pservers),
        "PADDLE_INIT_PORTS_NUM": "1",
        "PADDLE_INIT_PORTS_NUM_FOR_SPARSE": "0",
        "PADDLE_INIT_TRAINER_COUNT": str(job.devices_per_trainer),
        "PADDLE_INIT_USE_GPU": "1" if job.use_gpu else "0",
        "PADDLE_PSERVERS_IP_PORT_LIST": ",".join(f"{h}:{p}" for h, p in job.pservers),
        "PADDLE_TRAINER_ENDPOINTS": ",".join(f"{h}:{p}" for h, p in job.trainers),
        "PADDLE_TRAINERS_NUM": str(trainers),
        "POD_IP": host,
        "PADDLE_JOB_ID": job.job_name,
        "PADDLE_NNODES": str(trainers),
        "PADDLE_SERVER_NUM": str(pservers),
        "PADDLE_TRAINER_NUM": str(trainers),
        "PADDLE_MASTER": f"{master_host}:{master_port}",
        "TRAINING_ROLE": role,
        "TRAINER_ID": index,
        "PADDLE_INIT_TRAINER_ID": index,
        "PADDLE_TRAINER_ID": index,
        "PADDLE_INIT_PORT": v1_port,
        "PADDLE_CURRENT_ENDPOINT": f"{host}:{port}",
        "PADDLE_PORT": str(port),
    }
    if job.passes is not None:
        # Only a job that asked for passes is told a number: any default made up here
        # would override the program's own, which it can apply only when this is unset.
        env["PADDLE_INIT_NUM_PASSES"] = str(job.passes)
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        env["NVIDIA_VISIBLE_DEVICES"] = ",".join(devices) or "void"
    if role == "TRAINER":
        env |= {
            "MASTER_ADDR": master_host,
            "MASTER_PORT": str(master_port),
            "WORLD_SIZE": str(trainers),
            "RANK": index,
            "LOCAL_RANK": local_rank,
            "LOCAL_WORLD_SIZE": str(local_world_size),
        }
    return env
