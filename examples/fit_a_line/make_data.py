"""Make the fit_a_line data set: housing prices with the 13 features of the classic data, in shards.

The prices are a fixed linear function of the features plus a little noise, so a linear
model can fit them and a training run can check the loss it reaches. The same seed
always gives the same files; nothing is downloaded.

    python make_data.py OUT_DIR [--rows 4096] [--shards 4] [--seed 1]
"""

from __future__ import annotations

import argparse
import csv
import random
from pathlib import Path

FEATURES = [
    "CRIM",
    "ZN",
    "INDUS",
    "CHAS",
    "NOX",
    "RM",
    "AGE",
    "DIS",
    "RAD",
    "TAX",
    "PTRATIO",
    "B",
    "LSTAT",
]
# Per feature: the range values are drawn from (like the original data's), and its weight.
RANGES = [
    (0.0, 10.0),
    (0.0, 100.0),
    (0.5, 28.0),
    (0.0, 1.0),
    (0.38, 0.87),
    (3.5, 8.8),
    (3.0, 100.0),
    (1.1, 12.0),
    (1.0, 24.0),
    (187.0, 711.0),
    (12.6, 22.0),
    (0.3, 397.0),
    (1.7, 38.0),
]
WEIGHTS = [-0.9, 1.1, 0.1, 0.7, -2.0, 2.7, 0.0, -3.1, 2.6, -2.0, -2.1, 0.8, -3.7]
BIAS = 22.5
NOISE = 0.5


def normalised(value: float, low: float, high: float) -> float:
    return (value - low) / (high - low) * 2.0 - 1.0


def row(rng: random.Random) -> list[float]:
    features = [rng.uniform(low, high) for low, high in RANGES]
    features[3] = float(features[3] > 0.93)  # CHAS is a 0/1 flag, rarely set
    price = BIAS + NOISE * rng.gauss(0.0, 1.0)
    for value, (low, high), weight in zip(features, RANGES, WEIGHTS, strict=True):
        price += weight * normalised(value, low, high)
    return [round(v, 4) for v in features] + [round(price, 3)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path, help="directory for housing-00000.csv, ...")
    parser.add_argument("--rows", type=int, default=4096, help="rows in all (default: %(default)s)")
    parser.add_argument(
        "--shards", type=int, default=4, help="files to split them into (default: %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.rows < 1 or not 1 <= args.shards <= args.rows:
        parser.error("need at least one row, and between 1 and --rows shards")
    rng = random.Random(args.seed)  # noqa: S311 - a seeded, repeatable data set, not a secret
    args.out.mkdir(parents=True, exist_ok=True)
    per_shard = -(-args.rows // args.shards)
    written = 0
    for shard in range(args.shards):
        path = args.out / f"housing-{shard:05d}.csv"
        with path.open("w", newline="") as f:
            out = csv.writer(f)
            out.writerow([*FEATURES, "PRICE"])
            for _ in range(min(per_shard, args.rows - written)):
                out.writerow(row(rng))
                written += 1
    print(f"wrote {written} rows in {args.shards} shards to {args.out}")


if __name__ == "__main__":
    main()
