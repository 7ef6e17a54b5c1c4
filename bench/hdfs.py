"""1 GiB up and down an HDFS datacenter with `paddlecloud cp`, against a plain WebHDFS client.

Hadoop's own minicluster (scripts/hdfs.sh, started as tests/hdfs_cluster.py starts it:
one NameNode and one DataNode in one JVM, WebHDFS on) holds the datacenter root; a
`paddlecloud server` with `pfs.hdfs` pointed at it serves that root, acting `doas` each
user. In each round, on the same file and the same cluster:

- upload: the CLI (-> gateway -> pfs -> WebHDFS: tus chunks appended to a staged file,
  renamed into place) against a plain aiohttp client streaming the file to WebHDFS
  `CREATE` (the NameNode's 307, then one PUT to the DataNode);
- download: the CLI (<- gateway <- pfs <- WebHDFS `OPEN`, verified by its sha256) against
  the plain client reading `OPEN` (the 307 followed) into a local file and fsyncing it.

A ratio pairs the two figures of one round (the plain client's seconds over the CLI's),
and the median of the rounds is printed with their range. The size is `--size` (a
quantity such as 256Mi; 1Gi by default), the rounds `PADDLECLOUD_BENCH_HDFS_ROUNDS` (3).
Nothing is built here: without the minicluster (`make hdfs`) the bench says so in one
line and exits 1.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import yaml

from paddlecloud.common.quantity import QuantityError, parse_bytes

from .pfs import drop_caches_for, logged_in_server, settle, sha256_of, timed

DEFAULT_SIZE = "1Gi"
ROUNDS = int(os.environ.get("PADDLECLOUD_BENCH_HDFS_ROUNDS", "3"))
CHUNK = 1 << 20
DC = "datacenter1"
USER = "admin"  # the server's administrator, logged in by `logged_in_server`


class NotBuilt(Exception):
    """What is missing for the bench to run, in one line."""


def cache_root() -> Path:
    """Where scripts/hdfs.sh keeps the minicluster's jars and classes (its own rule)."""
    explicit = os.environ.get("PADDLECLOUD_HDFS_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "paddlecloud"


def launcher() -> Any:
    """tests/hdfs_cluster.py (the tests' own launcher: its script and platform user), once the
    minicluster is built; `NotBuilt` otherwise, before anything starts."""
    try:
        import hdfs_cluster  # tests/, on sys.path through bench/__init__.py
    except ImportError as exc:
        raise NotBuilt(
            f"the HDFS minicluster's launcher (tests/hdfs_cluster.py) cannot be imported: {exc}"
        ) from None
    reason = hdfs_cluster.unavailable()
    if reason is not None:
        raise NotBuilt(reason)
    if not any(cache_root().glob("hdfs-*/.built-*")):
        raise NotBuilt(
            f"the HDFS minicluster is not built (nothing in {cache_root()}/hdfs-*/): run `make hdfs` first"
        )
    return hdfs_cluster


def make_source(path: Path, size: int) -> str:
    """A file of `size` random bytes, and its sha256."""
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            piece = os.urandom(min(CHUNK, left))
            f.write(piece)
            digest.update(piece)
            left -= len(piece)
    return digest.hexdigest()


class PlainClient:
    """WebHDFS straight, as a user of HDFS would script it: aiohttp, no pfs, no hashing."""

    def __init__(self, session: aiohttp.ClientSession, url: str, user: str) -> None:
        self._session = session
        self._url = url.rstrip("/")
        self._user = user

    def _address(self, path: str, op: str, **params: str) -> str:
        query = "&".join(
            f"{k}={quote(v, safe='')}" for k, v in {"op": op, "user.name": self._user, **params}.items()
        )
        return f"{self._url}/webhdfs/v1{quote(path)}?{query}"

    async def create(self, path: str, source: Path) -> None:
        """CREATE: the NameNode names a DataNode (307), which takes the body in one PUT."""
        where = self._address(path, "CREATE", overwrite="true")
        async with self._session.put(where, allow_redirects=False) as resp:
            if resp.status != 307:
                raise RuntimeError(f"CREATE {path}: {resp.status} {await resp.text()}")
            datanode = resp.headers["Location"]

        async def body() -> AsyncIterator[bytes]:
            with open(source, "rb") as f:
                while piece := f.read(CHUNK):
                    yield piece

        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(source.stat().st_size)}
        async with self._session.put(datanode, data=body(), headers=headers) as resp:
            if resp.status != 201:
                raise RuntimeError(f"CREATE {path} at the DataNode: {resp.status} {await resp.text()}")

    async def open(self, path: str, target: Path) -> None:
        """OPEN, its redirect followed, into `target`, fsynced."""
        async with self._session.get(self._address(path, "OPEN")) as resp:
            if resp.status != 200:
                raise RuntimeError(f"OPEN {path}: {resp.status} {await resp.text()}")
            with open(target, "wb") as f:
                async for chunk in resp.content.iter_chunked(CHUNK):
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())

    async def delete(self, path: str) -> None:
        async with self._session.delete(self._address(path, "DELETE")) as resp:
            await resp.read()


async def plain(url: str, user: str, step: str, path: str, local: Path) -> float:
    """Seconds of one plain-client transfer (`create` from `local`, or `open` into it)."""
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        client = PlainClient(session, url, user)
        start = time.perf_counter()
        await (client.create(path, local) if step == "create" else client.open(path, local))
        seconds = time.perf_counter() - start
        if step == "create":
            await client.delete(path)
        return seconds


@dataclass
class Row:
    name: str
    seconds: list[float] = field(default_factory=list)
    baseline: Row | None = None

    def line(self, size: int, width: int) -> str:
        text = f"{self.name:{width}}{size / statistics.median(self.seconds) / 1e6:>8.0f}"
        if self.baseline is not None:
            ratios = [b / s for b, s in zip(self.baseline.seconds, self.seconds, strict=True)]
            text += f"{statistics.median(ratios):>8.2f}x  {min(ratios):.2f}-{max(ratios):.2f}"
        return text


def run(size: int) -> None:
    hdfs_cluster = launcher()
    cli = [sys.executable, "-m", "paddlecloud"]
    plain_up = Row("upload: aiohttp -> WebHDFS CREATE (plain client)")
    up = Row("upload: CLI -> gateway -> pfs -> WebHDFS (tus, sha256)", baseline=plain_up)
    plain_down = Row("download: aiohttp <- WebHDFS OPEN (plain client, fsync)")
    down = Row("download: CLI <- gateway <- pfs <- WebHDFS (verified)", baseline=plain_down)
    with tempfile.TemporaryDirectory(dir=os.environ.get("PADDLECLOUD_BENCH_DIR")) as tmp:
        work = Path(tmp)
        source = work / "source.bin"
        expected = make_source(source, size)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLECLOUD_", "PADDLE_"))}
        env["HOME"] = str(work / "home")
        (work / "hdfs").mkdir()
        with hdfs_cluster.minicluster(work / "hdfs") as hdfs:
            root = "/bench"
            hdfs.make_dir(root, owner=hdfs.platform_user)
            hdfs.make_dir(f"{root}/plain", owner=hdfs.platform_user)
            settings = work / "server.yaml"
            # One DataNode: every block has one replica (the minicluster's dfs.replication).
            hdfs_settings = {"namenode": hdfs.url, "root_path": root, "user": hdfs.platform_user}
            hdfs_settings |= {"proxy_users": True, "replication": 1}
            settings.write_text(yaml.safe_dump({"pfs": {"datacenter": DC, "hdfs": hdfs_settings}}))
            with logged_in_server(cli, env, work / "data", "--server-config", str(settings)):
                for round_ in range(ROUNDS):
                    remote = f"/pfs/{DC}/home/{USER}/bench-{round_}.bin"
                    in_hdfs = f"{root}/home/{USER}/bench-{round_}.bin"
                    # In turns, so that neither client always goes first.
                    for step in ("plain", "cli") if round_ % 2 == 0 else ("cli", "plain"):
                        settle()
                        drop_caches_for(source)
                        if step == "plain":
                            plain_path = f"{root}/plain/bench-{round_}.bin"
                            plain_up.seconds.append(
                                asyncio.run(plain(hdfs.url, hdfs.platform_user, "create", plain_path, source))
                            )
                        else:
                            up.seconds.append(timed([*cli, "cp", "-q", str(source), remote], env))
                    status = hdfs.status(in_hdfs)
                    if status is None or status["length"] != size:
                        raise RuntimeError(
                            f"the CLI's upload is not at {in_hdfs} with {size} bytes: {status}"
                        )
                    for step in ("plain", "cli") if round_ % 2 == 0 else ("cli", "plain"):
                        downloaded = work / f"downloaded-{step}.bin"
                        settle()
                        if step == "plain":
                            plain_down.seconds.append(
                                asyncio.run(plain(hdfs.url, hdfs.superuser, "open", in_hdfs, downloaded))
                            )
                        else:
                            down.seconds.append(timed([*cli, "cp", "-q", remote, str(downloaded)], env))
                        if sha256_of(downloaded) != expected:
                            raise RuntimeError(f"the {step} download's bytes differ from the source")
                        settle(downloaded)
                    subprocess.run([*cli, "rm", remote], env=env, check=True, stdout=subprocess.DEVNULL)
    print(
        f"{size / 2**20:g} MiB of random bytes ({size} bytes, --size), {ROUNDS} rounds "
        "(PADDLECLOUD_BENCH_HDFS_ROUNDS); Hadoop's minicluster (1 NameNode, 1 DataNode) on this machine"
    )
    print(
        "MB/s is the median; ratio is the median of the rounds' paired ratios (plain / CLI), then their range"
    )
    width = 62
    print(f"{'':{width}}{'MB/s':>8}{'ratio':>9}  range")
    for row in (plain_up, up, plain_down, down):
        print(row.line(size, width))


def main(size: str | None = None) -> None:
    """The bench, moving `size` (a quantity; 1Gi when None); one line and exit 1 where it cannot run."""
    text = size or DEFAULT_SIZE
    try:
        count = parse_bytes(text)
    except QuantityError as exc:
        sys.exit(f"bench hdfs: --size {text!r}: {exc}")
    if count <= 0:
        sys.exit(f"bench hdfs: --size {text!r}: give a positive size such as 256Mi")
    try:
        run(count)
    except NotBuilt as exc:
        sys.exit(f"bench hdfs: {exc}")
