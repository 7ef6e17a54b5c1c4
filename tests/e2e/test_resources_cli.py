"""Resource use per worker through the real CLI against a real `paddlecloud server` (local
backend, real cgroups): a job that holds 200 MiB shows it in `top job` while it runs, in
the resources API and `get job`'s peaks after it ended (issue 34's acceptance)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_jobs_cli import as_json, ok, one_error_line, run_cli, wait_for_state

from paddlecloud import Client

pytestmark = pytest.mark.slow

MiB = 2**20

# Holds 200 MiB, every page touched (an untouched bytearray is already zeroed memory the
# kernel charges as it is written), for a few seconds, then exits 0.
HOLD_PY = """\
import time
block = bytearray(200 * 2**20)
for i in range(0, len(block), 4096):
    block[i] = 1
print("holding", len(block), flush=True)
time.sleep(6)
"""


def test_a_job_holding_200_mib_shows_it_in_top_the_api_and_its_peaks(
    server_factory: Any, tmp_path: Path
) -> None:
    settings = tmp_path / "settings.yaml"
    settings.write_text(yaml.safe_dump({"jobs": {"metrics": {"interval": 0.5}}}))
    server = server_factory("--server-config", str(settings))
    package = tmp_path / "hold"
    package.mkdir()
    (package / "train.py").write_text(HOLD_PY)
    ok(run_cli(server, "submit", "--name", "hold", "--memory", "512Mi", str(package)))

    # `top job` while it runs: polled until a sample caught the allocation (or the job ended).
    deadline = time.monotonic() + 90
    seen: dict[str, Any] | None = None
    while seen is None:
        top = as_json(run_cli(server, "-o", "json", "top", "job", "hold"))
        assert top["available"] is True, top
        for row in top["workers"]:
            if row["worker"] == "trainer-0" and (row["memory_bytes"] or 0) >= 200 * MiB:
                seen = row
        if seen is None:
            state = as_json(run_cli(server, "-o", "json", "get", "job", "hold"))["state"]
            assert state in ("PENDING", "RUNNING"), f"the job ended ({state}) before top saw 200 MiB: {top}"
            assert time.monotonic() < deadline, top
    assert seen["memory_limit_bytes"] == 512 * MiB
    table = ok(run_cli(server, "top", "job", "hold"))
    assert table.splitlines()[0].split()[:3] == ["WORKER", "CPU", "MEMORY"]
    assert "/ 512.0 MiB (" in table

    job = wait_for_state(server, "hold", ("SUCCEEDED", "FAILED", "KILLED"))
    assert job["state"] == "SUCCEEDED", job["reason"]

    # The series after the end: kept, and it reaches the 200 MiB.
    with Client(server.endpoint, "admin", server.admin_password) as client:
        answer = client.resources("hold")
        [worker] = answer["workers"]
        assert worker["worker"] == "trainer-0" and answer["interval_seconds"] == 0.5
        assert max(worker["memory_bytes"]) >= 200 * MiB
        assert len(worker["t"]) == len(worker["cpu_cores"]) == len(worker["memory_bytes"]) >= 2
        assert worker["gpu_utilization"] == [None] * len(worker["t"])  # no GPU asked
        assert any(cores is not None and cores > 0 for cores in worker["cpu_cores"])
        later = client.resources("hold", since=worker["t"][-2])
        assert later["workers"][0]["t"] == worker["t"][-1:]

    peaks = as_json(run_cli(server, "-o", "json", "get", "job", "hold"))["resources"]
    assert peaks["trainer-0"]["memory_bytes"] >= 200 * MiB
    assert peaks["trainer-0"]["memory_limit_bytes"] == 512 * MiB
    assert "Peak resource use:" in ok(run_cli(server, "get", "job", "hold"))

    # Mistakes: one line, non-zero.
    line = one_error_line(run_cli(server, "top", "job", "no-such-job"))
    assert "no-such-job" in line
