"""The upload suite again, through pfs's streaming path: a staging that is not `direct` (as
HDFS's is not) gets each body's pieces through `Staging.append`, hashed in the loop, and a
checksummed chunk that does not match or was cut short is truncated back.

The staging here (tests/streaming_staging.py) keeps POSIX's records and parts and does its
own plain writes, so these tests see the same files as the local-disk suite: resumes, chunk
checksums, the newer request that stops a stale PATCH, a stalled body, restarts.
"""

from __future__ import annotations

import asyncio

from streaming_staging import StreamingVolume
from test_pfs_packages import (  # the package checks read the part back through `read_part`
    test_a_package_is_placed_under_its_manifests_identity,
    test_an_archive_under_another_packages_identity_is_refused,
    test_what_is_no_package_is_refused_under_a_packages_name,
)
from test_pfs_uploads import (  # the local-disk suite's fixtures and tests, collected here again
    Platform,
    checksum,
    make_platform,
    platform,
    problem,
    test_a_body_that_stalls_times_out_and_keeps_what_arrived,
    test_a_stale_patch_does_not_block_the_client_that_comes_back,
    test_an_upload_resumes_across_a_restart,
    test_body_past_the_upload_length_is_never_written,
    test_chunk_checksums,
    test_creation_with_upload,
    test_deferred_length,
    test_quota_applies_when_a_deferred_length_is_declared,
    test_upload_cut_at_random_points_then_resumed_is_byte_identical,
    test_whole_file_sha256_mismatch_is_460_and_nothing_appears,
)

from paddlecloud.pfs.keys import VOLUME

PFS_VOLUME = StreamingVolume  # make_platform opens pfs on this volume

__all__ = [
    "make_platform",
    "platform",
    "test_a_body_that_stalls_times_out_and_keeps_what_arrived",
    "test_a_package_is_placed_under_its_manifests_identity",
    "test_a_stale_patch_does_not_block_the_client_that_comes_back",
    "test_an_archive_under_another_packages_identity_is_refused",
    "test_an_upload_resumes_across_a_restart",
    "test_body_past_the_upload_length_is_never_written",
    "test_chunk_checksums",
    "test_creation_with_upload",
    "test_deferred_length",
    "test_quota_applies_when_a_deferred_length_is_declared",
    "test_upload_cut_at_random_points_then_resumed_is_byte_identical",
    "test_what_is_no_package_is_refused_under_a_packages_name",
    "test_whole_file_sha256_mismatch_is_460_and_nothing_appears",
]


async def test_a_checksummed_chunk_cut_short_is_taken_back_through_append(platform: Platform) -> None:
    alice = await platform.user("alice")
    url = await platform.new_upload(alice, "/pfs/dc1/home/alice/cut.bin", 20)
    good = b"0123456789"
    resp = await platform.patch(alice, url, 0, good, **{"Upload-Checksum": checksum("sha256", good)})
    assert resp.status == 204 and resp.headers["Upload-Offset"] == "10"
    staging = platform.pfs_server[0].app[VOLUME].staging
    assert staging.appends == 1  # the body went through `append`, not the descriptor path
    sent = asyncio.Event()
    never = asyncio.Event()

    async def cut() -> object:
        yield b"abcde"
        sent.set()
        await never.wait()
        yield b"fghij"

    part = platform.root / ".uploads" / (url.rsplit("/", 1)[1] + ".part")
    stale = asyncio.create_task(
        platform.patch(
            alice, url, 10, cut(), **{"Content-Length": "10", "Upload-Checksum": checksum("sha256", b"x")}
        )
    )
    try:
        await sent.wait()
        async with asyncio.timeout(20):
            while part.stat().st_size < 15:  # still on its way through the gateway
                await asyncio.sleep(0.01)
            # A newer request stops the PATCH; its checksummed half-chunk cannot be verified.
            assert await platform.offset(alice, url) == 10
        await problem(await stale, 400, "ERR_UPLOAD_INTERRUPTED")
    finally:
        never.set()
        stale.cancel()
    assert part.read_bytes() == good
    rest = b"ABCDEFGHIJ"
    resp = await platform.patch(alice, url, 10, rest, **{"Upload-Checksum": checksum("sha256", rest)})
    assert resp.status == 204, await resp.text()
    assert (platform.home("alice") / "cut.bin").read_bytes() == good + rest
