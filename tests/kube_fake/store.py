"""The fake's objects: one global resourceVersion, a bounded history of changes that
watches replay, garbage collection by ownerReferences, and admission (names, labels,
namespaces, quotas). Everything here runs on the fake's event loop."""

from __future__ import annotations

import asyncio
import builtins
import collections
import copy
import random
import uuid
from collections.abc import Callable
from typing import NamedTuple

from kube_fake import quota
from kube_fake.resources import (
    BY_PLURAL,
    EVENTS,
    JOBS,
    NAMESPACES,
    PODS,
    QUOTAS,
    STATEFULSETS,
    KubeError,
    Obj,
    Predicate,
    Resource,
    invalid,
    micro_timestamp,
    not_found,
    qualified,
    timestamp,
    validate_labels,
    validate_name,
)

Key = tuple[str, str, str]  # plural, namespace ("" when cluster-scoped), name
# What the real server draws generateName suffixes from: no vowels, no look-alikes.
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


class Change(NamedTuple):
    """One write. `obj` is the new state, or for DELETED the last one (with the deletion's
    resourceVersion); `old` is the state before, None for ADDED."""

    rv: int
    type: str
    resource: Resource
    obj: Obj
    old: Obj | None


class Expired(Exception):
    """A watch asked for changes older than the history keeps."""


class Watcher:
    """One open watch: the events it should see, queued; None ends it."""

    def __init__(
        self, resource: Resource, namespace: str | None, labels: Predicate, fields: Predicate
    ) -> None:
        self.resource = resource
        self.namespace = namespace
        self.labels = labels
        self.fields = fields
        self.queue: asyncio.Queue[tuple[str, Obj] | None] = asyncio.Queue()

    def _matches(self, obj: Obj | None) -> bool:
        return obj is not None and self.labels(obj) and self.fields(obj)

    def offer(self, change: Change) -> None:
        """Queue what this watch sees of `change`. As the real watch cache does, an object
        that starts matching the selectors shows as ADDED and one that stops as DELETED."""
        if change.resource != self.resource:
            return
        if self.namespace is not None and change.obj["metadata"].get("namespace") != self.namespace:
            return
        now, before = self._matches(change.obj), self._matches(change.old)
        if change.type == "MODIFIED":
            kind = "MODIFIED" if now and before else "ADDED" if now else "DELETED" if before else None
        else:
            kind = change.type if now else None
        if kind:
            self.queue.put_nowait((kind, change.obj))

    def close(self) -> None:
        self.queue.put_nowait(None)


class Store:
    """Every object, by resource, namespace and name, with its watches and history."""

    def __init__(self, history: int) -> None:
        self.objects: dict[Key, Obj] = {}
        self._uids: dict[str, Key] = {}
        self._created: dict[str, int] = {}  # uid: the resourceVersion that created it
        self.rv = 0
        self._history: collections.deque[Change] = collections.deque(maxlen=history)
        # Changes at or before this resourceVersion can no longer be replayed.
        self._compacted = 0
        self._watchers: set[Watcher] = set()
        self._subscribers: list[Callable[[Change], None]] = []

    # Reading.
    def find(self, resource: Resource, namespace: str, name: str) -> Obj | None:
        return self.objects.get((resource.plural, namespace, name))

    def get(self, resource: Resource, namespace: str, name: str) -> Obj:
        obj = self.find(resource, namespace, name)
        if obj is None:
            raise not_found(resource, name)
        return obj

    def by_uid(self, uid: str) -> Obj | None:
        key = self._uids.get(uid)
        return self.objects[key] if key else None

    def created(self, obj: Obj) -> int:
        """When `obj` was created, as a resourceVersion: orders objects made in one second."""
        return self._created[obj["metadata"]["uid"]]

    def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        labels: Predicate | None = None,
        fields: Predicate | None = None,
    ) -> list[Obj]:
        """Objects in name order (namespace, then name), as the real server lists them."""
        found = [
            obj
            for (plural, ns, _), obj in sorted(self.objects.items())
            if plural == resource.plural
            and (namespace is None or ns == namespace)
            and (labels is None or labels(obj))
            and (fields is None or fields(obj))
        ]
        return found

    # Writing. Stored objects are never mutated in place: a write stores a new dict, so
    # what readers, watches and the history hold stays as it was.
    def create(self, resource: Resource, namespace: str, body: Obj) -> Obj:
        """Admit and store a new object, as a POST does."""
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        name = meta.get("name") or ""
        if not name:
            prefix = meta.get("generateName")
            if not prefix:
                raise KubeError(
                    422,
                    "Invalid",
                    f'{resource.kind} "" is invalid: metadata.name: Required value: '
                    "name or generateName is required",
                )
            name = prefix + "".join(random.choices(_SUFFIX_ALPHABET, k=5))  # noqa: S311
        validate_name(resource, name)
        validate_labels(resource, name, meta.get("labels") or {})
        if resource.namespaced:
            if meta.get("namespace", namespace) != namespace:
                raise KubeError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            ns = self.find(NAMESPACES, "", namespace)
            if ns is None:
                raise not_found(NAMESPACES, namespace)
            if ns["metadata"].get("deletionTimestamp"):
                raise KubeError(
                    403,
                    "Forbidden",
                    f'{resource.plural} "{name}" is forbidden: unable to create new content in namespace '
                    f"{namespace} because it is being terminated",
                )
            meta["namespace"] = namespace
        if (resource.plural, namespace, name) in self.objects:
            raise KubeError(
                409,
                "AlreadyExists",
                f'{qualified(resource)} "{name}" already exists',
                {"name": name, "group": resource.group, "kind": resource.plural},
            )
        meta.update(name=name, uid=str(uuid.uuid4()), creationTimestamp=timestamp())
        for field in ("resourceVersion", "deletionTimestamp", "selfLink"):
            meta.pop(field, None)
        obj["kind"], obj["apiVersion"] = resource.kind, resource.api_version
        if resource.has_status:
            meta["generation"] = 1
            obj["status"] = {}
        _default(resource, obj)
        _validate(resource, obj)
        if resource is PODS:
            quota.admit(obj, self.list(QUOTAS, namespace), self.list(PODS, namespace))
        self._write(resource, None, obj)
        self._created[meta["uid"]] = self.rv
        # An object whose owner is already gone is collected at once, as the real garbage
        # collector does when it finds a dangling owner reference.
        if any(ref.get("uid") not in self._uids for ref in meta.get("ownerReferences") or ()):
            asyncio.get_running_loop().call_soon(self._collect_dangling, resource, namespace, name)
        return obj

    def replace(self, resource: Resource, namespace: str, name: str, body: Obj, subresource: str = "") -> Obj:
        """Store `body` in place of an existing object, as a PUT or PATCH does: with a
        resourceVersion in it, only if that is still the current one."""
        old = self.get(resource, namespace, name)
        meta = body.get("metadata") or {}
        if meta.get("name", name) != name:
            raise KubeError(
                400,
                "BadRequest",
                f"the name of the object ({meta['name']}) does not match the name on the URL ({name})",
            )
        if meta.get("resourceVersion") not in (None, "", old["metadata"]["resourceVersion"]):
            raise KubeError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {qualified(resource)} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                {"name": name, "group": resource.group, "kind": resource.plural},
            )
        if subresource == "status":
            new = {**copy.deepcopy(old), "status": copy.deepcopy(body.get("status") or {})}
        else:
            new = copy.deepcopy(body)
            new["metadata"] = {
                **meta,
                **{
                    k: old["metadata"][k]
                    for k in ("name", "uid", "creationTimestamp", "generation")
                    if k in old["metadata"]
                },
            }
            if resource.namespaced:
                new["metadata"]["namespace"] = namespace
            new["kind"], new["apiVersion"] = resource.kind, resource.api_version
            validate_labels(resource, name, new["metadata"].get("labels") or {})
            if resource.has_status:
                new["status"] = old.get("status", {})
        return self.commit(resource, old, new)

    def commit(self, resource: Resource, old: Obj, new: Obj) -> Obj:
        """Store `new` as the next state of `old` (what controllers and the kubelet write
        directly). Nothing is written, and no resourceVersion spent, if nothing changed."""
        new = copy.deepcopy(new)
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if "generation" in old["metadata"] and _spec(new) != _spec(old):
            new["metadata"]["generation"] = old["metadata"]["generation"] + 1
        if new == old:
            return old
        self._write(resource, old, new)
        return new

    def delete(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        propagation: str = "Background",
        preconditions: Obj | None = None,
    ) -> Obj:
        """Remove an object at once; its dependents follow on the next turn of the loop (or
        lose their owner reference with propagation Orphan). A namespace takes everything
        in it along before it goes. `preconditions` (uid, resourceVersion) that the object
        no longer meets make it a 409 Conflict, as in DeleteOptions."""
        obj = self.get(resource, namespace, name)
        for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
            wanted = (preconditions or {}).get(field)
            if wanted and wanted != obj["metadata"][field]:
                raise KubeError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {qualified(resource)} "{name}": Precondition failed: '
                    f"{label} in precondition: {wanted}, {label} in object meta: {obj['metadata'][field]}",
                    {"name": name, "group": resource.group, "kind": resource.plural},
                )
        if resource is NAMESPACES:
            terminating = copy.deepcopy(obj)
            terminating["metadata"]["deletionTimestamp"] = timestamp()
            terminating["status"] = {"phase": "Terminating"}
            obj = self.commit(resource, obj, terminating)
            for (plural, ns, member), _ in list(self.objects.items()):
                if ns == name and (plural, ns, member) in self.objects:
                    self.delete(BY_PLURAL[plural], ns, member)
        del self.objects[(resource.plural, namespace, name)]
        del self._uids[obj["metadata"]["uid"]]
        del self._created[obj["metadata"]["uid"]]
        last = copy.deepcopy(obj)
        self.rv += 1
        last["metadata"]["resourceVersion"] = str(self.rv)
        self._emit(Change(self.rv, "DELETED", resource, last, obj))
        uid = obj["metadata"]["uid"]
        if propagation == "Orphan":
            self._orphan(uid)
        else:
            asyncio.get_running_loop().call_soon(self._collect, uid)
        return last

    def _write(self, resource: Resource, old: Obj | None, new: Obj) -> None:
        self.rv += 1
        new["metadata"]["resourceVersion"] = str(self.rv)
        key = (resource.plural, new["metadata"].get("namespace", ""), new["metadata"]["name"])
        self.objects[key] = new
        self._uids[new["metadata"]["uid"]] = key
        self._emit(Change(self.rv, "ADDED" if old is None else "MODIFIED", resource, new, old))

    def _emit(self, change: Change) -> None:
        if len(self._history) == self._history.maxlen:
            self._compacted = self._history[0].rv
        self._history.append(change)
        for watcher in self._watchers:
            watcher.offer(change)
        for subscriber in self._subscribers:
            subscriber(change)

    # Garbage collection.
    def _dependents(self, uid: str) -> builtins.list[tuple[Resource, Obj]]:
        return [
            (BY_PLURAL[plural], obj)
            for (plural, _, _), obj in list(self.objects.items())
            if any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or ())
        ]

    def _collect(self, uid: str) -> None:
        for resource, obj in self._dependents(uid):
            meta = obj["metadata"]
            if self.find(resource, meta.get("namespace", ""), meta["name"]) is obj:
                self.delete(resource, meta.get("namespace", ""), meta["name"])

    def _collect_dangling(self, resource: Resource, namespace: str, name: str) -> None:
        obj = self.find(resource, namespace, name)
        if obj is not None and any(
            ref.get("uid") not in self._uids for ref in obj["metadata"]["ownerReferences"]
        ):
            self.delete(resource, namespace, name)

    def _orphan(self, uid: str) -> None:
        for resource, obj in self._dependents(uid):
            orphaned = copy.deepcopy(obj)
            orphaned["metadata"]["ownerReferences"] = [
                ref for ref in obj["metadata"]["ownerReferences"] if ref.get("uid") != uid
            ]
            self.commit(resource, obj, orphaned)

    # Watching.
    def watch(
        self,
        resource: Resource,
        namespace: str | None,
        labels: Predicate,
        fields: Predicate,
        since: int | None,
    ) -> Watcher:
        """A watch that first sees every change after `since` (Expired if the history no
        longer reaches back that far), or with `since` None every current object as ADDED,
        and then each change as it happens."""
        watcher = Watcher(resource, namespace, labels, fields)
        if since is None:
            for obj in self.list(resource, namespace, labels, fields):
                watcher.queue.put_nowait(("ADDED", obj))
        else:
            if since < self._compacted:
                raise Expired(f"too old resource version: {since} ({self._compacted + 1})")
            for change in self._history:
                if change.rv > since:
                    watcher.offer(change)
        self._watchers.add(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        self._watchers.discard(watcher)

    def expire(self) -> None:
        """End every watch and forget the history, so that a watch from any resourceVersion
        a client has seen answers 410 Gone, as after an etcd compaction. The resourceVersion
        moves on by one, so that a new list gives one a watch can start from."""
        self.rv += 1
        self._compacted = self.rv
        self._history.clear()
        for watcher in list(self._watchers):
            watcher.close()

    def close_watches(self) -> None:
        for watcher in list(self._watchers):
            watcher.close()

    def record_event(self, involved: Obj, kind: str, reason: str, message: str, component: str) -> None:
        """A core/v1 Event about `involved`, as controllers and the kubelet record them: the
        same event again bumps `count` and `lastTimestamp` instead of adding another."""
        meta = involved["metadata"]
        namespace = meta.get("namespace", "default")
        for event in self.list(EVENTS, namespace):
            if (event["involvedObject"]["uid"], event["reason"], event["message"]) == (
                meta["uid"],
                reason,
                message,
            ):
                again = copy.deepcopy(event)
                again.update(count=event["count"] + 1, lastTimestamp=timestamp(), eventTime=micro_timestamp())
                self.commit(EVENTS, event, again)
                return
        if self.find(NAMESPACES, "", namespace) is None:
            return  # the namespace went with what the event is about
        self.create(
            EVENTS,
            namespace,
            {
                "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}"},
                "involvedObject": {
                    "kind": involved["kind"],
                    "apiVersion": involved["apiVersion"],
                    "namespace": namespace,
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "resourceVersion": meta["resourceVersion"],
                },
                "reason": reason,
                "message": message,
                "type": kind,
                "count": 1,
                "firstTimestamp": timestamp(),
                "lastTimestamp": timestamp(),
                "eventTime": micro_timestamp(),
                "source": {"component": component},
                "reportingComponent": component,
                "reportingInstance": component,
                "action": reason,
            },
        )

    def subscribe(self, subscriber: Callable[[Change], None]) -> None:
        """Call `subscriber` with every change, synchronously, after the watches see it."""
        self._subscribers.append(subscriber)


def _spec(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _default(resource: Resource, obj: Obj) -> None:
    """The defaults the real API server fills in that a reader of these objects relies on."""
    spec = obj.setdefault("spec", {}) if resource in (PODS, JOBS, STATEFULSETS) else None
    meta = obj["metadata"]
    if resource is NAMESPACES:
        meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
        obj["status"] = {"phase": "Active"}
    elif resource is PODS:
        assert spec is not None
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        for container in (*spec.get("initContainers", ()), *spec.get("containers", ())):
            # A limit without a request requests the limit.
            res = container.get("resources") or {}
            for name, value in (res.get("limits") or {}).items():
                res.setdefault("requests", {}).setdefault(name, value)
        obj["status"] = {"phase": "Pending", "qosClass": "Burstable"}
    elif resource is JOBS:
        assert spec is not None
        uid, name = meta["uid"], meta["name"]
        spec.setdefault("parallelism", 1)
        spec.setdefault("completions", 1)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("backoffLimit", 2**31 - 1 if "backoffLimitPerIndex" in spec else 6)
        spec.setdefault("suspend", False)
        selected = {"batch.kubernetes.io/controller-uid": uid}
        spec.setdefault("selector", {"matchLabels": selected})
        template_meta = spec.setdefault("template", {}).setdefault("metadata", {})
        template_meta["labels"] = {
            **(template_meta.get("labels") or {}),
            **selected,
            "controller-uid": uid,
            "batch.kubernetes.io/job-name": name,
            "job-name": name,
        }
    elif resource is STATEFULSETS:
        assert spec is not None
        spec.setdefault("replicas", 1)
        spec.setdefault("podManagementPolicy", "OrderedReady")
        spec.setdefault("updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})
        spec.setdefault("revisionHistoryLimit", 10)
        # kubernetes_asyncio's V1StatefulSetStatus refuses a status without replicas.
        obj["status"] = {"replicas": 0, "availableReplicas": 0}
    elif resource.plural == "services":
        obj["status"] = {"loadBalancer": {}}


def _validate(resource: Resource, obj: Obj) -> None:
    """What the real server refuses and the controllers here rely on, and what this fake
    does not model (refused, rather than run wrongly)."""
    name, spec = obj["metadata"]["name"], obj.get("spec", {})
    if resource is JOBS:
        template = spec.get("template", {})
        restart = template.get("spec", {}).get("restartPolicy")
        if restart not in ("Never", "OnFailure"):
            raise invalid(
                resource,
                name,
                "spec.template.spec.restartPolicy",
                f'Unsupported value: "{restart}": supported values: "OnFailure", "Never"',
            )
        if restart != "Never" and ("backoffLimitPerIndex" in spec or "podFailurePolicy" in spec):
            raise invalid(
                resource,
                name,
                "spec.template.spec.restartPolicy",
                'only "Never" is supported with backoffLimitPerIndex or podFailurePolicy',
            )
        if spec["completionMode"] != "Indexed":
            raise invalid(resource, name, "spec.completionMode", "the fake emulates only Indexed Jobs")
        if "maxFailedIndexes" in spec and "backoffLimitPerIndex" not in spec:
            raise invalid(resource, name, "spec.maxFailedIndexes", "requires spec.backoffLimitPerIndex")
        validate_labels(
            resource, name, template.get("metadata", {}).get("labels") or {}, "spec.template.metadata.labels"
        )
    elif resource is STATEFULSETS:
        wanted = (spec.get("selector") or {}).get("matchLabels") or {}
        labels = spec.get("template", {}).get("metadata", {}).get("labels") or {}
        if not wanted or any(labels.get(k) != v for k, v in wanted.items()):
            raise invalid(
                resource, name, "spec.template.metadata.labels", "`selector` does not match template `labels`"
            )
        validate_labels(resource, name, labels, "spec.template.metadata.labels")
    elif resource is PODS and not spec.get("containers"):
        raise invalid(resource, name, "spec.containers", "Required value")
