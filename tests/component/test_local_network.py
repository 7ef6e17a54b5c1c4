"""Local jobs' networks: each job its own loopback, outbound only through pasta, never the host's loopback.

Real jobs through the real local backend and bubblewrap, as root. The host side stands
for what a job must not reach: the platform's gateway and a listener on the host's
127.0.0.1 (a service's internal port), a host abstract unix socket, and bob's job
listening on its loopback.
Each listener's accept queue says afterwards whether anything reached it, whatever the
job itself saw.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_jobs_api import Jobs, start_jobs

from paddlecloud.common.netns import OUTBOUND_GATEWAY

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or shutil.which("pasta") is None,
    reason="network namespaces per job need root, bubblewrap and pasta (make system-deps)",
)

# Bob's job: listens on its loopback, says where, and at the end whether anyone came.
LISTENS = """\
import os, socket, time
home = os.environ["PADDLE_CLOUD_PFS_HOME"]
server = socket.create_server(("127.0.0.1", 0))
server.setblocking(False)
with open(os.path.join(home, "port.tmp"), "w") as f:
    f.write(str(server.getsockname()[1]))
os.rename(os.path.join(home, "port.tmp"), os.path.join(home, "port"))
while not os.path.exists(os.path.join(home, "release")):
    time.sleep(0.05)
try:
    server.accept()
    print("BOB accepted a connection", flush=True)
except BlockingIOError:
    print("BOB accepted nothing", flush=True)
"""

# Alice's job: a parameter server that greets, and a trainer that tries everything.
PROBES = """\
import json, os, socket

if os.environ["TRAINING_ROLE"] == "PSERVER":
    server = socket.create_server(("127.0.0.1", int(os.environ["PADDLE_PORT"])))
    while True:
        conn, _ = server.accept()
        conn.sendall(b"pserver here")
        conn.close()

outcome = {}


def attempt(name, action):
    try:
        outcome[name] = "succeeded: " + repr(action())[:80]
    except Exception as exc:
        outcome[name] = "refused: " + type(exc).__name__ + " " + str(exc)[:60]


def connect(host, port):
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        return conn.recv(64)


def touch(host, port):
    socket.create_connection((host, int(port)), timeout=5).close()


def connect_abstract(name):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect("\\0" + name)


def listed(path, needle):
    with open(path) as f:
        return needle in f.read() or 1 / 0


env = os.environ
pserver = env["PADDLE_PSERVERS_IP_PORT_LIST"].split(",")[0].rsplit(":", 1)
attempt("reach_own_pserver", lambda: connect(*pserver))
attempt("reach_bob_job", lambda: touch("127.0.0.1", env["BOB_PORT"]))
attempt("reach_host_service", lambda: touch("127.0.0.1", env["HOST_PORT"]))
attempt("reach_gateway", lambda: touch("127.0.0.1", env["GATEWAY_PORT"]))
attempt("reach_host_through_gateway", lambda: touch(env["GATEWAY"], env["HOST_PORT"]))
attempt("reach_host_abstract_socket", lambda: connect_abstract(env["ABSTRACT"]))
attempt("see_host_port", lambda: listed("/proc/net/tcp", ":%04X " % int(env["HOST_PORT"])))
attempt("see_host_abstract_socket", lambda: listed("/proc/net/unix", "@" + env["ABSTRACT"]))
if env.get("OUTSIDE"):
    attempt("reach_outside", lambda: touch(*env["OUTSIDE"].rsplit(":", 1)))
print("RESULTS " + json.dumps(outcome), flush=True)
"""

SHOULD_FAIL = [
    "reach_bob_job",
    "reach_host_service",
    "reach_gateway",
    "reach_host_abstract_socket",
    "see_host_port",
    "see_host_abstract_socket",
]


class Listener:
    """A socket that listens and never accepts: its queue tells whether anyone connected."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.listen(16)
        sock.setblocking(False)

    def reached(self) -> bool:
        try:
            conn, _ = self.sock.accept()
        except BlockingIOError:
            return False
        conn.close()
        return True


@pytest.fixture
def host_side() -> Iterator[dict[str, Any]]:
    """A listener on the host's loopback, a host abstract socket, and (where this host has
    an address other than loopback) a listener there, which stands for the outside."""
    loopback = Listener(socket.create_server(("127.0.0.1", 0)))
    abstract_name = f"paddlecloud-test-{secrets.token_hex(6)}"
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind("\0" + abstract_name)
    abstract_listener = Listener(abstract)
    outside = None
    address = outside_address()
    if address is not None:
        outside = Listener(socket.create_server((address, 0)))
    yield {
        "loopback": loopback,
        "abstract": abstract_listener,
        "abstract_name": abstract_name,
        "outside": outside,
    }
    for listener in (loopback, abstract_listener, outside):
        if listener is not None:
            listener.sock.close()


def outside_address() -> str | None:
    """This host's address on its default route (no packet is sent), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.1", 9))  # TEST-NET-3: only the route is looked up
        except OSError:
            return None
        address: str = probe.getsockname()[0]
    return None if address.startswith("127.") else address


async def run_probes(jobs: Jobs, host_side: dict[str, Any], bob_port: int | None = None) -> dict[str, str]:
    outside = host_side["outside"]
    env = {
        "BOB_PORT": str(bob_port or 9),
        "HOST_PORT": str(host_side["loopback"].sock.getsockname()[1]),
        "GATEWAY_PORT": str(jobs.client.port),  # the platform's gateway, on the host's loopback
        "GATEWAY": OUTBOUND_GATEWAY,
        "ABSTRACT": host_side["abstract_name"],
        "OUTSIDE": "" if outside is None else "{}:{}".format(*outside.sock.getsockname()),
    }
    package = jobs.package({"train.py": PROBES}, name="probes")
    await jobs.submit({"name": "probes", "package": package, "pservers": 1, "trainers": 1, "env": env})
    job = await jobs.wait("probes", ("SUCCEEDED", "FAILED"))
    logs = await jobs.logs("probes")
    assert job["state"] == "SUCCEEDED", (job["reason"], logs)
    line = next(x for x in logs.splitlines() if "RESULTS " in x)
    results: dict[str, str] = json.loads(line.split("RESULTS ", 1)[1])
    return results


async def bob_listening(jobs: Jobs) -> int:
    """Start bob's listening job; the port it listens on (in its own namespace)."""
    package = jobs.package({"train.py": LISTENS}, name="listens", user="bob")
    await jobs.submit({"name": "listens", "package": package}, who="bob")
    port_file = jobs.home("bob") / "port"
    deadline = time.monotonic() + 60
    while not port_file.exists():
        job = await jobs.job("listens", "bob")
        assert job["state"] in ("PENDING", "RUNNING") and time.monotonic() < deadline, job
        await asyncio.sleep(0.05)
    return int(port_file.read_text())


async def bob_was_reached(jobs: Jobs) -> str:
    (jobs.home("bob") / "release").write_text("")
    deadline = time.monotonic() + 60
    while True:
        job = await jobs.job("listens", "bob")
        if job["state"] in ("SUCCEEDED", "FAILED"):
            break
        assert time.monotonic() < deadline, job
        await asyncio.sleep(0.05)
    resp = await jobs.call("GET", "jobs/listens/logs", "bob")
    return next(x for x in (await resp.text()).splitlines() if "BOB " in x)


async def test_a_job_reaches_its_own_workers_and_the_outside_but_no_other_job_or_host_loopback(
    tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any, host_side: dict[str, Any]
) -> None:
    jobs = await start_jobs(tmp_path, aiohttp_server, aiohttp_client)
    bob_port = await bob_listening(jobs)
    results = await run_probes(jobs, host_side, bob_port)
    reached = {name: results[name] for name in SHOULD_FAIL if not results[name].startswith("refused")}
    assert reached == {}, results
    assert "BOB accepted nothing" in await bob_was_reached(jobs), results
    assert not host_side["loopback"].reached(), results
    assert not host_side["abstract"].reached(), results
    # The parameter server answered its own trainer, on the loopback they share.
    assert results["reach_own_pserver"] == "succeeded: b'pserver here'", results
    # Outbound goes through pasta, whose gateway is not the host's loopback (--no-map-gw):
    # whatever answers at that address elsewhere, it is not the listener here.
    assert not host_side["loopback"].reached(), results
    if host_side["outside"] is not None:
        assert results["reach_outside"].startswith("succeeded"), results
        assert host_side["outside"].reached(), results


async def test_with_network_none_a_job_has_only_its_own_loopback(
    tmp_path: Path, aiohttp_server: Any, aiohttp_client: Any, host_side: dict[str, Any]
) -> None:
    jobs = await start_jobs(tmp_path, aiohttp_server, aiohttp_client, network="none")
    results = await run_probes(jobs, host_side)
    assert results["reach_own_pserver"] == "succeeded: b'pserver here'", results
    assert "Network is unreachable" in results["reach_host_through_gateway"], results
    if host_side["outside"] is not None:
        assert "Network is unreachable" in results["reach_outside"], results
        assert not host_side["outside"].reached(), results
    reached = {name: results[name] for name in SHOULD_FAIL if not results[name].startswith("refused")}
    assert reached == {}, results
    assert not host_side["loopback"].reached(), results
