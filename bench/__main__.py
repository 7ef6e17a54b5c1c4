"""`python -m bench [NAME ...]`: run every benchmark, or the named ones."""

from __future__ import annotations

import argparse
import importlib
import sys

BENCHMARKS = ("gateway", "pfs", "jobs", "builder", "cli", "kubelogs")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", choices=[*BENCHMARKS, []], help="default: all")
    args = parser.parse_args()
    for name in args.names or BENCHMARKS:
        print(f"== bench/{name}", flush=True)
        importlib.import_module(f"bench.{name}").main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
