"""What a Kaniko build is made of, as pure functions: the Dockerfile and its context, and
the Kubernetes objects that run it. Nothing here talks to a cluster or a registry.

One build is three objects in the build namespace, named after the build:

- `pcbuild-<id>`, a ConfigMap: the build context, the generated `Dockerfile` and the
  `requirements.txt` exactly as the request sent it (the text the cache key holds);
- `pcbuild-<id>-docker`, a Secret of type `kubernetes.io/dockerconfigjson`: the push
  credentials, and the user's credentials for a private base image, as Kaniko reads them
  from `/kaniko/.docker/config.json`;
- `pcbuild-<id>`, a batch/v1 Job running the executor, which pushes
  `<registry>/<repository>:<key>` and keeps its layer cache in `--cache-repo`. An init
  container copies the context out of the ConfigMap into the workspace, because a
  ConfigMap volume's files are symbolic links, which Kaniko would copy as links.

The ConfigMap and the Secret are owned by the Job (the backend adds the reference once the
Job exists), so deleting the Job removes them. The Job is Indexed with one completion:
that runs exactly like a plain Job of one pod, and it is the mode the jobs backend's
trainers use, which the test cluster emulates.

Security. Pods get no service-account token and no service links, run with the runtime's
default seccomp profile, and the init container runs as an unprivileged user with no
capabilities. The executor runs as root: Kaniko unpacks the base image over its own
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
CONTEXT_INIT = "context"
WORKSPACE = "/workspace"
CONTEXT_MOUNT = "/context"
DOCKER_CONFIG_DIR = "/kaniko/.docker"
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
    destination: str  # <registry>/<repository>:<key>
    cache_repo: str
    requirements: str
    builder_version: str
    settings: KanikoSection
    index: PipIndex
    timeout_seconds: float


def job_name(build_id: str) -> str:
    return f"pcbuild-{build_id}"


def secret_name(build_id: str) -> str:
    return f"pcbuild-{build_id}-docker"


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


def docker_config_secret(build: KanikoBuild, config_json: str) -> dict[str, Any]:
    """The credentials Kaniko pushes and pulls with (`dockerconfig.dockerconfigjson`)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(build, secret_name(build.build_id)),
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(config_json.encode()).decode()},
    }


def executor_args(build: KanikoBuild) -> list[str]:
    args = [
        f"--dockerfile={WORKSPACE}/Dockerfile",
        f"--context=dir://{WORKSPACE}/",
        f"--destination={build.destination}",
        "--cache=true",
        f"--cache-repo={build.cache_repo}",
        "--snapshot-mode=redo",
        "--push-retry=2",
        "--log-format=text",
        "--verbosity=info",
    ]
    args += [f"--insecure-registry={host}" for host in build.settings.insecure_registries]
    return args


def build_job(build: KanikoBuild) -> dict[str, Any]:
    """The Job that runs the executor once: no retries (a pip failure fails the same way
    again), the builder's timeout as the deadline's base, the configured resources as both
    requests and limits."""
    settings = build.settings
    resources = {
        "cpu": settings.cpu,
        "memory": settings.memory,
        "ephemeral-storage": settings.ephemeral_storage,
    }
    meta = _metadata(build, job_name(build.build_id))
    pod_meta = {"labels": dict(meta["labels"]), "annotations": dict(meta["annotations"])}
    no_privileges = {"allowPrivilegeEscalation": False, "seccompProfile": {"type": "RuntimeDefault"}}
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
                            "securityContext": {
                                **no_privileges,
                                "runAsNonRoot": True,
                                "runAsUser": INIT_UID,
                                "runAsGroup": INIT_UID,
                                "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": [
                                {"name": "context", "mountPath": CONTEXT_MOUNT, "readOnly": True},
                                {"name": "workspace", "mountPath": WORKSPACE},
                            ],
                        }
                    ],
                    "containers": [
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
                            "volumeMounts": [
                                {"name": "workspace", "mountPath": WORKSPACE},
                                {"name": "docker-config", "mountPath": DOCKER_CONFIG_DIR, "readOnly": True},
                            ],
                        }
                    ],
                    "volumes": [
                        {"name": "context", "configMap": {"name": job_name(build.build_id)}},
                        {"name": "workspace", "emptyDir": {"sizeLimit": "64Mi"}},
                        {
                            "name": "docker-config",
                            "secret": {
                                "secretName": secret_name(build.build_id),
                                "items": [{"key": ".dockerconfigjson", "path": "config.json"}],
                            },
                        },
                    ],
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
