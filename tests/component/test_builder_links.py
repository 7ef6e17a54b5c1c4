"""The review's attack on the local builder (issue 26, finding 1): a requirement served over
HTTP whose in-tree build backend plants symlinks where the builder, as root, writes its
own files. Real pip, real bubblewrap, a real sdist on a loopback server."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import test_builder
from aiohttp import web
from test_builder import Builds, make_evil_sdist

# test_builder's fixtures: a builder service behind a gateway, its settings, a wheelhouse.
builds, builder_settings = test_builder.builds, test_builder.builder_settings
wheelhouse = test_builder.wheelhouse
pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bubblewrap (make system-deps)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the attack is on a builder running as root"),
]

# Runs as the build's uid while pip builds the sdist: plants a link at each path the
# builder writes after pip (`.pth` in site-packages, metadata, stamp), then builds
# evilpkg's wheel, so that pip itself succeeds and the builder's own steps meet the links.
PLANTING = """
_build_wheel = build_wheel
LINKS = json.loads({links!r})


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    import sys
    site = os.path.join(sys.prefix, "lib", "python%d.%d" % sys.version_info[:2], "site-packages")
    for where, target in LINKS.items():
        os.symlink(target, os.path.join(site if where.endswith(".pth") else sys.prefix, where))
    return _build_wheel(wheel_directory, config_settings, metadata_directory)
"""


@pytest.fixture
def canaries(tmp_path: Path) -> dict[str, Path]:
    """Root-only files outside the build, and one root-only path that must stay absent."""
    secret = tmp_path / "root-only"
    secret.mkdir(mode=0o700)
    found = {"pth": secret / "internal.secret", "meta": secret / "config.yaml", "stamp": secret / "created"}
    found["pth"].write_bytes(b"the platform's internal secret\n")
    found["meta"].write_bytes(b"admin_password_file: /etc/whatever\n")
    for path in found.values():
        if path.exists():
            path.chmod(0o600)
    return found


async def test_symlinks_a_build_plants_at_the_builders_own_files_change_nothing_and_fail_it(
    builds: Builds, canaries: dict[str, Path], aiohttp_server: Any, tmp_path: Path
) -> None:
    before = {name: path.read_bytes() for name, path in canaries.items() if path.exists()}
    links = {
        "_paddlecloud_platform.pth": str(canaries["pth"]),
        "paddlecloud-env.json": str(canaries["meta"]),
        "paddlecloud-last-used": str(canaries["stamp"]),
    }
    sdist = make_evil_sdist(tmp_path, {}, PLANTING.format(links=json.dumps(links))).read_bytes()

    async def serve(request: web.Request) -> web.Response:
        return web.Response(body=sdist)

    served = web.Application()
    served.router.add_get("/evilpkg-1.0.tar.gz", serve)
    server = await aiohttp_server(served)
    url = server.make_url("/evilpkg-1.0.tar.gz")

    build = await builds.wait((await builds.post(f"evilpkg @ {url}\n"))["id"])

    assert {name: path.read_bytes() for name, path in canaries.items() if path.exists()} == before
    assert not canaries["stamp"].exists()
    assert sorted(p.name for p in canaries["pth"].parent.iterdir()) == ["config.yaml", "internal.secret"]
    logs = await builds.logs(build["id"])
    assert build["state"] == "FAILED", (build, logs)
    # The name in the reason is one pip never makes: the planting ran, and was refused.
    assert "refused" in build["reason"] and "_paddlecloud_platform.pth" in build["reason"], build
    assert "nothing was published" in logs
    assert builds.envs() == []
