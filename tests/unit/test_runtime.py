"""Runtime info: the runtime contract's variables, the local defaults, and clear errors."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from paddlecloud import runtime
from paddlecloud.runtime import Role, RuntimeInfo

TRAINER_ENV = {
    "PADDLE_JOB_NAME": "mnist",
    "PADDLE_CLOUD_CURRENT_DATACENTER": "dc1",
    "PADDLE_CLOUD_USER": "alice",
    "PADDLE_CLOUD_PFS_HOME": "/pfs/dc1/home/alice",
    "PADDLE_CLOUD_OUTPUT": "/pfs/dc1/home/alice/jobs/mnist/output",
    "TRAINING_ROLE": "TRAINER",
    "TRAINER_ID": "2",
    "TRAINERS": "3",
    "PSERVERS": "2",
    "PADDLE_PSERVERS_IP_PORT_LIST": "10.0.0.1:7164,mnist-pserver-1.mnist:7164",
    "PADDLE_CURRENT_ENDPOINT": "10.0.0.9:6170",
    "PADDLE_INIT_NUM_PASSES": "5",
}


def test_info_snapshot_of_a_trainer() -> None:
    assert runtime.info(TRAINER_ENV) == RuntimeInfo(
        in_paddlecloud=True,
        job_name="mnist",
        role=Role.TRAINER,
        trainer_id=2,
        trainer_count=3,
        pserver_endpoints=("10.0.0.1:7164", "mnist-pserver-1.mnist:7164"),
        current_endpoint="10.0.0.9:6170",
        datacenter="dc1",
        user="alice",
        pfs_home="/pfs/dc1/home/alice",
        output_dir="/pfs/dc1/home/alice/jobs/mnist/output",
        passes=5,
    )


def test_functions_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in TRAINER_ENV.items():
        monkeypatch.setenv(name, value)
    assert runtime.trainer_id() == 2
    assert runtime.trainer_count() == 3
    assert runtime.role() is Role.TRAINER
    assert runtime.pserver_endpoints() == ["10.0.0.1:7164", "mnist-pserver-1.mnist:7164"]
    assert runtime.job_name() == "mnist"
    assert runtime.output_dir().endswith("/output")


def test_a_pserver_has_no_trainer_id() -> None:
    env = {k: v for k, v in TRAINER_ENV.items() if k != "TRAINER_ID"} | {"TRAINING_ROLE": "PSERVER"}
    snapshot = runtime.info(env)
    assert snapshot.role is Role.PSERVER
    assert snapshot.trainer_id is None
    with pytest.raises(RuntimeError, match=r"TRAINER_ID or PADDLE_TRAINER_ID .* of PaddleCloud job 'mnist'"):
        runtime.trainer_id(env)


def test_run_by_hand_is_a_single_trainer() -> None:
    snapshot = runtime.info({})
    assert not snapshot.in_paddlecloud
    assert (snapshot.trainer_id, snapshot.trainer_count, snapshot.role) == (0, 1, Role.TRAINER)
    assert snapshot.pserver_endpoints == ()
    assert snapshot.datacenter is None and snapshot.passes is None


@pytest.mark.parametrize(
    ("function", "variable"),
    [
        (runtime.job_name, "PADDLE_JOB_NAME"),
        (runtime.datacenter, "PADDLE_CLOUD_CURRENT_DATACENTER"),
        (runtime.user, "PADDLE_CLOUD_USER"),
        (runtime.pfs_home, "PADDLE_CLOUD_PFS_HOME"),
        (runtime.output_dir, "PADDLE_CLOUD_OUTPUT"),
    ],
)
def test_values_without_a_local_default_say_why(
    function: Callable[[dict[str, str]], str], variable: str
) -> None:
    with pytest.raises(RuntimeError, match=f"not running under PaddleCloud: {variable} is not set"):
        function({})


@pytest.mark.parametrize("missing", ["TRAINERS", "TRAINING_ROLE", "TRAINER_ID"])
def test_under_paddlecloud_a_missing_variable_is_an_error_not_a_default(missing: str) -> None:
    env = {k: v for k, v in TRAINER_ENV.items() if k != missing}
    with pytest.raises(RuntimeError, match=missing):
        runtime.info(env)


def test_fleet_and_v2_names_are_understood() -> None:
    env = {
        "PADDLE_TRAINER_ID": "1",
        "PADDLE_TRAINERS_NUM": "4",
        "PADDLE_INIT_PSERVERS": "10.0.0.1,10.0.0.2",
        "PADDLE_INIT_PORT": "7164",
        "PADDLE_INIT_TRAINER_COUNT": "8",  # threads per trainer in Paddle v1, not trainers
    }
    assert runtime.trainer_id(env) == 1
    assert runtime.trainer_count(env) == 4
    assert runtime.pserver_endpoints(env) == ["10.0.0.1:7164", "10.0.0.2:7164"]
    assert runtime.trainer_count({"PADDLE_INIT_NUM_GRADIENT_SERVERS": "6"}) == 6


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TRAINER_ID": "x"}, "TRAINER_ID='x' is not an integer"),
        ({"TRAINER_ID": "3", "TRAINERS": "3"}, "trainer id 3 is out of range for 3 trainers"),
        ({"TRAINERS": "0"}, "TRAINERS='0' must be at least 1"),
        ({"TRAINING_ROLE": "MASTER"}, "neither PSERVER nor TRAINER"),
        ({"PADDLE_PSERVERS_IP_PORT_LIST": "10.0.0.1"}, "not a host:port endpoint"),
        ({"PADDLE_CURRENT_ENDPOINT": "h:99999"}, "not a host:port endpoint"),
        ({"PSERVERS": "2"}, "PADDLE_PSERVERS_IP_PORT_LIST is not set"),
    ],
)
def test_malformed_values_are_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        runtime.info(env)


def test_no_pservers_means_an_empty_list() -> None:
    assert (
        runtime.pserver_endpoints(TRAINER_ENV | {"PSERVERS": "0", "PADDLE_PSERVERS_IP_PORT_LIST": ""}) == []
    )
    assert runtime.role({"TRAINING_ROLE": "pserver"}) is Role.PSERVER
