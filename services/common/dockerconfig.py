"""Registry credentials in Docker's config.json shape: `{"auths": {<server>: {...}}}`.

One shape serves everything that pulls or pushes: the kubelet (a Secret of type
`kubernetes.io/dockerconfigjson` holds it under `.dockerconfigjson`), Kaniko (it reads
`/kaniko/.docker/config.json`), buildah and skopeo (`--authfile`), and the builder's own
registry client. Each entry holds `auth`, the base64 of `username:password`, which is what
every reader looks at first; `username` and `password` are written beside it for readers
that look at those.

The key is the registry's host (and port), without a scheme or path, except for Docker
Hub, whose key is the historical `https://index.docker.io/v1/`: the Docker CLI writes that
key for Hub logins and the readers above look Hub images up under it, not under
`docker.io`. The original product wrote the user's text as given and the credentials
alone, without `auths` around them, so no kubelet ever used them.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DOCKER_HUB_KEY = "https://index.docker.io/v1/"
DOCKER_HUB_HOSTS = frozenset(
    {"docker.io", "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com", "hub.docker.com"}
)


@dataclass(frozen=True)
class Credentials:
    """A user name and password (or token) for one registry. Never logged."""

    username: str
    password: str = field(repr=False)


def host_of(server: str) -> str:
    """The host[:port] a server is written as (`https://r.example.com/v2/` → `r.example.com`),
    with Docker Hub's many names as `docker.io`."""
    text = server.strip()
    if "://" in text:
        text = text.split("://", 1)[1]
    host = text.split("/", 1)[0].lower()
    return "docker.io" if host in DOCKER_HUB_HOSTS else host


def image_host(image: str) -> str:
    """The registry an image is pulled from, as `host_of` writes it: the image name's first
    part when it has a `.` or `:` or is `localhost` (as Docker reads names), else Docker Hub
    (`python:3.11` is `docker.io/library/python:3.11`)."""
    first, sep, _ = image.strip().partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return host_of(first)
    return "docker.io"


def auth_key(server: str) -> str:
    """The key of `server`'s entry in `auths`."""
    host = host_of(server)
    return DOCKER_HUB_KEY if host == "docker.io" else host


def dockerconfigjson(entries: Mapping[str, Credentials]) -> str:
    """The config.json text holding `entries` (server → credentials), keys as `auth_key` says.
    A later entry for the same registry wins."""
    auths: dict[str, dict[str, str]] = {}
    for server, creds in entries.items():
        token = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
        auths[auth_key(server)] = {"username": creds.username, "password": creds.password, "auth": token}
    return json.dumps({"auths": auths}, sort_keys=True, separators=(",", ":"))


def read_auths(text: str) -> dict[str, Credentials]:
    """The credentials of a config.json, by host (`host_of` its key). ValueError, saying what
    is wrong without quoting any secret, for a file that is not one."""
    try:
        data: Any = json.loads(text)
    except ValueError:
        raise ValueError("is not JSON (a docker config.json is expected)") from None
    auths = data.get("auths") if isinstance(data, dict) else None
    if not isinstance(auths, dict):
        raise ValueError('has no "auths" object (a docker config.json is expected)')
    result = {}
    for key, entry in auths.items():
        if not isinstance(entry, dict):
            raise ValueError(f"the entry for {key!r} is not an object")
        username, password = entry.get("username"), entry.get("password")
        if entry.get("auth"):
            try:
                decoded = base64.b64decode(str(entry["auth"]), validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                raise ValueError(f"the auth of {key!r} is not base64 of user:password") from None
            username, sep, password = decoded.partition(":")
            if not sep:
                raise ValueError(f"the auth of {key!r} is not base64 of user:password")
        if not isinstance(username, str) or not isinstance(password, str):
            raise ValueError(f"the entry for {key!r} has neither auth nor username and password")
        result[host_of(key)] = Credentials(username, password)
    return result
