"""The distribution as pip builds it: setuptools has nothing to warn about, and the wheel
ships the dashboard's files (issue 28 item 8: ~130 lines of warnings at every install)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "services" / "gateway" / "dashboard" / "static"


def test_building_the_wheel_warns_of_nothing_and_ships_the_dashboard(tmp_path: Path) -> None:
    # A copy of what the build reads, so that setuptools' build/ and egg-info land there.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("cli", "services"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    # The venv's own setuptools (the dev extra): no index needed, as quick as a build gets.
    pip = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "--no-index"]
    result = subprocess.run(
        [*pip, "--wheel-dir", str(tmp_path / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    # Python's warnings as setuptools raises them (`_Warning: Package ... is absent from the
    # packages configuration`, SetuptoolsDeprecationWarning, ...); distutils' lower-case
    # "warning: byte-compiling is disabled" is pip's -v talking, not a problem.
    assert [line for line in output.splitlines() if re.search(r"[A-Za-z_]*Warning\b", line)] == []
    (wheel,) = (tmp_path / "dist").glob("paddlecloud-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    dashboard = {
        "paddlecloud/gateway/dashboard/static/" + path.relative_to(STATIC).as_posix()
        for path in STATIC.rglob("*")
        if path.is_file()
    }
    assert len(dashboard) > 5 and dashboard <= shipped
