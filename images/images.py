"""`make images`: build the platform's images, copy the third-party ones, into one registry.

Reads images/images.txt (every image the chart pulls). With REGISTRY=host[:port][/prefix]
it builds each `build` image with the first engine found (buildah, podman, docker), pushes
it to <REGISTRY>/<name>:<IMAGE_TAG>, copies each `copy` image with crane (go-containerregistry,
`make crane`) to <REGISTRY>/<name>:<tag> keeping its digest, and prints the `helm --set` flags
that point the chart at them. Without REGISTRY it only builds, tagged paddlecloud/<name>.

Settings (make variables or environment; docs/install.md):
  REGISTRY            where to push (host[:port][/prefix]); empty: build only
  INSECURE=1          the registry (and the sources) may be plain http or self-signed
  REGISTRY_AUTH_FILE  credentials, containers-auth.json / ~/.docker/config.json format
  IMAGE_TAG           the tag of the built images (default: pyproject.toml's version)
  PYTHON_IMAGE        the base the Dockerfiles build FROM (default python:3.11-slim)
  PIP_INDEX_URL       the package index pip uses inside the builds (a mirror)
  <NAME>_SOURCE       where to copy a third-party image from (MONGO_SOURCE, KANIKO_SOURCE...)
  CRANE               the crane binary; ENGINE: buildah, podman or docker
  BUILDAH_GLOBAL, BUILDAH_FLAGS  extra buildah options (`--storage-driver vfs`, `--isolation chroot`)

Only the standard library: it runs before any virtualenv exists.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIST = REPO / "images" / "images.txt"
VALUES = REPO / "charts" / "paddlecloud" / "values.yaml"
ENGINES = ("buildah", "podman", "docker")


@dataclass(frozen=True)
class Entry:
    """One line of images/images.txt."""

    how: str  # build | copy
    name: str
    key: str  # the values key, dotted
    origin: str  # build: the Dockerfile; copy: the source image (the chart's default)


def entries(path: Path = LIST) -> list[Entry]:
    """The list's lines, in order; a malformed line is an error naming it."""
    found: list[Entry] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 4 or words[0] not in ("build", "copy"):
            raise SystemExit(f"{path}:{number}: expected `build|copy NAME KEY ORIGIN`, got {line!r}")
        found.append(Entry(*words))
    return found


def split_reference(ref: str) -> tuple[str, str, str]:
    """(repository, tag, digest) of an image reference; tag and digest may be empty."""
    repository, _, digest = ref.partition("@")
    slash = repository.rfind("/")
    colon = repository.rfind(":")
    tag = ""
    if colon > slash:  # a colon after the last slash is a tag, not a registry's port
        repository, tag = repository[:colon], repository[colon + 1 :]
    return repository, tag, digest


def setting(name: str, default: str = "") -> str:
    return os.environ.get(name, "").strip() or default


def run(argv: list[str], env: dict[str, str] | None = None) -> None:
    print("+", shlex.join(argv), flush=True)
    started = time.monotonic()
    if subprocess.run(argv, env=env, check=False).returncode != 0:
        raise SystemExit(f"make images: `{shlex.join(argv[:3])} ...` failed (its output is above)")
    print(f"  ({time.monotonic() - started:.0f} s)", flush=True)


def version() -> str:
    match = re.search(r'^version = "(.+)"', (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    return match.group(1) if match else "latest"


class Engine:
    """The container engine's build and push commands, with the registry's settings."""

    def __init__(self, insecure: bool, authfile: str, docker_config: str) -> None:
        chosen = setting("ENGINE") or next((e for e in ENGINES if shutil.which(e)), "")
        if not chosen:
            raise SystemExit(
                "make images: no container engine (buildah, podman or docker) here: install one"
                " (apt-get install buildah) and run make images again"
            )
        self.name = chosen
        self.insecure, self.authfile, self.docker_config = insecure, authfile, docker_config

    def _options(self) -> list[str]:
        if self.name == "docker":  # the daemon's own settings (insecure-registries, docker login)
            return []
        return (["--tls-verify=false"] if self.insecure else []) + (
            ["--authfile", self.authfile] if self.authfile else []
        )

    def _env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_CONFIG": self.docker_config} if self.docker_config else dict(os.environ)

    def build(self, dockerfile: Path, context: Path, tag: str, args: dict[str, str]) -> None:
        if self.name == "buildah":
            start = [
                "buildah",
                *shlex.split(setting("BUILDAH_GLOBAL")),
                "bud",
                *shlex.split(setting("BUILDAH_FLAGS")),
            ]
        else:
            start = [self.name, "build"]
        build_args = [
            arg for key, value in args.items() if value for arg in ("--build-arg", f"{key}={value}")
        ]
        run(
            [*start, *self._options(), *build_args, "-f", str(dockerfile), "-t", tag, str(context)],
            self._env(),
        )

    def push(self, tag: str) -> None:
        if self.name == "docker":
            run(["docker", "push", tag], self._env())
            return
        start = (
            [self.name, *shlex.split(setting("BUILDAH_GLOBAL"))] if self.name == "buildah" else [self.name]
        )
        run([*start, "push", *self._options(), tag, f"docker://{tag}"], self._env())


def helm_sets(entry: Entry, image: str) -> list[str]:
    """The --set flags that point `entry`'s values key at `image`."""
    repository, tag, digest = split_reference(image)
    if entry.key in ("image", "mongodb.image"):  # {repository, tag} maps
        tag_value = tag + (f"@{digest}" if digest else "")
        return [f"{entry.key}.repository={repository}", f"{entry.key}.tag={tag_value}"]
    return [f"{entry.key}={image}"]


def build_all(engine: Engine, prefix: str, tag: str, built: dict[str, str]) -> None:
    args = {"PYTHON_IMAGE": setting("PYTHON_IMAGE"), "PIP_INDEX_URL": setting("PIP_INDEX_URL")}
    for entry in entries():
        if entry.how != "build" or entry.name in built:
            continue
        image = f"{prefix}/{entry.name}:{tag}"
        dockerfile = REPO / entry.origin
        if entry.name == "pusher":
            # The pusher is the platform image plus crane, built outside the repository
            # (`make crane`): a context of its own holds the two.
            crane = setting("CRANE") or shutil.which("crane") or ""
            if not crane:
                raise SystemExit(
                    "make images: no crane for the pusher image (run `make crane`, or set CRANE=)"
                )
            with tempfile.TemporaryDirectory(prefix="paddlecloud-pusher-") as context:
                shutil.copy2(crane, Path(context) / "crane")
                engine.build(dockerfile, Path(context), image, {"PLATFORM_IMAGE": built["paddlecloud"]})
        else:
            engine.build(dockerfile, REPO, image, args)
        built[entry.name] = image


def copy_all(crane: str, prefix: str, insecure: bool, env: dict[str, str]) -> dict[str, str]:
    """Each third-party image copied once; name → the image in the registry."""
    copied: dict[str, str] = {}
    for entry in entries():
        if entry.how != "copy" or entry.name in copied:
            continue
        source = setting(f"{entry.name.upper()}_SOURCE", entry.origin)
        _, tag, digest = split_reference(source)
        destination = f"{prefix}/{entry.name}" + (f":{tag}" if tag else "")
        # crane copies the manifest (an index with every platform, where the source is one)
        # byte for byte, so the digest is the source's: a digest-pinned value still holds.
        run([crane, "copy", *(["--insecure"] if insecure else []), source, destination], env)
        copied[entry.name] = destination + (f"@{digest}" if digest else "")
    return copied


def main() -> int:
    registry = setting("REGISTRY").rstrip("/")
    if "://" in registry or any(c.isspace() for c in registry):
        raise SystemExit(
            f"make images: REGISTRY={registry!r} is not host[:port][/prefix] (no scheme: for plain http"
            " add INSECURE=1)"
        )
    insecure = setting("INSECURE", "0").lower() in ("1", "true", "yes")
    authfile = setting("REGISTRY_AUTH_FILE")
    if authfile and not Path(authfile).is_file():
        raise SystemExit(f"make images: REGISTRY_AUTH_FILE={authfile} is not a file")
    tag = setting("IMAGE_TAG", version())
    with tempfile.TemporaryDirectory(prefix="paddlecloud-images-") as scratch:
        docker_config = ""
        if authfile:
            # crane and docker read $DOCKER_CONFIG/config.json; the containers' auth.json has
            # the same "auths" layout.
            docker_config = scratch
            shutil.copyfile(authfile, Path(scratch) / "config.json")
        env = {**os.environ, "DOCKER_CONFIG": docker_config} if docker_config else dict(os.environ)
        engine = Engine(insecure, authfile, docker_config)
        built: dict[str, str] = {}
        build_all(engine, registry or "paddlecloud", tag, built)
        if not registry:
            print(f"make images: built {', '.join(built.values())}; nothing pushed (set REGISTRY= to push)")
            return 0
        for image in built.values():
            engine.push(image)
        crane = setting("CRANE") or shutil.which("crane") or ""
        if not crane:
            raise SystemExit(
                "make images: no crane to copy the third-party images (run `make crane`, or set CRANE=)"
            )
        images = {**built, **copy_all(crane, registry, insecure, env)}
    flags: list[str] = []
    for entry in entries():
        flags += helm_sets(entry, images[entry.name])
    print("\nEvery image is in the registry. Point the chart at them with:\n")
    print(" \\\n".join(f"  --set {flag}" for flag in dict.fromkeys(flags)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
