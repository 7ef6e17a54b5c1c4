"""A small client of the Registry HTTP API v2: image names, manifest digests, tag lookups.

What the Kaniko backend asks a registry, and nothing more: the digest a base image's tag
names now (`digest`), and whether `<repository>:<key>` exists (`exists`), both answered by
a HEAD on `/v2/<repository>/manifests/<reference>` (the distribution spec's "pulling
manifests": 200 with `Docker-Content-Digest`, or 404). No local record is kept that
could go stale: the registry is asked every time.

Authentication, as registries answer an anonymous request with 401 and a
`WWW-Authenticate` challenge:

- `Basic realm="..."`: the request is sent again with the credentials (the CNCF
  distribution registry with htpasswd, Harbor's and Nexus' basic mode);
- `Bearer realm="<token url>",service="...",scope="..."`: the token server named by
  `realm` is asked for a token (`GET realm?service=...&scope=...`, with the credentials as
  basic auth when there are any: the Docker token authentication spec), and the request
  is sent again with `Authorization: Bearer <token>`. Docker Hub, GHCR, GitLab, Quay and
  ECR work this way; anonymous tokens serve public images. Tokens are kept for their
  `expires_in` (60 s when not said), per registry, scope and user.

A registry that refuses the credentials (401 again, or the token server's 401) raises
`RegistryAuthError` naming the registry and the user; an unreachable one
`RegistryUnavailable`. Passwords never appear in messages or logs.
"""

from __future__ import annotations

import base64
import hashlib
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

from paddlecloud.common.dockerconfig import Credentials, host_of

DOCKER_HUB_API = "registry-1.docker.io"
# Every manifest kind a tag may name: multi-platform indexes first, as `docker pull` asks.
MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_PATH = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
# key=value pairs of a challenge; values quoted or not.
_PARAM = re.compile(r'([A-Za-z_]+)\s*=\s*(?:"([^"]*)"|([^\s,]*))')


class RegistryError(Exception):
    """A registry answered something other than yes or no; the message says what, for a user."""


class RegistryAuthError(RegistryError):
    """The registry refused the credentials (or needs some and got none)."""


class RegistryUnavailable(RegistryError):
    """The registry could not be reached, or failed (5xx)."""


@dataclass(frozen=True)
class ImageRef:
    """An image name taken apart as Docker reads it: `python:3.11` is
    `docker.io/library/python:3.11`; a first part with a `.` or `:`, or `localhost`, is a
    registry."""

    registry: str  # host[:port]; docker.io for Docker Hub
    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, text: str) -> ImageRef:
        """ValueError, saying what is wrong, for a name that is not an image reference."""
        rest, digest = text.strip(), None
        if "@" in rest:
            rest, digest = rest.split("@", 1)
            if not _DIGEST.match(digest):
                raise ValueError(f"{text!r}: the digest must be sha256: and 64 hex digits")
        first, sep, remainder = rest.partition("/")
        if sep and ("." in first or ":" in first or first == "localhost"):
            registry, path = host_of(first), remainder
        else:
            registry, path = "docker.io", rest
        tag = None
        last = path.rsplit("/", 1)[-1]
        if ":" in last:
            path, tag = path.rsplit(":", 1)
            if not _TAG.match(tag):
                raise ValueError(f"{text!r}: {tag!r} is not a tag")
        if registry == "docker.io" and "/" not in path:
            path = f"library/{path}"
        if not _PATH.match(path):
            raise ValueError(f"{text!r}: {path!r} is not a repository name (lowercase, digits, . _ - /)")
        if tag is None and digest is None:
            tag = "latest"
        return cls(registry, path, tag, digest)

    @property
    def reference(self) -> str:
        """What follows `/manifests/`: the digest when there is one, else the tag."""
        return self.digest or str(self.tag)

    def with_tag(self, tag: str) -> ImageRef:
        return ImageRef(self.registry, self.repository, tag, None)

    def with_digest(self, digest: str) -> ImageRef:
        return ImageRef(self.registry, self.repository, None, digest)

    def __str__(self) -> str:
        name = f"{self.registry}/{self.repository}"
        if self.tag:
            name += f":{self.tag}"
        if self.digest:
            name += f"@{self.digest}"
        return name


@dataclass
class _Token:
    value: str
    expires: float


class RegistryClient:
    """Asks registries about manifests. `credentials` are by registry host; `insecure`
    registries are reached over plain http. The caller owns `session`."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        credentials: Mapping[str, Credentials] | None = None,
        *,
        insecure: frozenset[str] = frozenset(),
        timeout: float = 10.0,
    ) -> None:
        self._session = session
        self._credentials = dict(credentials or {})
        self._insecure = frozenset(host_of(h) for h in insecure)
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._tokens: dict[tuple[str, str, str], _Token] = {}

    def credentials_for(self, registry: str) -> Credentials | None:
        return self._credentials.get(host_of(registry))

    def _base_url(self, registry: str) -> str:
        host = DOCKER_HUB_API if registry == "docker.io" else registry
        scheme = "http" if registry in self._insecure else "https"
        return f"{scheme}://{host}"

    async def digest(self, ref: ImageRef, credentials: Credentials | None = None) -> str | None:
        """The digest `ref` names now (its own digest when it has one), or None when the
        registry has no such manifest."""
        if ref.digest is not None:
            return ref.digest
        status, headers, body = await self._manifest("HEAD", ref, credentials)
        if status == 404:
            return None
        digest = headers.get("Docker-Content-Digest", "")
        if _DIGEST.match(digest):
            return digest
        # A registry need not send the header on HEAD: the digest is the body's sha256.
        status, headers, body = await self._manifest("GET", ref, credentials)
        if status == 404:
            return None
        return "sha256:" + hashlib.sha256(body).hexdigest()

    async def exists(self, ref: ImageRef, credentials: Credentials | None = None) -> bool:
        """Whether the registry has a manifest at `ref` (one HEAD)."""
        status, _, _ = await self._manifest("HEAD", ref, credentials)
        return status != 404

    async def manifest(self, ref: ImageRef, credentials: Credentials | None = None) -> bytes | None:
        """The manifest's bytes, or None when there is none."""
        status, _, body = await self._manifest("GET", ref, credentials)
        return None if status == 404 else body

    async def blob(self, ref: ImageRef, digest: str, credentials: Credentials | None = None) -> bytes:
        """A blob of `ref`'s repository (a config, or a layer: small ones only, it is read whole)."""
        path = f"/v2/{ref.repository}/blobs/{digest}"
        status, _, body = await self._request("GET", ref, path, {}, credentials)
        if status == 404:
            raise RegistryError(f"{ref.registry}/{ref.repository} has no blob {digest}")
        return body

    async def _manifest(
        self, method: str, ref: ImageRef, credentials: Credentials | None
    ) -> tuple[int, Mapping[str, str], bytes]:
        path = f"/v2/{ref.repository}/manifests/{ref.reference}"
        return await self._request(method, ref, path, {"Accept": MANIFEST_TYPES}, credentials)

    async def _request(
        self,
        method: str,
        ref: ImageRef,
        path: str,
        headers: Mapping[str, str],
        credentials: Credentials | None,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """One request, authenticated as the registry's challenge asks. The answer's status
        (200 or 404), headers and body; RegistryError for anything else."""
        creds = credentials or self.credentials_for(ref.registry)
        url = self._base_url(ref.registry) + path
        scope = f"repository:{ref.repository}:pull"
        key = (ref.registry, scope, creds.username if creds else "")
        auth: str | None = None
        token = self._tokens.get(key)
        if token is not None and token.expires > time.monotonic():
            auth = f"Bearer {token.value}"
        for attempt in range(2):
            status, answer_headers, body = await self._send(method, url, headers, auth, ref)
            if status != 401:
                break
            if attempt == 1:
                raise self._refused(ref, creds)
            challenge = answer_headers.get("WWW-Authenticate", "")
            scheme, params = _parse_challenge(challenge)
            if scheme == "basic":
                if creds is None:
                    raise self._refused(ref, creds)
                auth = _basic(creds)
            elif scheme == "bearer" and params.get("realm"):
                value, lifetime = await self._token(ref, params, scope, creds)
                self._tokens[key] = _Token(value, time.monotonic() + max(lifetime - 5, 1))
                auth = f"Bearer {value}"
            else:
                raise RegistryError(
                    f"registry {ref.registry} asked for an authentication it did not describe "
                    f"(WWW-Authenticate: {challenge[:100]!r})"
                )
        if status in (200, 404):
            return status, answer_headers, body
        if status == 403:
            who = f"user {creds.username!r}" if creds else "anonymous requests"
            raise RegistryAuthError(f"registry {ref.registry} denies {who} access to {ref.repository}")
        if status >= 500:
            raise RegistryUnavailable(f"registry {ref.registry} failed: HTTP {status} on {method} {path}")
        raise RegistryError(f"registry {ref.registry} answered HTTP {status} to {method} {path}")

    async def _send(
        self, method: str, url: str, headers: Mapping[str, str], auth: str | None, ref: ImageRef
    ) -> tuple[int, Mapping[str, str], bytes]:
        sent = dict(headers)
        if auth is not None:
            sent["Authorization"] = auth
        try:
            async with self._session.request(
                method, url, headers=sent, timeout=self._timeout, allow_redirects=True
            ) as response:
                body = await response.read() if method != "HEAD" else b""
                return response.status, response.headers, body
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise RegistryUnavailable(
                f"registry {ref.registry} cannot be reached ({exc or type(exc).__name__})"
            ) from exc

    async def _token(
        self, ref: ImageRef, params: Mapping[str, str], scope: str, creds: Credentials | None
    ) -> tuple[str, float]:
        query = {
            k: v
            for k, v in (("service", params.get("service")), ("scope", params.get("scope") or scope))
            if v
        }
        headers = {"Authorization": _basic(creds)} if creds else {}
        try:
            async with self._session.get(
                params["realm"], params=query, headers=headers, timeout=self._timeout
            ) as response:
                if response.status in (401, 403):
                    raise self._refused(ref, creds)
                if response.status != 200:
                    raise RegistryError(
                        f"the token server of registry {ref.registry} answered HTTP {response.status}"
                    )
                data = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise RegistryUnavailable(
                f"the token server of registry {ref.registry} cannot be used ({exc or type(exc).__name__})"
            ) from exc
        value = (data.get("token") or data.get("access_token")) if isinstance(data, dict) else None
        if not isinstance(value, str) or not value:
            raise RegistryError(f"the token server of registry {ref.registry} gave no token")
        lifetime = data.get("expires_in")
        return value, float(lifetime) if isinstance(lifetime, int | float) and lifetime > 0 else 60.0

    @staticmethod
    def _refused(ref: ImageRef, creds: Credentials | None) -> RegistryAuthError:
        if creds is None:
            return RegistryAuthError(
                f"registry {ref.registry} needs credentials for {ref.repository}, and none were given"
            )
        return RegistryAuthError(
            f"registry {ref.registry} refused the credentials of user {creds.username!r} "
            f"for {ref.repository}: check the user name and password"
        )


def _basic(creds: Credentials) -> str:
    return "Basic " + base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()


def _parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """`Bearer realm="...",service="..."` → ("bearer", {"realm": ..., "service": ...})."""
    scheme, _, rest = header.strip().partition(" ")
    params = {
        m.group(1).lower(): m.group(2) if m.group(2) is not None else m.group(3)
        for m in _PARAM.finditer(rest)
    }
    return scheme.lower(), params
