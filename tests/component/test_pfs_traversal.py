"""Every PFS endpoint that takes a path, attacked through the real gateway: nothing leaves alice's home.

Each attack is sent as a real client sends it (the client URL-encodes `params=`), and
again as raw, pre-encoded query strings; then the suite checks that nothing outside
alice's home (bob's home, public, a file outside the PFS root) changed by a byte.
Both resolvers run it: openat2(RESOLVE_BENEATH), and the O_NOFOLLOW walk used where
openat2 is missing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientResponse
from test_pfs_files import API, HOME, Pfs, problem, snapshot, start_pfs, write
from yarl import URL

from paddlecloud.common import beneath
from support import PFS_TRAVERSALS

ALICE = f"{HOME}/alice"
# Paths whose resolution passes through a symlink that leads out of alice's home.
THROUGH_LINKS = [
    "to-bob/secret.txt",
    "to-bob/private",
    "to-bob-abs/secret.txt",
    "chain1/secret.txt",
    "dotdot/bob/secret.txt",
    "dir/up2/private/notes.txt",
    "up/outside/file.txt",
    "to-outside/file.txt",
    "magic/etc/passwd",
]
# Symlinks that are themselves the last component and point out; opening follows them.
LINKS_OUT = ["to-bob-secret", "to-outside-file", "to-bob", "up", "magic"]
# Query strings exactly as they go on the wire: encoding done by hand, once or twice.
RAW_PATHS = [
    "/pfs/dc1/home/alice/%252e%252e/bob",
    "/pfs/dc1/home/alice/%252e%252e%252fbob%252fsecret.txt",
    "/pfs/dc1/home/alice/%2e%2e/bob/secret.txt",
    "/pfs/dc1/home/alice/.%2e/bob/secret.txt",
    "/pfs/dc1/home/alice/%2E%2E%2F%2E%2E%2Fbob",
    "/pfs/dc1/home/alice/..%2fbob%2fsecret.txt",
    "/pfs/dc1/home/alice/..%5cbob",
    "/pfs/dc1/home/alice/%c0%ae%c0%ae/bob",
    "/pfs/dc1/home/alice/%ef%bc%8e%ef%bc%8e/bob",
    "/pfs/dc1/home/alice/%e2%80%a5/bob",
    "/pfs/dc1/home/alice/x%00/../../bob",
    "/pfs/dc1/home/alice/to-bob%2fsecret.txt",
    "/pfs/dc1/home/alice/up%2Foutside%2Ffile.txt",
    "%2fpfs%2fdc1%2fhome%2fbob%2fsecret.txt",
    "/pfs/dc1/home/alice/%2e%2e%2f%2e%2e%2f%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "/pfs/dc1/public/%2e%2e/home/bob",
    "/pfs/%2e%2e/dc1/home/bob",
    "/pfs/dc1/home/%2e%2e/home/bob",
    "/pfs/dc1/home/alice/..;/bob",
]
BAD_USERS = [
    "../bob",
    "..",
    ".",
    "bob/../alice",
    "%2e%2e",
    "%252e%252e",
    "",
    "a\x00b",
    "/etc",
    "\uff0e\uff0e",
]
RAW_USERS = ["..%2fbob", "%2e%2e", "%252e%252e%252fbob", "bob%00", "%2fetc"]


@pytest.fixture(params=["openat2", "nofollow-walk"])
async def pfs(
    request: Any, tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any, monkeypatch: Any
) -> Pfs:
    if request.param == "nofollow-walk":
        # As on a kernel without openat2: the service's Root probes once at startup.
        monkeypatch.setattr(beneath, "probe_openat2", lambda: False)
    elif not beneath.probe_openat2():
        pytest.skip("openat2 is not available on this kernel")
    env = await start_pfs(tmp_path, aiohttp_server, aiohttp_client)
    alice, bob = env.home("alice"), env.home("bob")
    write(alice / "mine.txt", b"mine")
    write(alice / "dir" / "inner.txt", b"inner")
    write(bob / "secret.txt", b"bob's secret")
    write(bob / "private" / "notes.txt", b"bob's notes")
    write(env.root / "public" / "shared.txt", b"shared")
    outside = tmp_path / "outside"
    write(outside / "file.txt", b"not pfs")
    links = {
        "to-bob": "../bob",
        "to-bob-abs": str(bob),
        "to-bob-secret": "../bob/secret.txt",
        "chain1": "chain2",
        "chain2": "to-bob",
        "dotdot": "..",
        "dir/up2": "../../bob",
        "up": "../../..",
        "to-outside": str(outside),
        "to-outside-file": str(outside / "file.txt"),
        "magic": "/proc/self/root",
    }
    for name, target in links.items():
        os.symlink(target, alice / name)
    return env


def world(pfs: Pfs) -> dict[str, Any]:
    """Everything the attacks must leave alone: the whole PFS root and the file outside it."""
    return {**snapshot(pfs.root), **snapshot(pfs.root.parent / "outside")}


async def refused(resp: ClientResponse, allowed: tuple[int, ...] = (400, 403, 404)) -> int:
    """A 4xx problem document, never a 500 or a success."""
    assert resp.status in allowed, (resp.method, resp.url, resp.status, await resp.text())
    if resp.method != "HEAD":
        await problem(resp, resp.status)
    return resp.status


def encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def path_calls(path: str) -> list[tuple[str, str, str, dict[str, Any]]]:
    """Every endpoint that takes `path`: (name, method, endpoint, request arguments)."""
    mine = f"{ALICE}/mine.txt"
    return [
        ("GET files", "GET", "files", {"params": {"path": path}}),
        ("HEAD files", "HEAD", "files", {"params": {"path": path}}),
        ("DELETE files", "DELETE", "files", {"params": {"path": path, "recursive": "1"}}),
        ("ls", "GET", "ls", {"params": {"path": path, "recursive": "1"}}),
        ("stat", "GET", "stat", {"params": {"path": path, "checksum": "sha256"}}),
        ("mkdir", "POST", "mkdir", {"json": {"path": path}}),
        ("mv src", "POST", "mv", {"json": {"src": path, "dst": f"{ALICE}/stolen", "overwrite": True}}),
        ("mv dst", "POST", "mv", {"json": {"src": mine, "dst": path, "overwrite": True}}),
    ]


async def test_traversal_spellings_are_bad_paths_on_every_endpoint(pfs: Pfs) -> None:
    before = world(pfs)
    for text in [*PFS_TRAVERSALS, "/pfs/dc1/home/alice/\udc80"]:
        # A lone surrogate cannot be URL-encoded at all, but JSON can carry one ("\udc80").
        json_only = not encodable(text)
        for name, method, endpoint, kwargs in path_calls(text):
            if json_only and method != "POST":
                continue
            resp = await pfs.call(method, endpoint, **kwargs)
            assert resp.status == 400, (name, text, await resp.text())
            if resp.method != "HEAD":
                await problem(resp, 400, "ERR_BAD_PATH")
    assert world(pfs) == before


async def test_symlinks_out_of_the_home_are_refused_on_every_endpoint(pfs: Pfs) -> None:
    before = world(pfs)
    for relative in THROUGH_LINKS:
        for name, method, endpoint, kwargs in path_calls(f"{ALICE}/{relative}"):
            resp = await pfs.call(method, endpoint, **kwargs)
            assert await refused(resp, (403,)) == 403, (name, relative)
    for relative in LINKS_OUT:
        # Downloading follows the last component, and must not follow it out.
        resp = await pfs.call("GET", "files", params={"path": f"{ALICE}/{relative}"})
        await problem(resp, 403, "ERR_PATH_FORBIDDEN")
        resp = await pfs.call("HEAD", "files", params={"path": f"{ALICE}/{relative}"})
        assert resp.status == 403
    assert world(pfs) == before


async def test_raw_pre_encoded_queries(pfs: Pfs) -> None:
    before = world(pfs)
    for raw in RAW_PATHS:
        for method, endpoint, extra in (
            ("GET", "files", ""),
            ("HEAD", "files", ""),
            ("DELETE", "files", "&recursive=1"),
            ("GET", "ls", "&recursive=1"),
            ("GET", "stat", "&checksum=sha256"),
        ):
            url = URL(f"{API}/{endpoint}?path={raw}{extra}", encoded=True)
            resp = await pfs.client.request(method, url, headers=pfs.headers["alice"])
            # What went on the wire is what we wrote, not re-encoded by the client.
            assert resp.url.raw_query_string == f"path={raw}{extra}"
            await refused(resp)
    for raw in RAW_USERS:
        url = URL(f"{API}/usage?user={raw}", encoded=True)
        await refused(await pfs.client.get(url, headers=pfs.headers["alice"]))
    assert world(pfs) == before


async def test_usage_names_a_user_never_a_path(pfs: Pfs) -> None:
    before = world(pfs)
    for user in BAD_USERS:
        for who in ("alice", "admin"):
            body = await problem(await pfs.get("usage", who, user=user), 400, "ERR_BAD_PATH")
            assert "user" in body["detail"]
    await problem(await pfs.get("usage", user="bob"), 403, "ERR_FORBIDDEN")
    assert world(pfs) == before


async def test_links_themselves_are_listed_moved_and_removed_never_followed(pfs: Pfs) -> None:
    alice = pfs.home("alice")
    outside_alice = {k: v for k, v in world(pfs).items() if not k.startswith(str(alice))}
    for link in ("to-bob", "to-outside", "up", "chain1"):
        body = await pfs.ok_json("ls", path=f"{ALICE}/{link}", recursive="1")
        assert [(e["name"], e["type"]) for e in body["entries"]] == [(link, "symlink")]
        body = await pfs.ok_json("stat", path=f"{ALICE}/{link}", checksum="sha256")
        assert (body["type"], body["target"]) == ("symlink", os.readlink(alice / link))
    whole = await pfs.ok_json("ls", path=ALICE, recursive="1")
    names = {e["name"] for e in whole["entries"]}
    assert names.isdisjoint({"secret.txt", "private", "notes.txt", "file.txt", "etc"})
    assert {"to-bob", "up", "magic", "inner.txt", "up2"} <= names
    # mkdir -p does not follow a symlink either: it is in the way.
    for link in ("to-bob", "to-outside", "up"):
        resp = await pfs.call("POST", "mkdir", json={"path": f"{ALICE}/{link}/new", "parents": True})
        await refused(resp, (403, 409))
    # Moving and removing a link moves and removes the link.
    resp = await pfs.call("POST", "mv", json={"src": f"{ALICE}/to-bob", "dst": f"{ALICE}/renamed"})
    assert resp.status == 200
    assert os.readlink(alice / "renamed") == "../bob"
    for link in ("renamed", "to-outside", "up", "to-bob-secret", "dotdot", "magic"):
        resp = await pfs.call("DELETE", "files", params={"path": f"{ALICE}/{link}", "recursive": "1"})
        assert resp.status == 204, link
        assert not os.path.lexists(alice / link)
    resp = await pfs.call("DELETE", "files", params={"path": f"{ALICE}/dir", "recursive": "1"})
    assert resp.status == 204  # holds up2 -> ../../bob, which rmtree must not enter
    after = {k: v for k, v in world(pfs).items() if not k.startswith(str(alice))}
    assert after == outside_alice
    assert (pfs.home("bob") / "private" / "notes.txt").read_bytes() == b"bob's notes"
