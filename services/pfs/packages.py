"""Job packages arriving by upload: pfs places an archive under a package's name only if
its bytes have that name (docs/jobs.md, "Package identity").

A package lives at `<home>/.paddlecloud/packages/<64 hex>.tar.gz` (or `.zip`). The name is
either the sha256 of the archive's bytes (a ready-made archive, and every package made before
manifests) or the sha256 of the manifest of its members (`paddlecloud.common.manifest`),
which is recomputed here from the staged bytes before the upload is placed: the jobs
service and the CLI then trust the name, so an unchanged package is found with one stat.
"""

from __future__ import annotations

import asyncio
import io
import re
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor

from paddlecloud.common.manifest import READ_BLOCK, NotAPackage, identity_of_archive
from paddlecloud.common.storage.base import Staging
from paddlecloud.common.volume import PfsPath

from .errors import PackageMismatch

PACKAGE_DIR = (".paddlecloud", "packages")
_NAME = re.compile(r"^([0-9a-f]{64})(\.tar\.gz|\.zip)$")


def package_name(dest: PfsPath) -> tuple[str, str] | None:
    """(identity, suffix) when `dest` is where a package is kept, else None."""
    if dest.area != "home" or len(dest.parts) != 3 or dest.parts[:2] != PACKAGE_DIR:
        return None
    found = _NAME.match(dest.parts[2])
    return (found.group(1), found.group(2)) if found else None


async def check_package(staging: Staging, upload_id: str, dest: PfsPath, digest: str) -> None:
    """PackageMismatch unless the staged upload `upload_id`, whose bytes' sha256 is `digest`,
    is the package that `dest` names; anything else at `dest` passes as it is."""
    named = package_name(dest)
    if named is None:
        return
    name, suffix = named
    if digest == name:
        return  # named by its bytes
    if suffix != ".tar.gz":
        raise PackageMismatch(
            f"{dest}: the file's sha256 is {digest}; a .zip package is named by the sha256 of its "
            "bytes. Nothing was placed."
        )
    try:
        found = await _identity(staging, upload_id)
    except NotAPackage as exc:
        raise PackageMismatch(
            f"{dest}: {exc}; a package named by its manifest is a .tar.gz as `paddlecloud submit` "
            "makes it. Nothing was placed."
        ) from None
    if found != name:
        raise PackageMismatch(
            f"{dest}: the archive's members have the identity {found}, not the one it is named by "
            "(nor is that the sha256 of its bytes); `paddlecloud submit` names a package itself. "
            "Nothing was placed."
        )


async def _identity(staging: Staging, upload_id: str) -> str:
    loop = asyncio.get_running_loop()
    pieces = staging.read_part(upload_id)
    # tarfile reads synchronously in a thread of its own, not one of the default executor's,
    # which may be what serves the reads that thread waits for.
    pool = ThreadPoolExecutor(1, thread_name_prefix="pfs-package-check")
    try:
        archive = io.BufferedReader(_Pieces(pieces, loop), READ_BLOCK)
        return await loop.run_in_executor(pool, identity_of_archive, archive)
    finally:
        pool.shutdown(wait=False)
        await pieces.aclose()


class _Pieces(io.RawIOBase):
    """An async stream of byte pieces as a blocking file, read from a worker thread."""

    def __init__(self, pieces: AsyncGenerator[bytes], loop: asyncio.AbstractEventLoop) -> None:
        self._pieces = pieces
        self._loop = loop
        self._left = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._left:
            piece = asyncio.run_coroutine_threadsafe(self._next(), self._loop).result()
            if piece is None:
                return 0
            self._left = memoryview(piece)
        n = min(len(buffer), len(self._left))
        buffer[:n] = self._left[:n]
        self._left = self._left[n:]
        return n

    async def _next(self) -> bytes | None:
        try:
            return await anext(self._pieces)
        except StopAsyncIteration:
            return None
