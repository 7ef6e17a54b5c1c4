"""The CLI against a real `paddlecloud server`, each as its own process."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

STARTUP_TIMEOUT = 60.0


def clean_env(home: Path) -> dict[str, str]:
    """The caller's environment without any PaddleCloud settings, with HOME moved."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLECLOUD_", "PADDLE_"))}
    env["HOME"] = str(home)
    return env


@dataclass
class Server:
    """A running `paddlecloud server` and a way to run the CLI against it."""

    process: subprocess.Popen[str]
    home: Path
    data_dir: Path
    endpoint: str = ""
    admin_password: str | None = None
    stdout_lines: list[str] = field(default_factory=list)
    _stderr: queue.Queue[str] = field(default_factory=queue.Queue)
    stderr_lines: list[str] = field(default_factory=list)

    def cli(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-m", "paddlecloud", *args],
            env=clean_env(self.home),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"paddlecloud {' '.join(args)} exited {result.returncode}: {result.stderr}")
        return result

    def add_datacenter(self, name: str, username: str, password: str) -> None:
        """A client config entry `name` for this server, logging in as `username`."""
        self.cli(
            "config",
            "add",
            name,
            "--endpoint",
            self.endpoint,
            "--username",
            username,
            "--password-stdin",
            stdin=f"{password}\n",
        )

    def wait_for_stderr(self, needle: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.stderr_lines:
                if needle in line:
                    return line
            try:
                self.stderr_lines.append(self._stderr.get(timeout=0.1))
            except queue.Empty:
                pass
        raise AssertionError(f"server never said {needle!r}; it said: {self.stderr_lines}")

    def services(self) -> dict[str, psutil.Process]:
        found = {}
        for child in psutil.Process(self.process.pid).children():
            for name in ("gateway", "jobs", "pfs", "builder"):
                if f"paddlecloud.{name}" in child.cmdline():
                    found[name] = child
        return found

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start_server(
    home: Path, data_dir: Path, *extra: str, command: list[str] | None = None, cwd: Path | None = None
) -> Server:
    """`paddlecloud server` on a free port; `command` replaces the usual command line
    (the README's own, whose data directory is the default under HOME)."""
    default = [sys.executable, "-m", "paddlecloud", "server", "--data-dir", str(data_dir), "--port", "0"]
    argv = command or default
    process = subprocess.Popen(
        [*argv, *extra],
        env=clean_env(home),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    server = Server(process, home, data_dir)
    assert process.stderr is not None and process.stdout is not None

    def pump() -> None:
        for line in process.stderr:  # type: ignore[union-attr]
            server._stderr.put(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True, name="server-stderr").start()
    deadline = time.monotonic() + STARTUP_TIMEOUT
    for line in process.stdout:
        server.stdout_lines.append(line.rstrip("\n"))
        if line.startswith("PaddleCloud is running at "):
            server.endpoint = line.split()[4]
        if line.startswith("Created administrator"):
            server.admin_password = line.rsplit(": ", 1)[1].strip()
        if line.startswith("Press Ctrl-C"):
            break
        if time.monotonic() > deadline:
            break
    if not server.endpoint:
        server.stop()
        raise AssertionError(f"server did not start: {server.stdout_lines} {process.stderr.read()}")
    return server


@pytest.fixture
def server_factory(tmp_path) -> Iterator[type[Server] | object]:
    started: list[Server] = []

    def start(*extra: str, home: Path | None = None, data_dir: Path | None = None) -> Server:
        server = start_server(home or tmp_path / "home", data_dir or tmp_path / "data", *extra)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
