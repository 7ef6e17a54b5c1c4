"""The kubernetes backend's verdict on a job, one row per case: what the watch cache
holds (owner, the trainers' Indexed Job, pods, the namespace's Warning Events), what
the store recorded, and the state, reason and times the judge gives."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from paddlecloud.jobs.kube.judge import Observed, Recorded, Rules, Verdict, judge
from paddlecloud.jobs.kube.names import COMPLETION_INDEX, INDEX_FAILURES, LABEL_ROLE
from paddlecloud.jobs.spec import JobSpec

NOW = datetime(2026, 11, 27, 12, 0, 0, tzinfo=UTC)
NOW_TEXT = "2026-11-27T12:00:00.000Z"
AN_HOUR_AGO = "2026-11-27T11:00:00Z"
RULES = Rules(max_evictions=3, image_pull_timeout_seconds=300)
OWNER: dict[str, Any] = {"kind": "ConfigMap", "metadata": {"name": "j", "namespace": "ns"}}


def spec(**fields: Any) -> JobSpec:
    return JobSpec.model_validate({"name": "j", "package": "/pfs/dc1/home/alice/pkg", **fields})


def trainers(condition: str | None = None, **extra: Any) -> dict[str, Any]:
    """The trainers' Indexed Job, with `condition` True (Complete, Failed) if given."""
    conditions = [
        {"type": condition, "status": "True", "lastTransitionTime": "2026-11-27T11:59:00Z", **extra}
    ]
    return {
        "kind": "Job",
        "metadata": {"name": "j-trainer", "namespace": "ns", "uid": "uid-j-trainer"},
        "status": {"conditions": conditions if condition else []},
    }


def running(started: str = "2026-11-27T11:30:00Z") -> dict[str, Any]:
    return {"running": {"startedAt": started}}


def ended(code: int, reason: str = "Error", started: str = "2026-11-27T11:30:00Z") -> dict[str, Any]:
    finished = "2026-11-27T11:31:00Z"
    return {"terminated": {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": finished}}


def pod(
    role: str,
    index: int,
    state: dict[str, Any] | None = None,
    *,
    last: dict[str, Any] | None = None,
    restarts: int = 0,
    failures: int = 0,
    created: str = "2026-11-27T11:29:00Z",
    **status: Any,
) -> dict[str, Any]:
    """A pod of the job: a trainer (of the Indexed Job, `failures` before it) or a
    parameter server (of the StatefulSet), its main container in `state`."""
    name = f"j-{role}-{index}" + (f"-{failures}" if role == "trainer" else "")
    labels = {LABEL_ROLE: role}
    annotations = {}
    if role == "trainer":
        annotations = {COMPLETION_INDEX: str(index), INDEX_FAILURES: str(failures)}
    container = {"name": role, "image": "paddle:1", "restartCount": restarts, "state": state or {}}
    if last is not None:
        container["lastState"] = last
    meta = {
        "name": name,
        "namespace": "ns",
        "uid": f"uid-{name}",
        "creationTimestamp": created,
        "labels": labels,
    }
    return {
        "metadata": {**meta, "annotations": annotations},
        "status": {"containerStatuses": [container] if state is not None else [], **status},
    }


def waiting(reason: str, message: str) -> dict[str, Any]:
    return {"waiting": {"reason": reason, "message": message}}


def warning(reason: str, about: str, message: str, when: str = "2026-11-27T11:50:00Z") -> dict[str, Any]:
    """A Warning Event about the object whose name is `about` (its uid: `uid-<name>`)."""
    involved = {"name": about, "namespace": "ns", "uid": f"uid-{about}"}
    return {
        "reason": reason,
        "type": "Warning",
        "message": message,
        "lastTimestamp": when,
        "involvedObject": involved,
    }


QUOTA = 'pods "j-trainer-0-x" is forbidden: exceeded quota: paddlecloud-quota, requested: cpu=1'
PSA = 'pods "j-trainer-0-x" is forbidden: violates PodSecurity "restricted:latest": hostPath volumes'
LIMITS = 'pods "j-trainer-0-x" is forbidden: maximum cpu usage per Container is 500m, but limit is 1'
NO_ACCOUNT = (
    'pods "j-trainer-0-x" is forbidden: error looking up service account ns/default: '
    'serviceaccount "default" not found'
)
DENIED = (
    "pods \"j-trainer-0-x\" is forbidden: ValidatingAdmissionPolicy 'gpu' with binding 'b' denied request"
)
MOUNT = 'MountVolume.SetUp failed for volume "pfs" : mount failed: exit status 32'


def unscheduled(message: str) -> list[dict[str, Any]]:
    return [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]


@dataclass
class Case:
    name: str
    observed: Observed
    expect: Verdict
    spec: dict[str, Any] = field(default_factory=dict)
    recorded: Recorded = field(default_factory=lambda: Recorded("PENDING"))


OOM = "exited with 137 (OOMKilled: it used more than its 2Gi of memory — raise -memory)"
CASES = [
    Case(
        "owner deleted",
        Observed(None, trainers(), [pod("trainer", 0, running())]),
        Verdict(
            "FAILED",
            "its Kubernetes objects were deleted outside PaddleCloud",
            "2026-11-27T11:30:00Z",
            NOW_TEXT,
        ),
    ),
    Case(
        "no pods yet",
        Observed(OWNER, None, []),
        Verdict("PENDING", "waiting for the trainers' pods to start"),
    ),
    Case(
        "pending unschedulable",
        Observed(OWNER, trainers(), [pod("trainer", 0, conditions=unscheduled("0/3 nodes are available"))]),
        Verdict("PENDING", "cannot be scheduled: 0/3 nodes are available (pod j-trainer-0-0)"),
    ),
    Case(
        "image pull back-off, still within its time",
        Observed(
            OWNER, trainers(), [pod("trainer", 0, waiting("ImagePullBackOff", "Back-off"), created=NOW_TEXT)]
        ),
        Verdict("PENDING", "cannot pull image paddle:1: Back-off"),
    ),
    Case(
        "image pull back-off past image_pull_timeout_seconds",
        Observed(
            OWNER, trainers(), [pod("trainer", 0, waiting("ErrImagePull", "not found"), created=AN_HOUR_AGO)]
        ),
        Verdict("FAILED", "cannot pull image paddle:1: not found (for more than 300 s)", None, NOW_TEXT),
    ),
    Case(
        "waiting for the parameter servers",
        Observed(
            OWNER, None, [pod("pserver", 0, running(), conditions=[{"type": "Ready", "status": "True"}])]
        ),
        Verdict("PENDING", "waiting for the parameter servers: 1 of 2 ready"),
        spec={"pservers": 2},
    ),
    Case(
        "the quota refuses the pods: the Events are read",
        Observed(OWNER, trainers(), [], warnings=(warning("FailedCreate", "j-trainer", QUOTA),)),
        Verdict("PENDING", f"the namespace's quota refuses its pods: {QUOTA}", read_events=True),
    ),
    Case(
        "Pod Security refuses the pods: waiting would not change it",
        Observed(OWNER, trainers(), [], warnings=(warning("FailedCreate", "j-trainer", PSA),)),
        Verdict("FAILED", f"Kubernetes refuses its pods (Pod Security admission): {PSA}", None, NOW_TEXT),
    ),
    Case(
        "a LimitRange's maximum refuses the parameter servers' pods: lasting",
        Observed(
            OWNER,
            trainers(),
            [],
            {"metadata": {"uid": "uid-j-pserver"}},
            (warning("FailedCreate", "j-pserver", LIMITS),),
        ),
        Verdict("FAILED", f"the namespace's LimitRange refuses its pods: {LIMITS}", None, NOW_TEXT),
        spec={"pservers": 1},
    ),
    Case(
        "an admission policy denies the pods: lasting",
        Observed(OWNER, trainers(), [], warnings=(warning("FailedCreate", "j-trainer", DENIED),)),
        Verdict("FAILED", f"an admission policy refuses its pods: {DENIED}", None, NOW_TEXT),
    ),
    Case(
        "the newest refusal tells: the ServiceAccount not made yet, after the quota's",
        Observed(
            OWNER,
            trainers(),
            [],
            warnings=(
                warning("FailedCreate", "j-trainer", NO_ACCOUNT, "2026-11-27T11:55:00Z"),
                warning("FailedCreate", "j-trainer", QUOTA),
            ),
        ),
        Verdict(
            "PENDING",
            f"its pods wait for the namespace's ServiceAccount to be made: {NO_ACCOUNT}",
            read_events=True,
        ),
    ),
    Case(
        "a refusal of an earlier job's object of the same name (another uid) says nothing",
        Observed(
            OWNER,
            trainers(),
            [],
            warnings=({**warning("FailedCreate", "j-trainer", PSA), "involvedObject": {"uid": "earlier"}},),
        ),
        Verdict("PENDING", "waiting for the trainers' pods to start", read_events=True),
    ),
    Case(
        "a refusal from before the pods were made says nothing now",
        Observed(
            OWNER,
            trainers(),
            [pod("trainer", 0, {})],
            warnings=(warning("FailedCreate", "j-trainer", QUOTA),),
        ),
        Verdict("PENDING", "waiting for the trainers' pods to start", read_events=True),
    ),
    Case(
        "a volume that does not mount: the pod waits, and the job with it",
        Observed(
            OWNER,
            trainers(),
            [pod("trainer", 0, waiting("ContainerCreating", ""), phase="Pending")],
            warnings=(warning("FailedMount", "j-trainer-0-0", MOUNT),),
        ),
        Verdict(
            "PENDING", f"a volume of its pods does not mount: {MOUNT} (pod j-trainer-0-0)", read_events=True
        ),
    ),
    Case(
        "an unschedulable pod says why from its condition; no Event is read",
        Observed(
            OWNER, trainers(), [pod("trainer", 0, None, conditions=unscheduled("0/1 nodes are available"))]
        ),
        Verdict("PENDING", "cannot be scheduled: 0/1 nodes are available (pod j-trainer-0-0)"),
    ),
    Case(
        "fewer pods than asked, no refusal seen yet: the Events are read",
        Observed(OWNER, trainers(), [pod("trainer", 0, {})]),
        Verdict("PENDING", "waiting for the trainers' pods to start", read_events=True),
        spec={"trainers": 2},
    ),
    Case(
        "a trainer runs",
        Observed(OWNER, trainers(), [pod("trainer", 0, running())]),
        Verdict("RUNNING", "running", "2026-11-27T11:30:00Z"),
    ),
    Case(
        "between a trainer's attempts a RUNNING job stays RUNNING",
        Observed(OWNER, trainers(), [pod("trainer", 0, ended(1))]),
        Verdict("RUNNING", "trainer-0 restarting", "2026-11-27T11:00:00+00:00"),
        recorded=Recorded("RUNNING", "trainer-0 restarting", "2026-11-27T11:00:00+00:00"),
    ),
    Case(
        "succeeded",
        Observed(OWNER, trainers("Complete"), [pod("trainer", 0, ended(0, "Completed"))]),
        Verdict("SUCCEEDED", "every trainer exited 0", "2026-11-27T11:30:00Z", "2026-11-27T11:59:00Z"),
    ),
    Case(
        "OOMKilled past its restarts",
        Observed(
            OWNER,
            trainers("Failed", reason="FailedIndexes"),
            [
                pod("trainer", 0, ended(137, "OOMKilled"), failures=0, created="2026-11-27T11:29:00Z"),
                pod("trainer", 0, ended(137, "OOMKilled"), failures=1, created="2026-11-27T11:32:00Z"),
            ],
        ),
        Verdict("FAILED", f"trainer-0 {OOM} after 1 restart", "2026-11-27T11:30:00Z", "2026-11-27T11:59:00Z"),
        spec={"memory": "2Gi", "max_restarts": 1},
    ),
    Case(
        "killed by a signal, not out of its memory",
        Observed(OWNER, trainers("Failed"), [pod("trainer", 0, ended(137))]),
        Verdict(
            "FAILED",
            "trainer-0 exited with 137 (killed, often out of memory — raise -memory) after 0 restarts",
            "2026-11-27T11:30:00Z",
            "2026-11-27T11:59:00Z",
        ),
    ),
    Case(
        "the trainers' Job failed with no trainer exit seen",
        Observed(OWNER, trainers("Failed", message="Job has reached the specified backoff limit"), []),
        Verdict(
            "FAILED",
            "the trainers failed: Job has reached the specified backoff limit",
            None,
            "2026-11-27T11:59:00Z",
        ),
    ),
    Case(
        "a parameter server lost past its restarts",
        Observed(
            OWNER,
            trainers(),
            [pod("pserver", 0, running(), last=ended(139), restarts=1), pod("trainer", 0, running())],
        ),
        Verdict(
            "FAILED",
            "pserver-0 exited with 139 (segmentation fault) after 0 restarts",
            "2026-11-27T11:30:00Z",
            NOW_TEXT,
        ),
        spec={"pservers": 1},
    ),
    Case(
        "evicted more often than max_evictions",
        Observed(OWNER, trainers(), [pod("trainer", 0, failures=i, reason="Evicted") for i in range(4)]),
        Verdict("FAILED", "its pods were evicted 4 times (more than 3)", None, NOW_TEXT),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_judge(case: Case) -> None:
    assert judge(spec(**case.spec), case.recorded, case.observed, RULES, NOW) == case.expect
