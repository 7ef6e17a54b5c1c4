"""nx-27017, the MongoDB wire server on SQLite, started for the Mongo store's tests and the benchmarks."""

from __future__ import annotations

import collections
import re
import subprocess
import sys
import threading
from pathlib import Path

_LISTENING = re.compile(r"Listening on \S+:(\d+)")
# Generous: the first start imports neosqlite and may create its data directory.
START_TIMEOUT = 30.0


class EmulatorError(RuntimeError):
    """nx-27017 is not installed, or did not start listening; the message says which and why."""


class Nx27017:
    """nx-27017 on a loopback port the kernel picks, with its databases in `data_dir`.

    Started by the constructor; `wait_ready()` gives the port, `stop()` ends it.
    """

    def __init__(self, data_dir: Path) -> None:
        binary = Path(sys.executable).with_name("nx-27017")
        if not binary.exists():
            raise EmulatorError(f"{binary} is missing: install the dev extras (pip install -e '.[dev]')")
        data_dir.mkdir(parents=True, exist_ok=True)
        # --data-dir gives every logical database its own SQLite file, so the
        # per-test database names really isolate tests from one another.
        self._proc = subprocess.Popen(
            [
                str(binary),
                "--data-dir", str(data_dir),
                "--host", "127.0.0.1",
                "-p", "0",
                "--log-file", str(data_dir / "nx-27017.log"),
                "--pid-file", str(data_dir / "nx-27017.pid"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        self._lines: collections.deque[str] = collections.deque(maxlen=200)
        self._port: int | None = None
        self._ready = threading.Event()
        # The server logs every connection to stderr; the pipe must be drained for
        # as long as it runs or the server blocks once it fills.
        self._reader = threading.Thread(target=self._drain, name="nx-27017-stderr", daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._lines.append(line)
            match = _LISTENING.search(line)
            if match and self._port is None:
                self._port = int(match[1])
                self._ready.set()
        self._ready.set()  # the server exited; wait_ready reports why

    def wait_ready(self) -> int:
        """The port once the server has bound it (it logs the port after listen())."""
        self._ready.wait(START_TIMEOUT)
        if self._port is None:
            self.stop()
            output = "".join(self._lines) or "(no output)"
            raise EmulatorError(f"nx-27017 did not start listening within {START_TIMEOUT} s:\n{output}")
        return self._port

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout=10)
        if self._proc.stderr is not None:
            self._proc.stderr.close()
