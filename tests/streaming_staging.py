"""A test-only staging that appends through `Staging.append` and `truncate`, as a streaming
medium (HDFS) does: pfs's generic upload path, run over a POSIX directory with plain writes."""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path

from paddlecloud.common.storage.base import Staging
from paddlecloud.common.storage.posix import PosixStaging, PosixVolume
from paddlecloud.common.volume import PfsPath


class StreamingStaging(Staging):
    """PosixStaging's records, parts and placing; appends and truncations of its own, with
    no descriptor for pfs to read back or sync (`direct` False)."""

    direct = False

    def __init__(self, inner: PosixStaging) -> None:
        self.inner = inner
        self.appends = 0  # how many bodies came through `append`: the tests check it was this path

    async def append(self, upload_id: str, start: int, pieces: AsyncIterator[bytes]) -> int:
        fd = self.inner.open_part(upload_id)
        try:
            if os.fstat(fd).st_size != start:
                raise OSError(
                    f"{upload_id}: appending at {start}, but the part is {os.fstat(fd).st_size} long"
                )
            self.appends += 1
            async for piece in pieces:
                view = memoryview(piece)
                while view:
                    view = view[os.write(fd, view) :]
            return os.fstat(fd).st_size
        finally:
            # Durable before the size is answered, and also what arrived before `pieces` raised.
            os.fsync(fd)
            os.close(fd)

    async def truncate(self, upload_id: str, size: int) -> None:
        fd = self.inner.open_part(upload_id)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)

    async def load_records(self) -> list[bytes]:
        return await self.inner.load_records()

    async def write_record(self, upload_id: str, data: bytes) -> None:
        await self.inner.write_record(upload_id, data)

    async def create_part(self, upload_id: str) -> int:
        return await self.inner.create_part(upload_id)

    async def part_size(self, upload_id: str) -> int | None:
        return await self.inner.part_size(upload_id)

    async def part_mtime(self, upload_id: str) -> float | None:
        return await self.inner.part_mtime(upload_id)

    async def hash_part(self, upload_id: str) -> str:
        return await self.inner.hash_part(upload_id)

    def read_part(self, upload_id: str) -> AsyncGenerator[bytes]:
        return self.inner.read_part(upload_id)

    async def place(self, upload_id: str, dest: PfsPath, *, digest: str, overwrite: bool) -> None:
        await self.inner.place(upload_id, dest, digest=digest, overwrite=overwrite)

    async def placed(self, upload_id: str, marker: int, dest: PfsPath, length: int) -> str | None:
        return await self.inner.placed(upload_id, marker, dest, length)

    async def remove(self, upload_id: str, *, record: bool) -> None:
        await self.inner.remove(upload_id, record=record)

    async def orphans(self, known: set[str], older_than: float) -> list[str]:
        return await self.inner.orphans(known, older_than)

    async def unlink(self, name: str) -> None:
        await self.inner.unlink(name)


class StreamingVolume(PosixVolume):
    """A POSIX volume whose uploads take the streaming path (StreamingStaging)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.posix_staging = self.staging
        self.staging = StreamingStaging(self.posix_staging)  # type: ignore[assignment]

    async def close(self) -> None:
        self.posix_staging.close()
