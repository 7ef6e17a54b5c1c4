"""The local backend's launch plan: the runtime contract of every worker, in every style."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from paddlecloud.jobs.contract import (
    FLEET_ENV,
    KUBEFLOW_ENV,
    PADDLE_V1_ENV,
    PADDLECLOUD_ENV,
    PYTORCH_ENV,
    RESERVED_ENV,
)
from paddlecloud.jobs.local.plan import HostPlan, Plan, Ports, Role, WorkerPaths, build_plan
from support import plan_launch

PS_PORTS = [40001, 40002]
TRAINER_PORTS = [41001, 41002, 41003]
MASTER_PORT = 42000


# What the host decides, as opposed to what the job asks (every other override).
HOST_FIELDS = {"devices", "grace_seconds", "port_timeout_seconds", "restart_delay_seconds", "network"}


def make_plan(
    *, ports: list[int] = PS_PORTS, trainer_ports: list[int] = TRAINER_PORTS, **overrides: Any
) -> Plan:
    fields: dict[str, Any] = {
        "name": "mnist-1",
        "entry": "python train.py --epochs 2",
        "trainers": 3,
        "pservers": 2,
        "passes": 5,
        "env": {"LEARNING_RATE": "0.1"},
        "max_restarts": 2,
    }
    decided = {key: overrides.pop(key) for key in HOST_FIELDS & overrides.keys()}
    launch = plan_launch()
    # Not validated: a plan must refuse what a submit would have, should it get it.
    launch = replace(launch, spec=launch.spec.model_copy(update=fields | overrides))
    paths = WorkerPaths(
        pfs_home="/pfs/dc1/home/alice",
        output="/pfs/dc1/home/alice/jobs/mnist-1",
        package="/srv/jobs/mnist-1/package",
    )
    ports_held = Ports(tuple(ports), tuple(trainer_ports), MASTER_PORT)
    return build_plan(launch, HostPlan(paths=paths, ports=ports_held, **decided))


def test_workers_are_named_ordered_and_run_the_entry_through_a_shell() -> None:
    plan = make_plan()
    assert [w.name for w in plan.workers] == ["pserver-0", "pserver-1", "trainer-0", "trainer-1", "trainer-2"]
    assert [w.port for w in plan.pservers] == PS_PORTS
    assert all(w.port is None for w in plan.trainers)
    for worker in plan.workers:
        assert worker.argv == ("/bin/sh", "-c", "python train.py --epochs 2")
        assert worker.cwd == "/srv/jobs/mnist-1/package"
        assert worker.host == "127.0.0.1"
    assert plan.max_restarts == 2
    assert plan.grace_seconds == 10


@pytest.mark.parametrize("name", [w.name for w in make_plan().workers])
def test_every_worker_gets_every_contract_variable(name: str) -> None:
    worker = next(w for w in make_plan().workers if w.name == name)
    expected = set(PADDLECLOUD_ENV + PADDLE_V1_ENV + FLEET_ENV + KUBEFLOW_ENV)
    if worker.role is Role.TRAINER:
        expected |= set(PYTORCH_ENV)
    else:
        assert not set(PYTORCH_ENV) & worker.env.keys(), "a pserver must not look like a torch rank"
    assert expected <= worker.env.keys()
    assert worker.env["LEARNING_RATE"] == "0.1"


def test_paddlecloud_style() -> None:
    for worker in make_plan().workers:
        env = worker.env
        assert env["PADDLE_JOB_NAME"] == "mnist-1"
        assert env["PADDLE_CLOUD_CURRENT_DATACENTER"] == "dc1"
        assert env["PADDLE_CLOUD_USER"] == "alice"
        assert env["PADDLE_CLOUD_PFS_HOME"] == "/pfs/dc1/home/alice"
        assert env["PADDLE_CLOUD_OUTPUT"] == "/pfs/dc1/home/alice/jobs/mnist-1"
        assert env["TRAINING_ROLE"] == worker.role.value
        assert env["TRAINER_ID"] == str(worker.index)
        assert env["TRAINERS"] == "3"
        assert env["PSERVERS"] == "2"
        assert env["ENTRY"] == "python train.py --epochs 2"
        assert env["TRAINER_PACKAGE"] == "/srv/jobs/mnist-1/package"
        assert env["NAMESPACE"] == ""


def test_paddle_v1_style() -> None:
    plan = make_plan(gpu=4)
    for worker in plan.workers:
        env = worker.env
        assert env["PADDLE_INIT_TRAINER_ID"] == str(worker.index)
        assert env["PADDLE_INIT_NUM_GRADIENT_SERVERS"] == "3"
        # A host list, as in the original: on one machine the same host, once per server.
        assert env["PADDLE_INIT_PSERVERS"] == "127.0.0.1,127.0.0.1"
        assert env["PADDLE_INIT_PORTS_NUM"] == "1"
        assert env["PADDLE_INIT_PORTS_NUM_FOR_SPARSE"] == "0"
        assert env["PADDLE_INIT_TRAINER_COUNT"] == "4"
        assert env["PADDLE_INIT_NUM_PASSES"] == "5"
        assert env["PADDLE_INIT_USE_GPU"] == "1"
    # A v1 server listens on its own port; a v1 trainer knows only the first server's.
    assert [w.env["PADDLE_INIT_PORT"] for w in plan.pservers] == ["40001", "40002"]
    assert {w.env["PADDLE_INIT_PORT"] for w in plan.trainers} == {"40001"}
    assert make_plan(gpu=0).workers[0].env["PADDLE_INIT_USE_GPU"] == "0"


def test_a_job_that_gives_no_passes_is_told_none() -> None:
    # The program's own default applies only while the variable is unset (issue 28).
    for worker in make_plan(passes=None).workers:
        assert "PADDLE_INIT_NUM_PASSES" not in worker.env


def test_fleet_style() -> None:
    plan = make_plan()
    for worker in plan.workers:
        env = worker.env
        assert env["PADDLE_PSERVERS_IP_PORT_LIST"] == "127.0.0.1:40001,127.0.0.1:40002"
        assert env["PADDLE_TRAINER_ENDPOINTS"] == "127.0.0.1:41001,127.0.0.1:41002,127.0.0.1:41003"
        assert env["PADDLE_TRAINERS_NUM"] == "3"
        assert env["PADDLE_TRAINER_ID"] == str(worker.index)
        assert env["POD_IP"] == "127.0.0.1"
    for worker, port in zip(plan.pservers, PS_PORTS, strict=True):
        assert worker.env["PADDLE_PORT"] == str(port)
        assert worker.env["PADDLE_CURRENT_ENDPOINT"] == f"127.0.0.1:{port}"
    for worker, port in zip(plan.trainers, TRAINER_PORTS, strict=True):
        assert worker.env["PADDLE_PORT"] == str(port)
        assert worker.env["PADDLE_CURRENT_ENDPOINT"] == f"127.0.0.1:{port}"


def test_pytorch_style_for_trainers() -> None:
    for worker in make_plan().trainers:
        env = worker.env
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["MASTER_PORT"] == str(MASTER_PORT)
        assert env["WORLD_SIZE"] == "3"
        assert env["RANK"] == str(worker.index)
        assert env["LOCAL_RANK"] == str(worker.index)
        assert env["LOCAL_WORLD_SIZE"] == "3"


def test_a_gpu_trainer_sees_only_its_own_devices_and_is_local_rank_0_among_them() -> None:
    # `torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))` must pick the trainer's own
    # GPU: with only its devices visible, trainer-2 asking for cuda:2 would fail.
    held = {"trainer-0": ["3"], "trainer-1": ["1"], "trainer-2": ["0"]}
    plan = make_plan(gpu=1, devices=held)
    for worker in plan.trainers:
        env = worker.env
        assert env["CUDA_VISIBLE_DEVICES"] == held[worker.name][0]
        assert (env["RANK"], env["WORLD_SIZE"]) == (str(worker.index), "3")
        assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("0", "1")
    for worker in plan.pservers:
        assert worker.env["CUDA_VISIBLE_DEVICES"] == "" and "LOCAL_RANK" not in worker.env


def test_kubeflow_paddlejob_style() -> None:
    for worker in make_plan().workers:
        env = worker.env
        assert env["PADDLE_JOB_ID"] == "mnist-1"
        assert env["PADDLE_NNODES"] == "3"
        assert env["PADDLE_SERVER_NUM"] == "2"
        assert env["PADDLE_TRAINER_NUM"] == "3"
        assert env["PADDLE_MASTER"] == f"127.0.0.1:{MASTER_PORT}"


def test_styles_agree_with_each_other() -> None:
    plan = make_plan()
    for worker in plan.workers:
        env = worker.env
        ids = {env["TRAINER_ID"], env["PADDLE_INIT_TRAINER_ID"], env["PADDLE_TRAINER_ID"]}
        assert ids == {str(worker.index)}
        counts = {
            env["TRAINERS"],
            env["PADDLE_INIT_NUM_GRADIENT_SERVERS"],
            env["PADDLE_TRAINERS_NUM"],
            env["PADDLE_TRAINER_NUM"],
            str(len(env["PADDLE_TRAINER_ENDPOINTS"].split(","))),
        }
        assert counts == {"3"}
        servers = {
            env["PSERVERS"],
            env["PADDLE_SERVER_NUM"],
            str(len(env["PADDLE_PSERVERS_IP_PORT_LIST"].split(","))),
            str(len(env["PADDLE_INIT_PSERVERS"].split(","))),
        }
        assert servers == {"2"}
        hosts = {endpoint.split(":")[0] for endpoint in env["PADDLE_PSERVERS_IP_PORT_LIST"].split(",")}
        assert hosts == set(env["PADDLE_INIT_PSERVERS"].split(",")) == {env["POD_IP"]}
        assert env["PADDLE_CURRENT_ENDPOINT"] == f"{env['POD_IP']}:{env['PADDLE_PORT']}"
        if worker.role is Role.TRAINER:
            assert env["RANK"] == env["TRAINER_ID"]
            assert env["WORLD_SIZE"] == env["TRAINERS"]
            assert env["PADDLE_MASTER"] == f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
            own = env["PADDLE_TRAINER_ENDPOINTS"].split(",")[worker.index]
            assert own == env["PADDLE_CURRENT_ENDPOINT"]
        else:
            own = env["PADDLE_PSERVERS_IP_PORT_LIST"].split(",")[worker.index]
            assert own == env["PADDLE_CURRENT_ENDPOINT"] == f"127.0.0.1:{worker.port}"
            assert env["PADDLE_INIT_PORT"] == str(worker.port)


def test_without_parameter_servers() -> None:
    plan = make_plan(pservers=0, ports=[], trainers=1, trainer_ports=[41001])
    (trainer,) = plan.workers
    assert trainer.env["PSERVERS"] == "0"
    assert trainer.env["PADDLE_PSERVERS_IP_PORT_LIST"] == ""
    assert trainer.env["PADDLE_INIT_PSERVERS"] == ""
    assert trainer.env["PADDLE_INIT_PORT"] == ""


def test_round_trips_through_json() -> None:
    plan = make_plan(grace_seconds=2.5, port_timeout_seconds=7, restart_delay_seconds=0.25, network="none")
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan
    assert again.to_dict() == plan.to_dict()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"ports": [40001]}, "one port per parameter server"),
        ({"trainer_ports": [41001]}, "one port per trainer"),
        ({"trainers": 0, "trainer_ports": []}, "trainers must be at least 1"),
        ({"max_restarts": -1}, "max_restarts"),
        ({"env": {"TRAINER_ID": "7", "RANK": "0"}}, "RANK, TRAINER_ID"),
    ],
)
def test_inconsistent_jobs_are_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_plan(**overrides)


def test_reserved_names_cover_every_style() -> None:
    assert {"NAMESPACE", "PADDLE_INIT_USE_GPU", "POD_IP", "LOCAL_WORLD_SIZE", "PADDLE_MASTER"} <= RESERVED_ENV
