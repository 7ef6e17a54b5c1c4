"""Sandboxes for user code on one machine: bubblewrap namespaces, an unprivileged uid, a chosen view.

Jobs' workers and the builder's pip runs execute code that a platform user wrote or
named. Each such process runs under Debian's `bwrap` (bubblewrap) with its own mount,
PID, IPC and UTS namespaces, and under `setpriv` as an unprivileged uid with no
capabilities, no supplementary groups and `no_new_privs` (so no set-uid program in the
system can raise it again). What it sees is only what a `View` lists:

- the system read-only (`/usr`, `/etc`, and `/bin`, `/lib`... as on the host);
- the Python environment it runs with, read-only, at its own path; the directories
  above such a path are made traversable (0711) but not listable, so a Python that lives
  under `/root` is reachable while `/root` itself shows nothing;
- the directories the caller binds (a PFS home read-write, public read-only, ...);
- a fresh `/proc` of its own PID namespace (no host process is visible), a minimal
  `/dev`, a private `/dev/shm`.

The network namespace is not made here, but for a view with `no_network` (a job's viewer:
bwrap makes one with only a loopback): as root, a job's supervisor moves itself into a
namespace of its own before its first worker, so that the workers share it, and a build's
pip runs in one of its own (services/common/netns.py); bwrap keeps the one it is started
in. Unsandboxed, and where the service is not root, processes share the host's network.

Inside, a seccomp filter (services/common/seccomp.py, Docker's default set) refuses the
system calls that reach machine-wide kernel state or make namespaces (no nested user
namespace, which would hand the process every capability inside it), and any set-uid or
set-gid mode, so nothing a sandboxed process writes carries one. bwrap's own
`--disable-userns` cannot be used here: it needs bwrap to make a user namespace, and a
process in one cannot switch to a host uid with setpriv. bwrap reads its options from a
memory file (`--args`), so the sandbox's PID 1 (bwrap's reaper) shows `bwrap --args N` in
`/proc/1/cmdline` rather than the host paths it binds.

The UTS namespace's host name is `paddlecloud`, and it resolves (to loopback), as a host's
own name does: `/etc/hosts` is the host's plus that name (`hosts_file`). Paddle's
collective mode looks the host name up and crashes where it does not resolve.

Why bwrap as root plus setpriv, rather than bwrap in a user namespace: as root, bwrap
needs no unprivileged user namespaces (which some distributions restrict), and the
process really runs as the unprivileged uid on the host, so files it writes are owned by
that uid and the kernel's ordinary permission checks apply to it. A service that is not
root cannot switch uids: there bwrap makes a user namespace itself, and the sandbox
still hides everything it does not bind, but its processes keep the service's uid.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import structlog

from .seccomp import SeccompUnavailable, filter_program

log = structlog.get_logger(__name__)

SandboxMode = Literal["auto", "required", "off"]
# The host's top-level system directories a sandbox sees read-only (a symlink stays one).
# The platform's packages, found wherever they are installed (an editable install keeps
# them in the source tree, which must not be bound whole: a demo's data may live there).
PLATFORM_PACKAGES = ("paddlecloud", "paddlecloud.common", "paddlecloud.jobs", "paddlecloud.pfs")
SYSTEM_DIRS = ("usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# The host name inside every sandbox: the same for all, so it tells nothing of the host.
HOSTNAME = "paddlecloud"


class SandboxUnavailable(RuntimeError):
    """The configuration requires a sandbox that this machine cannot make."""


@dataclass(frozen=True)
class Bind:
    """`source` on the host appears at `target` inside; read-only unless `writable`."""

    source: str
    target: str
    writable: bool = False
    device: bool = False  # a device node (GPUs): bound with device access

    def to_dict(self) -> dict[str, object]:
        return {
            "source": self.source,
            "target": self.target,
            "writable": self.writable,
            "device": self.device,
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Bind:
        return cls(
            str(data["source"]),
            str(data["target"]),
            bool(data.get("writable", False)),
            bool(data.get("device", False)),
        )


@dataclass(frozen=True)
class View:
    """What one sandboxed process sees and who it runs as."""

    uid: int
    gid: int
    binds: tuple[Bind, ...] = ()
    cwd: str = "/"
    tmp: str | None = None  # a host directory for /tmp; None: a fresh tmpfs
    # The size in bytes of the fresh /tmp and /dev/shm (None: the kernel's default, half the
    # RAM). Their pages are memory, charged to the cgroup of the process that writes them.
    tmp_size: int | None = None
    # A network namespace of bwrap's own making, with only a loopback: for a process that
    # needs no network at all (a job's viewer). Jobs and builds make theirs with netns.py.
    no_network: bool = False


@dataclass(frozen=True)
class Command:
    """A command line and the descriptors it reads (bwrap's options, the seccomp filter):
    the child must inherit them at these numbers, and the caller closes its own copies
    with `close()` once the child started."""

    argv: list[str]
    fds: tuple[int, ...] = field(default=())

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


def _memory_file(name: str, data: bytes) -> int:
    """A close-on-exec descriptor of a fresh memory file holding `data`, read from its start.

    A fresh one per command: a child reads it to its end, moving the offset it shares with
    every other holder of this descriptor."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


@dataclass(frozen=True)
class Sandbox:
    """How this machine sandboxes: `bwrap` (and `setpriv` to drop root), or nothing."""

    bwrap: str | None
    setpriv: str | None
    root: bool  # the service runs as root, so processes can run as other uids

    @property
    def enabled(self) -> bool:
        return self.bwrap is not None

    @property
    def switches_uid(self) -> bool:
        return self.enabled and self.root and self.setpriv is not None

    def describe(self) -> str:
        if not self.enabled:
            return "off: user code runs as the service's own user and sees the whole machine"
        if self.switches_uid:
            return "bwrap namespaces, an unprivileged uid per user"
        return "bwrap namespaces with the service's own uid (not root: uids cannot be switched)"

    def wrap(self, view: View, argv: Sequence[str], *, die_with_parent: bool = True) -> Command:
        """The command that runs `argv` inside `view`, under the seccomp filter;
        `die_with_parent` as for `bwrap_args`."""
        if self.bwrap is None:
            return Command(list(argv))
        # The generated /etc/hosts goes over the host's (bound read-only with /etc).
        view = replace(view, binds=(*view.binds, Bind(hosts_file(), "/etc/hosts")))
        options = bwrap_args(view, system_binds(), python_paths(), die_with_parent=die_with_parent)
        assert options[-1] == "--"
        command = ["--"]
        if self.switches_uid:
            assert self.setpriv is not None
            command += [
                self.setpriv,
                *(f"--reuid={view.uid}", f"--regid={view.gid}", "--clear-groups"),
                *("--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"),
            ]
        seccomp = _memory_file("paddlecloud-seccomp", filter_program())
        try:
            options = [*options[:-1], "--seccomp", str(seccomp)]
            data = b"".join(os.fsencode(option) + b"\0" for option in options)
            arguments = _memory_file("paddlecloud-bwrap-args", data)
        except BaseException:
            os.close(seccomp)
            raise
        return Command([self.bwrap, "--args", str(arguments), *command, *argv], (arguments, seccomp))


def detect(mode: SandboxMode, what: str) -> Sandbox:
    """The sandbox this machine can make for `what` (jobs, builds); SandboxUnavailable
    when `mode` is `required` and it cannot."""
    root = os.geteuid() == 0
    if mode == "off":
        return Sandbox(None, None, root)
    bwrap, setpriv = shutil.which("bwrap"), shutil.which("setpriv")
    missing = []
    if bwrap is None:
        missing.append("bwrap (Debian: apt-get install bubblewrap)")
    if root and setpriv is None:
        missing.append("setpriv (util-linux)")
    try:
        filter_program()  # made once here, so forks inherit it
    except SeccompUnavailable as exc:
        missing.append(f"a seccomp filter ({exc})")
    if missing:
        if mode == "required":
            raise SandboxUnavailable(f"{what} need a sandbox and this machine lacks {', '.join(missing)}")
        return Sandbox(None, None, root)
    return Sandbox(bwrap, setpriv, root)


@functools.cache
def system_binds() -> tuple[tuple[str, str | None], ...]:
    """(name, symlink target or None) for each top-level system directory on this host.

    Worked out once per process (the supervisor zygote, before it forks)."""
    found: list[tuple[str, str | None]] = []
    for name in SYSTEM_DIRS:
        path = Path("/") / name
        if path.is_symlink():
            found.append((name, os.readlink(path)))
        elif path.is_dir():
            found.append((name, None))
    return tuple(found)


@functools.cache
def python_paths() -> tuple[str, ...]:
    """Host directories that the platform's Python needs: the interpreter's installation,
    the virtualenv, and the source directories of an editable install of paddlecloud.
    Paths below the system directories are already visible and left out. Worked out once
    per process (0.3 ms here), so the supervisor zygote's forks inherit it."""
    paths = {os.path.realpath(sys.base_prefix), sys.prefix}
    for package in PLATFORM_PACKAGES:
        spec = importlib.util.find_spec(package)
        for location in (spec.submodule_search_locations or []) if spec else []:
            paths.add(os.path.realpath(location))
    # One bind for a directory and everything below it.
    kept = sorted(p for p in paths if not _under_system(p))
    return tuple(p for p in kept if not any(p.startswith(other + "/") for other in kept))


@functools.cache
def hosts_text() -> bytes:
    """The sandbox's /etc/hosts: the host's own lines, then HOSTNAME on loopback (IPv4 and
    IPv6). Read once per process (the supervisor zygote, before it forks)."""
    try:
        with open("/etc/hosts", "rb") as f:
            text = f.read()
    except OSError:  # no hosts file: localhost is added too
        text = b"127.0.0.1\tlocalhost\n::1\tlocalhost\n"
    if text and not text.endswith(b"\n"):
        text += b"\n"
    return text + f"127.0.0.1\t{HOSTNAME}\n::1\t{HOSTNAME}\n".encode()


def hosts_file() -> str:
    """A file holding `hosts_text()`, for bwrap to bind over /etc/hosts.

    Named by its content, in a directory of this uid's own (0700) in the system's temporary
    directory, so every process of the service shares one file and none leaves another
    behind; written to a temporary name and renamed, so a reader never sees half of it.
    The directory is checked through its descriptor to be this uid's, not a link and not
    writable by others (in sticky /tmp no one else can then replace it); if another user
    made it first, a fresh private one is used instead. Made again if removed (a /tmp
    cleaner), at the cost of a stat per sandboxed start.
    """
    text = hosts_text()
    name = f"hosts-{hashlib.sha256(text).hexdigest()[:16]}"
    for directory in _hosts_dirs():
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o022:
                log.warning("sandbox_hosts_dir_not_ours", directory=directory)
                continue
            try:
                found = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                pass
            else:
                if stat.S_ISREG(found.st_mode) and found.st_size == len(text):
                    return os.path.join(directory, name)
            partial = f".{name}.{os.getpid()}"
            out = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=fd)
            with os.fdopen(out, "wb") as f:
                f.write(text)
            os.rename(partial, name, src_dir_fd=fd, dst_dir_fd=fd)
            return os.path.join(directory, name)
        finally:
            os.close(fd)
    raise SandboxUnavailable("cannot write the sandbox's /etc/hosts in a private temporary directory")


def _hosts_dirs() -> Iterator[str]:
    """Where `hosts_file` may write: this uid's named directory (made if missing), then a
    fresh private one, made once per process and only if the first would not do."""
    shared = os.path.join(tempfile.gettempdir(), f"paddlecloud-sandbox-{os.geteuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(shared, 0o700)
    yield shared
    yield _private_dir()


@functools.cache
def _private_dir() -> str:
    return tempfile.mkdtemp(prefix="paddlecloud-sandbox-")


def _under_system(path: str) -> bool:
    parts = Path(path).parts
    return len(parts) > 1 and parts[1] in SYSTEM_DIRS


def bwrap_args(
    view: View,
    system: Iterable[tuple[str, str | None]],
    python: Iterable[str],
    *,
    die_with_parent: bool = True,
) -> list[str]:
    """bwrap's arguments for `view`, up to and including its `--` (pure: tests read it).

    `die_with_parent` (`--die-with-parent`): the whole sandbox is SIGKILLed as soon as
    bwrap's parent dies, and as soon as bwrap's own first process does, whatever the
    reason. A caller that ends the sandbox by ending bwrap (the builder: pip must not
    outlive a killed service) needs it. A caller that stops the sandbox with SIGTERM to
    its process group, waits a grace and then SIGKILLs the group (a job's worker
    launcher) must not have it: bwrap's first process handles no SIGTERM and dies of it
    at once, which would SIGKILL the program in the sandbox in the middle of its own
    handler (its last lines lost, no grace at all). Without it, bwrap's PID 1 (in the
    group, and ignoring SIGTERM as a PID namespace's init does) stays until every
    process in the sandbox has ended, and the group's SIGKILL ends them all.

    bwrap creates a mount point's missing parents itself, but owner-only (0700), which an
    unprivileged uid cannot pass through; so every parent is made first: 0711 above the
    Python paths (which may be under `/root`: traversable, not listable) and 0755 above
    the view's own binds (`/pfs/<dc>/home` and the like). Binds go from the outside in.
    """
    args = [
        *(["--die-with-parent"] if die_with_parent else []),
        *("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"),
        *(["--unshare-net"] if view.no_network else []),
        *("--hostname", HOSTNAME),
    ]
    for name, link in system:
        if link is not None:
            args += ["--symlink", link, f"/{name}"]
        else:
            args += ["--ro-bind", f"/{name}", f"/{name}"]
    # bwrap's --size (0.8.0, Debian 12, has it) bounds the next tmpfs.
    size = ["--size", str(view.tmp_size)] if view.tmp_size is not None else []
    args += ["--proc", "/proc", "--dev", "/dev", *size, "--perms", "1777", "--tmpfs", "/dev/shm"]  # noqa: S108 - private
    if view.tmp is None:
        args += [*size, "--perms", "1777", "--tmpfs", "/tmp"]  # noqa: S108 - the sandbox's own, private
    # Parents inside /tmp are made too: a bind there (a test's environment under /tmp)
    # would otherwise get bwrap's owner-only directories in the private /tmp.
    mounted = {"/proc", "/dev", *(f"/{name}" for name, _ in system)}
    made: set[str] = {"/"}

    def parents(target: str, mode: str) -> list[str]:
        out: list[str] = []
        for parent in reversed(Path(target).parents):
            text = str(parent)
            inside_mount = any(text == m or text.startswith(m + "/") for m in mounted)
            if text not in made and not inside_mount:
                out += ["--perms", mode, "--dir", text]
                made.add(text)
        return out

    mounts = [(p, p, "--ro-bind", "0711") for p in python]
    for b in view.binds:
        mounts.append(
            (
                b.source,
                b.target,
                "--dev-bind" if b.device else "--bind" if b.writable else "--ro-bind",
                "0755",
            )
        )
    if view.tmp is not None:
        mounts.append((view.tmp, "/tmp", "--bind", "0755"))  # noqa: S108 - the sandbox's own, private
    for source, target, option, mode in sorted(mounts, key=lambda m: len(Path(m[1]).parts)):
        args += parents(target, mode)
        args += [option, source, target]
        made.add(target)
        if option == "--ro-bind":  # nothing can be made inside it: what is below exists
            mounted.add(target)
    args += ["--chdir", view.cwd, "--"]
    return args
