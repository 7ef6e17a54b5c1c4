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

from kube_real.builds import builds_namespace
from kube_real.fixtures import RealKube
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


async def test_the_generated_context_builds_and_the_registry_answers_hits_and_misses(
    registry: str, buildah: list[str], wheelhouse: str, real_kube: RealKube, tmp_path: Path
) -> None:
    base = f"{registry}/{BASE}:3.11"
    root = base_root(tmp_path / "root")
    push_base(buildah, root, base, "one")

    auth = tmp_path / "push.json"
    auth.write_text(dockerconfigjson({registry: Credentials(USER, PASSWORD)}))
    wheel_host = wheelhouse.split("//", 1)[1].split(":", 1)[0]
    # The backend connects as the chart's builder ServiceAccount (it asks the cluster
    # nothing here: the Job is what buildah stands in for).
    with builds_namespace(real_kube, tmp_path) as builds:
        config = make_config(
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
        backend = KanikoBuildBackend(config)
        await backend.open()
        try:
            requirements = "pctiny==1.0\n"
            base_ref = await backend.base_identity(None)
            assert base_ref.startswith(f"{registry}/{BASE}@sha256:")
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
            push(buildah, "localhost/runtime:built", plan.destination)
            built_in = time.monotonic() - started

            # A hit is one HEAD on the registry.
            found = await backend.lookup(key, touch=True)
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
                    "paddlecloud/runtime: check the user name and password"
                )
                anonymous = RegistryClient(session, insecure=frozenset({registry}))
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
        auth.write_text(dockerconfigjson({registry: Credentials(USER, "rotated")}))
        stale = KanikoBuildBackend(config)
        await stale.open()
        try:
            with pytest.raises(BackendUnavailable, match="refused the credentials of user 'pusher'"):
                await stale.lookup(key, touch=False)
        finally:
            await stale.close()
    print(f"\nbuildah built and pushed the runtime image in {built_in:.1f} s")
