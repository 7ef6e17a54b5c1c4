"""`server`: run the whole platform on this machine (SQLite, local processes, a local PFS root)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import ClientConfig, ConfigMissing, Datacenter, load_config, save_config
from ..context import Context
from ..flags import add_flag
from . import CommandTree

if TYPE_CHECKING:
    # The platform (aiohttp's server, structlog, pydantic) is imported by the one command that
    # runs it, not at every command's start-up.
    from paddlecloud.common.platform import Platform

ORDER = 95
DATA_DIR_ENV = "PADDLECLOUD_DATA_DIR"


def write_client_config(ctx: Context, platform: Platform, *, make_current: bool) -> Path:
    """Add (or refresh) the local platform's admin entry in the client config."""
    from paddlecloud.common.platform import ADMIN

    path = ctx.config_path
    try:
        config = load_config(path)
    except ConfigMissing:
        config = ClientConfig(path=path)
    entry = Datacenter(
        name=platform.datacenter,
        username=ADMIN,
        password=platform.admin_password(),
        endpoint=platform.endpoint,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    save_config(config.with_datacenter(entry, make_current=make_current))
    return path


def data_dir(ctx: Context, args: argparse.Namespace) -> Path:
    home = ctx.env.get("HOME")
    chosen = args.data_dir or ctx.env.get(DATA_DIR_ENV) or "~/.paddlecloud"
    if chosen.startswith("~/") and home:
        return Path(home) / chosen[2:]
    return Path(chosen).expanduser()


def isolation_notes(config_path: Path) -> list[str]:
    """How jobs are isolated on this machine, said once at start: the jobs service decides
    the same way from the same config (docs/jobs.md, "What a local job can see and use")."""
    from paddlecloud.common import cgroups, sandbox
    from paddlecloud.common.config import load_config as load_server_config

    config = load_server_config(config_path)
    if config.jobs.backend == "kubernetes":
        kube = config.jobs.kubernetes
        where = kube.kubeconfig or "the default kubeconfig"
        mode = "a namespace per user" if kube.namespace_mode == "per-user" else f"namespace {kube.namespace}"
        return [f"Jobs run on Kubernetes ({where}, {mode}); see docs/kubernetes.md."]
    try:
        box = sandbox.detect(config.jobs.sandbox, "jobs")
    except sandbox.SandboxUnavailable as exc:
        return [f"Jobs: {exc}"]
    lines = [
        f"Jobs run sandboxed: {box.describe()}."
        if box.enabled
        else f"WARNING: jobs are not sandboxed ({box.describe()})."
    ]
    if config.jobs.limits == "off" or cgroups.detect() is None:
        lines.append(
            "Job cpu and memory limits are advisory here (no cgroups): they count against quotas only."
        )
    return lines


async def server(ctx: Context, args: argparse.Namespace) -> int:
    from paddlecloud.common.platform import ADMIN, Platform, StartupError, run_platform

    platform = Platform(
        data_dir=data_dir(ctx, args),
        host=args.host,
        port=args.port,
        base_config=Path(args.server_config) if args.server_config else None,
        datacenter=args.datacenter_name,
        log=lambda line: print(f"{ctx.prog} server: {line}", file=ctx.stderr, flush=True),
    )
    try:
        new_password = platform.prepare()
    except StartupError as exc:
        platform.log(str(exc))
        return 1

    def on_ready(running: Platform) -> None:
        out = ctx.stdout
        print(f"PaddleCloud is running at {running.endpoint} (data in {running.data_dir})", file=out)
        print(f"Open {running.endpoint}/ in a browser for the dashboard.", file=out)
        if new_password is not None:
            print(f"Created administrator {ADMIN!r} with password: {new_password}", file=out)
            print(f"  (also kept in {running.data_dir / 'admin.password'}, readable only by you)", file=out)
        if new_password is not None or args.init:
            path = write_client_config(ctx, running, make_current=True)
            print(f"Wrote datacenter {running.datacenter!r} for {ADMIN!r} to {path}", file=out)
        for line in isolation_notes(running.run_dir / "paddlecloud.yaml"):
            print(line, file=out)
        print("Press Ctrl-C to stop.", file=out, flush=True)

    return await run_platform(platform, on_ready)


def register(tree: CommandTree) -> None:
    p = tree.command(
        "server",
        server,
        help="run the whole platform on this machine",
        description=(
            "Run the gateway and the jobs, pfs and builder services as supervised processes on\n"
            "this machine, with a SQLite store and a local PFS root under the data directory. A\n"
            "crashed service is restarted; Ctrl-C or SIGTERM stops them all. The first run creates\n"
            "the administrator, prints its password and adds it to the client config."
        ),
        epilog=(
            "examples:\n"
            "  paddlecloud server                       # http://127.0.0.1:8080, data in ~/.paddlecloud\n"
            "  paddlecloud server --port 0 --data-dir /tmp/pc   # any free port\n"
            "  paddlecloud server --init                # rewrite the client config for the admin\n"
        ),
    )
    add_flag(
        p, "data-dir", metavar="DIR", help=f"state directory (default: ${DATA_DIR_ENV}, else ~/.paddlecloud)"
    )
    add_flag(p, "host", default="127.0.0.1", help="address the gateway listens on (default: %(default)s)")
    add_flag(
        p, "port", type=int, default=8080, help="gateway port; 0 picks a free one (default: %(default)s)"
    )
    add_flag(
        p,
        "server-config",
        metavar="FILE",
        help=(
            "a paddlecloud.yaml whose sections are merged under the embedded defaults; what the"
            " server sets itself (ports, hosts, service URLs, the admin, the internal secret)"
            " is refused, as is any unknown key"
        ),
    )
    add_flag(
        p,
        "datacenter-name",
        default="datacenter1",
        metavar="NAME",
        help="this platform's datacenter: PFS paths are /pfs/NAME/... (default: %(default)s)",
    )
    add_flag(p, "init", action="store_true", help="write the admin's entry to the client config again")
