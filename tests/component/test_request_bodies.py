"""Request bodies as a hostile client sends them: slowly, large, deeply nested, with huge numbers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from test_jobs_api import Jobs, start_jobs


@pytest.fixture
async def jobs(tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any) -> Jobs:
    return await start_jobs(tmp_path, aiohttp_server, aiohttp_client)


async def dribbled(data: bytes, piece: int = 4096) -> AsyncIterator[bytes]:
    """The body a little at a time, as a slow network delivers it."""
    for start in range(0, len(data), piece):
        yield data[start : start + piece]
        await asyncio.sleep(0)


async def post(jobs: Jobs, body: bytes, *, slow: bool = False) -> tuple[int, dict[str, Any]]:
    data: Any = dribbled(body) if slow else body
    resp = await jobs.call(
        "POST", "jobs", data=data, params={"dry_run": "1"}, headers={"Content-Type": "application/json"}
    )
    return resp.status, await resp.json(content_type=None)


async def test_a_large_valid_spec_that_arrives_slowly_is_read_whole_every_time(jobs: Jobs) -> None:
    package = jobs.package({"train.py": "print(1)\n"})
    env = {f"VAR_{i}": "x" * 250 for i in range(800)}  # ~210 KB of JSON
    body = json.dumps({"name": "big", "package": package, "env": env}).encode()
    assert len(body) > 200_000
    for _ in range(10):
        status, answer = await post(jobs, body, slow=True)
        assert status == 200, answer
        assert answer["job"]["spec"]["env"] == env


async def test_bodies_past_the_limits_are_refused_saying_which_limit(jobs: Jobs) -> None:
    package = jobs.package({"train.py": "print(1)\n"})

    async def refused(spec: Any, status: int, field: str | None, words: str, **kw: Any) -> None:
        code, answer = await post(
            jobs, json.dumps(spec).encode() if not isinstance(spec, bytes) else spec, **kw
        )
        assert code == status, answer
        assert answer["type"].startswith("urn:paddlecloud:error:"), answer  # problem+json, never a 500
        assert words in answer["detail"], answer
        if field is not None:
            assert answer["errors"][0]["field"] == field, answer

    base = {"name": "j", "package": package}
    await refused({**base, "env": {"BIG": "x" * 1_000_000}}, 422, "env", "at most 256 KiB", slow=True)
    await refused({**base, "entry": "echo " + "x" * 200_000}, 422, "entry", "put the command in a script")
    await refused({**base, "env": {f"V{i}": "1" for i in range(1001)}}, 422, "env", "at most 1000")
    await refused({**base, "cpu": "1e300"}, 422, "cpu", "too large")
    await refused({**base, "memory": "12345678901234567890123456789Gi"}, 422, "memory", "too large")
    await refused({**base, "cpu": "20000"}, 422, "cpu", "at most 10000 CPUs")
    await refused(b"[" * 100_000 + b"]" * 100_000, 400, None, "nests JSON")
    await refused(b'{"name": "j", "trainers": ' + b"7" * 5000 + b"}", 400, None, "JSON this service reads")
    await refused(
        b'{"name": "' + b"x" * (1024 * 1024 + 10) + b'"}', 413, None, "at most 1048576 bytes", slow=True
    )
    listed = await (await jobs.call("GET", "jobs", params={"all": "1"})).json()
    assert listed["jobs"] == []


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e400"])
@pytest.mark.parametrize("field", ["cpu", "pscpu"])
async def test_numbers_json_cannot_compare_are_422_naming_the_field(
    jobs: Jobs, field: str, number: bytes
) -> None:
    package = jobs.package({"train.py": "print(1)\n"})
    body = b'{"name": "j", "package": "%s", "%s": %s}' % (package.encode(), field.encode(), number)
    status, answer = await post(jobs, body)
    assert status == 422, answer
    assert answer["errors"][0]["field"] == field, answer


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("gpu", True, "valid integer"),
        ("trainers", False, "valid integer"),
        ("pservers", True, "valid integer"),
        ("passes", True, "valid integer"),
        ("max_restarts", True, "valid integer"),
        ("cpu", True, "expected a quantity"),
        ("memory", False, "expected a quantity"),
        ("gpu", 10**30, "less than or equal to 1024"),
        ("passes", 10**30, "less than or equal to 1000000"),
    ],
)
async def test_booleans_and_absurd_counts_in_a_spec_are_422(
    jobs: Jobs, field: str, value: Any, words: str
) -> None:
    package = jobs.package({"train.py": "print(1)\n"})
    status, answer = await post(jobs, json.dumps({"name": "j", "package": package, field: value}).encode())
    assert status == 422, answer
    assert answer["errors"][0]["field"] == field, answer
    assert words in answer["errors"][0]["message"], answer
