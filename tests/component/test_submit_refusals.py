"""A refused submit leaves nothing, on both backends and for every role: each way the jobs
service can refuse a submit, and after it no job is recorded, listed or started, and its
name is free. (An admin's job used to be recorded PENDING before its package was checked
with the owner's rights, then refused 422: a phantom that kept its name until a restart.)

The kubernetes backend runs on the real control plane (tests/kube_real) with the rights
the Helm chart gives the jobs service. There, too, a job whose objects the API server
refuses (an invalid Job spec, from manifests mutated here: 422) fails naming the field
and leaves nothing behind."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from test_jobs_api import Jobs, start_jobs

from kube_real import KubeClient
from kube_real.chart import ChartRights, install_rights
from kube_real.fixtures import RealKube
from paddlecloud.builder.app import create_app as create_builder
from paddlecloud.common.keys import STORE
from paddlecloud.common.store import Job, Token, User
from paddlecloud.common.store.models import SUCCEEDED, utcnow
from paddlecloud.gateway.accounts import hash_token
from paddlecloud.jobs.kube import manifests
from paddlecloud.jobs.kube.names import LABEL_JOB, namespace_for
from support import free_port, make_config

ADMIN = "root"
TRAIN = {"train.py": "print('hello')\n"}


@dataclass(frozen=True)
class Refusal:
    """One way to be refused: who submits what (over a valid spec), and the answer."""

    who: str
    spec: dict[str, Any]
    status: int
    says: str  # in the problem's detail
    field: str | None = None
    prepare: Callable[[Jobs, str], Awaitable[None] | None] | None = None
    builder: str = "real"  # "real": a builder answers; "down": nothing listens there


def bobs_files(jobs: Jobs, who: str) -> None:
    jobs.package(TRAIN, name="pkg", user="bob")


def a_plain_file(jobs: Jobs, who: str) -> None:
    (jobs.home(who) / "notes.txt").write_text("not a package\n")


def requirements(text: bytes) -> Callable[[Jobs, str], None]:
    def write(jobs: Jobs, who: str) -> None:
        (jobs.home(who) / "pkg" / "requirements.txt").write_bytes(text)

    return write


async def a_job_named_taken(jobs: Jobs, who: str) -> None:
    store = jobs.client.app[STORE]
    spec = {"name": "taken", "package": "/pfs/dc1/home/alice/pkg"}
    await store.create_job(Job(id="a" * 32, owner="alice", name="taken", state=SUCCEEDED, spec=spec))


BOBS = "/pfs/dc1/home/bob/pkg"
REFUSALS = {
    # The reported one: an admin's package in another user's home.
    "admin-package-in-another-home": Refusal(
        ADMIN, {"package": BOBS}, 422, "you may only use your own home", "package", bobs_files
    ),
    "admin-output-in-another-home": Refusal(
        ADMIN, {"output": "/pfs/dc1/home/bob/out"}, 422, "with its owner's rights", "output"
    ),
    "admin-input-in-another-home": Refusal(
        ADMIN, {"input": BOBS}, 422, "with its owner's rights", "input", bobs_files
    ),
    "package-in-another-home": Refusal(
        "alice", {"package": BOBS}, 422, "your own home", "package", bobs_files
    ),
    "bad-spec": Refusal("alice", {"trainers": 0}, 422, "", "trainers"),
    "unknown-datacenter": Refusal("alice", {"datacenter": "dc9"}, 422, "unknown datacenter", "datacenter"),
    "unknown-registry": Refusal("alice", {"registry": "nope"}, 422, "no registry named", "registry"),
    "missing-input": Refusal("alice", {"input": "nothing/here"}, 422, "does not exist", "input"),
    "name-taken": Refusal("alice", {"name": "taken"}, 409, "already exists", None, a_job_named_taken),
    "over-quota": Refusal("alice", {"trainers": 9}, 403, "does not fit your quota"),
    "admin-package-missing": Refusal(ADMIN, {"package": "gone"}, 422, "not found on PFS", "package"),
    "package-neither-directory-nor-archive": Refusal(
        "alice", {"package": "notes.txt"}, 422, "must be a directory", "package", a_plain_file
    ),
    "requirements-not-text": Refusal(
        "alice", {}, 422, "is not UTF-8", "package", requirements(b"\xff\xfe\n")
    ),
    "requirements-the-builder-refuses": Refusal(
        "alice", {}, 422, "--index-url", "package", requirements(b"--index-url http://example.invalid/\n")
    ),
    "admin-builder-down": Refusal(
        ADMIN, {}, 503, "cannot be built now", None, requirements(b"tinypkg==2.0\n"), builder="down"
    ),
}
# What this backend can never run: more GPUs than the machine has; a pod larger than a
# namespace admits.
TOO_LARGE: dict[str, dict[str, Any]] = {"local": {"gpu": 1}, "kubernetes": {"cpu": "300"}}


# The kubernetes backend's tests run where the session's control plane runs (one
# pytest-xdist worker: tests/conftest.py groups the tests that ask for `real_kube`).
@pytest.fixture(params=["local", pytest.param("kubernetes", marks=pytest.mark.xdist_group("kube-real"))])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# Every kind a job makes, by the API path of its collection in a namespace.
JOB_KINDS = (
    "/api/v1/namespaces/{ns}/configmaps",
    "/api/v1/namespaces/{ns}/services",
    "/api/v1/namespaces/{ns}/secrets",
    "/api/v1/namespaces/{ns}/pods",
    "/apis/apps/v1/namespaces/{ns}/statefulsets",
    "/apis/batch/v1/namespaces/{ns}/jobs",
    "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
)


@dataclass
class Cluster:
    """The real control plane as one test's jobs service sees it: the chart's rights for
    the service (in a namespace of the test's) and the prefix of its users' namespaces."""

    admin: KubeClient
    rights: ChartRights
    prefix: str

    def namespaces(self) -> list[str]:
        """The users' namespaces the service made."""
        items = self.admin.get("/api/v1/namespaces")["items"]
        return [n["metadata"]["name"] for n in items if n["metadata"]["name"].startswith(self.prefix)]

    def objects(self, namespace: str, job: str) -> list[str]:
        """What is left in `namespace` of the job's objects."""
        found = []
        for path in JOB_KINDS:
            listing = self.admin.get(path.format(ns=namespace), query={"labelSelector": f"{LABEL_JOB}={job}"})
            found += [f"{path.rsplit('/', 1)[1]}/{o['metadata']['name']}" for o in listing["items"]]
        return found


@contextmanager
def cluster(real_kube: RealKube, tmp_path: Path) -> Iterator[Cluster]:
    """The jobs service's rights as the chart renders them, in a namespace of this test's,
    and a prefix of its own for the users' namespaces; both removed afterwards."""
    token = secrets.token_hex(3)
    rights = install_rights(real_kube.cluster, tmp_path, f"pcjobs-{token}")
    made = Cluster(real_kube.cluster.admin, rights, f"t{token}-")
    try:
        yield made
    finally:
        for namespace in made.namespaces():
            made.admin.request("DELETE", f"/api/v1/namespaces/{namespace}")
        rights.remove()


@pytest.fixture
def kube(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster | None]:
    """The cluster of the kubernetes backend; asked for before the services, so that it
    outlives them."""
    if backend != "kubernetes":
        yield None
        return
    # Asked for here, by the kubernetes tests only: the local ones run where no control
    # plane is built.
    with cluster(request.getfixturevalue("real_kube"), tmp_path) as made:
        yield made


async def platform(
    tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any, kube: Cluster | None, builder: str
) -> Jobs:
    """pfs, jobs (on `kube`'s cluster, or local), a builder (or none: `down`) and a
    gateway, with users alice (a small quota), bob (none) and the admin."""
    if builder == "down":
        builder_url = f"http://127.0.0.1:{free_port()}"
    else:
        sections = {"pfs": {"datacenter": "dc1"}, "builder": {"work_dir": str(tmp_path / "builder")}}
        server = await aiohttp_server(create_builder(make_config(tmp_path, **sections)))
        builder_url = str(server.make_url(""))
    settings: dict[str, Any] = {"gpus": []}
    if kube is not None:
        settings = {
            "backend": "kubernetes",
            "kubernetes": {
                "kubeconfig": str(kube.rights.kubeconfig),
                **kube.rights.settings,
                "namespace_prefix": kube.prefix,
                # hostPath: a pvc datacenter needs a claim in each user's namespace.
                "datacenters": {"dc1": {"kind": "hostpath", "host_path": "/srv/paddlecloud-pfs"}},
                "watch_timeout_seconds": 5,
                "max_backoff_seconds": 1,
            },
        }
    jobs = await start_jobs(tmp_path, aiohttp_server, aiohttp_client, builder_url=builder_url, **settings)
    store = jobs.client.app[STORE]
    await store.create_user(User(ADMIN, "!unused", admin=True))
    token = f"pc_{secrets.token_urlsafe(32)}"
    await store.add_token(Token(hash_token(token), ADMIN, expires_at=utcnow() + timedelta(hours=1)))
    jobs.headers[ADMIN] = {"Authorization": f"Bearer {token}"}
    return jobs


async def names_listed(jobs: Jobs, who: str) -> list[str]:
    resp = await jobs.call("GET", "jobs", who, params={"all": "1"})
    assert resp.status == 200, await resp.text()
    return [job["name"] for job in (await resp.json())["jobs"]]


@pytest.mark.parametrize("case", list(REFUSALS), ids=list(REFUSALS))
async def test_a_refused_submit_leaves_no_job_and_its_name_free(
    case: str, kube: Cluster | None, tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any
) -> None:
    refusal = REFUSALS[case]
    await check(await platform(tmp_path, aiohttp_server, aiohttp_client, kube, refusal.builder), refusal)
    if kube is not None:
        assert not kube.namespaces(), "a refused job's namespace was made"


async def test_a_job_the_backend_can_never_run_is_refused_and_leaves_nothing(
    backend: str, kube: Cluster | None, tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any
) -> None:
    refusal = Refusal(ADMIN, TOO_LARGE[backend], 422, "", next(iter(TOO_LARGE[backend])))
    await check(await platform(tmp_path, aiohttp_server, aiohttp_client, kube, "real"), refusal)
    if kube is not None:
        assert not kube.namespaces(), "a refused job's namespace was made"


def _invalid_podreplacementpolicy(job: dict[str, Any]) -> None:
    # With a podFailurePolicy (the trainers' Job has one), only Failed is allowed.
    job["spec"]["podReplacementPolicy"] = "TerminatingOrFailed"


def _invalid_maxfailedindexes(job: dict[str, Any]) -> None:
    job["spec"]["maxFailedIndexes"] = job["spec"]["completions"] + 1


@pytest.mark.parametrize(
    ("mutation", "says"),
    [
        (
            _invalid_podreplacementpolicy,
            'spec.podReplacementPolicy: Unsupported value: "TerminatingOrFailed"',
        ),
        (
            _invalid_maxfailedindexes,
            "spec.maxFailedIndexes: Invalid value: 2: must be less than or equal to completions",
        ),
    ],
    ids=["podReplacementPolicy", "maxFailedIndexes"],
)
async def test_a_job_spec_the_api_server_refuses_fails_naming_the_field_and_leaves_nothing(
    mutation: Callable[[dict[str, Any]], None],
    says: str,
    real_kube: RealKube,
    tmp_path: Path,
    aiohttp_server: Any,
    aiohttp_client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The trainers' Job, mutated past what the API server's validation admits: it answers
    422 naming the field, the job FAILS with those words, and the objects made before the
    Job (its owner, Service and NetworkPolicy) go. Only a real API server validates so."""
    made = manifests._trainer_job

    def invalid(plan: manifests.JobPlan) -> dict[str, Any]:
        job = made(plan)
        mutation(job)
        return job

    monkeypatch.setattr(manifests, "_trainer_job", invalid)
    with cluster(real_kube, tmp_path) as kube:
        jobs = await platform(tmp_path, aiohttp_server, aiohttp_client, kube, "real")
        await jobs.submit({"name": "invalid", "package": jobs.package(TRAIN)})
        job = await jobs.wait("invalid", ("FAILED", "SUCCEEDED", "RUNNING"))
        assert job["state"] == "FAILED", job
        assert job["reason"].startswith("Kubernetes refused the job: create Job invalid-trainer: "), job
        assert says in job["reason"], job["reason"]
        namespace = namespace_for("alice", kube.prefix)
        deadline = time.monotonic() + 60
        while left := kube.objects(namespace, "invalid"):
            assert time.monotonic() < deadline, f"the refused job's objects are still there: {left}"
            await asyncio.sleep(0.2)


async def check(jobs: Jobs, refusal: Refusal) -> None:
    who = refusal.who
    own = jobs.package(TRAIN, name="pkg", user=who)
    if refusal.prepare is not None:
        prepared = refusal.prepare(jobs, who)
        if prepared is not None:
            await prepared
    before = [job.name async for job in all_jobs(jobs)]
    spec = {"name": "refused", "package": own, **refusal.spec}
    problem = await jobs.submit(spec, who=who, status=refusal.status)
    assert refusal.says in problem["detail"], problem
    if refusal.field is not None:
        assert refusal.field in {e["field"] for e in problem.get("errors", [])}, problem

    # Nothing recorded, listed or started...
    assert [job.name async for job in all_jobs(jobs)] == before
    assert sorted(await names_listed(jobs, who)) == sorted(before if who == "alice" else [])
    assert not any(jobs.work_dir.glob("*/*")), "a refused job's directory was made"
    # ... and the name is free: the same name with a spec that passes every check.
    name = spec["name"]
    valid = {"name": name, "package": own}
    (jobs.home(who) / "pkg" / "requirements.txt").unlink(missing_ok=True)
    answer = await jobs.call("POST", "jobs", who, json=valid, params={"dry_run": "1"})
    body = await answer.json()
    if name == "taken":
        assert answer.status == 409, body  # the job that held it still does, unchanged
    else:
        assert answer.status == 200 and body["job"]["name"] == name, body


async def all_jobs(jobs: Jobs) -> AsyncIterator[Job]:
    page, _ = await jobs.client.app[STORE].list_jobs(None, states=None, limit=500)
    for job in page:
        yield job
