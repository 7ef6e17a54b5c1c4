"""`make images` for real: every image the chart uses lands in a registry, and Helm installs
the chart pointed at them into the real control plane.

The real `make images` runs with Debian's buildah (`--storage-driver vfs --isolation chroot`,
as root) and pushes to Debian's `docker-registry` on loopback (htpasswd auth, plain http:
`INSECURE=1`, credentials through `REGISTRY_AUTH_FILE`). Two stand-ins, because nothing
public is reachable from here: the Dockerfiles build FROM a base made from the host's Python
(tests/real_registry.py, with ensurepip and busybox's tools added), and pip inside the builds
installs from a wheelhouse on loopback (`PIP_INDEX_URL`), downloaded once from PyPI into
~/.cache/paddlecloud. The third-party images (MongoDB, the Kaniko executor, the builds' Python
base, busybox) are small real images in a second local registry, named by `<NAME>_SOURCE`:
crane's copy is real, Docker Hub and ghcr.io are not. Then every image the chart rendered
with the printed `--set` flags references (each container's `image`, and the images the
ConfigMap names: defaultImage, initImage, executorImage, baseImage, pusherImage where the
chart has it) must be in the registry, the executor by the source's digest, and `helm
install` with them is accepted by the real API server (a release in a namespace of its own,
removed afterwards). What a real cluster adds, pulling and running them, is not shown here.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from real_registry import (
    PASSWORD,
    USER,
    base_root,
    buildah_command,
    missing,
    push_base,
    put_image,
    serve_directory,
    start_registry,
)

from kube_real import chart
from kube_real.chart import CHART, FULLNAME, RELEASE
from kube_real.fixtures import RealKube

pytestmark = [pytest.mark.slow, pytest.mark.skipif(missing() is not None, reason=str(missing()))]

REPO = Path(__file__).resolve().parents[2]
CRANE = Path(
    subprocess.run([REPO / "scripts/crane.sh", "binary"], capture_output=True, text=True).stdout.strip()
)


def wheelhouse() -> Path:
    """The wheels the images' builds install (the platform's dependencies, cramjam for the
    runtime's extra and setuptools), downloaded once per dependency list."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    wanted = [
        *project["project"]["dependencies"],
        *project["project"]["optional-dependencies"]["recordio-snappy"],
        *project["build-system"]["requires"],
    ]
    key = hashlib.sha256(json.dumps(wanted).encode()).hexdigest()[:16]
    where = Path.home() / ".cache" / "paddlecloud" / f"images-wheelhouse-{key}"
    if not where.is_dir():
        partial = where.with_name(where.name + f".{secrets.token_hex(4)}")
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--only-binary=:all:",
                "-d",
                str(partial),
                *wanted,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.fail(f"pip download for the wheelhouse failed:\n{done.stderr[-2000:]}")
        partial.rename(where)
    return where


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture
def index(tmp_path: Path) -> Iterator[str]:
    """A PEP 503 simple index of the wheelhouse on loopback (pip trusts http on loopback)."""
    root = tmp_path / "index"
    projects: dict[str, list[Path]] = {}
    for wheel in wheelhouse().glob("*.whl"):
        projects.setdefault(normalize(wheel.name.split("-")[0]), []).append(wheel)
    for project, wheels in projects.items():
        (root / "simple" / project).mkdir(parents=True)
        links = []
        for wheel in wheels:
            (root / "simple" / project / wheel.name).symlink_to(wheel)
            links.append(f'<a href="{wheel.name}">{wheel.name}</a>')
        (root / "simple" / project / "index.html").write_text(
            "<html><body>" + "".join(links) + "</body></html>"
        )
    url, server = serve_directory(root)
    yield f"{url}simple"
    server.terminate()
    server.wait(10)


@pytest.fixture
def registries(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(the admin's registry, the stand-in for the public ones), each host:port."""
    started = []
    for name in ("dest", "source"):
        (tmp_path / name).mkdir()
        started.append(start_registry(tmp_path / name))
    yield started[0][0], started[1][0]
    for _, process in started:
        process.terminate()
        process.wait(10)


@pytest.fixture
def buildah(tmp_path: Path) -> Iterator[list[str]]:
    where = tmp_path / "buildah"
    command = buildah_command(where)
    yield command
    subprocess.run([*command, "rm", "--all"], capture_output=True, check=False)
    subprocess.run(["rm", "-rf", str(where)], check=False)


def python_base(root: Path) -> Path:
    """real_registry's base with what the Dockerfiles use beyond it: `python -m venv`
    (ensurepip and Debian's bundled wheels) and busybox's mkdir and chown."""
    base_root(root)
    stdlib = Path(f"/usr/lib/python3.{sys.version_info.minor}")
    subprocess.run(["cp", "-a", str(stdlib / "ensurepip"), str(root / stdlib.relative_to("/"))], check=True)
    (root / "usr/share").mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", "/usr/share/python-wheels", str(root / "usr/share/")], check=True)
    for tool in ("mkdir", "chown"):
        (root / "bin" / tool).symlink_to((root / "bin/sh").readlink())
    return root


def configmap_images(config: Any) -> list[str]:
    """The images paddlecloud.yaml names (keys ending in `image`), non-empty."""
    if isinstance(config, dict):
        return [
            found
            for key, value in config.items()
            for found in (
                [value] if key.endswith("image") and isinstance(value, str) else configmap_images(value)
            )
            if found
        ]
    return []


def referenced_images(objects: list[dict[str, Any]]) -> set[str]:
    images: set[str] = set()
    for obj in objects:
        if obj["kind"] in ("Deployment", "StatefulSet"):
            pod = obj["spec"]["template"]["spec"]
            images |= {c["image"] for c in [*pod.get("initContainers", ()), *pod["containers"]]}
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == FULLNAME:
            images |= set(configmap_images(yaml.safe_load(obj["data"]["paddlecloud.yaml"])))
    return images


def crane(docker_config: Path, *args: str) -> str:
    done = subprocess.run(
        [str(CRANE), *args, "--insecure"],
        capture_output=True,
        text=True,
        env={"DOCKER_CONFIG": str(docker_config), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, f"crane {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def test_make_images_pushes_every_image_the_chart_uses_and_helm_installs_with_them(
    real_kube: RealKube, registries: tuple[str, str], buildah: list[str], index: str, tmp_path: Path
) -> None:
    destination, source = registries
    login = {"auth": base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}
    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps({"auths": {destination: login, source: login}}))
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker/config.json").write_text(auth.read_text())
    push_base(buildah, python_base(tmp_path / "base"), f"{source}/base/python:3.11", "images")
    kaniko = put_image(source, "kaniko/executor", "v1.23.2", "kaniko")
    for repository, tag in (("library/mongo", "8.0"), ("library/python", "3.11-slim"), ("busybox", "1.36")):
        put_image(source, repository, tag, repository)

    prefix = f"{destination}/lab"
    settings = {
        "REGISTRY": prefix,
        "INSECURE": "1",
        "REGISTRY_AUTH_FILE": str(auth),
        "PYTHON_IMAGE": f"{source}/base/python:3.11",
        "PIP_INDEX_URL": index,
        "ENGINE": "buildah",
        "BUILDAH_GLOBAL": shlex.join(buildah[1:]),
        "BUILDAH_FLAGS": "--isolation chroot",
        "MONGO_SOURCE": f"{source}/library/mongo:8.0",
        "KANIKO_SOURCE": f"{source}/kaniko/executor:v1.23.2@{kaniko}",
        "PYTHON_SOURCE": f"{source}/library/python:3.11-slim",
        "BUSYBOX_SOURCE": f"{source}/busybox:1.36",
    }
    done = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-C",
            str(REPO),
            "images",
            *(f"{k}={v}" for k, v in settings.items()),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"make images failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    print(done.stdout)  # shown with -s: each step's command and seconds
    sets = re.findall(r"^\s*--set (\S+)", done.stdout, re.MULTILINE)
    assert f"jobs.kubernetes.defaultImage={prefix}/runtime:0.1.0" in sets, done.stdout[-3000:]

    namespace = f"img-{secrets.token_hex(3)}"
    builds = f"{namespace}-builds"
    # The kaniko builder, so that the chart names its executor, base and init images too.
    sets += [
        "builder.backend=kaniko",
        f"builder.kaniko.registry={destination}",
        f"builder.kaniko.namespace={builds}",
        f"builder.kaniko.push.username={USER}",
        f"builder.kaniko.push.password={PASSWORD}",
    ]
    home = tmp_path / "helm"
    objects = chart.render(real_kube.cluster.admin_kubeconfig, home, "default", namespace, *sets)
    images = referenced_images(objects)
    # The platform, runtime, MongoDB, executor, pusher, builds' base and init images at least.
    assert len(images) >= 7, images
    docker_config = tmp_path / "docker"
    for image in sorted(images):
        assert image.startswith(f"{prefix}/"), f"the chart still pulls {image} from outside the registry"
        crane(docker_config, "digest", image)  # fails the test where the registry lacks it
    executor = next(i for i in images if "/kaniko" in i)
    assert executor.endswith(f"@{kaniko}") and crane(docker_config, "digest", executor) == kaniko
    # The pusher the chart names: the platform image plus crane, run as uid 1000.
    assert f"{prefix}/pusher:0.1.0" in images, images
    pusher = json.loads(crane(docker_config, "config", f"{prefix}/pusher:0.1.0"))
    assert pusher["config"]["User"] == "1000:1000"

    admin = real_kube.cluster.admin
    # The release's namespace; the chart makes the builds' one (builder.kaniko.createNamespace).
    admin.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
    try:
        flags = [arg for s in sets for arg in ("--set", s)]
        kubeconfig = real_kube.cluster.admin_kubeconfig
        installed = chart.helm(kubeconfig, home, "install", RELEASE, str(CHART), "-n", namespace, *flags)
        assert installed.returncode == 0, installed.stderr
        assert "STATUS: deployed" in installed.stdout
        gateway = admin.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{FULLNAME}-gateway")
        assert gateway["spec"]["template"]["spec"]["containers"][0]["image"] == f"{prefix}/paddlecloud:0.1.0"
    finally:
        chart.helm(real_kube.cluster.admin_kubeconfig, home, "uninstall", RELEASE, "-n", namespace)
        for name in (namespace, builds):
            admin.request("DELETE", f"/api/v1/namespaces/{name}")
