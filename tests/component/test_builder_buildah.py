"""The Kaniko backend's Dockerfile and context, built for real and pushed to a real registry.

The Kaniko executor cannot run outside a container, so Debian's `buildah` (`--storage-driver
vfs --isolation chroot`, as root) stands in for it: it builds exactly the context a Kaniko
Job gets (`KanikoBuildBackend.plan` → `kaniko_manifests.context_files`), with pip installing
from a wheelhouse on loopback, and pushes to Debian's `docker-registry` (the CNCF
distribution registry) on loopback with htpasswd (basic) auth. The base image is made here:
`buildah from scratch` with the host's Python, its libraries, busybox as /bin/sh and pip,
about 40 MB, pushed first. Then the backend's own registry client answers: a miss, a hit
after the build (a HEAD), a miss again once the base tag moved (a new digest, a new key),
wrong credentials refused in words; and the pushed image's config and last layer show the
requirements installed.

Needs root, buildah, docker-registry and htpasswd (`make system-deps`); skipped otherwise,
saying which is missing.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from kube_fake import FakeKube
from paddlecloud.builder.backend import BackendUnavailable, BuildRequest
from paddlecloud.builder.kaniko import KanikoBuildBackend
from paddlecloud.builder.kaniko_manifests import IMAGE_LABEL_KEY, context_files
from paddlecloud.builder.registry import ImageRef, RegistryAuthError, RegistryClient
from paddlecloud.builder.spec import cache_key
from paddlecloud.common.dockerconfig import Credentials, dockerconfigjson
from support import free_port, make_config, make_wheel

USER, PASSWORD = "pusher", "registry-secret"
BASE = "base/python"
STDLIB = Path(f"/usr/lib/python3.{sys.version_info.minor}")
STDLIB_SKIP = {
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "lib2to3",
    "pydoc_data",
    "__pycache__",
    "EXTERNALLY-MANAGED",  # PEP 668: pip would refuse to install into this Python
    "site-packages",
    "dist-packages",
}


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "buildah with --isolation chroot needs root"
    for tool, package in (
        ("buildah", "buildah"),
        ("docker-registry", "docker-registry"),
        ("htpasswd", "apache2-utils"),
    ):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian package {package}; `make system-deps`)"
    if (
        not (STDLIB / "lib-dynload").is_dir()
        or not Path(f"/usr/bin/python3.{sys.version_info.minor}").exists()
    ):
        return (
            f"the base image is made from Debian's python3.{sys.version_info.minor}, which is not installed"
        )
    if shutil.which("busybox") is None:
        return "busybox is not installed (the base image's /bin/sh)"
    return None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_missing() is not None, reason=str(_missing()))]


@dataclass
class RealRegistry:
    host: str
    process: subprocess.Popen[bytes]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealRegistry]:
    where = tmp_path_factory.mktemp("registry")
    htpasswd = subprocess.run(
        ["htpasswd", "-Bbn", USER, PASSWORD], check=True, capture_output=True, text=True
    ).stdout
    (where / "htpasswd").write_text(htpasswd)
    port = free_port()
    config = {
        "version": 0.1,
        "log": {"level": "error"},
        "storage": {"filesystem": {"rootdirectory": str(where / "data")}, "delete": {"enabled": True}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": "test"},
        "auth": {"htpasswd": {"realm": "basic-realm", "path": str(where / "htpasswd")}},
    }
    (where / "config.yml").write_text(json.dumps(config))  # YAML reads JSON
    process = subprocess.Popen(
        ["docker-registry", "serve", str(where / "config.yml")],
        stdout=subprocess.DEVNULL,
        stderr=open(where / "registry.log", "wb"),
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1)
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                break
        except OSError:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            pytest.fail(f"docker-registry did not start: {(where / 'registry.log').read_text()[-2000:]}")
        time.sleep(0.05)
    yield RealRegistry(f"127.0.0.1:{port}", process)
    process.terminate()
    process.wait(10)


@pytest.fixture(scope="module")
def buildah(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """buildah with storage of its own (vfs), removed afterwards."""
    where = tmp_path_factory.mktemp("buildah")
    command = [
        "buildah",
        "--root",
        str(where / "root"),
        "--runroot",
        str(where / "run"),
        "--storage-driver",
        "vfs",
    ]
    yield command
    subprocess.run([*command, "rm", "--all"], capture_output=True, check=False)
    subprocess.run(["rm", "-rf", str(where)], check=False)


def run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{' '.join(argv[:6])}... failed ({done.returncode}):\n{done.stderr[-3000:]}"
    return done.stdout


def base_root(root: Path) -> Path:
    """A filesystem with Debian's Python, the libraries it and its extension modules link,
    busybox as /bin/sh and rm, and pip (the platform's own, copied)."""
    version = f"python3.{sys.version_info.minor}"
    shutil.copytree(
        STDLIB, root / STDLIB.relative_to("/"), ignore=lambda d, names: [n for n in names if n in STDLIB_SKIP]
    )
    programs = [f"/usr/bin/{version}", str(shutil.which("busybox"))]
    linked: set[str] = set()
    for binary in [*programs, *map(str, (STDLIB / "lib-dynload").glob("*.so"))]:
        ldd = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False).stdout
        linked.update(word for line in ldd.splitlines() for word in line.split() if word.startswith("/"))
    for path in [*programs, *linked]:
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    busybox = "/" + str(Path(programs[1]).relative_to("/"))
    for name, points_to in (
        ("usr/bin/python3", version),
        ("usr/bin/python", version),
        ("bin/sh", busybox),
        ("bin/rm", busybox),
    ):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(points_to, root / name)
    import pip

    shutil.copytree(
        Path(pip.__file__).parent,
        root / "usr/lib/python3/dist-packages/pip",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (root / "tmp").mkdir()
    os.chmod(root / "tmp", 0o1777)  # noqa: S103 - an image's /tmp, as every image has it
    return root


def push_base(buildah: list[str], root: Path, destination: str, marker: str) -> None:
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc/base-marker").write_text(marker)  # a second push is another image
    container = run(*buildah, "from", "scratch").strip()
    run(*buildah, "copy", "--quiet", container, str(root), "/")
    run(*buildah, "config", "--env", "PATH=/usr/local/bin:/usr/bin:/bin", "--cmd", "python3", container)
    run(*buildah, "commit", "--quiet", "--rm", container, f"localhost/base:{marker}")
    run(
        *buildah,
        "push",
        "--quiet",
        "--creds",
        f"{USER}:{PASSWORD}",
        "--tls-verify=false",
        f"localhost/base:{marker}",
        f"docker://{destination}",
    )


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Iterator[str]:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "pctiny", "1.0", body="WHERE = 'from the wheelhouse'\n")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(wheels), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
            break
        except OSError:
            if time.monotonic() > deadline:
                server.kill()
                pytest.fail("the wheelhouse server did not start")
            time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/"
    server.terminate()
    server.wait(10)


async def test_the_generated_context_builds_and_the_registry_answers_hits_and_misses(
    registry: RealRegistry, buildah: list[str], wheelhouse: str, tmp_path: Path
) -> None:
    base = f"{registry.host}/{BASE}:3.11"
    root = base_root(tmp_path / "root")
    push_base(buildah, root, base, "one")

    auth = tmp_path / "push.json"
    auth.write_text(dockerconfigjson({registry.host: Credentials(USER, PASSWORD)}))
    wheel_host = wheelhouse.split("//", 1)[1].split(":", 1)[0]
    with FakeKube() as kube:
        config = make_config(
            tmp_path,
            jobs={"kubernetes": {"kubeconfig": str(kube.write_kubeconfig(tmp_path / "kubeconfig"))}},
            builder={
                "backend": "kaniko",
                "find_links": [wheelhouse],
                "no_index": True,
                "kaniko": {
                    "registry": registry.host,
                    "insecure_registries": [registry.host],
                    "auth_file": str(auth),
                    "base_image": base,
                    "trusted_hosts": [wheel_host],
                },
            },
        )
        backend = KanikoBuildBackend(config)
        await backend.open()
        try:
            requirements = "pctiny==1.0\n"
            base_ref = await backend.base_identity(None)
            assert base_ref.startswith(f"{registry.host}/{BASE}@sha256:")
            key = cache_key(base_ref, requirements, backend.version)
            assert await backend.lookup(key, touch=False) is None

            request = BuildRequest("b" * 32, key, "alice", requirements, base_ref=base_ref)
            plan = backend.plan(request)
            context = tmp_path / "context"
            context.mkdir()
            for name, text in context_files(plan).items():
                (context / name).write_text(text)
            started = time.monotonic()
            run(
                *buildah,
                "build",
                "--quiet",
                "--isolation",
                "chroot",
                "--creds",
                f"{USER}:{PASSWORD}",
                "--tls-verify=false",
                "-t",
                "localhost/runtime:built",
                str(context),
            )
            run(
                *buildah,
                "push",
                "--quiet",
                "--creds",
                f"{USER}:{PASSWORD}",
                "--tls-verify=false",
                "localhost/runtime:built",
                f"docker://{plan.destination}",
            )
            built_in = time.monotonic() - started

            # A hit is one HEAD on the registry.
            found = await backend.lookup(key, touch=True)
            assert found is not None and found.artifact == {"image": plan.destination}
            # The image says what it holds, and its last layer is the installed requirements.
            async with aiohttp.ClientSession() as session:
                client = RegistryClient(
                    session, {registry.host: Credentials(USER, PASSWORD)}, insecure=frozenset({registry.host})
                )
                ref = ImageRef.parse(plan.destination)
                manifest = json.loads(await client.manifest(ref) or b"{}")
                image_config = json.loads(await client.blob(ref, manifest["config"]["digest"]))
                assert image_config["config"]["Labels"][IMAGE_LABEL_KEY] == key
                assert image_config["config"]["WorkingDir"] == "/job/work"
                assert any("pip install" in (h.get("created_by") or "") for h in image_config["history"])
                layer = await client.blob(ref, manifest["layers"][-1]["digest"])
                with tarfile.open(fileobj=io.BytesIO(gzip.decompress(layer))) as tar:
                    names = tar.getnames()
                assert any(name.endswith("pctiny/__init__.py") for name in names), names[:20]
                assert any("pctiny-1.0.dist-info" in name for name in names)

                # Wrong credentials: refused, in words, without the password.
                wrong = RegistryClient(
                    session, {registry.host: Credentials(USER, "nope")}, insecure=frozenset({registry.host})
                )
                with pytest.raises(RegistryAuthError) as refused:
                    await wrong.exists(ref)
                assert str(refused.value) == (
                    f"registry {registry.host} refused the credentials of user 'pusher' for "
                    "paddlecloud/runtime: check the user name and password"
                )
                anonymous = RegistryClient(session, insecure=frozenset({registry.host}))
                with pytest.raises(RegistryAuthError, match="needs credentials"):
                    await anonymous.exists(ref)

            # The base tag moves: a new digest, a new key, a miss.
            push_base(buildah, root, base, "two")
            moved = await backend.base_identity(None)
            assert moved != base_ref
            new_key = cache_key(moved, requirements, backend.version)
            assert await backend.lookup(new_key, touch=False) is None
            assert await backend.lookup(key, touch=False) is not None, "the old image stays"
        finally:
            await backend.close()

        # The backend with refused push credentials says so when asked for a lookup.
        auth.write_text(dockerconfigjson({registry.host: Credentials(USER, "rotated")}))
        stale = KanikoBuildBackend(config)
        await stale.open()
        try:
            with pytest.raises(BackendUnavailable, match="refused the credentials of user 'pusher'"):
                await stale.lookup(key, touch=False)
        finally:
            await stale.close()
    print(f"\nbuildah built and pushed the runtime image in {built_in:.1f} s")
