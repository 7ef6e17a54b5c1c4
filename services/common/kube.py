"""A thin layer over the Kubernetes REST API: manifests in, JSON objects out.

The jobs service's kubernetes backend and the builder's Kaniko backend both use it; the
connection settings are `jobs.kubernetes`'s (kubeconfig, context, timeouts): one cluster.

kubernetes-asyncio's `ApiClient` does what is hard to get right — kubeconfig and
in-cluster credentials, TLS, token refresh — and this module does the rest on top of
its `call_api`, with plain dicts rather than generated model classes: the backend's
manifests are dicts already (manifests.py), and the watch cache keeps what the API
server sent. Every call has a timeout (`request_timeout_seconds`); a watch asks the
server to end it after `watch_timeout_seconds`, and its reads time out a little later.

Errors become `KubeError` with the API's status and message, as the subclass that says
what to do about it: `NotFound` (404), `Conflict` (409: the name is taken, or a
precondition failed), `Forbidden` (403), `Gone` (410: a list or watch whose
resourceVersion is too old), `Unavailable` (no answer, 429 or 5xx: the server is away or
busy, try again later). Callers catch the kind they handle instead of comparing numbers.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import client, config

from paddlecloud.common.config import ConfigError, KubernetesSection


@dataclass(frozen=True)
class Resource:
    prefix: str  # api/v1 or apis/<group>/<version>
    plural: str
    namespaced: bool = True

    @property
    def group(self) -> str:
        return "" if self.prefix == "api/v1" else self.prefix.split("/")[1]

    def path(self, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
        parts = [f"/{self.prefix}"]
        if self.namespaced and namespace is not None:
            parts.append(f"/namespaces/{namespace}")
        parts.append(f"/{self.plural}")
        if name is not None:
            parts.append(f"/{name}")
            if sub:
                parts.append(f"/{sub}")
        return "".join(parts)


RESOURCES: dict[str, Resource] = {
    "Namespace": Resource("api/v1", "namespaces", namespaced=False),
    "PersistentVolume": Resource("api/v1", "persistentvolumes", namespaced=False),
    "PersistentVolumeClaim": Resource("api/v1", "persistentvolumeclaims"),
    "Pod": Resource("api/v1", "pods"),
    "Service": Resource("api/v1", "services"),
    "ConfigMap": Resource("api/v1", "configmaps"),
    "Secret": Resource("api/v1", "secrets"),
    "ResourceQuota": Resource("api/v1", "resourcequotas"),
    "LimitRange": Resource("api/v1", "limitranges"),
    "Event": Resource("api/v1", "events"),
    "StatefulSet": Resource("apis/apps/v1", "statefulsets"),
    "Job": Resource("apis/batch/v1", "jobs"),
    "NetworkPolicy": Resource("apis/networking.k8s.io/v1", "networkpolicies"),
    "Lease": Resource("apis/coordination.k8s.io/v1", "leases"),
    "RoleBinding": Resource("apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "SelfSubjectReview": Resource("apis/authentication.k8s.io/v1", "selfsubjectreviews", namespaced=False),
    # Served by metrics-server through the aggregation layer where a cluster has one;
    # a cluster without it answers 404 for the whole group.
    "PodMetrics": Resource("apis/metrics.k8s.io/v1beta1", "pods"),
}


class KubeError(Exception):
    """The API server refused a call, or could not be reached (status 0)."""

    def __init__(self, status: int, message: str, reason: str = "", causes: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        # The types of the Status's `details.causes` (their `reason`): what a caller may act
        # on beyond the status (NamespaceTerminating: a 403 that passes once the namespace
        # is gone).
        self.causes = causes


class NotFound(KubeError):
    """404: no such object (or namespace)."""


class Conflict(KubeError):
    """409: the name is taken (AlreadyExists), or a write's precondition failed."""


class Forbidden(KubeError):
    """403: not allowed (RBAC), or refused by admission (a Terminating namespace)."""


class Gone(KubeError):
    """410: the resourceVersion asked for is no longer in the server's history."""


class Unavailable(KubeError):
    """The API server did not answer (status 0), is throttling (429) or failing (5xx):
    nothing is wrong with the request, so it is worth trying again later."""


_BY_STATUS: dict[int, type[KubeError]] = {
    404: NotFound,
    409: Conflict,
    403: Forbidden,
    410: Gone,
    429: Unavailable,
}


def _error(status: int, body: Any, what: str) -> KubeError:
    message, reason = f"{what}: HTTP {status}", ""
    causes: tuple[str, ...] = ()
    if isinstance(body, dict):
        message = f"{what}: {body.get('message') or f'HTTP {status}'}"
        reason = str(body.get("reason") or "")
        details = body.get("details")
        found = details.get("causes") if isinstance(details, dict) else None
        if isinstance(found, list):
            # A StatusCause's type is written `reason` in JSON.
            causes = tuple(str(c["reason"]) for c in found if isinstance(c, dict) and c.get("reason"))
    kind = Unavailable if status == 0 or status >= 500 else _BY_STATUS.get(status, KubeError)
    return kind(status, message, reason, causes)


async def _read(response: aiohttp.ClientResponse, what: str) -> bytes:
    """The whole body, released after; KubeError if it breaks off."""
    try:
        return await response.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise Unavailable(0, f"{what}: the answer broke off ({exc or type(exc).__name__})") from exc
    finally:
        response.release()


async def _refuse_unless_ok(response: aiohttp.ClientResponse, what: str) -> None:
    """A stream's answer: KubeError (Gone for 410) with the API's Status unless it is 200."""
    if response.status != 200:
        try:
            body = await response.json(content_type=None)
        except (ValueError, aiohttp.ClientError):
            body = None
        raise _error(response.status, body, what)


class Kube:
    """One connection to one API server. `await Kube.connect(settings)`, then calls."""

    def __init__(self, api: client.ApiClient, settings: KubernetesSection) -> None:
        self._api = api
        self._timeout = settings.request_timeout_seconds
        self._watch_timeout = settings.watch_timeout_seconds

    @classmethod
    async def connect(cls, settings: KubernetesSection) -> Kube:
        configuration = client.Configuration()
        where = settings.kubeconfig
        try:
            if where == "in-cluster" or (where is None and os.environ.get("KUBERNETES_SERVICE_HOST")):
                config.load_incluster_config(client_configuration=configuration)
            else:
                await config.load_kube_config(
                    config_file=where, context=settings.context, client_configuration=configuration
                )
        except (config.ConfigException, yaml.YAMLError, OSError, TypeError, KeyError, ValueError) as exc:
            what = (
                "the in-cluster service account"
                if where == "in-cluster"
                else (where or "the default kubeconfig")
            )
            detail = " ".join(str(exc).split())[:300]
            raise ConfigError(f"jobs.kubernetes.kubeconfig: cannot use {what}: {detail}") from exc
        return cls(client.ApiClient(configuration), settings)

    @property
    def host(self) -> str:
        return str(self._api.configuration.host)

    async def close(self) -> None:
        await self._api.close()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        limit: Any = None,
    ) -> aiohttp.ClientResponse:
        params = [(k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in (query or {}).items()]
        try:
            response: aiohttp.ClientResponse = await self._api.call_api(
                path,
                method,
                query_params=params,
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=limit or self._timeout,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            why = str(exc) or type(exc).__name__
            raise Unavailable(0, f"{method} {path}: the API server did not answer ({why})") from exc
        return response

    async def _json(self, method: str, path: str, what: str, **kwargs: Any) -> Any:
        response = await self._call(method, path, **kwargs)
        raw = await _read(response, what)
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        if not 200 <= response.status < 300:
            raise _error(response.status, body, what)
        return body

    # -- objects ---------------------------------------------------------------------

    async def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        res = RESOURCES[kind]
        try:
            return await self._json("GET", res.path(namespace, name), f"get {kind} {name}")
        except NotFound:
            return None

    async def list(
        self,
        kind: str,
        namespace: str | None = None,
        *,
        selector: str | None = None,
        fields: str | None = None,
    ) -> dict[str, Any]:
        query = {k: v for k, v in (("labelSelector", selector), ("fieldSelector", fields)) if v}
        body = await self._json("GET", RESOURCES[kind].path(namespace), f"list {kind}", query=query)
        return body if isinstance(body, dict) else {"items": [], "metadata": {}}

    async def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Create `manifest`; `Conflict` (reason AlreadyExists) when its name is taken."""
        kind, meta = manifest["kind"], manifest["metadata"]
        path = RESOURCES[kind].path(meta.get("namespace"))
        return await self._json("POST", path, f"create {kind} {meta['name']}", body=dict(manifest))

    async def whoami(self) -> str:
        """The user name the API server knows these credentials by (a SelfSubjectReview,
        which every authenticated user may create): `system:serviceaccount:<ns>:<name>`
        for a ServiceAccount's token."""
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        answer = await self._json(
            "POST", RESOURCES["SelfSubjectReview"].path(None), "create SelfSubjectReview", body=review
        )
        return str(((answer or {}).get("status") or {}).get("userInfo", {}).get("username") or "")

    async def replace(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        kind, meta = manifest["kind"], manifest["metadata"]
        path = RESOURCES[kind].path(meta.get("namespace"), meta["name"])
        return await self._json("PUT", path, f"replace {kind} {meta['name']}", body=dict(manifest))

    async def patch(
        self, kind: str, namespace: str | None, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386)."""
        path = RESOURCES[kind].path(namespace, name)
        return await self._json(
            "PATCH",
            path,
            f"patch {kind} {name}",
            body=dict(patch),
            content_type="application/merge-patch+json",
        )

    async def delete(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        *,
        grace_seconds: float | None = None,
        uid: str | None = None,
    ) -> bool:
        """Delete in the background (the garbage collector removes what it owns); False
        if it was gone already. With `uid`, only that incarnation of the name."""
        body: dict[str, Any] = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "propagationPolicy": "Background",
        }
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = int(grace_seconds)
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        try:
            await self._json(
                "DELETE", RESOURCES[kind].path(namespace, name), f"delete {kind} {name}", body=body
            )
        except NotFound:
            return False  # gone already
        except Conflict:
            if uid is None:
                raise
            return False  # the name now belongs to a newer object
        return True

    # -- streams ---------------------------------------------------------------------

    async def watch(
        self, kind: str, namespace: str | None, *, selector: str | None, resource_version: str
    ) -> AsyncIterator[dict[str, Any]]:
        """The watch events after `resource_version` until the server ends the stream
        (at watch_timeout_seconds). Gone for a 410, as a status or as an ERROR event."""
        query: dict[str, Any] = {
            "watch": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": self._watch_timeout,
            "allowWatchBookmarks": "true",
        }
        if selector:
            query["labelSelector"] = selector
        what = f"watch {kind}"
        timeout = aiohttp.ClientTimeout(connect=self._timeout, sock_read=self._watch_timeout + self._timeout)
        response = await self._call("GET", RESOURCES[kind].path(namespace), query=query, limit=timeout)
        try:
            await _refuse_unless_ok(response, what)
            while True:
                try:
                    line = await response.content.readline()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    raise Unavailable(
                        0, f"{what}: the stream broke off ({exc or type(exc).__name__})"
                    ) from exc
                if not line:
                    return
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    raise _error(int(status.get("code") or 500), status, what)
                yield event
        finally:
            response.release()

    async def log(
        self,
        namespace: str,
        pod: str,
        container: str,
        *,
        previous: bool = False,
        tail: int | None = None,
        limit_bytes: int | None = None,
        since_time: str | None = None,
        timestamps: bool = False,
    ) -> str:
        """A container's log, whole (or its last `tail` lines / `limit_bytes`; from
        `since_time` on, an RFC 3339 time in whole seconds; each line after its kubelet
        timestamp with `timestamps`)."""
        query: dict[str, Any] = {"container": container}
        if previous:
            query["previous"] = "true"
        if tail is not None:
            query["tailLines"] = tail
        if limit_bytes is not None:
            query["limitBytes"] = limit_bytes
        if since_time is not None:
            query["sinceTime"] = since_time
        if timestamps:
            query["timestamps"] = "true"
        path = RESOURCES["Pod"].path(namespace, pod, "log")
        response = await self._call("GET", path, query=query)
        raw = await _read(response, f"log of {pod}")
        if response.status != 200:
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            raise _error(response.status, body, f"log of {pod}")
        return raw.decode("utf-8", "replace")

    async def follow_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        *,
        skip: int = 0,
        since_time: str | None = None,
        tail: int | None = None,
        timestamps: bool = False,
    ) -> AsyncIterator[bytes]:
        """A container's log as it is written (`follow`), in chunks, from byte `skip` on,
        until the container ends or the stream breaks (KubeError). A log is append-only
        while its container runs and is not rotated, so a follower that lost the stream
        resumes by reading again with `skip` set to what it already has (a build's), or
        from `since_time` with `timestamps` (a job's: survives the kubelet's rotation);
        `tail`: from the last so many lines on."""
        query = {"container": container, "follow": "true"}
        if since_time is not None:
            query["sinceTime"] = since_time
        if tail is not None:
            query["tailLines"] = str(tail)
        if timestamps:
            query["timestamps"] = "true"
        path = RESOURCES["Pod"].path(namespace, pod, "log")
        # No read timeout: a build may print nothing for minutes (a large wheel downloading).
        timeout = aiohttp.ClientTimeout(connect=self._timeout, sock_read=None)
        response = await self._call("GET", path, query=query, limit=timeout)
        try:
            await _refuse_unless_ok(response, f"log of {pod}")
            while True:
                try:
                    chunk = await response.content.readany()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    raise Unavailable(
                        0, f"log of {pod}: the stream broke off ({exc or type(exc).__name__})"
                    ) from exc
                if not chunk:
                    return
                if skip >= len(chunk):
                    skip -= len(chunk)
                    continue
                chunk, skip = chunk[skip:], 0
                yield chunk
        finally:
            response.release()
