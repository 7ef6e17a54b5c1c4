"""Fail when a function is more complex than a limit (radon's cyclomatic complexity), for `make lint`.

    python scripts/complexity.py --max 15 services/jobs/

Every function, method and closure under the paths counts; each one above the limit is named
with its place and complexity, and the exit status is 1. So is a file radon cannot parse
(radon itself reports it and exits 0). Radon's own filter works on ranks (C is 11 to 20) and
xenon, which gates on them, fails only above 20: the limit wanted here is a number, so this
reads `radon cc --json` and compares.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def radon_blocks(paths: list[str]) -> dict[str, Any]:
    """Radon's JSON: for each file, its blocks, or {"error": ...} where it could not parse it."""
    # --show-closures lists a closure as a block of its own: radon does not add its complexity
    # to the enclosing function's, so without it a complex closure would go unseen.
    command = [sys.executable, "-m", "radon", "cc", "--json", "--show-closures", *paths]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def over_limit(report: dict[str, Any], limit: int) -> Iterator[str]:
    """One line per problem: a file radon could not read, or a function above `limit`."""
    for path, blocks in sorted(report.items()):
        if isinstance(blocks, dict):
            yield f"{path}: radon could not read it: {blocks.get('error')}"
            continue
        # With --show-closures the list holds every function, method and closure at its top
        # level (classes repeat their methods inside; a class's own figure is an average).
        for block in blocks:
            if block["type"] not in ("function", "method") or block["complexity"] <= limit:
                continue
            name = f"{block['classname']}.{block['name']}" if block["type"] == "method" else block["name"]
            yield f"{path}:{block['lineno']}: {name} has complexity {block['complexity']}, above {limit}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, required=True, help="the highest complexity allowed")
    parser.add_argument("paths", nargs="+", help="files or directories to check")
    args = parser.parse_args(argv)
    missing = [path for path in args.paths if not Path(path).exists()]
    if missing:
        print(f"complexity: no such path: {', '.join(missing)}", file=sys.stderr)
        return 2
    problems = list(over_limit(radon_blocks(args.paths), args.max))
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        print(
            f"complexity: {len(problems)} above the limit of {args.max} in {' '.join(args.paths)}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
