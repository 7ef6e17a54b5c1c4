"""Starts the control plane and one simulated node for people, and keeps it running until
Ctrl-C: `scripts/kube-control-plane.sh start` (docs/testing.md)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from kube_real.cluster import start


def main() -> int:
    parser = argparse.ArgumentParser(prog="kube-control-plane start")
    parser.add_argument("--bin-dir", type=Path, required=True)
    parser.add_argument("--root", type=Path, required=True, help="state: etcd data, PKI, kubeconfigs, logs")
    parser.add_argument("--nodes", type=int, default=1, help="simulated nodes (default 1)")
    args = parser.parse_args()
    cluster = start(args.root.resolve(), args.bin_dir)
    kubelets = [cluster.kubelet(f"sim-{i}") for i in range(args.nodes)]
    for kubelet in kubelets:
        kubelet.start()
    print(f"API server:  {cluster.server}")
    print(f"admin:       export KUBECONFIG={args.root.resolve() / 'admin.kubeconfig'}")
    print(f"logs:        {args.root.resolve()}/*.log")
    print("nodes:       " + ", ".join(k.node for k in kubelets) + " (simulated kubelets)")
    print("Ctrl-C stops it.", flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    for kubelet in kubelets:
        kubelet.stop()
    cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
