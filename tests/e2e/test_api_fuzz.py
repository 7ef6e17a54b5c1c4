"""Schemathesis over the whole OpenAPI document, against a real `paddlecloud server`.

Every operation gets a bounded number of generated requests, as an administrator (who
may call every operation). Each answer must not be a 5xx, must have a status the document
lists for that operation, and must fit the document's schema for it. The builder has no
package index (nothing is installed by fuzzing) and builds are sandboxed anyway.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
import yaml
from conftest import Server, start_server
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance
from test_full_disk import login

from paddlecloud.gateway.openapi import openapi_document

pytestmark = pytest.mark.slow

EXAMPLES_PER_OPERATION = 12


@pytest.fixture(scope="module")
def fuzzed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    tmp = tmp_path_factory.mktemp("fuzz")
    settings = tmp / "server.yaml"
    # The fuzzer sends wrong current passwords to PUT auth/password, which count as failed
    # logins: with the limits on, the admin could not log in again at the end (the limits
    # have tests of their own, tests/component/test_gateway_logins.py).
    limits_off = {"login_failures_per_user": 0, "login_failures_per_address": 0}
    settings.write_text(
        yaml.safe_dump({"builder": {"no_index": True, "find_links": []}, "gateway": limits_off})
    )
    server = start_server(tmp / "home", tmp / "data", "--server-config", str(settings))
    try:
        assert server.admin_password
        yield server, login(server.endpoint, server.admin_password)
    finally:
        server.stop()


# The document is the service's own, read without a server: each operation is one test.
schema = schemathesis.openapi.from_dict(openapi_document())


@schemathesis.serializer("application/offset+octet-stream")
def _tus_chunk(_ctx: Any, value: Any) -> bytes:
    """A tus PATCH body: the bytes of a chunk, whatever was generated for it."""
    return value if isinstance(value, bytes) else str(value).encode()


@schema.parametrize()
@hypothesis.settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck),
    derandomize=True,
)
def test_every_operation_answers_within_its_documented_contract(
    case: Any, fuzzed_server: tuple[Server, str]
) -> None:
    server, token = fuzzed_server
    if (case.method.upper(), case.path) == ("DELETE", "/auth/token"):
        assert server.admin_password
        token = login(server.endpoint, server.admin_password)  # it revokes the one it uses
    case.call_and_validate(
        base_url=server.endpoint + "/api/v1",
        headers={"Authorization": f"Bearer {token}"},
        checks=[not_a_server_error, status_code_conformance, response_schema_conformance],
        timeout=30,
    )


def test_a_dry_run_of_a_package_not_uploaded_yet_fits_its_own_schema(
    fuzzed_server: tuple[Server, str],
) -> None:
    server, token = fuzzed_server
    spec = {"name": "later", "package": "/pfs/datacenter1/home/admin/not-yet.tar.gz"}
    case = schema["/jobs"]["POST"].Case(body=spec, query={"dry_run": "1"})
    response = case.call_and_validate(
        base_url=server.endpoint + "/api/v1",
        headers={"Authorization": f"Bearer {token}"},
        checks=[not_a_server_error, status_code_conformance, response_schema_conformance],
    )
    assert response.status_code == 200 and response.json()["package"] == {
        "path": spec["package"],
        "kind": None,
        "found": False,
    }


def test_the_fuzzed_server_is_still_whole(fuzzed_server: tuple[Server, str], tmp_path: Path) -> None:
    server, _ = fuzzed_server
    assert server.process.poll() is None
    server.cli("login")
    assert server.cli("version").returncode == 0
