"""A real registry and a real image builder on loopback, for the Kaniko backend's tests and
bench: Debian's `docker-registry` (the CNCF distribution registry) with htpasswd auth, and
`buildah` (vfs storage, chroot isolation: needs root) with a base image made from the host's
Python; and `put_image`, which pushes a small image through the Registry API as Kaniko's
push would, for tests whose Kaniko is a scripted pod. No import of the test helpers:
bench/builder.py uses this too.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

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


def registry_missing() -> str | None:
    """Why the real registry cannot run here, or None."""
    for tool, package in (("docker-registry", "docker-registry"), ("htpasswd", "apache2-utils")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian package {package}; `make system-deps`)"
    return None


def missing() -> str | None:
    """Why the real registry and builder cannot run here, or None."""
    if os.geteuid() != 0:
        return "buildah with --isolation chroot needs root"
    if shutil.which("buildah") is None:
        return "buildah is not installed (Debian package buildah; `make system-deps`)"
    if (why := registry_missing()) is not None:
        return why
    version = f"python3.{sys.version_info.minor}"
    if not (STDLIB / "lib-dynload").is_dir() or not Path(f"/usr/bin/{version}").exists():
        return f"the base image is made from Debian's {version}, which is not installed"
    if shutil.which("busybox") is None:
        return "busybox is not installed (the base image's /bin/sh)"
    return None


def start_registry(where: Path, users: dict[str, str] | None = None) -> tuple[str, subprocess.Popen[bytes]]:
    """docker-registry on a free loopback port with htpasswd auth for USER (and `users`,
    name → password); its host:port. Every user it knows may read and push anywhere."""
    htpasswd = "".join(
        subprocess.run(
            ["htpasswd", "-Bbn", name, password], check=True, capture_output=True, text=True
        ).stdout.strip()
        + "\n"
        for name, password in {USER: PASSWORD, **(users or {})}.items()
    )
    (where / "htpasswd").write_text(htpasswd)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = {
        "version": 0.1,
        "log": {"level": "error"},
        "storage": {"filesystem": {"rootdirectory": str(where / "data")}, "delete": {"enabled": True}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": "test"},
        "auth": {"htpasswd": {"realm": "basic-realm", "path": str(where / "htpasswd")}},
    }
    (where / "config.yml").write_text(json.dumps(config))  # YAML reads JSON
    with open(where / "registry.log", "wb") as errors:
        process = subprocess.Popen(
            ["docker-registry", "serve", str(where / "config.yml")], stdout=subprocess.DEVNULL, stderr=errors
        )
    deadline = time.monotonic() + 10
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1)
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                return f"127.0.0.1:{port}", process
        except OSError:
            pass
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            raise RuntimeError(
                f"docker-registry did not start: {(where / 'registry.log').read_text()[-2000:]}"
            )
        time.sleep(0.05)


def serve_directory(root: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """`root` served over http on a free loopback port (a wheelhouse or a package index for
    pip inside a build: pip trusts plain http on loopback); its URL, ending in /."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(root), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
            return f"http://127.0.0.1:{port}/", server
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise RuntimeError(f"http.server for {root} did not start") from None
            time.sleep(0.05)


def buildah_command(where: Path) -> list[str]:
    """buildah with storage of its own under `where` (vfs)."""
    return [
        "buildah",
        "--root",
        str(where / "root"),
        "--runroot",
        str(where / "run"),
        "--storage-driver",
        "vfs",
    ]


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
    push(buildah, f"localhost/base:{marker}", destination)


def push(buildah: list[str], image: str, destination: str) -> None:
    """Push a local image to the registry as the test user."""
    run(
        *buildah,
        "push",
        "--quiet",
        "--creds",
        f"{USER}:{PASSWORD}",
        "--tls-verify=false",
        image,
        f"docker://{destination}",
    )


# -- Pushing without a builder -----------------------------------------------------------

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"


def _registry_call(
    method: str, url: str, body: bytes | None, headers: dict[str, str], user: str, password: str
) -> tuple[int, dict[str, str]]:
    login = base64.b64encode(f"{user}:{password}".encode()).decode()
    # Always http://<loopback registry>: the callers build the URL.
    request = urllib.request.Request(  # noqa: S310
        url, data=body, method=method, headers={**headers, "Authorization": f"Basic {login}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


def _put_blob(host: str, repository: str, blob: bytes, user: str, password: str) -> str:
    """One blob by a monolithic upload (POST, then PUT with the digest); its digest."""
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    status, headers = _registry_call(
        "POST", f"http://{host}/v2/{repository}/blobs/uploads/", b"", {}, user, password
    )
    assert status == 202, f"starting an upload to {host}/{repository}: {status}"
    location = headers["Location"]
    if location.startswith("/"):
        location = f"http://{host}{location}"
    separator = "&" if "?" in location else "?"
    status, _ = _registry_call(
        "PUT",
        f"{location}{separator}digest={digest}",
        blob,
        {"Content-Type": "application/octet-stream"},
        user,
        password,
    )
    assert status == 201, f"uploading {digest} to {host}/{repository}: {status}"
    return digest


def put_image(
    host: str, repository: str, tag: str, marker: str, *, user: str = USER, password: str = PASSWORD
) -> str:
    """Push a small image to `host/repository:tag` through the Registry API v2, as Kaniko's
    push does (the layers and the config as blobs, then the manifest under the tag): one
    layer holding the file `marker` with `marker` in it, so images with other markers have
    other digests. The manifest's digest."""
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as archive:
        data = marker.encode()
        info = tarfile.TarInfo("marker")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    layer = gzip.compress(tar.getvalue(), mtime=0)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Labels": {"marker": marker}},
            "rootfs": {
                "type": "layers",
                "diff_ids": [f"sha256:{hashlib.sha256(tar.getvalue()).hexdigest()}"],
            },
        }
    ).encode()
    layer_digest = _put_blob(host, repository, layer, user, password)
    config_digest = _put_blob(host, repository, config, user, password)
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_V2,
            "config": {
                "mediaType": "application/vnd.docker.container.image.v1+json",
                "size": len(config),
                "digest": config_digest,
            },
            "layers": [
                {
                    "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                    "size": len(layer),
                    "digest": layer_digest,
                }
            ],
        }
    ).encode()
    status, headers = _registry_call(
        "PUT",
        f"http://{host}/v2/{repository}/manifests/{tag}",
        manifest,
        {"Content-Type": MANIFEST_V2},
        user,
        password,
    )
    assert status == 201, f"pushing the manifest {host}/{repository}:{tag}: {status}"
    return headers["Docker-Content-Digest"]


def has_tag(host: str, repository: str, tag: str, *, user: str = USER, password: str = PASSWORD) -> bool:
    """Whether the registry has a manifest under `repository:tag` (a HEAD, as a pull starts)."""
    status, _ = _registry_call(
        "HEAD",
        f"http://{host}/v2/{repository}/manifests/{tag}",
        None,
        {"Accept": MANIFEST_V2},
        user,
        password,
    )
    assert status in (200, 404), f"HEAD {host}/{repository}:{tag}: {status}"
    return status == 200
