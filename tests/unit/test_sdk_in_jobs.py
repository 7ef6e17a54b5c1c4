"""The SDK directory a Kubernetes job mounts (services/jobs/sdk.py): `import paddlecloud.metrics` in a
Python without the platform, and an installed paddlecloud left in charge where there is one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from paddlecloud.jobs import sdk


def sdk_dir(root: Path) -> Path:
    for relative, text in sdk.files().items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        path.chmod(0o444)
    return root


def python(code: str, pythonpath: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter with `-S` (no site-packages: nothing of the platform's
    installed), PYTHONPATH set through the same shell line a pod's command starts with."""
    script = sdk.pythonpath_prefix().replace(sdk.SDK_DIR, pythonpath)
    script += f'exec "{sys.executable}" -S -c "$CODE"'
    clean = {"PATH": os.environ["PATH"], "CODE": code, **env}
    return subprocess.run(
        ["/bin/sh", "-c", script], env=clean, cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_a_python_without_paddlecloud_logs_metrics_through_the_mounted_sdk(tmp_path: Path) -> None:
    mounted = sdk_dir(tmp_path / "sdk")
    code = (
        "import paddlecloud.metrics as m, sys\n"
        "for step in range(3): m.log(step=step, loss=1.0 / (step + 1))\n"
        "print(m.__file__)\n"
        "print([k for k in sys.modules if k.split('.')[0] in ('aiohttp', 'pydantic', 'yaml')])\n"
    )
    result = python(code, str(mounted), tmp_path, PADDLE_CLOUD_OUTPUT=str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    where, heavy = result.stdout.splitlines()
    assert where == str(mounted / "paddlecloud" / "metrics.py")
    assert heavy == "[]"
    lines = (tmp_path / "out" / "metrics" / "local.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 1, 2]


def test_an_installed_paddlecloud_is_loaded_in_the_sdks_place_and_a_users_own_comes_first(
    tmp_path: Path,
) -> None:
    mounted = sdk_dir(tmp_path / "sdk")
    # An image's own paddlecloud (the runtime image's: runtime helpers and a lazy __init__),
    # further along sys.path than the SDK directory, and one that predates metrics.py.
    installed = tmp_path / "site" / "paddlecloud"
    installed.mkdir(parents=True)
    (installed / "__init__.py").write_text("from . import runtime\nFULL = True\n")
    (installed / "runtime.py").write_text("NAME = 'the installed runtime'\n")
    code = (
        "import paddlecloud, paddlecloud.metrics, paddlecloud.runtime\n"
        "print(paddlecloud.FULL, paddlecloud.runtime.NAME, paddlecloud.metrics.__file__)\n"
    )
    both = f"{mounted}:{tmp_path / 'site'}"
    result = python(code, both, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "True",
        "the",
        "installed",
        "runtime",
        str(mounted / "paddlecloud" / "metrics.py"),
    ]

    # The user's PYTHONPATH comes before the SDK's: their own paddlecloud is the one imported.
    own = tmp_path / "own" / "paddlecloud"
    own.mkdir(parents=True)
    (own / "__init__.py").write_text("MINE = True\n")
    script = sdk.pythonpath_prefix().replace(sdk.SDK_DIR, str(mounted))
    script += f'exec "{sys.executable}" -S -c "import paddlecloud; print(paddlecloud.MINE)"'
    result = subprocess.run(
        ["/bin/sh", "-c", script],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path / "own")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"
