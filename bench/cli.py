"""The CLI's start-up (issue 28 item 7): `paddlecloud version` against a running server, and
`paddlecloud --help`, each against `python -c pass` with the same interpreter, interleaved.

Scripts call `paddlecloud` in loops, so what one command costs before it does anything is paid
on every call. Wall time moves with the machine's load; the CPU time of each process (user and
system, from the kernel's accounting of reaped children) is the steadier figure.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import aim
from .platform import Platform

ROUNDS = 20
# Issues 28 and 35's aim: `paddlecloud version` and `--help` within 0.2 s of a bare interpreter.
AIM_OVER_PYTHON = 0.2


def _cli() -> list[str]:
    """The console script as a user runs it, else `python -m paddlecloud`."""
    script = Path(sys.executable).parent / "paddlecloud"
    return [str(script)] if script.exists() else [sys.executable, "-m", "paddlecloud"]


def _run(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run; it must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    with tempfile.TemporaryDirectory(dir=os.environ.get("PADDLECLOUD_BENCH_DIR")) as tmp:
        with Platform(Path(tmp) / "platform", {}).running() as platform:
            # The server wrote the admin's entry into this HOME's client config on its first run.
            # Bytecode as an installed package has it: written by the warm-up runs if need be.
            env = {k: v for k, v in platform.env.items() if k != "PYTHONDONTWRITEBYTECODE"}
            commands = {
                "python -c pass": [sys.executable, "-c", "pass"],
                "paddlecloud --help": [*_cli(), "--help"],
                "paddlecloud version": [*_cli(), "version"],
            }
            for argv in commands.values():
                _run(argv, env)
            walls: dict[str, list[float]] = {name: [] for name in commands}
            cpus: dict[str, list[float]] = {name: [] for name in commands}
            for _ in range(ROUNDS):
                for name, argv in commands.items():
                    wall, cpu = _run(argv, env)
                    walls[name].append(wall)
                    cpus[name].append(cpu)
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; {ROUNDS} interleaved rounds")
    print(f"{'':24}{'wall median':>12}{'min':>8}{'cpu median':>12}   over python -c pass (wall / cpu)")
    base = "python -c pass"
    base_wall, base_cpu = statistics.median(walls[base]), statistics.median(cpus[base])
    for name in commands:
        wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
        over = f"+{(wall - base_wall) * 1000:.0f} / +{(cpu - base_cpu) * 1000:.0f} ms" if name != base else ""
        fastest = min(walls[name])
        print(f"{name:24}{wall * 1000:>10.0f}ms{fastest * 1000:>6.0f}ms{cpu * 1000:>10.0f}ms   {over}")
    for name in ("paddlecloud version", "paddlecloud --help"):
        extra = statistics.median(walls[name]) - base_wall
        aim(
            f"`{name}` <= {AIM_OVER_PYTHON:g} s over `python -c pass` (wall, median)",
            f"+{extra:.3f} s",
            extra <= AIM_OVER_PYTHON,
            indent="",
        )
