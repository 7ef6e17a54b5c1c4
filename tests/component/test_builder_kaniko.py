"""The builder service with `builder.backend: kaniko`, end to end against the fake cluster
(tests/kube_fake: API server, Job controller, scripted kubelet) and a fake registry that
authenticates with the bearer-token challenge (tests/registry_fake.py).

A build pod's script plays Kaniko: it prints what Kaniko and pip print and, on success,
"pushes" the key's tag to the registry. Every request the builder made is checked against
its declared rights (services/builder/rbac.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from registry_fake import FakeRegistry

from kube_fake import FakeKube, PodScript
from paddlecloud.builder import kaniko_manifests as manifests
from paddlecloud.builder import rbac
from paddlecloud.builder.app import create_app
from paddlecloud.builder.keys import BUILDER
from paddlecloud.common.dockerconfig import Credentials, dockerconfigjson
from paddlecloud.common.store import Registry
from support import make_config, signed

NS = "paddlecloud-builds"
REPO = "paddlecloud/runtime"
BASE_REPO = "base/python"
API = "/api/v1/builds"
FINAL = ("SUCCEEDED", "FAILED")
PIP_FAILURE = [
    "INFO[0001] RUN python3 -m pip install ...",
    "ERROR: Could not find a version that satisfies the requirement nosuchpkg==1.0 (from versions: none)",
    "ERROR: No matching distribution found for nosuchpkg==1.0",
    "error building image: error building stage: failed to execute command: waiting for process to exit: "
    "exit status 1",
]


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    with FakeKube() as fake:
        fake.create("namespaces", {"metadata": {"name": NS}})
        yield fake


@pytest.fixture
def registry() -> Iterator[FakeRegistry]:
    with FakeRegistry({"pusher": "push-secret", "bob": "bobs-secret"}) as fake:
        fake.put(BASE_REPO, "3.11", "base one")
        fake.put("private/base", "1", "private base")
        yield fake


def pushing(
    registry: FakeRegistry, lines: list[str] | None = None, **kwargs: Any
) -> Callable[..., PodScript]:
    """A pod script that succeeds like Kaniko and pushes the tag its Job names."""

    def script(pod: dict[str, Any]) -> PodScript:
        key = pod["metadata"]["annotations"][manifests.ANNOTATION_KEY]
        registry.put(REPO, key, f"runtime {key}")
        return PodScript(
            lines=lines
            or ["INFO[0000] Retrieving image", "Successfully installed tinypkg-1.0", "INFO[0005] Pushed"],
            **kwargs,
        )

    return script


def builder_config(tmp_path: Path, kube: FakeKube, registry: FakeRegistry, **kaniko: Any) -> Any:
    auth = tmp_path / "push-config.json"
    auth.write_text(dockerconfigjson({registry.host: Credentials("pusher", "push-secret")}))
    settings = {
        "registry": registry.host,
        "repository": REPO,
        "insecure_registries": [registry.host],
        "auth_file": str(auth),
        "base_image": f"{registry.host}/{BASE_REPO}:3.11",
        "namespace": NS,
        "poll_seconds": 0.02,
        **kaniko,
    }
    return make_config(
        tmp_path,
        jobs={"kubernetes": {"kubeconfig": str(kube.write_kubeconfig(tmp_path / "kubeconfig"))}},
        builder={
            "backend": "kaniko",
            "kaniko": settings,
            "poll_seconds": 0.02,
            "find_links": ["http://wheels.example/"],
            "no_index": True,
        },
    )


@pytest.fixture
async def client_for(aiohttp_client: Callable[..., Any], tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    async def make(config: Any) -> TestClient[Any, Any]:
        return await aiohttp_client(create_app(config))

    yield make


async def call(
    client: TestClient[Any, Any], method: str, path: str, body: Any = None, user: str = "alice"
) -> Any:
    response = await client.request(method, path, json=body, headers=signed(method, path, user))
    text = await response.text()
    return response.status, (json.loads(text) if text and response.content_type.endswith("json") else text)


async def wait_final(client: TestClient[Any, Any], build_id: str, user: str = "alice") -> dict[str, Any]:
    for _ in range(500):
        status, build = await call(client, "GET", f"{API}/{build_id}", user=user)
        assert status == 200, build
        if build["state"] in FINAL:
            return dict(build)
        await asyncio.sleep(0.02)
    raise AssertionError(f"build {build_id} did not end: {build}")


def check_rights(kube: FakeKube) -> None:
    made = kube.requests
    assert made, "the builder made no request"
    outside = [r for r in made if not rbac.allowed(r.verb, *r.rbac[:2], namespaced=r.namespace == NS)]
    assert outside == [], f"requests outside the builder's Role: {outside}"


async def test_a_build_runs_as_a_kaniko_job_and_its_image_is_then_a_cache_hit(
    kube: FakeKube, registry: FakeRegistry, client_for: Callable[..., Any], tmp_path: Path
) -> None:
    kube.script = pushing(registry)
    client = await client_for(builder_config(tmp_path, kube, registry))
    body = {"requirements": "tinypkg==1.0\n"}
    status, planned = await call(client, "POST", f"{API}?dry_run=1", body)
    assert status == 200 and planned["cached"] is False, planned
    status, build = await call(client, "POST", API, body)
    assert status == 201, build
    assert build["key"] == planned["key"]
    # While it runs, the Job is there as manifests.build_job made it.
    job = None
    for _ in range(200):
        job = kube.get("jobs", NS, manifests.job_name(build["id"]))
        if job is not None:
            break
        await asyncio.sleep(0.01)
    assert job is not None
    pod = job["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    executor = pod["containers"][0]
    assert f"--destination={registry.host}/{REPO}:{build['key']}" in executor["args"]
    assert f"--cache-repo={registry.host}/{REPO}/cache" in executor["args"]
    assert executor["resources"]["limits"]["memory"] == "2Gi"

    done = await wait_final(client, build["id"])
    assert done["state"] == "SUCCEEDED", done
    assert done["image"] == f"{registry.host}/{REPO}:{build['key']}"
    # The pod, the Job, its context and its credentials are gone; the log stays.
    assert await_gone(kube, build["id"])
    status, text = await call(client, "GET", f"{API}/{build['id']}/logs")
    assert "Successfully installed tinypkg-1.0" in text
    assert f"FROM {registry.host}/{BASE_REPO}@sha256:" in text
    # Resumable: after the second line's cursor come exactly the lines after it.
    response = await client.get(
        f"{API}/{build['id']}/logs",
        headers={**signed("GET", f"{API}/{build['id']}/logs"), "Accept": "application/x-ndjson"},
    )
    items = [json.loads(line) for line in (await response.text()).splitlines()]
    path = f"{API}/{build['id']}/logs?cursor={items[1]['cursor']}"
    status, rest = await call(client, "GET", path)
    assert rest.splitlines() == [item["line"] for item in items[2:]]

    # The registry is the cache: a dry run and a request are hits, with no second Job.
    status, planned = await call(client, "POST", f"{API}?dry_run=1", body)
    assert planned == {"key": build["key"], "cached": True}
    jobs_before = [r for r in kube.requests if r.verb == "create" and r.resource == "jobs"]
    status, hit = await call(client, "POST", API, body, user="bob")
    assert status == 201 and hit["state"] == "SUCCEEDED" and hit["cached"] is True, hit
    assert hit["image"] == done["image"]
    assert [r for r in kube.requests if r.verb == "create" and r.resource == "jobs"] == jobs_before
    # Anonymous HEADs were challenged, then answered with a bearer token.
    assert {seen.authorization for seen in registry.requests} == {"", "Bearer"}
    check_rights(kube)


def await_gone(kube: FakeKube, build_id: str) -> bool:
    return (
        kube.get("jobs", NS, manifests.job_name(build_id)) is None
        and kube.get("secrets", NS, manifests.secret_name(build_id)) is None
        and kube.get("configmaps", NS, manifests.job_name(build_id)) is None
        and not kube.list("pods", NS, f"{manifests.LABEL_BUILD}={build_id}")
    )


async def test_identical_requests_share_one_build(
    kube: FakeKube, registry: FakeRegistry, client_for: Callable[..., Any], tmp_path: Path
) -> None:
    kube.script = pushing(registry, run_seconds=0.5)
    client = await client_for(builder_config(tmp_path, kube, registry))
    body = {"requirements": "otherpkg\n"}
    answers = await asyncio.gather(*(call(client, "POST", API, body) for _ in range(3)))
    ids = {build["id"] for _, build in answers}
    assert len(ids) == 1, answers
    done = await wait_final(client, ids.pop())
    assert done["state"] == "SUCCEEDED"
    assert len([r for r in kube.requests if r.verb == "create" and r.resource == "jobs"]) == 1


async def test_a_pip_failure_fails_the_build_with_its_last_error_lines(
    kube: FakeKube, registry: FakeRegistry, client_for: Callable[..., Any], tmp_path: Path
) -> None:
    kube.script = lambda pod: PodScript(lines=PIP_FAILURE, exit_code=1)
    client = await client_for(builder_config(tmp_path, kube, registry))
    _, build = await call(client, "POST", API, {"requirements": "nosuchpkg==1.0\n"})
    done = await wait_final(client, build["id"])
    assert done["state"] == "FAILED"
    assert done["reason"].startswith("the build failed (Kaniko exit 1): ERROR: Could not find a version"), (
        done
    )
    assert "No matching distribution found for nosuchpkg==1.0" in done["reason"]
    assert "error building image" in done["reason"]
    assert done["image"] is None
    assert await_gone(kube, build["id"])
    # Nothing was published: the same request builds again.
    _, planned = await call(client, "POST", f"{API}?dry_run=1", {"requirements": "nosuchpkg==1.0\n"})
    assert planned["cached"] is False
    check_rights(kube)


async def test_a_build_past_its_timeout_is_stopped_and_says_so(
    kube: FakeKube, registry: FakeRegistry, client_for: Callable[..., Any], tmp_path: Path
) -> None:
    kube.script = lambda pod: PodScript(lines=["INFO[0000] Downloading a very large wheel"], run_seconds=None)
    config = builder_config(tmp_path, kube, registry)
    config = config.model_copy(
        update={"builder": config.builder.model_copy(update={"build_timeout_seconds": 1.0})}
    )
    client = await client_for(config)
    _, build = await call(client, "POST", API, {"requirements": "tinypkg\n"})
    done = await wait_final(client, build["id"])
    assert done["state"] == "FAILED"
    assert done["reason"] == "the build took longer than 1 s and was stopped"
    assert await_gone(kube, build["id"])
    _, text = await call(client, "GET", f"{API}/{build['id']}/logs")
    assert "Downloading a very large wheel" in text
    assert "stopped: the build took longer than 1 s" in text


async def test_a_moved_base_tag_is_a_new_key_and_a_private_base_is_read_with_the_users_credentials(
    kube: FakeKube, registry: FakeRegistry, client_for: Callable[..., Any], tmp_path: Path
) -> None:
    kube.script = pushing(registry)
    client = await client_for(builder_config(tmp_path, kube, registry))
    body = {"requirements": "tinypkg\n"}
    _, first = await call(client, "POST", f"{API}?dry_run=1", body)
    registry.put(BASE_REPO, "3.11", "base two")
    _, second = await call(client, "POST", f"{API}?dry_run=1", body)
    assert first["key"] != second["key"]

    private = {"requirements": "tinypkg\n", "base": f"{registry.host}/private/base:1"}
    # The push credentials do not read another user's private base...
    store = client.server.app[BUILDER]._store
    status, problem = await call(client, "POST", API, {**private, "registry": "mine"}, user="bob")
    assert status == 422 and problem["errors"][0]["field"] == "registry", problem
    await store.put_registry(Registry("bob", "mine", registry.host, "bob", "wrong"))
    status, problem = await call(client, "POST", API, {**private, "registry": "mine"}, user="bob")
    assert status == 422 and problem["errors"][0]["field"] == "base", problem
    assert "refused the credentials of user 'bob'" in problem["detail"]
    assert "wrong" not in json.dumps(problem)
    await store.put_registry(Registry("bob", "mine", registry.host, "bob", "bobs-secret"))
    status, build = await call(client, "POST", API, {**private, "registry": "mine"}, user="bob")
    assert status == 201, build
    # The build's Secret holds the user's credentials for the base and the push credentials.
    secret = None
    for _ in range(200):
        secret = kube.get("secrets", NS, manifests.secret_name(build["id"]))
        if secret is not None:
            break
        await asyncio.sleep(0.01)
    assert secret is not None and secret["type"] == "kubernetes.io/dockerconfigjson"
    done = await wait_final(client, build["id"], user="bob")
    assert done["state"] == "SUCCEEDED", done


async def test_wrong_push_credentials_are_a_clear_503(
    kube: FakeKube, registry: FakeRegistry, client_for: Callable[..., Any], tmp_path: Path
) -> None:
    registry.users["pusher"] = "rotated"
    client = await client_for(builder_config(tmp_path, kube, registry))
    status, problem = await call(client, "POST", API, {"requirements": "tinypkg\n"})
    assert status == 503, problem
    assert f"registry {registry.host} refused the credentials of user 'pusher'" in problem["detail"]
    assert "push-secret" not in json.dumps(problem)
