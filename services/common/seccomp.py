"""The sandbox's seccomp filter: the usual container default set, compiled by libseccomp.

Sandboxed jobs and builds run with this filter (bwrap loads it just before it starts the
program). It follows the default profile of Docker and containerd: everything is
allowed except the system calls that reach kernel state shared by the whole machine
(keyrings, BPF, perf, kernel modules, clocks, swap, reboot, mounts), that make new
namespaces (a user namespace hands its creator every capability inside it), that open
files by handle, or that have a long record of kernel bugs and no use in training
(userfaultfd, io_uring). Beyond Docker's set, no file may be given a set-uid or set-gid
bit. A refused call fails with EPERM, as it would for an unprivileged process, so
programs that probe for these features carry on without them.

The BPF program is made by libseccomp (Debian's `libseccomp2`, the library Docker,
systemd and apt itself use; apt depends on it, so every Debian system has it) through
ctypes: a handful of its stable C functions. Not PyPI's `pyseccomp` (a ctypes binding
too, unmaintained since 2021) nor Debian's `python3-seccomp` (built for the system
Python, not a virtualenv's), and never hand-assembled BPF.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os

# The dangerous ones, as Docker's default profile leaves them out (on x86_64 and arm64;
# a name this machine's architecture lacks is skipped).
DENIED = (
    # kernel keyrings, BPF programs, performance counters: machine-wide kernel state
    *("add_key", "keyctl", "request_key", "bpf", "perf_event_open", "lookup_dcookie"),
    # kernel modules and replacing the kernel
    *("init_module", "finit_module", "delete_module", "create_module", "query_module", "get_kernel_syms"),
    *("kexec_load", "kexec_file_load", "reboot"),
    # clocks, swap, accounting, quotas, the kernel log, old interfaces
    *("settimeofday", "clock_settime", "clock_adjtime", "stime"),
    *("swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "nfsservctl"),
    *("sysfs", "_sysctl", "uselib", "ustat", "vm86", "vm86old", "iopl", "ioperm"),
    # mounts and namespaces (clone and unshare: only with namespace flags, below)
    *("mount", "umount", "umount2", "pivot_root", "setns", "mount_setattr"),
    *("fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree"),
    # files by handle (the Shocker escape), other processes' memory placement and files
    *("open_by_handle_at", "name_to_handle_at", "move_pages", "kcmp"),
    # a long record of kernel bugs, no use in training
    *("userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register"),
)
# clone(2) and unshare(2) flags that make a namespace.
NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
    "CLONE_NEWTIME": 0x00000080,
}
# Set-uid and set-gid bits: no sandboxed process may put one on a file (the argument
# that holds the mode, per call), so nothing a job writes into a home can later run as
# its uid for whoever starts it on the host. openat2 carries its mode in memory, where a
# filter cannot read it: ENOSYS, and the C library's open is used instead.
SET_ID_BITS = (0o4000, 0o2000)
MODE_ARGUMENT = {
    "chmod": 1,
    "fchmod": 1,
    "fchmodat": 2,
    "fchmodat2": 2,
    "open": 2,
    "openat": 3,
    "creat": 1,
    "mknod": 1,
    "mknodat": 2,
}
# personality(2) is allowed whole, unlike Docker, which allows only some values: libseccomp
# cannot say "flag set and not the query value" in one rule, the unsafe flags (no ASLR,
# executable data) weaken only the caller itself, and the kernel drops them on any exec
# that would raise privileges, which no_new_privs forbids here anyway.

_ACT_ALLOW = 0x7FFF0000
_CMP_MASKED_EQ = 7


def _act_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    """libseccomp's `struct scmp_arg_cmp`."""

    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


class SeccompUnavailable(RuntimeError):
    """libseccomp is not installed, or refused the filter."""


@functools.cache
def _library() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        missing = f"libseccomp is not installed (Debian: apt-get install libseccomp2): {exc}"
        raise SeccompUnavailable(missing) from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


@functools.cache
def filter_program() -> bytes:
    """The compiled BPF program (what bwrap's `--seccomp FD` reads). Made once per process."""
    lib = _library()
    ctx = lib.seccomp_init(_ACT_ALLOW)
    if not ctx:
        raise SeccompUnavailable("seccomp_init failed")
    try:
        eperm = _act_errno(errno.EPERM)

        def rule(action: int, name: str, *conditions: tuple[int, int, int, int]) -> None:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:  # not a system call of this architecture
                return
            array = (_ArgCmp * max(1, len(conditions)))(*(_ArgCmp(*c) for c in conditions))
            code = lib.seccomp_rule_add_array(ctx, action, number, len(conditions), array)
            if code < 0:
                raise SeccompUnavailable(f"libseccomp refused the rule for {name}: {os.strerror(-code)}")

        for name in DENIED:
            rule(eperm, name)
        for flag in NAMESPACE_FLAGS.values():
            # On x86_64 and arm64 the flags are clone's first argument, as unshare's.
            rule(eperm, "clone", (0, _CMP_MASKED_EQ, flag, flag))
            rule(eperm, "unshare", (0, _CMP_MASKED_EQ, flag, flag))
        # clone3 passes its flags in memory, where a filter cannot read them: ENOSYS makes
        # the C library fall back to clone, as under Docker.
        rule(_act_errno(errno.ENOSYS), "clone3")
        for name, argument in MODE_ARGUMENT.items():
            for bit in SET_ID_BITS:
                rule(eperm, name, (argument, _CMP_MASKED_EQ, bit, bit))
        rule(_act_errno(errno.ENOSYS), "openat2")
        fd = os.memfd_create("seccomp-bpf", os.MFD_CLOEXEC)
        try:
            code = lib.seccomp_export_bpf(ctx, fd)
            if code < 0:
                raise SeccompUnavailable(f"libseccomp could not export the filter: {os.strerror(-code)}")
            os.lseek(fd, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)
