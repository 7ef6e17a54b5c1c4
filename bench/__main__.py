"""`python -m bench [NAME ...]`: run every benchmark, or the named ones."""

from __future__ import annotations

import argparse
import importlib
import sys

# hdfs last: where the minicluster is not built it says so and exits 1. `peers` runs only when
# named (`make bench-peers`): the peers are installed apart (scripts/peers.sh).
BENCHMARKS = ("gateway", "pfs", "listing", "jobs", "package", "metrics", "builder", "cli", "kubelogs", "hdfs")
ON_REQUEST = ("peers",)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "names", nargs="*", choices=[*BENCHMARKS, *ON_REQUEST, []], help="default: all but peers"
    )
    parser.add_argument(
        "--size", help="hdfs: the bytes moved each way, a quantity such as 256Mi (default 1Gi)"
    )
    args = parser.parse_args()
    for name in args.names or BENCHMARKS:
        print(f"== bench/{name}", flush=True)
        module = importlib.import_module(f"bench.{name}")
        if name == "hdfs":
            module.main(size=args.size)
        else:
            module.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
