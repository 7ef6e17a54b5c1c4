"""pfs's domain refuses with domain errors, which know no HTTP; the service's one table
(errors.PROBLEMS) shows each as the problem it always was."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from paddlecloud.common.errors import DomainError, Exists, ProblemError, problem_for_domain
from paddlecloud.common.internal_auth import Identity
from paddlecloud.common.storage.cephfs import CephQuotas
from paddlecloud.common.storage.posix import PosixVolume
from paddlecloud.common.store import Store, open_store
from paddlecloud.common.volume import BadPath, PathForbidden, PathNotFound, PfsPath
from paddlecloud.pfs import tus
from paddlecloud.pfs.errors import PROBLEMS, BadMetadata, UploadNotFound
from paddlecloud.pfs.files import Files
from paddlecloud.pfs.uploads import Uploads

DC = "dc1"
ALICE = Identity("alice")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    store = open_store(f"sqlite:///{tmp_path}/store.db")
    await store.open()
    yield store
    await store.close()


@pytest.fixture
async def root(tmp_path: Path) -> AsyncIterator[PosixVolume]:
    root = PosixVolume(tmp_path / "pfs", quotas=CephQuotas(tmp_path / "pfs", enabled=False))
    await root.ensure_home("alice")
    (tmp_path / "pfs" / "home" / "alice" / "data").mkdir()
    yield root
    await root.close()


@pytest.fixture
def files(root: PosixVolume, store: Store) -> Files:
    return Files(root, store, datacenter=DC)


def shown(refusal: DomainError) -> tuple[int, str, str]:
    problem = problem_for_domain(refusal, PROBLEMS)
    return problem.kind.status, problem.kind.code, problem.detail


async def refused(call: Callable[[], Any]) -> DomainError:
    """What the domain raised calling `call` (awaiting it, if a coroutine): a DomainError, never a problem."""
    with pytest.raises(DomainError) as info:
        result = call()
        if inspect.isawaitable(result):
            await result
    assert not isinstance(info.value, ProblemError)
    return info.value


async def test_files_refuse_bad_and_missing_paths_as_domain_errors(files: Files) -> None:
    bad = await refused(lambda: files.resolve(ALICE, "/pfs/dc1/home/alice/../bob/x", write=False))
    assert isinstance(bad, BadPath)
    assert shown(bad)[:2] == (400, "ERR_BAD_PATH")

    theirs = await refused(lambda: files.resolve(ALICE, "/pfs/dc1/home/bob/x", write=False))
    assert isinstance(theirs, PathForbidden)
    assert shown(theirs) == (
        403,
        "ERR_PATH_FORBIDDEN",
        "/pfs/dc1/home/bob/x: you may only use your own home, /pfs/dc1/home/alice",
    )

    missing = await refused(lambda: files.stat(PfsPath(DC, "home", "alice", ("nope",)), sha256=False))
    assert isinstance(missing, PathNotFound)
    assert shown(missing) == (
        404,
        "ERR_PATH_NOT_FOUND",
        "/pfs/dc1/home/alice/nope: no such file or directory",
    )

    # A home nobody made yet is missing too, for everyone but its owner (an empty listing).
    nobody = PfsPath(DC, "home", "carol", ())
    assert isinstance(await refused(lambda: files.listing(ALICE, nobody, False)), PathNotFound)
    assert await files.listing(Identity("carol"), nobody, False) == []


async def test_file_operations_refuse_as_domain_errors(files: Files) -> None:
    data = PfsPath(DC, "home", "alice", ("data",))
    exists = await refused(lambda: files.mkdir(data, parents=False))
    assert isinstance(exists, Exists)
    assert shown(exists) == (409, "ERR_ALREADY_EXISTS", "/pfs/dc1/home/alice/data: already exists")


async def test_uploads_refuse_as_domain_errors(root: PosixVolume, store: Store) -> None:
    uploads = Uploads(root, store, datacenter=DC, max_size=1 << 20, expiry_seconds=60, read_timeout=5)
    gone = await refused(lambda: uploads.lookup("A" * 32, ALICE))
    assert isinstance(gone, UploadNotFound)
    assert shown(gone)[:2] == (404, "ERR_UPLOAD_NOT_FOUND")

    unnamed = await refused(lambda: uploads.create(ALICE, 3, tus.Metadata(())))
    assert isinstance(unnamed, BadMetadata)
    assert shown(unnamed)[:2] == (400, "ERR_BAD_METADATA")

    outside = tus.parse_metadata("path L3Bmcy9kYzEvaG9tZS9hbGljZS8uLi94")  # /pfs/dc1/home/alice/../x
    assert isinstance(await refused(lambda: uploads.create(ALICE, 3, outside)), BadPath)
