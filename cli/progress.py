"""Transfer progress for people: tqdm bars on a terminal, per-file lines, and the closing summary."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from typing import Any, Protocol, TextIO

SIZE_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")
# A per-file bar's label is cut to this many characters so that the bar itself still fits.
LABEL_WIDTH = 32
# The size assumed for a terminal that reports none (0x0: a serial console, some CI runners
# and containers); tqdm would take a width of 0 to mean "no bar, numbers only".
FALLBACK_COLUMNS = 80
FALLBACK_LINES = 24


def terminal_shape(stream: Any, env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(columns, lines) of the terminal `stream` writes to; what it cannot tell comes from
    $COLUMNS/$LINES, else 80x24. Never 0: a bar needs a width."""
    env = os.environ if env is None else env
    columns = lines = 0
    try:
        columns, lines = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):
        pass
    return (
        columns or _positive(env.get("COLUMNS")) or FALLBACK_COLUMNS,
        lines or _positive(env.get("LINES")) or FALLBACK_LINES,
    )


def _positive(value: str | None) -> int:
    return int(value) if value and value.isdigit() and int(value) > 0 else 0


def human_size(size: int | float) -> str:
    """Bytes in binary units with one decimal: `0 B`, `512 B`, `1.5 KiB`, `1.2 GiB`."""
    if size < 1024:
        return f"{int(size)} B"
    value = float(size)
    for unit in SIZE_UNITS:
        value /= 1024
        if value < 1024 or unit == SIZE_UNITS[-1]:
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def summary_text(
    verb: str,
    *,
    files: int,
    size: int,
    seconds: float,
    identical: int = 0,
    resumed: int = 0,
    failed: int = 0,
    directories: int = 0,
) -> str:
    """The line that ends a transfer: `uploaded 12 files (1.2 GiB) in 8.1s, 3 already identical`."""
    text = f"{verb} {plural(files, 'file')} ({human_size(size)}) in {seconds:.1f}s"
    if identical:
        text += f", {identical} already identical"
    if resumed:
        text += f", {resumed} resumed"
    if directories:
        text += f", {directories} {'directory' if directories == 1 else 'directories'} created"
    if failed:
        text += f", {failed} failed"
    return text


def short_label(name: str, width: int = LABEL_WIDTH) -> str:
    """`name` cut from the left to `width` characters: the end of a path says the most."""
    return name if len(name) <= width else "…" + name[-(width - 1) :]


class FileBar(Protocol):
    """One file's progress; `update` may be called from a worker thread (hashing)."""

    def update(self, n: int) -> None: ...

    def close(self) -> None: ...


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


class Progress:
    """What a transfer shows while it runs.

    `bars` draws tqdm bars on `stderr` (an overall byte count, and one bar per file in
    flight); `lines` prints one line per file event on `stdout`. The CLI turns bars on only
    when stderr is a terminal and `-q` was not given, and lines off with `-q` or `-o json`.
    """

    def __init__(
        self,
        *,
        stdout: TextIO,
        stderr: TextIO,
        bars: bool,
        lines: bool,
        slots: int = 4,
        problems: bool = True,
        problem_prefix: str = "",
    ) -> None:
        self.stdout = stdout
        self.stderr = stderr
        self.lines = lines
        self.problems = problems
        self.problem_prefix = problem_prefix
        self._lock = threading.Lock()
        self._overall: Any = None
        self._tqdm: Any = None
        self._free_slots = list(range(1, slots + 1))
        if bars:
            # Imported here: the SDK in a training job should not pay for tqdm.
            from tqdm import tqdm

            self._tqdm = tqdm
            self._overall = self._bar(total=0, position=0, desc="total")

    @classmethod
    def quiet(cls, stdout: TextIO | None = None, stderr: TextIO | None = None) -> Progress:
        """Silent: what the SDK uses unless told otherwise; failures reach the caller as exceptions."""
        return cls(
            stdout=stdout or sys.stdout, stderr=stderr or sys.stderr, bars=False, lines=False, problems=False
        )

    def expect(self, size: int) -> None:
        """Add `size` bytes to the overall total (negative: they will not be sent after all)."""
        if self._overall is not None:
            with self._lock:
                self._overall.total = max(0, (self._overall.total or 0) + size)
                self._overall.refresh()

    def file(self, label: str, total: int, initial: int = 0, *, counts: bool = True) -> FileBar:
        """A bar for one file; `initial` bytes are already there (a resumed transfer).

        `counts=False` for work that moves no bytes (hashing): the overall bar stays put.
        """
        if self._tqdm is None:
            return _NoBar()
        with self._lock:
            position = self._free_slots.pop(0) if self._free_slots else None
        bar = self._bar(total=total, initial=initial, position=position, desc=short_label(label))
        return _TqdmFileBar(self, bar, position, counts)

    def _bar(self, **options: Any) -> Any:
        """A tqdm bar on stderr, sized to the terminal, and resized with it.

        The size comes from `terminal_shape` rather than from tqdm's own `dynamic_ncols`,
        which takes a terminal that reports 0 columns at its word and draws no bar at all.
        tqdm keeps its resize callback in `dynamic_ncols` and calls it with the stream before
        each redraw; ours goes there once the bar exists (given to the constructor, it would
        be replaced by tqdm's).
        """
        columns, lines = terminal_shape(self.stderr)
        bar = self._tqdm(
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            file=self.stderr,
            leave=False,
            ncols=columns,
            nrows=lines,
            **options,
        )
        bar.dynamic_ncols = terminal_shape
        return bar

    def note(self, line: str) -> None:
        """One line about a file (`uploaded ...`, `resuming ...`); nothing unless lines are on."""
        if not self.lines:
            return
        if self._tqdm is not None:
            # tqdm.write lifts the bars off the terminal, prints, and redraws them below.
            self._tqdm.write(line, file=self.stdout)
        else:
            self.stdout.write(line + "\n")
        self.stdout.flush()

    def problem(self, line: str) -> None:
        """One line about a file that failed, on stderr, whatever `lines` says (unless `problems` is off)."""
        if not self.problems:
            return
        text = self.problem_prefix + line
        if self._tqdm is not None:
            self._tqdm.write(text, file=self.stderr)
        else:
            self.stderr.write(text + "\n")
        self.stderr.flush()

    def close(self) -> None:
        if self._overall is not None:
            self._overall.close()
            self._overall = None

    def _advance(self, n: int) -> None:
        if self._overall is not None:
            self._overall.update(n)

    def _release(self, position: int | None) -> None:
        if position is not None:
            with self._lock:
                self._free_slots.append(position)
                self._free_slots.sort()


class _TqdmFileBar:
    def __init__(self, owner: Progress, bar: Any, position: int | None, counts: bool) -> None:
        self._owner = owner
        self._bar = bar
        self._position = position
        self._counts = counts

    def update(self, n: int) -> None:
        self._bar.update(n)
        if self._counts:
            self._owner._advance(n)

    def close(self) -> None:
        self._bar.close()
        self._owner._release(self._position)
