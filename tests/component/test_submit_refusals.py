"""A refused submit leaves nothing, on both backends and for every role: each way the jobs
service can refuse a submit, and after it no job is recorded, listed or started, and its
name is free. (An admin's job used to be recorded PENDING before its package was checked
with the owner's rights, then refused 422: a phantom that kept its name until a restart.)"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from test_jobs_api import Jobs, start_jobs

from kube_fake import FakeKube
from paddlecloud.builder.app import create_app as create_builder
from paddlecloud.common.keys import STORE
from paddlecloud.common.store import Job, Token, User
from paddlecloud.common.store.models import SUCCEEDED, utcnow
from paddlecloud.gateway.accounts import hash_token
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


@pytest.fixture(params=["local", "kubernetes"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def kube(backend: str) -> Iterator[FakeKube | None]:
    """The cluster of the kubernetes backend; asked for before the services, so that it
    outlives them. Nothing of a refused job may be in it."""
    if backend != "kubernetes":
        yield None
        return
    with FakeKube() as fake:
        yield fake
        assert not fake.list("configmaps"), "a refused job's objects were created"


async def platform(
    tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any, kube: FakeKube | None, builder: str
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
                "kubeconfig": str(kube.write_kubeconfig(tmp_path / "kubeconfig")),
                "datacenters": {"dc1": {"kind": "pvc", "claim_name": "pfs"}},
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
    case: str, kube: FakeKube | None, tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any
) -> None:
    refusal = REFUSALS[case]
    await check(await platform(tmp_path, aiohttp_server, aiohttp_client, kube, refusal.builder), refusal)


async def test_a_job_the_backend_can_never_run_is_refused_and_leaves_nothing(
    backend: str, kube: FakeKube | None, tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any
) -> None:
    refusal = Refusal(ADMIN, TOO_LARGE[backend], 422, "", next(iter(TOO_LARGE[backend])))
    await check(await platform(tmp_path, aiohttp_server, aiohttp_client, kube, "real"), refusal)


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
