"""`paddlecloud users create` against a real `paddlecloud server`: the quota a new user
gets (gateway.default_quota), said when the user is made, as text and as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.slow

UNLIMITED = dict.fromkeys(("cpu", "gpu", "memory", "jobs", "storage"))
DEFAULT = {"cpu": "4", "gpu": 0, "memory": "8Gi", "jobs": 2, "storage": "10Gi"}


def test_users_create_says_the_default_quota_the_new_user_got(server_factory: Any, tmp_path: Path) -> None:
    settings = tmp_path / "settings.yaml"
    settings.write_text(yaml.safe_dump({"gateway": {"default_quota": DEFAULT}}))
    server = server_factory("--server-config", str(settings))
    bob = server.cli("users", "create", "bob", "--password-stdin", stdin="bob-password\n")
    assert bob.stdout.splitlines() == [
        "Created user bob.",
        "Quota: cpu 4, gpu 0, memory 8Gi, jobs 2, storage 10Gi.",
    ]
    carol = json.loads(server.cli("-o", "json", "users", "create", "carol").stdout)
    assert carol["quota"] == DEFAULT and carol["password"]
    # The administrator the server made at its start is no new user: unlimited, as before.
    listed = json.loads(server.cli("-o", "json", "get", "users").stdout)["users"]
    assert {u["name"]: u["quota"] for u in listed} == {"admin": UNLIMITED, "bob": DEFAULT, "carol": DEFAULT}
