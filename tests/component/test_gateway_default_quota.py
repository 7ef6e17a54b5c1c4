"""The quota a new user starts with (gateway.default_quota): given at creation, and only
then: users made before a change of the setting keep their quota."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paddlecloud.gateway.app import create_app as create_gateway
from support import ADMIN_PASSWORD, make_config

UNLIMITED = dict.fromkeys(("cpu", "gpu", "memory", "jobs", "storage", "disk"))


async def create(client: Any, name: str) -> dict[str, Any]:
    login = await client.post("/api/v1/auth/token", json={"username": "admin", "password": ADMIN_PASSWORD})
    headers = {"Authorization": f"Bearer {(await login.json())['token']}"}
    resp = await client.post("/api/v1/users", json={"name": name, "password": "a-password"}, headers=headers)
    assert resp.status == 201, await resp.text()
    listed = await (await client.get("/api/v1/users", headers=headers)).json()
    return {"created": await resp.json(), "users": {u["name"]: u["quota"] for u in listed["users"]}}


async def test_new_users_get_the_default_and_a_changed_default_changes_no_one(
    tmp_path: Path, aiohttp_client: Any
) -> None:
    # The same store under three gateways in turn, each with the default its operator set.
    first = await aiohttp_client(create_gateway(make_config(tmp_path)))
    alice = await create(first, "alice")
    assert alice["created"]["quota"] == UNLIMITED
    await first.close()

    small = {"cpu": "500m", "gpu": 0, "memory": "2Gi", "jobs": 1, "storage": "1Gi", "disk": "4Gi"}
    second = await aiohttp_client(create_gateway(make_config(tmp_path, gateway={"default_quota": small})))
    bob = await create(second, "bob")
    assert bob["created"]["quota"] == small
    assert bob["users"] == {"admin": UNLIMITED, "alice": UNLIMITED, "bob": small}
    await second.close()

    larger = {"cpu": 8, "jobs": 4}
    third = await aiohttp_client(create_gateway(make_config(tmp_path, gateway={"default_quota": larger})))
    carol = await create(third, "carol")
    expected = {**UNLIMITED, "cpu": "8", "jobs": 4}
    assert carol["users"] == {"admin": UNLIMITED, "alice": UNLIMITED, "bob": small, "carol": expected}
