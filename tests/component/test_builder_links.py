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

from paddlecloud.builder.backend import BuildRequest
from paddlecloud.builder.local import LAST_USED, META, PLATFORM_PTH, LocalBuildBackend, _Failed
from support import make_config

# test_builder's fixtures: a builder service behind a gateway, its settings, a wheelhouse.
builds, builder_settings = test_builder.builds, test_builder.builder_settings
wheelhouse = test_builder.wheelhouse
SITE = "<site-packages>"
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


@pytest.fixture
async def evil_url(
    builder_settings: dict[str, Any], canaries: dict[str, Path], aiohttp_server: Any, tmp_path: Path
) -> str:
    """The planting sdist's URL, on a server on the host's loopback that the build may reach:
    its port is one of the builder's find-links (a build's network namespace reaches the
    index's ports and no other, docs/security.md), as a lab's own index would be."""
    links = {
        "_paddlecloud_platform.pth": str(canaries["pth"]),
        "paddlecloud-env.json": str(canaries["meta"]),
        "paddlecloud-last-used": str(canaries["stamp"]),
    }
    sdist = make_evil_sdist(tmp_path, {}, PLANTING.format(links=json.dumps(links))).read_bytes()

    async def serve(request: web.Request) -> web.Response:
        return web.Response(body=sdist)

    async def page(request: web.Request) -> web.Response:
        return web.Response(text="<html><body></body></html>", content_type="text/html")

    served = web.Application()
    served.router.add_get("/evilpkg-1.0.tar.gz", serve)
    served.router.add_get("/links/", page)
    server = await aiohttp_server(served)
    builder_settings.update(find_links=[*builder_settings["find_links"], str(server.make_url("/links/"))])
    return str(server.make_url("/evilpkg-1.0.tar.gz"))


async def test_symlinks_a_build_plants_at_the_builders_own_files_change_nothing_and_fail_it(
    evil_url: str, builds: Builds, canaries: dict[str, Path]
) -> None:
    before = {name: path.read_bytes() for name, path in canaries.items() if path.exists()}
    url = evil_url

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


# -- each place the builder writes, one at a time (no pip: the environment is laid out here) --


@pytest.fixture
async def backend(tmp_path: Path) -> LocalBuildBackend:
    config = make_config(tmp_path, pfs={"datacenter": "dc1"}, builder={"work_dir": str(tmp_path / "builder")})
    built = LocalBuildBackend(config)
    await built.open()
    return built


def laid_out(backend: LocalBuildBackend, build_id: str) -> Path:
    """A build directory as pip's run may leave it: a venv's site-packages, nothing else."""
    env = backend.work_dir / "builds" / build_id
    (env / backend._site_packages).mkdir(parents=True)
    return env


@pytest.mark.parametrize("where", [f"{SITE}/{PLATFORM_PTH}", META, LAST_USED])
async def test_a_link_at_a_file_the_builder_writes_is_refused(
    backend: LocalBuildBackend, canaries: dict[str, Path], where: str
) -> None:
    env = laid_out(backend, "b1")
    (env / where.replace(SITE, str(backend._site_packages))).symlink_to(canaries["pth"])
    before = canaries["pth"].read_bytes()
    with pytest.raises(_Failed, match="refused: the build left something at"):
        backend._finish(env, BuildRequest("b1", "k1", "alice", "x\n"))
    assert canaries["pth"].read_bytes() == before


async def test_a_link_on_the_way_to_site_packages_is_refused(
    backend: LocalBuildBackend, canaries: dict[str, Path]
) -> None:
    env = laid_out(backend, "b1")
    site = env / backend._site_packages
    site.rmdir()
    site.symlink_to(canaries["pth"].parent)  # the .pth would land among root's files
    with pytest.raises(_Failed, match="refused: the build left a symlink on the way"):
        backend._finish(env, BuildRequest("b1", "k1", "alice", "x\n"))
    assert sorted(p.name for p in canaries["pth"].parent.iterdir()) == ["config.yaml", "internal.secret"]


async def test_lookup_neither_reads_nor_touches_through_links(
    backend: LocalBuildBackend, canaries: dict[str, Path]
) -> None:
    env = laid_out(backend, "b1")
    backend._finish(env, BuildRequest("b1", "k1", "alice", "x\n"))
    backend._publish("k1", env)
    assert await backend.lookup("k1", touch=True) is not None
    os.utime(canaries["pth"], (1, 1))
    (env / LAST_USED).unlink()
    (env / LAST_USED).symlink_to(canaries["pth"])
    await backend.lookup("k1", touch=True)
    assert canaries["pth"].stat().st_mtime == 1
    (env / META).unlink()
    (env / META).symlink_to(canaries["meta"])
    assert await backend.lookup("k1", touch=True) is None
    assert await backend.entries() == []
