"""Submitting a 50 MiB package directory (issue 35 item 2): the first submit, and the
resubmit of the unchanged directory, through the real CLI against `paddlecloud server`,
beside the old path (the package named by the sha256 of its compressed archive, so packed
and gzipped on every submit) run by the same CLI in the same rounds, interleaved.

The directory: 1,000 source-like files of 10 KiB (text, compressible) and 4 files of
10 MiB of random bytes (weights, data: incompressible), 50 MiB in all. Each round changes
one small file, so each "first" submit is of a package PFS lacks; the new path's first
submit also starts from an empty stat cache. A third command, the submit of the package by
its PFS path, is the floor: the submit call with no local package at all. One untimed submit
warms the server and the page cache first; every job is waited for (untimed) and removed
before the next command.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from paddlecloud import package as pkgmod

from . import aim
from .platform import CLI, Platform

ROUNDS = int(os.environ.get("PADDLECLOUD_BENCH_PACKAGE_ROUNDS", "5"))
SMALL_FILES, SMALL_SIZE = 1000, 10 * 1024
BIG_FILES, BIG_SIZE = 4, 10 * 2**20
# "Unchanged packages cost nothing" (issue 35 item 2): the CLI's resubmit of the unchanged
# directory, over the same CLI's submit of the package by its PFS path. Against Ray's submit
# call, measured in the same run, the aim is `make bench-peers`'s (bench/peers.py).
AIM_OVER_FLOOR = 0.1
KINDS = ("new first", "new resubmit", "old first", "old resubmit", "floor")
REPO = Path(__file__).resolve().parent.parent


def make_tree(root: Path) -> None:
    for i in range(SMALL_FILES):
        sub = root / f"src/m{i // 100:02d}"
        sub.mkdir(parents=True, exist_ok=True)
        line = f"def f{i}(x):\n    return x * {i}  # a line of code\n"
        (sub / f"mod{i:04d}.py").write_text((line * (SMALL_SIZE // len(line) + 1))[:SMALL_SIZE])
    (root / "weights").mkdir()
    for i in range(BIG_FILES):
        (root / f"weights/part{i}.bin").write_bytes(os.urandom(BIG_SIZE))
    (root / "train.py").write_text("pass\n")


def old_prepare(source: Path) -> pkgmod.Package:
    """The package as the CLI made it before manifests: collected, packed and gzipped, and
    named by the sha256 of the compressed bytes (pfs still accepts that name)."""
    collected = pkgmod.collect(source)
    workdir = Path(tempfile.mkdtemp(prefix="paddlecloud-old-package-"))
    partial = workdir / "package.tar.gz.partial"
    with open(partial, "wb") as out:
        size = pkgmod.write_archive(collected, out)
    digest = hashlib.sha256()
    with open(partial, "rb") as packed:
        while block := packed.read(pkgmod.READ_BLOCK):
            digest.update(block)
    archive = workdir / f"{digest.hexdigest()}.tar.gz"
    os.replace(partial, archive)
    return pkgmod.Package(
        source=source,
        archive=archive,
        sha256=digest.hexdigest(),
        size=size,
        files=collected.files,
        bytes=collected.bytes,
        ignored=collected.ignored,
    )


def old_cli() -> int:
    """`paddlecloud` with the old packing (the hashing of the gzip stream, which the old
    writer did as it wrote, is a second read here: a few ms of the 40 MiB it hashes), and the
    old archive: every file deflated at level 6 in one gzip member, none stored."""
    from paddlecloud import client
    from paddlecloud.main import main  # not __main__, which runs the CLI as it is imported

    pkgmod.STORE_FROM = sys.maxsize

    client.prepare = lambda source, **_: old_prepare(source)  # type: ignore[assignment]
    return main(sys.argv[1:])


class Runner:
    def __init__(self, platform: Platform, cache: Path) -> None:
        self.platform = platform
        self.env = {**platform.env, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(REPO)}
        self.cache = cache
        self.count = 0

    def submit(self, argv: list[str], source: str) -> float:
        self.count += 1
        name = f"pkg-{self.count}"
        started = time.perf_counter()
        result = subprocess.run(
            [*argv, "submit", "--name", name, source], env=self.env, capture_output=True, text=True
        )
        seconds = time.perf_counter() - started
        if result.returncode != 0:
            raise RuntimeError(f"submit exited {result.returncode}: {result.stderr}{result.stdout}")
        self.wait_and_remove(name)
        return seconds

    def wait_and_remove(self, name: str) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            out = subprocess.run(
                [*CLI, "-o", "json", "get", "job", name], env=self.env, capture_output=True, text=True
            )
            if out.returncode == 0 and json.loads(out.stdout)["state"] in ("SUCCEEDED", "FAILED", "KILLED"):
                break
            time.sleep(0.3)
        subprocess.run([*CLI, "kill", "-rm", name], env=self.env, capture_output=True)


def main() -> None:
    new_cli = CLI
    old = [sys.executable, "-c", "import sys; from bench.package import old_cli; sys.exit(old_cli())"]
    with tempfile.TemporaryDirectory(dir=os.environ.get("PADDLECLOUD_BENCH_DIR")) as tmp:
        work = Path(tmp)
        tree = work / "tree"
        make_tree(tree)
        with Platform(work / "platform", {}).running() as platform:
            run = Runner(platform, work / "cache")
            times: dict[str, list[float]] = {k: [] for k in KINDS}
            run.submit(new_cli, str(tree))  # warms the server and the page cache, untimed
            for r in range(1, ROUNDS + 1):
                got: dict[str, float] = {}
                (tree / "src/m00/mod0000.py").write_text(f"ROUND = {r}  # new\n")
                shutil.rmtree(run.cache, ignore_errors=True)
                got["new first"] = run.submit(new_cli, str(tree))
                got["new resubmit"] = run.submit(new_cli, str(tree))
                (tree / "src/m00/mod0000.py").write_text(f"ROUND = {r}  # old\n")
                got["old first"] = run.submit(old, str(tree))
                got["old resubmit"] = run.submit(old, str(tree))
                got["floor"] = run.submit(new_cli, "pfs:.paddlecloud/packages/" + latest_package(run))
                shown = ", ".join(f"{k} {v:.3f} s" for k, v in got.items())
                print(f"  round {r} (load {os.getloadavg()[0]:.1f}): {shown}", flush=True)
                for key, value in got.items():
                    times[key].append(value)
    report(times)


def latest_package(run: Runner) -> str:
    out = subprocess.run(
        [*CLI, "-o", "json", "ls", "pfs:.paddlecloud/packages"], env=run.env, capture_output=True, text=True
    )
    entries = json.loads(out.stdout)["entries"]
    newest = max((e for e in entries if e["type"] == "file"), key=lambda e: e["mtime"])
    return str(newest["path"]).rsplit("/", 1)[1]


def report(times: dict[str, list[float]]) -> None:
    print(
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; {ROUNDS} interleaved rounds; "
        f"{SMALL_FILES} files of {SMALL_SIZE // 1024} KiB + {BIG_FILES} of {BIG_SIZE >> 20} MiB (random)"
    )
    med = {k: statistics.median(v) for k, v in times.items()}
    for key, values in times.items():
        print(f"  {key:14} median {med[key]:.3f} s  (min {min(values):.3f}, max {max(values):.3f})")
    print(
        f"  new/old first {med['new first'] / med['old first']:.2f}x; "
        f"new/old resubmit {med['new resubmit'] / med['old resubmit']:.2f}x"
    )
    aim(
        "first submit no slower than the old path's (medians, same run; within 5%, the rounds' noise)",
        f"{med['new first']:.3f} s vs {med['old first']:.3f} s",
        med["new first"] <= med["old first"] * 1.05,
    )
    over = med["new resubmit"] - med["floor"]
    aim(
        f"resubmit of the unchanged 50 MiB directory <= {AIM_OVER_FLOOR} s over the submit by PFS path "
        "(against Ray's: make bench-peers)",
        f"{over:+.3f} s ({med['new resubmit']:.3f} vs {med['floor']:.3f} s; "
        f"the old path {med['old resubmit']:.3f} s)",
        over <= AIM_OVER_FLOOR,
    )
