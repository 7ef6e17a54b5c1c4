"""The fake kubelet (and scheduler): it moves each pod through its phases as a script the
test chooses says, keeps the containers' logs, and records the events a real node would.

A pod's life: scheduled (`spec.nodeName`, PodScheduled) or left Pending as Unschedulable;
then Pending with its containers waiting in ContainerCreating (or in ErrImagePull and
ImagePullBackOff); then Running and Ready; then its containers terminate, and the pod is
Succeeded or Failed, or, under restartPolicy Always (or OnFailure after a failure), the
containers restart in place with `restartCount` + 1 and `lastState.terminated`. Every step
waits `step` seconds. All containers of a pod run the same script, in step. Init
containers succeed at once.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import functools
import itertools
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kube_fake.resources import PODS, Obj, now, timestamp
from kube_fake.store import Change, Store

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
POD_INDEX = "apps.kubernetes.io/pod-index"


@dataclass(frozen=True)
class PodScript:
    """What a pod does, as the script the test sets decides for each start of its
    containers. The defaults print the containers' environment and exit 0 after 0.2 s."""

    # What each container prints; None: its name and its resolved environment, `NAME=value`.
    lines: Sequence[str] | None = None
    exit_code: int = 0
    # The terminated state's reason; by default Completed for exit 0, else Error.
    reason: str | None = None
    # How long the containers run (the lines spread over it); None: until the pod is deleted.
    run_seconds: float | None = 0.2
    # The scheduler's message, e.g. "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.":
    # the pod stays Pending, and the script is asked again every `step` until it is None.
    unschedulable: str | None = None
    # The containers never start: ErrImagePull, then ImagePullBackOff.
    image_pull_error: bool = False
    # Instead of exiting, the pod is evicted: Failed, reason Evicted, condition DisruptionTarget.
    evict: bool = False


def default_script(pod: Obj) -> PodScript:
    """Run to completion quickly; run forever under restartPolicy Always (a server)."""
    return PodScript(run_seconds=None) if pod["spec"].get("restartPolicy") == "Always" else PodScript()


def pod_index(pod: Obj) -> int | None:
    """The pod's index in its Indexed Job or StatefulSet, from the label the controller sets."""
    labels = pod["metadata"].get("labels") or {}
    index = labels.get(COMPLETION_INDEX, labels.get(POD_INDEX))
    return int(index) if index is not None else None


_FIELD = re.compile(r"^metadata\.(labels|annotations)\['([^']*)'\]$")
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def resolve_env(pod: Obj, container: Obj) -> dict[str, str]:
    """A container's environment as the kubelet gives it: `value`s with `$(VAR)` expanded
    from variables defined before them (`$$` escapes; unknown references stay as they
    are), and `valueFrom.fieldRef` read from the pod (metadata.name, .namespace, .uid,
    .labels['k'], .annotations['k'], spec.nodeName, spec.serviceAccountName,
    status.podIP, status.hostIP). ValueError for a source this does not resolve
    (configMapKeyRef, secretKeyRef, resourceFieldRef, envFrom)."""
    if container.get("envFrom"):
        raise ValueError(f"container {container['name']}: envFrom is not resolved by the fake")
    env: dict[str, str] = {}
    for var in container.get("env") or ():
        name = var["name"]
        if "valueFrom" in var:
            ref = var["valueFrom"].get("fieldRef")
            if ref is None:
                raise ValueError(f"env {name}: only valueFrom.fieldRef is resolved by the fake")
            env[name] = _field(pod, ref["fieldPath"])
        else:

            def expand(m: re.Match[str], known: dict[str, str] = env) -> str:
                if m[0] == "$$":
                    return "$"
                return known.get(m[1], m[0])

            env[name] = _REFERENCE.sub(expand, var.get("value", ""))
    return env


def _field(pod: Obj, path: str) -> str:
    if m := _FIELD.match(path):
        return str((pod["metadata"].get(m[1]) or {}).get(m[2], ""))
    simple = {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"].get("namespace", ""),
        "metadata.uid": pod["metadata"]["uid"],
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
        "status.podIP": pod.get("status", {}).get("podIP", ""),
        "status.hostIP": pod.get("status", {}).get("hostIP", ""),
    }
    if path not in simple:
        raise ValueError(f"fieldRef {path!r} is not resolved by the fake")
    return str(simple[path])


@dataclass
class Run:
    """One run of one container: its log lines, and whether it has terminated."""

    lines: list[tuple[datetime.datetime, str]] = field(default_factory=list)
    done: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def print(self, text: str) -> None:
        self.lines.append((now(), text))
        self._wake()

    def finish(self) -> None:
        self.done = True
        self._wake()

    def _wake(self) -> None:
        # Followers wait on the event they saw; each change gives them a fresh one.
        self.changed.set()
        self.changed = asyncio.Event()


@dataclass
class ContainerLog:
    current: Run | None = None
    previous: Run | None = None


class PodGone(Exception):
    """The pod was deleted while the kubelet was working on it."""


class Kubelet:
    """Runs every pod the store holds, on `nodes`, one task per pod."""

    def __init__(
        self, store: Store, nodes: Sequence[str], step: float, report: Callable[[BaseException], None]
    ):
        self.store = store
        self.step = step
        self.script: Callable[[Obj], PodScript] = default_script
        self.logs: dict[str, dict[str, ContainerLog]] = {}  # pod uid: container: its runs
        self._nodes = itertools.cycle(list(enumerate(nodes, start=1)))
        self._ips = itertools.count(2)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._report = report
        self.resumed = asyncio.Event()
        self.resumed.set()
        store.subscribe(self._on_change)

    def _on_change(self, change: Change) -> None:
        if change.resource is not PODS:
            return
        meta = change.obj["metadata"]
        uid = meta["uid"]
        if change.type == "ADDED":
            self.logs[uid] = {c["name"]: ContainerLog() for c in change.obj["spec"]["containers"]}
            task = asyncio.get_running_loop().create_task(
                self._live(meta["namespace"], meta["name"], uid),
                name=f"kubelet-{meta['namespace']}-{meta['name']}",
            )
            self._tasks[uid] = task
            task.add_done_callback(self._done)
        elif change.type == "DELETED":
            if uid in self._tasks:
                self._tasks.pop(uid).cancel()
            for log in self.logs.pop(uid, {}).values():
                if log.current:
                    log.current.finish()

    def _done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (error := task.exception()) and not isinstance(error, PodGone):
            self._report(error)

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def attempt(self, pod: Obj) -> int:
        """How many times this pod's work was tried before: earlier pods of the same owner
        and index that still exist, plus restarts of its first container."""
        index = pod_index(pod)
        owner = [r["uid"] for r in pod["metadata"].get("ownerReferences") or () if r.get("controller")]
        earlier = 0
        if owner and index is not None:
            created = self.store.created(pod)
            for other in self.store.list(PODS, pod["metadata"]["namespace"]):
                refs = [
                    r["uid"] for r in other["metadata"].get("ownerReferences") or () if r.get("controller")
                ]
                if refs == owner and pod_index(other) == index and self.store.created(other) < created:
                    earlier += 1
        statuses = pod.get("status", {}).get("containerStatuses") or [{}]
        return earlier + int(statuses[0].get("restartCount", 0))

    # The pod's life.
    async def _tick(self) -> None:
        await asyncio.sleep(self.step)
        await self.resumed.wait()

    def _pod(self, namespace: str, name: str, uid: str) -> Obj:
        pod = self.store.find(PODS, namespace, name)
        if pod is None or pod["metadata"]["uid"] != uid:
            raise PodGone(name)
        return pod

    def _update(self, namespace: str, name: str, uid: str, change: Callable[[Obj], None]) -> Obj:
        pod = self._pod(namespace, name, uid)
        new = copy.deepcopy(pod)
        change(new)
        return self.store.commit(PODS, pod, new)

    def _script(self, pod: Obj) -> PodScript:
        return self.script(copy.deepcopy(pod))

    async def _live(self, namespace: str, name: str, uid: str) -> None:
        def update(change: Callable[[Obj], None]) -> Obj:
            return self._update(namespace, name, uid, change)

        await self._tick()
        script = self._script(self._pod(namespace, name, uid))
        while script.unschedulable is not None:
            message = script.unschedulable
            pod = update(functools.partial(_unschedulable, message=message))
            self.store.record_event(pod, "Warning", "FailedScheduling", message, "default-scheduler")
            await self._tick()
            script = self._script(self._pod(namespace, name, uid))

        number, node = next(self._nodes)
        pod = update(functools.partial(_bind, node=node))
        self.store.record_event(
            pod,
            "Normal",
            "Scheduled",
            f"Successfully assigned {namespace}/{name} to {node}",
            "default-scheduler",
        )
        await self._tick()
        host_ip, pod_ip = f"10.0.0.{number}", f"10.244.{number}.{next(self._ips) % 250 + 2}"
        pod = update(functools.partial(_create_containers, host_ip=host_ip, pod_ip=pod_ip))
        await self._tick()

        if script.image_pull_error:
            for container in pod["spec"]["containers"]:
                image = container.get("image", "")
                message = (
                    f'Failed to pull image "{image}": rpc error: code = NotFound desc = {image}: not found'
                )
                waiting = functools.partial(_wait, containers={container["name"]}, message=message)
                pod = update(functools.partial(waiting, reason="ErrImagePull"))
                self.store.record_event(pod, "Warning", "Failed", message, "kubelet")
                await self._tick()
                message = f'Back-off pulling image "{image}"'
                waiting = functools.partial(_wait, containers={container["name"]}, message=message)
                pod = update(functools.partial(waiting, reason="ImagePullBackOff"))
                self.store.record_event(pod, "Normal", "BackOff", message, "kubelet")
            return

        while True:
            try:
                environments = {c["name"]: resolve_env(pod, c) for c in pod["spec"]["containers"]}
            except ValueError as e:
                everyone = {c["name"] for c in pod["spec"]["containers"]}
                pod = update(
                    functools.partial(
                        _wait, containers=everyone, reason="CreateContainerConfigError", message=str(e)
                    )
                )
                self.store.record_event(pod, "Warning", "Failed", f"Error: {e}", "kubelet")
                return
            runs = self._start_runs(pod["metadata"]["uid"])
            pod = update(_start)
            self.store.record_event(pod, "Normal", "Started", "Started container", "kubelet")
            try:
                await self._run(script, environments, runs)
            finally:
                for run in runs.values():
                    run.finish()
            if script.evict:
                update(_evict)
                return
            pod = update(functools.partial(_terminate, script=script))
            if pod["status"]["phase"] in ("Succeeded", "Failed"):
                return
            await self._tick()
            script = self._script(self._pod(namespace, name, uid))

    def _start_runs(self, uid: str) -> dict[str, Run]:
        runs = {}
        for container, log in self.logs[uid].items():
            if log.current is not None:
                log.previous = log.current
            log.current = runs[container] = Run()
        return runs

    async def _run(
        self, script: PodScript, environments: dict[str, dict[str, str]], runs: dict[str, Run]
    ) -> None:
        printed = {
            c: list(script.lines)
            if script.lines is not None
            else [f"{c} started", *(f"{k}={v}" for k, v in env.items())]
            for c, env in environments.items()
        }
        count = max((len(lines) for lines in printed.values()), default=0)
        interval = script.run_seconds / (count + 1) if script.run_seconds else self.step
        for i in range(count):
            await asyncio.sleep(interval)
            for container, lines in printed.items():
                if i < len(lines):
                    runs[container].print(lines[i])
        if script.run_seconds is None:
            await asyncio.Event().wait()  # until the pod is deleted and this task cancelled
        else:
            await asyncio.sleep(max(0.0, script.run_seconds - interval * count))


def _set_condition(
    pod: Obj, kind: str, status: str, reason: str | None = None, message: str | None = None
) -> None:
    conditions = pod["status"].setdefault("conditions", [])
    old = next((c for c in conditions if c["type"] == kind), None)
    new: dict[str, Any] = {"type": kind, "status": status, "lastProbeTime": None}
    new["lastTransitionTime"] = old["lastTransitionTime"] if old and old["status"] == status else timestamp()
    if reason:
        new["reason"] = reason
    if message:
        new["message"] = message
    if old:
        conditions[conditions.index(old)] = new
    else:
        conditions.append(new)


def _bind(pod: Obj, node: str) -> None:
    pod["spec"]["nodeName"] = node
    _set_condition(pod, "PodScheduled", "True")


def _container_status(container: Obj, state: Obj, restarts: int = 0, ready: bool = False) -> Obj:
    return {
        "name": container["name"],
        "image": container.get("image", ""),
        "imageID": "",
        "containerID": f"containerd://{secrets.token_hex(32)}",
        "ready": ready,
        "started": "running" in state,
        "restartCount": restarts,
        "state": state,
        "lastState": {},
    }


def _create_containers(pod: Obj, host_ip: str, pod_ip: str) -> None:
    status = pod["status"]
    status.update(hostIP=host_ip, podIP=pod_ip, podIPs=[{"ip": pod_ip}], startTime=timestamp())
    status["hostIPs"] = [{"ip": host_ip}]
    when = timestamp()
    done = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": when, "finishedAt": when}}
    if pod["spec"].get("initContainers"):
        status["initContainerStatuses"] = [_container_status(c, done) for c in pod["spec"]["initContainers"]]
    status["containerStatuses"] = [
        _container_status(c, {"waiting": {"reason": "ContainerCreating"}}) for c in pod["spec"]["containers"]
    ]
    _set_condition(pod, "PodReadyToStartContainers", "True")
    _set_condition(pod, "Initialized", "True")
    for kind in ("Ready", "ContainersReady"):
        _set_condition(pod, kind, "False", "ContainersNotReady", "containers with unready status")


def _unschedulable(pod: Obj, message: str) -> None:
    _set_condition(pod, "PodScheduled", "False", "Unschedulable", message)


def _wait(pod: Obj, containers: set[str], reason: str, message: str) -> None:
    for status in pod["status"]["containerStatuses"]:
        if status["name"] in containers:
            status["state"] = {"waiting": {"reason": reason, "message": message}}


def _start(pod: Obj) -> None:
    pod["status"]["phase"] = "Running"
    for status in pod["status"]["containerStatuses"]:
        status.update(state={"running": {"startedAt": timestamp()}}, ready=True, started=True)
    for kind in ("Ready", "ContainersReady"):
        _set_condition(pod, kind, "True")


def _terminate(pod: Obj, script: PodScript) -> None:
    """The containers exit; they restart in place if the restart policy says so."""
    reason = script.reason or ("Completed" if script.exit_code == 0 else "Error")
    policy = pod["spec"].get("restartPolicy", "Always")
    restart = policy == "Always" or (policy == "OnFailure" and script.exit_code != 0)
    for status in pod["status"]["containerStatuses"]:
        started = status["state"].get("running", {}).get("startedAt", timestamp())
        terminated = {
            "exitCode": script.exit_code,
            "reason": reason,
            "startedAt": started,
            "finishedAt": timestamp(),
        }
        terminated["containerID"] = status["containerID"]
        status.update(ready=False, started=False)
        if restart:
            waiting = "CrashLoopBackOff" if script.exit_code else "Completed"
            message = (
                f"back-off 10s restarting failed container={status['name']} pod={pod['metadata']['name']}"
            )
            status.update(lastState={"terminated": terminated}, restartCount=status["restartCount"] + 1)
            status["state"] = {"waiting": {"reason": waiting, "message": message}}
            status["containerID"] = f"containerd://{secrets.token_hex(32)}"
        else:
            status["state"] = {"terminated": terminated}
    if not restart:
        failed = script.exit_code != 0
        pod["status"]["phase"] = "Failed" if failed else "Succeeded"
    for kind in ("Ready", "ContainersReady"):
        _set_condition(pod, kind, "False", "PodCompleted" if not restart else "ContainersNotReady")


def _evict(pod: Obj) -> None:
    message = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi."
    pod["status"].update(phase="Failed", reason="Evicted", message=message)
    for status in pod["status"]["containerStatuses"]:
        started = status["state"].get("running", {}).get("startedAt", timestamp())
        status.update(ready=False, started=False)
        status["state"] = {
            "terminated": {
                "exitCode": 137,
                "reason": "Error",
                "startedAt": started,
                "finishedAt": timestamp(),
            }
        }
    _set_condition(pod, "DisruptionTarget", "True", "TerminationByKubelet", message)
    for kind in ("Ready", "ContainersReady"):
        _set_condition(pod, kind, "False", "PodFailed")
