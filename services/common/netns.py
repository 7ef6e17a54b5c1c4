"""Network namespaces for sandboxed jobs and builds: a private loopback, and outbound traffic through pasta.

A job's supervisor (root, before it starts any worker) and the builder's pip runs (through
`python -m paddlecloud.common.netns`) each move into a network namespace of their own,
which every process they start inherits: a job's workers share one loopback and see no
other job's ports, no port on the host's loopback and no host abstract unix socket
(abstract socket names belong to the network namespace; path-named sockets are files,
reached only where the sandbox binds them).

Outbound traffic, where allowed, goes through `pasta` (Debian's `passt` package), a
user-mode network stack: the namespace gets one interface (`OUTBOUND_ADDRESS` behind the
gateway `OUTBOUND_GATEWAY`), and pasta turns what it sends into ordinary sockets of its
own on the host. With `--no-map-gw` the gateway is not the host's loopback, and with
`-T none` / `-U none` no host port is forwarded into the namespace, so the host's
loopback stays unreachable; `forward_tcp` names the only exceptions (a package index on
the host's loopback, for builds). `-t none` / `-u none`: nothing is forwarded the other
way either, so a job's ports are not published on the host.

Why pasta and not slirp4netns: both are user-mode stacks in Debian 12, but only pasta can
forward one chosen host loopback port into the namespace (`-T`), which builds need for a
package index on the host's loopback while the rest of it stays unreachable; slirp4netns
maps all of the host's loopback or none of it (`--disable-host-loopback`).
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
# The namespace's side of pasta: slirp's customary addresses, so that what a job sees
# does not depend on the host's network, and the host's own addresses stay reachable as
# other hosts on the network reach them (through pasta, never through a loopback).
OUTBOUND_ADDRESS = "10.0.2.100"
OUTBOUND_GATEWAY = "10.0.2.2"
OUTBOUND_PREFIX = 24
CONFIGURE_TIMEOUT_SECONDS = 10.0


class NetworkUnavailable(RuntimeError):
    """A namespace, or its outbound network, could not be made."""


def pasta_path() -> str | None:
    """Where pasta is installed, or None (Debian: apt-get install passt)."""
    return shutil.which("pasta")


def no_outbound_reason() -> str | None:
    """Why this machine cannot give a namespace outbound traffic through pasta, or None
    when it can: pasta must be installed, and it needs a host interface with an IPv4
    default route to send from (it refuses to start without one)."""
    if pasta_path() is None:
        return "pasta is missing (Debian: apt-get install passt)"
    if not _has_default_route():
        return "this machine has no IPv4 default route for pasta to send through"
    return None


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc().setns(fd, CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"setns: {os.strerror(code)}")


def _loopback_up() -> None:
    """Bring `lo` up in the current namespace (a new one has it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def isolate() -> int:
    """Move this process (root, single-threaded) into a new network namespace with its
    loopback up. Returns a descriptor of the namespace it left (the host's), for
    `outbound`. NetworkUnavailable if it fails."""
    host = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    if _libc().unshare(CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        os.close(host)
        raise NetworkUnavailable(f"cannot make a network namespace: {os.strerror(code)}")
    try:
        _loopback_up()
    except OSError as exc:
        os.close(host)
        raise NetworkUnavailable(f"cannot bring the loopback up: {exc}") from None
    return host


def outbound(host: int, forward_tcp: Sequence[int] = ()) -> subprocess.Popen[bytes]:
    """Start pasta for this process's namespace, from the `host` namespace (isolate's
    descriptor), and wait until the namespace has its route out. Returns pasta's process:
    the caller stops it when done, and it is killed should this process die.
    NetworkUnavailable if it cannot start or configure the namespace."""
    pasta = pasta_path()
    if pasta is None:
        raise NetworkUnavailable("outbound network needs pasta (Debian: apt-get install passt)")
    ours = os.open("/proc/self/ns/net", os.O_RDONLY)  # inherited by pasta, which joins it
    forwards = ",".join(str(p) for p in forward_tcp) or "none"

    def in_host_namespace() -> None:
        # pasta's own sockets must be the host's; it dies with us (foreground, PDEATHSIG).
        _setns(host)
        _libc().prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)

    # --runas 0: Debian 12's pasta, dropped to `nobody`, cannot join a namespace that root
    # made; as uid 0 it still drops to CAP_SYS_ADMIN and CAP_NET_BIND_SERVICE, sets
    # no_new_privs and a seccomp filter, and leaves itself an empty mount namespace.
    argv = [
        pasta,
        *("--runas", "0", "--foreground", "--quiet", "--config-net", "--no-map-gw", "--ipv4-only"),
        *("--address", OUTBOUND_ADDRESS, "--netmask", str(OUTBOUND_PREFIX), "--gateway", OUTBOUND_GATEWAY),
        *("-t", "none", "-u", "none", "-T", forwards, "-U", "none"),
        *("--no-netns-quit", "--netns", f"/proc/self/fd/{ours}"),
    ]
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(ours,),
            preexec_fn=in_host_namespace,
        )
    except OSError as exc:
        raise NetworkUnavailable(f"cannot start pasta: {exc}") from None
    finally:
        os.close(ours)
    deadline = time.monotonic() + CONFIGURE_TIMEOUT_SECONDS
    # pasta configures the interface, then its route: the route is the sign it is done.
    while not _has_default_route():
        if proc.poll() is not None:
            raise NetworkUnavailable(
                f"pasta exited with status {proc.returncode} before it configured the network"
            )
        if time.monotonic() > deadline:
            stop(proc)
            raise NetworkUnavailable(
                f"pasta did not configure the network within {CONFIGURE_TIMEOUT_SECONDS:g} s"
            )
        time.sleep(0.005)
    return proc


def _has_default_route() -> bool:
    try:
        lines = Path("/proc/self/net/route").read_text().splitlines()[1:]
    except OSError:
        return False
    return any(line.split()[1:2] == ["00000000"] for line in lines)


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    """Stop pasta (it holds nothing that needs a graceful end)."""
    if proc is None or proc.poll() is not None:
        return
    proc.kill()
    proc.wait()


def main(argv: list[str] | None = None) -> int:
    """`python -m paddlecloud.common.netns [--outbound] [--forward-tcp PORT]... [--keep-fd FD]...
    -- COMMAND...`: run COMMAND in a network namespace of its own; its exit status (128+N
    for signal N). COMMAND inherits each FD at its number (bwrap's options, its filter)."""
    parser = argparse.ArgumentParser(prog="python -m paddlecloud.common.netns")
    parser.add_argument("--outbound", action="store_true", help="outbound network through pasta")
    parser.add_argument("--forward-tcp", type=int, action="append", default=[], metavar="PORT")
    parser.add_argument(
        "--keep-fd", type=int, action="append", default=[], metavar="FD", help="a descriptor COMMAND inherits"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give a COMMAND after --")
    pasta = None
    try:
        host = isolate()
        try:
            if args.outbound:
                pasta = outbound(host, args.forward_tcp)
        finally:
            os.close(host)
    except (NetworkUnavailable, OSError) as exc:
        print(f"paddlecloud netns: {exc}", file=sys.stderr)
        return 125
    try:
        child = subprocess.Popen(command, pass_fds=args.keep_fd)
    except OSError as exc:
        stop(pasta)
        print(f"paddlecloud netns: cannot run {command[0]}: {exc}", file=sys.stderr)
        return 127 if exc.errno == errno.ENOENT else 126
    try:
        while True:
            try:
                code = child.wait()
                break
            except KeyboardInterrupt:
                continue
    finally:
        stop(pasta)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
