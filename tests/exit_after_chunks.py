"""The `paddlecloud` command, stopping for good in the middle of a transfer, as if it were killed.

`python tests/exit_after_chunks.py N ARGS...` runs `paddlecloud ARGS...` and, once N upload
chunks were acknowledged (or N chunks' worth of download bytes written), exits at once with
`EXIT_STATUS` and no cleanup. The e2e tests interrupt transfers with it at a known point.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from paddlecloud.main import main

EXIT_STATUS = 75


def exit_after(limit: int) -> Callable[[int], None]:
    """A transfer's `on_chunk` hook that ends the process once `limit` chunks have moved."""

    def hook(chunks: int) -> None:
        if chunks >= limit:
            sys.stdout.flush()
            sys.stderr.write(f"exit_after_chunks: exiting after {chunks} chunks\n")
            sys.stderr.flush()
            os._exit(EXIT_STATUS)

    return hook


if __name__ == "__main__":
    limit, *argv = sys.argv[1:]
    sys.exit(main(argv, on_chunk=exit_after(int(limit))))
