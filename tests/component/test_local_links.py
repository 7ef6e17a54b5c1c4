"""The local jobs backend as root under what users can write (issue 26, finding 1): a link
planted in a home or on the way to a package is changed itself or refused, never followed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from test_jobs_api import Jobs, start_jobs

from paddlecloud.common.beneath import LinkRefused
from paddlecloud.jobs.keys import MANAGER
from paddlecloud.jobs.local.supervisor import prepare_workdir


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    secret = tmp_path / "root-only"
    secret.mkdir(mode=0o700)
    (secret / "internal.secret").write_text("the platform's secret\n")
    return secret / "internal.secret"


def test_a_package_reached_through_a_swapped_link_is_not_listed(tmp_path: Path, canary: Path) -> None:
    home = tmp_path / "home" / "alice"
    home.mkdir(parents=True)
    # The package was a directory when the job was prepared; a job swapped it since.
    (home / "pkg").symlink_to(canary.parent)
    workdir = tmp_path / "work" / "trainer-0"
    with pytest.raises(LinkRefused):
        prepare_workdir(
            workdir, home / "pkg", trainer_id=0, trainer_count=1, seen_at="/pfs/x/pkg", within=home
        )
    assert not (workdir / "internal.secret").is_symlink()  # root listed nothing of root's for the job


def test_a_package_in_the_home_is_listed_beneath_it(tmp_path: Path) -> None:
    home = tmp_path / "home" / "alice"
    (home / "pkg").mkdir(parents=True)
    (home / "pkg" / "train.py").write_text("print('hi')\n")
    workdir = tmp_path / "work" / "trainer-0"
    prepare_workdir(
        workdir, home / "pkg", trainer_id=3, trainer_count=4, seen_at="/pfs/dc1/home/alice/pkg", within=home
    )
    assert os.readlink(workdir / "train.py") == "/pfs/dc1/home/alice/pkg/train.py"
    assert (workdir / "trainer_id").read_text() == "3\n"


async def test_a_link_in_a_home_given_to_its_user_is_changed_itself(
    tmp_path: Path, canary: Path, aiohttp_server: Any, aiohttp_client: Any
) -> None:
    jobs: Jobs = await start_jobs(tmp_path, aiohttp_server, aiohttp_client)
    backend = jobs.server_app[MANAGER].backend  # type: ignore[attr-defined]
    if not backend._sandbox.switches_uid:
        pytest.skip("the sandbox cannot switch uids here (bubblewrap missing, or not root)")
    package = jobs.package({"train.py": "print('ran')\n"})
    (jobs.home() / "planted").symlink_to(canary)
    (jobs.home() / "planted-dir").symlink_to(canary.parent)
    await jobs.submit({"name": "first", "package": package})
    job = await jobs.wait("first", ("SUCCEEDED", "FAILED"))
    assert job["state"] == "SUCCEEDED", job["reason"]
    uid = jobs.home().stat().st_uid
    assert uid != 0 and (jobs.home() / "planted").lstat().st_uid == uid
    for path in (canary, canary.parent):
        assert (path.stat().st_uid, path.stat().st_gid) == (0, 0), path
