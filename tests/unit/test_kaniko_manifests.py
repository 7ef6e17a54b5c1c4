"""The Kaniko build's manifests and Dockerfile, image names, and registry credentials' shape.

The manifests are checked with kubernetes-validate in strict mode (a misspelled field
fails) at the version the jobs backend's manifests are written for."""

from __future__ import annotations

import base64
import json
from typing import Any

import kubernetes_validate
import pytest

from paddlecloud.builder import kaniko_manifests as manifests
from paddlecloud.builder import rbac
from paddlecloud.builder.backend import PipIndex
from paddlecloud.builder.registry import ImageRef, _parse_challenge
from paddlecloud.common.config import KANIKO_EXECUTOR_IMAGE, ConfigError, KanikoSection, load_config
from paddlecloud.common.dockerconfig import Credentials, auth_key, dockerconfigjson, read_auths
from paddlecloud.jobs.kube.manifests import KUBERNETES_VERSION

DIGEST = "sha256:" + "ab" * 32


def make_build(*, pull_credentials: bool = False, **settings: Any) -> manifests.KanikoBuild:
    return manifests.KanikoBuild(
        build_id="0123456789abcdef0123456789abcdef",
        key="9" * 64,
        owner="alice",
        base=f"registry.example.com/base/python@{DIGEST}",
        destination=f"registry.example.com/paddlecloud/runtime/alice:{'9' * 64}",
        requirements="numpy==2.1.0\nrequests[socks] ; python_version >= '3.8'\n",
        builder_version="kaniko-2",
        settings=KanikoSection(registry="registry.example.com", **settings),
        index=PipIndex(
            "https://pypi.example.com/simple", ("http://wheels.example/",), False, ("wheels.example",)
        ),
        timeout_seconds=3600,
        pull_credentials=pull_credentials,
    )


def validate(obj: dict[str, Any]) -> None:
    assert kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True) == KUBERNETES_VERSION


def test_every_build_object_is_strictly_valid() -> None:
    build = make_build(insecure_registries=("registry.example.com",), pull_credentials=True)
    job = manifests.build_job(build)
    validate(job)
    validate(manifests.build_job(make_build()))
    validate(manifests.context_config_map(build))
    validate(manifests.docker_config_secret(build, dockerconfigjson({})))
    job["metadata"]["uid"] = "u-1"
    owned = manifests.context_config_map(build)
    owned["metadata"].update(manifests.owned_by(job)["metadata"])
    validate(owned)


def test_the_job_is_bounded_and_holds_no_token() -> None:
    build = make_build(cpu="2", memory="4Gi")
    job = manifests.build_job(build)
    spec = job["spec"]
    assert spec["backoffLimit"] == 0 and spec["completions"] == 1
    assert spec["activeDeadlineSeconds"] == 3600 + manifests.DEADLINE_SLACK_SECONDS
    pod = spec["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and pod["restartPolicy"] == "Never"
    init, executor = pod["initContainers"]
    (pusher,) = pod["containers"]
    assert executor["name"] == manifests.EXECUTOR and pusher["name"] == manifests.PUSHER
    for unprivileged in (init, pusher):
        assert unprivileged["securityContext"]["runAsNonRoot"] is True
        assert unprivileged["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # Kaniko needs root; it gets no escalation and only the capabilities unpacking needs.
    assert executor["securityContext"]["runAsUser"] == 0
    assert executor["securityContext"]["allowPrivilegeEscalation"] is False
    assert "SYS_ADMIN" not in executor["securityContext"]["capabilities"]["add"]
    assert executor["resources"]["limits"] == {"cpu": "2", "memory": "4Gi", "ephemeral-storage": "10Gi"}
    assert executor["resources"]["requests"] == executor["resources"]["limits"]
    args = executor["args"]
    assert f"--destination={build.destination}" in args and "--no-push" in args
    assert f"--tar-path={manifests.IMAGE_TAR}" in args
    # Else Kaniko checks push rights it has no credentials for, on a cache repository unset.
    assert "--no-push-cache" in args and "--skip-push-permission-check" in args
    # No layer cache: Kaniko would push it from the executor.
    assert not [arg for arg in args if arg.startswith(("--cache", "--push"))]
    assert pusher["command"] == [
        *("python", "-m", "paddlecloud.builder.push"),
        *("--tar", manifests.IMAGE_TAR, "--destination", build.destination),
    ]
    assert executor["image"] == KANIKO_EXECUTOR_IMAGE and "@sha256:" in executor["image"]
    assert pusher["image"] == "paddlecloud/pusher:0.1.0"


def _mounts(container: dict[str, Any]) -> set[str]:
    return {m["name"] for m in container.get("volumeMounts") or []}


@pytest.mark.parametrize("pull_credentials", [False, True])
def test_no_container_that_runs_user_code_mounts_the_push_credentials(pull_credentials: bool) -> None:
    """Kaniko runs the RUN steps (pip, an sdist's setup.py) in the executor container's own
    root filesystem: every volume mounted there is readable by user code. Only the pusher,
    which runs the platform's own command and no user code, mounts the push Secret; it
    reads nothing the user wrote but the tarball (opened without following links, push.py)."""
    build = make_build(pull_credentials=pull_credentials)
    pod = manifests.build_job(build)["spec"]["template"]["spec"]
    push_volume = next(v for v in pod["volumes"] if v["name"] == manifests.PUSH_VOLUME)
    assert push_volume["secret"]["secretName"] == manifests.secret_name(build.build_id)
    containers = [*pod["initContainers"], *pod["containers"]]
    holders = [c["name"] for c in containers if manifests.PUSH_VOLUME in _mounts(c)]
    assert holders == [manifests.PUSHER]
    # Nor any other way in: no projected or secret volume of the push Secret elsewhere,
    # no env from it, no service-account token.
    for container in containers:
        if container["name"] == manifests.PUSHER:
            continue
        for mount in container.get("volumeMounts") or []:
            volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
            assert volume.get("secret", {}).get("secretName") != manifests.secret_name(build.build_id)
        assert "envFrom" not in container and "env" not in container
    pusher = pod["containers"][0]
    # The pusher runs the platform's command, never the executor's image or the user's.
    assert pusher["image"] == build.settings.pusher_image and pusher["command"][:3] == [
        "python",
        "-m",
        "paddlecloud.builder.push",
    ]
    assert _mounts(pusher) == {"image", manifests.PUSH_VOLUME}
    assert all(m["readOnly"] for m in pusher["volumeMounts"])
    executor = pod["initContainers"][1]
    if pull_credentials:
        # The user's own pull credentials, for their private base: readable by their own code.
        assert _mounts(executor) == {"workspace", "image", manifests.PULL_VOLUME}
        pull = next(v for v in pod["volumes"] if v["name"] == manifests.PULL_VOLUME)
        assert pull["secret"]["secretName"] == manifests.pull_secret_name(build.build_id)
    else:
        assert _mounts(executor) == {"workspace", "image"}


def test_the_dockerfile_pins_the_base_and_installs_with_the_configured_index() -> None:
    build = make_build()
    text = manifests.dockerfile(build)
    lines = text.splitlines()
    assert lines[0] == f"FROM registry.example.com/base/python@{DIGEST}"
    assert lines[1] == f"COPY requirements.txt {manifests.REQUIREMENTS_IN_IMAGE}"
    run = lines[2]
    assert run.startswith("RUN PIP_CONFIG_FILE=/dev/null ")
    assert "--index-url https://pypi.example.com/simple --find-links http://wheels.example/" in run
    assert "--trusted-host wheels.example" in run
    assert lines[3] == f"WORKDIR {manifests.JOB_WORKDIR}"
    assert lines[4].startswith(f'LABEL {manifests.IMAGE_LABEL_KEY}="{build.key}"')
    assert manifests.context_files(build)["requirements.txt"] == build.requirements


def test_image_names_are_read_as_docker_reads_them() -> None:
    assert ImageRef.parse("python:3.11-slim") == ImageRef("docker.io", "library/python", "3.11-slim")
    assert ImageRef.parse("bob/app") == ImageRef("docker.io", "bob/app", "latest")
    assert ImageRef.parse("localhost:5000/a/b:1") == ImageRef("localhost:5000", "a/b", "1")
    ref = ImageRef.parse(f"r.example.com/x@{DIGEST}")
    assert (ref.tag, ref.digest, ref.reference) == (None, DIGEST, DIGEST)
    assert str(ImageRef.parse("r.example.com:443/x:1").with_digest(DIGEST)) == f"r.example.com:443/x@{DIGEST}"
    for bad in ("UPPER/case", "r.example.com/x@sha256:12", "x:bad tag"):
        with pytest.raises(ValueError):
            ImageRef.parse(bad)


def test_challenges_are_parsed() -> None:
    scheme, params = _parse_challenge(
        'Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/python:pull"'
    )
    assert scheme == "bearer"
    assert params == {
        "realm": "https://auth.docker.io/token",
        "service": "registry.docker.io",
        "scope": "repository:library/python:pull",
    }
    assert _parse_challenge('Basic realm="basic-realm"') == ("basic", {"realm": "basic-realm"})


def test_registry_credentials_have_the_auths_shape_with_docker_hubs_key() -> None:
    text = dockerconfigjson(
        {
            "https://registry.example.com:5000/v2/": Credentials("bob", "s3cr$t"),
            "docker.io": Credentials("al", "x"),
        }
    )
    config = json.loads(text)
    assert set(config) == {"auths"}
    entry = config["auths"]["registry.example.com:5000"]
    assert base64.b64decode(entry["auth"]).decode() == "bob:s3cr$t"
    assert "https://index.docker.io/v1/" in config["auths"]
    assert auth_key("registry-1.docker.io") == "https://index.docker.io/v1/"
    back = read_auths(text)
    assert back["registry.example.com:5000"] == Credentials("bob", "s3cr$t")
    assert back["docker.io"] == Credentials("al", "x")
    assert "s3cr" not in repr(back)
    with pytest.raises(ValueError, match="auths"):
        read_auths('{"registry.example.com": {}}')


def test_kaniko_settings_are_checked_at_start(tmp_path: Any) -> None:
    def load(builder: dict[str, Any]) -> Any:
        path = tmp_path / "c.yaml"
        path.write_text(json.dumps({"builder": builder}))
        return load_config(path, env={})

    with pytest.raises(ConfigError, match=r"kaniko\.registry"):
        load({"backend": "kaniko"})
    with pytest.raises(ConfigError, match="http"):
        load({"backend": "kaniko", "kaniko": {"registry": "r.example.com"}, "find_links": ["/wheels"]})
    with pytest.raises(ConfigError, match="credentials"):
        load(
            {"backend": "kaniko", "kaniko": {"registry": "r"}, "index_url": "https://u:p@pypi.example/simple"}
        )
    with pytest.raises(ConfigError, match="memory"):
        load({"backend": "kaniko", "kaniko": {"registry": "r", "memory": "lots"}})
    with pytest.raises(ConfigError, match="auth_file"):
        load({"backend": "kaniko", "kaniko": {"registry": "r", "auth_file": str(tmp_path / "none.json")}})
    with pytest.raises(ConfigError, match=r"cache_repository: .*layer cache is removed"):
        load({"backend": "kaniko", "kaniko": {"registry": "r", "cache_repository": "x/cache"}})
    with pytest.raises(ConfigError, match=r"kaniko\.kubeconfig: .*no kubeconfig file at"):
        load({"backend": "kaniko", "kaniko": {"registry": "r", "kubeconfig": str(tmp_path / "none")}})
    config = load(
        {"backend": "kaniko", "kaniko": {"registry": "r.example.com:5000", "insecure_registries": "a,b"}}
    )
    assert config.builder.kaniko.insecure_registries == ("a", "b")
    assert config.builder.kaniko.kubeconfig is None  # jobs.kubernetes's then


def test_the_builders_role_grants_no_reading_of_secrets_and_nothing_cluster_wide() -> None:
    for permission in rbac.PERMISSIONS:
        assert not set(permission.verbs) & rbac.FORBIDDEN_VERBS
        assert permission.resource not in rbac.FORBIDDEN_RESOURCES
    secrets = next(p for p in rbac.PERMISSIONS if p.resource == "secrets")
    assert not {"get", "list", "watch"} & set(secrets.verbs)
    assert not rbac.allowed("list", "batch", "jobs", namespaced=False)
    role = rbac.role("paddlecloud-builder", "paddlecloud-builds")
    assert role["kind"] == "Role" and role["rules"] == rbac.policy_rules()
