"""The fake's HTTP API: discovery, the verbs on every served resource, watches, pod logs,
injected failures, and a log of every request in the terms RBAC uses."""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from aiohttp import web

from kube_fake.kubelet import Kubelet, Run
from kube_fake.protobuf import decode_secret
from kube_fake.resources import (
    BY_PATH,
    GROUP_VERSIONS,
    PODS,
    RESOURCES,
    KubeError,
    Obj,
    Resource,
    field_selector,
    json_patch,
    label_selector,
    merge_patch,
    nano_timestamp,
    now,
    parse_timestamp,
    status_object,
)
from kube_fake.store import Expired, Store

VERSION = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.0-fake",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.24.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}
_PUBLIC = {"/version", "/healthz", "/livez", "/readyz"}
_REASONS = {
    400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 409: "Conflict",
    410: "Gone", 429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout",
}  # fmt: skip
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
PROTOBUF = "application/vnd.kubernetes.protobuf"


class KubeRequest(NamedTuple):
    """One request to a resource, as RBAC sees it. `namespace` is None for cluster-scoped
    resources and cluster-wide lists; `name` is None for lists, watches of a collection
    and creates."""

    verb: str  # get, list, watch, create, update, patch, delete, deletecollection
    group: str
    version: str
    resource: str
    subresource: str
    namespace: str | None
    name: str | None

    @property
    def rbac(self) -> tuple[str, str, str]:
        """(apiGroup, resource as a Role names it, verb): ("", "pods/log", "get")."""
        resource = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        return self.group, resource, self.verb


def permitted(rules: Iterable[Mapping[str, Any]], request: KubeRequest) -> bool:
    """Whether a Role's `rules` allow `request` (with `*` wildcards and resourceNames)."""
    group, resource, verb = request.rbac

    def allows(values: Iterable[str] | None, value: str) -> bool:
        return any(v in ("*", value) for v in values or ())

    return any(
        allows(rule.get("apiGroups"), group)
        and allows(rule.get("resources"), resource)
        and allows(rule.get("verbs"), verb)
        and (not rule.get("resourceNames") or request.name in rule["resourceNames"])
        for rule in rules
    )


@dataclass(frozen=True)
class Target:
    resource: Resource
    namespace: str | None
    name: str | None
    subresource: str


def parse_target(path: str) -> Target:
    """The resource a path names: /api/v1/pods, /api/v1/namespaces/ns/pods/x/log,
    /apis/batch/v1/namespaces/ns/jobs/x/status, /api/v1/namespaces/ns."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise _no_such_path()
    namespace = None
    nested = BY_PATH.get((group, version, rest[2])) if len(rest) >= 3 and rest[0] == "namespaces" else None
    if nested and nested.namespaced:
        resource, namespace, rest = nested, rest[1], rest[2:]
    else:
        found = BY_PATH.get((group, version, rest[0]))
        if found is None or (found.namespaced and len(rest) > 1):
            raise _no_such_path()
        resource = found
    name = rest[1] if len(rest) > 1 else None
    subresource = rest[2] if len(rest) > 2 else ""
    if len(rest) > 3 or (subresource and subresource not in resource.subresources):
        raise _no_such_path()
    return Target(resource, namespace, name, subresource)


def _no_such_path() -> KubeError:
    return KubeError(404, "NotFound", "the server could not find the requested resource")


def _bool(query: Mapping[str, str], name: str) -> bool:
    """A boolean query parameter as Go's strconv.ParseBool reads it."""
    value = query.get(name, "false")
    if value in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if value in ("0", "f", "F", "FALSE", "false", "False", ""):
        return False
    raise KubeError(400, "BadRequest", f"invalid boolean value for {name}: {value!r}")


def _int(query: Mapping[str, str], name: str) -> int | None:
    value = query.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise KubeError(400, "BadRequest", f"invalid integer value for {name}: {value!r}") from None


def rbac_verb(method: str, target: Target, watch: bool) -> str:
    if method == "GET":
        if watch:
            return "watch"
        return "get" if target.name else "list"
    verbs = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
    if method not in verbs:
        raise KubeError(
            405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
        )
    if method == "DELETE" and not target.name:
        return "deletecollection"
    return verbs[method]


class Faults:
    """An injected failure: every request answers `status` until `until` (monotonic)."""

    def __init__(self) -> None:
        self.status = 0
        self.until = 0.0

    def current(self) -> int | None:
        return self.status if self.status and time.monotonic() < self.until else None


class ApiServer:
    """The aiohttp application of the fake API server."""

    def __init__(
        self,
        store: Store,
        kubelet: Kubelet,
        faults: Faults,
        report: Callable[[BaseException], None],
        *,
        anonymous: bool = False,
    ):
        self.store = store
        self.anonymous = anonymous
        self.kubelet = kubelet
        self.faults = faults
        self.requests: list[KubeRequest] = []
        self._report = report
        # Set to end every open stream at once (an injected failure, shutdown); replaced after.
        self._cut = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self.handle)
        return app

    def cut_streams(self) -> None:
        """End every open watch and log stream, as a restarting API server would."""
        self.store.close_watches()
        self._cut.set()
        self._cut = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            path = request.path.rstrip("/") or "/"
            document = self._discovery(path)
            target = verb = None
            if document is None:
                target = parse_target(path)
                verb = rbac_verb(request.method, target, _bool(request.query, "watch"))
                self.requests.append(
                    KubeRequest(
                        verb,
                        target.resource.group,
                        target.resource.version,
                        target.resource.plural,
                        target.subresource,
                        target.namespace,
                        target.name,
                    )
                )
            if (code := self.faults.current()) is not None:
                reason = _REASONS.get(code, "Unknown")
                headers = {"Retry-After": "1"} if code in (429, 503) else None
                body = status_object(code, reason, f"injected failure: {reason}")
                return web.json_response(body, status=code, headers=headers)
            token = request.headers.get("Authorization", "").startswith("Bearer ")
            if path not in _PUBLIC and not token and not self.anonymous:
                raise KubeError(401, "Unauthorized", "Unauthorized")
            if document is not None:
                if request.method != "GET":
                    raise KubeError(405, "MethodNotAllowed", "the server does not allow this method")
                return (
                    web.json_response(document)
                    if not isinstance(document, str)
                    else web.Response(text=document)
                )
            assert target is not None and verb is not None
            return await self._serve(request, target, verb)
        except KubeError as e:
            return web.json_response(e.status(), status=e.code)
        except Exception as e:  # a bug in the fake: reported, and answered as the real server would
            self._report(e)
            return web.json_response(
                status_object(500, "InternalError", f"fake API server error: {e!r}"), status=500
            )

    # Discovery.
    def _discovery(self, path: str) -> Obj | str | None:
        if path in ("/healthz", "/livez", "/readyz"):
            return "ok"
        if path == "/version":
            return VERSION
        if path == "/api":
            return {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
            }
        groups = sorted({g for g, _ in GROUP_VERSIONS if g})
        if path == "/apis":
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(g) for g in groups]}
        if path.startswith("/apis/") and path.count("/") == 2 and path[6:] in groups:
            return {"kind": "APIGroup", "apiVersion": "v1", **_group(path[6:])}
        for group, version in GROUP_VERSIONS:
            if path == (f"/apis/{group}/{version}" if group else f"/api/{version}"):
                return _resource_list(group, version)
        return None

    # The verbs.
    async def _serve(self, request: web.Request, target: Target, verb: str) -> web.StreamResponse:
        resource, name, sub = target.resource, target.name, target.subresource
        namespace = target.namespace or ""
        query = request.query
        if sub == "log":
            if verb != "get":
                raise KubeError(405, "MethodNotAllowed", "pods/log can only be read")
            return await self._log(request, namespace, str(name))
        if verb == "get":
            return web.json_response(self.store.get(resource, namespace, str(name)))
        if verb in ("list", "watch"):
            labels = label_selector(query.get("labelSelector"))
            fields = field_selector(resource, query.get("fieldSelector"))
            if name:  # the old form of watching one object: /api/v1/namespaces/ns/pods/x?watch=1
                by_name = fields
                fields = lambda obj: obj["metadata"]["name"] == name and by_name(obj)  # noqa: E731
            if verb == "watch":
                return await self._watch(request, target, labels, fields)
            # Items of a list carry no kind or apiVersion: the list's own say what they are.
            items = [
                {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
                for obj in self.store.list(resource, target.namespace, labels, fields)
            ]
            return web.json_response(
                {
                    "kind": f"{resource.kind}List",
                    "apiVersion": resource.api_version,
                    "metadata": {"resourceVersion": str(self.store.rv)},
                    "items": items,
                }
            )
        if verb == "create":
            if name:
                raise KubeError(405, "MethodNotAllowed", "POST names a collection, not an object")
            body = await _body(request, dict)
            return web.json_response(self.store.create(resource, namespace, body), status=201)
        if verb == "update":
            body = await _body(request, dict)
            return web.json_response(self.store.replace(resource, namespace, str(name), body, sub))
        if verb == "patch":
            return web.json_response(await self._patch(request, target))
        if verb == "delete" and not sub:
            return web.json_response(await self._delete(request, resource, namespace, str(name)))
        raise KubeError(
            405, "MethodNotAllowed", f"{verb} is not emulated on {resource.plural}{'/' + sub if sub else ''}"
        )

    async def _patch(self, request: web.Request, target: Target) -> Obj:
        name, namespace = str(target.name), target.namespace or ""
        current = self.store.get(target.resource, namespace, name)
        if request.content_type in (MERGE_PATCH, STRATEGIC_MERGE_PATCH):
            patch: Any = await _body(request, dict)
            patched = merge_patch(current, patch)
        elif request.content_type == JSON_PATCH:
            patch = await _body(request, list)
            patched = json_patch(current, patch)
        else:
            raise KubeError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format ({request.content_type}) - accepted "
                f"media types include: {JSON_PATCH}, {MERGE_PATCH}, {STRATEGIC_MERGE_PATCH} "
                "(server-side apply is not emulated)",
            )
        # A resourceVersion in a merge patch is a precondition; without one the patch applies
        # to whatever is current.
        if not (isinstance(patch, dict) and (patch.get("metadata") or {}).get("resourceVersion")):
            patched["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        return self.store.replace(target.resource, namespace, name, patched, target.subresource)

    async def _delete(self, request: web.Request, resource: Resource, namespace: str, name: str) -> Obj:
        options = await _body(request, dict) if request.can_read_body else {}
        propagation = (
            request.query.get("propagationPolicy") or options.get("propagationPolicy") or "Background"
        )
        if propagation not in ("Orphan", "Background", "Foreground"):
            raise KubeError(
                400,
                "BadRequest",
                f"propagationPolicy {propagation!r} is not Orphan, Background or Foreground",
            )
        # gracePeriodSeconds is accepted and has no effect: objects go at once.
        _int(request.query, "gracePeriodSeconds")
        preconditions = options.get("preconditions")
        last = self.store.delete(resource, namespace, name, propagation, preconditions)
        if resource.plural in ("pods", "namespaces"):
            return last  # these answer with the object, the others with a Status
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {
                "name": name,
                "group": resource.group,
                "kind": resource.plural,
                "uid": last["metadata"]["uid"],
            },
        }

    async def _watch(
        self, request: web.Request, target: Target, labels: Any, fields: Any
    ) -> web.StreamResponse:
        since = _int(request.query, "resourceVersion")
        timeout = _int(request.query, "timeoutSeconds")
        bookmarks = _bool(request.query, "allowWatchBookmarks")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        try:
            # "0" means "any": like no resourceVersion, it starts with the current objects.
            watcher = self.store.watch(target.resource, target.namespace, labels, fields, since or None)
        except Expired as e:
            # The real server answers 200 and then an ERROR event with a 410 Status.
            await _send(response, "ERROR", status_object(410, "Expired", str(e)))
            return response
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        try:
            while True:
                remaining = None if deadline is None else deadline - loop.time()
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), remaining)
                except TimeoutError:
                    if bookmarks:
                        bookmark = {
                            "kind": target.resource.kind,
                            "apiVersion": target.resource.api_version,
                            "metadata": {"resourceVersion": str(self.store.rv)},
                        }
                        await _send(response, "BOOKMARK", bookmark)
                    break
                if item is None:
                    break
                await _send(response, *item)
        except ConnectionResetError:
            # The watcher hung up (a client's watch ended, or it was closed at shutdown) while
            # an event was on its way: the real API server drops the stream the same way.
            return response
        finally:
            self.store.unwatch(watcher)
        await response.write_eof()
        return response

    async def _log(self, request: web.Request, namespace: str, name: str) -> web.StreamResponse:
        pod = self.store.get(PODS, namespace, name)
        query = request.query
        containers = [c["name"] for c in pod["spec"]["containers"]]
        container = query.get("container")
        if not container:
            if len(containers) != 1:
                raise KubeError(
                    400,
                    "BadRequest",
                    f"a container name must be specified for pod {name}, "
                    f"choose one of: [{' '.join(containers)}]",
                )
            container = containers[0]
        elif container not in containers:
            raise KubeError(400, "BadRequest", f"container {container} is not valid for pod {name}")
        log = self.kubelet.logs[pod["metadata"]["uid"]][container]
        if _bool(query, "previous"):
            run = log.previous
            if run is None:
                raise KubeError(
                    400,
                    "BadRequest",
                    f'previous terminated container "{container}" in pod "{name}" not found',
                )
        else:
            run = log.current
            if run is None:
                raise KubeError(
                    400,
                    "BadRequest",
                    f'container "{container}" in pod "{name}" is waiting to start: '
                    f"{_waiting(pod, container)}",
                )
        follow, stamps = _bool(query, "follow"), _bool(query, "timestamps")
        tail = _int(query, "tailLines")
        since_seconds = _int(query, "sinceSeconds")
        oldest = parse_timestamp(query["sinceTime"]) if query.get("sinceTime") else None
        if since_seconds is not None:
            oldest = now() - datetime.timedelta(seconds=since_seconds)
        lines = run.lines
        start = 0 if tail is None else max(0, len(lines) - tail)
        while oldest and start < len(lines) and lines[start][0] < oldest:
            start += 1
        limit = _int(query, "limitBytes")
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        await self._stream_log(response, run, start, follow, stamps, limit)
        await response.write_eof()
        return response

    async def _stream_log(
        self, response: web.StreamResponse, run: Run, sent: int, follow: bool, stamps: bool, limit: int | None
    ) -> None:
        """Lines from the `sent`th on, then with `follow` each as it is printed until the
        container ends; at most `limit` bytes when given (limitBytes)."""
        while True:
            changed, cut = run.changed, self._cut
            if sent < len(run.lines):
                chunk = "".join(
                    (f"{nano_timestamp(when)} {text}\n" if stamps else f"{text}\n")
                    for when, text in run.lines[sent:]
                ).encode()
                sent = len(run.lines)
                if limit is not None:
                    chunk, limit = chunk[:limit], limit - len(chunk[:limit])
                await response.write(chunk)
                if limit == 0:
                    return
                continue
            if not follow or run.done:
                return
            waits = [asyncio.ensure_future(changed.wait()), asyncio.ensure_future(cut.wait())]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waits:
                    waiter.cancel()
            if cut.is_set():
                return


async def _body(request: web.Request, kind: type) -> Any:
    try:
        if request.content_type == PROTOBUF:
            # Go's typed clients (Helm's release Secrets) write protobuf.
            body = decode_secret(await request.read())
        else:
            body = await request.json()
    except ValueError:
        raise KubeError(400, "BadRequest", "the body of the request was not valid JSON") from None
    if not isinstance(body, kind):
        raise KubeError(400, "BadRequest", f"the body of the request must be a JSON {kind.__name__}")
    return body


async def _send(response: web.StreamResponse, kind: str, obj: Obj) -> None:
    await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")


def _waiting(pod: Obj, container: str) -> str:
    for status in pod.get("status", {}).get("containerStatuses") or ():
        if status["name"] == container:
            reason = status["state"].get("waiting", {}).get("reason", "ContainerCreating")
            if reason in ("ErrImagePull", "ImagePullBackOff"):
                return "trying and failing to pull image"
            return str(reason)
    return "ContainerCreating"


def _group(group: str) -> Obj:
    versions = [{"groupVersion": f"{group}/{v}", "version": v} for g, v in GROUP_VERSIONS if g == group]
    return {"name": group, "versions": versions, "preferredVersion": versions[0]}


def _resource_list(group: str, version: str) -> Obj:
    verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
    resources = []
    for r in RESOURCES:
        if (r.group, r.version) != (group, version):
            continue
        resources.append(
            {
                "name": r.plural,
                "singularName": r.kind.lower(),
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": verbs,
            }
        )
        for sub in r.subresources:
            sub_verbs = ["get"] if sub == "log" else ["get", "patch", "update"]
            resources.append(
                {
                    "name": f"{r.plural}/{sub}",
                    "singularName": "",
                    "namespaced": r.namespaced,
                    "kind": "Pod" if sub == "log" else r.kind,
                    "verbs": sub_verbs,
                }
            )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }
