"""A PyTorch DistributedDataParallel job on CPU (gloo): linear regression on synthetic data.

Every trainer of a trainer-only PaddleCloud job runs this. PaddleCloud sets the
PyTorch variables on trainers (`MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE`, `RANK`),
so `init_process_group(init_method="env://")` needs nothing else. Run by hand, with
none of them set, it is rank 0 of 1 on a free local port:

    python train.py

The data set is made from a fixed seed, identically on every rank; `DistributedSampler`
gives each rank its own share of it every epoch, and DDP averages the gradients. After
the last epoch every rank evaluates the model on the whole data set and rank 0 saves it
(`model.pt`, a state dict, and `model.json`) to the job's output directory (`output/`
by hand). A rank exits 1 when the final loss is not below the threshold.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from paddlecloud import runtime

ROWS = 4096
FEATURES = 8
NOISE = 0.1
SEED = 1
DEFAULT_EPOCHS = 10
BATCH_SIZE = 64  # per rank
LEARNING_RATE = 0.02
# The best mean squared error is about NOISE**2 (the noise added to the targets).
THRESHOLD = round(2 * NOISE**2, 12)


def log(message: str) -> None:
    print(message, flush=True)


def make_data() -> TensorDataset:
    """The same data set on every rank: targets linear in the features, plus noise."""
    generator = torch.Generator().manual_seed(SEED)
    x = torch.randn(ROWS, FEATURES, generator=generator)
    true_weights = torch.linspace(-2.0, 2.0, FEATURES)
    y = x @ true_weights + 0.5 + NOISE * torch.randn(ROWS, generator=generator)
    return TensorDataset(x, y.unsqueeze(1))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def join_process_group() -> tuple[int, int, dist.TCPStore]:
    """Join the job's process group from the environment; alone on this machine when run by hand.

    The rendezvous store is made here rather than by `init_method="env://"` so that it
    outlives the group: rank 0 serves it, and a rank still tearing its group down talks to
    it, so rank 0 leaves only once every rank has said it is done (see `leave`)."""
    if "WORLD_SIZE" not in os.environ:
        os.environ.update(
            {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "1", "RANK": "0"}
        )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=rank == 0
    )
    dist.init_process_group(backend="gloo", store=store, rank=rank, world_size=world)
    return rank, world, store


def leave(store: dist.TCPStore, rank: int, world: int) -> None:
    """Tear the group down; rank 0, which serves the store, waits for every rank to be done
    (a rank whose store went away mid-teardown dies with 'terminate called...')."""
    dist.destroy_process_group()
    store.add("left", 1)
    deadline = time.monotonic() + 60
    while rank == 0 and store.add("left", 0) < world and time.monotonic() < deadline:
        time.sleep(0.05)


def main() -> int:
    info = runtime.info()
    epochs = info.passes or DEFAULT_EPOCHS
    output = Path(info.output_dir or "output")
    rank, world, store = join_process_group()
    try:
        torch.manual_seed(SEED)  # the same initial model everywhere (DDP also broadcasts rank 0's)
        data = make_data()
        sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
            data, num_replicas=world, rank=rank, shuffle=True, seed=SEED
        )
        loader = DataLoader(data, batch_size=BATCH_SIZE, sampler=sampler)
        model = DistributedDataParallel(nn.Linear(FEATURES, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
        loss_fn = nn.MSELoss()
        log(f"rank {rank} of {world}: {len(sampler)} of {ROWS} rows per epoch, {epochs} epochs")
        for epoch in range(epochs):
            sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every rank
            totals = torch.zeros(2)  # sum of squared errors, rows
            for x, y in loader:
                optimizer.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()  # DDP all-reduces the gradients here
                optimizer.step()
                totals += torch.tensor([loss.item() * len(x), len(x)])
            dist.all_reduce(totals)  # the loss of the epoch over every rank's rows
            log(f"epoch {epoch} rank {rank} loss {(totals[0] / totals[1]).item():.6f}")
        with torch.no_grad():
            x, y = data.tensors
            final = loss_fn(model.module(x), y).item()
        ok = final < THRESHOLD
        verdict = "ok" if ok else "NOT REACHED"
        log(f"rank {rank} final loss {final:.6f} on all {ROWS} rows; threshold {THRESHOLD:g}: {verdict}")
        if rank == 0:
            output.mkdir(parents=True, exist_ok=True)
            torch.save(model.module.state_dict(), output / "model.pt")
            summary = {
                "weights": model.module.weight.detach().flatten().tolist(),
                "bias": model.module.bias.item(),
                "final_loss": final,
                "threshold": THRESHOLD,
                "epochs": epochs,
                "world_size": world,
            }
            (output / "model.json").write_text(json.dumps(summary, indent=2) + "\n")
            log(f"rank 0 saved the model to {output / 'model.pt'}")
        dist.barrier()  # no rank leaves while another still needs the group
        return 0 if ok else 1
    finally:
        leave(store, rank, world)


if __name__ == "__main__":
    sys.exit(main())
