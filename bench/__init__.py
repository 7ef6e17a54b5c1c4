"""Benchmarks: each prints figures as ratios against a baseline measured in the same run."""

import sys
from pathlib import Path

# The process harness (configs, ServiceProcess) and the MongoDB emulator's launcher are shared
# with the tests (tests/support.py, tests/mongo_emulator.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def verdict(ok: bool) -> str:
    """How each benchmark says whether a figure meets its aim."""
    return "met" if ok else "not met"


def aim(what: str, figure: str, ok: bool, indent: str = "  ") -> None:
    """One aim beside its figure: `aim: <what>: <figure>, met` (or not met)."""
    print(f"{indent}aim: {what}: {figure}, {verdict(ok)}", flush=True)
