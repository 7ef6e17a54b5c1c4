"""The pusher of a Kaniko build: pushes the executor's image tarball with crane.

`python -m paddlecloud.builder.push --tar /image/image.tar --destination <ref>` runs in the
build pod's main container, after the executor (an init container that ran the user's
pip and `setup.py` code) wrote the tarball and exited. It is the only container that mounts
the push credentials (`DOCKER_CONFIG`), and it runs no user code, but the tarball sits in
a volume that user code could write: the executor could have left a symbolic link there
(to the credentials file, were it mounted where a link could reach it), a directory such
as an OCI layout whose blobs are links, or a FIFO that blocks. So the file is opened
beneath its directory's descriptor with O_NOFOLLOW (a link is refused, not followed),
must be a regular file (fstat), and crane reads exactly that opened file through
`/proc/self/fd/N`, never the path again. The pushed digest is printed last.

Exit status 0 when pushed; 1 with one line saying why otherwise (a refused file, crane's
failure); 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from typing import TextIO

_DIGEST = re.compile(r"@(sha256:[0-9a-f]{64})\s*$")


class Refused(Exception):
    """The tarball cannot be pushed; the message says why."""


def open_tarball(path: str) -> int:
    """A read-only descriptor of the regular file at `path`, opened beneath its directory
    without following a link in its last component; Refused saying why otherwise."""
    directory, name = os.path.split(path)
    if not name:
        raise Refused(f"{path}: not a file name")
    try:
        dir_fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise Refused(f"{directory}: {exc.strerror}") from None
    try:
        # O_NONBLOCK: a FIFO left there must not hang the pusher (cleared below).
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise Refused(f"{path} is a symbolic link; only the image tarball itself is pushed") from None
            raise Refused(f"{path}: {exc.strerror}") from None
    finally:
        os.close(dir_fd)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise Refused(f"{path} is {kind}; only an image tarball (a regular file) is pushed")
    os.set_blocking(fd, True)
    return fd


def push(path: str, destination: str, *, crane: str = "crane", insecure: bool = False, out: TextIO) -> str:
    """Push the tarball at `path` as `destination` with crane; the pushed digest."""
    fd = open_tarball(path)
    try:
        argv = [crane, *(["--insecure"] if insecure else []), "push", f"/proc/self/fd/{fd}", destination]
        # crane inherits the descriptor under the same number (pass_fds), and DOCKER_CONFIG.
        done = subprocess.run(argv, pass_fds=(fd,), capture_output=True, text=True, check=False)
    finally:
        os.close(fd)
    if done.stderr:
        out.write(done.stderr if done.stderr.endswith("\n") else done.stderr + "\n")
    if done.returncode != 0:
        last = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), "")
        raise Refused(f"crane push failed (exit {done.returncode}): {last.strip()}")
    found = _DIGEST.search(done.stdout.strip())
    if found is None:
        raise Refused(f"crane push printed no digest: {done.stdout.strip()[:200]!r}")
    return found.group(1)


def main(argv: Sequence[str] | None = None, *, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    parser = argparse.ArgumentParser(prog="python -m paddlecloud.builder.push", description=__doc__)
    parser.add_argument("--tar", required=True, help="the image tarball the executor wrote")
    parser.add_argument("--destination", required=True, help="the image reference to push it as")
    parser.add_argument("--insecure", action="store_true", help="the registry speaks plain http")
    parser.add_argument("--crane", default="crane", help="the crane binary (default: on PATH)")
    args = parser.parse_args(argv)
    crane = shutil.which(args.crane)
    if crane is None:
        err.write(f"push: no crane binary at {args.crane!r}\n")
        return 1
    try:
        digest = push(args.tar, args.destination, crane=crane, insecure=args.insecure, out=err)
    except Refused as exc:
        err.write(f"push: refused: {exc}\n")
        return 1
    out.write(f"pushed {args.destination}@{digest}\n{digest}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
