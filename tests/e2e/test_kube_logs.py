"""A job's logs on the real control plane when the kubelet rotates them: `logs -f` through
the real CLI loses no line and repeats none across a rotation and reads through the API
server only what it does not have yet; a reader resumes from a cursor taken before the
rotation. The simulated kubelet (tests/kube_real/logs.py) serves only the current log
file after a rotation, as the real one does, and counts the bytes it served."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kube_backend_support as kb
import pytest
from kube_backend_support import KubeBackend, wait

import kube_real
from kube_real.fixtures import RealKube
from paddlecloud import Client
from paddlecloud.jobs.kube.names import LABEL_JOB

pytestmark = pytest.mark.slow


@pytest.fixture
def backend(real_kube: RealKube, server_factory: Any, tmp_path: Path) -> Iterator[KubeBackend]:
    with kb.kube_backend(real_kube, server_factory, tmp_path) as started:
        yield started


def _read_until(lines: queue.Queue[str | None], out: list[str], last: str) -> None:
    while last not in out:
        line = lines.get(timeout=60)
        assert line is not None, out[-5:]
        out.append(line)


def test_logs_follow_across_a_rotation_loses_no_line_repeats_none_and_reads_only_what_is_new(
    backend: KubeBackend,
) -> None:
    k = backend
    logs = k.kube.kubelet.logs
    release = threading.Event()
    # Enough that reading it all again would show in the bytes the kubelet served.
    first = tuple(f"step {i:04d} {'x' * 40}" for i in range(2000))
    size = sum(len(line) + 1 for line in first)
    trainer = kube_real.PodScript(lines=first, until=release, final_lines=("the end",))
    env = {n: v for n, v in os.environ.items() if not n.startswith(("PADDLECLOUD_", "PADDLE_"))}
    follower = None
    try:
        with k.kube.scripted(kb.script(trainer=lambda pod: trainer)):
            k.submit("rotated")
            pod = wait(lambda: _running_pod(k, "rotated"), "the trainer's pod running")
            key = (k.namespace(), pod["metadata"]["name"], pod["spec"]["containers"][0]["name"])
            follower = subprocess.Popen(
                [sys.executable, "-m", "paddlecloud", "logs", "-f", "rotated"],
                env=env | {"HOME": str(k.server.home)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            lines, out = kb.lines_of(follower), []
            _read_until(lines, out, f"[trainer-0] {first[-1]}")

            # Lines written while it follows cost the kubelet their own bytes, not the log's.
            served = logs.served
            for i in range(3):
                logs.print(key, f"live {i}")
            _read_until(lines, out, "[trainer-0] live 2")
            assert logs.served - served < size // 10, (logs.served - served, size)

            # A reader that stopped here resumes after the rotation from its cursor.
            with Client(k.server.endpoint, "admin", k.server.admin_password) as client:
                cursor = list(client.logs("rotated"))[-1].cursor
                logs.rotate(key)  # the kubelet serves only the new file from now on
                for i in range(3):
                    logs.print(key, f"rotated {i}")
                _read_until(lines, out, "[trainer-0] rotated 2")
                resumed = [e.line for e in client.logs("rotated", cursor=cursor)]
            assert resumed == [f"rotated {i}" for i in range(3)], resumed

            release.set()
            while (line := lines.get(timeout=60)) is not None:
                out.append(line)
            assert follower.wait(timeout=30) == 0, follower.stderr.read() if follower.stderr else ""
    finally:
        release.set()
        if follower is not None and follower.poll() is None:
            follower.kill()
            follower.wait()
    expected = [*first, *(f"live {i}" for i in range(3)), *(f"rotated {i}" for i in range(3)), "the end"]
    assert [line for line in out if line.startswith("[trainer-0] ")] == [f"[trainer-0] {e}" for e in expected]


def _running_pod(k: KubeBackend, job: str) -> dict[str, Any] | None:
    listing = k.kube.cluster.admin.get(
        f"/api/v1/namespaces/{k.namespace()}/pods", query={"labelSelector": f"{LABEL_JOB}={job}"}
    )
    running = [p for p in listing["items"] if (p.get("status") or {}).get("phase") == "Running"]
    return running[0] if running else None
