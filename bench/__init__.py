"""Benchmarks: each prints figures as ratios against a baseline measured in the same run."""

import sys
from pathlib import Path

# The process harness (configs, ServiceProcess) is shared with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
