"""`paddlecloud metrics NAME`: a job's training curves as a summary table, CSV or JSON (docs/metrics.md)."""

from __future__ import annotations

import argparse
import csv
import io
from collections.abc import Mapping, Sequence
from typing import Any

from ..context import Context
from ..flags import add_flag
from ..output import Column, render_data, render_table
from . import CommandTree
from .jobs import JOB_HELP

ORDER = 22
CSV_COLUMNS = ("worker", "source", "tag", "step", "wall_time", "value")
EMPTY = (
    "No scalars yet. A training program logs them with "
    "`import paddlecloud.metrics; paddlecloud.metrics.log(step=step, loss=loss)`; "
    "TensorBoard event files in the job's output are read too."
)


def summary_rows(series: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per series: where it comes from, how many points, its last step and value."""
    rows = []
    for one in series:
        steps, values = one.get("step") or [], one.get("value") or []
        rows.append(
            {
                "worker": one.get("worker"),
                "source": one.get("source"),
                "tag": one.get("tag"),
                "points": len(steps),
                "step": steps[-1] if steps else None,
                "value": f"{values[-1]:.6g}" if values else None,
            }
        )
    return rows


def csv_text(series: Sequence[Mapping[str, Any]]) -> str:
    """Every point, one row each, under CSV_COLUMNS: what a spreadsheet or pandas reads."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for one in series:
        for step, wall_time, value in zip(one["step"], one["wall_time"], one["value"], strict=True):
            writer.writerow([one["worker"], one["source"], one["tag"], step, repr(wall_time), repr(value)])
    return out.getvalue()


async def metrics(ctx: Context, args: argparse.Namespace) -> int:
    answer = await ctx.client().metrics(args.job, tag=args.tag)
    series = answer.get("series") or []
    for warning in answer.get("warnings") or []:
        ctx.warn(warning)
    if ctx.output == "csv":
        ctx.out(csv_text(series))
    elif ctx.output == "table":
        columns: list[Column] = [
            ("WORKER", "worker"),
            ("SOURCE", "source"),
            ("TAG", "tag"),
            ("POINTS", "points"),
            ("LAST STEP", "step"),
            ("LAST VALUE", "value"),
        ]
        ctx.out(render_table(summary_rows(series), columns, empty=EMPTY))
    else:
        ctx.out(render_data(answer, ctx.output))
    return 0


def register(tree: CommandTree) -> None:
    command = tree.command(
        "metrics",
        metrics,
        help="show a job's training curves (scalars it logged)",
        description=(
            "Show the scalars a job logged: with paddlecloud.metrics.log() (each worker's, from "
            "metrics/<worker>.jsonl in its output) and in TensorBoard event files in its output, "
            "read as they are now, while the job runs and after it ended. The table has one row "
            "per worker and tag (its last step and value); -o csv every point, one row each, with "
            "the columns worker,source,tag,step,wall_time,value; -o json the server's answer. "
            "Each series holds at most 2000 points (longer ones are downsampled)."
        ),
        epilog=(
            "examples:\n  paddlecloud metrics mnist\n  paddlecloud metrics mnist -o csv > mnist.csv\n"
            "  paddlecloud metrics mnist --tag loss -o json\n"
            "\nin the training program (no install: every job's Python has it):\n"
            "  import paddlecloud.metrics\n"
            "  paddlecloud.metrics.log(step=step, loss=loss, acc=acc)\n"
        ),
    )
    command.add_argument("job", metavar="JOB", help=JOB_HELP)
    add_flag(command, "tag", metavar="TAG", help="only this scalar (loss, acc, ...)")
    command.set_defaults(csv=True)
