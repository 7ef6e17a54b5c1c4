"""1 GiB up and down through gateway and pfs with the CLI, against this machine's ceilings.

The issue's aims, each against a baseline measured in the same round on the same disk:
- upload: at least 0.8x of a bare aiohttp handler that streams the body to a file and
  fsyncs it, while keeping durability and the whole file's sha256;
- download: at least 0.9x of a direct `FileResponse` to the same client, i.e. the CLI
  downloading (and verifying) the same file from a bare aiohttp app with no gateway and no
  pfs in between.

The other rows say where the rest goes, without changing those ratios: `cp`; the bare
handler fed the same chunks tus uses, each fdatasynced before the next is sent (what
acknowledging only durable offsets costs any server); a bare `FileResponse` read by a plain
aiohttp client that neither hashes nor starts a process (what the CLI itself costs); and the
CLI's start-up, which every CLI row includes.

Each round measures every row once, each step from a synced disk and a source evicted from
the page cache; a ratio pairs the two figures of one round, and the median of the rounds is
printed with their range. `PADDLECLOUD_BENCH_PFS_ROUNDS` sets the rounds (3).

Both download rows read the file the upload stored, in turns which goes first. On this
machine's virtual disk the first read of freshly written bytes runs at a quarter of the speed
of later reads, even from an evicted page cache (the host caches them): `warm` reads the
stored file once beforehand, so that neither row pays for it and both start where the
source-reading rows start.

The CephFS rows (where a Ceph cluster can run here: scripts/ceph-cluster.sh) run a second
server whose PFS root is on a ceph-fuse mount of a throwaway single-node cluster (one OSD on
memstore, so RAM rather than the disk), and pair the CLI's upload there with a bare `cp`
onto the same mount plus its fsync, in the same round: first into a home without a quota
(renamed into place), then, the admin given a storage quota, into a home that is a quota
realm of its own (copied into place: docs/storage.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web

from paddlecloud.common.storage import cephfs
from paddlecloud.transfer import CHUNK_SIZE

from . import aim
from .procs import child_pid, children_cpu_seconds, cpu_seconds

SIZE = 2**30
CHUNK = 1 << 20
# Issue 18's aims, on the median of the rounds' paired ratios.
AIM_UPLOAD = 0.8
AIM_DOWNLOAD = 0.9


def make_source(path: Path) -> str:
    """A file of SIZE random bytes, and its sha256."""
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for _ in range(SIZE // CHUNK):
            piece = os.urandom(CHUNK)
            f.write(piece)
            digest.update(piece)
    return digest.hexdigest()


def warm(path: Path) -> None:
    """Read `path` once from the disk and evict it again: what the host below this machine
    keeps of it is then the same as of a file read before, as the source has been."""
    drop_caches_for(path)
    with open(path, "rb") as f:
        while f.read(CHUNK):
            pass
    drop_caches_for(path)


def drop_caches_for(path: Path) -> None:
    """Evict the file from the page cache so each run reads it from the same starting point."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


async def serve_on_loopback(app: web.Application) -> tuple[web.AppRunner, int]:
    """Start `app` on a free loopback port: its runner (to clean up) and the port."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, runner.addresses[0][1]


async def bare_ceiling(
    source: Path, workdir: Path, settle: Callable[..., None]
) -> tuple[float, float, float]:
    """Seconds to upload to, and download from, bare aiohttp handlers on loopback; and the CPU
    seconds of the upload (client and handler both run in this process)."""
    target = workdir / "bare-upload"

    async def sink(request: web.Request) -> web.Response:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            async for chunk in request.content.iter_any():
                os.write(fd, chunk)
            os.fsync(fd)
        finally:
            os.close(fd)
        return web.Response(status=204)

    async def serve(_request: web.Request) -> web.FileResponse:
        return web.FileResponse(source)

    app = web.Application(client_max_size=0)
    app.router.add_put("/sink", sink)
    app.router.add_get("/file", serve)
    runner, port = await serve_on_loopback(app)
    try:
        async with aiohttp.ClientSession() as session:

            async def body() -> AsyncIterator[bytes]:
                with open(source, "rb") as f:
                    while piece := f.read(CHUNK):
                        yield piece

            drop_caches_for(source)
            start, cpu = time.perf_counter(), time.process_time()
            async with session.put(
                f"http://127.0.0.1:{port}/sink", data=body(), headers={"Content-Length": str(SIZE)}
            ) as resp:
                assert resp.status == 204
            up, up_cpu = time.perf_counter() - start, time.process_time() - cpu
            settle(target)
            drop_caches_for(source)
            start = time.perf_counter()
            out = workdir / "bare-download"
            with open(out, "wb") as f:
                async with session.get(f"http://127.0.0.1:{port}/file") as resp:
                    async for chunk in resp.content.iter_chunked(CHUNK):
                        f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            down = time.perf_counter() - start
    finally:
        await runner.cleanup()
    return up, down, up_cpu


async def chunked_ceiling(source: Path, workdir: Path) -> float:
    """Seconds to send `source` to a bare handler in CHUNK_SIZE requests, each appended and
    fdatasynced before its answer, one after the other (tus's rule: an offset is only
    acknowledged once durable, and the next chunk starts from it)."""
    target = workdir / "bare-chunked"

    async def append(request: web.Request) -> web.Response:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            async for chunk in request.content.iter_any():
                os.write(fd, chunk)
            await asyncio.to_thread(os.fdatasync, fd)
        finally:
            os.close(fd)
        return web.Response(status=204)

    app = web.Application(client_max_size=0)
    app.router.add_patch("/append", append)
    runner, port = await serve_on_loopback(app)
    try:
        async with aiohttp.ClientSession() as session:
            drop_caches_for(source)
            start = time.perf_counter()
            with open(source, "rb") as f:
                # Like the CLI, the next chunk is read while this one is sent.
                ahead = asyncio.ensure_future(asyncio.to_thread(f.read, CHUNK_SIZE))
                while piece := await ahead:
                    ahead = asyncio.ensure_future(asyncio.to_thread(f.read, CHUNK_SIZE))
                    async with session.patch(f"http://127.0.0.1:{port}/append", data=piece) as resp:
                        assert resp.status == 204
            return time.perf_counter() - start
    finally:
        await runner.cleanup()


async def cli_from_file_response(
    cli: list[str], env: dict[str, str], source: Path, sha256: str, workdir: Path
) -> tuple[float, float]:
    """Seconds for the CLI to download `source` from a bare `FileResponse`: the same client,
    doing the same verification, with no gateway and no pfs in between; and the CPU seconds
    of the download, the CLI's and the `FileResponse`'s (this process's).

    The app answers only what `cp` asks: a token, the file's stat (with its sha256) and the file.
    """
    remote = "/pfs/direct/home/bench/source.bin"
    info = source.stat()
    entry = {"path": remote, "name": "source.bin", "type": "file", "size": info.st_size, "mode": "0644"}

    async def token(_request: web.Request) -> web.Response:
        return web.json_response({"token": "direct", "expires_at": None, "user": "bench", "admin": False})

    async def stat(request: web.Request) -> web.Response:
        extra = {"sha256": sha256} if request.query.get("checksum") == "sha256" else {}
        return web.json_response({**entry, **extra})

    async def files(_request: web.Request) -> web.FileResponse:
        return web.FileResponse(source)

    app = web.Application()
    app.router.add_post("/api/v1/auth/token", token)
    app.router.add_get("/api/v1/pfs/stat", stat)
    app.router.add_get("/api/v1/pfs/files", files)
    runner, port = await serve_on_loopback(app)
    config = workdir / "direct.yaml"
    config.touch(mode=0o600)
    config.write_text(
        yaml.safe_dump(
            {
                "datacenters": [
                    {
                        "name": "direct",
                        "username": "bench",
                        "password": "bench",
                        "endpoint": f"http://127.0.0.1:{port}",
                    }
                ],
                "current-datacenter": "direct",
            }
        )
    )
    out = workdir / "direct-download.bin"
    try:
        drop_caches_for(source)
        start, cpu = time.perf_counter(), children_cpu_seconds() + time.process_time()
        process = await asyncio.create_subprocess_exec(
            *cli,
            "cp",
            "-q",
            remote,
            str(out),
            env={**env, "PADDLE_CONFIG": str(config)},
            stdout=subprocess.DEVNULL,
        )
        assert await process.wait() == 0, "the CLI could not download from the bare FileResponse"
        seconds = time.perf_counter() - start
        cpu = children_cpu_seconds() + time.process_time() - cpu
    finally:
        await runner.cleanup()
    assert sha256_of(out) == sha256, "downloaded bytes differ"
    out.unlink()
    return seconds, cpu


@contextlib.contextmanager
def logged_in_server(
    cli: list[str], env: dict[str, str], data_dir: Path, *extra: str
) -> Iterator[subprocess.Popen[str]]:
    """`paddlecloud server` on `data_dir`, its admin logged in, stopped (SIGTERM) after."""
    server = subprocess.Popen(
        [*cli, "server", "--data-dir", str(data_dir), "--port", "0", *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout is not None
        for line in server.stdout:
            if line.startswith("Press Ctrl-C"):
                break
        subprocess.run([*cli, "login"], env=env, check=True, stdout=subprocess.DEVNULL)
        yield server
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)


def timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(CHUNK):
            digest.update(piece)
    return digest.hexdigest()


ROUNDS = int(os.environ.get("PADDLECLOUD_BENCH_PFS_ROUNDS", "3"))


@dataclass(frozen=True)
class TransferCpu:
    """CPU seconds (user and system) that one transfer through the platform cost each process."""

    cli: float
    gateway: float
    pfs: float

    @classmethod
    def now(cls, services: dict[str, int]) -> TransferCpu:
        """Totals so far: this process's reaped children (the CLI) and the services' own."""
        return cls(children_cpu_seconds(), cpu_seconds(services["gateway"]), cpu_seconds(services["pfs"]))

    def __sub__(self, before: TransferCpu) -> TransferCpu:
        return TransferCpu(self.cli - before.cli, self.gateway - before.gateway, self.pfs - before.pfs)

    @classmethod
    def median(cls, rounds: list[TransferCpu]) -> TransferCpu:
        return cls(*(statistics.median(getattr(r, f.name) for r in rounds) for f in fields(cls)))

    def describe(self, what: str, baseline: float, baseline_name: str) -> str:
        total = self.cli + self.gateway + self.pfs
        return (
            f"CPU seconds of one {what} (median of the rounds): CLI {self.cli:.2f}, gateway "
            f"{self.gateway:.2f}, pfs {self.pfs:.2f}: {total:.2f} in all on {os.cpu_count()} CPUs, against "
            f"{baseline:.2f} for {baseline_name}"
        )


def settle(*written: Path) -> None:
    """Remove what the last step wrote and flush everything dirty, so that no step pays for
    another's writeback (the largest source of noise here, before this)."""
    for path in written:
        path.unlink(missing_ok=True)
    os.sync()


@dataclass
class Row:
    name: str
    seconds: list[float] = field(default_factory=list)
    baseline: Row | None = None

    def rate(self) -> float:
        return SIZE / statistics.median(self.seconds) / 1e6

    def ratios(self) -> list[float]:
        """The speed against the baseline's, paired round by round: both were measured within
        a minute of each other, so a slow spell of the shared disk hits both."""
        assert self.baseline is not None
        return [b / s for b, s in zip(self.baseline.seconds, self.seconds, strict=True)]


def main() -> None:
    cli = [sys.executable, "-m", "paddlecloud"]
    chunk = f"{CHUNK_SIZE >> 20} MiB"
    cp = Row("cp + sync")
    up_ceiling = Row("upload: bare aiohttp handler + fsync (ceiling)")
    up = Row("upload: CLI -> gateway -> pfs (tus, crc32 chunks, sha256)", baseline=up_ceiling)
    chunked = Row(f"  bare handler, {chunk} requests each fdatasynced", baseline=up_ceiling)
    direct = Row("download: CLI <- bare FileResponse (ceiling, verified)")
    down = Row("download: CLI <- gateway <- pfs (verified)", baseline=direct)
    down_ceiling = Row("  plain aiohttp client <- bare FileResponse")
    against_plain = Row("  CLI <- gateway <- pfs, against the plain client", down.seconds, down_ceiling)
    upload_cpu: list[TransferCpu] = []
    download_cpu: list[TransferCpu] = []
    bare_upload_cpu: list[float] = []  # the bare handler and its client (this process)
    direct_download_cpu: list[float] = []  # the CLI and the bare FileResponse
    with tempfile.TemporaryDirectory(dir=os.environ.get("PADDLECLOUD_BENCH_DIR")) as tmp:
        work = Path(tmp)
        source = work / "source.bin"
        expected = make_source(source)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLECLOUD_", "PADDLE_"))}
        env["HOME"] = str(work / "home")
        startup = timed([*cli, "--help"], env)

        with logged_in_server(cli, env, work / "data") as server:
            services = {
                name: child_pid(server.pid, f"paddlecloud.{name}", name) for name in ("gateway", "pfs")
            }
            # Each round measures every row once, in the same order, each step starting from
            # a flushed disk and a source evicted from the page cache.
            for round_ in range(ROUNDS):
                copy = work / "cp-copy"
                settle()
                drop_caches_for(source)
                cp.seconds.append(timed(["sh", "-c", f"cp {source} {copy} && sync {copy}"], env))
                settle(copy)
                up_seconds, down_seconds, bare_cpu = asyncio.run(bare_ceiling(source, work, settle))
                bare_upload_cpu.append(bare_cpu)
                up_ceiling.seconds.append(up_seconds)
                down_ceiling.seconds.append(down_seconds)
                settle(work / "bare-download")
                chunked.seconds.append(asyncio.run(chunked_ceiling(source, work)))
                settle(work / "bare-chunked")

                remote = f"/pfs/datacenter1/home/admin/bench-{round_}.bin"
                drop_caches_for(source)
                before = TransferCpu.now(services)
                up.seconds.append(timed([*cli, "cp", "-q", str(source), remote], env))
                upload_cpu.append(TransferCpu.now(services) - before)
                stored = work / "data" / "pfs" / "home" / "admin" / f"bench-{round_}.bin"
                assert sha256_of(stored) == expected, "uploaded bytes differ"
                settle()
                warm(stored)

                # In turns, so that neither download row always goes first.
                for step in ("direct", "pfs") if round_ % 2 == 0 else ("pfs", "direct"):
                    if step == "direct":
                        seconds, direct_cpu = asyncio.run(
                            cli_from_file_response(cli, env, stored, expected, work)
                        )
                        direct.seconds.append(seconds)
                        direct_download_cpu.append(direct_cpu)
                        settle()
                        continue
                    drop_caches_for(stored)
                    downloaded = work / "downloaded.bin"
                    before = TransferCpu.now(services)
                    down.seconds.append(timed([*cli, "cp", "-q", remote, str(downloaded)], env))
                    download_cpu.append(TransferCpu.now(services) - before)
                    assert sha256_of(downloaded) == expected, "downloaded bytes differ"
                    settle(downloaded)
                subprocess.run([*cli, "rm", remote], env=env, check=True, stdout=subprocess.DEVNULL)
                settle()

    print(
        f"1 GiB of random bytes, {ROUNDS} rounds (PADDLECLOUD_BENCH_PFS_ROUNDS), each step from a "
        f"synced disk and an evicted source; {shutil.which('cp')}"
    )
    print("both download rows read the uploaded file, after one read of it (see `warm`), in turns")
    print("MB/s is the median; ratio is the median of the rounds' paired ratios, then their range")
    width = 62
    print(f"{'':{width}}{'MB/s':>8}{'ratio':>9}  range")
    for row in (cp, up_ceiling, up, chunked, direct, down, down_ceiling, against_plain):
        line = f"{row.name:{width}}{row.rate():>8.0f}"
        if row.baseline is not None:
            ratios = row.ratios()
            line += f"{statistics.median(ratios):>8.2f}x  {min(ratios):.2f}-{max(ratios):.2f}"
        print(line)
    print(f"CLI start-up (paddlecloud --help), part of every CLI row: {startup:.2f} s")
    for what, rounds, baseline, name in (
        ("upload", upload_cpu, bare_upload_cpu, "the bare handler and its client"),
        ("download", download_cpu, direct_download_cpu, "the CLI from the bare FileResponse"),
    ):
        print(TransferCpu.median(rounds).describe(what, statistics.median(baseline), name))
    for row, goal in ((up, AIM_UPLOAD), (down, AIM_DOWNLOAD)):
        ratio = statistics.median(row.ratios())
        what = f"{row.name.split(':')[0]} >= {goal:.2f}x of its baseline"
        aim(what, f"{ratio:.2f}x", ratio >= goal, indent="")
    cephfs_rows(cli, width)


def cephfs_rows(cli: list[str], width: int) -> None:
    """The CephFS rows: 1 GiB with the CLI onto a PFS root on ceph-fuse, against `cp` onto the mount."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "ceph-cluster.sh"
    cluster = Path(tempfile.mkdtemp(prefix="pc-ceph-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLECLOUD_", "PADDLE_"))}
    # Deleted objects are purged in the background: room for a few rounds' GiBs at once.
    started = subprocess.run(
        [str(script), "up", str(cluster)],
        env={**env, "CEPH_MEMSTORE_BYTES": str(8 * SIZE)},
        capture_output=True,
        text=True,
    )
    if started.returncode != 0:
        print(f"CephFS rows skipped: the cluster did not start: {started.stderr.strip()[-300:]}")
        subprocess.run([str(script), "down", str(cluster)], check=False)
        return
    mount = cluster / "mnt"
    cp = Row("cp + fsync onto ceph-fuse (memstore OSD)")
    up = Row("upload: CLI -> gateway -> pfs, root on ceph-fuse", baseline=cp)
    cp_again = Row("  cp + fsync, in the rounds below")
    realm = Row("  upload into a home with a Ceph quota (copied)", baseline=cp_again)
    try:
        with tempfile.TemporaryDirectory(dir=os.environ.get("PADDLECLOUD_BENCH_DIR")) as tmp:
            work = Path(tmp)
            source = work / "source.bin"
            expected = make_source(source)
            env["HOME"] = str(work / "home")
            settings = work / "server.yaml"
            settings.write_text(yaml.safe_dump({"pfs": {"root": str(mount / "pfs")}}))
            with logged_in_server(cli, env, work / "data", "--server-config", str(settings)):
                for baseline, row in ((cp, up), (cp_again, realm)):
                    if row is realm:
                        quota = [*cli, "users", "quota", "admin", "-storage", "100Gi"]
                        subprocess.run(quota, env=env, check=True, stdout=subprocess.DEVNULL)
                    for round_ in range(ROUNDS):
                        copy = mount / f"cp-copy-{round_}"
                        settle()
                        drop_caches_for(source)
                        baseline.seconds.append(
                            timed(["sh", "-c", f"cp {source} {copy} && sync {copy}"], env)
                        )
                        copy.unlink()
                        remote = f"/pfs/datacenter1/home/admin/bench-{round_}.bin"
                        settle()
                        drop_caches_for(source)
                        row.seconds.append(timed([*cli, "cp", "-q", str(source), remote], env))
                        stored = mount / "pfs" / "home" / "admin" / f"bench-{round_}.bin"
                        assert sha256_of(stored) == expected, "uploaded bytes differ"
                        subprocess.run([*cli, "rm", remote], env=env, check=True, stdout=subprocess.DEVNULL)
                home = os.open(mount / "pfs" / "home" / "admin", os.O_RDONLY | os.O_DIRECTORY)
                try:
                    assert cephfs.quota_of(home) == 100 * SIZE, "the quota row ran without a Ceph quota"
                finally:
                    os.close(home)
    finally:
        subprocess.run([str(script), "down", str(cluster)], check=False)
    print(f"CephFS: single-node cluster, ceph-fuse, {ROUNDS} rounds; the source on the local disk")
    for row in (cp, up, cp_again, realm):
        line = f"{row.name:{width}}{row.rate():>8.0f}"
        if row.baseline is not None:
            ratios = row.ratios()
            line += f"{statistics.median(ratios):>8.2f}x  {min(ratios):.2f}-{max(ratios):.2f}"
        print(line)


if __name__ == "__main__":
    main()
