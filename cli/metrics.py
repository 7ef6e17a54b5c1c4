"""Training curves from a training program: `paddlecloud.metrics.log(step=..., loss=...)`.

Standard library only and no network: it runs in every worker's own Python, which need
not have anything of the platform's installed beyond this file. Each call appends one
JSON line to `$PADDLE_CLOUD_OUTPUT/metrics/<worker>.jsonl`, which the platform reads off
PFS the way it reads logs (docs/metrics.md, §2):

    {"step": 12, "time": 1795000000.25, "scalars": {"loss": 0.31}}

Each worker writes its own file, so workers never interleave their lines; a line is
written with one `write` on a file opened for appending, and flushed at once, so a
worker killed mid-run leaves every line it logged before.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import threading
import time
from pathlib import Path
from typing import IO

__all__ = ["log", "metrics_path"]

_lock = threading.Lock()
_file: IO[str] | None = None
_opened: Path | None = None
_next_step = 0


def metrics_path(environ: dict[str, str] | None = None) -> Path:
    """Where this process's lines go: `$PADDLE_CLOUD_OUTPUT/metrics/<worker>.jsonl`, or
    `./paddlecloud-metrics/local.jsonl` outside the platform."""
    env = os.environ if environ is None else environ
    output = env.get("PADDLE_CLOUD_OUTPUT")
    role = env.get("TRAINING_ROLE", "").lower()
    index = env.get("TRAINER_ID", "")
    worker = f"{role}-{index}" if role in ("trainer", "pserver") and index.isdigit() else "local"
    directory = Path(output) / "metrics" if output else Path("paddlecloud-metrics")
    return directory / f"{worker}.jsonl"


def log(step: int | None = None, **scalars: float) -> None:
    """Record `scalars` (finite numbers, by name) at `step` (counted from 0 when not given).

    Raises ValueError for a scalar that is not a finite number or a step that is not a
    non-negative int, at the call, so a mistake shows where it is made.
    """
    global _next_step
    if not scalars:
        raise ValueError("log() needs at least one scalar, as name=value")
    values: dict[str, float] = {}
    for name, value in scalars.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            # numpy and paddle scalars are Real; a tensor with one element has .item().
            item = getattr(value, "item", None)
            value = item() if callable(item) else value
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"scalar {name!r} must be a finite number, not {value!r}")
        values[name] = float(value)
    with _lock:
        if step is None:
            step = _next_step
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int, not {step!r}")
        _next_step = step + 1
        line = json.dumps({"step": step, "time": round(time.time(), 3), "scalars": values}) + "\n"
        stream = _open()
        stream.write(line)
        stream.flush()


def _open() -> IO[str]:
    global _file, _opened
    path = metrics_path()
    if _file is None or _opened != path:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Line-buffered appends: each line reaches the file whole, in one write.
        _file = open(path, "a", encoding="utf-8", buffering=1)
        _opened = path
    return _file
