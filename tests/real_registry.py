"""A real registry and a real image builder on loopback, for the Kaniko backend's tests and
bench: Debian's `docker-registry` (the CNCF distribution registry) with htpasswd auth, and
`buildah` (vfs storage, chroot isolation: needs root) with a base image made from the host's
Python. No import of the test helpers: bench/builder.py uses this too.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
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


def missing() -> str | None:
    """Why the real registry and builder cannot run here, or None."""
    if os.geteuid() != 0:
        return "buildah with --isolation chroot needs root"
    tools = (("buildah", "buildah"), ("docker-registry", "docker-registry"), ("htpasswd", "apache2-utils"))
    for tool, package in tools:
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian package {package}; `make system-deps`)"
    version = f"python3.{sys.version_info.minor}"
    if not (STDLIB / "lib-dynload").is_dir() or not Path(f"/usr/bin/{version}").exists():
        return f"the base image is made from Debian's {version}, which is not installed"
    if shutil.which("busybox") is None:
        return "busybox is not installed (the base image's /bin/sh)"
    return None


def start_registry(where: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """docker-registry on a free loopback port with htpasswd auth for USER; its host:port."""
    htpasswd = subprocess.run(
        ["htpasswd", "-Bbn", USER, PASSWORD], check=True, capture_output=True, text=True
    ).stdout
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
