"""Small authenticated GETs through the gateway against the same endpoint hit directly."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from paddlecloud.common import internal_auth
from support import ADMIN_PASSWORD, ServiceProcess, make_config, write_config

from .upstream import PING

DURATION = "8s"
CONNECTIONS = 32
ROUNDS = 2


# Issue 20's load figure: many clients at once through the gateway, against fewer.
LOAD_CONNECTIONS = (50, 200)


def wrk(
    url: str, headers: dict[str, str], connections: int = CONNECTIONS, *, allow_errors: bool = False
) -> dict[str, float]:
    """Requests per second, latency percentiles (ms) and errors from one wrk run."""
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

    return {"rps": rps, "p50": pct("50"), "p99": pct("99"), "errors": errors}


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
            wrk(upstream.url + PING, direct_headers)  # warm-up
            wrk(gateway.url + PING, gateway_headers)
            runs: dict[str, list[dict[str, float]]] = {"direct": [], "gateway": []}
            for _ in range(ROUNDS):  # interleaved, so drift on a shared machine hits both
                runs["direct"].append(wrk(upstream.url + PING, direct_headers))
                runs["gateway"].append(wrk(gateway.url + PING, gateway_headers))
            load = {
                n: wrk(gateway.url + PING, gateway_headers, n, allow_errors=True) for n in LOAD_CONNECTIONS
            }
            # The same load on the service alone: what one aiohttp process does on this machine.
            bare = {
                n: wrk(upstream.url + PING, direct_headers, n, allow_errors=True) for n in LOAD_CONNECTIONS
            }
        finally:
            gateway.stop()
            upstream.stop()
    best = {k: max(v, key=lambda r: r["rps"]) for k, v in runs.items()}
    d, g = best["direct"], best["gateway"]
    print(f"{CONNECTIONS} connections, {DURATION} per run, best of {ROUNDS} interleaved runs")
    print(f"{'':10}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}")
    for name, r in (("direct", d), ("gateway", g)):
        print(f"{name:10}{r['rps']:>10.0f}{r['p50']:>10.2f}{r['p99']:>10.2f}")
    print(
        f"gateway/direct: throughput {g['rps'] / d['rps']:.2f}x, p99 {g['p99'] / d['p99']:.2f}x "
        f"(aim: throughput >= 0.50x)"
    )
    for name, runs_at in (("direct", bare), ("gateway", load)):
        for n in LOAD_CONNECTIONS:
            r = runs_at[n]
            rate, p99, errs = r["rps"], r["p99"], int(r["errors"])
            print(f"{name:8} {n:>4} connections: {rate:>7.0f} req/s, p99 {p99:8.1f} ms, {errs} errors")
    few, many = (load[n] for n in LOAD_CONNECTIONS)
    ratio = many["p99"] / few["p99"]
    met = "met" if many["errors"] == 0 and ratio <= 5 else "not met"
    print(
        f"load through the gateway: {LOAD_CONNECTIONS[1]} connections p99 {many['p99']:.1f} ms, "
        f"{int(many['errors'])} errors; {LOAD_CONNECTIONS[0]} connections p99 {few['p99']:.1f} ms; "
        f"p99 {ratio:.2f}x (aim: 0 errors and p99 <= 5x): {met}"
    )


if __name__ == "__main__":
    main()
