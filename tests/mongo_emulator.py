"""The MongoDB wire servers the Mongo store's tests and the benchmarks start: nx-27017, and FerretDB."""

from __future__ import annotations

import collections
import re
import subprocess
import sys
import threading
from pathlib import Path

# nx-27017 logs "Listening on 127.0.0.1:PORT"; FerretDB v1 "Listening on TCP 127.0.0.1:PORT ...".
_LISTENING = re.compile(r"Listening on (?:TCP )?\S+:(\d+)")
# Generous: the first start imports neosqlite and may create its data directory.
START_TIMEOUT = 30.0
# scripts/ferretdb.sh builds FerretDB (make ferretdb) and says where the binary is.
FERRETDB_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "ferretdb.sh"


class EmulatorError(RuntimeError):
    """A wire server is not installed, or did not start listening; the message says which and why."""


class _WireServer:
    """A MongoDB wire server on a loopback port the kernel picks (it logs the port once bound).

    Started by the constructor; `wait_ready()` gives the port, `stop()` ends it.
    """

    name = ""

    def __init__(self, argv: list[str]) -> None:
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self._lines: collections.deque[str] = collections.deque(maxlen=200)
        self._port: int | None = None
        self._ready = threading.Event()
        # The servers log every connection to stderr; the pipe must be drained for
        # as long as it runs or the server blocks once it fills.
        self._reader = threading.Thread(target=self._drain, name=f"{self.name}-stderr", daemon=True)
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
            raise EmulatorError(f"{self.name} did not start listening within {START_TIMEOUT} s:\n{output}")
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


class Nx27017(_WireServer):
    """nx-27017 (Python, on neosqlite) with its databases in `data_dir`."""

    name = "nx-27017"

    def __init__(self, data_dir: Path) -> None:
        binary = Path(sys.executable).with_name("nx-27017")
        if not binary.exists():
            raise EmulatorError(f"{binary} is missing: install the dev extras (pip install -e '.[dev]')")
        data_dir.mkdir(parents=True, exist_ok=True)
        # --data-dir gives every logical database its own SQLite file, so the
        # per-test database names really isolate tests from one another.
        super().__init__(
            [
                str(binary),
                "--data-dir", str(data_dir),
                "--host", "127.0.0.1",
                "-p", "0",
                "--log-file", str(data_dir / "nx-27017.log"),
                "--pid-file", str(data_dir / "nx-27017.pid"),
            ]
        )  # fmt: skip


def ferretdb_binary() -> Path:
    """Where scripts/ferretdb.sh puts FerretDB (the version is pinned there only)."""
    out = subprocess.run([str(FERRETDB_SCRIPT), "binary"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


class FerretDB(_WireServer):
    """FerretDB v1 (Go) on its SQLite backend, one SQLite file per database in `data_dir`."""

    name = "FerretDB"

    def __init__(self, data_dir: Path) -> None:
        binary = ferretdb_binary()
        if not binary.exists():
            raise EmulatorError(f"{binary} is missing: run `make ferretdb` (a Go build, minutes when cold)")
        data_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(
            [
                str(binary),
                "--handler=sqlite",
                # A directory URI (the trailing slash): each database is DIR/<name>.sqlite.
                f"--sqlite-url=file:{data_dir}/",
                "--listen-addr=127.0.0.1:0",
                # Its own state (an instance UUID) beside the data, not in the working directory.
                f"--state-dir={data_dir}",
                # No debug HTTP server: its fixed default port would clash between test runs.
                "--debug-addr=-",
                "--telemetry=disable",
            ]
        )  # fmt: skip
