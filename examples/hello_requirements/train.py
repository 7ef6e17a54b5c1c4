"""A trainer-only job whose package has a requirements.txt.

The platform builds an environment with `tabulate` installed (once: later jobs with the
same requirements reuse it) and runs this program with that environment's `python`; the
platform's own helpers (`paddlecloud.runtime`) stay importable.
"""

from __future__ import annotations

import sys

import tabulate

from paddlecloud import runtime


def main() -> int:
    info = runtime.info()
    rows = [
        ("job", info.job_name),
        ("trainer", f"{info.trainer_id} of {info.trainer_count}"),
        ("python", sys.executable),
        ("tabulate", tabulate.__version__),
    ]
    print(tabulate.tabulate(rows, headers=["what", "value"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
