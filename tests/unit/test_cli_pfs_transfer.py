"""The transfer engine against a small fake of the PFS API (docs/pfs.md) on loopback.

The fake keeps files in a temporary directory, speaks tus with checksums and whole-file sha256
verification, serves downloads with aiohttp's FileResponse (Range, If-Range, ETag), and can be
told to fail a given PATCH, so that resume, retry and restart paths run deterministically.
The real service is exercised by tests/e2e/test_pfs_cli.py.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import secrets
import unicodedata
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from paddlecloud import transfer
from paddlecloud.client import BODY_SLICE, AsyncClient
from paddlecloud.errors import ApiError
from paddlecloud.progress import Progress
from paddlecloud.transfer import PART_SUFFIX, ResumeState, TransferError, Transfers

HOME = "/pfs/dc1/home/alice"
CHUNK = 1024


def problem(status: int, detail: str) -> web.Response:
    body = {"title": web.Response(status=status).reason, "status": status, "detail": detail}
    return web.json_response(body, status=status, content_type="application/problem+json")


@dataclass
class Upload:
    path: str
    length: int
    sha256: str | None
    overwrite: bool
    data: bytearray = field(default_factory=bytearray)


class FakePfs:
    """The PFS endpoints, over `root` (PFS path /pfs/dc1/... is root/...)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.uploads: dict[str, Upload] = {}
        self.patches = 0
        self.received = 0  # bytes of PATCH bodies accepted
        self.fail_patch: dict[int, int] = {}  # PATCH number (1-based) -> status to answer instead
        self.damage_patch: set[int] = set()  # PATCH numbers whose body arrives with one bit flipped
        # PATCH number -> bytes of its body kept before the connection "breaks" (a 503): tus
        # servers keep what arrived, and the client learns how much from a HEAD.
        self.cut_patch: dict[int, int] = {}
        self.gets: list[dict[str, str]] = []

    def local(self, path: str) -> Path:
        assert path.startswith("/pfs/dc1/"), path
        # As the real service does: names in composed form (NFC), whatever was sent.
        path = unicodedata.normalize("NFC", path)
        return self.root / path.removeprefix("/pfs/dc1/").rstrip("/")

    def entry(self, path: Path) -> dict[str, Any]:
        info = path.lstat()
        kind = "dir" if path.is_dir() else "file"
        return {
            "path": "/pfs/dc1/" + path.relative_to(self.root).as_posix(),
            "name": path.name,
            "type": kind,
            "size": info.st_size if kind == "file" else 0,
            "mtime": datetime.fromtimestamp(info.st_mtime, UTC).isoformat(),
            "mode": f"{info.st_mode & 0o777:04o}",
        }

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        prefix = "/api/v1/pfs"
        app.router.add_get(f"{prefix}/stat", self.stat)
        app.router.add_get(f"{prefix}/ls", self.ls)
        app.router.add_post(f"{prefix}/mkdir", self.mkdir)
        app.router.add_get(f"{prefix}/files", self.files)
        app.router.add_post(f"{prefix}/uploads", self.create)
        app.router.add_route("HEAD", f"{prefix}/uploads/{{id}}", self.head)
        app.router.add_patch(f"{prefix}/uploads/{{id}}", self.patch)
        app.router.add_delete(f"{prefix}/uploads/{{id}}", self.terminate)
        return app

    async def stat(self, request: web.Request) -> web.Response:
        path = self.local(request.query["path"])
        if not path.exists():
            return problem(404, f"{request.query['path']}: no such file")
        entry = self.entry(path)
        if request.query.get("checksum") == "sha256" and entry["type"] == "file":
            entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        return web.json_response(entry)

    async def ls(self, request: web.Request) -> web.Response:
        path = self.local(request.query["path"])
        if not path.exists():
            return problem(404, f"{request.query['path']}: no such file")
        if path.is_file():
            found = [path]
        elif request.query.get("recursive") == "1":
            found = list(path.rglob("*"))
        else:
            found = list(path.iterdir())
        entries = sorted((self.entry(p) for p in found), key=lambda e: e["path"])
        return web.json_response({"path": request.query["path"], "entries": entries})

    async def mkdir(self, request: web.Request) -> web.Response:
        body = await request.json()
        path = self.local(body["path"])
        existed = path.is_dir()
        path.mkdir(parents=True, exist_ok=True)
        return web.json_response(self.entry(path), status=200 if existed else 201)

    async def files(self, request: web.Request) -> web.StreamResponse:
        self.gets.append(dict(request.headers))
        path = self.local(request.query["path"])
        if not path.is_file():
            return problem(404, "no such file")
        info = path.stat()
        etag = f'"{info.st_mtime_ns:x}-{info.st_size:x}"'  # the ETag FileResponse sends
        if_range = request.headers.get("If-Range")
        if if_range is not None and if_range != etag:
            # aiohttp's FileResponse reads If-Range only as a date (and honours the Range for
            # an entity tag); one that does not match means "send the whole file".
            return web.Response(body=path.read_bytes(), headers={"ETag": etag})
        return web.FileResponse(path)

    async def create(self, request: web.Request) -> web.Response:
        assert request.headers["Tus-Resumable"] == "1.0.0"
        metadata = {}
        for pair in request.headers["Upload-Metadata"].split(","):
            key, _, value = pair.partition(" ")
            metadata[key] = base64.b64decode(value).decode()
        dest = self.local(metadata["path"])
        overwrite = metadata.get("overwrite") == "1"
        if dest.exists() and not overwrite:
            return problem(409, f"{metadata['path']} exists")
        upload_id = secrets.token_hex(8)
        upload = Upload(
            metadata["path"], int(request.headers["Upload-Length"]), metadata.get("sha256"), overwrite
        )
        self.uploads[upload_id] = upload
        headers = {"Location": f"/api/v1/pfs/uploads/{upload_id}", "Tus-Resumable": "1.0.0"}
        if upload.length == 0:
            failure = self.complete(upload)
            if failure is not None:
                return failure
        return web.Response(status=201, headers=headers)

    async def head(self, request: web.Request) -> web.Response:
        upload = self.uploads.get(request.match_info["id"])
        if upload is None:
            return web.Response(status=404)
        return web.Response(
            status=200,
            headers={"Upload-Offset": str(len(upload.data)), "Upload-Length": str(upload.length)},
        )

    async def patch(self, request: web.Request) -> web.Response:
        self.patches += 1
        upload = self.uploads.get(request.match_info["id"])
        if upload is None:
            return web.Response(status=404)
        body = await request.read()
        if self.patches in self.damage_patch and body:
            body = bytes([body[0] ^ 1]) + body[1:]
        injected = self.fail_patch.pop(self.patches, None)
        if injected is not None:
            return problem(injected, f"injected failure of PATCH {self.patches}")
        if int(request.headers["Upload-Offset"]) != len(upload.data):
            return problem(409, "mismatched offset")
        kept = self.cut_patch.pop(self.patches, None)
        if kept is not None:
            upload.data += body[:kept]
            self.received += kept
            return problem(503, f"PATCH {self.patches} broke after {kept} bytes")
        algorithm, _, digest = request.headers["Upload-Checksum"].partition(" ")
        assert algorithm == "crc32"
        if base64.b64decode(digest) != zlib.crc32(body).to_bytes(4, "big"):
            return problem(460, "checksum mismatch")
        upload.data += body
        self.received += len(body)
        headers = {"Upload-Offset": str(len(upload.data))}
        if len(upload.data) == upload.length:
            failure = self.complete(upload)
            if failure is not None:
                return failure
            headers["PaddleCloud-Sha256"] = hashlib.sha256(upload.data).hexdigest()
            headers["PaddleCloud-Path"] = upload.path
        return web.Response(status=204, headers=headers)

    def complete(self, upload: Upload) -> web.Response | None:
        if upload.sha256 is not None and hashlib.sha256(upload.data).hexdigest() != upload.sha256:
            return problem(422, "sha256 mismatch")
        dest = self.local(upload.path)
        if dest.exists() and not upload.overwrite:
            return problem(409, f"{upload.path} exists")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(bytes(upload.data))
        return None

    async def terminate(self, request: web.Request) -> web.Response:
        self.uploads.pop(request.match_info["id"], None)
        return web.Response(status=204)


@dataclass
class Rig:
    pfs: FakePfs
    client: AsyncClient
    state: ResumeState
    out: io.StringIO
    err: io.StringIO

    def transfers(self, **kwargs: Any) -> Transfers:
        progress = Progress(stdout=self.out, stderr=self.err, bars=False, lines=True)
        kwargs.setdefault("chunk_size", CHUNK)
        return Transfers(self.client, user="alice", state=self.state, progress=progress, **kwargs)


@pytest.fixture
async def rig(aiohttp_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Rig]:
    monkeypatch.setattr(transfer, "RETRY_BASE_DELAY", 0.0)
    root = tmp_path / "pfs"
    (root / "home" / "alice").mkdir(parents=True)
    pfs = FakePfs(root)
    server = await aiohttp_server(pfs.app())
    client = AsyncClient(str(server.make_url("")), token="test-token", datacenter="dc1")
    yield Rig(pfs, client, ResumeState(tmp_path / "state" / "uploads.json"), io.StringIO(), io.StringIO())
    await client.close()


def make_tree(root: Path) -> dict[str, bytes]:
    files = {
        "top.txt": b"hello\n",
        "zero": b"",
        "a/b/deep.bin": os.urandom(3 * CHUNK + 17),
        "a/mid.bin": os.urandom(CHUNK),
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / "empty").mkdir()
    return files


async def test_a_tree_goes_up_then_is_skipped_as_identical_then_comes_back(rig: Rig, tmp_path: Path) -> None:
    source = tmp_path / "tree"
    files = make_tree(source)
    report = await rig.transfers().upload([source], f"{HOME}/data", recursive=True)
    assert len(report.transferred) == 4 and report.identical == 0 and report.failed == 0
    for name, data in files.items():
        assert (rig.pfs.root / "home/alice/data" / name).read_bytes() == data
    assert (rig.pfs.root / "home/alice/data/empty").is_dir()
    assert json.loads(rig.state.path.read_text())["uploads"] == {}  # finished uploads are forgotten

    # Again into the same place: the source's trailing slash says "what it holds", as rsync's.
    again = await rig.transfers().upload([f"{source}/"], f"{HOME}/data", recursive=True)
    assert again.identical == 4 and not again.transferred
    assert "4 already identical" in again.summary()
    assert "skipped tree/top.txt: already identical" in rig.out.getvalue()

    # Without it, an existing directory is copied into, under the source's own name, as cp does;
    # and so is a DEST with a trailing slash.
    nested = await rig.transfers().upload([source], f"{HOME}/data", recursive=True)
    assert len(nested.transferred) == 4 and (rig.pfs.root / "home/alice/data/tree/a/b/deep.bin").exists()
    into = await rig.transfers().upload([source], f"{HOME}/data/", recursive=True)
    assert into.identical == 4 and not into.transferred

    back = tmp_path / "back"
    down = await rig.transfers().download([f"{HOME}/data"], back, recursive=True)
    assert down.failed == 0 and len(down.transferred) == 4 + 4  # the tree twice: data/ and data/tree/
    for name, data in files.items():
        assert (back / name).read_bytes() == data
    assert (back / "empty").is_dir() and not list(back.rglob(f"*{PART_SUFFIX}"))
    again_down = await rig.transfers().download([f"{HOME}/data/"], back, recursive=True)
    assert again_down.identical == 8 and not again_down.transferred
    nested_down = await rig.transfers().download([f"{HOME}/data"], back, recursive=True)
    assert len(nested_down.transferred) == 8 and (back / "data" / "tree" / "top.txt").exists()


async def test_a_decomposed_local_name_is_the_composed_remote_one_and_is_skipped_when_identical(
    rig: Rig, tmp_path: Path
) -> None:
    # macOS writes names decomposed (NFD); the service keeps them composed (NFC).
    source = tmp_path / "tree"
    source.mkdir()
    (source / "cafe\u0301.txt").write_bytes(b"menu")
    first = await rig.transfers().upload([f"{source}/"], f"{HOME}/data", recursive=True)
    assert len(first.transferred) == 1, first.summary()
    assert [p.name for p in (rig.pfs.root / "home/alice/data").iterdir()] == ["caf\u00e9.txt"]
    again = await rig.transfers().upload([f"{source}/"], f"{HOME}/data", recursive=True)
    assert again.identical == 1 and not again.transferred, again.summary()


async def test_a_second_run_that_nests_says_how_to_copy_into_the_same_place(rig: Rig, tmp_path: Path) -> None:
    source = tmp_path / "data"
    make_tree(source)
    await rig.transfers().upload([source], f"{HOME}/data", recursive=True)
    await rig.transfers().upload([source], f"{HOME}/data", recursive=True)
    assert (rig.pfs.root / "home/alice/data/data/top.txt").exists()
    assert f"{HOME}/data exists: copying data into it, as {HOME}/data/data" in rig.out.getvalue()
    assert "end the source with a slash: data/" in rig.out.getvalue()
    back = tmp_path / "back" / "data"
    back.mkdir(parents=True)
    await rig.transfers().download([f"{HOME}/data"], back, recursive=True)
    assert (
        back / "data" / "top.txt"
    ).exists() and f"{back} exists: copying data into it" in rig.out.getvalue()


async def test_a_trailing_slash_on_a_file_is_refused(rig: Rig, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"a")
    with pytest.raises(TransferError, match=r"a\.txt/: not a directory"):
        await rig.transfers().upload([f"{tmp_path}/a.txt/"], f"{HOME}/x", recursive=True)
    (rig.pfs.root / "home/alice/b.txt").write_bytes(b"b")
    with pytest.raises(TransferError, match=r"b\.txt/: not a directory"):
        await rig.transfers().download([f"{HOME}/b.txt/"], tmp_path / "b", recursive=True)


async def test_an_interrupted_upload_resumes_without_resending_acknowledged_bytes(
    rig: Rig, tmp_path: Path
) -> None:
    data = os.urandom(5 * CHUNK + 3)
    local = tmp_path / "big.bin"
    local.write_bytes(data)
    rig.pfs.fail_patch[3] = 507  # not retryable: this run gives up after two chunks
    with pytest.raises(ApiError) as failed:
        await rig.transfers().upload([local], f"{HOME}/big.bin")
    assert failed.value.status == 507
    assert rig.pfs.received == 2 * CHUNK
    [record] = json.loads(rig.state.path.read_text())["uploads"].values()
    # No pass over the file before sending: the whole-file sha256 is not known up front.
    assert record["url"].startswith("/api/v1/pfs/uploads/") and record["sha256"] is None

    report = await rig.transfers().upload([local], f"{HOME}/big.bin")
    [result] = report.files
    assert (result.status, result.resumed_from) == ("uploaded", 2 * CHUNK)
    # The whole file was verified, the part sent by the first run included.
    assert result.sha256 == hashlib.sha256(data).hexdigest()
    assert rig.pfs.received == len(data)  # nothing sent twice
    assert f"resuming big.bin at 2.0 KiB of {transfer.human_size(len(data))}" in rig.out.getvalue()
    assert (rig.pfs.root / "home/alice/big.bin").read_bytes() == data


async def test_retries_a_damaged_chunk_and_a_server_hiccup(rig: Rig, tmp_path: Path) -> None:
    local = tmp_path / "a.bin"
    local.write_bytes(os.urandom(3 * CHUNK))
    rig.pfs.damage_patch.add(2)  # the chunk's own CRC-32 gives it away: 460, sent again
    rig.pfs.fail_patch[3] = 503
    report = await rig.transfers().upload([local], f"{HOME}/a.bin")
    assert report.files[0].status == "uploaded"
    assert (rig.pfs.root / "home/alice/a.bin").read_bytes() == local.read_bytes()
    assert rig.out.getvalue().count("retrying a.bin") == 2


async def test_chunks_over_a_mib_arrive_whole_and_can_be_sent_again(rig: Rig, tmp_path: Path) -> None:
    # Bodies over client.BODY_SLICE are written a view at a time: every byte must arrive
    # once and in order, and a chunk refused for damage is sent again from the same bytes.
    local = tmp_path / "big.bin"
    data = os.urandom(5 * BODY_SLICE + 11)
    local.write_bytes(data)
    rig.pfs.damage_patch.add(2)
    report = await rig.transfers(chunk_size=2 * BODY_SLICE + 3).upload([local], f"{HOME}/big.bin")
    assert report.files[0].status == "uploaded", report.files[0].error
    assert (rig.pfs.root / "home/alice/big.bin").read_bytes() == data
    assert rig.pfs.received == len(data) and rig.pfs.patches == 4


async def test_a_chunk_cut_short_goes_on_from_where_the_server_got_to(rig: Rig, tmp_path: Path) -> None:
    # The client has already hashed the chunks it read ahead; going on from the middle of
    # one, it must not count any byte twice or miss one in the whole file's sha256.
    local = tmp_path / "a.bin"
    data = os.urandom(3 * CHUNK + 5)
    local.write_bytes(data)
    rig.pfs.cut_patch[2] = CHUNK // 3
    report = await rig.transfers().upload([local], f"{HOME}/a.bin")
    assert report.files[0].status == "uploaded", report.files[0].error
    assert report.files[0].sha256 == hashlib.sha256(data).hexdigest()
    assert (rig.pfs.root / "home/alice/a.bin").read_bytes() == data
    assert rig.pfs.received == len(data)  # nothing sent twice that the server had kept


async def test_an_expired_upload_starts_over(rig: Rig, tmp_path: Path) -> None:
    local = tmp_path / "a.bin"
    local.write_bytes(os.urandom(3 * CHUNK))
    rig.pfs.fail_patch[2] = 507
    with pytest.raises(ApiError):
        await rig.transfers().upload([local], f"{HOME}/a.bin")
    rig.pfs.uploads.clear()  # the server collected it
    report = await rig.transfers().upload([local], f"{HOME}/a.bin")
    assert report.files[0].resumed_from is None
    assert (rig.pfs.root / "home/alice/a.bin").read_bytes() == local.read_bytes()


async def test_an_upload_of_a_changed_file_terminates_the_old_one(rig: Rig, tmp_path: Path) -> None:
    local = tmp_path / "a.bin"
    local.write_bytes(os.urandom(3 * CHUNK))
    rig.pfs.fail_patch[2] = 507
    with pytest.raises(ApiError):
        await rig.transfers().upload([local], f"{HOME}/a.bin")
    assert len(rig.pfs.uploads) == 1
    local.write_bytes(os.urandom(2 * CHUNK))
    os.utime(local, ns=(1, 1))
    await rig.transfers().upload([local], f"{HOME}/a.bin")
    assert len(rig.pfs.uploads) == 1  # the finished one; the stale one was terminated
    assert json.loads(rig.state.path.read_text())["uploads"] == {}


async def test_a_different_file_at_the_destination_needs_overwrite(rig: Rig, tmp_path: Path) -> None:
    local = tmp_path / "a.txt"
    local.write_bytes(b"new contents")
    (rig.pfs.root / "home/alice/a.txt").write_bytes(b"old contents")  # same size, other bytes
    with pytest.raises(TransferError, match=rf"{HOME}/a.txt exists and differs .* --overwrite"):
        await rig.transfers().upload([local], f"{HOME}/a.txt")
    report = await rig.transfers(overwrite=True).upload([local], f"{HOME}/a.txt")
    assert report.files[0].status == "uploaded"
    assert (rig.pfs.root / "home/alice/a.txt").read_bytes() == b"new contents"

    (tmp_path / "b.txt").write_bytes(b"local")
    (rig.pfs.root / "home/alice/b.txt").write_bytes(b"remote!")
    with pytest.raises(TransferError, match=r"b\.txt exists and differs"):
        await rig.transfers().download([f"{HOME}/b.txt"], tmp_path / "b.txt")


async def test_a_download_without_parents_refuses_a_missing_local_directory_and_makes_nothing(
    rig: Rig, tmp_path: Path
) -> None:
    (rig.pfs.root / "home/alice/f.txt").write_bytes(b"data")
    (rig.pfs.root / "home/alice/tree/sub").mkdir(parents=True)
    (rig.pfs.root / "home/alice/tree/sub/g.txt").write_bytes(b"g")
    missing = tmp_path / "nonexistent" / "dir"
    for source, dest, recursive in (
        (f"{HOME}/f.txt", missing / "x.txt", False),
        (f"{HOME}/f.txt", f"{missing}/", False),
        (f"{HOME}/tree", missing / "tree", True),
    ):
        with pytest.raises(
            TransferError, match=r"the directory .*nonexistent.* does not exist \(-p makes it\)"
        ):
            await rig.transfers(parents=False).download([source], dest, recursive=recursive)
    assert not (tmp_path / "nonexistent").exists()
    (tmp_path / "plain").write_bytes(b"")
    with pytest.raises(TransferError, match=r"plain is not a directory"):
        await rig.transfers(parents=False).download([f"{HOME}/f.txt"], tmp_path / "plain" / "x.txt")

    # The destination itself is still made when its parent is there; -p makes the rest.
    await rig.transfers(parents=False).download([f"{HOME}/f.txt"], f"{tmp_path}/new/")
    assert (tmp_path / "new" / "f.txt").read_bytes() == b"data"
    await rig.transfers(parents=True).download([f"{HOME}/f.txt"], missing / "x.txt")
    assert (missing / "x.txt").read_bytes() == b"data"


async def test_tree_failures_are_reported_per_file_and_the_rest_goes_on(rig: Rig, tmp_path: Path) -> None:
    source = tmp_path / "tree"
    make_tree(source)
    (rig.pfs.root / "home/alice/data/a").mkdir(parents=True)
    (rig.pfs.root / "home/alice/data/a/mid.bin").write_bytes(b"something else")
    report = await rig.transfers().upload([f"{source}/"], f"{HOME}/data", recursive=True)
    assert report.failed == 1 and len(report.transferred) == 3
    assert rig.err.getvalue().count("\n") == 1 and "mid.bin exists and differs" in rig.err.getvalue()


async def test_single_file_mistakes_raise_one_clear_error(rig: Rig, tmp_path: Path) -> None:
    with pytest.raises(TransferError, match="no such file or directory"):
        await rig.transfers().upload([tmp_path / "missing"], f"{HOME}/x")
    (tmp_path / "d").mkdir()
    with pytest.raises(TransferError, match=r"is a directory .*-r"):
        await rig.transfers().upload([tmp_path / "d"], f"{HOME}/x")
    (rig.pfs.root / "home/alice/rd").mkdir()
    with pytest.raises(TransferError, match=r"is a directory .*-r"):
        await rig.transfers().download([f"{HOME}/rd"], tmp_path / "x")


async def test_an_interrupted_download_resumes_with_if_range(rig: Rig, tmp_path: Path) -> None:
    data = os.urandom(4 * CHUNK)
    (rig.pfs.root / "home/alice/big.bin").write_bytes(data)
    dest = tmp_path / "big.bin"
    part = tmp_path / ("big.bin" + PART_SUFFIX)
    # What a first run that stopped after 1.5 chunks leaves: the part file, and the ETag of the
    # version it holds the beginning of.
    part.write_bytes(data[: CHUNK + CHUNK // 2])
    async with rig.client.open("HEAD", "pfs/files", params={"path": f"{HOME}/big.bin"}) as response:
        current_etag = response.headers["ETag"]
    key = ResumeState.download_key(rig.client.endpoint, "alice", f"{HOME}/big.bin", part.resolve())
    rig.state.put("downloads", key, {"etag": current_etag, "size": len(data)})

    report = await rig.transfers().download([f"{HOME}/big.bin"], dest)
    assert report.files[0].resumed_from == CHUNK + CHUNK // 2
    assert rig.pfs.gets[-1]["Range"] == f"bytes={CHUNK + CHUNK // 2}-"
    assert rig.pfs.gets[-1]["If-Range"] == current_etag
    assert dest.read_bytes() == data and not part.exists()
    assert "resuming big.bin at 1.5 KiB of 4.0 KiB" in rig.out.getvalue()

    # The file changed since the part was written: If-Range fails, the whole file comes (200).
    dest.unlink()
    part.write_bytes(data[:CHUNK])
    rig.state.put("downloads", key, {"etag": '"stale"', "size": len(data)})
    report = await rig.transfers().download([f"{HOME}/big.bin"], dest)
    assert report.files[0].resumed_from is None and dest.read_bytes() == data
    assert "changed on PFS since the last attempt; starting over" in rig.out.getvalue()


async def test_a_download_synced_as_it_goes_arrives_whole_and_a_failed_sync_fails_it(
    rig: Rig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The part file is fdatasynced in the background every WRITEBACK_EVERY bytes: the bytes
    # must all arrive, and a sync that fails (EIO) must fail the download, not publish it.
    monkeypatch.setattr(transfer, "WRITEBACK_EVERY", 4 * CHUNK)
    data = os.urandom(50 * CHUNK + 7)
    (rig.pfs.root / "home/alice/synced.bin").write_bytes(data)
    synced: list[int] = []
    real_fdatasync = os.fdatasync

    def counting(fd: int) -> None:
        synced.append(fd)
        real_fdatasync(fd)

    monkeypatch.setattr(transfer.os, "fdatasync", counting)
    report = await rig.transfers().download([f"{HOME}/synced.bin"], tmp_path / "synced.bin")
    assert report.files[0].status == "downloaded", report.files[0].error
    assert (tmp_path / "synced.bin").read_bytes() == data
    assert synced  # at least one background sync ran before the final fsync

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(transfer.os, "fdatasync", failing)
    with pytest.raises(TransferError, match=r"synced\.bin: Input/output error"):
        await rig.transfers().download([f"{HOME}/synced.bin"], tmp_path / "failed.bin")
    assert not (tmp_path / "failed.bin").exists()
