"""`paddlecloud top job NAME`: what each worker of a job uses now (Arena's spelling)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..context import Context
from ..output import Column, render_table
from ..progress import human_size
from . import CommandTree

ORDER = 21  # right after the job commands in --help


def latest(workers: Sequence[Mapping[str, Any]], now: float) -> list[dict[str, Any]]:
    """Each worker's last sampled figures (workers with none yet are left out)."""
    rows = []
    for worker in workers:
        times = worker.get("t") or []
        if not times:
            continue

        def last(column: str, worker: Mapping[str, Any] = worker) -> Any:
            values = worker.get(column) or []
            return values[-1] if values else None

        rows.append(
            {
                "worker": worker.get("worker"),
                "cpu_cores": last("cpu_cores"),
                "memory_bytes": last("memory_bytes"),
                "memory_limit_bytes": worker.get("memory_limit_bytes"),
                "gpu_utilization": last("gpu_utilization"),
                "gpu_memory_bytes": last("gpu_memory_bytes"),
                "t": times[-1],
                "age_seconds": round(max(now - float(times[-1]), 0.0), 1),
            }
        )
    return rows


def memory_text(used: Any, limit: Any) -> str:
    """`200.0 MiB / 1.0 GiB (20%)`, `200.0 MiB` without a limit, `-` unknown."""
    if used is None:
        return "-"
    text = human_size(used)
    if limit:
        text += f" / {human_size(limit)} ({100 * used / limit:.0f}%)"
    return text


def _cores(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}"


def _percent(value: Any) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _size(value: Any) -> str:
    return "-" if value is None else human_size(value)


TOP_COLUMNS: list[Column] = [
    ("WORKER", "worker"),
    ("CPU", lambda r: _cores(r.get("cpu_cores"))),
    ("MEMORY", lambda r: memory_text(r.get("memory_bytes"), r.get("memory_limit_bytes"))),
    ("GPU UTIL", lambda r: _percent(r.get("gpu_utilization"))),
    ("GPU MEMORY", lambda r: _size(r.get("gpu_memory_bytes"))),
    ("SAMPLED", lambda r: f"{r.get('age_seconds', 0):.0f}s ago"),
]


async def top_job(ctx: Context, args: argparse.Namespace) -> int:
    answer = await ctx.client().resources(args.job)
    rows = latest(answer.get("workers") or [], time.time())
    data = {
        "name": answer.get("name"),
        "available": answer.get("available"),
        "reason": answer.get("reason"),
        "workers": rows,
    }

    def table() -> str:
        if not answer.get("available", True):
            return f"Resource use of {args.job} is not available: {answer.get('reason')}"
        interval = answer.get("interval_seconds")
        empty = f"No figures yet (each running worker is sampled every {interval} s)."
        return render_table(rows, TOP_COLUMNS, empty=empty)

    ctx.emit(data, table)
    return 0


def register(tree: CommandTree) -> None:
    top = tree.group("top", help="show what a job's workers use now: top job NAME")
    one = top.command(
        "job",
        top_job,
        help="CPU, memory (of its limit) and GPU of each worker, as last sampled",
        description=(
            "Show what each worker of a job uses, as the platform last sampled it: CPU cores,\n"
            "memory with its limit, GPU utilisation and GPU memory. `get job NAME` shows the\n"
            "peaks; the API's /jobs/NAME/resources serves the whole series."
        ),
        epilog=(
            "examples:\n  paddlecloud top job fit-a-line\n  paddlecloud top job fit-a-line -o json\n"
            "  paddlecloud top job alice/fit-a-line   (admins: another user's job)\n"
        ),
    )
    one.add_argument("job", metavar="JOB", help="a job of yours, or USER/NAME: another user's (admins only)")
