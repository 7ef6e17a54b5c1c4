"""The CLI's start-up: `--help` and `version` import only what they use (issue 28 item 7).

Scripts call `paddlecloud` in loops, so what one command imports is paid on every call; aiohttp
alone takes longer to import than the 0.2 s the whole start-up may cost. Asserted through the
modules the real command imports (`python -X importtime`), never through a clock.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env

from paddlecloud import __version__

pytestmark = pytest.mark.slow

# What the server, the transfers and the job commands need, and neither of these two commands.
HEAVY = (
    "aiohttp",
    "yarl",
    "multidict",
    "structlog",
    "pydantic",
    "kubernetes_asyncio",
    "pathspec",
    "isal",
    "prometheus_client",
    "uvloop",
    "pymongo",
    "aiosqlite",
    "argon2",
    "tqdm",
    "paddlecloud.common",
    "paddlecloud.gateway",
    "paddlecloud.jobs",
    "paddlecloud.pfs",
    "paddlecloud.builder",
    "paddlecloud.client",
    "paddlecloud.transfer",
)


def imported(home: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run `paddlecloud ARGS` as a user does; the modules it imported, from -X importtime."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "paddlecloud", *args],
        env=clean_env(home),
        capture_output=True,
        text=True,
        timeout=60,
    )
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    }
    modules.discard("package")  # importtime's own header line
    return result, modules


def heavy(modules: set[str], *more: str) -> list[str]:
    """Which of HEAVY (and `more`) the command imported, each named once."""
    return sorted(n for n in (*HEAVY, *more) if any(m == n or m.startswith(n + ".") for m in modules))


def test_help_imports_no_client_no_server_and_no_yaml(tmp_path: Path) -> None:
    result, modules = imported(tmp_path, "--help")
    assert result.returncode == 0, result.stderr
    assert "paddlecloud.main" in modules  # the probe sees the CLI's own imports
    # Nor what only a failure with --debug (traceback), a generated name or password (secrets)
    # or a config write (tempfile) needs.
    assert heavy(modules, "yaml", "asyncio", "traceback", "secrets", "tempfile") == []
    assert "submit" in result.stdout and "server" in result.stdout


def test_version_against_a_server_imports_neither_aiohttp_nor_asyncio_nor_the_server(
    server_factory: Any,
) -> None:
    server = server_factory()
    result, modules = imported(server.home, "version")
    assert result.returncode == 0, result.stderr
    assert heavy(modules, "asyncio") == []
    assert (
        result.stdout
        == f"Client: {__version__}\nServer: {__version__} (API v1) at datacenter1 ({server.endpoint})\n"
    )
