"""`paddlecloud ls` prints a paged listing as its pages come: the first entries are on stdout
before the server has served the last page, and every entry comes once, in order."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from paddlecloud.main import main

DIR = "/pfs/dc1/home/alice/big"
NAMES = [f"f{i:04d}" for i in range(25)]
PAGE = 10


def _entry(name: str) -> dict[str, Any]:
    return {
        "path": f"{DIR}/{name}",
        "name": name,
        "type": "file",
        "size": 1,
        "mtime": "2026-11-27T22:00:00+00:00",
        "mode": "0644",
    }


class Watched(io.StringIO):
    """stdout that says when the first entry has been written to it."""

    def __init__(self) -> None:
        super().__init__()
        self.first_entry = threading.Event()

    def write(self, text: str) -> int:
        written = super().write(text)
        if NAMES[0] in self.getvalue():
            self.first_entry.set()
        return written


class PagingServer:
    """A gateway that serves DIR in pages of PAGE and holds every later page until the CLI
    has printed the first entry (a CLI that held the whole listing would never print it)."""

    def __init__(self, stdout: Watched) -> None:
        self.stdout = stdout
        self.limits: list[str] = []
        self.held_in_vain = False
        self.ready = threading.Event()
        self.url = ""

    async def token(self, _request: web.Request) -> web.Response:
        return web.json_response({"token": "t", "expires_at": None, "user": "alice", "admin": False})

    async def ls(self, request: web.Request) -> web.Response:
        assert request.query["path"] == DIR
        self.limits.append(request.query["limit"])
        start = 0
        if "after" in request.query:
            # Bounded: a CLI that never prints fails the test below instead of hanging it.
            printed = await asyncio.to_thread(self.stdout.first_entry.wait, 30)
            self.held_in_vain |= not printed
            start = NAMES.index(request.query["after"]) + 1
        names = NAMES[start : start + PAGE]
        more = start + PAGE < len(NAMES)
        body = {"path": DIR, "entries": [_entry(n) for n in names], "next": names[-1] if more else None}
        return web.json_response(body)

    def serve(self) -> Iterator[None]:
        loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/api/v1/auth/token", self.token)
        app.router.add_get("/api/v1/pfs/ls", self.ls)
        runner = web.AppRunner(app)

        async def start() -> None:
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            self.url = f"http://127.0.0.1:{port}"

        loop.run_until_complete(start())
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        try:
            yield
        finally:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(30)
            loop.close()


def _run(tmp_path: Path, *args: str) -> tuple[PagingServer, Watched]:
    stdout = Watched()
    server = PagingServer(stdout)
    serving = server.serve()
    next(serving)
    try:
        config = tmp_path / ".paddle" / "config"
        config.parent.mkdir(exist_ok=True)
        config.write_text(
            json.dumps(
                {
                    "datacenters": [
                        {"name": "dc1", "username": "alice", "password": "pw", "endpoint": server.url}
                    ],
                    "current-datacenter": "dc1",
                }
            )
        )
        config.chmod(0o600)
        status = main(["ls", *args, DIR], env={"HOME": str(tmp_path)}, stdout=stdout, stderr=io.StringIO())
        assert status == 0
    finally:
        with pytest.raises(StopIteration):
            next(serving)
    return server, stdout


def test_ls_prints_the_first_page_before_the_last_is_served(tmp_path: Path) -> None:
    server, stdout = _run(tmp_path)
    assert not server.held_in_vain and len(server.limits) == 3
    lines = stdout.getvalue().splitlines()
    assert lines[0].split() == ["TYPE", "SIZE", "MODIFIED", "PATH"]
    assert [line.split()[-1] for line in lines[1:]] == NAMES
    # Widths from the first page: every row's PATH column starts where the header's does.
    column = lines[0].index("PATH")
    assert all(line[column:] in NAMES for line in lines[1:])


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_ls_data_formats_stream_the_one_document_they_always_printed(tmp_path: Path, fmt: str) -> None:
    server, stdout = _run(tmp_path, "-o", fmt)
    assert not server.held_in_vain and len(server.limits) == 3
    if fmt == "json":
        document = json.loads(stdout.getvalue())
    else:
        import yaml

        document = yaml.safe_load(stdout.getvalue())
    assert document == {"path": DIR, "entries": [_entry(n) for n in NAMES]}
