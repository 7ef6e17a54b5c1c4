"""Listing a big directory (issue 35, deliverable 8): 1 k, 20 k and 1 M empty files, through
the API a page at a time and through `paddlecloud ls`, with the time to the first entry, the
time in all, and the peak RSS of the pfs service (counted afresh for each directory) and of
the CLI, whose growth from the smallest directory to the largest is an aim.

Baselines in the same run: the unpaged answer (the whole listing in one JSON document, as
before; not asked of the 1 M directory, which it would hold whole) and `paddlecloud --help`
(what any command costs before it does anything). `PADDLECLOUD_BENCH_LS_SIZES` sets the sizes
(default 1000,20000,1000000). The directories are made in the server's PFS root with
os.open/os.close, in a temporary directory deleted after.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from . import aim
from .platform import CLI, Platform
from .procs import child_pid

# Issue 35's aims for a 20,000-entry directory.
AIM_FIRST_ENTRY = 0.1
AIM_CLI_TOTAL = 0.5
AIM_AT = 20_000
# "Lists in bounded memory on both sides": from the smallest directory to the largest (1 M
# entries, 1,000 times as many) the peak RSS of the pfs service and of the CLI grows by at most
# this. A listing held whole would grow by hundreds of MiB (a few hundred bytes an entry).
AIM_GROWTH_MIB = 32


def make_dir(path: Path, count: int) -> None:
    path.mkdir()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(count):
            os.close(os.open(f"f{i:07d}", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
    finally:
        os.close(fd)


def reset_peak_rss(pid: int) -> None:
    """Start `pid`'s peak RSS (VmHWM) afresh from its current RSS (Linux >= 4.0)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def api(url: str, password: str, path: str, paged: bool) -> tuple[float, float, int]:
    """Seconds to the first entry and in all, and the entries listed."""
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{url}/api/v1/auth/token", json={"username": "admin", "password": password}
        ) as r:
            token = (await r.json())["token"]
        headers = {"Authorization": f"Bearer {token}"}
        params = {"path": path, **({"limit": "1000"} if paged else {})}
        start = time.perf_counter()
        first, count = None, 0
        while True:
            async with session.get(f"{url}/api/v1/pfs/ls", params=params, headers=headers) as r:
                body = await r.json()
            count += len(body["entries"])
            if first is None:
                first = time.perf_counter() - start
            if not body.get("next"):
                return first, time.perf_counter() - start, count
            params.update(limit="10000", after=body["next"])


def cli_ls(env: dict[str, str], path: str) -> tuple[float, float, int, float]:
    """`paddlecloud ls`: seconds to its first entry and in all, lines, and its peak RSS (MiB)."""
    start = time.perf_counter()
    proc = subprocess.Popen([*CLI, "ls", path], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    first, lines = None, 0
    for _line in proc.stdout:
        lines += 1
        if lines == 2:  # the header, then the first entry
            first = time.perf_counter() - start
    _, status, usage = os.wait4(proc.pid, 0)
    total = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, f"ls exited {proc.returncode}"
    return first or total, total, lines - 1, usage.ru_maxrss / 1024


def main() -> None:
    sizes = [int(s) for s in os.environ.get("PADDLECLOUD_BENCH_LS_SIZES", "1000,20000,1000000").split(",")]
    print(f"load average {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(dir=os.environ.get("PADDLECLOUD_BENCH_DIR")) as tmp:
        with Platform(Path(tmp) / "platform", {}).running() as platform:
            assert platform.process is not None
            pfs = child_pid(platform.process.pid, "paddlecloud.pfs", "pfs")
            made_dir = subprocess.run(
                [*CLI, "mkdir", "bench"], env=platform.env, check=True, capture_output=True, text=True
            )
            remote_bench = made_dir.stdout.strip().rstrip("/")  # /pfs/<dc>/home/admin/bench
            home = next(platform.data.rglob("home/admin"))
            help_start = time.perf_counter()
            subprocess.run([*CLI, "--help"], env=platform.env, check=True, stdout=subprocess.DEVNULL)
            startup = time.perf_counter() - help_start
            print(f"  paddlecloud --help (start-up baseline): {startup:.3f} s", flush=True)
            peaks: dict[int, tuple[float, float]] = {}  # size: (pfs, CLI) peak RSS, MiB
            for size in sizes:
                made = time.perf_counter()
                make_dir(home / "bench" / str(size), size)
                print(f"{size} entries (made in {time.perf_counter() - made:.1f} s):", flush=True)
                remote = f"bench/{size}"
                url, password = platform.url, platform.admin_password()
                full = f"{remote_bench}/{size}"
                if size <= 100_000:
                    _, whole, count = asyncio.run(api(url, password, full, paged=False))
                    print(f"  API unpaged (baseline): {whole:.3f} s for {count}", flush=True)
                reset_peak_rss(pfs)  # what the paged listing and `ls` take, not the unpaged answer
                first, total, count = asyncio.run(api(url, password, full, paged=True))
                assert count == size, (count, size)
                print(f"  API paged: first entry {first:.3f} s, all {total:.3f} s", flush=True)
                cli_first, cli_total, lines, rss = cli_ls(platform.env, remote)
                assert lines == size, (lines, size)
                print(
                    f"  paddlecloud ls: first entry {cli_first:.3f} s, all {cli_total:.3f} s "
                    f"({cli_total - startup:+.3f} s over --help), CLI peak RSS {rss:.0f} MiB; "
                    f"pfs peak RSS {peak_rss_mib(pfs):.0f} MiB; load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
                peaks[size] = (peak_rss_mib(pfs), rss)
                if size == AIM_AT:
                    aim(
                        "API first entry, 20 k",
                        f"{first:.3f} s (aim <= {AIM_FIRST_ENTRY} s)",
                        first <= AIM_FIRST_ENTRY,
                    )
                    aim(
                        "paddlecloud ls first entry, 20 k",
                        f"{cli_first:.3f} s (aim <= {AIM_FIRST_ENTRY} s)",
                        cli_first <= AIM_FIRST_ENTRY,
                    )
                    aim(
                        "paddlecloud ls in all, 20 k",
                        f"{cli_total:.3f} s (aim <= {AIM_CLI_TOTAL} s)",
                        cli_total <= AIM_CLI_TOTAL,
                    )
            small, large = min(peaks), max(peaks)
            if large > small:
                grew = [peaks[large][i] - peaks[small][i] for i in (0, 1)]
                aim(
                    f"bounded memory: peak RSS growth from {small:,} to {large:,} entries "
                    f"<= {AIM_GROWTH_MIB} MiB",
                    f"pfs {grew[0]:+.0f} MiB, CLI {grew[1]:+.0f} MiB",
                    max(grew) <= AIM_GROWTH_MIB,
                )


if __name__ == "__main__":
    main()
    sys.exit(0)
