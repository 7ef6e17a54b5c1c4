"""A real HDFS for the tests: Hadoop's own minicluster in one JVM per session (scripts/hdfs.sh).

`real_hdfs` starts `scripts/hdfs.sh run` as a subprocess with its own temporary base
directory and waits for the ready file it writes; the JVM reads its stdin until EOF, so if
this test process dies (and the pipe closes) the cluster stops with it, and at the session's
end it is asked to stop by closing that pipe. Where it cannot run (no JDK or Maven) the tests
that need it are skipped and say why; where it should run and does not start, they fail.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "hdfs.sh"
PLATFORM_USER = "paddlecloud"
_START_TIMEOUT = 180.0


def unavailable() -> str | None:
    """Why the minicluster cannot run here, or None when it can."""
    missing = [tool for tool in ("java", "javac", "mvn") if shutil.which(tool) is None]
    if missing:
        return f"HDFS tests need a JDK 17 and Maven ({', '.join(missing)} missing)"
    return None


@dataclass
class RealHdfs:
    """A running minicluster: its WebHDFS URL, the OS user that is its superuser, and the
    user PaddleCloud acts as (a superuser too, allowed to act for anyone)."""

    url: str
    superuser: str
    platform_user: str
    process: subprocess.Popen[bytes]

    def _call(self, method: str, path: str, op: str, **params: str) -> bytes:
        query = urllib.parse.urlencode({"op": op, "user.name": self.superuser, **params})
        url = f"{self.url}/webhdfs/v1{urllib.parse.quote(path)}?{query}"
        request = urllib.request.Request(url, method=method)  # noqa: S310 - the minicluster's http URL
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            return response.read()

    def make_dir(self, path: str, *, owner: str | None = None, mode: int = 0o755) -> None:
        """Make `path` (and its parents) as the superuser, then give it to `owner`."""
        self._call("PUT", path, "MKDIRS", permission=f"{mode:o}")
        if owner is not None:
            self._call("PUT", path, "SETOWNER", owner=owner)

    def make_home(self, root: str, user: str) -> str:
        """`<root>/home/<user>`, owned by `user`, mode 0700, as the HDFS volume makes it."""
        home = f"{root}/home/{user}"
        self.make_dir(home, owner=user, mode=0o700)
        return home

    def make_symlink(self, link: str, target: str) -> None:
        """An HDFS symlink at `link` (the minicluster enables them; operators rarely do)."""
        self._call("PUT", link, "CREATESYMLINK", destination=target, createParent="true")

    def status(self, path: str) -> dict[str, object] | None:
        try:
            return json.loads(self._call("GET", path, "GETFILESTATUS"))["FileStatus"]
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def listdir(self, path: str) -> list[str]:
        statuses = json.loads(self._call("GET", path, "LISTSTATUS"))["FileStatuses"]["FileStatus"]
        return sorted(str(s["pathSuffix"]) for s in statuses)

    def content_summary(self, path: str) -> dict[str, Any]:
        summary: dict[str, Any] = json.loads(self._call("GET", path, "GETCONTENTSUMMARY"))["ContentSummary"]
        return summary

    def read(self, path: str) -> bytes:
        return self._call("GET", path, "OPEN")

    def write_as(self, user: str, path: str, data: bytes) -> None:
        """CREATE `path` as `user` (a job writing through its node's mount), straight to WebHDFS."""
        query = urllib.parse.urlencode({"op": "CREATE", "user.name": user, "noredirect": "true"})
        url = f"{self.url}/webhdfs/v1{urllib.parse.quote(path)}?{query}"
        with urllib.request.urlopen(urllib.request.Request(url, method="PUT"), timeout=30) as answer:  # noqa: S310
            location = json.loads(answer.read())["Location"]
        put = urllib.request.Request(location, data=data, method="PUT")  # noqa: S310
        with urllib.request.urlopen(put, timeout=60) as answer:  # noqa: S310
            answer.read()

    def fresh_root(self) -> str:
        """A new, empty directory for one test's datacenter root, writable by the platform."""
        root = f"/tests/{uuid.uuid4().hex}"
        self.make_dir(root, owner=self.platform_user)
        return root


@contextlib.contextmanager
def minicluster(directory: Path) -> Iterator[RealHdfs]:
    """The minicluster in one JVM, its state under `directory`; stopped after (stdin closed,
    the JVM's signal to stop cleanly; SIGKILL only if it hangs). RuntimeError if it does not
    start. The tests' `real_hdfs` and bench/hdfs.py both start it here."""
    ready = directory / "ready.json"
    log_path = directory / "minihdfs.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(SCRIPT), "run", str(directory / "data"), str(ready), PLATFORM_USER],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        waited = 0.0
        while not ready.exists():
            try:
                code = process.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                waited += 0.2
                if waited > _START_TIMEOUT:
                    raise RuntimeError(
                        f"the HDFS minicluster did not start in {_START_TIMEOUT:.0f} s ({log_path})"
                    ) from None
                continue
            tail = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the HDFS minicluster exited with {code} before it was ready:\n{tail}")
        info = json.loads(ready.read_text())
        yield RealHdfs(info["url"], info["superuser"], PLATFORM_USER, process)
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def real_hdfs() -> Iterator[RealHdfs]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    directory = Path(tempfile.mkdtemp(prefix="pc-hdfs-"))
    try:
        with minicluster(directory) as hdfs:
            yield hdfs
    except RuntimeError as exc:  # it did not start: the tests that need it fail, saying why
        pytest.fail(str(exc))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
