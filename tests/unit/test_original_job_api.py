"""The original Python API (`paddlecloud.job`): each keyword mapped onto today's spec, or refused by name."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from paddlecloud import job
from paddlecloud.job import CephFSVolume, OriginalArgumentRefused, PaddleJob, dist_train


def original(**overrides: Any) -> PaddleJob:
    """The original docs' call, every keyword as they spell it."""
    keywords: dict[str, Any] = {
        "job_name": "word2vec",
        "entry_point": "python train.py",
        "memory": "1G",
        "cpu_nums": 1,
        "runtime_image": "paddlepaddle/paddle",
        "pservers": 2,
        "trainers": 3,
        "gpu_nums": 0,
        "use_gpu": False,
        "trainer_package_path": "./word2vec",
        "namespace": "alice",
    }
    keywords.update(overrides)
    return PaddleJob(**keywords)


def test_the_original_keywords_map_onto_todays_spec() -> None:
    with pytest.warns(UserWarning, match="namespace='alice' is not sent"):
        spec = original().spec()
    assert spec == {
        "name": "word2vec",
        "package": "./word2vec",
        "entry": "python train.py",
        "image": "paddlepaddle/paddle",
        "trainers": 3,
        "pservers": 2,
        "cpu": 1,
        "gpu": 0,
        "memory": "1G",
    }


def test_the_originals_defaults_and_other_spellings() -> None:
    bare = PaddleJob(job_name="j", trainer_package="/pfs/dc1/home/alice/pkg", entry_point="python t.py")
    spec = bare.spec()
    assert (spec["trainers"], spec["pservers"], spec["gpu"], spec["memory"]) == (3, 2, 0, "1G")
    assert "cpu" not in spec and "image" not in spec  # the server's defaults
    other = PaddleJob(
        "j",
        "./pkg",
        "python t.py",
        cpu_num=2,
        base_image="img",
        use_gpu=True,
        num_parameter_servers=4,
        trainer_mem="2G",
        pserver_cpu=1,
        pserver_mem="512M",
        input="data",
        output="out",
        env={"K": "V"},
    ).spec()
    assert (other["cpu"], other["image"], other["gpu"], other["pservers"]) == (2, "img", 1, 4)
    assert (other["memory"], other["pscpu"], other["psmemory"]) == ("2G", 1, "512M")  # trainer_mem wins
    assert (other["input"], other["output"], other["env"]) == ("data", "out", {"K": "V"})
    assert PaddleJob("j", "./p", gpu_nums=2, use_gpu=True).spec()["gpu"] == 2
    assert (
        original(namespace=None).cpu_nums == 1
        and original(namespace=None).runtime_image == "paddlepaddle/paddle"
    )


def test_a_cephfs_volume_keeps_the_originals_defaults_and_is_refused_by_name_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    volume = CephFSVolume(monitors_addr="192.168.1.123:6789,192.168.1.124:6789", environ={})
    assert volume.monitors == ["192.168.1.123:6789", "192.168.1.124:6789"]
    assert (volume.user, volume.secret_name, volume.mount_path, volume.path) == (
        "admin",
        "cephfs-secret",
        "/data",
        "/",
    )
    from_env = CephFSVolume(environ={"CEPHFS_MONITORS_ADDR": "m:6789", "CEPHFS_MOUNT_PATH": "/mnt/cephfs"})
    assert (from_env.monitors, from_env.mount_path) == (["m:6789"], "/mnt/cephfs")
    quoted = CephFSVolume(
        monitors_addr="m:6789", user="admin", secret_name="cephfs-secret", mount_path="/mnt/cephfs", path="/"
    )
    built = original(namespace=None, cephfs_volume=quoted)  # building never fails on an original keyword
    with pytest.raises(
        OriginalArgumentRefused, match=r"^cephfs_volume: a CephFS volume only means"
    ) as refused:
        built.spec()
    assert refused.value.argument == "cephfs_volume" and "/pfs/<datacenter>/home/<you>" in str(refused.value)


@pytest.mark.parametrize(
    ("overrides", "argument"),
    [
        ({"cpu_num": 2}, "cpu_nums"),  # cpu_nums=1 and cpu_num=2
        ({"base_image": "other"}, "runtime_image"),
        ({"gpu_nums": 2}, "use_gpu"),  # use_gpu=False
        ({"trainer_package_path": None}, "trainer_package_path"),
    ],
)
def test_contradictions_and_gaps_are_refused_by_name(overrides: dict[str, Any], argument: str) -> None:
    with pytest.raises(OriginalArgumentRefused) as refused:
        original(namespace=None, **overrides).spec()
    assert refused.value.argument == argument and str(refused.value).startswith(f"{argument}: ")


class FakeClient:
    def __init__(self) -> None:
        self.submitted: list[dict[str, Any]] = []

    def submit_package(self, spec: dict[str, Any], package: str, *, dry_run: bool = False) -> Any:
        self.submitted.append({**spec, "_package": package})
        return None


def test_dist_train_trains_in_the_job_and_submits_from_outside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []
    assert dist_train(lambda: ran.append("trained") or "done", environ={"PADDLE_JOB_NAME": "j"}) == "done"
    assert dist_train(lambda: ran.append("again"), environ={"RUNNING_ON_CLOUD": "YES"}) is None
    assert ran == ["trained", "again"]

    class V2Trainer:
        def train(self, reader: Any, num_passes: int = 1, event_handler: Any = None) -> str:
            return f"v2 {reader} x{num_passes}"

    assert dist_train(V2Trainer(), "r", num_passes=4, environ={"PADDLE_JOB_NAME": "j"}) == "v2 r x4"

    # From outside a job: the first design's keywords, and the running script as the package.
    script = tmp_path / "pkg" / "train.py"
    script.parent.mkdir()
    script.write_text("print('hi')\n")
    monkeypatch.setattr(sys, "argv", [str(script)])
    client = FakeClient()
    dist_train(
        V2Trainer(),
        "r",
        num_passes=5,
        client=client,  # type: ignore[arg-type]
        environ={},
        k8s_job="quickstart",
        trainers=8,
        num_parameter_servers=4,
        input="/quickstart/input",
        output="/quickstart/output",
        base_image="paddlepaddle/paddle:0.10.rc2",
        use_gpu=False,
    )
    [sent] = client.submitted
    assert (sent["name"], sent["trainers"], sent["pservers"], sent["passes"]) == ("quickstart", 8, 4, 5)
    assert (sent["input"], sent["output"], sent["image"]) == (
        "/quickstart/input",
        "/quickstart/output",
        "paddlepaddle/paddle:0.10.rc2",
    )
    assert (sent["entry"], sent["_package"]) == ("python train.py", str(script.parent))
    with pytest.raises(OriginalArgumentRefused, match=r"^k8s_token: "):
        dist_train(client=client, environ={}, job_name="x", k8s_token="tls.pem")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="does not know bogus"):
        dist_train(client=client, environ={}, job_name="x", bogus=1)  # type: ignore[arg-type]
    assert job.on_cloud({"PADDLE_JOB_NAME": "x"}) and not job.on_cloud({})
