"""The original Python API: `job.PaddleJob(job_name=..., runtime_image=..., cephfs_volume=...)`
and `dist_train`, each argument mapped onto today's job spec or refused by name with the reason.

The original docs (the `paddle.job` package of PaddlePaddle's cluster-training design)
submit a job from Python::

    from paddlecloud import job

    paddle_job = job.PaddleJob(
        job_name="word2vec",
        entry_point="python train.py",
        trainer_package_path="./word2vec",   # a local directory (packed and uploaded) or /pfs/...
        memory="1G",
        cpu_nums=1,
        runtime_image="paddlepaddle/paddle",
    )
    job.dist_train(trainer=train, paddle_job=paddle_job)   # submits here, trains in the job

How each original argument maps (the defaults are the original's):

=====================================  =====================================================
original                               today's spec
=====================================  =====================================================
job_name                               name
entry_point                            entry
trainer_package / trainer_package_path package: a local directory or archive, or /pfs/...
runtime_image / base_image             image (the Kubernetes backend runs it; one machine
                                       runs the package in a Python environment instead)
cpu_nums / cpu_num / trainer_cpu       cpu, per trainer
memory / trainer_mem                   memory, per trainer (default "1G")
gpu_nums / gpu_num / trainer_gpu       gpu, per trainer (default 0)
use_gpu                                gpu 1 unless gpu_nums says how many; False with
                                       gpu_nums > 0 is refused as a contradiction
trainers                               trainers (default 3)
pservers / num_parameter_servers       pservers (default 2)
pserver_cpu / pserver_mem              pscpu / psmemory
input, output, env, passes, registry,  the same fields
datacenter, topology, max_restarts,
psentry
namespace                              not sent: the server runs your jobs in your own
                                       namespace (the original's JobManager also took it
                                       from your credentials, whatever was passed); a
                                       warning says so
cephfs_volume (a CephFSVolume)         refused: see `CEPHFS_REFUSAL`
=====================================  =====================================================

Refusals are `OriginalArgumentRefused` (a `PaddleCloudError`), raised when the job is
submitted (`spec()`), naming the argument and why; building a `PaddleJob` never fails on an
original keyword.
"""

from __future__ import annotations

import inspect
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import runtime
from .errors import PaddleCloudError
from .paddlejob import PaddleJob as _PaddleJob

if TYPE_CHECKING:
    from .answers import DryRun, Job
    from .client import Client

__all__ = ["CEPHFS_REFUSAL", "CephFSVolume", "OriginalArgumentRefused", "PaddleJob", "dist_train"]

# The original's defaults (paddle.job's README, "Advanced Parameters").
DEFAULT_TRAINERS = 3
DEFAULT_PSERVERS = 2
DEFAULT_GPUS = 0
DEFAULT_MEMORY = "1G"

CEPHFS_REFUSAL = (
    "a CephFS volume only means something on the Kubernetes backend, and there the operator "
    "gives every job its datacenter's PFS volume (jobs.kubernetes.datacenters); a job does not "
    "mount one of its own, on any backend. Leave cephfs_volume out: every job sees your PFS home "
    "at /pfs/<datacenter>/home/<you> (paddlecloud.runtime.pfs_home() in the job) where the "
    "original mounted CephFS at mount_path; put data there with `paddlecloud cp` and name it "
    "with input="
)


class OriginalArgumentRefused(PaddleCloudError):
    """An argument of the original API that cannot be honoured here; the message names it and why."""

    def __init__(self, argument: str, reason: str) -> None:
        self.argument = argument
        super().__init__(f"{argument}: {reason}")


def _setting(value: Any, variable: str, default: Any, environ: Mapping[str, str]) -> Any:
    """The original's `get_parameter`: the argument, else the environment variable, else the default."""
    if value:
        return value
    return environ.get(variable) or default


class CephFSVolume:
    """The original's CephFS volume description, with its defaults and environment variables.

    It is accepted and kept, so that the original call builds; submitting a job with it is
    refused (`CEPHFS_REFUSAL`), since PaddleCloud mounts the datacenter's PFS itself.
    """

    def __init__(
        self,
        monitors_addr: str | None = None,
        user: str | None = None,
        secret_name: str | None = None,
        mount_path: str | None = None,
        path: str | None = None,
        *,
        cephfs_path: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        addresses = _setting(monitors_addr, "CEPHFS_MONITORS_ADDR", "", env)
        self.monitors = [a.strip() for a in str(addresses).split(",") if a.strip()]
        self.user = _setting(user, "CEPHFS_USER", "admin", env)
        self.secret_name = _setting(secret_name, "CEPHFS_SECRET", "cephfs-secret", env)
        self.mount_path = _setting(mount_path, "CEPHFS_MOUNT_PATH", "/data", env)
        # `path` in the original's README, `cephfs_path` in its code.
        self.path = _setting(path or cephfs_path, "CEPHFS_PATH", "/", env)

    def __repr__(self) -> str:
        return (
            f"CephFSVolume(monitors_addr={','.join(self.monitors)!r}, user={self.user!r}, "
            f"secret_name={self.secret_name!r}, mount_path={self.mount_path!r}, path={self.path!r})"
        )


# An argument's spellings, original and first-design, in the order they are preferred.
_SPELLINGS = {
    "package": ("trainer_package", "trainer_package_path"),
    "image": ("runtime_image", "base_image"),
    "cpu": ("cpu_nums", "cpu_num", "trainer_cpu"),
    "memory": ("memory", "trainer_mem"),
    "gpu": ("gpu_nums", "gpu_num", "trainer_gpu"),
    "pservers": ("pservers", "num_parameter_servers"),
}
_DEFAULTS = {"memory": DEFAULT_MEMORY, "gpu": DEFAULT_GPUS, "pservers": DEFAULT_PSERVERS}


class PaddleJob(_PaddleJob):
    """A job described with the original API's keywords; submitted, followed and killed like
    `paddlecloud.PaddleJob` (`submit(client)`, `logs()`, `wait()`, `kill()`).

    See the module's table for how each keyword maps. Unless given, a job has the original's
    3 trainers, 2 parameter servers, no GPU and 1G of memory per trainer. The original names
    stay readable as attributes (`job_name`, `entry_point`, `cpu_nums`, `gpu_nums`,
    `runtime_image`, `use_gpu`, `cephfs_volume`, `namespace`).
    """

    def __init__(
        self,
        job_name: str,
        trainer_package: str | os.PathLike[str] | None = None,
        entry_point: str | None = None,
        runtime_image: str | None = None,
        cpu_nums: str | int | float | None = None,
        memory: str | None = None,
        gpu_nums: int | None = None,
        cephfs_volume: CephFSVolume | None = None,
        trainers: int = DEFAULT_TRAINERS,
        pservers: int | None = None,
        *,
        trainer_package_path: str | os.PathLike[str] | None = None,
        base_image: str | None = None,
        cpu_num: str | int | float | None = None,
        gpu_num: int | None = None,
        use_gpu: bool | None = None,
        namespace: str | None = None,
        num_parameter_servers: int | None = None,
        trainer_cpu: str | int | float | None = None,
        trainer_gpu: int | None = None,
        trainer_mem: str | None = None,
        pserver_cpu: str | int | float | None = None,
        pserver_mem: str | None = None,
        psentry: str | None = None,
        input: str | None = None,
        output: str | None = None,
        env: dict[str, str] | None = None,
        passes: int | None = None,
        registry: str | None = None,
        datacenter: str | None = None,
        topology: str | None = None,
        max_restarts: int | None = None,
    ) -> None:
        self._namespace_warned = False
        # Every spelling as given: `spec()` refuses two that disagree when the job is submitted.
        self._given: dict[str, Any] = {
            "trainer_package": trainer_package,
            "trainer_package_path": trainer_package_path,
            "runtime_image": runtime_image,
            "base_image": base_image,
            "cpu_nums": cpu_nums,
            "cpu_num": cpu_num,
            "trainer_cpu": trainer_cpu,
            "memory": memory,
            "trainer_mem": trainer_mem,
            "gpu_nums": gpu_nums,
            "gpu_num": gpu_num,
            "trainer_gpu": trainer_gpu,
            "pservers": pservers,
            "num_parameter_servers": num_parameter_servers,
        }
        chosen = {field: self._first(field) for field in _SPELLINGS}
        self.job_name = job_name
        self.entry_point = entry_point
        self.runtime_image = chosen["image"]
        self.cpu_nums = chosen["cpu"]
        self.gpu_nums: int = chosen["gpu"]
        self.use_gpu = use_gpu
        self.cephfs_volume = cephfs_volume
        self.namespace = namespace
        super().__init__(
            name=job_name,
            package=chosen["package"] if chosen["package"] is not None else "",
            entry=entry_point,
            trainers=trainers,
            pservers=chosen["pservers"],
            cpu=chosen["cpu"],
            memory=chosen["memory"],
            image=chosen["image"],
            pscpu=pserver_cpu,
            psmemory=pserver_mem,
            psentry=psentry,
            input=input,
            output=output,
            env=env,
            passes=passes,
            registry=registry,
            datacenter=datacenter,
            topology=topology,
            max_restarts=max_restarts,
        )
        self.gpu = self._gpus()

    def _first(self, field: str) -> Any:
        values = [self._given[name] for name in _SPELLINGS[field] if self._given[name] is not None]
        return values[0] if values else _DEFAULTS.get(field)

    def _gpus(self) -> int:
        # use_gpu alone means one GPU per trainer, as `submit --use-gpu` does.
        return self.gpu_nums if self.gpu_nums or not self.use_gpu else 1

    def spec(self, package_path: str | None = None) -> dict[str, Any]:
        """Today's spec for this job: each original argument mapped, or `OriginalArgumentRefused`."""
        self._check()
        return super().spec(package_path)

    def submit(self, client: Client, *, dry_run: bool = False) -> Job | DryRun:
        """As `paddlecloud.PaddleJob.submit`, after the original arguments are checked (before
        anything is packed or uploaded)."""
        self._check()
        return super().submit(client, dry_run=dry_run)

    def _check(self) -> None:
        if self.cephfs_volume is not None:
            raise OriginalArgumentRefused("cephfs_volume", CEPHFS_REFUSAL)
        for spellings in _SPELLINGS.values():
            given = {name: self._given[name] for name in spellings if self._given[name] is not None}
            if len({repr(v) for v in given.values()}) > 1:
                spelled = " and ".join(f"{name}={value!r}" for name, value in given.items())
                raise OriginalArgumentRefused(spellings[0], f"{spelled} disagree; give one")
        if not os.fspath(self.package):
            raise OriginalArgumentRefused(
                "trainer_package_path",
                "which package? give the directory of your training code (packed and uploaded) "
                "or its path on PFS",
            )
        if self.use_gpu is False and self.gpu_nums:
            raise OriginalArgumentRefused("use_gpu", f"use_gpu=False but gpu_nums={self.gpu_nums}: say which")
        # Once per job: `submit` checks, then builds the spec, which checks again.
        if self.namespace is not None and not self._namespace_warned:
            self._namespace_warned = True
            warnings.warn(
                f"namespace={self.namespace!r} is not sent: the server runs your jobs in your own "
                "namespace, as the original's JobManager took it from your credentials",
                stacklevel=3,
            )


# --- dist_train ----------------------------------------------------------------------------

# The first design's keywords that `dist_train` takes for the job, by their PaddleJob names.
_FIRST_DESIGN_NAMES = {"k8s_job": "job_name", "num_parameter_servers": "num_parameter_servers"}
_REFUSED_KEYWORDS = {
    "k8s_user": "PaddleCloud signs in with the client config's credentials (~/.paddle/config)",
    "k8s_token": "PaddleCloud signs in with the client config's credentials (~/.paddle/config)",
    "volume": "a job does not mount a volume of its own; your PFS home is at /pfs/<datacenter>/home/<you>",
}


def on_cloud(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process runs inside a PaddleCloud job (or says so as the original did)."""
    env = os.environ if environ is None else environ
    return runtime.in_paddlecloud(env) or env.get("RUNNING_ON_CLOUD", "").upper() == "YES"


def dist_train(
    trainer: Any = None,
    reader: Any = None,
    paddle_job: PaddleJob | None = None,
    *,
    model: Any = None,
    optimizer: Any = None,
    num_passes: int | None = None,
    event_handler: Callable[..., Any] | None = None,
    feeding: Any = None,
    client: Client | None = None,
    environ: Mapping[str, str] | None = None,
    **keywords: Any,
) -> Any:
    """Train here when running inside a PaddleCloud job; otherwise submit this program as one.

    The original designs' `paddle.dist_train`/`paddle.job.dist_train`: the same script runs
    twice, on your machine (it submits the job and returns the `Job`) and in every trainer
    (it trains: `trainer()` for a function, `trainer.train(reader=..., num_passes=...)` for a
    Paddle v2 trainer, or `optimizer.train(model, reader=...)` as in the first design).

    The job is `paddle_job`, or made from the first design's keywords (`job_name`,
    `trainers`, `pservers`, `input`, `output`, `base_image`, `use_gpu`, `memory`, ...; also
    `k8s_job` for the name and `num_parameter_servers`), mapped as `PaddleJob` maps them.
    Without `trainer_package`/`entry_point` the package is the running script's directory
    and the entry `python <script>`. `client` defaults to `Client.from_config()`.
    """
    env = os.environ if environ is None else environ
    if on_cloud(env):
        return _train(trainer, reader, model, optimizer, num_passes, event_handler, feeding)
    for name, reason in _REFUSED_KEYWORDS.items():
        if name in keywords:
            raise OriginalArgumentRefused(name, reason)
    if paddle_job is not None and keywords:
        raise TypeError(f"give the job as paddle_job or as keywords, not both ({', '.join(keywords)})")
    if num_passes is not None:
        keywords.setdefault("passes", num_passes)
    job = paddle_job if paddle_job is not None else _job_from_keywords(keywords)
    if client is None:
        from .client import Client  # the SDK's client, imported only where a job is submitted

        client = Client.from_config()
    answer = job.submit(client)
    name = getattr(answer, "name", None) or job.name
    print(f"Started job {name}; follow it with: paddlecloud logs -f {name}", file=sys.stderr)
    return answer


def _job_from_keywords(keywords: dict[str, Any]) -> PaddleJob:
    for old, new in _FIRST_DESIGN_NAMES.items():
        if old in keywords and old != new:
            if new in keywords:
                raise TypeError(f"{old} and {new} name the same thing; give one")
            keywords[new] = keywords.pop(old)
    if "job_name" not in keywords:
        raise TypeError("dist_train needs job_name= (or k8s_job=), or a paddle_job")
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if script is not None and script.is_file():
        keywords.setdefault("trainer_package_path", str(script.resolve().parent))
        keywords.setdefault("entry_point", f"python {script.name}")
    accepted = set(inspect.signature(PaddleJob.__init__).parameters) - {"self"}
    unknown = sorted(set(keywords) - accepted)
    if unknown:
        raise TypeError(f"dist_train does not know {', '.join(unknown)}")
    return PaddleJob(**keywords)


def _train(
    trainer: Any,
    reader: Any,
    model: Any,
    optimizer: Any,
    num_passes: int | None,
    event_handler: Callable[..., Any] | None,
    feeding: Any,
) -> Any:
    options = {
        k: v
        for k, v in {"num_passes": num_passes, "event_handler": event_handler, "feeding": feeding}.items()
        if v is not None
    }
    if trainer is not None and hasattr(trainer, "train"):
        return trainer.train(reader=reader, **options)
    if trainer is not None:
        return trainer()
    if optimizer is not None:
        return optimizer.train(model, reader=reader, **options)
    raise TypeError("dist_train has nothing to train here: give trainer= (or optimizer= and model=)")
