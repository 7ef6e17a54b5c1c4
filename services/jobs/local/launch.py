"""Worker launcher: `python -m paddlecloud.jobs.local.launch SUPERVISOR_PID [--cgroup DIR]... -- ARGV...`.

The supervisor starts every worker through this small process, which leads the
worker's process group and stays its parent. The supervisor does not start a new
interpreter for it: `fork_launcher` forks the supervisor itself and runs `run` in the
child (about 1 ms against 20 ms and 10 ms of CPU for `python -m`, on every worker start
and restart). The command line above does the same from a shell. The launcher:

- It asks the kernel for SIGHUP when the supervisor dies (PR_SET_PDEATHSIG, Linux),
  even by SIGKILL, and then SIGKILLs its whole process group: a supervisor that cannot
  stop its workers any more still takes them down. Only processes that left the group
  (`setsid`) escape.
- It is a child subreaper (PR_SET_CHILD_SUBREAPER), so what the worker spawns stays
  below it: `/bin/sh -c` (Debian's dash does not exec a lone command) and the program
  under it. On a stop (SIGTERM to the group, which every member gets) it exits only once
  all of them have, so the supervisor's grace period covers the real program, not just
  the shell in front of it, nor bwrap in front of a sandboxed one: bwrap dies of the
  SIGTERM at once, and its PID 1, left below this launcher, stays until the sandbox is
  empty (the supervisor starts bwrap without `--die-with-parent`, which would SIGKILL
  the sandbox as soon as bwrap died).
- ARGV starts in each `--cgroup` group (the worker's limits): the child joins them
  between fork and exec, so the program is charged from its first instruction and the
  launcher itself is not.
- It exits with the status of ARGV (death by signal N as death by signal N), so the
  supervisor sees the program's own exit.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import sys
from collections.abc import Mapping, Sequence
from types import FrameType

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def main(argv: list[str]) -> int:
    """Start ARGV under this process and wait for it; its exit status is ours."""
    usage = "usage: python -m paddlecloud.jobs.local.launch SUPERVISOR_PID [--cgroup DIR]... -- ARGV..."
    if len(argv) < 3 or "--" not in argv:
        print(usage, file=sys.stderr)
        return 2
    supervisor_pid = int(argv[0])
    split = argv.index("--")
    options, command = argv[1:split], argv[split + 1 :]
    if not command or len(options) % 2 or any(flag != "--cgroup" for flag in options[::2]):
        print(usage, file=sys.stderr)
        return 2
    return run(supervisor_pid, options[1::2], command, dict(os.environ))


def fork_launcher(
    groups: Sequence[str],
    command: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    log_fd: int,
    pass_fds: Sequence[int] = (),
) -> int:
    """Fork this process (the supervisor) into a worker's launcher: its own session, `cwd`,
    stdin from /dev/null, stdout and stderr into `log_fd`, no other descriptor of ours
    but `pass_fds` (kept at their numbers for `command`: the sandbox's options and filter).
    The child's pid; the child never returns."""
    supervisor_pid = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 127
    try:
        # Nothing of the supervisor's event loop may run here: its signal wake-up and
        # handlers go, and the descriptors it polls are closed below.
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        os.setsid()
        os.chdir(cwd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        start = 3
        for fd in sorted(pass_fds):
            os.closerange(start, fd)
            os.set_inheritable(fd, True)
            start = fd + 1
        os.closerange(start, os.sysconf("SC_OPEN_MAX"))
        code = run(supervisor_pid, list(groups), list(command), dict(env))
    except BaseException as exc:  # the child must reach _exit, whatever happened
        with contextlib.suppress(Exception):
            os.write(2, f"paddlecloud: the worker's launcher failed: {exc!r}\n".encode())
    finally:
        os._exit(code)


def run(supervisor_pid: int, groups: list[str], command: list[str], env: dict[str, str]) -> int:
    """Lead the worker: start `command` with `env` under this process, wait for it, and
    exit as it did (see the module's docstring)."""
    stopping = False

    def on_stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True  # the whole group got the signal; the program decides what to do

    def on_parent_death(signum: int, frame: FrameType | None) -> None:
        if os.getppid() != supervisor_pid:
            os.killpg(0, signal.SIGKILL)

    # Handlers, not SIG_IGN: the kernel resets handled signals to their default on exec,
    # so the program starts with the dispositions it expects.
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, on_parent_death)
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGHUP), 0, 0, 0)
    # The supervisor may have died before the death signal was armed.
    if os.getppid() != supervisor_pid:
        return 1
    child = os.fork()
    if child == 0:
        _exec_in(groups, command, env)  # never returns

    status: int | None = None
    while True:
        try:
            pid, wait_status = os.wait()
        except ChildProcessError:
            break  # nothing of the worker is left
        if pid == child:
            status = wait_status
        if status is not None and not stopping:
            break  # it finished on its own; the supervisor sweeps what it left in the group
    return _exit_like(status)


def _exec_in(groups: list[str], command: list[str], env: dict[str, str]) -> None:
    """In the forked child: join the worker's cgroups, restore default signal
    dispositions, and become the worker's program."""
    try:
        for group in groups:
            with open(os.path.join(group, "cgroup.procs"), "w", encoding="ascii") as f:
                f.write("0")
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        os.execvpe(command[0], command, env)  # noqa: S606 - the worker's own argv
    except OSError as exc:
        # Straight to the descriptor: a forked launcher's sys.stderr may hold the supervisor's bytes.
        os.write(2, f"paddlecloud: cannot run {command[0]}: {exc.strerror}\n".encode(errors="replace"))
    finally:
        os._exit(127)


def _exit_like(status: int | None) -> int:
    if status is None:
        return 1
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        # Die of the same signal, without writing a core of this launcher.
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
