"""`paddlecloud server --server-config`: what the server sets itself, and what no service
knows, are refused at start with the key named, before anything starts or is written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from paddlecloud.common.platform import StartupError, read_server_config

OWNED = {
    "jobs": {"port": 9000},
    "pfs": {"port": 9001},
    "builder": {"port": 9002, "host": "0.0.0.0"},  # noqa: S104 - what a user might write
    "gateway": {"port": 9003, "jobs_url": "http://10.0.0.1:1"},
    "internal": {"secret": "mine"},
}


def written(tmp_path: Path, settings: object) -> Path:
    config = tmp_path / "server.yaml"
    config.write_text(yaml.safe_dump(settings))
    return config


def test_the_server_refuses_a_config_setting_its_own_ports_naming_each(tmp_path: Path) -> None:
    data = tmp_path / "data"
    argv = [sys.executable, "-m", "paddlecloud", "server", "--data-dir", str(data), "--port", "0"]
    # A server that wrongly starts runs until this guard stops it: the test then fails.
    done = subprocess.run(
        [*argv, "--server-config", str(written(tmp_path, OWNED))],
        capture_output=True,
        text=True,
        env={**os.environ, "HOME": str(tmp_path)},
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    named = ("jobs.port", "pfs.port", "builder.port", "builder.host", "gateway.jobs_url", "internal.secret")
    for key in named:
        assert key in done.stderr, done.stderr
    assert "gateway.port (use --port)" in done.stderr
    assert "free loopback port" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not data.exists()  # refused before anything was made


def test_the_same_from_the_environment_is_refused_naming_the_variable(tmp_path: Path) -> None:
    with pytest.raises(StartupError, match=r"PADDLECLOUD_PFS_PORT \(paddlecloud server gives"):
        read_server_config(None, {"PADDLECLOUD_PFS_PORT": "9000"}, "dc1")
    with pytest.raises(StartupError, match=r"PADDLECLOUD_GATEWAY_BUILDER_URL"):
        read_server_config(written(tmp_path, {}), {"PADDLECLOUD_GATEWAY_BUILDER_URL": "http://x"}, "dc1")


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"jobs": {"prot": 9000}}, "jobs.prot"),
        ({"jbos": {"sandbox": "off"}}, "jbos"),
        ({"jobs": {"sandbox": "sometimes"}}, "jobs.sandbox"),
        ({"jobs": 5}, "config jobs: a section is a mapping"),
    ],
)
def test_unknown_or_bad_settings_are_refused_by_name(tmp_path: Path, settings: object, named: str) -> None:
    with pytest.raises(StartupError) as refused:
        read_server_config(written(tmp_path, settings), {}, "dc1")
    assert named in str(refused.value) and str(refused.value).startswith("--server-config ")


def test_what_the_server_leaves_to_the_config_is_kept(tmp_path: Path) -> None:
    settings = {"jobs": {"sandbox": "off", "grace_seconds": 2.0}, "pfs": {"root": str(tmp_path / "pfs")}}
    assert read_server_config(written(tmp_path, settings), {}, "dc1") == settings


def test_a_config_is_checked_under_the_servers_own_datacenter_name(tmp_path: Path) -> None:
    # Valid only for the datacenter `--datacenter-name` gives, not the config's default one.
    volumes = {"dc9": {"kind": "pvc", "claim_name": "pfs"}}
    settings = {"jobs": {"backend": "kubernetes", "kubernetes": {"datacenters": volumes}}}
    assert read_server_config(written(tmp_path, settings), {}, "dc9") == settings
    with pytest.raises(StartupError, match="no volume for datacenter 'dc1'"):
        read_server_config(written(tmp_path, settings), {}, "dc1")
