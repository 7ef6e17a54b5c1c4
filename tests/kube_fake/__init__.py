"""A stateful fake Kubernetes API server, with Job and StatefulSet controllers and a fake
kubelet, for testing the kubernetes jobs backend end to end on loopback.

    with FakeKube() as kube:
        kube.write_kubeconfig(tmp_path / "kubeconfig")
        kube.script = lambda pod: PodScript(exit_code=137, reason="OOMKilled") if ... else PodScript()
        ... drive the backend, or kubernetes_asyncio, against kube.url ...
        assert kube.get("jobs", "ns", "x")["status"]["completedIndexes"] == "0-2"

The model. aiohttp serves on 127.0.0.1 (a port the kernel picks) from a thread of its own
with its own event loop, so sync tests, async tests and a `paddlecloud server` subprocess
can all use it. Objects live in memory (store.py) under one global resourceVersion that
every write increases; a bounded history of changes (`history`, 1000) lets a watch resume
from any resourceVersion it still holds and answers older ones with an ERROR event of
code 410, as after an etcd compaction. Creates get a uid, a creationTimestamp, names from
generateName, the defaults readers rely on, and validation of names and labels; quota
admission refuses pods that would exceed a ResourceQuota with the real message. Deletes
are immediate (no graceful termination, no finalizers); dependents named by
ownerReferences are garbage-collected right after (Orphan strips the reference instead),
and deleting a namespace deletes everything in it. Controllers (controllers.py) and the
kubelet (kubelet.py) run on the same loop and write status directly, so their writes
raise resourceVersions and reach watches but are not in the request log.

Emulated: the resources in resources.RESOURCES (core pods, pods/log, services,
configmaps, secrets, resourcequotas, limitranges, events, namespaces, nodes; apps/v1
statefulsets; batch/v1 jobs; networking.k8s.io/v1 networkpolicies; and, stored with no
controller, what the Helm chart installs: serviceaccounts, deployments,
poddisruptionbudgets, ingresses, RBAC roles and bindings); get, list, watch,
create, update, patch (merge, strategic merge as merge: lists are replaced whole, and
JSON patch), delete; label selectors (=, ==, !=, exists, !exists, in, notin), the field
selectors the real server supports per resource; Secrets in protobuf (Go's typed clients:
Helm's release records, protobuf.py); anonymous requests with `anonymous=True` (Go
clients send no token over plain http); 409 AlreadyExists and Conflict, 404
NotFound, 422 Invalid, 403 Forbidden, as `Status` objects; discovery (/version, /api,
/apis, /api/v1, /apis/<group>/<version>, with or without a trailing slash); a bearer
token, any token, is required except on /version and the health checks.

Not emulated: deletecollection, server-side apply, dry runs, `limit`/`continue` (lists
come whole), list `resourceVersion` semantics (lists are always current), graceful
deletion, finalizers, RBAC enforcement (the request log is there to check it instead),
NonIndexed Jobs (refused with 422), `suspend`, Job pod-recreation back-off,
`activeDeadlineSeconds`, StatefulSet volumeClaimTemplates and rolling updates, Services'
endpoints, NetworkPolicy enforcement, LimitRange defaulting, envFrom and secret or
ConfigMap env references in the kubelet (the container waits in
CreateContainerConfigError instead).

kmock (0.8, the emulator by kopf's author) was tried first and not used: it does not
recognise kubernetes_asyncio's `watch=True` as a watch, keeps no resourceVersions (a
literal "..."), uids, label selectors, history or 410s, does not fill namespaces from the
URL, answers 500 to POST /api/v1/namespaces and 404 to /version/ and /apis/, has no
watch timeouts, and has no garbage collection, controllers or kubelet. Patching all of
that would have been more code than this, and harder to read.
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import copy
import logging
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import yaml
from aiohttp import web

from kube_fake.controllers import Controllers, compress_indexes
from kube_fake.kubelet import Kubelet, PodScript, default_script, pod_index, resolve_env
from kube_fake.quota import parse_quantity
from kube_fake.resources import BY_PLURAL, NAMESPACES, NODES, KubeError, Obj, label_selector
from kube_fake.server import ApiServer, Faults, KubeRequest, permitted
from kube_fake.store import Store

__all__ = [
    "FakeKube",
    "KubeError",
    "KubeRequest",
    "PodScript",
    "compress_indexes",
    "default_script",
    "parse_quantity",
    "permitted",
    "pod_index",
    "resolve_env",
]

_log = logging.getLogger("kube_fake")
_T = TypeVar("_T")
_CALL_TIMEOUT = 10.0


class FakeKube:
    """The fake cluster: start it with `with FakeKube() as kube:` (or start()/stop()).

    Every method may be called from any thread, the fake's own included (a pod script
    runs there). What they return is a copy. An error inside the fake (a bug, or a
    script that raised) is kept in `errors`, and leaving the `with` block then fails."""

    def __init__(
        self,
        *,
        step: float = 0.02,
        resync: float = 0.1,
        history: int = 1000,
        nodes: Sequence[str] = ("node-1", "node-2", "node-3"),
        anonymous: bool = False,
    ) -> None:
        """`step`: seconds between a pod's phases; `resync`: how often the controllers look
        again without a change (quota retries); `history`: changes a watch can resume from;
        `anonymous`: answer requests without a token too, as a server with anonymous auth
        does (Go clients send no token over plain http, so Helm and kubectl need it)."""
        self.anonymous = anonymous
        self.step = step
        self.resync = resync
        self.history = history
        self.nodes = tuple(nodes)
        self.errors: list[BaseException] = []
        self._faults = Faults()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._stopping: asyncio.Event | None = None
        self._script: Callable[[Obj], PodScript] = default_script
        self.url = ""

    # Starting and stopping.
    def __enter__(self) -> FakeKube:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        if self.errors and kind is None:
            raise AssertionError(
                "the fake Kubernetes failed:\n"
                + "\n".join("".join(traceback.format_exception(e)) for e in self.errors)
            )

    def start(self) -> FakeKube:
        self._thread = threading.Thread(target=self._serve, name="kube-fake", daemon=True)
        self._thread.start()
        if not self._ready.wait(_CALL_TIMEOUT):
            raise RuntimeError("the fake Kubernetes did not start within 10 s")
        if self._startup_error is not None:
            raise RuntimeError("the fake Kubernetes did not start") from self._startup_error
        return self

    def stop(self) -> None:
        if self._thread is None or self._loop is None or self._stopping is None:
            return
        self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(_CALL_TIMEOUT)
        self._thread = None

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except BaseException as e:
            self._startup_error = e
            self._ready.set()
        finally:
            loop.close()

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        self._store = store = Store(self.history)
        self._kubelet = kubelet = Kubelet(store, self.nodes, self.step, self._report)
        kubelet.script = self._run_script
        controllers = Controllers(store, self.resync, self._report)
        self._api = api = ApiServer(store, kubelet, self._faults, self._report, anonymous=self.anonymous)
        for name in ("default", "kube-system", "kube-public"):
            store.create(NAMESPACES, "", {"metadata": {"name": name}})
        for name in self.nodes:
            store.create(NODES, "", {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
        # Handlers are cancelled when their client goes, so a watch the client closed does
        # not linger until shutdown.
        runner = web.AppRunner(api.app(), handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        task = asyncio.create_task(controllers.run(), name="kube-fake-controllers")
        task.add_done_callback(self._controllers_ended)
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await kubelet.stop()
            api.cut_streams()
            await runner.cleanup()

    def _controllers_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled():
            self._report(task.exception() or RuntimeError("the controllers' loop returned"))

    def _report(self, error: BaseException) -> None:
        _log.error("kube_fake_error", exc_info=error)
        self.errors.append(error)

    def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run `fn` on the fake's loop and return what it returns (a copy)."""
        if self._loop is None or self._thread is None:
            raise RuntimeError("the fake Kubernetes is not running")
        if threading.current_thread() is self._thread:
            return copy.deepcopy(fn(*args))
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(copy.deepcopy(fn(*args)))
            except BaseException as e:
                future.set_exception(e)

        self._loop.call_soon_threadsafe(run)
        return future.result(_CALL_TIMEOUT)

    # For clients.
    def write_kubeconfig(self, path: Path | str, *, namespace: str = "default") -> Path:
        """A kubeconfig at `path` that reaches this server over plain http with a token."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [
                {"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}
            ],
            "current-context": "fake",
        }
        path = Path(path)
        path.write_text(yaml.safe_dump(config))
        return path

    # What pods do.
    @property
    def script(self) -> Callable[[Obj], PodScript]:
        """Decides what each pod does, asked each time its containers start (again), with
        the pod as it is then. Use `pod_index(pod)` and `kube.attempt(pod)` to vary it."""
        return self._script

    @script.setter
    def script(self, script: Callable[[Obj], PodScript]) -> None:
        self._script = script

    def _run_script(self, pod: Obj) -> PodScript:
        return self._script(pod)

    def attempt(self, pod: Obj) -> int:
        """How many times this pod's work was tried before it: earlier pods of the same Job
        index (or StatefulSet ordinal) that still exist, plus its first container's restarts."""
        return self._call(self._kubelet.attempt, pod)

    def pause_kubelet(self) -> None:
        """Stop moving pods through their phases (they stay where they are) until resumed."""
        self._call(self._kubelet.resumed.clear)

    def resume_kubelet(self) -> None:
        self._call(self._kubelet.resumed.set)

    # Faults.
    def fail(self, status: int = 500, seconds: float = 60.0) -> None:
        """Answer every request with `status` (a Status body) for `seconds` or until heal(),
        and end the watches and log streams that are open, as a failing server would."""
        self._faults.status = status
        self._faults.until = time.monotonic() + seconds
        self._call(self._api.cut_streams)

    def heal(self) -> None:
        self._faults.status = 0

    def expire_watches(self) -> None:
        """End every open watch and forget the history: resuming from any resourceVersion
        before now answers 410 Gone, a new list and watch works."""
        self._call(self._store.expire)

    # Inspection and seeding.
    @property
    def requests(self) -> list[KubeRequest]:
        """Every request to a resource so far, in order (discovery is not recorded: every
        authenticated user may read it)."""
        return list(self._api.requests)

    def get(self, plural: str, namespace: str | None, name: str) -> Obj | None:
        return self._call(self._store.find, BY_PLURAL[plural], namespace or "", name)

    def list(
        self, plural: str, namespace: str | None = None, selector: str | None = None
    ) -> builtins.list[Obj]:
        return self._call(lambda: self._store.list(BY_PLURAL[plural], namespace, label_selector(selector)))

    def create(self, plural: str, obj: Obj) -> Obj:
        """Store an object as a POST would (without appearing in `requests`)."""
        namespace = obj.get("metadata", {}).get("namespace", "")
        return self._call(self._store.create, BY_PLURAL[plural], namespace, obj)

    def delete(self, plural: str, namespace: str | None, name: str) -> None:
        """Delete an object as a DELETE would (without appearing in `requests`)."""
        self._call(self._store.delete, BY_PLURAL[plural], namespace or "", name)

    def logs(
        self, namespace: str, pod: str, container: str | None = None, *, previous: bool = False
    ) -> builtins.list[str]:
        """The lines a container printed: its current run, or with `previous` the one before."""

        def read() -> builtins.list[str]:
            obj = self._store.get(BY_PLURAL["pods"], namespace, pod)
            logs = self._kubelet.logs[obj["metadata"]["uid"]]
            log = logs[container] if container else next(iter(logs.values()))
            run = log.previous if previous else log.current
            return [text for _, text in run.lines] if run else []

        return self._call(read)
