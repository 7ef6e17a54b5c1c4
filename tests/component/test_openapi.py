"""The OpenAPI document is valid, served, and describes exactly the routes the gateway answers."""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

from paddlecloud import __version__
from paddlecloud.gateway.app import ROUTES, create_app
from paddlecloud.gateway.openapi import openapi_document
from support import make_config

METHODS = {"get", "post", "put", "delete", "patch", "head", "options"}


def test_document_is_valid_openapi() -> None:
    document = openapi_document()
    validate(document)
    assert document["info"]["version"] == __version__


def test_document_matches_the_gateways_own_routes(tmp_path) -> None:
    app = create_app(make_config(tmp_path))
    routes = set()
    for route in app.router.routes():
        path = route.resource.canonical if route.resource else ""
        if path.startswith("/api/v1/") and "{tail" not in path and route.method.lower() in METHODS:
            routes.add((route.method.lower(), path.removeprefix("/api/v1")))
    # aiohttp answers HEAD wherever it answers GET; that is no API of its own.
    routes -= {("head", path) for method, path in routes if method == "get"}
    proxied = tuple(prefix.removeprefix("/api/v1") for prefix, _ in ROUTES)
    documented = {
        (method, path)
        for path, item in openapi_document()["paths"].items()
        if not path.startswith(proxied)
        for method in item
        if method in METHODS
    }
    assert routes == documented


async def test_document_is_served(tmp_path, aiohttp_client) -> None:
    client = await aiohttp_client(create_app(make_config(tmp_path)))
    login = await client.post(
        "/api/v1/auth/token", json={"username": "admin", "password": "admin-password-for-tests"}
    )
    token = (await login.json())["token"]
    resp = await client.get("/api/v1/openapi.json", headers={"Authorization": f"Bearer {token}"})
    assert resp.status == 200
    assert (await resp.json())["openapi"].startswith("3.")


def test_document_lists_exactly_the_pfs_services_routes(tmp_path) -> None:
    from paddlecloud.pfs.app import create_app as create_pfs

    app = create_pfs(make_config(tmp_path))
    routes = set()
    for route in app.router.routes():
        path = route.resource.canonical if route.resource else ""
        if not path.startswith("/api/v1/pfs"):
            continue
        path = path.removeprefix("/api/v1")
        if route.method == "*":  # the tus endpoints dispatch on the method themselves
            methods = {"head", "patch", "delete"} if "{" in path else {"options", "post"}
            routes |= {(m, path) for m in methods}
        elif route.method.lower() in METHODS:
            routes.add((route.method.lower(), path))
    # aiohttp answers HEAD for every GET; the document lists it where it means something
    # of its own (a download's headers), so a HEAD listed must be one that is served.
    documented = {
        (method, path)
        for path, item in openapi_document()["paths"].items()
        if path.startswith("/pfs")
        for method in item
        if method in METHODS
    }
    assert documented <= routes
    assert routes - documented == {("head", p) for m, p in routes if m == "get"} - documented


def test_document_lists_exactly_the_jobs_services_routes(tmp_path) -> None:
    from paddlecloud.jobs.app import create_app as create_jobs

    app = create_jobs(make_config(tmp_path))
    routes = set()
    for route in app.router.routes():
        path = route.resource.canonical if route.resource else ""
        if path.startswith(("/api/v1/jobs", "/api/v1/quota")) and route.method.lower() in METHODS:
            routes.add((route.method.lower(), path.removeprefix("/api/v1")))
    routes -= {("head", path) for method, path in routes if method == "get"}
    documented = {
        (method, path)
        for path, item in openapi_document()["paths"].items()
        if path.startswith(("/jobs", "/quota"))
        for method in item
        if method in METHODS
    }
    assert routes == documented


def test_document_lists_exactly_the_builder_services_routes(tmp_path) -> None:
    from paddlecloud.builder.app import create_app as create_builder

    app = create_builder(make_config(tmp_path))
    routes = set()
    for route in app.router.routes():
        path = route.resource.canonical if route.resource else ""
        if path.startswith("/api/v1/builds") and route.method.lower() in METHODS:
            routes.add((route.method.lower(), path.removeprefix("/api/v1")))
    routes -= {("head", path) for method, path in routes if method == "get"}
    documented = {
        (method, path)
        for path, item in openapi_document()["paths"].items()
        if path.startswith("/builds")
        for method in item
        if method in METHODS
    }
    assert routes == {("post", "/builds"), ("get", "/builds/{id}"), ("get", "/builds/{id}/logs")}
    assert routes == documented


def _parameter(document: dict[str, Any], path: str, method: str, name: str) -> dict[str, Any]:
    item = document["paths"][path]
    for parameter in [*item.get("parameters", []), *item[method].get("parameters", [])]:
        if "$ref" in parameter:
            parameter = document["components"]["parameters"][parameter["$ref"].rsplit("/", 1)[1]]
        if parameter["name"] == name:
            return parameter
    raise KeyError(name)


def _body_property(document: dict[str, Any], path: str, name: str) -> dict[str, Any]:
    body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    prop: dict[str, Any] = body["properties"][name]
    return prop


async def test_what_the_server_refuses_the_document_refuses_too(
    tmp_path, aiohttp_server, aiohttp_client
) -> None:
    """Clients generated from the document (and schemathesis) must not be told an empty
    path or cursor is fine when the server answers 400 for it."""
    from test_jobs_api import start_jobs

    document = openapi_document()
    jobs = await start_jobs(tmp_path, aiohttp_server, aiohttp_client)
    refused: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
        ("GET", "pfs/ls", {"params": {"path": ""}}, _parameter(document, "/pfs/ls", "get", "path")),
        ("GET", "pfs/stat", {"params": {"path": ""}}, _parameter(document, "/pfs/stat", "get", "path")),
        ("GET", "pfs/files", {"params": {"path": ""}}, _parameter(document, "/pfs/files", "get", "path")),
        (
            "POST",
            "pfs/mkdir",
            {"json": {"path": ""}},
            {"schema": _body_property(document, "/pfs/mkdir", "path")},
        ),
        (
            "POST",
            "pfs/mv",
            {"json": {"src": "", "dst": "x"}},
            {"schema": _body_property(document, "/pfs/mv", "src")},
        ),
        (
            "POST",
            "pfs/mv",
            {"json": {"src": "x", "dst": ""}},
            {"schema": _body_property(document, "/pfs/mv", "dst")},
        ),
        ("GET", "jobs", {"params": {"cursor": ""}}, _parameter(document, "/jobs", "get", "cursor")),
    ]
    for method, endpoint, kwargs, parameter in refused:
        resp = await jobs.call(method, endpoint, **kwargs)
        assert 400 <= resp.status < 500, (endpoint, kwargs, resp.status, await resp.text())
        assert not Draft202012Validator(parameter["schema"]).is_valid(""), (endpoint, parameter)
    # tus: the header is required, and 1.0.0 is the only value; anything else is a 412.
    tus = _parameter(document, "/pfs/uploads/{upload_id}", "patch", "Tus-Resumable")
    assert tus["required"] is True and tus["schema"]["enum"] == ["1.0.0"]
    for path, method in (
        ("/pfs/uploads", "post"),
        *(("/pfs/uploads/{upload_id}", m) for m in ("head", "patch", "delete")),
    ):
        assert _parameter(document, path, method, "Tus-Resumable") == tus
        assert "412" in document["paths"][path][method]["responses"]
    for wrong in ({}, {"Tus-Resumable": "0.2.2"}):
        resp = await jobs.call("POST", "pfs/uploads", headers={**wrong, "Upload-Length": "1"})
        assert resp.status == 412 and resp.headers["Tus-Version"] == "1.0.0", await resp.text()
