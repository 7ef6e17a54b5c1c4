"""The fake Kubernetes (tests/kube_fake) driven by the real kubernetes_asyncio client: what
the kubernetes backend's tests rely on it to do as a real cluster would."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from kube_fake import FakeKube, PodScript, permitted, pod_index, resolve_env
from support import wait_until

NS = "alice"
TIMEOUT = 5.0


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    with FakeKube() as fake:
        fake.create("namespaces", {"metadata": {"name": NS}})
        yield fake


@pytest.fixture
async def api(kube: FakeKube, tmp_path) -> AsyncIterator[client.ApiClient]:
    kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
    async with await config.new_client_from_config(config_file=str(kubeconfig)) as api_client:
        yield api_client


def status_of(error: ApiException) -> dict[str, Any]:
    body = json.loads(error.body)
    assert body["kind"] == "Status"
    return body


def config_map(name: str, labels: dict[str, str] | None = None, owner: dict[str, Any] | None = None) -> dict:
    meta: dict[str, Any] = {"name": name, "labels": labels or {}}
    if owner:
        meta["ownerReferences"] = [owner]
    return {"metadata": meta, "data": {"k": "v"}}


def container(**extra: Any) -> dict[str, Any]:
    return {"name": "main", "image": "registry.example/train:1", **extra}


def indexed_job(name: str, completions: int, **spec: Any) -> dict[str, Any]:
    template_spec = {"restartPolicy": "Never", "subdomain": name, "containers": [container()]}
    template_spec.update(spec.pop("pod", {}))
    return {
        "metadata": {"name": name, **spec.pop("metadata", {})},
        "spec": {
            "completions": completions,
            "parallelism": completions,
            "completionMode": "Indexed",
            "template": {"metadata": {"labels": {"role": "trainer"}}, "spec": template_spec},
            **spec,
        },
    }


def statefulset(name: str, replicas: int, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if owner:
        meta["ownerReferences"] = [owner]
    return {
        "metadata": meta,
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"role": "pserver"}},
            "template": {"metadata": {"labels": {"role": "pserver"}}, "spec": {"containers": [container()]}},
        },
    }


def owner_ref(obj: Any, kind: str = "ConfigMap") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "name": obj.metadata.name, "uid": obj.metadata.uid}


def job_condition(kube: FakeKube, name: str) -> dict[str, Any] | None:
    job = kube.get("jobs", NS, name)
    conditions = (job or {}).get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] in ("Complete", "Failed")), None)


async def test_create_get_and_the_errors_of_the_real_server(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    created = await core.create_namespaced_config_map(NS, config_map("a"))
    assert created.metadata.namespace == NS and created.metadata.uid
    assert (
        await core.read_namespaced_config_map("a", NS)
    ).metadata.resource_version == created.metadata.resource_version

    with pytest.raises(ApiException) as again:
        await core.create_namespaced_config_map(NS, config_map("a"))
    assert again.value.status == 409 and status_of(again.value)["reason"] == "AlreadyExists"
    with pytest.raises(ApiException) as missing:
        await core.read_namespaced_config_map("nope", NS)
    assert missing.value.status == 404 and status_of(missing.value)["reason"] == "NotFound"
    with pytest.raises(ApiException) as no_namespace:
        await core.create_namespaced_config_map("bob", config_map("a"))
    assert (
        no_namespace.value.status == 404
        and 'namespaces "bob" not found' in status_of(no_namespace.value)["message"]
    )
    with pytest.raises(ApiException) as nameless:
        await core.create_namespaced_config_map(NS, {"metadata": {}})
    assert nameless.value.status == 422 and status_of(nameless.value)["reason"] == "Invalid"

    generated = await core.create_namespaced_config_map(NS, {"metadata": {"generateName": "gen-"}})
    assert generated.metadata.name.startswith("gen-") and len(generated.metadata.name) == 9

    # An update with the resourceVersion read succeeds once; the same stale one then conflicts.
    created.data = {"k": "w"}
    updated = await core.replace_namespaced_config_map("a", NS, created)
    assert int(updated.metadata.resource_version) > int(created.metadata.resource_version)
    with pytest.raises(ApiException) as stale:
        await core.replace_namespaced_config_map("a", NS, created)
    assert stale.value.status == 409 and status_of(stale.value)["reason"] == "Conflict"

    # Patches: a dict is sent as a strategic merge patch, a list as a JSON patch.
    patched = await core.patch_namespaced_config_map("a", NS, {"metadata": {"labels": {"x": "1"}}})
    assert patched.metadata.labels == {"x": "1"} and patched.data == {"k": "w"}
    ops = [{"op": "replace", "path": "/data/k", "value": "z"}]
    assert (await core.patch_namespaced_config_map("a", NS, ops)).data == {"k": "z"}
    merged = await core.patch_namespaced_config_map(
        "a", NS, {"data": {"k": None, "n": "1"}}, _content_type="application/merge-patch+json"
    )
    assert merged.data == {"n": "1"}

    # Items of a list come without kind or apiVersion, as from the real server.
    listed = await core.list_namespaced_config_map(NS, field_selector="metadata.name=a")
    assert [(i.kind, i.api_version, i.metadata.name) for i in listed.items] == [(None, None, "a")]
    with pytest.raises(ApiException) as precondition:
        await core.delete_namespaced_config_map("a", NS, body={"preconditions": {"uid": "an-older-uid"}})
    assert (
        precondition.value.status == 409 and "Precondition failed" in status_of(precondition.value)["message"]
    )
    await core.delete_namespaced_config_map("a", NS, body={"preconditions": {"uid": created.metadata.uid}})
    assert all(i.metadata.name != "a" for i in (await core.list_namespaced_config_map(NS)).items)


async def test_label_selectors_filter_lists_with_every_operator(
    kube: FakeKube, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    for name, labels in [("a", {"role": "trainer", "gpu": "1"}), ("b", {"role": "pserver"}), ("c", {})]:
        await core.create_namespaced_config_map(NS, config_map(name, labels))

    async def names(selector: str) -> list[str]:
        listed = await core.list_namespaced_config_map(NS, label_selector=selector)
        return [item.metadata.name for item in listed.items]

    assert await names("role=trainer") == ["a"]
    assert await names("role==pserver") == ["b"]
    assert await names("role!=trainer") == ["b", "c"]
    assert await names("gpu") == ["a"]
    assert await names("!gpu") == ["b", "c"]
    assert await names("role in (trainer, pserver)") == ["a", "b"]
    assert await names("role notin (trainer)") == ["b", "c"]
    assert await names("role,!gpu") == ["b"]
    assert kube.list("configmaps", NS, "role in (pserver)")[0]["metadata"]["name"] == "b"
    by_name = await core.list_config_map_for_all_namespaces(field_selector="metadata.name=c")
    assert [(i.metadata.namespace, i.metadata.name) for i in by_name.items] == [(NS, "c")]
    with pytest.raises(ApiException) as bad:
        await core.list_namespaced_config_map(NS, field_selector="data.k=v")
    assert bad.value.status == 400


async def test_watch_from_a_lists_resource_version_sees_later_changes_only(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_config_map(NS, config_map("before", {"app": "x"}))
    listed = await core.list_namespaced_config_map(NS)
    await core.create_namespaced_config_map(NS, config_map("after", {"app": "x"}))
    await core.patch_namespaced_config_map("before", NS, {"data": {"k": "2"}})
    await core.delete_namespaced_config_map("after", NS)
    await core.create_namespaced_config_map(NS, config_map("other", {"app": "y"}))

    seen = []
    async with watch.Watch() as w:
        stream = w.stream(
            core.list_namespaced_config_map,
            NS,
            label_selector="app=x",
            resource_version=listed.metadata.resource_version,
            timeout_seconds=1,
        )
        async for event in stream:
            seen.append((event["type"], event["object"].metadata.name))
    assert seen == [("ADDED", "after"), ("MODIFIED", "before"), ("DELETED", "after")]


async def test_expired_watches_end_and_resuming_them_answers_410(
    kube: FakeKube, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    listed = await core.list_namespaced_config_map(NS)
    seen = asyncio.Event()

    async def follow() -> list[str]:
        names = []
        # With timeout_seconds, kubernetes_asyncio ends the iteration when the server does
        # instead of reconnecting by itself.
        async with watch.Watch() as w:
            stream = w.stream(
                core.list_namespaced_config_map, NS, resource_version=listed.metadata.resource_version,
                timeout_seconds=30,
            )  # fmt: skip
            async for event in stream:
                names.append(event["object"].metadata.name)
                seen.set()
        return names

    follower = asyncio.create_task(follow())
    await core.create_namespaced_config_map(NS, config_map("seen"))
    await asyncio.wait_for(seen.wait(), TIMEOUT)
    kube.expire_watches()
    assert await asyncio.wait_for(follower, TIMEOUT) == ["seen"]

    with pytest.raises(ApiException) as gone:
        async with watch.Watch() as w:
            async for _ in w.stream(
                core.list_namespaced_config_map, NS, resource_version=listed.metadata.resource_version,
                timeout_seconds=1,
            ):  # fmt: skip
                pass
    assert gone.value.status == 410

    # Without timeout_seconds the client retries a 410 once, from the same version, then raises.
    with pytest.raises(ApiException) as gone_again:
        async with watch.Watch() as w:
            async for _ in w.stream(core.list_namespaced_config_map, NS, resource_version="1"):
                pass
    assert gone_again.value.status == 410

    relisted = await core.list_namespaced_config_map(NS)
    async with watch.Watch() as w:
        stream = w.stream(
            core.list_namespaced_config_map,
            NS,
            resource_version=relisted.metadata.resource_version,
            timeout_seconds=1,
        )
        assert [e async for e in stream] == []


async def test_a_watch_ends_at_its_timeout(api: client.ApiClient) -> None:
    started = time.monotonic()
    async with watch.Watch() as w:
        events = [e async for e in w.stream(client.CoreV1Api(api).list_namespaced_pod, NS, timeout_seconds=1)]
    assert events == []
    assert 0.9 <= time.monotonic() - started < 3


async def test_deleting_an_owner_collects_everything_it_owns(kube: FakeKube, api: client.ApiClient) -> None:
    core, batch, apps = client.CoreV1Api(api), client.BatchV1Api(api), client.AppsV1Api(api)
    kube.script = lambda pod: PodScript(run_seconds=None)
    owner = await core.create_namespaced_config_map(NS, config_map("job-1"))
    await batch.create_namespaced_job(
        NS, indexed_job("job-1-trainer", 2, metadata={"ownerReferences": [owner_ref(owner)]})
    )
    await apps.create_namespaced_stateful_set(NS, statefulset("job-1-pserver", 2, owner_ref(owner)))
    await core.create_namespaced_service(
        NS,
        {"metadata": {"name": "job-1-pserver", "ownerReferences": [owner_ref(owner)]},
         "spec": {"clusterIP": "None", "selector": {"role": "pserver"}}},
    )  # fmt: skip
    assert await wait_until(lambda: len(kube.list("pods", NS)) == 4, TIMEOUT)

    await core.delete_namespaced_config_map("job-1", NS, propagation_policy="Background")
    assert await wait_until(lambda: not kube.list("pods", NS), TIMEOUT)
    for plural in ("jobs", "statefulsets", "services", "configmaps"):
        assert kube.list(plural, NS) == [], plural

    await core.delete_namespace(NS)
    assert kube.get("namespaces", None, NS) is None


async def test_an_indexed_job_runs_one_pod_per_index_and_completes(
    kube: FakeKube, api: client.ApiClient
) -> None:
    batch = client.BatchV1Api(api)
    await batch.create_namespaced_job(NS, indexed_job("train", 3))
    assert await wait_until(lambda: job_condition(kube, "train") is not None, TIMEOUT)

    job = kube.get("jobs", NS, "train")
    assert job is not None
    assert job_condition(kube, "train")["type"] == "Complete"  # type: ignore[index]
    assert job["status"]["completedIndexes"] == "0-2"
    assert (
        job["status"]["succeeded"] == 3 and job["status"]["active"] == 0 and job["status"]["completionTime"]
    )
    pods = kube.list("pods", NS, "batch.kubernetes.io/job-name=train")
    assert sorted(pod_index(p) for p in pods) == [0, 1, 2]  # they stay after the Job completes
    for pod in pods:
        index = pod_index(pod)
        assert pod["metadata"]["name"].startswith(f"train-{index}-")
        assert pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == str(index)
        assert pod["metadata"]["labels"]["role"] == "trainer"
        assert pod["spec"]["hostname"] == f"train-{index}" and pod["spec"]["subdomain"] == "train"
        assert pod["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
        assert pod["metadata"]["ownerReferences"][0]["controller"] is True
        terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert terminated["exitCode"] == 0 and terminated["reason"] == "Completed"
        assert f"JOB_COMPLETION_INDEX={index}" in kube.logs(NS, pod["metadata"]["name"])


async def test_an_index_that_fails_past_its_backoff_limit_fails_the_job(
    kube: FakeKube, api: client.ApiClient
) -> None:
    def script(pod: dict) -> PodScript:
        if pod_index(pod) == 1:
            return PodScript(exit_code=137, reason="OOMKilled", run_seconds=0.05)
        return PodScript(run_seconds=0.05)

    kube.script = script
    await client.BatchV1Api(api).create_namespaced_job(NS, indexed_job("train", 3, backoffLimitPerIndex=1))
    assert await wait_until(lambda: job_condition(kube, "train") is not None, TIMEOUT)

    failed = job_condition(kube, "train")
    assert failed is not None and failed["type"] == "Failed" and failed["reason"] == "FailedIndexes"
    status = kube.get("jobs", NS, "train")["status"]  # type: ignore[index]
    assert status["failedIndexes"] == "1" and status["completedIndexes"] == "0,2" and status["failed"] == 2
    second = kube.list("pods", NS, "batch.kubernetes.io/job-completion-index=1")
    assert len(second) == 2  # the first try and one retry: backoffLimitPerIndex 1
    for pod in second:
        assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] == "OOMKilled"
    assert sorted(
        p["metadata"]["annotations"]["batch.kubernetes.io/job-index-failure-count"] for p in second
    ) == [
        "0",
        "1",
    ]


async def test_an_eviction_ignored_by_the_pod_failure_policy_does_not_count(
    kube: FakeKube, api: client.ApiClient
) -> None:
    kube.script = lambda pod: PodScript(evict=kube.attempt(pod) == 0, run_seconds=0.05)
    policy = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    job = indexed_job("train", 1, backoffLimitPerIndex=0, podFailurePolicy=policy)
    await client.BatchV1Api(api).create_namespaced_job(NS, job)
    assert await wait_until(lambda: job_condition(kube, "train") is not None, TIMEOUT)

    assert job_condition(kube, "train")["type"] == "Complete"  # type: ignore[index]
    assert kube.get("jobs", NS, "train")["status"]["failed"] == 0  # type: ignore[index]
    pods = sorted(kube.list("pods", NS), key=lambda p: p["status"]["phase"])
    assert [p["status"]["phase"] for p in pods] == ["Failed", "Succeeded"]
    assert pods[0]["status"]["reason"] == "Evicted"


async def test_a_pod_past_the_quota_is_refused_with_an_event_and_retried(
    kube: FakeKube, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    kube.script = lambda pod: PodScript(run_seconds=None)
    await core.create_namespaced_resource_quota(
        NS, {"metadata": {"name": "q"}, "spec": {"hard": {"requests.cpu": "2"}}}
    )
    resources = {"requests": {"cpu": "1500m"}, "limits": {"cpu": "1500m"}}
    job = indexed_job("train", 2, pod={"containers": [container(resources=resources)]})
    await client.BatchV1Api(api).create_namespaced_job(NS, job)

    def refusals() -> list[dict]:
        return [e for e in kube.list("events", NS) if e["reason"] == "FailedCreate"]

    assert await wait_until(lambda: bool(refusals()), TIMEOUT)
    event = refusals()[0]
    assert event["type"] == "Warning" and event["involvedObject"]["kind"] == "Job"
    assert event["involvedObject"]["name"] == "train"
    assert event["message"].startswith('Error creating: pods "train-')
    assert event["message"].endswith(
        "is forbidden: exceeded quota: q, requested: requests.cpu=1500m, used: requests.cpu=1500m, "
        "limited: requests.cpu=2"
    )
    assert len(kube.list("pods", NS)) == 1
    quota = kube.get("resourcequotas", NS, "q")
    assert quota is not None and quota["status"]["used"] == {"requests.cpu": "1500m"}

    await core.patch_namespaced_resource_quota("q", NS, {"spec": {"hard": {"requests.cpu": "4"}}})
    assert await wait_until(lambda: len(kube.list("pods", NS)) == 2, TIMEOUT)


async def test_a_statefulset_restarts_containers_in_place_and_replaces_deleted_pods(
    kube: FakeKube, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)

    def script(pod: dict) -> PodScript:
        if pod_index(pod) == 0 and kube.attempt(pod) == 0:
            return PodScript(lines=["first run"], exit_code=1, run_seconds=0.05)
        return PodScript(lines=["serving"], run_seconds=None)

    kube.script = script
    await client.AppsV1Api(api).create_namespaced_stateful_set(NS, statefulset("ps", 2))

    def restarted_and_ready() -> bool:
        sts, pod = kube.get("statefulsets", NS, "ps"), kube.get("pods", NS, "ps-0")
        restarts = pod["status"].get("containerStatuses", [{}])[0].get("restartCount") if pod else None
        return bool(sts) and sts["status"].get("readyReplicas") == 2 and restarts == 1  # type: ignore[index]

    assert await wait_until(restarted_and_ready, TIMEOUT)
    pod = await core.read_namespaced_pod("ps-0", NS)
    restarted = pod.status.container_statuses[0]
    assert restarted.restart_count == 1 and restarted.last_state.terminated.exit_code == 1
    assert restarted.state.running is not None
    assert pod.metadata.labels["apps.kubernetes.io/pod-index"] == "0"
    assert pod.metadata.labels["statefulset.kubernetes.io/pod-name"] == "ps-0"
    assert pod.spec.hostname == "ps-0" and pod.spec.subdomain == "ps"
    assert await core.read_namespaced_pod_log("ps-0", NS, previous=True) == "first run\n"
    assert await wait_until(lambda: kube.logs(NS, "ps-0") == ["serving"], TIMEOUT)

    old_uid = (await core.read_namespaced_pod("ps-1", NS)).metadata.uid
    await core.delete_namespaced_pod("ps-1", NS)

    def replaced() -> bool:
        pod = kube.get("pods", NS, "ps-1")
        return pod is not None and pod["metadata"]["uid"] != old_uid

    assert await wait_until(replaced, TIMEOUT)


async def test_logs_wait_for_the_container_then_follow_it_to_its_end(
    kube: FakeKube, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    kube.script = lambda pod: PodScript(lines=["one", "two", "three"], run_seconds=0.3)
    kube.pause_kubelet()
    await core.create_namespaced_pod(
        NS, {"metadata": {"name": "p"}, "spec": {"restartPolicy": "Never", "containers": [container()]}}
    )
    with pytest.raises(ApiException) as waiting:
        await core.read_namespaced_pod_log("p", NS)
    assert waiting.value.status == 400
    assert (
        status_of(waiting.value)["message"]
        == 'container "main" in pod "p" is waiting to start: ContainerCreating'
    )

    kube.resume_kubelet()

    def started() -> bool:
        pod = kube.get("pods", NS, "p")
        return (
            pod is not None
            and "running" in pod["status"].get("containerStatuses", [{"state": {}}])[0]["state"]
        )

    # Watch().stream does not raise on an HTTP error (it reads the body as lines), so follow
    # only once the container runs.
    assert await wait_until(started, TIMEOUT)
    lines = []
    async with watch.Watch() as w:
        async for line in w.stream(core.read_namespaced_pod_log, "p", NS, timestamps=True):
            lines.append(line)
    assert [line.split(" ", 1)[1] for line in lines] == ["one\n", "two\n", "three\n"]
    assert lines[0][:4].isdigit() and lines[0].split(" ", 1)[0].endswith("Z")
    assert (await core.read_namespaced_pod("p", NS)).status.phase == "Succeeded"
    assert await core.read_namespaced_pod_log("p", NS, tail_lines=1) == "three\n"
    assert await core.read_namespaced_pod_log("p", NS, limit_bytes=5) == "one\nt"

    await core.delete_namespaced_pod("p", NS)
    with pytest.raises(ApiException) as gone:
        await core.read_namespaced_pod_log("p", NS)
    assert gone.value.status == 404


async def test_scheduling_and_image_pull_failures_leave_pods_pending_with_events(
    kube: FakeKube, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    unschedulable = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    kube.script = lambda pod: (
        PodScript(unschedulable=unschedulable)
        if pod["metadata"]["name"] == "big"
        else PodScript(image_pull_error=True)
    )
    for name in ("big", "typo"):
        await core.create_namespaced_pod(
            NS, {"metadata": {"name": name}, "spec": {"containers": [container()]}}
        )

    async def events_of(pod: str) -> list[Any]:
        listed = await core.list_namespaced_event(NS, field_selector=f"involvedObject.name={pod}")
        return [e for e in listed.items if e.type == "Warning"]

    assert await wait_until(
        lambda: len([e for e in kube.list("events", NS) if e["type"] == "Warning"]) >= 2, TIMEOUT
    )
    (scheduling,) = await events_of("big")
    assert scheduling.reason == "FailedScheduling" and scheduling.message == unschedulable
    assert scheduling.last_timestamp is not None and scheduling.event_time is not None
    (pulling,) = await events_of("typo")
    assert pulling.reason == "Failed" and '"registry.example/train:1"' in pulling.message

    big = await core.read_namespaced_pod("big", NS)
    assert big.status.phase == "Pending" and big.spec.node_name is None
    assert [(c.type, c.status, c.reason) for c in big.status.conditions] == [
        ("PodScheduled", "False", "Unschedulable")
    ]
    assert await wait_until(
        lambda: (
            kube.get("pods", NS, "typo")["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]  # type: ignore[index]
            == "ImagePullBackOff"
        ),
        TIMEOUT,
    )
    with pytest.raises(ApiException) as waiting:
        await core.read_namespaced_pod_log("typo", NS)
    assert "trying and failing to pull image" in status_of(waiting.value)["message"]


async def test_injected_failures_answer_every_request_until_healed(
    kube: FakeKube, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    kube.fail(status=503, seconds=60)
    with pytest.raises(ApiException) as failing:
        await core.list_namespaced_pod(NS)
    assert failing.value.status == 503 and status_of(failing.value)["code"] == 503
    kube.heal()
    assert (await core.list_namespaced_pod(NS)).items == []

    kube.fail(status=500, seconds=0.2)
    await asyncio.sleep(0.3)  # the failure was for 0.2 s; this waits it out, it asserts nothing
    assert (await core.list_namespaced_pod(NS)).items == []


async def test_the_request_log_names_each_call_as_rbac_does(kube: FakeKube, api: client.ApiClient) -> None:
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    kube.script = lambda pod: PodScript(lines=["hi"], run_seconds=0.05)
    await batch.create_namespaced_job(NS, indexed_job("train", 1))
    await batch.read_namespaced_job("train", NS)
    await batch.patch_namespaced_job("train", NS, {"metadata": {"labels": {"x": "1"}}})
    await core.list_pod_for_all_namespaces(label_selector="job-name=train")
    assert await wait_until(lambda: job_condition(kube, "train") is not None, TIMEOUT)
    pod = kube.list("pods", NS)[0]["metadata"]["name"]
    assert await core.read_namespaced_pod_log(pod, NS) == "hi\n"
    async with watch.Watch() as w:
        assert [e async for e in w.stream(core.list_namespaced_event, NS, timeout_seconds=1)]
    await batch.delete_namespaced_job("train", NS, propagation_policy="Foreground", grace_period_seconds=0)

    assert [r.rbac for r in kube.requests] == [
        ("batch", "jobs", "create"),
        ("batch", "jobs", "get"),
        ("batch", "jobs", "patch"),
        ("", "pods", "list"),
        ("", "pods/log", "get"),
        ("", "events", "watch"),
        ("batch", "jobs", "delete"),
    ]
    assert kube.requests[3].namespace is None and kube.requests[4].name == pod
    role = [
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["pods", "pods/log", "events"], "verbs": ["get", "list", "watch"]},
    ]
    assert all(permitted(role, r) for r in kube.requests)
    assert not permitted(role[1:], kube.requests[0])


def test_resolve_env_reads_fields_and_expands_earlier_variables() -> None:
    pod = {
        "metadata": {
            "name": "p",
            "namespace": NS,
            "uid": "u",
            "labels": {"l": "x"},
            "annotations": {"a": "3"},
        },
        "spec": {"nodeName": "node-1"},
        "status": {"podIP": "10.244.1.5"},
    }
    spec = container(
        env=[
            {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "INDEX", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['a']"}}},
            {"name": "LABEL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['l']"}}},
            {"name": "ENDPOINT", "value": "$(HOST):6170/$(INDEX)"},
            {"name": "LATER", "value": "$(NEXT) $$(HOST)"},
            {"name": "NEXT", "value": "n"},
        ]
    )
    assert resolve_env(pod, spec) == {
        "HOST": "10.244.1.5",
        "INDEX": "3",
        "LABEL": "x",
        "ENDPOINT": "10.244.1.5:6170/3",
        "LATER": "$(NEXT) $(HOST)",
        "NEXT": "n",
    }
    with pytest.raises(ValueError, match=r"only valueFrom\.fieldRef"):
        resolve_env(
            pod, container(env=[{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}])
        )
