"""The runtime contract's one function, `contract_env`: the job's input is part of it."""

from __future__ import annotations

from typing import Any

import pytest

from paddlecloud.jobs.contract import JobContract, contract_env


def job(**overrides: Any) -> JobContract:
    fields: dict[str, Any] = {
        "job_name": "mnist",
        "user": "alice",
        "datacenter": "dc1",
        "pfs_home": "/pfs/dc1/home/alice",
        "output": "/pfs/dc1/home/alice/jobs/mnist",
        "entry": "python train.py",
        "package_dir": "/job/package",
        "namespace": "",
        "passes": None,
        "use_gpu": False,
        "devices_per_trainer": 1,
        "pservers": [("127.0.0.1", 40001)],
        "trainers": [("127.0.0.1", 41001)],
        "master": ("127.0.0.1", 42000),
        "socket_ifname": "lo",
        "user_env": {"LEARNING_RATE": "0.1"},
    }
    return JobContract(**(fields | overrides))


def env_of(contract: JobContract, role: str) -> dict[str, str]:
    port = 40001 if role == "PSERVER" else 41001
    return contract_env(
        contract,
        role=role,
        index="0",
        host="127.0.0.1",
        port=port,
        local_rank="0",
        local_world_size=1,
        devices=(),
    )


@pytest.mark.parametrize("role", ["PSERVER", "TRAINER"])
def test_a_job_with_an_input_tells_every_worker_where_it_is(role: str) -> None:
    env = env_of(job(input="/pfs/dc1/home/alice/data"), role)
    assert env["PADDLE_CLOUD_INPUT"] == "/pfs/dc1/home/alice/data"
    assert env["PADDLE_CLOUD_OUTPUT"] == "/pfs/dc1/home/alice/jobs/mnist"
    assert env["LEARNING_RATE"] == "0.1"


@pytest.mark.parametrize("role", ["PSERVER", "TRAINER"])
def test_a_job_without_an_input_sets_no_input_variable(role: str) -> None:
    env = env_of(job(), role)
    assert "PADDLE_CLOUD_INPUT" not in env
    assert env["PADDLE_CLOUD_PFS_HOME"] == "/pfs/dc1/home/alice"
