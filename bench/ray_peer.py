"""Ray Jobs' side of bench/peers, run by the Ray venv's Python (scripts/peers.sh), never the platform's.

`python ray_peer.py <dashboard url>` reads one JSON request a line on stdin and answers each
with one JSON line on stdout; every figure is timed here, around Ray's own SDK
(`JobSubmissionClient`), as bench/peers times PaddleCloud's SDK in its own process, so neither
side pays for an interpreter's start. It imports nothing of PaddleCloud: the two venvs differ.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import threading
import time
from typing import Any

from ray.job_submission import JobStatus, JobSubmissionClient

TERMINAL = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}
TICK = re.compile(rb"^(\d+) (\d+\.\d+)$", re.MULTILINE)


def wait_ended(client: JobSubmissionClient, ids: list[str], timeout: float = 300) -> dict[str, str]:
    """Each job's final status, once every one of them has ended."""
    deadline = time.monotonic() + timeout
    ended: dict[str, str] = {}
    while len(ended) < len(ids):
        for job in ids:
            if job not in ended:
                status = client.get_job_status(job)
                if status in TERMINAL:
                    ended[job] = str(status)
        if time.monotonic() > deadline:
            raise RuntimeError(f"Ray jobs still running after {timeout} s: {sorted(set(ids) - set(ended))}")
        time.sleep(0.1)
    return ended


def first_statement(client: JobSubmissionClient, script: str) -> dict[str, Any]:
    """submit → the program's first statement (it prints `up <time.time()>` first)."""
    t0 = time.time()
    job = client.submit_job(entrypoint=f"python {script} 60")
    accepted = time.time() - t0

    async def first_line() -> float:
        async for chunk in client.tail_job_logs(job):
            for line in chunk.splitlines():
                if line.startswith("up "):
                    return float(line.split()[1])
        raise RuntimeError(f"Ray job {job} ended without its first line")

    program = asyncio.run(first_line()) - t0
    client.stop_job(job)
    wait_ended(client, [job])
    return {"accepted": accepted, "program": program}


def throughput(address: str, script: str, clients: int, jobs: int) -> dict[str, Any]:
    """`clients` threads, each with its own client, submit `jobs` jobs one after another, all at
    once: every call's seconds, seconds until the last returned and until every job ended."""
    latencies: list[float] = []
    ids: list[str] = []
    lock = threading.Lock()
    ready = threading.Barrier(clients + 1)

    def client_thread() -> None:
        client = JobSubmissionClient(address)
        ready.wait()
        for _ in range(jobs):
            t = time.perf_counter()
            job = client.submit_job(entrypoint=f"python {script} 0")
            with lock:
                latencies.append(time.perf_counter() - t)
                ids.append(job)

    threads = [threading.Thread(target=client_thread) for _ in range(clients)]
    for thread in threads:
        thread.start()
    ready.wait()  # the clients are made (each asks the server its version): not timed
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    submitted = time.perf_counter() - start
    statuses = wait_ended(JobSubmissionClient(address), ids)
    finished = time.perf_counter() - start
    succeeded = sum(1 for s in statuses.values() if s == str(JobStatus.SUCCEEDED))
    return {"latencies": latencies, "submitted": submitted, "finished": finished, "succeeded": succeeded}


def submit_directory(client: JobSubmissionClient, directory: str) -> dict[str, Any]:
    """One `submit_job` with the directory as its working_dir (Ray hashes the files and uploads
    the package only when its cluster lacks it); the job is then waited for, untimed."""
    t = time.perf_counter()
    job = client.submit_job(entrypoint="python up.py 0", runtime_env={"working_dir": directory})
    seconds = time.perf_counter() - t
    status = wait_ended(client, [job])[job]
    return {"seconds": seconds, "status": status}


def follow(client: JobSubmissionClient, script: str, rate: float, count: int) -> dict[str, Any]:
    """A job printing `count` lines at `rate` a second (0: as fast as it can), followed with
    `tail_job_logs`: each line's written → received, and lines a second from the first line
    written to the last received."""
    job = client.submit_job(entrypoint=f"python {script} {rate} {count}")

    async def tail() -> dict[str, Any]:
        latencies: list[float] = []
        first = None
        buffer = b""
        async for chunk in client.tail_job_logs(job):
            now = time.time()
            buffer += chunk.encode()
            head, _, buffer = buffer.rpartition(b"\n")
            for _seq, written in TICK.findall(head):
                stamp = float(written)
                if first is None:
                    first = stamp
                latencies.append(now - stamp)
            if len(latencies) >= count:
                break
        end = time.time()
        if first is None or len(latencies) != count:
            raise RuntimeError(f"Ray's tail of {job} gave {len(latencies)} lines, not {count}")
        return {"latencies": latencies if rate else [], "rate": count / (end - first)}

    answer = asyncio.run(tail())
    wait_ended(client, [job])
    return answer


def main() -> int:
    address = sys.argv[1]
    client = JobSubmissionClient(address)
    for raw in sys.stdin:
        request = json.loads(raw)
        op = request.pop("op")
        try:
            if op == "first_statement":
                answer = first_statement(client, **request)
            elif op == "throughput":
                answer = throughput(address, **request)
            elif op == "submit_directory":
                answer = submit_directory(client, **request)
            elif op == "follow":
                answer = follow(client, **request)
            else:
                answer = {"error": f"unknown request {op!r}"}
        except Exception as error:  # said to bench/peers, which decides what it means
            answer = {"error": f"{op}: {type(error).__name__}: {error}"}
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
