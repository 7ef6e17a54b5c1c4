"""Small authenticated GETs through the gateway against the same endpoint hit directly, at 32
connections (issue 18's aims) and at 50 and 200 (issue 20's): each figure beside its aim."""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from paddlecloud.common import internal_auth
from support import ADMIN_PASSWORD, ServiceProcess, make_config, write_config

from . import verdict
from .upstream import PING

DURATION = "8s"
CONNECTIONS = 32
ROUNDS = 3

# Issue 18's aims for the gateway against the service alone, on the median of the rounds.
AIM_THROUGHPUT = 0.7
AIM_P99 = 3.0
# Issue 20's aim under load: no errors, and the p99 at 200 connections within 5x of 50's.
AIM_LOAD_P99 = 5.0


# Issue 20's load figure: many clients at once through the gateway, against fewer.
LOAD_CONNECTIONS = (50, 200)


def schedstat(pids: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Nanoseconds each process spent on a CPU and waiting for one (Linux), by name."""
    stats = {}
    for name, pid in pids.items():
        try:
            run, wait, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
        except (OSError, ValueError):
            continue
        stats[name] = (int(run), int(wait))
    return stats


def wrk(
    url: str,
    headers: dict[str, str],
    connections: int = CONNECTIONS,
    *,
    allow_errors: bool = False,
    pids: dict[str, int] | None = None,
) -> dict[str, float]:
    """Requests per second, latency percentiles (ms) and errors from one wrk run; with
    `pids`, also each process's CPU time and run-queue wait per request (us)."""
    before = schedstat(pids or {})
    cmd = ["wrk", "-t2", f"-c{connections}", f"-d{DURATION}", "--latency", "--timeout", "10s"]
    for key, value in headers.items():
        cmd += ["-H", f"{key}: {value}"]
    out = subprocess.run([*cmd, url], capture_output=True, text=True, check=True).stdout
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    errors = (int(non_2xx.group(1)) if non_2xx else 0) + (
        sum(int(n) for n in socket_errors.groups()) if socket_errors else 0
    )
    if errors and not allow_errors:
        raise RuntimeError(f"wrk saw errors:\n{out}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]

    def pct(p: str) -> float:
        value, unit = re.search(rf"\s{p}%\s+([\d.]+)(us|ms|s)", out).groups()  # type: ignore[union-attr]
        return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]

    result = {"rps": rps, "p50": pct("50"), "p99": pct("99"), "errors": errors}
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    for name, (run, wait) in schedstat(pids or {}).items():
        if name in before and requests:
            result[f"{name}_cpu_us"] = (run - before[name][0]) / 1000 / requests
            result[f"{name}_wait_us"] = (wait - before[name][1]) / 1000 / requests
    return result


def median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the rounds."""
    return {key: statistics.median(r[key] for r in runs) for key in runs[0] if all(key in r for r in runs)}


def login(url: str) -> str:
    body = json.dumps({"username": "admin", "password": ADMIN_PASSWORD}).encode()
    # The URL is the loopback gateway this benchmark started itself.
    request = urllib.request.Request(  # noqa: S310
        f"{url}/api/v1/auth/token", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request) as resp:  # noqa: S310
        return str(json.load(resp)["token"])


def main() -> None:
    if shutil.which("wrk") is None:
        sys.exit("bench/gateway needs wrk: apt-get install wrk (make bench does this)")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        upstream_dir = workdir / "upstream"
        upstream_dir.mkdir()
        upstream = ServiceProcess("jobs", write_config(upstream_dir), upstream_dir)
        upstream.module = "bench.upstream"
        upstream.start()
        gateway = ServiceProcess(
            "gateway", write_config(workdir, gateway={"jobs_url": upstream.url}), workdir
        )
        try:
            gateway.start()
            token = login(gateway.url)
            secret = make_config(upstream_dir).internal_secret()
            # One signature serves the whole run: it stays fresh for MAX_AGE_SECONDS.
            signed = internal_auth.sign(
                secret, internal_auth.Identity("admin", True), "bench-direct", "GET", PING
            )
            direct_headers = {**signed, "X-Request-ID": "bench-direct"}
            gateway_headers = {"Authorization": f"Bearer {token}"}
            assert upstream.process is not None and gateway.process is not None
            pids = {"gateway": gateway.process.pid, "service": upstream.process.pid}
            wrk(upstream.url + PING, direct_headers)  # warm-up
            wrk(gateway.url + PING, gateway_headers)
            runs: dict[str, list[dict[str, float]]] = {"direct": [], "gateway": []}
            for _ in range(ROUNDS):  # interleaved, so drift on a shared machine hits both
                runs["direct"].append(wrk(upstream.url + PING, direct_headers, pids=pids))
                runs["gateway"].append(wrk(gateway.url + PING, gateway_headers, pids=pids))
            load = {
                n: wrk(gateway.url + PING, gateway_headers, n, allow_errors=True, pids=pids)
                for n in LOAD_CONNECTIONS
            }
            # The same load on the service alone: what one aiohttp process does on this machine.
            bare = {
                n: wrk(upstream.url + PING, direct_headers, n, allow_errors=True, pids=pids)
                for n in LOAD_CONNECTIONS
            }
        finally:
            gateway.stop()
            upstream.stop()
    # Other work on a shared machine shows in the figures; say how much there was.
    print("load average (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    median = {k: median_run(v) for k, v in runs.items()}
    d, g = median["direct"], median["gateway"]
    print(f"{CONNECTIONS} connections, {DURATION} per run, median of {ROUNDS} interleaved runs")
    print(f"{'':10}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}   CPU us/request (run-queue wait)")
    for name, r in (("direct", d), ("gateway", g)):
        print(f"{name:10}{r['rps']:>10.0f}{r['p50']:>10.2f}{r['p99']:>10.2f}   {_cpu(r, name)}")
    throughput, tail = g["rps"] / d["rps"], g["p99"] / d["p99"]
    print(
        f"gateway/direct throughput {throughput:.2f}x "
        f"(aim >= {AIM_THROUGHPUT}x): {verdict(throughput >= AIM_THROUGHPUT)}"
    )
    print(f"gateway/direct p99 {tail:.2f}x (aim <= {AIM_P99}x): {verdict(tail <= AIM_P99)}")
    for name, runs_at in (("direct", bare), ("gateway", load)):
        for n in LOAD_CONNECTIONS:
            r = runs_at[n]
            rate, p99, errs = r["rps"], r["p99"], int(r["errors"])
            print(
                f"{name:8} {n:>4} connections: {rate:>7.0f} req/s, p99 {p99:8.1f} ms, {errs} errors   "
                f"{_cpu(r, name)}"
            )
    for name, runs_at in (("direct", bare), ("gateway", load)):
        few, many = (runs_at[n] for n in LOAD_CONNECTIONS)
        ratio = many["p99"] / few["p99"]
        met = many["errors"] == 0 and ratio <= AIM_LOAD_P99
        print(
            f"load {name}: {LOAD_CONNECTIONS[1]} connections p99 {many['p99']:.1f} ms, "
            f"{int(many['errors'])} errors; {LOAD_CONNECTIONS[0]} connections p99 {few['p99']:.1f} ms; "
            f"p99 {ratio:.2f}x (aim: 0 errors and p99 <= {AIM_LOAD_P99}x): {verdict(met)}"
        )


def _cpu(r: dict[str, float], row: str) -> str:
    """CPU time per request of each process the row's requests pass through, with the time
    it waited for a CPU in brackets: what the time is spent on, and how busy the machine was."""
    names = ("gateway", "service") if row == "gateway" else ("service",)
    return ", ".join(
        f"{name} {r[f'{name}_cpu_us']:.0f} ({r[f'{name}_wait_us']:.0f})"
        for name in names
        if f"{name}_cpu_us" in r
    )


if __name__ == "__main__":
    main()
