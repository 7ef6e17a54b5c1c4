"""`paddlecloud server` for the benches: on a free port, with its data under one directory."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

import yaml

CLI = [sys.executable, "-m", "paddlecloud"]


def clean_env(home: Path) -> dict[str, str]:
    """This environment without PaddleCloud's variables, with this venv's `python` first on PATH
    (as for a user whose venv is active): the jobs and the baselines run the same interpreter."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLECLOUD_", "PADDLE_"))}
    env["HOME"] = str(home)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


class Platform:
    """`paddlecloud server` on a free port with its data under `root`."""

    def __init__(self, root: Path, server_config: dict[str, Any]) -> None:
        self.root = root
        self.data = root / "data"
        self.env = clean_env(root / "home")
        self.config = server_config
        self.process: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> None:
        (self.root / "home").mkdir(parents=True, exist_ok=True)
        config = self.root / "server.yaml"
        config.write_text(yaml.safe_dump(self.config))
        with open(self.root / "server.stderr", "ab") as stderr:
            self.process = subprocess.Popen(
                [*CLI, "server", "--data-dir", str(self.data), "--port", "0", "--server-config", str(config)],
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        assert self.process.stdout is not None
        for line in self.process.stdout:
            found = re.match(r"PaddleCloud is running at (\S+)", line)
            if found:
                self.url = found[1]
            if line.startswith("Press Ctrl-C"):
                break
        if not self.url:
            self.stop()
            raise RuntimeError(f"the server did not start: {(self.root / 'server.stderr').read_text()}")

    def admin_password(self) -> str:
        return (self.data / "admin.password").read_text().strip()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        assert self.process.stdout is not None
        self.process.stdout.close()

    @contextmanager
    def running(self) -> Iterator[Self]:
        self.start()
        try:
            yield self
        finally:
            self.stop()
