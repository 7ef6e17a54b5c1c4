"""Job commands: `submit`, `get jobs|job|workers|quota`, `logs` and `kill`."""

from __future__ import annotations

import argparse
import json
import string
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..context import Context, UsageError
from ..errors import PaddleCloudError
from ..flags import Deferred, add_flag
from ..output import FORMATS, Column, cell, render_data, render_record, render_table
from ..progress import Progress, human_size, plural
from ..steps import SubmitSteps
from . import CommandTree
from .top import TOP_COLUMNS

if TYPE_CHECKING:
    # Imported where used: these cost start-up time to every command (docs/performance.md).
    from ..answers import DryRun, Job, Quota
    from ..client import AsyncClient
    from ..package import Package

ORDER = 20

# DESIGN §4's defaults, used only to show a dry run's plan when the server could not make it.
DEFAULTS = {
    "trainers": 1,
    "pservers": 0,
    "cpu": "1",
    "gpu": 0,
    "memory": "1Gi",
    "pscpu": "1",
    "psmemory": "1Gi",
    "disk": "1Gi",
}
MAX_NAME_LENGTH = 44
NAME_SUFFIX_LENGTH = 5
# `--output` of `submit` is both the global output format and the job's output path; a value
# that is a format is the former (see `_split_output`), this spelling is always the latter.
OUTPUT_PATH_FLAG = "--output-path"


class JobEnded(PaddleCloudError):
    """A followed job ended other than SUCCEEDED; the message says how and why."""


# --- the spec from the command line ---------------------------------------------------------


def parse_env(items: Sequence[str]) -> dict[str, str]:
    """`--env K=V` values as a map (the last of a repeated key wins); `UsageError` on bad syntax."""
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--env {item!r}: expected KEY=VALUE, such as --env LEARNING_RATE=0.01")
        if key != key.strip():
            raise UsageError(f"--env {item!r}: no spaces around the name, KEY=VALUE")
        env[key] = value
    return env


def package_argument(args: argparse.Namespace) -> str:
    """The package the command line names, positionally or with --package-path (not both)."""
    positional, flag = getattr(args, "package", None), getattr(args, "package_path", None)
    if positional and flag and positional != flag:
        raise UsageError(f"two packages given: {flag} (--package-path) and {positional}; give one")
    package = positional or flag
    if not package:
        raise UsageError(
            "submit: which package? give a local directory or a /pfs/... path: submit [flags] PACKAGE"
        )
    return str(package)


def default_name(package: str, suffix: str | None = None) -> str:
    """A job name from the package's directory name and a random suffix (names are unique in history)."""
    base = Path(package.removeprefix("pfs:").rstrip("/") or "job").name
    for archive in (".tar.gz", ".tgz", ".zip"):
        base = base.removesuffix(archive)
    cleaned = "".join(c if c.isalnum() and c.isascii() else "-" for c in base.lower())
    cleaned = "-".join(part for part in cleaned.split("-") if part)
    if not cleaned or not cleaned[0].isalpha():
        cleaned = f"job-{cleaned}" if cleaned else "job"
    import secrets  # here: it imports hmac and random, which `--help` need not pay for

    suffix = suffix or "".join(
        secrets.choice(string.ascii_lowercase + string.digits) for _ in range(NAME_SUFFIX_LENGTH)
    )
    return f"{cleaned[: MAX_NAME_LENGTH - len(suffix) - 1].rstrip('-')}-{suffix}"


def build_spec(args: argparse.Namespace, package: str) -> dict[str, Any]:
    """The job spec a `submit` command line asks for: name and package always, and only the
    fields given, so that the server's defaults apply to the rest."""
    from ..paddlejob import pfs_package

    if args.entry is not None and args.module is not None:
        raise UsageError("give either --entry or --module, not both (--module M runs `python -m M`)")
    source = getattr(args, "package", None) or getattr(args, "package_path", None) or package
    if args.module is not None:
        _check_module(args.module, source)
    entry = args.entry if args.module is None else f"python -m {args.module}"
    given: dict[str, Any] = {
        "entry": entry,
        "psentry": args.psentry,
        "image": args.image,
        "registry": args.registry,
        "trainers": args.parallelism,
        "pservers": _pservers(args),
        "cpu": args.cpu,
        "gpu": args.gpu if args.gpu is not None or not getattr(args, "use_gpu", False) else 1,
        "memory": args.memory,
        "pscpu": args.pscpu,
        "psmemory": args.psmemory,
        "disk": args.disk,
        "passes": args.passes,
        "topology": args.topology,
        "env": parse_env(args.env) if args.env else None,
        "input": _pfs_argument(args.input),
        "output": _pfs_argument(args.job_output),
        "max_restarts": args.max_restarts,
    }
    # Named after what the user gave (./fit_a_line), not after the <sha256>.tar.gz it became.
    if not args.jobname and pfs_package(source) is None:
        source = Path(source).resolve().name or source  # `submit .` is named after the directory
    name = args.jobname or default_name(source)
    return {"name": name, "package": package, **{k: v for k, v in given.items() if v is not None}}


def _check_module(module: str, source: str) -> None:
    """Refuse a `--module` path written from the package's parent, saying what it is relative
    to: `python -m` runs in the package, so with `--package-path ./demo`, `--module demo.train`
    (as in gcloud's `--module-name`) names no module and `--module train` is meant. Only a
    module named after a local package directory that does not hold it is refused: any other
    may come from the job's requirements."""
    from ..paddlejob import pfs_package

    root = Path(source) if source and pfs_package(source) is None else None
    if root is None or not root.is_dir():
        return  # an archive or a PFS path: nothing to look into here
    parts = module.split(".")
    if parts[0] != root.resolve().name:
        return
    found = root.joinpath(*parts)
    if found.with_suffix(".py").is_file() or found.is_dir():
        return
    hint = ""
    inner = root.joinpath(*parts[1:])
    if len(parts) > 1 and (inner.with_suffix(".py").is_file() or inner.is_dir()):
        hint = f"; did you mean --module {'.'.join(parts[1:])}?"
    raise UsageError(
        f"--module {module}: no {'/'.join(parts)}.py in the package {source}; the module path is "
        f"relative to the package directory, where `python -m` runs{hint}"
    )


def _pservers(args: argparse.Namespace) -> int | None:
    """The parameter servers asked for: as given, else as many as the trainers where those
    were given as `-p N` (the original design: "-pservers defaults to -p"), else None."""
    if args.pservers is not None:
        return int(args.pservers)
    if args.parallelism is not None and getattr(args, "trainers_spelling", None) == SEED_TRAINERS:
        return int(args.parallelism)
    return None


def _pfs_argument(value: str | None) -> str | None:
    # `pfs:x` is `x` in your home, which is how the server reads a relative path too.
    return None if value is None else value.removeprefix("pfs:")


# --- submit ------------------------------------------------------------------------------------


def _say(ctx: Context) -> Callable[[str], None]:
    """Progress lines: on stdout for people, on stderr when stdout carries JSON or YAML."""
    if ctx.output == "table":
        return ctx.out

    def to_stderr(line: str) -> None:
        ctx.stderr.write(line + "\n")
        ctx.stderr.flush()

    return to_stderr


def _describe(pkg: Package, source: str) -> str:
    if pkg.archive == pkg.source:
        return f"Using archive {source} ({human_size(pkg.size)})"
    extra = f"; {plural(pkg.ignored, 'path')} left out" if pkg.ignored else ""
    return f"Collecting package {source} ({plural(pkg.files, 'file')}, {human_size(pkg.bytes)}{extra})"


def big_package_note(pkg: Package) -> str:
    from ..package import BIG_PACKAGE, IGNORE_FILE

    largest = ", ".join(f"{path} ({human_size(size)})" for path, size in pkg.largest)
    return (
        f"the package is {human_size(pkg.bytes)} (over {human_size(BIG_PACKAGE)}); largest: {largest}. "
        f"Data belongs on PFS (paddlecloud cp -r ./data pfs:data); leave it out with {IGNORE_FILE}"
    )


def _shape(spec: Mapping[str, Any]) -> str:
    trainers = spec.get("trainers", DEFAULTS["trainers"])
    pservers = spec.get("pservers", DEFAULTS["pservers"])
    text = plural(trainers, "trainer")
    if pservers:
        text += f", {plural(pservers, 'parameter server')}"
    return text


class _Steps(SubmitSteps):
    """Says what placing the package does, on stdout for people (stderr under `-o json`)."""

    def __init__(self, ctx: Context) -> None:
        super().__init__()
        self.ctx = ctx
        self.say = _say(ctx)

    def remote(self, path: str) -> None:
        self.say(f"Using package {path}")

    def packed(self, pkg: Package, source: str) -> None:
        self.say(_describe(pkg, source))
        for note in pkg.notes:
            self.ctx.warn(note)
        if pkg.big:
            self.ctx.warn(big_package_note(pkg))

    def found(self, path: str) -> None:
        self.say(f"Package already on PFS: {path}")

    def would_upload(self, pkg: Package, path: str) -> None:
        # A directory's archive is built only to be uploaded: its files' total says the size.
        size = (
            human_size(pkg.size) if pkg.archive is not None else f"{human_size(pkg.bytes)} before compression"
        )
        self.say(f"Would upload package ({size}) as {path}")

    def uploading(self, pkg: Package, path: str) -> Progress:
        self.say(f"Uploading package ({human_size(pkg.size)}) as {path}")
        self.progress = _progress(self.ctx)
        return self.progress

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()


def _progress(ctx: Context) -> Progress:
    isatty = getattr(ctx.stderr, "isatty", None)
    bars = ctx.output == "table" and callable(isatty) and bool(isatty())
    return Progress(
        stdout=ctx.stdout,
        stderr=ctx.stderr,
        bars=bars,
        lines=False,
        slots=1,
        problem_prefix=f"{ctx.prog}: error: ",
    )


async def submit(ctx: Context, args: argparse.Namespace) -> int:
    source = package_argument(args)
    spec = build_spec(args, package="")  # command-line mistakes first, before any packing
    client = ctx.client()
    if client.datacenter is None:
        client.datacenter = ctx.datacenter().name
    steps = _Steps(ctx)
    try:
        spec["package"] = await client.place_package(
            source, upload=not args.dry_run, check=None if args.dry_run else spec, steps=steps
        )
    finally:
        steps.close()
    if args.dry_run:
        plan = await client.submit(spec, dry_run=True)
        _warn(ctx, plan)
        return _dry_run(ctx, spec, plan)

    # Said once the server took the job: a spec it refuses never "starts".
    job = await client.submit(spec)
    name = job.name or spec["name"]
    steps.say(f"Started job {name} ({_shape(spec)})")
    _warn(ctx, job)
    if not args.follow:
        ctx.emit(job.to_dict(), lambda: _started_text(ctx, name, job))
        return 0
    steps.say(
        f"Job {name} is {job.state or 'PENDING'}; following its logs (Ctrl-C stops following, not the job)"
    )
    return await _follow(ctx, client, name)


def _warn(ctx: Context, answer: Mapping[str, Any]) -> None:
    """The server's warnings about the job: what it accepted and will not use (`-image` on
    one machine), one line each."""
    for note in answer.get("warnings") or []:
        ctx.warn(str(note))


def _started_text(ctx: Context, name: str, job: Job) -> str:
    return (
        f"Job {name} is {job.state or 'PENDING'}.\n"
        f"  {ctx.prog} logs -f {name}    # follow its logs\n"
        f"  {ctx.prog} get job {name}    # its state, workers and events\n"
        f"  {ctx.prog} kill {name}       # stop it"
    )


async def _follow(ctx: Context, client: AsyncClient, name: str) -> int:
    """Stream the job's logs until it ends; 0 if it SUCCEEDED, else `JobEnded`."""
    write = ctx.out if ctx.output == "table" else _say(ctx)
    async for entry in client.logs(name, follow=True):
        write(entry.text)
    job = await client.job(name)
    if not job.final:
        # The stream ends when the job is final; a server that ends it early is waited out.
        job = await client.wait(name)
    state, reason = job.state, job.reason
    if ctx.output != "table":
        ctx.out(render_data(job.to_dict(), ctx.output))
    if state == "SUCCEEDED":
        if ctx.output == "table":
            ctx.out(f"Job {name} SUCCEEDED" + (f": {reason}" if reason else ""))
        return 0
    raise JobEnded(f"job {name} {state}: {reason or 'no reason given'}")


WORKER_PLAN_COLUMNS: list[Column] = [
    ("NAME", "name"),
    ("ROLE", "role"),
    ("CPU", "cpu"),
    ("MEMORY", "memory"),
    ("GPU", "gpu"),
]


def _dry_run(ctx: Context, spec: Mapping[str, Any], plan: DryRun) -> int:
    package = plan.package

    def text() -> str:
        lines = [f"Dry run: job {spec['name']} would run {plural(len(plan.workers), 'worker')}:"]
        lines.append(render_table(plan.workers, WORKER_PLAN_COLUMNS, empty="(no workers)").rstrip("\n"))
        path = spec["package"] if package is None else package.get("path", spec["package"])
        lines.append(f"Package: {path}" + (f" ({package.kind})" if package and package.kind else ""))
        if package is not None and package.found is False:
            lines.append("The package is not on PFS yet: submit would upload it.")
        if plan.build is not None:
            key = (plan.build.key or "")[:12]
            if plan.build.cached:
                lines.append(f"Environment for requirements.txt: a cache hit (key {key}...), no build.")
            else:
                lines.append(f"Environment for requirements.txt: would be built first (key {key}...).")
        if plan.objects:
            kinds = ", ".join(
                f"{o.get('kind')} {(o.get('metadata') or {}).get('name')}" for o in plan.objects
            )
            lines.append(
                f"Kubernetes objects it would create ({len(plan.objects)}; -o yaml shows them): {kinds}"
            )
        lines.append("Nothing was uploaded or started.")
        return "\n".join(lines)

    if plan.objects and ctx.output == "yaml":
        # As `kubectl create --dry-run=client -o yaml` prints them: one document per object.
        ctx.out("---\n".join(render_data(o, "yaml") for o in plan.objects))
        return 0
    ctx.emit(plan.to_dict(), text)
    return 0


# --- get ---------------------------------------------------------------------------------------


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def age(value: Any, now: datetime | None = None) -> str:
    """How long ago, kubectl style: `45s`, `12m`, `3h`, `2d`; `-` for no time."""
    then = _parse_time(value)
    if then is None:
        return "-" if not value else str(value)
    seconds = max(0, int(((now or datetime.now(UTC)) - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def local_time(value: Any) -> str:
    then = _parse_time(value)
    if then is None:
        return "-" if not value else str(value)
    return then.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _spec_of(key: str) -> Callable[[Mapping[str, Any]], Any]:
    def get(job: Mapping[str, Any]) -> Any:
        spec = job.get("spec")
        return spec.get(key) if isinstance(spec, Mapping) else None

    return get


JOB_COLUMNS: list[Column] = [
    ("NAME", "name"),
    ("STATE", "state"),
    ("TRAINERS", _spec_of("trainers")),
    ("PSERVERS", _spec_of("pservers")),
    ("AGE", lambda job: age(job.get("created_at"))),
    ("REASON", lambda job: shorten(job.get("reason"))),
]
# `get jobs -A`: whose each job is, first, as kubectl puts NAMESPACE.
ALL_USERS_COLUMNS: list[Column] = [("USER", "owner"), *JOB_COLUMNS]
# A table's REASON cell; `get job` and `-o json` keep the whole reason.
REASON_WIDTH = 80


def shorten(text: Any, width: int = REASON_WIDTH) -> Any:
    """`text` on one line, cut to `width` characters with an ellipsis."""
    if not isinstance(text, str):
        return text
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1].rstrip() + "…"


WORKER_COLUMNS: list[Column] = [
    ("NAME", "name"),
    ("ROLE", "role"),
    ("INDEX", "index"),
    ("STATE", "state"),
    ("RESTARTS", "restarts"),
    ("STARTED", lambda w: local_time(w.get("started_at"))),
    ("HOST", "host"),
    ("EXIT", "exit_code"),
]
GPU_COLUMN: Column = ("GPUS", lambda w: ",".join(w.get("devices") or []) or "-")


def worker_columns(workers: Sequence[Mapping[str, Any]]) -> list[Column]:
    """The workers' columns, with the GPUs they hold where any holds one."""
    return [*WORKER_COLUMNS, GPU_COLUMN] if any(w.get("devices") for w in workers) else WORKER_COLUMNS


PEAK_COLUMNS: list[Column] = TOP_COLUMNS[:-1]  # the peaks, with no time of their own

EVENT_COLUMNS: list[Column] = [
    ("TIME", lambda e: local_time(e.get("time"))),
    ("TYPE", "type"),
    ("STATE", "state"),
    ("REASON", "reason"),
    ("MESSAGE", "message"),
]


async def get_jobs(ctx: Context, args: argparse.Namespace) -> int:
    show_all = bool(getattr(args, "all", False))
    all_users = bool(getattr(args, "all_users", False))
    # A state filter looks at finished jobs too: `--state FAILED` alone should find them.
    jobs = await ctx.client().jobs(
        all=show_all or bool(args.state), state=args.state or None, limit=args.limit, all_users=all_users
    )
    empty = (
        "No jobs."
        if show_all or args.state
        else f"No active jobs ({ctx.prog} get jobs -a lists finished ones too)."
    )
    columns = ALL_USERS_COLUMNS if all_users else JOB_COLUMNS
    ctx.emit({"jobs": jobs}, lambda: render_table(jobs, columns, empty=empty))
    return 0


def _resources(spec: Mapping[str, Any], cpu: str, memory: str, gpu: str | None) -> str:
    parts = [f"cpu {cell(spec.get(cpu))}", f"memory {cell(spec.get(memory))}"]
    if gpu is not None:
        parts.append(f"gpu {cell(spec.get(gpu))}")
    if spec.get("disk") is not None:  # every worker's, pservers' too
        parts.append(f"disk {cell(spec.get('disk'))}")
    return ", ".join(parts)


def job_text(answer: Mapping[str, Any]) -> str:
    """`get job` for people: the job, its spec, its workers and its events."""
    from ..answers import Job

    job = answer if isinstance(answer, Job) else Job.from_dict(answer)
    spec = job.spec
    fields: list[Column] = [
        ("Name", "name"),
        ("State", "state"),
        ("Reason", "reason"),
        ("Owner", "owner"),
        ("Created", lambda j: _when(j.get("created_at"))),
        ("Started", lambda j: _when(j.get("started_at"))),
        ("Finished", lambda j: _when(j.get("finished_at"))),
        ("Package", lambda _: spec.get("package")),
        ("Entry", lambda _: spec.get("entry")),
        (
            "Trainers",
            lambda _: f"{cell(spec.get('trainers'))} (each {_resources(spec, 'cpu', 'memory', 'gpu')})",
        ),
        (
            "Pservers",
            lambda _: (
                f"{cell(spec.get('pservers'))} (each {_resources(spec, 'pscpu', 'psmemory', None)})"
                if spec.get("pservers")
                else cell(spec.get("pservers"))
            ),
        ),
    ]
    for label, key in (
        ("Image", "image"),
        ("Registry", "registry"),
        ("Passes", "passes"),
        ("Topology", "topology"),
        ("Input", "input"),
        ("Output", "output"),
        ("Datacenter", "datacenter"),
        ("Max restarts", "max_restarts"),
    ):
        if spec.get(key) is not None:
            fields.append((label, _constant(spec.get(key))))
    if spec.get("env"):
        fields.append(("Env", lambda _: " ".join(f"{k}={v}" for k, v in spec["env"].items())))
    text = render_record(job, fields)
    text += "\nWorkers:\n" + render_table(job.workers, worker_columns(job.workers), empty="  (none yet)")
    if job.resources:
        peaks = [{"worker": name, **figures} for name, figures in job.resources.items()]
        text += "\nPeak resource use:\n" + render_table(peaks, PEAK_COLUMNS)
    text += "\nEvents:\n" + render_table(job.events, EVENT_COLUMNS, empty="  (none)")
    return text


def _constant(value: Any) -> Callable[[Mapping[str, Any]], Any]:
    return lambda _: value


def _when(value: Any) -> str:
    if not value:
        return "-"
    return f"{local_time(value)} ({age(value)} ago)"


async def get_job(ctx: Context, args: argparse.Namespace) -> int:
    job = await ctx.client().job(args.job)
    ctx.emit(job, lambda: job_text(job))
    return 0


async def get_workers(ctx: Context, args: argparse.Namespace) -> int:
    workers = await ctx.client().workers(args.job)
    ctx.emit(
        {"workers": workers},
        lambda: render_table(workers, worker_columns(workers), empty="No workers (yet)."),
    )
    return 0


def _quota(answer: Mapping[str, Any]) -> Quota:
    from ..answers import Quota

    return answer if isinstance(answer, Quota) else Quota.from_dict(answer)


def quota_rows(answer: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "resource": resource,
            "used": _readable(resource, value.used),
            "limit": "unlimited" if value.limit is None else _readable(resource, value.limit),
        }
        for resource, value in _quota(answer).limits().items()
    ]


def _readable(resource: str, value: Any) -> Any:
    """A byte count the server spelled exactly (`435781`) as people read it (`425.6 KiB`)."""
    exact_bytes = isinstance(value, str) and value.isdigit() and int(value) >= 1024
    if resource in ("memory", "storage", "disk") and exact_bytes:
        return human_size(int(value))
    return value


def quota_notes(answer: Mapping[str, Any]) -> str:
    """What the table does not say: which GPUs your jobs hold, what the machine has free,
    and whether cpu and memory limits, and the storage quota, are enforced or only counted."""
    quota = _quota(answer)
    lines = []
    for item in quota.devices:
        lines.append(f"GPU {item.get('device')}: held by {item.get('job')} {item.get('worker')}")
    machine = quota.machine
    if machine:
        if machine.get("gpus"):
            lines.append(f"GPUs on this machine: {machine.get('gpus_free')} of {machine.get('gpus')} free")
        if machine.get("limits") == "advisory":
            lines.append(f"Limits are advisory here: {machine.get('limits_detail')}")
        if machine.get("storage") == "advisory":
            lines.append(f"Storage quota: {machine.get('storage_detail')}")
    return "".join(f"{line}\n" for line in lines)


async def get_quota(ctx: Context, args: argparse.Namespace) -> int:
    answer = await ctx.client().quota()
    rows = quota_rows(answer)
    columns: list[Column] = [("RESOURCE", "resource"), ("USED", "used"), ("LIMIT", "limit")]
    ctx.emit(answer, lambda: render_table(rows, columns) + quota_notes(answer))
    return 0


# --- logs and kill ----------------------------------------------------------------------------


async def logs(ctx: Context, args: argparse.Namespace) -> int:
    if args.role == "pserver" and not (await ctx.client().job(args.job)).spec.get("pservers"):
        # As kubectl does for a selector that matches nothing ("No resources found"): said on
        # stderr, exit 0, since asking is no mistake and a loop over roles should go on; but
        # never silence, which reads as a server that has not started yet, and never a follow
        # that waits for the job's end to print nothing.
        ctx.stderr.write(f"No parameter servers in job {args.job} (it has -pservers 0): no logs to show.\n")
        return 0
    stream = ctx.client().logs(
        args.job, tail=args.tail, follow=args.follow, role=args.role, worker=args.worker or None
    )
    async for entry in stream:
        if ctx.output == "json":
            ctx.out(json.dumps(entry.to_dict(), ensure_ascii=False))  # one object per line (NDJSON)
        elif ctx.output == "yaml":
            ctx.out("---\n" + render_data(entry, "yaml"))
        else:
            ctx.out(entry.text)
    return 0


async def kill(ctx: Context, args: argparse.Namespace) -> int:
    from ..answers import FINAL_STATES, Job

    client = ctx.client()
    results: list[Mapping[str, Any]] = []
    lines: list[str] = []
    for name in args.jobs:
        job = await client.kill(name, rm=args.rm)
        if args.rm:
            results.append({"name": name, "removed": True})
            lines.append(f"job {name} removed")
            continue
        job = job or Job.from_dict({"name": name})
        results.append(job)
        state = job.state
        if state == "KILLED" or state not in FINAL_STATES:
            lines.append(f"job {name} killed")
        else:
            lines.append(f"job {name} had already ended: {state}")
    ctx.emit(results[0] if len(results) == 1 else results, lambda: "\n".join(lines))
    return 0


# --- the command line -------------------------------------------------------------------------


def _count(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {number}")
    return number


# The original design's short spelling of the trainer count (`submit ./pkg -p 4 -c 2 -m 10Gi`),
# whose parameter servers default to as many as trainers; every other spelling's, to none.
SEED_TRAINERS = "-p"


class _Trainers(argparse._StoreAction):
    """Stores the trainer count and which spelling gave it (`trainers_spelling`)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        super().__call__(parser, namespace, values, option_string)
        namespace.trainers_spelling = option_string


def _quantity(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("expected a quantity such as 2, 500m or 1Gi")
    return value.strip()


def _memory(value: str) -> str:
    """A memory quantity; `-m trainer.main` (a module, as a newer habit would have it) is
    refused saying which spelling means which."""
    value = _quantity(value)
    if not (value[0].isdigit() or value[0] == "."):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a quantity such as 10Gi: -m/-memory is the memory per trainer "
            "(as in the original docs); run a Python module with --module"
        )
    return value


# What `submit --output X` takes for a format: csv is not one of submit's, so X=csv stays a path.
_SUBMIT_FORMATS = tuple(f for f in FORMATS if f != "csv")


def _split_output(arg_strings: Sequence[str]) -> list[str]:
    """`submit --output X`: the global output format when X is one (json, yaml, table), else the
    job's output path; `-o` is always the format and `--output-path` always the path."""
    out: list[str] = []
    rest = iter(arg_strings)
    for arg in rest:
        if arg == "--":
            out.append(arg)
            out.extend(rest)
            break
        flag, eq, value = arg.partition("=")
        if flag in ("-output", "--output"):
            if eq:
                out.append(arg if value in _SUBMIT_FORMATS else f"{OUTPUT_PATH_FLAG}={value}")
                continue
            following = next(rest, None)
            if following is None:
                out.append(arg)
            elif following in _SUBMIT_FORMATS or following.startswith("-"):
                out.extend([arg, following])
            else:
                out.extend([OUTPUT_PATH_FLAG, following])
            continue
        out.append(arg)
    return out


SUBMIT_EPILOG = """\
examples:
  paddlecloud submit -jobname fit-a-line -cpu 1 -gpu 0 -memory 1Gi -parallelism 2 \\
      -pscpu 1 -pservers 2 -psmemory 1Gi -passes 1 -entry "python train.py" ./fit_a_line
  paddlecloud submit --job-name mnist --trainers 4 --module trainer.main --env LR=0.01 -f ./mnist
  paddlecloud submit --dry-run ./mnist                 # name and check; upload and start nothing
  paddlecloud submit --name again /pfs/datacenter1/home/alice/.paddlecloud/packages/<id>.tar.gz

PACKAGE is a local directory, a local .tar.gz/.zip, or a path on PFS (/pfs/..., or pfs:x for x
in your home). A directory's package leaves out what .paddlecloudignore lists (gitignore
syntax) and .git, .venv, __pycache__, *.pyc and similar; it is named by the sha256 of its
files' manifest (unchanged files are not read again: a stat cache under ~/.cache/paddlecloud),
and packed reproducibly and uploaded to <home>/.paddlecloud/packages/ only if PFS does not
hold it yet; an archive is named by its sha256. Symlinks leading out of the package are left
out. The job starts in the unpacked package.

Only the flags given are sent; the server's defaults fill in the rest (1 trainer, no parameter
servers, cpu 1, memory 1Gi, gpu 0, entry "python train.py"); -p N, the original design's
spelling, also asks for N parameter servers unless -pservers says. -t FILE runs python FILE in
the package. Without a name the job is named after the package's directory with a random
suffix. The job runs in the datacenter the config
selects (the global --datacenter). --output is the job's output path unless its value is json,
yaml or table (the global output format); --output-path is always the path.
"""


def _register_submit(tree: CommandTree) -> None:
    parser = tree.command(
        "submit",
        submit,
        aliases=["train"],
        help="submit a training job: pack and upload its package, start it",
        description=(
            "Submit a job of parameter servers and trainers. A local package directory is packed\n"
            "and uploaded (only when PFS does not hold that exact package yet), then the job starts."
        ),
        epilog=SUBMIT_EPILOG,
        # argparse cannot tell `--output PATH` (the job's) from the global `--output FORMAT`.
        prepare_args=_split_output,
    )
    parser.add_argument(
        "package", nargs="?", metavar="PACKAGE", help="local directory or archive, or PFS path"
    )
    add_submit_flags(parser)


def add_submit_flags(parser: Deferred) -> None:
    job = parser.add_argument_group("the job")
    add_flag(
        job, "jobname", "job-name", "name", metavar="NAME", help="the job's name (unique among your jobs)"
    )
    add_flag(job, "package-path", "package", metavar="PATH", help="the package, instead of PACKAGE")
    add_flag(
        job,
        "entry",
        "entry-point",
        metavar="CMD",
        help='the command each worker runs (default "python train.py")',
    )
    add_flag(
        job,
        "psentry",
        "pserver-entry",
        metavar="CMD",
        help="the command parameter servers run (default: the entry, with TRAINING_ROLE=PSERVER)",
    )
    add_flag(
        job,
        "module",
        "module-name",
        metavar="MODULE",
        help="run `python -m MODULE` (instead of --entry); -m is the memory, as in the original docs",
    )
    add_flag(
        job,
        "env",
        short="-e",
        action="append",
        metavar="KEY=VALUE",
        help="an environment variable for every worker (repeat for more)",
    )
    add_flag(job, "input", metavar="PFS_PATH", help="the job's input on PFS")
    add_flag(
        job,
        "output-path",
        "output-dir",
        dest="job_output",
        metavar="PFS_PATH",
        help="the job's output on PFS (also --output)",
    )
    add_flag(job, "image", "base-image", metavar="IMAGE", help="the container image to run in (Kubernetes)")
    add_flag(job, "registry", metavar="NAME", help="saved registry credentials to pull the image with")
    add_flag(
        job,
        "topology",
        short="-t",
        metavar="FILE",
        help="the script each worker runs, within the package: python FILE (the original's; or --entry)",
    )
    add_flag(job, "passes", type=_count, metavar="N", help="passes over the data (PADDLE_INIT_NUM_PASSES)")
    add_flag(
        job,
        "max-restarts",
        type=_count,
        metavar="N",
        help="restarts of a failing worker before the job fails",
    )

    sizes = parser.add_argument_group("workers and resources")
    add_flag(
        sizes,
        "parallelism",
        "trainers",
        "trainer-count",
        short="-p",
        type=_count,
        action=_Trainers,
        metavar="N",
        help="trainers (default 1)",
    )
    add_flag(
        sizes,
        "pservers",
        "pserver-count",
        type=_count,
        metavar="N",
        help=f"parameter servers (default 0; with {SEED_TRAINERS} N, the original design's spelling, N)",
    )
    add_flag(
        sizes, "cpu", short="-c", type=_quantity, metavar="Q", help="CPUs per trainer, such as 1 or 500m"
    )
    add_flag(sizes, "gpu", "trainer-gpu-num", type=_count, metavar="N", help="GPUs per trainer")
    add_flag(
        sizes,
        "use-gpu",
        action="store_true",
        help="give each trainer a GPU (unless --gpu says how many); also =true or =false",
    )
    add_flag(
        sizes,
        "memory",
        short="-m",
        type=_memory,
        metavar="Q",
        help="memory per trainer, such as 1Gi or 512Mi",
    )
    add_flag(sizes, "pscpu", type=_quantity, metavar="Q", help="CPUs per parameter server")
    add_flag(sizes, "psmemory", type=_quantity, metavar="Q", help="memory per parameter server")
    add_flag(
        sizes,
        "disk",
        type=_quantity,
        metavar="Q",
        help="scratch space per worker (working directory, files outside PFS), such as 10Gi",
    )

    run = parser.add_argument_group("how to submit")
    add_flag(
        run,
        "follow",
        short="-f",
        action="store_true",
        help="stream the logs; exit 0 only if the job succeeds",
    )
    add_flag(
        run,
        "dry-run",
        "dryrun",
        action="store_true",
        help="name and check the package; upload and start nothing",
    )


ALL_USERS_HELP = "every user's jobs, with a USER column (admins only)"
JOB_HELP = "a job of yours, or USER/NAME: another user's (admins only)"


def _register_get(tree: CommandTree) -> None:
    get = tree.group("get", help="show resources: jobs, job NAME, workers NAME, quota, users")
    # The original client took `-a` before the resource: `paddlecloud get -a jobs`.
    add_flag(
        get.parser,
        "all",
        short="-a",
        action="store_true",
        default=argparse.SUPPRESS,
        help="finished jobs too",
    )

    listing = get.command(
        "jobs",
        get_jobs,
        help="list your jobs (active ones; -a all)",
        description="List your jobs, newest first: the active ones, or with -a finished ones too.",
        epilog=(
            "examples:\n  paddlecloud get jobs\n  paddlecloud get jobs -a\n"
            "  paddlecloud get jobs --state FAILED -o json\n"
            "  paddlecloud get jobs -A            (admins: every user's jobs)\n"
        ),
    )
    add_flag(
        listing, "all", short="-a", action="store_true", default=argparse.SUPPRESS, help="finished jobs too"
    )
    add_flag(
        listing,
        "state",
        action="append",
        type=str.upper,
        metavar="STATE",
        help="only jobs in this state (repeat for more)",
    )
    add_flag(listing, "limit", type=_positive, metavar="N", help="at most N jobs")
    add_flag(listing, "all-users", short="-A", action="store_true", help=ALL_USERS_HELP)

    one = get.command(
        "job",
        get_job,
        help="show one job: spec, state, workers and events",
        epilog=(
            "examples:\n  paddlecloud get job fit-a-line\n  paddlecloud get job fit-a-line -o yaml\n"
            "  paddlecloud get job alice/fit-a-line   (admins: another user's job)\n"
        ),
    )
    one.add_argument("job", metavar="JOB", help=JOB_HELP)

    workers = get.command(
        "workers",
        get_workers,
        help="list a job's parameter servers and trainers",
        epilog="examples:\n  paddlecloud get workers fit-a-line\n",
    )
    workers.add_argument("job", metavar="JOB", help=JOB_HELP)

    get.command(
        "quota",
        get_quota,
        help="show your usage against your limits",
        epilog="examples:\n  paddlecloud get quota\n  paddlecloud get quota -o json\n",
    )


def _positive(value: str) -> int:
    number = _count(value)
    if number < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return number


def _register_verbs(tree: CommandTree) -> None:
    """The original client's verbs: `jobs`/`list` are `get jobs`, `status JOB` is `get job JOB`
    (and `train` is `submit`, `cancel` is `kill`, registered with those)."""
    listing = tree.command(
        "jobs",
        get_jobs,
        aliases=["list"],
        help="list your jobs (same as get jobs)",
        epilog="examples:\n  paddlecloud jobs\n  paddlecloud list -a\n",
    )
    add_flag(listing, "all", short="-a", action="store_true", help="finished jobs too")
    add_flag(listing, "state", action="append", type=str.upper, metavar="STATE", help="only this state")
    add_flag(listing, "limit", type=_positive, metavar="N", help="at most N jobs")
    add_flag(listing, "all-users", short="-A", action="store_true", help=ALL_USERS_HELP)
    status = tree.command(
        "status",
        get_job,
        help="show one job (same as get job)",
        epilog="examples:\n  paddlecloud status fit-a-line\n",
    )
    status.add_argument("job", metavar="JOB", help=JOB_HELP)


def register(tree: CommandTree) -> None:
    _register_submit(tree)
    _register_get(tree)
    _register_verbs(tree)

    follow = tree.command(
        "logs",
        logs,
        help="print or follow a job's logs",
        description=(
            "Print a job's log lines, each prefixed with its worker ([trainer-0] ...), parameter\n"
            "servers included. With -f, follow them until the job ends; a dropped connection is\n"
            "resumed where it broke, without losing or repeating a line."
        ),
        epilog=(
            "examples:\n"
            "  paddlecloud logs fit-a-line\n"
            "  paddlecloud logs -n 20 -f fit-a-line\n"
            "  paddlecloud logs --role pserver fit-a-line\n"
            "  paddlecloud logs -w trainer-1 fit-a-line\n"
            "  paddlecloud logs alice/fit-a-line   (admins: another user's job)\n"
        ),
    )
    follow.add_argument("job", metavar="JOB", help=JOB_HELP)
    add_flag(
        follow,
        "tail",
        short="-n",
        type=_count,
        metavar="N",
        help="start from the last N lines of each worker",
    )
    add_flag(follow, "follow", short="-f", action="store_true", help="keep streaming until the job ends")
    add_flag(
        follow,
        "role",
        type=str.lower,
        choices=("trainer", "pserver"),
        metavar="ROLE",
        help="trainer or pserver",
    )
    add_flag(
        follow,
        "worker",
        short="-w",
        action="append",
        metavar="NAME",
        help="only this worker (repeat for more)",
    )

    stop = tree.command(
        "kill",
        kill,
        aliases=["cancel"],
        help="stop a job (-rm: and remove it from history)",
        description=(
            "Stop every process of a job; it ends KILLED. With -rm it is also removed from your\n"
            "history, with its logs, and its name can be used again."
        ),
        epilog=(
            "examples:\n  paddlecloud kill fit-a-line\n  paddlecloud kill -rm fit-a-line\n"
            "  paddlecloud kill alice/fit-a-line   (admins: another user's job)\n"
        ),
    )
    stop.add_argument("jobs", nargs="+", metavar="JOB", help=JOB_HELP)
    add_flag(stop, "rm", action="store_true", help="also remove the job and its logs from history")
