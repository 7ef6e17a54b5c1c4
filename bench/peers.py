"""PaddleCloud against its peers on this machine: Ray Jobs 2.60 and tusd v2.9.1 (issue 35 item 1).

`make bench-peers` installs the peers outside the repository (scripts/peers.sh) and runs this:
`paddlecloud server`, a Ray head (`ray start --head`, its job submission server) and tusd, all
on this machine at once, measured in interleaved rounds; each figure is printed as medians
with their range, and as the ratio PaddleCloud/peer of the medians.

- Ray: submit → the program's first statement; 20 clients x 3 jobs (the 60 submit calls,
  jobs/s, the machine's CPU per job); submitting a 50 MiB directory, first and unchanged;
  a 100,000-line log burst reaching a follower and one line's latency for a slow writer.
  Ray's side is its own SDK (`JobSubmissionClient`) in its own venv (bench/ray_peer.py);
  PaddleCloud's is its SDK (`AsyncClient.submit_package`) for the directory, and the REST API
  through the gateway as bench/jobs uses it for the rest. Both sides run the same programs
  (bench/jobs's `up.py` and `ticks.py`) with the same `python`.
- tusd: 1 GiB up and down with one tus client, the bench's own (`TusClient` below, aiohttp),
  pointed at tusd's `/files/` and at the gateway's `/api/v1/pfs/uploads` with a token, both
  stores on the same disk. The platform's transfer engine cannot be that client: it speaks
  PFS beyond tus (stat before, sha256 compare after, downloads from `pfs/files`), which tusd
  does not serve. The client sends the same 16 MiB chunks (the CLI's), each with its sha256
  in `Upload-Checksum`, and writes downloads to a file it fsyncs.

Rounds: `PADDLECLOUD_BENCH_PEERS_ROUNDS` (3), and `PADDLECLOUD_BENCH_PEERS_TUS_ROUNDS` for the
1 GiB transfers (2). Without the peers built it says so in one line and exits 1.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from paddlecloud.client import AsyncClient
from paddlecloud.transfer import CHUNK_SIZE

from . import aim
from .jobs import (
    CLIENTS,
    DATACENTER,
    JOBS_PER_CLIENT,
    PASSWORD,
    UP,
    Api,
    Platform,
    check_nothing_left,
    create_users,
    follow_burst,
    follow_latency,
    kill_active,
    logins,
    processes_under,
    submit_throughput,
    submit_to_running,
    supervisors_gone,
)
from .pfs import drop_caches_for, make_source
from .procs import machine_cpu_seconds

ROUNDS = int(os.environ.get("PADDLECLOUD_BENCH_PEERS_ROUNDS", "3"))
TUS_ROUNDS = int(os.environ.get("PADDLECLOUD_BENCH_PEERS_TUS_ROUNDS", "2"))
STARTS = 2  # submit → first statement samples per side in each round
RESUBMITS = 3  # unchanged resubmits per side in each round, after its first submit
PACKAGE_MIB = 50
BURST_LINES = 100_000
SLOW_RATE, SLOW_LINES = 20, 40  # the slow writer: 20 lines a second for 2 s
# Issue 35's aims, PaddleCloud against the peer, on the medians of this run.
AIM_SUBMIT_CALLS = 1.0  # the 60 submit calls' seconds, at most Ray's
AIM_RESUBMIT = 1.0  # an unchanged directory's submit call, at most Ray's
AIM_BURST = 1.0  # burst lines/s, at least Ray's
AIM_TUS = 1.0  # upload and download, at least tusd's
WIDTH = 56

CACHE = Path(os.environ.get("PADDLECLOUD_CACHE", Path.home() / ".cache" / "paddlecloud"))
PEERS_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "peers.sh"
RAY_PEER = Path(__file__).resolve().parent / "ray_peer.py"


def pinned(name: str) -> str:
    """A version scripts/peers.sh pins (`RAY_VERSION=...`): one place says it."""
    found = re.search(rf"^{name}=(\S+)$", PEERS_SCRIPT.read_text(), re.MULTILINE)
    assert found, f"{PEERS_SCRIPT} pins no {name}"
    return found[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load() -> str:
    return "load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


# --- figures ------------------------------------------------------------------------------------


def spread(values: list[float], scale: float = 1.0, fmt: str = ".3f") -> str:
    """`median (min-max)` of the values times `scale`."""
    med = statistics.median(values) * scale
    return f"{med:{fmt}} ({min(values) * scale:{fmt}}-{max(values) * scale:{fmt}})"


def compare(
    what: str, ours: list[float], peer: list[float], unit: str, scale: float = 1.0, fmt: str = ".3f"
) -> float:
    """One row: both sides' medians with their ranges and the ratio of the medians (ours/peer)."""
    ratio = statistics.median(ours) / statistics.median(peer)
    print(
        f"  {what:{WIDTH}} {spread(ours, scale, fmt):>24} {spread(peer, scale, fmt):>24}"
        f" {unit:6} {ratio:7.3f}",
        flush=True,
    )
    return ratio


def table(title: str, peer: str) -> None:
    print(f"{title} ({load()})")
    print(f"  {'':{WIDTH}} {'PaddleCloud':>24} {peer:>24} {'':6} {'ratio':>7}")


# --- Ray ----------------------------------------------------------------------------------------


class Ray:
    """A Ray head on free ports with its session under `root`, and the SDK driver talking to it."""

    def __init__(self, python: Path, root: Path) -> None:
        self.python = python
        self.root = root
        self.head: subprocess.Popen[bytes] | None = None
        self.driver: subprocess.Popen[str] | None = None
        self.address = ""
        self.env: dict[str, str] = {}

    def start(self) -> None:
        """The head, then the driver; the head is tried three times: on a loaded machine its
        dashboard agent can take longer to start than the raylet waits for it (30 s), and
        the raylet then exits ("Timed out waiting for file .../metrics_agent_port_...")."""
        for attempt in range(3):
            try:
                self._start_head()
                break
            except RuntimeError:
                self.stop()
                if attempt == 2:
                    raise
                print(f"  (the Ray head did not start, {load()}: trying again)", flush=True)
        self._start_driver()

    def _start_head(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "up.py").write_text(UP)  # for the first job, which says the server is up
        port = free_port()
        self.address = f"http://127.0.0.1:{port}"
        # The jobs' `python` is the Ray venv's (3.11, as the platform's): its bin first on PATH.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env["PATH"] = f"{self.python.parent}{os.pathsep}{os.environ['PATH']}"
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        self.env = env
        argv = [
            # Its start at a higher priority (nice -10), put back to the default once it is up
            # (below): the raylet waits ~16 s for its dashboard agent to write its ports into
            # files, whatever ports it is given, and exits when it does not ("Timed out waiting
            # for file .../dashboard_agent_listen_port_..."). On this shared machine at a load
            # average of 27 the agent took 22-28 s, even at nice -10: see performance-history.
            "nice",
            "-n",
            "-10",
            str(self.python.parent / "ray"),
            "start",
            "--head",
            "--block",
            f"--port={free_port()}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={port}",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            f"--temp-dir={self.root}",
            "--num-cpus=2",
            "--object-store-memory=200000000",
            "--disable-usage-stats",
        ]
        with open(self.root / "head.log", "ab") as out:
            # A session of its own, so that stop() ends this head's processes and no other Ray's;
            # its working directory is `root`, which every worker inherits (see stop()).
            self.head = subprocess.Popen(
                argv, cwd=self.root, env=env, stdout=out, stderr=out, start_new_session=True
            )
        # `ray start` says this once its node registered (the raylet up, its agents with it).
        log = self.root / "head.log"
        deadline = time.monotonic() + 180
        while "Ray runtime started" not in log.read_text(errors="replace"):
            if self.head.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Ray head did not start: see {log}")
            time.sleep(0.5)
        # Every thread of its processes back to the default priority: measured as the platform is.
        for pid, _ in processes_under(self.root):
            for task in Path(f"/proc/{pid}/task").glob("*"):
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, int(task.name), 0)

    def _start_driver(self) -> None:
        self.driver = subprocess.Popen(
            # -I: not bench/ first on sys.path, whose platform.py would hide the standard one.
            [str(self.python), "-I", str(RAY_PEER), self.address],
            cwd=self.root,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        # The job agent comes up after the dashboard: the first job says when jobs can start.
        last = None
        for _ in range(60):
            try:
                self.ask("first_statement", script=str(self.root / "up.py"))
                return
            except RuntimeError as error:
                if self.driver.poll() is not None:
                    raise
                last = error
                time.sleep(1)
        raise RuntimeError(f"Ray's job server took no job in a minute: {last}")

    def ask(self, op: str, **request: Any) -> dict[str, Any]:
        assert self.driver is not None and self.driver.stdin and self.driver.stdout
        self.driver.stdin.write(json.dumps({"op": op, **request}) + "\n")
        self.driver.stdin.flush()
        line = self.driver.stdout.readline()
        if not line:
            raise RuntimeError(f"bench/ray_peer.py ended during {op} (its error is above)")
        answer = dict(json.loads(line))
        if "error" in answer:
            raise RuntimeError(f"Ray: {answer['error']}")
        return answer

    def stop(self) -> None:
        if self.driver is not None and self.driver.poll() is None:
            assert self.driver.stdin is not None and self.driver.stdout is not None
            self.driver.stdin.close()
            self.driver.wait(timeout=30)
            self.driver.stdout.close()
        if self.head is not None and self.head.poll() is None:
            os.killpg(self.head.pid, signal.SIGTERM)  # `ray start --block` stops its processes
            try:
                self.head.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.head.pid, signal.SIGKILL)
                self.head.wait()
        # Workers rename themselves (`ray::IDLE`) and may leave the session: what still runs
        # in or on `root` is this head's, and is ended.
        time.sleep(1)
        for pid, _ in processes_under(self.root):
            os.kill(pid, signal.SIGKILL)

    @contextmanager
    def running(self) -> Iterator[Ray]:
        try:
            self.start()
            yield self
        finally:
            self.stop()


# --- tus ----------------------------------------------------------------------------------------


class TusClient:
    """The one tus 1.0 client both servers are measured with: creation, then PATCHes of
    CHUNK_SIZE each with `Upload-Checksum: sha256`, each sent once the last was acknowledged;
    a download streamed into a file that is fsynced before it counts as done."""

    def __init__(self, session: aiohttp.ClientSession, headers: dict[str, str]) -> None:
        self.session = session
        self.headers = {**headers, "Tus-Resumable": "1.0.0"}

    async def upload(self, creation_url: str, source: Path, metadata: dict[str, str]) -> str:
        """The upload's URL, once every byte of `source` was acknowledged."""
        size = source.stat().st_size
        encoded = ",".join(f"{k} {base64.b64encode(v.encode()).decode()}" for k, v in metadata.items())
        headers = {**self.headers, "Upload-Length": str(size), "Upload-Metadata": encoded}
        async with self.session.post(creation_url, headers=headers) as resp:
            if resp.status != 201:
                raise RuntimeError(f"tus POST {creation_url}: {resp.status} {await resp.text()}")
            url = str(resp.url.join(URL(resp.headers["Location"])))
        with open(source, "rb") as f:
            offset = 0
            while offset < size:
                chunk, digest = await asyncio.to_thread(self._read, f)
                headers = {
                    **self.headers,
                    "Content-Type": "application/offset+octet-stream",
                    "Upload-Offset": str(offset),
                    "Upload-Checksum": f"sha256 {digest}",
                }
                async with self.session.patch(url, data=chunk, headers=headers) as resp:
                    if resp.status != 204:
                        raise RuntimeError(f"tus PATCH {url}: {resp.status} {await resp.text()}")
                    offset = int(resp.headers["Upload-Offset"])
        return url

    @staticmethod
    def _read(f: Any) -> tuple[bytes, str]:
        chunk = f.read(CHUNK_SIZE)
        return chunk, base64.b64encode(hashlib.sha256(chunk).digest()).decode()

    async def download(self, url: str, target: Path) -> int:
        """Bytes written to `target` from a GET of `url`, fsynced."""
        written = 0
        async with self.session.get(url, headers=self.headers) as resp:
            if resp.status != 200:
                raise RuntimeError(f"GET {url}: {resp.status} {await resp.text()}")
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                async for piece in resp.content.iter_chunked(1 << 20):
                    written += os.write(fd, piece)
                await asyncio.to_thread(os.fsync, fd)
            finally:
                os.close(fd)
        return written


@contextmanager
def tusd_running(binary: Path, root: Path) -> Iterator[str]:
    """tusd serving `root/uploads` on a free loopback port: its creation URL."""
    port = free_port()
    (root / "uploads").mkdir(parents=True, exist_ok=True)
    with open(root / "tusd.log", "ab") as log:
        proc = subprocess.Popen(
            [str(binary), "-host", "127.0.0.1", "-port", str(port), "-upload-dir", str(root / "uploads")],
            stdout=log,
            stderr=log,
        )
    url = f"http://127.0.0.1:{port}/files/"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                request = urllib.request.Request(url, method="OPTIONS")
                with urllib.request.urlopen(request, timeout=2):  # noqa: S310
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"tusd did not start: see {root / 'tusd.log'}") from None
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# --- the rounds ---------------------------------------------------------------------------------


def write_package(directory: Path, seed: int) -> None:
    """A job package of PACKAGE_MIB MiB: the program and 1 MiB files of random data (new ones
    for each `seed`, so each round's first submit is a first on both sides)."""
    directory.mkdir(parents=True)
    (directory / "up.py").write_text(UP)
    for i in range(PACKAGE_MIB):
        (directory / f"data-{seed}-{i:03}.bin").write_bytes(os.urandom(1 << 20))


async def wait_ended(client: AsyncClient, name: str) -> None:
    deadline = time.monotonic() + 120
    while (await client.job(name)).state in ("PENDING", "BUILDING", "RUNNING"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {name} still runs after 120 s")
        await asyncio.sleep(0.1)


class Bench:
    """Both sides' figures, gathered round by round."""

    def __init__(self, platform: Platform, ray: Ray) -> None:
        self.platform = platform
        self.ray = ray
        self.users = [f"peer-{c}" for c in range(CLIENTS)]
        self.host_package = platform.home(self.users[0]) / "bench"
        self.counter = 0

    def name(self, what: str) -> str:
        self.counter += 1
        return f"{what}-{self.counter}"

    async def run(self) -> None:
        platform = self.platform
        await create_users(platform.url, platform.admin_password(), self.users)
        packages = [platform.write_package(user) for user in self.users]
        up, ticks = str(self.host_package / "up.py"), str(self.host_package / "ticks.py")
        async with AsyncExitStack() as stack:
            apis = await logins(platform.url, self.users, stack)
            client = await stack.enter_async_context(
                AsyncClient(platform.url, self.users[0], PASSWORD, datacenter=DATACENTER)
            )
            try:
                await self.starts(apis[0], packages[0], up)
                await self.throughput(apis, packages, up)
                await self.directory(client)
                await self.logs(apis[0], packages[0], ticks)
            finally:
                left = sum(await asyncio.gather(*(kill_active(api) for api in apis)))
                if left:
                    print(f"  ({left} jobs were still active at the end and were killed)")

    async def starts(self, api: Api, package: str, up: str) -> None:
        ours: list[float] = []
        peer: list[float] = []
        for _ in range(ROUNDS * STARTS):
            ours.append((await submit_to_running(api, package, self.name("start"))).program)
            peer.append((await asyncio.to_thread(self.ray.ask, "first_statement", script=up))["program"])
        table(f"submit → the program's first statement, {len(ours)} interleaved samples each", "Ray Jobs")
        compare("seconds (median, range)", ours, peer, "s")

    async def throughput(self, apis: list[Api], packages: list[str], up: str) -> None:
        total = CLIENTS * JOBS_PER_CLIENT
        calls: dict[str, list[float]] = {"ours": [], "peer": []}
        rate: dict[str, list[float]] = {"ours": [], "peer": []}
        cpu: dict[str, list[float]] = {"ours": [], "peer": []}
        p95: dict[str, list[float]] = {"ours": [], "peer": []}
        for r in range(ROUNDS):
            await supervisors_gone(self.platform)
            before = machine_cpu_seconds()
            latencies, submitted, finished = await submit_throughput(apis, packages, prefix=f"tp{r}")
            await supervisors_gone(self.platform)
            cpu["ours"].append((machine_cpu_seconds() - before) / total)
            calls["ours"].append(submitted)
            rate["ours"].append(total / finished)
            p95["ours"].append(statistics.quantiles(latencies, n=20)[-1])
            before = machine_cpu_seconds()
            answer = await asyncio.to_thread(
                self.ray.ask, "throughput", script=up, clients=CLIENTS, jobs=JOBS_PER_CLIENT
            )
            cpu["peer"].append((machine_cpu_seconds() - before) / total)
            if answer["succeeded"] != total:
                raise RuntimeError(f"only {answer['succeeded']} of Ray's {total} jobs succeeded")
            calls["peer"].append(answer["submitted"])
            rate["peer"].append(total / answer["finished"])
            p95["peer"].append(statistics.quantiles(answer["latencies"], n=20)[-1])
        table(
            f"{CLIENTS} clients x {JOBS_PER_CLIENT} jobs (`python up.py 0`), {ROUNDS} interleaved rounds",
            "Ray Jobs",
        )
        ratio = compare(f"the {total} submit calls, first to last", calls["ours"], calls["peer"], "s")
        compare("one submit call under that load, p95", p95["ours"], p95["peer"], "ms", 1e3, ".0f")
        compare("jobs submitted and ended per second", rate["ours"], rate["peer"], "jobs/s", 1, ".1f")
        compare("CPU per job, the machine's (/proc/stat)", cpu["ours"], cpu["peer"], "ms", 1e3, ".0f")
        aim(
            f"the {total} submit calls <= {AIM_SUBMIT_CALLS:g}x Ray's",
            f"{ratio:.2f}x",
            ratio <= AIM_SUBMIT_CALLS,
        )

    async def directory(self, client: AsyncClient) -> None:
        first: dict[str, list[float]] = {"ours": [], "peer": []}
        again: dict[str, list[float]] = {"ours": [], "peer": []}
        spec = {"entry": "python up.py 0", "trainers": 1, "pservers": 0}
        with tempfile.TemporaryDirectory(dir=self.platform.root) as tmp:
            for r in range(ROUNDS):
                directory = Path(tmp) / f"package-{r}"
                write_package(directory, r)
                for i in range(1 + RESUBMITS):
                    name = self.name("dir")
                    t = time.perf_counter()
                    await client.submit_package({**spec, "name": name}, directory)
                    (again if i else first)["ours"].append(time.perf_counter() - t)
                    await wait_ended(client, name)
                    answer = await asyncio.to_thread(
                        self.ray.ask, "submit_directory", directory=str(directory)
                    )
                    if answer["status"] != "SUCCEEDED":
                        raise RuntimeError(f"Ray's job from {directory} ended {answer['status']}")
                    (again if i else first)["peer"].append(answer["seconds"])
        table(
            f"submitting a {PACKAGE_MIB} MiB directory (the SDK's submit call: PaddleCloud's submit_package, "
            f"Ray's submit_job with a working_dir), {ROUNDS} rounds of a first and {RESUBMITS} unchanged",
            "Ray Jobs",
        )
        compare("first submit of the directory", first["ours"], first["peer"], "s")
        ratio = compare("the same directory again, unchanged", again["ours"], again["peer"], "s")
        aim(
            f"an unchanged directory's submit <= {AIM_RESUBMIT:g}x Ray's",
            f"{ratio:.2f}x",
            ratio <= AIM_RESUBMIT,
        )

    async def logs(self, api: Api, package: str, ticks: str) -> None:
        burst: dict[str, list[float]] = {"ours": [], "peer": []}
        latency: dict[str, list[float]] = {"ours": [], "peer": []}
        for _ in range(ROUNDS):
            burst["ours"].append(await follow_burst(api, package, self.name("burst"), BURST_LINES))
            answer = await asyncio.to_thread(self.ray.ask, "follow", script=ticks, rate=0, count=BURST_LINES)
            burst["peer"].append(answer["rate"])
            latency["ours"] += await follow_latency(api, package, self.name("slow"), SLOW_RATE, SLOW_LINES)
            answer = await asyncio.to_thread(
                self.ray.ask, "follow", script=ticks, rate=SLOW_RATE, count=SLOW_LINES
            )
            latency["peer"] += answer["latencies"]
        table(
            f"logs: a burst of {BURST_LINES:,} lines reaching one follower, and a writer of "
            f"{SLOW_RATE} lines/s "
            f"(PaddleCloud `logs -f`'s NDJSON stream, Ray's tail_job_logs), {ROUNDS} interleaved rounds",
            "Ray Jobs",
        )
        ratio = compare("burst: lines per second", burst["ours"], burst["peer"], "/s", 1, ",.0f")
        compare(
            "slow writer: a line written → received (every line)",
            latency["ours"],
            latency["peer"],
            "ms",
            1e3,
            ".1f",
        )
        aim(f"burst lines/s >= {AIM_BURST:g}x Ray's", f"{ratio:.2f}x", ratio >= AIM_BURST)


async def transfers(platform: Platform, tusd_url: str, workdir: Path) -> None:
    """1 GiB up and down with one TusClient: the gateway → pfs, and tusd; interleaved, taking turns
    at going first, each step from a synced disk and the file evicted from the page cache."""
    source = workdir / "source"
    await asyncio.to_thread(make_source, source)
    size = source.stat().st_size
    rates: dict[str, dict[str, list[float]]] = {
        "up": {"ours": [], "peer": []},
        "down": {"ours": [], "peer": []},
    }
    timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
    async with (
        Api.login(platform.url, "peer-0", PASSWORD) as api,
        aiohttp.ClientSession(timeout=timeout) as session,
    ):
        clients = {"ours": TusClient(session, api.headers), "peer": TusClient(session, {})}
        creation = {"ours": f"{platform.url}/api/v1/pfs/uploads", "peer": tusd_url}
        for r in range(TUS_ROUNDS):
            order = ["ours", "peer"] if r % 2 == 0 else ["peer", "ours"]
            destination = f"/pfs/{DATACENTER}/home/peer-0/big-{r}"
            stored = {"ours": platform.home("peer-0") / f"big-{r}"}
            download = {"ours": f"{platform.url}/api/v1/pfs/files?path={destination}"}
            for side in order:
                await asyncio.to_thread(settle, source)
                t = time.perf_counter()
                url = await clients[side].upload(
                    creation[side], source, {"path": destination, "filename": "big"}
                )
                rates["up"][side].append(size / (time.perf_counter() - t))
                download.setdefault(side, url)
                stored.setdefault(side, workdir / "tusd" / "uploads" / url.rstrip("/").rsplit("/", 1)[1])
            for side in order:
                target = workdir / f"down-{side}"
                await asyncio.to_thread(settle, stored[side])
                t = time.perf_counter()
                got = await clients[side].download(download[side], target)
                rates["down"][side].append(size / (time.perf_counter() - t))
                target.unlink()
                if got != size:
                    raise RuntimeError(f"{side}: downloaded {got} bytes of {size}")
            stored["ours"].unlink()
            for left in (workdir / "tusd" / "uploads").iterdir():
                left.unlink()
    mib = 1 / 2**20
    table(
        f"1 GiB with one tus client (the bench's, aiohttp; 16 MiB chunks with sha256), the same disk, "
        f"{TUS_ROUNDS} interleaved rounds",
        "tusd",
    )
    up = compare(
        "upload (PaddleCloud: gateway → pfs, with a token)",
        rates["up"]["ours"],
        rates["up"]["peer"],
        "MiB/s",
        mib,
        ".0f",
    )
    down = compare(
        "download into a file, fsynced", rates["down"]["ours"], rates["down"]["peer"], "MiB/s", mib, ".0f"
    )
    aim(f"upload >= {AIM_TUS:g}x tusd", f"{up:.2f}x", up >= AIM_TUS)
    aim(f"download >= {AIM_TUS:g}x tusd", f"{down:.2f}x", down >= AIM_TUS)


def settle(*paths: Path) -> None:
    """Written bytes on the disk and `paths` out of the page cache: each step starts alike."""
    os.sync()
    for path in paths:
        drop_caches_for(path)


def peers() -> tuple[Path, Path] | None:
    ray = CACHE / f"peer-ray-{pinned('RAY_VERSION')}"
    tusd = CACHE / f"peer-tusd-{pinned('TUSD_VERSION')}" / "bin" / "tusd"
    if not (ray / ".installed").exists() or not tusd.exists():
        return None
    return ray / "bin" / "python", tusd


def main() -> None:
    found = peers()
    if found is None:
        print(
            "bench/peers: Ray Jobs and tusd are not installed "
            "(`make bench-peers` or scripts/peers.sh installs them)"
        )
        sys.exit(1)
    ray_python, tusd = found
    print(
        f"{os.cpu_count()} CPUs, {load()}; Ray {pinned('RAY_VERSION')}, tusd {pinned('TUSD_VERSION')}",
        flush=True,
    )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=os.environ.get("PADDLECLOUD_BENCH_DIR")) as tmp:
        root = Path(tmp)
        platform = Platform(root / "platform", {})
        # The SDK keeps its state (resume records, caches) under HOME: the bench's, not the user's.
        os.environ["HOME"] = str(root / "platform" / "home")
        # Ray's sockets live under its temp dir, whose path must stay short (107 bytes).
        ray_root = Path(tempfile.mkdtemp(prefix="bench-ray-", dir="/tmp"))
        try:
            with platform.running():
                # Ray is stopped before the transfers, so that its idle processes take no CPU from them.
                with Ray(ray_python, ray_root).running() as ray:
                    asyncio.run(Bench(platform, ray).run())
                with tusd_running(tusd, root / "tusd") as tusd_url:
                    asyncio.run(transfers(platform, tusd_url, root))
        finally:
            check_nothing_left(platform)
            subprocess.run(["rm", "-rf", str(ray_root)], check=False)
    print(f"({time.perf_counter() - started:.0f} s in all; {load()})")
