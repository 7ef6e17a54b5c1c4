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

The backend opens as the chart's builder ServiceAccount on the real control plane
(tests/kube_real/builds.py), as in the builder's other tests; buildah stands in for the
Job, so it asks the cluster nothing.

Needs root, buildah, docker-registry and htpasswd (`make system-deps`), and the control
plane built (`make kube-control-plane`); skipped otherwise, saying which is missing.
"""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from real_registry import (
    BASE,
    PASSWORD,
    USER,
    base_root,
    buildah_command,
    missing,
    push,
    push_base,
    run,
    serve_directory,
    start_registry,
)

from kube_real.builds import Builds, builds_namespace
from kube_real.fixtures import RealKube
from paddlecloud.builder import kaniko_manifests
from paddlecloud.builder.backend import BackendUnavailable, BuildRequest
from paddlecloud.builder.kaniko import KanikoBuildBackend
from paddlecloud.builder.kaniko_manifests import IMAGE_LABEL_KEY, context_files
from paddlecloud.builder.registry import ImageRef, RegistryAuthError, RegistryClient
from paddlecloud.builder.spec import cache_key
from paddlecloud.common.dockerconfig import Credentials, dockerconfigjson
from support import make_config, make_wheel

pytestmark = [pytest.mark.slow, pytest.mark.skipif(missing() is not None, reason=str(missing()))]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The registry's host:port."""
    host, process = start_registry(tmp_path_factory.mktemp("registry"))
    yield host
    process.terminate()
    process.wait(10)


@pytest.fixture(scope="module")
def buildah(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """buildah with storage of its own (vfs), removed afterwards."""
    where = tmp_path_factory.mktemp("buildah")
    command = buildah_command(where)
    yield command
    subprocess.run([*command, "rm", "--all"], capture_output=True, check=False)
    subprocess.run(["rm", "-rf", str(where)], check=False)


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Iterator[str]:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "pctiny", "1.0", body="WHERE = 'from the wheelhouse'\n")
    url, server = serve_directory(wheels)
    yield url
    server.terminate()
    server.wait(10)


def kaniko_config(
    tmp_path: Path, builds: Builds, registry: str, wheelhouse: str, base: str, auth: Path
) -> Any:
    """The kaniko backend's config for `registry` (push credentials written to `auth`),
    pip reading only the wheelhouse, on the chart's builder rights in `builds`."""
    auth.write_text(dockerconfigjson({registry: Credentials(USER, PASSWORD)}))
    wheel_host = wheelhouse.split("//", 1)[1].split(":", 1)[0]
    return make_config(
        tmp_path,
        jobs={"kubernetes": {"kubeconfig": str(builds.rights.kubeconfig)}},
        builder={
            "backend": "kaniko",
            "find_links": [wheelhouse],
            "no_index": True,
            "kaniko": {
                "registry": registry,
                "insecure_registries": [registry],
                "auth_file": str(auth),
                "base_image": base,
                "trusted_hosts": [wheel_host],
                "namespace": builds.namespace,
            },
        },
    )


async def test_the_generated_context_builds_and_the_registry_answers_hits_and_misses(
    registry: str, buildah: list[str], wheelhouse: str, real_kube: RealKube, tmp_path: Path
) -> None:
    base = f"{registry}/{BASE}:3.11"
    root = base_root(tmp_path / "root")
    push_base(buildah, root, base, "one")

    auth = tmp_path / "push.json"
    # The backend connects as the chart's builder ServiceAccount (it asks the cluster
    # nothing here: the Job is what buildah stands in for).
    with builds_namespace(real_kube, tmp_path) as builds:
        config = kaniko_config(tmp_path, builds, registry, wheelhouse, base, auth)
        backend = KanikoBuildBackend(config)
        await backend.open()
        try:
            requirements = "pctiny==1.0\n"
            base_ref = await backend.base_identity(None)
            assert base_ref.startswith(f"{registry}/{BASE}@sha256:")
            key = cache_key(base_ref, requirements, backend.version, "alice")
            assert await backend.lookup(key, touch=False, owner="alice") is None

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
            push(buildah, "localhost/runtime:built", plan.destination)
            built_in = time.monotonic() - started

            # A hit is one HEAD on the registry.
            found = await backend.lookup(key, touch=True, owner="alice")
            assert found is not None and found.artifact == {"image": plan.destination}
            # The image says what it holds, and its last layer is the installed requirements.
            async with aiohttp.ClientSession() as session:
                client = RegistryClient(
                    session, {registry: Credentials(USER, PASSWORD)}, insecure=frozenset({registry})
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
                    session, {registry: Credentials(USER, "nope")}, insecure=frozenset({registry})
                )
                with pytest.raises(RegistryAuthError) as refused:
                    await wrong.exists(ref)
                assert str(refused.value) == (
                    f"registry {registry} refused the credentials of user 'pusher' for "
                    "paddlecloud/runtime/alice: check the user name and password"
                )
                anonymous = RegistryClient(session, insecure=frozenset({registry}))
                with pytest.raises(RegistryAuthError, match="needs credentials"):
                    await anonymous.exists(ref)

            # The base tag moves: a new digest, a new key, a miss.
            push_base(buildah, root, base, "two")
            moved = await backend.base_identity(None)
            assert moved != base_ref
            new_key = cache_key(moved, requirements, backend.version, "alice")
            assert await backend.lookup(new_key, touch=False, owner="alice") is None
            assert await backend.lookup(key, touch=False, owner="alice") is not None, "the old image stays"
        finally:
            await backend.close()

        # The backend with refused push credentials says so when asked for a lookup.
        auth.write_text(dockerconfigjson({registry: Credentials(USER, "rotated")}))
        stale = KanikoBuildBackend(config)
        await stale.open()
        try:
            with pytest.raises(BackendUnavailable, match="refused the credentials of user 'pusher'"):
                await stale.lookup(key, touch=False, owner="alice")
        finally:
            await stale.close()
    print(f"\nbuildah built and pushed the runtime image in {built_in:.1f} s")


# A build's user code looking for the registry credentials: an in-tree PEP 517 backend in
# `setup.py` (pip runs it as it runs any sdist's setup.py: as root, in the executor's own
# filesystem). It looks where Kaniko keeps credentials, where DOCKER_CONFIG points, and in
# every file under every mount, and writes what it found into the image.
PROBE_SETUP = r"""
import base64, hashlib, json, os, zipfile

def _probe():
    docker_config = os.environ.get("DOCKER_CONFIG", "/kaniko/.docker")
    paths = ["/kaniko/.docker/config.json", "/pusher/.docker/config.json",
             os.path.join(docker_config, "config.json"), os.path.expanduser("~/.docker/config.json")]
    try:
        with open("/proc/self/mounts") as f:
            mounts = [line.split()[1] for line in f]
    except OSError:
        mounts = []
    for top in mounts:
        if top == "/" or top.startswith(("/proc", "/sys", "/dev")):
            continue
        for where, _, names in os.walk(top):
            paths += [os.path.join(where, name) for name in names]
    found = {}
    for path in paths:
        try:
            with open(path, errors="replace") as f:
                text = f.read(1 << 16)
        except OSError:
            continue
        if "auths" in text:
            found[path] = text
    env = {k: v for k, v in os.environ.items() if "DOCKER" in k or "AUTH" in k or "REGISTRY" in k}
    with open("/pcprobe-found.json", "w") as f:
        json.dump({"files": found, "env": env, "mounts": mounts}, f)

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _probe()
    name = "pcprobe-1.0-py3-none-any.whl"
    files = {"pcprobe/__init__.py": b"", "pcprobe-1.0.dist-info/METADATA":
             b"Metadata-Version: 2.1\nName: pcprobe\nVersion: 1.0\n",
             "pcprobe-1.0.dist-info/WHEEL":
             b"Wheel-Version: 1.0\nGenerator: probe\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append("pcprobe-1.0.dist-info/RECORD,,")
    files["pcprobe-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return name
"""
PROBE_PYPROJECT = """[build-system]
requires = []
build-backend = "setup"
backend-path = ["."]

[project]
name = "pcprobe"
version = "1.0"
"""


def make_probe_sdist(directory: Path) -> None:
    """pcprobe-1.0.tar.gz, whose setup.py (its build backend) looks for credentials."""
    with tarfile.open(directory / "pcprobe-1.0.tar.gz", "w:gz") as tar:
        for name, text in (
            ("setup.py", PROBE_SETUP),
            ("pyproject.toml", PROBE_PYPROJECT),
            ("PKG-INFO", "Metadata-Version: 2.1\nName: pcprobe\nVersion: 1.0\n"),
        ):
            data = text.encode()
            info = tarfile.TarInfo(f"pcprobe-1.0/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def executor_volumes(
    backend: KanikoBuildBackend, request: BuildRequest, where: Path
) -> tuple[list[str], set[str]]:
    """`buildah build --volume` arguments, and the mount paths: every volume the executor
    container of the real `build_job` manifest mounts, at its mount path, with what the pod
    would hold there (the Secrets' config.json as the backend writes them, the context
    ConfigMap's files, empty directories for emptyDirs)."""
    plan = backend.plan(request)
    pod = kaniko_manifests.build_job(plan)["spec"]["template"]["spec"]
    containers = [*(pod.get("initContainers") or []), *pod["containers"]]
    executor = next(c for c in containers if c["name"] == kaniko_manifests.EXECUTOR)
    volumes = {v["name"]: v for v in pod["volumes"]}
    pull = getattr(backend, "pull_config", lambda _: None)(request)
    arguments = []
    for mount in executor["volumeMounts"]:
        volume = volumes[mount["name"]]
        source = where / mount["name"]
        source.mkdir(parents=True)
        if "secret" in volume:
            name = volume["secret"]["secretName"]
            text = (
                backend.docker_config(request)
                if name == kaniko_manifests.secret_name(request.build_id)
                else pull
            )
            assert text is not None, f"no content known for Secret {name}"
            for item in volume["secret"]["items"]:
                (source / item["path"]).write_text(text)
        elif "configMap" in volume:
            for name, text in context_files(plan).items():
                (source / name).write_text(text)
        else:
            assert "emptyDir" in volume, volume
        mode = "ro" if mount.get("readOnly") else "rw"
        arguments += ["--volume", f"{source}:{mount['mountPath']}:{mode}"]
    return arguments, {m["mountPath"] for m in executor["volumeMounts"]}


async def test_user_code_in_a_build_finds_no_registry_credentials(
    registry: str, buildah: list[str], wheelhouse: str, real_kube: RealKube, tmp_path: Path
) -> None:
    """The acceptance of issue 32: a requirements.txt whose sdist's setup.py looks for the
    registry credentials, built from the backend's real context with the executor
    container's file layout (every volume of the real manifest's executor bind-mounted
    with the content the pod would have), finds nothing; the push credentials reach only
    the pusher (test_kaniko_manifests.py checks no other container mounts them)."""
    base = f"{registry}/{BASE}:probe"
    push_base(buildah, base_root(tmp_path / "root"), base, "probe")
    make_probe_sdist(tmp_path / "wheels")  # the wheelhouse serves this directory
    with builds_namespace(real_kube, tmp_path) as builds:
        config = kaniko_config(tmp_path, builds, registry, wheelhouse, base, tmp_path / "push.json")
        backend = KanikoBuildBackend(config)
        await backend.open()
        try:
            requirements = "pcprobe==1.0\n"
            base_ref = await backend.base_identity(None)
            request = BuildRequest("c" * 32, "d" * 64, "mallory", requirements, base_ref=base_ref)
            context = tmp_path / "context"
            context.mkdir()
            for name, text in context_files(backend.plan(request)).items():
                (context / name).write_text(text)
            volumes, mounted = executor_volumes(backend, request, tmp_path / "volumes")
        finally:
            await backend.close()
    run(
        *buildah,
        "build",
        "--quiet",
        "--isolation",
        "chroot",
        "--tls-verify=false",
        "--creds",
        f"{USER}:{PASSWORD}",
        *volumes,
        "-t",
        "localhost/probe:built",
        str(context),
    )
    container = run(*buildah, "from", "localhost/probe:built").strip()
    try:
        found = json.loads(
            (Path(run(*buildah, "mount", container).strip()) / "pcprobe-found.json").read_text()
        )
    finally:
        run(*buildah, "rm", container)
    # The probe ran with the executor's volumes mounted (so it looked where they are)...
    assert mounted and mounted <= set(found["mounts"]), (mounted, found["mounts"])
    # ...and found no credentials: no file, no variable, not the password anywhere.
    assert found["files"] == {}, f"user code read credentials: {sorted(found['files'])}"
    assert found["env"] == {}, found["env"]
    assert PASSWORD not in json.dumps(found)
