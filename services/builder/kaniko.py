"""The Kaniko backend: one runtime image per cache key, built by a Kaniko Job on Kubernetes
and pushed to a registry (docs/builder.md, "The kaniko backend").

- The key names the base by digest: `base_identity` resolves the base image's tag on its
  registry (with the user's saved credentials when the request names them), and the
  build's Dockerfile says `FROM <base>@<digest>`, so the image under a key is built from
  exactly what the key says, and a moved tag means a new key.
- Each user's images are theirs: the key holds the owner (`per_user`), and the image is
  `<registry>/<repository>/<user>:<key>`, so two users with the same requirements get two
  images, and a lookup looks only in the asking user's path. Only the pusher, which runs
  no user code, holds the push credentials, and the builder alone says where it pushes.
- A lookup is a HEAD on `<registry>/<repository>/<user>/manifests/<key>`: the registry is
  the only record, so nothing here can go stale; the registry's retention rules are the
  size cap (`entries()` lists nothing).
- A build creates a ConfigMap (the context), the push credentials' Secret (and the user's
  pull Secret for a private base) and the Job (kaniko_manifests.py), waits for the
  executor to start (failing the build at once when admission refuses its pod for good,
  as the Job's FailedCreate Warning Event says), copies the executor's and then the
  pusher's log stream into the build's log file (kept after the pod goes; resumed by
  bytes when a stream breaks), and reads the end from the pod: both exit 0 and the tag
  present in the registry is success; anything else fails the build with pip's and
  Kaniko's (or the pusher's) last error lines. It stops the
  build at `builder.build_timeout_seconds` (the Job's own deadline is a backstop should the
  builder be gone), and when the service stops, and removes the Job either way.
- After a restart, `recover` deletes what interrupted builds left in the build namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Collection
from pathlib import Path
from typing import Any, BinaryIO

import aiohttp
import structlog

from paddlecloud.common.config import Config, ConfigError
from paddlecloud.common.dockerconfig import Credentials, dockerconfigjson, host_of, read_auths
from paddlecloud.common.kube import Conflict, Kube, KubeError
from paddlecloud.common.kuberefusal import CREATE_FAILED, refusal_in
from paddlecloud.common.store.models import USER_NAME

from . import kaniko_manifests as manifests
from .backend import (
    BackendUnavailable,
    BaseRefused,
    BuildBackend,
    BuildRequest,
    CacheEntry,
    LogLine,
    LogQuery,
    Outcome,
    PipIndex,
    Published,
    RegistryLogin,
)
from .buildlog import BuildLogs, say
from .registry import ImageRef, RegistryAuthError, RegistryClient, RegistryError

log = structlog.get_logger(__name__)

# How often, at most, the Warning Events of a build's Job are read while it has no pod.
EVENTS_SECONDS = 2.0
REASON_LINES = 3
REASON_CHARS = 2000
# Kaniko's own failure line (`--log-format=text`): "error building image: ..." and friends.
_KANIKO_ERROR = re.compile(r"^(error\b|level=error|.*\berror building image\b)", re.IGNORECASE)


class _Failed(Exception):
    """The build failed; the message is its reason."""


class KanikoBuildBackend(BuildBackend):
    name = "kaniko"
    # kaniko-2: built in two steps (--no-push, then the pusher), under per-user paths.
    version = "kaniko-2"
    artifact_fields = ("image",)
    evicts = False
    per_user = True

    def __init__(self, config: Config, *, kube: Kube | None = None) -> None:
        section = config.builder
        settings = section.kaniko
        if settings.registry is None:
            raise ValueError("builder.kaniko.registry is not set")
        self._settings = settings
        self._kube_settings = config.jobs.kubernetes
        if settings.kubeconfig is not None:
            # The builder's own account, not the jobs service's (which has no right to
            # make a build's objects the Job's: jobs/finalizers).
            self._kube_settings = self._kube_settings.model_copy(
                update={"kubeconfig": settings.kubeconfig, "context": settings.context}
            )
        self._given_kube = kube
        self._kube: Kube | None = kube
        self._registry_host = host_of(settings.registry)
        self._image_prefix = f"{settings.registry}/{settings.repository}"
        self._insecure_push = self._registry_host in {host_of(h) for h in settings.insecure_registries}
        self._timeout = section.build_timeout_seconds
        self._index = PipIndex(
            section.index_url, section.find_links, section.no_index, settings.trusted_hosts
        )
        self._logs = BuildLogs(section.work_dir.expanduser().absolute() / "logs", section.poll_seconds)
        self._poll = settings.poll_seconds
        self._push: dict[str, Credentials] = {}
        self._session: aiohttp.ClientSession | None = None
        self._client: RegistryClient | None = None

    # -- life ------------------------------------------------------------------------

    async def open(self) -> None:
        self._logs.directory.mkdir(parents=True, exist_ok=True)
        auth_file = self._settings.auth_file
        if auth_file is not None:
            try:
                text = auth_file.expanduser().read_text(encoding="utf-8")
                self._push = read_auths(text)
            except (OSError, ValueError) as exc:
                why = exc.strerror if isinstance(exc, OSError) else str(exc)
                raise ConfigError(f"builder.kaniko.auth_file {auth_file}: {why}") from None
            if self._registry_host not in self._push:
                raise ConfigError(
                    f"builder.kaniko.auth_file {auth_file} holds no credentials for {self._registry_host} "
                    f"(it has: {', '.join(sorted(self._push)) or 'none'})"
                )
        self._session = aiohttp.ClientSession()
        self._client = RegistryClient(
            self._session, self._push, insecure=frozenset(self._settings.insecure_registries)
        )
        if self._kube is None:
            self._kube = await Kube.connect(self._kube_settings)
        log.info(
            "kaniko_builder_ready",
            registry=self._registry_host,
            repository=self._settings.repository,
            namespace=self._settings.namespace,
            push_user=self._push[self._registry_host].username if self._registry_host in self._push else None,
        )

    async def close(self) -> None:
        if self._kube is not None and self._given_kube is None:
            await self._kube.close()
            self._kube = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            raise RuntimeError("the kaniko backend is not open")
        return self._kube

    @property
    def registry(self) -> RegistryClient:
        if self._client is None:
            raise RuntimeError("the kaniko backend is not open")
        return self._client

    # -- keys and lookups ------------------------------------------------------------

    def image_of(self, owner: str, key: str) -> str:
        """Where `owner`'s image of `key` is: `<registry>/<repository>/<user>:<key>`."""
        return f"{self._image_prefix}/{user_path(owner)}:{key}"

    def _target(self, owner: str, key: str) -> ImageRef:
        return ImageRef(self._registry_host, f"{self._settings.repository}/{user_path(owner)}", key)

    async def base_identity(self, base: str | None, registry: RegistryLogin | None = None) -> str:
        text = base or self._settings.base_image
        try:
            ref = ImageRef.parse(text)
        except ValueError as exc:
            raise BaseRefused(str(exc)) from None
        creds = None
        if registry is not None and host_of(registry.server) == ref.registry:
            creds = registry.credentials
        try:
            digest = await self.registry.digest(ref, creds)
        except RegistryAuthError as exc:
            if creds is None and self.registry.credentials_for(ref.registry) is not None:
                # The platform's own credentials were refused: the operator's to fix.
                raise BackendUnavailable(f"cannot read the base image {text}: {exc}") from None
            raise BaseRefused(f"cannot read the base image {text}: {exc}") from None
        except RegistryError as exc:
            raise BackendUnavailable(f"cannot resolve the base image {text}: {exc}") from None
        if digest is None:
            raise BaseRefused(f"the base image {text} does not exist (the registry has no such manifest)")
        return str(ref.with_digest(digest))

    async def lookup(self, key: str, *, touch: bool, owner: str) -> Published | None:
        try:
            found = await self.registry.exists(self._target(owner, key))
        except RegistryError as exc:
            raise BackendUnavailable(f"cannot look up {self.image_of(owner, key)}: {exc}") from None
        return Published({"image": self.image_of(owner, key)}, "") if found else None

    # -- building --------------------------------------------------------------------

    def plan(self, request: BuildRequest) -> manifests.KanikoBuild:
        """The manifests' input for `request` (whose base_ref base_identity resolved)."""
        if request.base_ref is None:
            raise ValueError("a Kaniko build needs the base resolved by base_identity")
        return manifests.KanikoBuild(
            build_id=request.build_id,
            key=request.key,
            owner=request.owner,
            base=request.base_ref,
            destination=self.image_of(request.owner, request.key),
            requirements=request.requirements,
            builder_version=self.version,
            settings=self._settings,
            index=self._index,
            timeout_seconds=self._timeout,
            pull_credentials=request.registry is not None,
            insecure_push=self._insecure_push,
        )

    def docker_config(self, request: BuildRequest) -> str:
        """The pusher's config.json: the push credentials alone."""
        return dockerconfigjson(self._push)

    def pull_config(self, request: BuildRequest) -> str | None:
        """The executor's config.json: the user's own credentials for a private base, or
        None. Never the push credentials: the executor runs user code."""
        if request.registry is None:
            return None
        return dockerconfigjson({request.registry.server: request.registry.credentials})

    async def build(self, request: BuildRequest) -> Outcome:
        started = time.monotonic()
        waits: list[str] = []  # why the pod is not made yet, should the build time out
        with open(self._logs.path(request.build_id), "ab", buffering=0) as out:  # noqa: ASYNC230 - local append
            try:
                build = self.plan(request)
                say(out, f"build {request.build_id} of key {request.key}")
                say(out, f"FROM {build.base}; pushing {build.destination}")
                async with asyncio.timeout(self._timeout):
                    await self._run(build, self.docker_config(request), self.pull_config(request), out, waits)
                elapsed = time.monotonic() - started
                say(out, f"pushed {build.destination} in {elapsed:.1f} s")
                return Outcome(True, f"built in {elapsed:.1f} s", {"image": build.destination})
            except _Failed as exc:
                say(out, f"build failed: {exc}")
                return Outcome(False, str(exc))
            except TimeoutError:
                reason = f"the build took longer than {self._timeout:g} s and was stopped"
                if waits:
                    reason += f"; {waits[-1]}"
                say(out, f"stopped: {reason}")
                return Outcome(False, reason)
            except KubeError as exc:
                reason = f"the cluster refused the build: {exc}"
                say(out, f"build failed: {reason}")
                return Outcome(False, reason)
            except asyncio.CancelledError:
                say(out, "stopped: the builder service is stopping; nothing was published")
                raise
            finally:
                # Shielded: a stopping service still removes the build's Job and Secret.
                await asyncio.shield(self._remove(request.build_id))

    async def _run(
        self,
        build: manifests.KanikoBuild,
        config_json: str,
        pull_json: str | None,
        out: BinaryIO,
        waits: list[str],
    ) -> None:
        namespace = self._settings.namespace
        owned = [("ConfigMap", manifests.context_config_map(build))]
        owned.append(("Secret", manifests.docker_config_secret(build, config_json)))
        if pull_json is not None:
            name = manifests.pull_secret_name(build.build_id)
            owned.append(("Secret", manifests.docker_config_secret(build, pull_json, name)))
        for _, obj in owned:
            await self._create(obj)
        job = await self._create(manifests.build_job(build))
        # Owned by the Job from now on: deleting it (or its TTL) removes them too.
        for kind, obj in owned:
            await self.kube.patch(kind, namespace, obj["metadata"]["name"], manifests.owned_by(job))
        say(out, f"Job {namespace}/{job['metadata']['name']} created")
        pod = await self._executor_started(build.build_id, str(job["metadata"]["uid"]), out, waits)
        start = os.fstat(out.fileno()).st_size
        terminated = await self._copy_log(pod, manifests.EXECUTOR, out)
        code = int(terminated.get("exitCode", -1))
        if code != 0:
            raise _Failed(self._failure(terminated, code, Path(out.name), start))
        start = os.fstat(out.fileno()).st_size
        terminated = await self._copy_log(pod, manifests.PUSHER, out)
        code = int(terminated.get("exitCode", -1))
        if code != 0:
            raise _Failed(_push_failure(terminated, code, Path(out.name), start))
        try:
            pushed = await self.registry.exists(self._target(build.owner, build.key))
        except RegistryError as exc:
            raise _Failed(f"Kaniko finished, but the registry cannot confirm the push: {exc}") from None
        if not pushed:
            raise _Failed(f"Kaniko finished, but the registry has no {build.destination}")

    async def _create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self.kube.create(manifest)
        except Conflict:
            meta = manifest["metadata"]
            existing = await self.kube.get(manifest["kind"], meta["namespace"], meta["name"])
            if existing is None:
                raise
            return existing  # created by an earlier attempt of this same build

    async def _executor_started(self, build_id: str, job_uid: str, out: BinaryIO, waits: list[str]) -> str:
        """The build pod's name once the executor runs (or ended); _Failed when the pod
        fails before it, or when admission refuses to make it for good (Pod Security, a
        LimitRange, an admission policy: the Job's FailedCreate Warning Event says so).
        What it waits for is said in the log, once each, and the last reason the pod is not
        made (a quota) is added to `waits`."""
        namespace = self._settings.namespace
        said: set[str] = set()
        events_read = -EVENTS_SECONDS

        def note(text: str) -> None:
            if text not in said:
                said.add(text)
                say(out, text)

        while True:
            pods = await self.kube.list("Pod", namespace, selector=f"{manifests.LABEL_BUILD}={build_id}")
            items = sorted(
                pods.get("items") or [], key=lambda p: str(p["metadata"].get("creationTimestamp", ""))
            )
            if items:
                pod = items[-1]
                name = pod["metadata"]["name"]
                status = pod.get("status") or {}
                for init in status.get("initContainerStatuses") or []:
                    ended = (init.get("state") or {}).get("terminated")
                    if init.get("name") == manifests.CONTEXT_INIT and ended and int(ended.get("exitCode", 0)):
                        raise _Failed(f"preparing the build context failed (exit {ended.get('exitCode')})")
                executor = _container(status, manifests.EXECUTOR)
                state = (executor or {}).get("state") or {}
                if "running" in state or "terminated" in state:
                    note(f"pod {name}: the executor started")
                    return name
                if status.get("phase") == "Failed":
                    raise _Failed(f"the build pod failed before Kaniko started: {status.get('reason') or ''}")
                inits = status.get("initContainerStatuses") or []
                for container in (*inits, *(status.get("containerStatuses") or [])):
                    waiting = (container.get("state") or {}).get("waiting") or {}
                    if waiting.get("reason") and waiting["reason"] not in (
                        "PodInitializing",
                        "ContainerCreating",
                    ):
                        what = f"{waiting['reason']} {waiting.get('message', '')}".rstrip()
                        note(f"pod {name}: {container.get('name')} waits: {what}")
                for condition in status.get("conditions") or []:
                    if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                        note(f"pod {name} is not scheduled yet: {condition.get('message', '')}")
            else:
                job = await self.kube.get("Job", namespace, manifests.job_name(build_id))
                if job is None:
                    raise _Failed("the build's Job was deleted from outside")
                for condition in (job.get("status") or {}).get("conditions") or []:
                    if condition.get("type") == "Failed" and condition.get("status") == "True":
                        raise _Failed(f"the build's Job failed: {condition.get('message', '')}")
                if time.monotonic() - events_read >= EVENTS_SECONDS:
                    events_read = time.monotonic()
                    waiting = await self._not_created(job_uid)
                    if waiting is not None:
                        note(f"the build waits: {waiting}")
                        waits.append(waiting)
            await asyncio.sleep(self._poll)

    async def _not_created(self, job_uid: str) -> str | None:
        """Why the Job controller cannot make the build's pod, from the newest FailedCreate
        Warning Event of its Job (filtered on the API server); None when there is none.
        _Failed when the refusal lasts (Pod Security, a LimitRange, an admission policy)."""
        answer = await self.kube.list(
            "Event", self._settings.namespace, fields=f"involvedObject.uid={job_uid},type=Warning"
        )
        found = [e for e in answer.get("items") or [] if e.get("reason") == CREATE_FAILED]
        if not found:
            return None
        latest = max(found, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
        refusal = refusal_in(CREATE_FAILED, str(latest.get("message") or ""), "the build's pods")
        if refusal.lasting:
            raise _Failed(refusal.message)
        return refusal.message

    async def _copy_log(self, pod: str, container: str, out: BinaryIO) -> dict[str, Any]:
        """Append `container`'s log to `out` until it ends; its terminated state."""
        namespace = self._settings.namespace
        written, delay, ends_line = 0, self._poll, True
        while True:
            broke = False
            try:
                async for chunk in self.kube.follow_log(namespace, pod, container, skip=written):
                    out.write(chunk)
                    written += len(chunk)
                    ends_line = chunk.endswith(b"\n")
            except KubeError as exc:
                broke = True
                log.warning("build_log_stream_broke", pod=pod, error=str(exc), retry_in=round(delay, 2))
            current = await self.kube.get("Pod", namespace, pod)
            if current is None:
                raise _Failed(f"the build pod was deleted before its {container} container finished")
            state = (_container(current.get("status") or {}, container) or {}).get("state") or {}
            if "terminated" in state and not broke:
                if not ends_line:
                    out.write(b"\n")
                return dict(state["terminated"])
            if broke or "terminated" not in state:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    def _failure(self, terminated: dict[str, Any], code: int, path: Path, start: int) -> str:
        reason = str(terminated.get("reason") or "")
        if reason == "OOMKilled":
            return f"Kaniko was killed: out of memory (builder.kaniko.memory is {self._settings.memory})"
        if reason == "DeadlineExceeded":
            return "the build's Job passed its deadline and was stopped"
        errors = _error_lines(path, start)
        message = f"the build failed (Kaniko exit {code})"
        return f"{message}: {errors}" if errors else message

    async def _remove(self, build_id: str) -> None:
        namespace = self._settings.namespace
        for kind, name in (
            ("Job", manifests.job_name(build_id)),
            ("Secret", manifests.secret_name(build_id)),
            ("Secret", manifests.pull_secret_name(build_id)),
            ("ConfigMap", manifests.job_name(build_id)),
        ):
            try:
                await self.kube.delete(kind, namespace, name)
            except KubeError as exc:
                log.warning("build_objects_not_removed", build=build_id, kind=kind, error=str(exc))

    # -- after a restart ------------------------------------------------------------

    async def recover(self, interrupted: Collection[str]) -> None:
        namespace = self._settings.namespace
        leftover = set(interrupted)
        try:
            jobs = await self.kube.list("Job", namespace, selector=manifests.build_selector())
        except KubeError as exc:
            log.warning("build_jobs_not_listed", error=str(exc))
            jobs = {"items": []}
        for job in jobs.get("items") or []:
            build_id = (job["metadata"].get("labels") or {}).get(manifests.LABEL_BUILD)
            if build_id:
                leftover.add(build_id)
        for build_id in sorted(leftover):
            await self._remove(build_id)
        for build_id in interrupted:
            path = self._logs.path(build_id)
            if path.exists():
                with open(path, "ab") as out:  # noqa: ASYNC230 - local append
                    say(out, "build failed: the builder restarted during this build; its Job was removed")
        if leftover:
            log.info("interrupted_builds_removed", count=len(leftover))

    # -- the size cap: the registry's retention rules apply --------------------------

    async def entries(self) -> list[CacheEntry]:
        return []

    async def evict(self, key: str, *, unless_used_after: float) -> bool:
        return False

    # -- logs ------------------------------------------------------------------------

    def logs(
        self, log_id: str, query: LogQuery, finished: Callable[[], Awaitable[bool]]
    ) -> AsyncGenerator[list[LogLine], None]:
        return self._logs.read(log_id, query, finished)


def user_path(owner: str) -> str:
    """The repository component of `owner`'s images: the name itself, which the users API
    keeps a DNS label (store.models.USER_NAME), and so a valid path component; any other
    text (a store written by hand) a hash of it, so two names never share a path."""
    if USER_NAME.match(owner):
        return owner
    return "u-" + hashlib.sha256(owner.encode()).hexdigest()[:24]


def _container(status: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The status of container `name`, an init container (the executor) or not."""
    every = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    return next((c for c in every if c.get("name") == name), None)


def _push_failure(terminated: dict[str, Any], code: int, path: Path, start: int) -> str:
    """Why the pusher failed: its `push:` line, else its last line."""
    with contextlib.suppress(OSError), open(path, "rb") as f:
        f.seek(start)
        lines = [line.strip() for line in f.read().decode("utf-8", errors="replace").splitlines()]
        said = [line for line in lines if line.startswith("push:")] or [line for line in lines if line]
        if said:
            return f"pushing the image failed (exit {code}): {said[-1][:REASON_CHARS]}"
    reason = f", {terminated['reason']}" if terminated.get("reason") else ""
    return f"pushing the image failed (exit {code}{reason})"


def _error_lines(path: Path, start: int) -> str:
    """pip's last `ERROR:` lines and Kaniko's last error line, from `start` on."""
    with contextlib.suppress(OSError), open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        f.seek(max(start, end - 256 * 1024))
        text = f.read().decode("utf-8", errors="replace")
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        pip = [line for line in lines if line.startswith("ERROR:")][-REASON_LINES:]
        kaniko = [line for line in lines if _KANIKO_ERROR.match(line) and not line.startswith("ERROR:")][-1:]
        quoted = " | ".join(pip + kaniko) or " | ".join(lines[-REASON_LINES:])
        return quoted if len(quoted) <= REASON_CHARS else "…" + quoted[-REASON_CHARS:]
    return ""
