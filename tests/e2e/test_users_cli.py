"""An admin's first steps with the CLI against a real `paddlecloud server`: `users create`
says the quota the new user got (gateway.default_quota), as text and as JSON; and a
submit refused for a package in another user's home leaves no job behind."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import Server, start_server

pytestmark = pytest.mark.slow

UNLIMITED = dict.fromkeys(("cpu", "gpu", "memory", "jobs", "storage", "disk"))
DEFAULT = {"cpu": "4", "gpu": 0, "memory": "8Gi", "jobs": 2, "storage": "10Gi", "disk": "20Gi"}
BOBS_HOME = "/pfs/datacenter1/home/bob"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One platform for the module, with a default quota for new users."""
    tmp = tmp_path_factory.mktemp("users")
    settings = tmp / "settings.yaml"
    settings.write_text(yaml.safe_dump({"gateway": {"default_quota": DEFAULT}}))
    started = start_server(tmp / "home", tmp / "data", "--server-config", str(settings))
    yield started
    started.stop()


def test_users_create_says_the_default_quota_the_new_user_got(server: Server) -> None:
    bob = server.cli("users", "create", "bob", "--password-stdin", stdin="bob-password\n")
    assert bob.stdout.splitlines() == [
        "Created user bob.",
        "Quota: cpu 4, gpu 0, memory 8Gi, jobs 2, storage 10Gi, disk 20Gi.",
    ]
    carol = json.loads(server.cli("-o", "json", "users", "create", "carol").stdout)
    assert carol["quota"] == DEFAULT and carol["password"]
    # The administrator the server made at its start is no new user: unlimited, as before.
    listed = json.loads(server.cli("-o", "json", "get", "users").stdout)["users"]
    assert {u["name"]: u["quota"] for u in listed} == {"admin": UNLIMITED, "bob": DEFAULT, "carol": DEFAULT}


def test_an_admins_submit_of_another_users_package_is_refused_and_leaves_no_job(
    server: Server, tmp_path: Path
) -> None:
    # An admin may write in bob's home, and put a package there...
    (tmp_path / "train.py").write_text("print('hello')\n")
    server.cli("mkdir", f"{BOBS_HOME}/pkg")
    server.cli("cp", str(tmp_path / "train.py"), f"{BOBS_HOME}/pkg/train.py")
    # ... but a job runs with its owner's rights: the submit is refused, and nothing stays.
    refused = server.cli("submit", "--name", "borrowed", f"{BOBS_HOME}/pkg", check=False)
    assert refused.returncode == 1, refused
    listed = json.loads(server.cli("-o", "json", "get", "jobs", "-a").stdout)["jobs"]
    assert [job["name"] for job in listed] == []
    [line] = refused.stderr.strip().splitlines()
    assert "you may only use your own home" in line and "with its owner's rights" in line, line
    # The name is free: the same name with the admin's own copy passes every check.
    server.cli("cp", str(tmp_path / "train.py"), "pfs:pkg/train.py")
    dry = server.cli("-o", "json", "submit", "--dry-run", "--name", "borrowed", "pfs:pkg")
    assert json.loads(dry.stdout)["job"]["name"] == "borrowed"


def test_an_e_mail_address_is_refused_as_a_user_name_in_words(server: Server) -> None:
    """A user name is a PFS home and a Kubernetes namespace as spelled: an e-mail address
    (an SSO login) is refused, saying what to use instead, and no account is made."""
    refused = server.cli("users", "create", "Alice.Smith@lab.example.org", "--password-stdin", check=False,
                         stdin="alice-password\n")  # fmt: skip
    assert refused.returncode == 1, refused
    [line] = refused.stderr.strip().splitlines()
    assert (
        "'Alice.Smith@lab.example.org' is an e-mail address; a user name is 1 to 32 lowercase letters" in line
    )
    assert "use the address's local part (such as 'alice-smith')" in line, line
    listed = json.loads(server.cli("-o", "json", "get", "users").stdout)["users"]
    assert "Alice.Smith@lab.example.org" not in {u["name"] for u in listed}
    # The local part, as suggested, is a user name.
    server.cli("users", "create", "alice-smith", "--password-stdin", stdin="alice-password\n")
