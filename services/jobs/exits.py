"""Exit statuses in words, the same on every backend (DESIGN §4), and a stopped worker's state."""

from __future__ import annotations

import signal

_SIGNAL_REASONS = {
    signal.SIGKILL: "killed, often out of memory — raise -memory",
    signal.SIGSEGV: "segmentation fault",
    signal.SIGABRT: "abort",
    signal.SIGFPE: "floating point exception",
}


# A worker's state, besides a job's: a parameter server that the platform stopped because
# every trainer exited 0. Such servers never exit by themselves (Paddle's do not), so
# neither SUCCEEDED (it did not end by itself) nor KILLED (nothing went wrong) says it.
WORKER_STOPPED = "STOPPED"


def exit_status(returncode: int) -> int:
    """A process's status as a shell reports it: death by signal N becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(status: int, out_of_memory: str | None = None) -> str:
    """`exited with 137 (killed, often out of memory — raise -memory)` and the like;
    `out_of_memory` is what the worker's cgroup knows, when it knows it was that."""
    text = f"exited with {status}"
    if out_of_memory is not None:
        return f"{text} ({out_of_memory})"
    if status > 128:
        try:
            sig = signal.Signals(status - 128)
        except ValueError:
            return text
        return f"{text} ({_SIGNAL_REASONS.get(sig, f'terminated by {sig.name}')})"
    return text
