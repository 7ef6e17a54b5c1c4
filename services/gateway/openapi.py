"""The OpenAPI 3 document for the whole API, kept as YAML beside this module."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import yaml

from paddlecloud import __version__

METHODS = ("get", "put", "post", "delete", "options", "head", "patch")
PROBLEM = {"$ref": "#/components/responses/Problem"}


@functools.cache
def openapi_document() -> dict[str, Any]:
    text = resources.files(__package__).joinpath("openapi.yaml").read_text()
    document: dict[str, Any] = yaml.safe_load(text)
    document["info"]["version"] = __version__
    for item in document["paths"].values():
        for method in METHODS:
            if method in item:
                _add_shared_statuses(document, item, item[method])
    return document


def _add_shared_statuses(document: dict[str, Any], item: dict[str, Any], operation: dict[str, Any]) -> None:
    """List on an operation the problems that the shared machinery, not its handler, may
    answer (services/common/web.py, the gateway's authentication), so the YAML states
    only what is particular to each operation:

    - 401 where a token is needed (the document's default security);
    - 400 where there are query parameters or a body (a malformed one), 413 and 415 where
      the body is JSON (too large, or not JSON);
    - 507 where the operation writes (the server's disk is full).
    """
    responses = operation.setdefault("responses", {})
    shared: list[str] = []
    if operation.get("security", document.get("security")):
        shared.append("401")
    parameters = [*item.get("parameters", ()), *operation.get("parameters", ())]
    body = operation.get("requestBody", {}).get("content", {})
    if parameters or body:  # a path, query or header value, or a body, that is malformed
        shared.append("400")
    if "application/json" in body:
        shared += ["413", "415", "422"]
    if body or operation is item.get("delete") or operation is item.get("patch"):
        shared.append("507")
    for status in shared:
        responses.setdefault(status, PROBLEM)
