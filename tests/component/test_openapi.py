"""The OpenAPI document is valid, served, and describes exactly the routes the gateway answers."""

from __future__ import annotations

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
