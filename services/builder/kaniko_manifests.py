"""What a Kaniko build is made of, as pure functions: the Dockerfile and its context, and
the Kubernetes objects that run it. Nothing here talks to a cluster or a registry.

One build is up to four objects in the build namespace, named after the build:

- `pcbuild-<id>`, a ConfigMap: the build context, the generated `Dockerfile` and the
  `requirements.txt` exactly as the request sent it (the text the cache key holds);
- `pcbuild-<id>-docker`, a Secret of type `kubernetes.io/dockerconfigjson`: the push
  credentials, mounted in the pusher alone;
- `pcbuild-<id>-pull`, the same kind of Secret, only when the request names the user's
  saved credentials for a private base image: mounted in the executor, where the user's
  own build can read them (they are the user's own);
- `pcbuild-<id>`, a batch/v1 Job of one pod in two steps. The executor, an init
  container, builds with `--no-push --tar-path` into an emptyDir and holds no push
  credential: Kaniko runs the RUN steps (pip, and any `setup.py` of an sdist) in the
  executor container's own root filesystem, so whatever is mounted there is readable by
  user code. Then the pusher, the only container that mounts the push credentials and one
  that runs no user code, pushes the tarball to `<registry>/<repository>/<user>:<key>`
  (`python -m paddlecloud.builder.push`, which opens the tarball without following links).
  An init container before both copies the context out of the ConfigMap into the
  workspace, because a ConfigMap volume's files are symbolic links, which Kaniko would
  copy as links.

No layer cache (`--cache-repo`): Kaniko pushes cache layers while it builds, which needs
push credentials in the executor; the image per cache key is the cache.

The ConfigMap and the Secrets are owned by the Job (the backend adds the reference once the
Job exists), so deleting the Job removes them. The Job is Indexed with one completion:
that runs exactly like a plain Job of one pod, and it is the mode the jobs backend's
trainers use, which the test cluster emulates.

Security. Pods get no service-account token and no service links, run with the runtime's
default seccomp profile, and the context copier and the pusher run as an unprivileged user
with no capabilities. The executor runs as root: Kaniko unpacks the base image over its own
filesystem and runs the RUN steps there, which needs uid 0 (GoogleContainerTools/kaniko
issues 105 and 2146). It gets no privilege escalation and only the capabilities that
unpacking and `chown`-ing image layers needs (what Shipwright's Kaniko strategy grants),
everything else dropped. Namespaces that enforce Pod Security `restricted` refuse it:
the build namespace needs `baseline`.
"""

from __future__ import annotations

import base64
import hashlib
import shlex
from dataclasses import dataclass
from typing import Any

from paddlecloud.common.config import KanikoSection

from .backend import PipIndex

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "paddlecloud"
LABEL_BUILD = "paddlecloud.org/build"
LABEL_ROLE = "paddlecloud.org/role"
ROLE_BUILD = "build"
ANNOTATION_USER = "paddlecloud.org/user-name"
ANNOTATION_KEY = "paddlecloud.org/build-key"
# Image labels that say what an image holds.
IMAGE_LABEL_KEY = "org.paddlecloud.build.key"
IMAGE_LABEL_REQUIREMENTS = "org.paddlecloud.build.requirements-sha256"
IMAGE_LABEL_BUILDER = "org.paddlecloud.builder"

EXECUTOR = "kaniko"
PUSHER = "pusher"
CONTEXT_INIT = "context"
WORKSPACE = "/workspace"
CONTEXT_MOUNT = "/context"
# Where Kaniko looks for registry credentials: only a private base's pull Secret goes here.
DOCKER_CONFIG_DIR = "/kaniko/.docker"
# The pusher's credentials: DOCKER_CONFIG points crane here.
PUSH_CONFIG_DIR = "/pusher/.docker"
# The executor writes the image here; the pusher reads it.
IMAGE_DIR = "/image"
IMAGE_TAR = f"{IMAGE_DIR}/image.tar"
# Volumes by name: the push credentials' is mounted in the pusher alone.
PUSH_VOLUME = "push-config"
PULL_VOLUME = "pull-config"
# Where jobs run: the job package is unpacked here by the job's own init container.
JOB_WORKDIR = "/job/work"
# Inside the image being built, removed by the same RUN step: not the builder's /tmp.
REQUIREMENTS_IN_IMAGE = "/tmp/paddlecloud-requirements.txt"  # noqa: S108
# What unpacking image layers as root needs; everything else is dropped.
EXECUTOR_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETGID", "SETUID", "SETFCAP", "KILL")
_COPY_CONTEXT = f"cp {CONTEXT_MOUNT}/Dockerfile {CONTEXT_MOUNT}/requirements.txt {WORKSPACE}/"
# The unprivileged user of the init container (distroless's "nonroot").
INIT_UID = 65532
# The cluster's own stop, should the builder be gone: this long after the builder's timeout.
DEADLINE_SLACK_SECONDS = 60


@dataclass(frozen=True)
class KanikoBuild:
    """Everything one build's manifests depend on, resolved by the backend."""

    build_id: str
    key: str
    owner: str
    base: str  # the FROM image, pinned by digest
    destination: str  # <registry>/<repository>/<user>:<key>
    requirements: str
    builder_version: str
    settings: KanikoSection
    index: PipIndex
    timeout_seconds: float
    # Whether the request named the user's credentials for a private base (the pull Secret).
    pull_credentials: bool = False
    # Whether the destination's registry is reached over plain http.
    insecure_push: bool = False


def job_name(build_id: str) -> str:
    return f"pcbuild-{build_id}"


def secret_name(build_id: str) -> str:
    """The push credentials' Secret."""
    return f"pcbuild-{build_id}-docker"


def pull_secret_name(build_id: str) -> str:
    """The user's credentials for a private base image (only when the request names them)."""
    return f"pcbuild-{build_id}-pull"


def build_selector() -> str:
    """The label selector of every object of every build."""
    return f"{MANAGED_BY}={MANAGER},{LABEL_ROLE}={ROLE_BUILD}"


def dockerfile(build: KanikoBuild) -> str:
    """The Dockerfile: the base pinned by digest, the requirements installed with the
    configured index, the working directory jobs run in, labels that say what it holds.

    pip reads no configuration file of the base image (`PIP_CONFIG_FILE=/dev/null`), so a
    build means the same whatever the base's pip.conf says, as local builds do. The label
    comes last, so Kaniko's cached layers for the RUN step serve other keys too."""
    pip = [
        "python3",
        *("-m", "pip", "install", "--no-cache-dir", "--no-input", "--disable-pip-version-check"),
        *("--progress-bar", "off"),
        *build.index.args(),
        *("-r", REQUIREMENTS_IN_IMAGE),
    ]
    requirements_sha = hashlib.sha256(build.requirements.encode()).hexdigest()
    env = "PIP_CONFIG_FILE=/dev/null PIP_ROOT_USER_ACTION=ignore PYTHONDONTWRITEBYTECODE=1"
    return "\n".join(
        [
            f"FROM {build.base}",
            f"COPY requirements.txt {REQUIREMENTS_IN_IMAGE}",
            f"RUN {env} {shlex.join(pip)} && rm -f {REQUIREMENTS_IN_IMAGE}",
            f"WORKDIR {JOB_WORKDIR}",
            f'LABEL {IMAGE_LABEL_KEY}="{build.key}" {IMAGE_LABEL_REQUIREMENTS}="{requirements_sha}" '
            f'{IMAGE_LABEL_BUILDER}="{build.builder_version}"',
            "",
        ]
    )


def context_files(build: KanikoBuild) -> dict[str, str]:
    """The build context, file name → text."""
    return {"Dockerfile": dockerfile(build), "requirements.txt": build.requirements}


def _metadata(build: KanikoBuild, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": build.settings.namespace,
        "labels": {MANAGED_BY: MANAGER, LABEL_ROLE: ROLE_BUILD, LABEL_BUILD: build.build_id},
        "annotations": {ANNOTATION_USER: build.owner, ANNOTATION_KEY: build.key},
    }


def context_config_map(build: KanikoBuild) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(build, job_name(build.build_id)),
        "data": context_files(build),
    }


def docker_config_secret(build: KanikoBuild, config_json: str, name: str | None = None) -> dict[str, Any]:
    """A `dockerconfig.dockerconfigjson` Secret: the push credentials (`secret_name`, the
    default), or the user's pull credentials (`pull_secret_name`)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(build, name or secret_name(build.build_id)),
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(config_json.encode()).decode()},
    }


def executor_args(build: KanikoBuild) -> list[str]:
    """Build into a tarball, push nothing: `--destination` only names the image's tag
    inside the tarball. `--no-push` alone is not enough without credentials: Kaniko
    (pkg/executor/push.go, CheckPushPermissions) then checks push rights on the cache
    repository, which is unset here, and fails before building; `--no-push-cache` and
    `--skip-push-permission-check` say there is nothing to check."""
    args = [
        f"--dockerfile={WORKSPACE}/Dockerfile",
        f"--context=dir://{WORKSPACE}/",
        f"--destination={build.destination}",
        "--no-push",
        "--no-push-cache",
        "--skip-push-permission-check",
        f"--tar-path={IMAGE_TAR}",
        "--snapshot-mode=redo",
        "--log-format=text",
        "--verbosity=info",
    ]
    args += [f"--insecure-registry={host}" for host in build.settings.insecure_registries]
    return args


def pusher_command(build: KanikoBuild) -> list[str]:
    """The pusher's command: push the executor's tarball as the destination."""
    command = ["python", "-m", "paddlecloud.builder.push"]
    command += ["--tar", IMAGE_TAR, "--destination", build.destination]
    if build.insecure_push:
        command.append("--insecure")
    return command


def build_job(build: KanikoBuild) -> dict[str, Any]:
    """The Job that runs the build once: no retries (a pip failure fails the same way
    again), the builder's timeout as the deadline's base, the configured resources as both
    requests and limits of the executor. The executor (user code runs there) mounts no
    push credential; the pusher (no user code) is the only container that does."""
    settings = build.settings
    resources = {
        "cpu": settings.cpu,
        "memory": settings.memory,
        "ephemeral-storage": settings.ephemeral_storage,
    }
    meta = _metadata(build, job_name(build.build_id))
    pod_meta = {"labels": dict(meta["labels"]), "annotations": dict(meta["annotations"])}
    no_privileges = {"allowPrivilegeEscalation": False, "seccompProfile": {"type": "RuntimeDefault"}}
    unprivileged = {
        **no_privileges,
        "runAsNonRoot": True,
        "runAsUser": INIT_UID,
        "runAsGroup": INIT_UID,
        "capabilities": {"drop": ["ALL"]},
    }
    executor_mounts: list[dict[str, Any]] = [
        {"name": "workspace", "mountPath": WORKSPACE},
        {"name": "image", "mountPath": IMAGE_DIR},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "context", "configMap": {"name": job_name(build.build_id)}},
        {"name": "workspace", "emptyDir": {"sizeLimit": "64Mi"}},
        # The image tarball: bounded by the pod's ephemeral-storage limits.
        {"name": "image", "emptyDir": {}},
        {
            "name": PUSH_VOLUME,
            "secret": {
                "secretName": secret_name(build.build_id),
                "items": [{"key": ".dockerconfigjson", "path": "config.json"}],
            },
        },
    ]
    if build.pull_credentials:
        # The user's own credentials for their private base: RUN steps can read them.
        executor_mounts.append({"name": PULL_VOLUME, "mountPath": DOCKER_CONFIG_DIR, "readOnly": True})
        volumes.append(
            {
                "name": PULL_VOLUME,
                "secret": {
                    "secretName": pull_secret_name(build.build_id),
                    "items": [{"key": ".dockerconfigjson", "path": "config.json"}],
                },
            }
        )
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "completionMode": "Indexed",
            "completions": 1,
            "parallelism": 1,
            "backoffLimit": 0,
            "activeDeadlineSeconds": int(build.timeout_seconds) + DEADLINE_SLACK_SECONDS,
            "ttlSecondsAfterFinished": 3600,
            "template": {
                "metadata": pod_meta,
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "initContainers": [
                        {
                            "name": CONTEXT_INIT,
                            "image": settings.init_image,
                            # cp follows the ConfigMap's links: the workspace gets plain files.
                            "command": [
                                "sh",
                                "-c",
                                _COPY_CONTEXT,
                            ],
                            "resources": {
                                "requests": {"cpu": "50m", "memory": "32Mi"},
                                "limits": {"cpu": "200m", "memory": "64Mi"},
                            },
                            "securityContext": {**unprivileged, "readOnlyRootFilesystem": True},
                            "volumeMounts": [
                                {"name": "context", "mountPath": CONTEXT_MOUNT, "readOnly": True},
                                {"name": "workspace", "mountPath": WORKSPACE},
                            ],
                        },
                        {
                            "name": EXECUTOR,
                            "image": settings.executor_image,
                            "args": executor_args(build),
                            "resources": {"requests": dict(resources), "limits": dict(resources)},
                            "securityContext": {
                                **no_privileges,
                                "runAsUser": 0,
                                "runAsNonRoot": False,
                                "capabilities": {"drop": ["ALL"], "add": list(EXECUTOR_CAPABILITIES)},
                            },
                            "volumeMounts": executor_mounts,
                        },
                    ],
                    "containers": [
                        {
                            "name": PUSHER,
                            "image": settings.pusher_image,
                            "command": pusher_command(build),
                            "env": [{"name": "DOCKER_CONFIG", "value": PUSH_CONFIG_DIR}],
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "128Mi"},
                                "limits": {"cpu": "1", "memory": "512Mi"},
                            },
                            "securityContext": unprivileged,
                            "volumeMounts": [
                                {"name": "image", "mountPath": IMAGE_DIR, "readOnly": True},
                                {"name": PUSH_VOLUME, "mountPath": PUSH_CONFIG_DIR, "readOnly": True},
                            ],
                        }
                    ],
                    "volumes": volumes,
                },
            },
        },
    }


def owned_by(job: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that makes an object the Job's (deleted with it)."""
    meta = job["metadata"]
    return {
        "metadata": {
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": False,
                    "blockOwnerDeletion": True,
                }
            ]
        }
    }
