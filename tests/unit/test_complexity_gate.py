"""The complexity gate of `make lint` (scripts/complexity.py) on modules of known complexity."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def branches(name: str, complexity: int, indent: str = "") -> str:
    """A function whose cyclomatic complexity is `complexity`: one path, and an `if` per extra one."""
    body = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(complexity - 1))
    return textwrap.indent(f"def {name}(x):\n{body}    return -1\n", indent)


def gate(tmp_path: Path, source: str, limit: int = 15) -> subprocess.CompletedProcess[str]:
    (tmp_path / "module.py").write_text(source)
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "complexity.py"), "--max", str(limit), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_function_at_the_limit_passes(tmp_path: Path) -> None:
    done = gate(tmp_path, branches("at_the_limit", 15))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


@pytest.mark.parametrize(
    ("source", "named"),
    [
        (branches("above", 16), "above has complexity 16, above 15"),
        ("class Job:\n" + branches("judge", 17, "    "), "Job.judge has complexity 17, above 15"),
        # radon does not add a closure's complexity to its function's: it must count on its own.
        (
            "def outer():\n" + branches("inner", 16, "    ") + "    return inner\n",
            "outer.inner has complexity 16",
        ),
        ("def broken(:\n", "radon could not read it"),
    ],
    ids=["function", "method", "closure", "unparseable"],
)
def test_what_is_above_the_limit_fails_named(tmp_path: Path, source: str, named: str) -> None:
    done = gate(tmp_path, branches("simple", 3) + "\n\n" + source)
    assert done.returncode == 1
    assert named in done.stderr
    assert "simple" not in done.stderr
