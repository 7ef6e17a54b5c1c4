"""The builder service with `builder.backend: kaniko`, end to end against the real control
plane (tests/kube_real: API server with RBAC and admission, Job controller, garbage
collector, scheduler, simulated kubelet) and a real registry (Debian's docker-registry with
htpasswd, tests/real_registry.py).

The builder authenticates with a token of the chart's builder ServiceAccount, whose Role
is installed exactly as charts/paddlecloud renders it for ci/kaniko-values.yaml, in a
builds namespace of the test's own labelled Pod Security `baseline` (docs/builder.md): a
request outside the chart's rights is a 403 that fails the build, and an executor pod that
`baseline` refuses never starts. The simulated kubelet runs no container: the build
pod's script plays Kaniko in the executor (an init container), printing what Kaniko and pip
print, and the pusher, which on success pushes the key's tag to the user's repository
through the Registry API as crane's push does (`put_image`). The pusher for real (crane,
the tarball opened without following links) is tested in test_builder_push.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient
from real_registry import PASSWORD, USER, has_tag, put_image, registry_missing, start_registry
from registry_fake import FakeRegistry

from kube_real import KubeClient, PodScript
from kube_real.builds import Builds, builds_namespace
from kube_real.fixtures import RealKube
from kube_real.kubelet import default_script
from paddlecloud.builder import kaniko_manifests as manifests
from paddlecloud.builder.app import create_app
from paddlecloud.builder.keys import BUILDER
from paddlecloud.builder.registry import ImageRef, RegistryClient
from paddlecloud.common.dockerconfig import Credentials, dockerconfigjson
from paddlecloud.common.store import Registry
from support import make_config, signed

pytestmark = pytest.mark.skipif(registry_missing() is not None, reason=str(registry_missing()))

Obj = dict[str, Any]

REPO = "paddlecloud/runtime"
BASE_REPO = "base/python"
API = "/api/v1/builds"
FINAL = ("SUCCEEDED", "FAILED")
BOB_PASSWORD = "bobs-secret"
PIP_FAILURE = (
    "INFO[0001] RUN python3 -m pip install ...",
    "ERROR: Could not find a version that satisfies the requirement nosuchpkg==1.0 (from versions: none)",
    "ERROR: No matching distribution found for nosuchpkg==1.0",
    "error building image: error building stage: failed to execute command: waiting for process to exit: "
    "exit status 1",
)
PUSHED = ("INFO[0000] Retrieving image", "Successfully installed tinypkg-1.0", "INFO[0005] Built the tarball")
PUSHER_LINES = ("pushed blob: sha256:5df2", "pushed the image")


@pytest.fixture
def builds(real_kube: RealKube, tmp_path: Path) -> Iterator[Builds]:
    with builds_namespace(real_kube, tmp_path) as made:
        yield made


@dataclass
class RealRegistry:
    """docker-registry on loopback, and what the executor pods the node ran saw."""

    host: str
    # Per build pod the node ran: its build key, its Job and its push Secret as stored then.
    runs: list[tuple[str, Obj, Obj]] = field(default_factory=list)
    # The pull Secrets (a private base's) of the build pods that had one.
    pulls: list[Obj] = field(default_factory=list)
    # What went wrong inside a pod script (raising there would stop the simulated kubelet).
    errors: list[BaseException] = field(default_factory=list)


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[RealRegistry]:
    """A registry of the test's own with the push user and bob, holding a public base
    `base/python:3.11` and bob's `private/base:1`."""
    where = tmp_path / "registry"
    where.mkdir()
    host, process = start_registry(where, {"bob": BOB_PASSWORD})
    try:
        put_image(host, BASE_REPO, "3.11", "base one")
        put_image(host, "private/base", "1", "private base", user="bob", password=BOB_PASSWORD)
        yield RealRegistry(host)
    finally:
        process.terminate()
        process.wait(10)


def kaniko(
    admin: KubeClient,
    registry: RealRegistry,
    lines: tuple[str, ...] = PUSHED,
    *,
    push: bool = True,
    exit_code: int = 0,
    **kwargs: Any,
) -> Callable[[Obj], PodScript]:
    """A pod script that plays a build pod: records the pod's Job and Secrets as the API
    server has them; the executor prints `lines` and exits with `exit_code`; then the
    pusher pushes the key's tag to the owner's repository (when `push`) as crane does.
    Any other pod runs as by default."""

    def script(pod: Obj) -> PodScript:
        annotations = pod["metadata"].get("annotations") or {}
        key = annotations.get(manifests.ANNOTATION_KEY)
        if key is None:
            return default_script(pod)
        try:
            build = pod["metadata"]["labels"][manifests.LABEL_BUILD]
            namespace = pod["metadata"]["namespace"]
            job = admin.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{manifests.job_name(build)}")
            secret = admin.get(f"/api/v1/namespaces/{namespace}/secrets/{manifests.secret_name(build)}")
            registry.runs.append((key, job, secret))
            pulls = [v for v in pod["spec"]["volumes"] if v["name"] == manifests.PULL_VOLUME]
            if pulls:
                name = pulls[0]["secret"]["secretName"]
                registry.pulls.append(admin.get(f"/api/v1/namespaces/{namespace}/secrets/{name}"))
            if push and exit_code == 0:
                owner = annotations[manifests.ANNOTATION_USER]
                put_image(registry.host, f"{REPO}/{owner}", key, f"runtime {key} of {owner}")
        except Exception as exc:
            registry.errors.append(exc)
        return PodScript(
            init=((manifests.EXECUTOR, lines, exit_code),), lines=PUSHER_LINES if push else (), **kwargs
        )

    return script


def builder_config(
    tmp_path: Path, builds: Builds, registry: RealRegistry, password: str = PASSWORD, timeout: float = 3600.0
) -> Any:
    auth = tmp_path / "push-config.json"
    auth.write_text(dockerconfigjson({registry.host: Credentials(USER, password)}))
    settings = {
        "registry": registry.host,
        "repository": REPO,
        "insecure_registries": [registry.host],
        "auth_file": str(auth),
        "base_image": f"{registry.host}/{BASE_REPO}:3.11",
        "namespace": builds.namespace,
        "poll_seconds": 0.05,
    }
    return make_config(
        tmp_path,
        jobs={"kubernetes": {"kubeconfig": str(builds.rights.kubeconfig)}},
        builder={
            "backend": "kaniko",
            "kaniko": settings,
            "work_dir": str(tmp_path / "builder"),
            "build_timeout_seconds": timeout,
            "poll_seconds": 0.02,
            "find_links": ["http://wheels.example/"],
            "no_index": True,
        },
    )


@pytest.fixture
async def client_for(aiohttp_client: Callable[..., Any]) -> AsyncIterator[Callable[..., Any]]:
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
    build: Any = None
    for _ in range(1500):
        status, build = await call(client, "GET", f"{API}/{build_id}", user=user)
        assert status == 200, build
        if build["state"] in FINAL:
            return dict(build)
        await asyncio.sleep(0.02)
    raise AssertionError(f"build {build_id} did not end: {build}")


async def all_gone(admin: KubeClient, namespace: str, build_id: str) -> None:
    """The build's Job, Secret, ConfigMap and pods are gone: deleted by the builder, the
    pod (and any of the others the builder missed) by the real garbage collector, which
    takes its time (TimeoutError naming what stayed)."""

    def wait() -> None:
        core = f"/api/v1/namespaces/{namespace}"
        admin.wait_gone(f"/apis/batch/v1/namespaces/{namespace}/jobs", manifests.job_name(build_id))
        admin.wait_gone(f"{core}/secrets", manifests.secret_name(build_id))
        admin.wait_gone(f"{core}/configmaps", manifests.job_name(build_id))
        selector = {"labelSelector": f"{manifests.LABEL_BUILD}={build_id}"}
        for pod in admin.get(f"{core}/pods", query=selector)["items"]:
            admin.wait_gone(f"{core}/pods", pod["metadata"]["name"])

    await asyncio.to_thread(wait)


async def test_a_build_runs_as_a_kaniko_job_and_its_image_is_then_a_cache_hit(
    real_kube: RealKube,
    builds: Builds,
    registry: RealRegistry,
    client_for: Callable[..., Any],
    tmp_path: Path,
) -> None:
    admin = real_kube.cluster.admin
    client = await client_for(builder_config(tmp_path, builds, registry))
    body = {"requirements": "tinypkg==1.0\n"}
    status, planned = await call(client, "POST", f"{API}?dry_run=1", body)
    assert status == 200 and planned["cached"] is False, planned
    with real_kube.scripted(kaniko(admin, registry)):
        status, build = await call(client, "POST", API, body)
        assert status == 201, build
        assert build["key"] == planned["key"]
        done = await wait_final(client, build["id"])
    assert done["state"] == "SUCCEEDED", done
    assert not registry.errors, registry.errors
    # alice's image, under her own path.
    assert done["image"] == f"{registry.host}/{REPO}/alice:{build['key']}"
    # While it ran, the Job was there as manifests.build_job made it.
    [(key, job, _)] = registry.runs
    assert key == build["key"]
    pod = job["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    executor = pod["initContainers"][1]
    assert f"--destination={done['image']}" in executor["args"] and "--no-push" in executor["args"]
    assert executor["resources"]["limits"]["memory"] == "2Gi"
    assert pod["containers"][0]["command"][-3:] == ["--destination", done["image"], "--insecure"]
    assert has_tag(registry.host, f"{REPO}/alice", build["key"])

    # The pod, the Job, its context and its credentials are gone; the log stays.
    await all_gone(admin, builds.namespace, build["id"])
    status, text = await call(client, "GET", f"{API}/{build['id']}/logs")
    assert "Successfully installed tinypkg-1.0" in text
    assert "pushed the image" in text, "the pusher's log follows the executor's"
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

    # The registry is the cache, per user: alice's dry run and request are hits, with no
    # second Job...
    with real_kube.scripted(kaniko(admin, registry)):
        status, planned = await call(client, "POST", f"{API}?dry_run=1", body)
        assert planned == {"key": build["key"], "cached": True}
        status, hit = await call(client, "POST", API, body)
    # Her own build is answered again.
    assert status == 200 and hit["id"] == build["id"] and hit["state"] == "SUCCEEDED", hit
    assert hit["image"] == done["image"]
    assert len(registry.runs) == 1, registry.runs
    # ...but bob, with the same requirements, never gets alice's image (her build ran her
    # requirements as root: what it left is hers): another key, his own build, his own path.
    with real_kube.scripted(kaniko(admin, registry)):
        status, bobs_plan = await call(client, "POST", f"{API}?dry_run=1", body, user="bob")
        assert bobs_plan["cached"] is False and bobs_plan["key"] != build["key"], bobs_plan
        status, bobs = await call(client, "POST", API, body, user="bob")
        assert status == 201 and bobs["cached"] is False, bobs
        bobs_done = await wait_final(client, bobs["id"], user="bob")
    assert bobs_done["state"] == "SUCCEEDED", bobs_done
    assert bobs_done["image"] == f"{registry.host}/{REPO}/bob:{bobs_plan['key']}"
    assert len(registry.runs) == 2 and registry.runs[1][0] == bobs_plan["key"]


async def test_identical_requests_share_one_build(
    real_kube: RealKube,
    builds: Builds,
    registry: RealRegistry,
    client_for: Callable[..., Any],
    tmp_path: Path,
) -> None:
    client = await client_for(builder_config(tmp_path, builds, registry))
    body = {"requirements": "otherpkg\n"}
    with real_kube.scripted(kaniko(real_kube.cluster.admin, registry, run_seconds=0.5)):
        answers = await asyncio.gather(*(call(client, "POST", API, body) for _ in range(3)))
        ids = {build["id"] for _, build in answers}
        assert len(ids) == 1, answers
        done = await wait_final(client, ids.pop())
    assert done["state"] == "SUCCEEDED", done
    assert not registry.errors, registry.errors
    # One Job ran one executor pod.
    assert len(registry.runs) == 1, registry.runs


async def test_a_pip_failure_fails_the_build_with_its_last_error_lines(
    real_kube: RealKube,
    builds: Builds,
    registry: RealRegistry,
    client_for: Callable[..., Any],
    tmp_path: Path,
) -> None:
    client = await client_for(builder_config(tmp_path, builds, registry))
    script = kaniko(real_kube.cluster.admin, registry, PIP_FAILURE, push=False, exit_code=1)
    with real_kube.scripted(script):
        _, build = await call(client, "POST", API, {"requirements": "nosuchpkg==1.0\n"})
        done = await wait_final(client, build["id"])
    assert done["state"] == "FAILED", done
    assert not registry.errors, registry.errors
    assert done["reason"].startswith("the build failed (Kaniko exit 1): ERROR: Could not find a version"), (
        done
    )
    assert "No matching distribution found for nosuchpkg==1.0" in done["reason"]
    assert "error building image" in done["reason"]
    assert done["image"] is None
    await all_gone(real_kube.cluster.admin, builds.namespace, build["id"])
    # Nothing was published: the same request builds again.
    _, planned = await call(client, "POST", f"{API}?dry_run=1", {"requirements": "nosuchpkg==1.0\n"})
    assert planned["cached"] is False


async def test_a_refused_push_fails_the_build_with_the_pushers_words(
    real_kube: RealKube,
    builds: Builds,
    registry: RealRegistry,
    client_for: Callable[..., Any],
    tmp_path: Path,
) -> None:
    """The executor built, the pusher refused what it found (push.py): the build fails
    quoting the pusher, nothing is published, the log holds both containers' lines."""
    client = await client_for(builder_config(tmp_path, builds, registry))
    refusal = "push: refused: /image/image.tar is a symbolic link; only the image tarball itself is pushed"
    script = kaniko(real_kube.cluster.admin, registry, push=False)

    def refused(pod: Obj) -> PodScript:
        return replace(script(pod), lines=(refusal,), exit_code=1)

    with real_kube.scripted(refused):
        _, build = await call(client, "POST", API, {"requirements": "tinypkg\n"})
        done = await wait_final(client, build["id"])
    assert done["state"] == "FAILED", done
    assert not registry.errors, registry.errors
    assert done["reason"] == f"pushing the image failed (exit 1): {refusal}", done
    _, text = await call(client, "GET", f"{API}/{build['id']}/logs")
    assert "Successfully installed tinypkg-1.0" in text and refusal in text
    _, planned = await call(client, "POST", f"{API}?dry_run=1", {"requirements": "tinypkg\n"})
    assert planned["cached"] is False


async def test_a_build_past_its_timeout_is_stopped_and_says_so(
    real_kube: RealKube,
    builds: Builds,
    registry: RealRegistry,
    client_for: Callable[..., Any],
    tmp_path: Path,
) -> None:
    client = await client_for(builder_config(tmp_path, builds, registry, timeout=1.0))
    lines = ("INFO[0000] Downloading a very large wheel",)
    with real_kube.scripted(kaniko(real_kube.cluster.admin, registry, lines, push=False, run_forever=True)):
        _, build = await call(client, "POST", API, {"requirements": "tinypkg\n"})
        done = await wait_final(client, build["id"])
    assert done["state"] == "FAILED", done
    assert not registry.errors, registry.errors
    assert done["reason"] == "the build took longer than 1 s and was stopped"
    # The running pod is stopped too: the garbage collector deletes it with its Job.
    await all_gone(real_kube.cluster.admin, builds.namespace, build["id"])
    _, text = await call(client, "GET", f"{API}/{build['id']}/logs")
    assert "Downloading a very large wheel" in text
    assert "stopped: the build took longer than 1 s" in text


async def build_without_a_pod(
    real_kube: RealKube, builds: Builds, registry: RealRegistry, client: TestClient[Any, Any]
) -> tuple[dict[str, Any], str]:
    """One build in a builds namespace whose pods Kubernetes does not make: the build as
    it ended, and its log; no executor pod ran."""
    with real_kube.scripted(kaniko(real_kube.cluster.admin, registry)):
        _, build = await call(client, "POST", API, {"requirements": "tinypkg\n"})
        done = await wait_final(client, build["id"])
    assert done["state"] == "FAILED", done
    assert not registry.runs, "no executor pod ran"
    _, text = await call(client, "GET", f"{API}/{build['id']}/logs")
    return done, text


async def test_a_build_pod_refused_by_pod_security_fails_the_build_saying_why(
    real_kube: RealKube, registry: RealRegistry, client_for: Callable[..., Any], tmp_path: Path
) -> None:
    """A builds namespace left at `restricted` refuses the executor (root, capabilities):
    the Job controller's FailedCreate Warning Event, read with the chart's builder rights,
    fails the build long before its timeout, in the admission's words, and the Job goes."""
    with builds_namespace(real_kube, tmp_path, pod_security="restricted") as builds:
        client = await client_for(builder_config(tmp_path, builds, registry, timeout=20.0))
        done, text = await build_without_a_pod(real_kube, builds, registry, client)
        why = "Kubernetes refuses the build's pods (Pod Security admission): "
        assert done["reason"].startswith(why), done
        assert 'violates PodSecurity "restricted:latest"' in done["reason"], done
        assert f"build failed: {why}" in text
        await all_gone(real_kube.cluster.admin, builds.namespace, done["id"])


async def test_a_build_pod_held_by_the_quota_waits_and_its_timeout_says_why(
    real_kube: RealKube,
    builds: Builds,
    registry: RealRegistry,
    client_for: Callable[..., Any],
    tmp_path: Path,
) -> None:
    """A quota may free: the build waits (its log says for what) and, stopped at its
    timeout, its reason names the quota."""
    quota = {"metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}}
    real_kube.cluster.admin.create(f"/api/v1/namespaces/{builds.namespace}/resourcequotas", quota)
    client = await client_for(builder_config(tmp_path, builds, registry, timeout=8.0))
    done, text = await build_without_a_pod(real_kube, builds, registry, client)
    why = "the namespace's quota refuses the build's pods: "
    assert done["reason"].startswith(f"the build took longer than 8 s and was stopped; {why}"), done
    assert f"the build waits: {why}" in text


async def test_a_moved_base_tag_is_a_new_key_and_a_private_base_is_read_with_the_users_credentials(
    real_kube: RealKube,
    builds: Builds,
    registry: RealRegistry,
    client_for: Callable[..., Any],
    tmp_path: Path,
) -> None:
    client = await client_for(builder_config(tmp_path, builds, registry))
    body = {"requirements": "tinypkg\n"}
    _, first = await call(client, "POST", f"{API}?dry_run=1", body)
    await asyncio.to_thread(put_image, registry.host, BASE_REPO, "3.11", "base two")
    _, second = await call(client, "POST", f"{API}?dry_run=1", body)
    assert first["key"] != second["key"]

    private = {"requirements": "tinypkg\n", "base": f"{registry.host}/private/base:1"}
    # A registry name bob has not saved is refused...
    store = client.server.app[BUILDER]._store
    status, problem = await call(client, "POST", API, {**private, "registry": "mine"}, user="bob")
    assert status == 422 and problem["errors"][0]["field"] == "registry", problem
    # ...and so are credentials the registry refuses, naming the user, never the password.
    await store.put_registry(Registry("bob", "mine", registry.host, "bob", "wrong"))
    status, problem = await call(client, "POST", API, {**private, "registry": "mine"}, user="bob")
    assert status == 422 and problem["errors"][0]["field"] == "base", problem
    assert "refused the credentials of user 'bob'" in problem["detail"]
    assert "wrong" not in json.dumps(problem)
    await store.put_registry(Registry("bob", "mine", registry.host, "bob", BOB_PASSWORD))
    with real_kube.scripted(kaniko(real_kube.cluster.admin, registry)):
        status, build = await call(client, "POST", API, {**private, "registry": "mine"}, user="bob")
        assert status == 201, build
        done = await wait_final(client, build["id"], user="bob")
    assert done["state"] == "SUCCEEDED", done
    assert not registry.errors, registry.errors
    assert (
        f"FROM {registry.host}/private/base@sha256:"
        in (await call(client, "GET", f"{API}/{build['id']}/logs", user="bob"))[1]
    )
    # The push Secret holds the push credentials alone; bob's own credentials for his
    # private base are a Secret of their own, the only one the executor mounts.
    [(_, _, secret)] = registry.runs
    assert secret["type"] == "kubernetes.io/dockerconfigjson"
    pushing = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    assert pushing["auths"][registry.host]["username"] == USER
    [pull] = registry.pulls
    pulling = json.loads(base64.b64decode(pull["data"][".dockerconfigjson"]))
    assert pulling == {"auths": {registry.host: {**pulling["auths"][registry.host], "username": "bob"}}}


async def test_wrong_push_credentials_are_a_clear_503(
    real_kube: RealKube,
    builds: Builds,
    registry: RealRegistry,
    client_for: Callable[..., Any],
    tmp_path: Path,
) -> None:
    client = await client_for(builder_config(tmp_path, builds, registry, password="rotated"))
    status, problem = await call(client, "POST", API, {"requirements": "tinypkg\n"})
    assert status == 503, problem
    assert f"registry {registry.host} refused the credentials of user '{USER}'" in problem["detail"]
    assert "rotated" not in json.dumps(problem)


async def test_the_registry_client_answers_a_bearer_challenge_with_a_token() -> None:
    """Docker Hub's way, which the real registry here (htpasswd, basic) does not speak:
    an anonymous HEAD is challenged with `Bearer realm=...`, the client fetches a token
    there with its basic credentials, and asks again with the token."""
    with FakeRegistry({USER: PASSWORD}) as fake:
        fake.put(REPO, "k1", "an image")
        async with aiohttp.ClientSession() as session:
            client = RegistryClient(
                session, {fake.host: Credentials(USER, PASSWORD)}, insecure=frozenset({fake.host})
            )
            assert await client.exists(ImageRef(fake.host, REPO, "k1"))
            assert not await client.exists(ImageRef(fake.host, REPO, "k2"))
        # Challenged once, then answered with the token, which the second HEAD reuses.
        assert [seen.authorization for seen in fake.requests] == ["", "Bearer", "Bearer"], fake.requests
        assert len(fake.tokens) == 1
