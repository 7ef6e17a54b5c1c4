"""Builds through the gateway of `paddlecloud server`: a cold build against a cache hit of
the same requirements, and the cold build against the same commands run by hand.

The builder installs from a wheelhouse this bench writes (pure-Python wheels of a few
hundred small modules each; `--no-index`, so no network), into a fresh virtualenv per
cache key. Each round asks for requirements no earlier round asked for (a comment line
makes the key new), times POST → SUCCEEDED (polling GET every 10 ms), then times the same
request again (the cache hit answers at once). The baseline is what the builder runs
for a cold build, by hand: `python -m venv --without-pip`, then pip from the platform
into it, with the same arguments.

The registry path (the kaniko backend), where root, buildah and docker-registry are there
(`make system-deps`): a cold build is the backend's generated context built with buildah
(vfs, chroot; the stand-in for the Kaniko executor, which runs only in a container) and
pushed to docker-registry on loopback with htpasswd auth, from a ~40 MB base image made of
the host's Python; a hit is the backend's lookup, one authenticated HEAD on the manifest.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from bench.platform import Platform as BasePlatform

PACKAGES = 8
MODULES_PER_PACKAGE = 200
ROUNDS = 5
HITS_PER_ROUND = 20
POLL = 0.01


def write_wheel(directory: Path, name: str, modules: int) -> None:
    """A pure-Python wheel of `modules` small modules, with its METADATA, WHEEL and RECORD."""
    files = {f"{name}/__init__.py": b"VALUE = 1\n"}
    for i in range(modules):
        files[f"{name}/m{i:04d}.py"] = (f"def f{i}(x):\n    return x + {i}\n" * 20).encode()
    info = f"{name}-1.0.dist-info"
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(directory / f"{name}-1.0-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            z.writestr(path, data)


def requirements(round_number: int) -> str:
    names = "\n".join(f"benchpkg{i}==1.0" for i in range(PACKAGES))
    return f"# round {round_number}\n{names}\n"


def by_hand(root: Path, wheelhouse: Path, text: str) -> float:
    """Seconds for what the builder runs for a cold build, without the builder."""
    env, run = root / "env", root / "run"
    root.mkdir(parents=True, exist_ok=True)
    pip_dir = root / "pip"
    if not pip_dir.exists():
        import pip

        pip_dir.mkdir()
        (pip_dir / "pip").symlink_to(Path(pip.__file__).parent)
    run.mkdir(exist_ok=True)
    (run / "requirements.txt").write_text(text)
    environ = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/"),
        "PYTHONPATH": str(pip_dir),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    start = time.perf_counter()
    with open(root / "by-hand.log", "ab") as out:  # the builder, too, writes pip's output to a file
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, stdout=out)
        subprocess.run(
            [
                *(str(env / "bin" / "python"), "-m", "pip", "install", "--no-input"),
                *("--disable-pip-version-check", "--progress-bar", "off", "--no-warn-script-location"),
                *("--find-links", str(wheelhouse), "--no-index", "-r", "requirements.txt"),
            ],
            check=True,
            cwd=run,
            env=environ,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    elapsed = time.perf_counter() - start
    subprocess.run(["rm", "-rf", str(env), str(run)], check=True)
    return elapsed


class Platform(BasePlatform):
    """The server, and a session as its admin."""

    @asynccontextmanager
    async def session(self) -> AsyncIterator[tuple[aiohttp.ClientSession, dict[str, str]]]:
        password = self.admin_password()
        async with aiohttp.ClientSession() as session:
            body = {"username": "admin", "password": password}
            async with session.post(f"{self.url}/api/v1/auth/token", json=body) as resp:
                assert resp.status == 201, await resp.text()
                token = (await resp.json())["token"]
            yield session, {"Authorization": f"Bearer {token}"}


async def measure(platform: Platform, wheelhouse: Path) -> tuple[list[float], list[float], list[float]]:
    """Seconds of each cold build, of every cache hit, and of each baseline, interleaved
    round by round so that the machine's load weighs on both alike."""
    cold, hits, baseline = [], [], []
    async with platform.session() as (session, headers):
        url = f"{platform.url}/api/v1/builds"
        for n in range(ROUNDS):
            by_hand_dir = platform.root.parent / "by-hand"
            baseline.append(await asyncio.to_thread(by_hand, by_hand_dir, wheelhouse, requirements(1000 + n)))
            body = {"requirements": requirements(n)}
            start = time.perf_counter()
            async with session.post(url, json=body, headers=headers) as resp:
                build = await resp.json()
                assert resp.status == 201 and build["cached"] is False, build
            while build["state"] not in ("SUCCEEDED", "FAILED"):
                await asyncio.sleep(POLL)
                async with session.get(f"{url}/{build['id']}", headers=headers) as resp:
                    build = await resp.json()
            cold.append(time.perf_counter() - start)
            assert build["state"] == "SUCCEEDED", build
            for _ in range(HITS_PER_ROUND):
                start = time.perf_counter()
                async with session.post(url, json=body, headers=headers) as resp:
                    hit = await resp.json()
                hits.append(time.perf_counter() - start)
                assert hit["cached"] is True and hit["state"] == "SUCCEEDED" and hit["id"] == build["id"], hit
    return cold, hits, baseline


def main() -> None:
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=os.environ.get("PADDLECLOUD_BENCH_DIR")) as tmp:
        root = Path(tmp)
        wheelhouse = root / "wheelhouse"
        wheelhouse.mkdir()
        for i in range(PACKAGES):
            write_wheel(wheelhouse, f"benchpkg{i}", MODULES_PER_PACKAGE)
        size = sum(p.stat().st_size for p in wheelhouse.iterdir())
        print(
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; {PACKAGES} wheels of "
            f"{MODULES_PER_PACKAGE} modules ({size / 2**20:.1f} MiB) from a local wheelhouse, --no-index; "
            f"{ROUNDS} rounds through the gateway of `paddlecloud server`",
            flush=True,
        )
        builder = {"work_dir": str(root / "builder"), "find_links": [str(wheelhouse)], "no_index": True}
        with Platform(root / "platform", {"builder": builder}).running() as platform:
            cold, hits, baseline = asyncio.run(measure(platform, wheelhouse))
    cold_s, base_s, hit_s = statistics.median(cold), statistics.median(baseline), statistics.median(hits)
    print(f"{'':52}{'median':>10}{'min':>10}{'max':>10}")
    rows = [
        ("cold build: POST → SUCCEEDED", cold),
        ("the same commands by hand (venv + pip)", baseline),
        ("cache hit: POST of the same requirements", hits),
    ]
    for name, samples in rows:
        figures = (statistics.median(samples), min(samples), max(samples))
        cells = "".join(f"{_seconds(v):>10}" for v in figures)
        print(f"{name:52}{cells}")
    print(f"cold build / by hand: {cold_s / base_s:.2f}x (the service's own cost on a cold build)")
    print(f"cache hit / cold build: {hit_s / cold_s:.5f}x ({cold_s / hit_s:,.0f} times faster)")
    registry_path()
    print(f"{time.perf_counter() - began:.0f} s in all")


REGISTRY_ROUNDS = 3
REGISTRY_HITS = 50


def registry_path() -> None:
    """The kaniko backend's cache on a registry: a HEAD-based hit against a cold build."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import real_registry as real  # the tests' helpers: one way to make the base and registry

    why = real.missing()
    if why is not None:
        print(f"registry path: skipped ({why})")
        return
    with tempfile.TemporaryDirectory(dir=os.environ.get("PADDLECLOUD_BENCH_DIR")) as tmp:
        root = Path(tmp)
        (root / "registry").mkdir()
        host, process = real.start_registry(root / "registry")
        buildah = real.buildah_command(root / "buildah")
        try:
            cold, hits = asyncio.run(_registry_rounds(root, host, buildah, real))
        finally:
            process.terminate()
            process.wait(10)
            subprocess.run([*buildah, "rm", "--all"], capture_output=True, check=False)
    cold_s, hit_s = statistics.median(cold), statistics.median(hits)
    print(
        f"registry path ({REGISTRY_ROUNDS} cold builds, {REGISTRY_HITS} hits each): "
        f"cold build (buildah build + push) {_seconds(cold_s)}, hit (one HEAD) {_seconds(hit_s)}"
    )
    print(f"registry cache hit / cold build: {hit_s / cold_s:.5f}x ({cold_s / hit_s:,.0f} times faster)")


async def _registry_rounds(
    root: Path, host: str, buildah: list[str], real: Any
) -> tuple[list[float], list[float]]:
    from paddlecloud.builder.backend import BuildRequest
    from paddlecloud.builder.kaniko import KanikoBuildBackend
    from paddlecloud.builder.kaniko_manifests import context_files
    from paddlecloud.builder.spec import cache_key
    from paddlecloud.common.config import Config
    from paddlecloud.common.dockerconfig import Credentials, dockerconfigjson

    base = f"{host}/{real.BASE}:3.11"
    real.push_base(buildah, real.base_root(root / "base"), base, "bench")
    wheels = root / "wheels"
    wheels.mkdir()
    write_wheel(wheels, "benchpkg0", MODULES_PER_PACKAGE)
    server = subprocess.Popen(
        [sys.executable, "-u", "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(wheels), "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = server.stdout.readline().split(" port ")[1].split()[0]  # "Serving HTTP on ... port N ..."
        auth = root / "push.json"
        auth.write_text(dockerconfigjson({host: Credentials(real.USER, real.PASSWORD)}))
        config = Config.model_validate(
            {
                "builder": {
                    "backend": "kaniko",
                    "work_dir": str(root / "builder"),
                    "find_links": [f"http://127.0.0.1:{port}/"],
                    "no_index": True,
                    "kaniko": {
                        "registry": host,
                        "insecure_registries": [host],
                        "auth_file": str(auth),
                        "base_image": base,
                        "trusted_hosts": ["127.0.0.1"],
                    },
                },
            }
        )
        backend = KanikoBuildBackend(config, kube=_NoCluster())  # type: ignore[arg-type]
        await backend.open()
        cold: list[float] = []
        hits: list[float] = []
        try:
            base_ref = await backend.base_identity(None)
            for round_number in range(REGISTRY_ROUNDS):
                text = f"benchpkg0\n# round {round_number} {time.time()}\n"
                key = cache_key(base_ref, text, backend.version, "bench")
                plan = backend.plan(
                    BuildRequest(f"{round_number:032x}", key, "bench", text, base_ref=base_ref)
                )
                context = root / f"context{round_number}"
                context.mkdir()
                for name, body in context_files(plan).items():
                    (context / name).write_text(body)
                started = time.perf_counter()
                creds = ["--creds", f"{real.USER}:{real.PASSWORD}", "--tls-verify=false"]
                tag = f"localhost/bench:{round_number}"
                real.run(
                    *buildah, "build", "--quiet", "--isolation", "chroot", *creds, "-t", tag, str(context)
                )
                real.run(*buildah, "push", "--quiet", *creds, tag, f"docker://{plan.destination}")
                cold.append(time.perf_counter() - started)
                for _ in range(REGISTRY_HITS):
                    started = time.perf_counter()
                    found = await backend.lookup(key, touch=True, owner="bench")
                    hits.append(time.perf_counter() - started)
                    assert found is not None
        finally:
            await backend.close()
    finally:
        server.terminate()
        server.wait(10)
    return cold, hits


class _NoCluster:
    """The bench asks the registry only: a cluster is never called."""


def _seconds(value: float) -> str:
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


if __name__ == "__main__":
    main()
