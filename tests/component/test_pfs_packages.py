"""pfs places an upload under a job package's name only if its bytes have that name: the
identity of its members' manifest, or the sha256 of its bytes (docs/jobs.md)."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

from test_pfs_uploads import Platform, make_platform, platform, problem

from paddlecloud.package import pack

__all__ = ["make_platform", "platform"]

PACKAGES = "/pfs/dc1/home/alice/.paddlecloud/packages"


def built(tmp_path: Path, tag: str, files: dict[str, str]) -> tuple[str, bytes]:
    """A package as `paddlecloud submit` builds it: (identity, archive bytes)."""
    root = tmp_path / tag
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    out = tmp_path / f"{tag}-out"
    out.mkdir()
    pkg = pack(root, out)
    assert pkg.archive is not None
    return pkg.sha256, pkg.archive.read_bytes()


async def upload(platform: Platform, path: str, data: bytes) -> tuple[int, str]:
    alice = await platform.user("alice")
    url = await platform.new_upload(alice, path, len(data))
    resp = await platform.patch(alice, url, 0, data)
    return resp.status, url


async def refused(platform: Platform, name: str, data: bytes, says: str) -> None:
    alice = await platform.user("alice")
    url = await platform.new_upload(alice, f"{PACKAGES}/{name}", len(data))
    body = await problem(await platform.patch(alice, url, 0, data), 422, "ERR_PACKAGE_MISMATCH")
    assert says in body["detail"] and body["detail"].endswith("Nothing was placed.")
    assert not (platform.home("alice") / ".paddlecloud/packages" / name).exists()
    assert [n for n in platform.staged() if not n.endswith(".info")] == []
    assert (await platform.client.head(url, headers=alice)).status == 410


async def test_a_package_is_placed_under_its_manifests_identity(platform: Platform, tmp_path: Path) -> None:
    identity, data = built(tmp_path, "a", {"train.py": "print(1)\n", "m/net.py": "W = 1\n"})
    status, _ = await upload(platform, f"{PACKAGES}/{identity}.tar.gz", data)
    assert status == 204
    assert (platform.home("alice") / f".paddlecloud/packages/{identity}.tar.gz").read_bytes() == data


async def test_an_archive_under_another_packages_identity_is_refused(
    platform: Platform, tmp_path: Path
) -> None:
    _, data = built(tmp_path, "a", {"train.py": "print(1)\n"})
    other, _ = built(tmp_path, "b", {"train.py": "print(2)\n"})
    await refused(platform, f"{other}.tar.gz", data, "not the one it is named by")


async def test_a_package_named_by_its_bytes_is_placed_as_before_manifests(
    platform: Platform, tmp_path: Path
) -> None:
    _, data = built(tmp_path, "a", {"train.py": "print(1)\n"})
    named = hashlib.sha256(data).hexdigest()
    assert (await upload(platform, f"{PACKAGES}/{named}.tar.gz", data))[0] == 204
    zipped = b"PK\x05\x06" + b"\0" * 18
    assert (await upload(platform, f"{PACKAGES}/{hashlib.sha256(zipped).hexdigest()}.zip", zipped))[0] == 204


async def test_what_is_no_package_is_refused_under_a_packages_name(
    platform: Platform, tmp_path: Path
) -> None:
    name = "0" * 64
    await refused(platform, f"{name}.tar.gz", b"not gzip at all", "not a readable .tar.gz")
    await refused(
        platform, f"{name}.zip", b"PK\x05\x06" + b"\0" * 18, "a .zip package is named by the sha256"
    )
    # A hard link is nothing the CLI writes: its identity could not be recomputed honestly.
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("x")
        info.type = tarfile.LNKTYPE
        info.linkname = "y"
        tar.addfile(info)
    await refused(platform, f"{name}.tar.gz", buffer.getvalue(), "neither a file, a directory nor a symlink")


async def test_other_files_beside_the_packages_are_placed_as_they_are(platform: Platform) -> None:
    for name in ("notes.txt", "F" * 64 + ".tar.gz", "sub/" + "0" * 64 + ".tar.gz"):
        assert (await upload(platform, f"{PACKAGES}/{name}", b"anything"))[0] == 204
