"""The simulated kubelet: nodes without a container runtime, as a client of the real API
server. It registers its node with cpu, memory, ephemeral-storage and `nvidia.com/gpu`
capacity, keeps the node's Lease renewed (so the node lifecycle controller keeps it Ready
and untainted), and moves each pod the real scheduler bound to it through its phases as the test's script
says. It speaks only as `system:node:<name>`, so the Node authorizer and the
NodeRestriction admission plugin judge every request as they would a real kubelet's, and
serves the containers' logs to the API server (`pods/log`, kube_real/logs.py).

Why not KWOK: docs/testing.md ("The simulated kubelet").
"""

from __future__ import annotations

import datetime
import http.client
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kube_real.client import ApiError, KubeClient, Obj
from kube_real.logs import LogServer, LogStore

log = logging.getLogger(__name__)
LEASE_SECONDS = 40
HEARTBEAT = 10.0


@dataclass(frozen=True)
class PodScript:
    """What a pod's containers do when they start. The default: exit 0 at once (a
    server under restartPolicy Always runs until deleted)."""

    # What each container prints when it starts (served as its log).
    lines: tuple[str, ...] = ()
    exit_code: int = 0
    # The terminated state's reason (OOMKilled, ...); by default Completed for 0, else Error.
    reason: str | None = None
    # The containers keep running until the pod is deleted.
    run_forever: bool = False
    # The containers run this long before they exit (0: at once); a pod deleted meanwhile
    # ends as a deleted pod does.
    run_seconds: float = 0.0
    # The image is never pulled: waiting in ErrImagePull, then ImagePullBackOff.
    image_pull_error: bool = False
    # The pod's first volume other than an emptyDir never mounts, with this error: the pod stays Pending, its
    # containers waiting in ContainerCreating, and the kubelet's Warning Event FailedMount
    # says `MountVolume.SetUp failed for volume "<volume>" : <mount_error>`, as the real
    # one's volume manager words it (pkg/volume/util/operationexecutor).
    mount_error: str | None = None
    # The node evicts the pod instead: Failed, reason Evicted, condition DisruptionTarget.
    evict: bool = False
    # Each container prints its environment first, `NAME=value` a line, resolved as a
    # kubelet resolves it (downward API fields, `$(VAR)` references).
    print_env: bool = False
    # The containers run until the test sets this (then, or once `run_seconds` passed
    # as well, they exit), printing `final_lines` as they do: a test decides when a pod
    # ends without guessing how long anything takes.
    until: threading.Event | None = None
    final_lines: tuple[str, ...] = ()
    # Init containers that print and exit as said, by name: (name, lines, exit code). The
    # others succeed at once, silent. One that exits non-zero fails the pod (restartPolicy
    # Never) before the main containers start, as a real kubelet does.
    init: tuple[tuple[str, tuple[str, ...], int], ...] = ()


_REFERENCE = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")
_FIELD = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def _field(pod: Obj, path: str) -> str:
    """A downward-API `fieldRef` of `pod`, as the kubelet reads it."""
    meta, spec = pod["metadata"], pod["spec"]
    if match := _FIELD.match(path):
        return str((meta.get(match[1]) or {}).get(match[2], ""))
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": "127.0.0.1",
        "status.hostIP": "127.0.0.1",
    }
    return str(simple.get(path) or "")


def environment(pod: Obj, container: Obj) -> list[tuple[str, str]]:
    """A container's `env` as the kubelet gives it to the process: each `valueFrom.fieldRef`
    read from the pod, each `$(VAR)` replaced by an earlier variable's value (an unknown one
    is left as written, `$$` is a `$`), as Kubernetes' expansion does."""
    values: dict[str, str] = {}
    result = []
    for var in container.get("env") or ():
        if "value" in var:

            def expand(match: re.Match[str]) -> str:
                if match[0] == "$$":
                    return "$"
                return values.get(match[1], match[0])

            value = _REFERENCE.sub(expand, var["value"])
        elif "fieldRef" in (var.get("valueFrom") or {}):
            value = _field(pod, var["valueFrom"]["fieldRef"]["fieldPath"])
        else:
            value = ""  # secrets, config maps and resources: not simulated
        values[var["name"]] = value
        result.append((var["name"], value))
    return result


def default_script(pod: Obj) -> PodScript:
    return PodScript(run_forever=pod["spec"].get("restartPolicy") == "Always")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _now_micro() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class SimulatedKubelet:
    """One node. `script` decides, per pod, what its containers do; set it before the pod
    is created. `start()` registers the node and returns once it is Ready."""

    def __init__(
        self,
        client: KubeClient,
        node: str,
        *,
        cpu: str = "16",
        memory: str = "64Gi",
        gpus: int = 4,
        pods: int = 110,
        ephemeral_storage: str = "100Gi",
        serving: tuple[Path, Path, Path] | None = None,
    ) -> None:
        """`serving`: the certificate, key and CA of the HTTPS endpoint the API server
        reads logs from; without it `pods/log` is not served."""
        self.client = client
        self.logs = LogStore()
        self._log_server = LogServer(self.logs, *serving) if serving else None
        self.node = node
        # Every real kubelet advertises ephemeral-storage; a pod that requests some (the Kaniko
        # executor) is otherwise left Pending, "Insufficient ephemeral-storage".
        self.capacity = {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpus), "pods": str(pods)}
        self.capacity["ephemeral-storage"] = ephemeral_storage
        self.script: Callable[[Obj], PodScript] = default_script
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._handled: set[str] = set()  # uids of pods whose containers were started
        self._ended: set[str] = set()  # uids of pods whose containers exited

    # -- the node ----------------------------------------------------------------------
    def _conditions(self) -> list[Obj]:
        now = _now()
        ok = {"status": "False", "lastHeartbeatTime": now, "lastTransitionTime": now}
        return [
            {"type": "MemoryPressure", "reason": "KubeletHasSufficientMemory", **ok},
            {"type": "DiskPressure", "reason": "KubeletHasNoDiskPressure", **ok},
            {"type": "PIDPressure", "reason": "KubeletHasSufficientPID", **ok},
            {
                **ok,
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "simulated kubelet",
            },
        ]

    def _register(self) -> None:
        port = self._log_server.port if self._log_server else 0
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node,
                "labels": {
                    "kubernetes.io/hostname": self.node,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                },
            },
            # Nodes, unlike most kinds, take their status on create: a kubelet registers
            # with its capacity and conditions in one request.
            "status": {
                "capacity": self.capacity,
                "allocatable": self.capacity,
                "conditions": self._conditions(),
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": self.node},
                ],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
                "nodeInfo": {
                    "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
                    "osImage": "simulated", "containerRuntimeVersion": "simulated://0",
                    "kubeletVersion": "v0.0.0-simulated", "kubeProxyVersion": "",
                    "operatingSystem": "linux", "architecture": "amd64",
                },
            },
        }  # fmt: skip
        reply = self.client.request("POST", "/api/v1/nodes", node)
        if reply.status == 409:
            self.client.merge_patch(f"/api/v1/nodes/{self.node}/status", {"status": node["status"]})
        elif reply.status != 201:
            raise ApiError("POST", "/api/v1/nodes", reply)

    def _heartbeat(self) -> None:
        """Renews the node's Lease (kube-node-lease), as a kubelet does every 10 s."""
        path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.node},
            "spec": {
                "holderIdentity": self.node,
                "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": _now_micro(),
            },
        }
        if self.client.request("POST", path, lease).status == 409:
            self.client.merge_patch(f"{path}/{self.node}", {"spec": {"renewTime": _now_micro()}})

    def _heartbeats(self) -> None:
        while not self._stop.wait(HEARTBEAT):
            try:
                self._heartbeat()
                self.client.merge_patch(
                    f"/api/v1/nodes/{self.node}/status", {"status": {"conditions": self._conditions()}}
                )
            except (ApiError, OSError) as e:
                log.warning("simulated kubelet %s: heartbeat failed: %s", self.node, e)

    # -- pods --------------------------------------------------------------------------
    def _pods(self) -> None:
        selector = {"fieldSelector": f"spec.nodeName={self.node}"}
        while not self._stop.is_set():
            try:
                listing = self.client.get("/api/v1/pods", query=selector)
                for pod in listing["items"]:
                    self._sync(pod)
                rv = listing["metadata"]["resourceVersion"]
                for event in self.client.watch(
                    "/api/v1/pods", resource_version=rv, query=selector, timeout=60
                ):
                    if self._stop.is_set():
                        return
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._sync(event["object"])
                    elif event["type"] == "DELETED":
                        self._handled.discard(event["object"]["metadata"]["uid"])
                        self._ended.discard(event["object"]["metadata"]["uid"])
                    elif event["type"] == "ERROR":
                        break  # 410 Gone: list again
            # A connection cut mid-answer (the API server restarting, or stop() closing
            # it) is an HTTPException, not an OSError: list again, or end when stopping.
            except (ApiError, OSError, http.client.HTTPException) as e:
                if not self._stop.is_set():
                    log.warning("simulated kubelet %s: %s; listing again", self.node, e)
                    self._stop.wait(1.0)
            except Exception as e:
                self.errors.append(e)
                log.exception("simulated kubelet %s crashed", self.node)
                return

    def _status_path(self, pod: Obj) -> str:
        meta = pod["metadata"]
        return f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"

    def _sync(self, pod: Obj) -> None:
        meta, status = pod["metadata"], pod.get("status") or {}
        if meta.get("deletionTimestamp"):
            self._finish_deletion(pod)
            return
        if status.get("phase") in ("Succeeded", "Failed") or meta["uid"] in self._handled:
            return
        self._handled.add(meta["uid"])
        self._run(pod, self.script(pod))

    def _container_statuses(self, pod: Obj, state: Obj, *, ready: bool) -> list[Obj]:
        return [
            {
                "name": c["name"],
                "image": c["image"],
                "imageID": "",
                "containerID": f"simulated://{pod['metadata']['uid']}/{c['name']}"
                if ready or "terminated" in state
                else "",
                "ready": ready,
                "started": "running" in state,
                "restartCount": 0,
                "state": state,
            }
            for c in pod["spec"]["containers"]
        ]

    def _init_statuses(self, pod: Obj, started: str, codes: dict[str, int] | None = None) -> list[Obj]:
        """Init containers end at once, in order, with their `codes` (0 by default): the
        main containers start only after them; those after a failed one wait."""
        statuses, failed = [], False
        for c in pod["spec"].get("initContainers") or ():
            code = (codes or {}).get(c["name"], 0)
            if failed:
                state: Obj = {"waiting": {"reason": "PodInitializing"}}
            else:
                reason = "Completed" if code == 0 else "Error"
                ended = {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": started}
                state = {"terminated": ended}
                failed = code != 0
            statuses.append(
                {
                    "name": c["name"],
                    "image": c["image"],
                    "imageID": "",
                    "ready": "terminated" in state and code == 0,
                    "restartCount": 0,
                    "state": state,
                }
            )
        return statuses

    def _conditions_for(self, pod: Obj, ready: bool) -> list[Obj]:
        now = _now()
        flag = "True" if ready else "False"
        return [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": flag, "lastTransitionTime": now},
            {"type": "Ready", "status": flag, "lastTransitionTime": now},
        ]

    def _patch_status(self, pod: Obj, status: Obj) -> None:
        reply = self.client.request(
            "PATCH", self._status_path(pod), {"status": status}, content_type="application/merge-patch+json"
        )
        if reply.status == 404:
            return  # deleted meanwhile
        if not 200 <= reply.status < 300:
            raise ApiError("PATCH", self._status_path(pod), reply)

    def _run(self, pod: Obj, script: PodScript) -> None:
        started = _now()
        base = {"hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}], "startTime": started}
        if script.mount_error is not None:
            self._mount_fails(pod, base, script.mount_error)
            return
        if script.image_pull_error:
            for reason in ("ErrImagePull", "ImagePullBackOff"):
                waiting = {
                    "waiting": {
                        "reason": reason,
                        "message": f'Back-off pulling image "{pod["spec"]["containers"][0]["image"]}"',
                    }
                }
                self._patch_status(
                    pod,
                    {**base, "phase": "Pending", "conditions": self._conditions_for(pod, False),
                     "containerStatuses": self._container_statuses(pod, waiting, ready=False)},
                )  # fmt: skip
            return
        codes = {name: code for name, _, code in script.init}
        printed = {name: lines for name, lines, _ in script.init}
        for c in pod["spec"].get("initContainers") or ():
            # Every init container has a log (empty unless the script says), as on a node.
            key = (pod["metadata"]["namespace"], pod["metadata"]["name"], c["name"])
            self.logs.open(key)
            for line in printed.get(c["name"], ()):
                self.logs.print(key, line)
            self.logs.finish(key)
            if codes.get(c["name"], 0):
                break
        if any(codes.values()):
            self._ended.add(pod["metadata"]["uid"])
            waiting = {"waiting": {"reason": "PodInitializing"}}
            self._patch_status(
                pod,
                {**base, "phase": "Failed", "conditions": self._conditions_for(pod, False),
                 "initContainerStatuses": self._init_statuses(pod, started, codes),
                 "containerStatuses": self._container_statuses(pod, waiting, ready=False)},
            )  # fmt: skip
            return
        for c in pod["spec"]["containers"]:
            key = (pod["metadata"]["namespace"], pod["metadata"]["name"], c["name"])
            self.logs.open(key)
            if script.print_env:
                for name, value in environment(pod, c):
                    self.logs.print(key, f"{name}={value}")
            for line in script.lines:
                self.logs.print(key, line)
        running = {"running": {"startedAt": started}}
        ip = "127.0.0.1"
        self._patch_status(
            pod,
            {**base, "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
             "conditions": self._conditions_for(pod, True),
             "initContainerStatuses": self._init_statuses(pod, started),
             "containerStatuses": self._container_statuses(pod, running, ready=True)},
        )  # fmt: skip
        if script.evict:
            message = "The node was low on resource: memory."
            target = {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}
            target |= {"message": message, "lastTransitionTime": _now()}
            conditions = [*self._conditions_for(pod, False), target]
            self._patch_status(
                pod, {"phase": "Failed", "reason": "Evicted", "message": message, "conditions": conditions}
            )
            return
        if script.run_forever:
            return
        if script.until is not None:
            thread = threading.Thread(
                target=self._run_until, args=(pod, script, started), name=f"pod-{pod['metadata']['name']}"
            )
            thread.daemon = True
            thread.start()
            return
        if script.run_seconds > 0:
            timer = threading.Timer(script.run_seconds, self._finish_run, (pod, script, started))
            timer.daemon = True
            timer.start()
            return
        self._terminate(pod, script.exit_code, script.reason, started, script.final_lines)

    def _mount_fails(self, pod: Obj, base: Obj, error: str) -> None:
        """The pod waits for a volume that does not mount, and the node says so in an Event."""
        waiting = {"waiting": {"reason": "ContainerCreating"}}
        conditions = [
            {**c, "status": "False"} if c["type"] == "Initialized" else c
            for c in self._conditions_for(pod, False)
        ]
        self._patch_status(
            pod,
            {**base, "phase": "Pending", "conditions": conditions,
             "containerStatuses": self._container_statuses(pod, waiting, ready=False)},
        )  # fmt: skip
        meta = pod["metadata"]
        # An emptyDir always mounts: the first other volume is the one that fails.
        volumes = pod["spec"].get("volumes") or [{"name": "data"}]
        volume = next((v for v in volumes if "emptyDir" not in v), volumes[0])["name"]
        now = _now()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{time.time_ns():x}", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                "namespace": meta["namespace"], "uid": meta["uid"],
            },
            "reason": "FailedMount",
            "message": f'MountVolume.SetUp failed for volume "{volume}" : {error}',
            "type": "Warning",
            "source": {"component": "kubelet", "host": self.node},
            "reportingComponent": "kubelet",
            "reportingInstance": self.node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }  # fmt: skip
        path = f"/api/v1/namespaces/{meta['namespace']}/events"
        reply = self.client.request("POST", path, event)
        if reply.status != 201:
            raise ApiError("POST", path, reply)

    def _run_until(self, pod: Obj, script: PodScript, started: str) -> None:
        """The containers run until the script's event is set (and `run_seconds` passed)."""
        assert script.until is not None
        deadline = time.monotonic() + script.run_seconds
        while not (script.until.is_set() and time.monotonic() >= deadline):
            if self._stop.wait(0.1):
                return
        self._finish_run(pod, script, started)

    def _finish_run(self, pod: Obj, script: PodScript, started: str) -> None:
        """A container that ran `run_seconds` exits, unless its pod went meanwhile."""
        uid = pod["metadata"]["uid"]
        if self._stop.is_set() or uid not in self._handled or uid in self._ended:
            return
        try:
            self._terminate(pod, script.exit_code, script.reason, started, script.final_lines)
        except (ApiError, OSError, http.client.HTTPException) as e:
            log.warning("simulated kubelet %s: ending %s: %s", self.node, pod["metadata"]["name"], e)
        except Exception as e:
            self.errors.append(e)
            log.exception("simulated kubelet %s crashed", self.node)

    def _terminate(
        self, pod: Obj, exit_code: int, reason: str | None, started: str, final_lines: tuple[str, ...] = ()
    ) -> None:
        self._ended.add(pod["metadata"]["uid"])
        for c in pod["spec"]["containers"]:
            key = (pod["metadata"]["namespace"], pod["metadata"]["name"], c["name"])
            for line in final_lines:
                self.logs.print(key, line)
            self.logs.finish(key)
        terminated = {
            "terminated": {
                "exitCode": exit_code,
                "reason": reason or ("Completed" if exit_code == 0 else "Error"),
                "startedAt": started,
                "finishedAt": _now(),
            }
        }
        self._patch_status(
            pod,
            {
                "phase": "Succeeded" if exit_code == 0 else "Failed",
                "conditions": self._conditions_for(pod, False),
                "containerStatuses": self._container_statuses(pod, terminated, ready=False),
            },
        )

    def _finish_deletion(self, pod: Obj) -> None:
        """A graceful delete: the containers stop (143, SIGTERM) and the kubelet removes
        the pod for good, as only the node's kubelet may once it has a node."""
        meta, status = pod["metadata"], pod.get("status") or {}
        if status.get("phase") not in ("Succeeded", "Failed"):
            self._terminate(pod, 143, "Error", (status.get("startTime") or _now()))
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        body = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": meta["uid"]},
        }
        reply = self.client.request("DELETE", path, body)
        if reply.status not in (200, 404, 409):
            raise ApiError("DELETE", path, reply)

    # -- life --------------------------------------------------------------------------
    def start(self) -> None:
        if self._log_server:
            self._log_server.start()
        self._register()
        self._heartbeat()
        for target, name in ((self._pods, "pods"), (self._heartbeats, "heartbeat")):
            thread = threading.Thread(target=target, name=f"kubelet-{self.node}-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self.client.close()
        if self._log_server:
            self._log_server.stop()
        for thread in self._threads:
            thread.join(timeout=10)
