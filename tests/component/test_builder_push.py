"""The kaniko build's pusher (`python -m paddlecloud.builder.push`) for real: crane (built by
`make crane`) pushing a tarball to Debian's docker-registry on loopback with htpasswd auth,
with the credentials where the build pod mounts them (DOCKER_CONFIG).

The tarball lies in a volume that the executor, which ran user code, could write: a
symbolic link there (to the credentials, say) or a directory (an OCI layout whose blobs
link to the credentials) is refused and nothing is pushed; a real image tarball is pushed
and its digest printed. The tarball is made by `crane pull --format tarball`, the same
docker-archive shape Kaniko's `--tar-path` writes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from real_registry import PASSWORD, USER, has_tag, put_image, registry_missing, start_registry

from paddlecloud.common.dockerconfig import Credentials, dockerconfigjson

ROOT = Path(__file__).resolve().parents[2]


def crane_binary() -> str | None:
    done = subprocess.run(
        [str(ROOT / "scripts/crane.sh"), "binary"], capture_output=True, text=True, check=False
    )
    path = done.stdout.strip()
    return path if path and os.access(path, os.X_OK) else None


CRANE = crane_binary()
pytestmark = [
    pytest.mark.skipif(registry_missing() is not None, reason=str(registry_missing())),
    pytest.mark.skipif(CRANE is None, reason="crane is not built (`make crane`)"),
]


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    where = tmp_path / "registry"
    where.mkdir()
    host, process = start_registry(where)
    yield host
    process.terminate()
    process.wait(10)


def pusher(tar: Path, destination: str, docker_config: Path) -> subprocess.CompletedProcess[str]:
    """The pusher as the build pod runs it: its command, DOCKER_CONFIG at the mounted Secret."""
    assert CRANE is not None
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "paddlecloud.builder.push",
            "--tar",
            str(tar),
            "--destination",
            destination,
            "--insecure",
            "--crane",
            CRANE,
        ],
        env={**os.environ, "DOCKER_CONFIG": str(docker_config)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_pusher_pushes_the_tarball_and_refuses_links_and_directories(
    registry: str, tmp_path: Path
) -> None:
    assert CRANE is not None
    secret = tmp_path / "push-config"  # the push Secret, mounted
    secret.mkdir()
    (secret / "config.json").write_text(dockerconfigjson({registry: Credentials(USER, PASSWORD)}))
    put_image(registry, "base/python", "3.11", "an image")
    volume = tmp_path / "image"  # the emptyDir the executor wrote
    volume.mkdir()
    made = subprocess.run(
        [CRANE, "--insecure", "pull", "--format", "tarball", f"{registry}/base/python:3.11", "real.tar"],
        cwd=volume,
        env={**os.environ, "DOCKER_CONFIG": str(secret)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr

    # A link to the credentials, left where the tarball should be: refused, not followed.
    (volume / "image.tar").symlink_to(secret / "config.json")
    refused = pusher(volume / "image.tar", f"{registry}/paddlecloud/runtime/alice:k1", secret)
    assert refused.returncode == 1, refused
    assert refused.stderr.strip().endswith("is a symbolic link; only the image tarball itself is pushed")
    # An OCI layout (a directory) whose blob links to the credentials: refused too.
    (volume / "image.tar").unlink()
    layout = volume / "image.tar"
    (layout / "blobs/sha256").mkdir(parents=True)
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    (layout / "blobs/sha256" / ("0" * 64)).symlink_to(secret / "config.json")
    refused = pusher(layout, f"{registry}/paddlecloud/runtime/alice:k1", secret)
    assert refused.returncode == 1, refused
    assert "is a directory; only an image tarball (a regular file) is pushed" in refused.stderr
    assert not has_tag(registry, "paddlecloud/runtime/alice", "k1"), "nothing was pushed"

    # The real tarball: pushed with the mounted credentials, its digest printed last.
    pushed = pusher(volume / "real.tar", f"{registry}/paddlecloud/runtime/alice:k1", secret)
    assert pushed.returncode == 0, pushed.stderr
    digest = pushed.stdout.strip().splitlines()[-1]
    assert digest.startswith("sha256:") and len(digest) == 71, pushed.stdout
    assert has_tag(registry, "paddlecloud/runtime/alice", "k1")
    # Without the credentials the registry refuses the push, and the pusher says so.
    (secret / "config.json").write_text(json.dumps({"auths": {}}))
    denied = pusher(volume / "real.tar", f"{registry}/paddlecloud/runtime/alice:k2", secret)
    assert denied.returncode == 1 and "push: refused: crane push failed" in denied.stderr, denied
