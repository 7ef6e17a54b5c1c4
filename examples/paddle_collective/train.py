"""Paddle collective training (DataParallel) on CPU or GPU: linear regression on synthetic data.

Every trainer of a trainer-only PaddleCloud job runs this unchanged, as it would under
`python -m paddle.distributed.launch --nproc_per_node 2 train.py`: the platform sets
what `paddle.distributed.init_parallel_env()` reads (PADDLE_TRAINER_ID,
PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ENDPOINTS, PADDLE_CURRENT_ENDPOINT), the backend
(PADDLE_DISTRI_BACKEND: gloo without GPUs, nccl with) and the interface gloo and NCCL
use (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME). Run by hand with none of them set, it
trains alone:

    python train.py

The data set is made from a fixed seed, identically on every trainer; each takes every
N-th row. `DataParallel` averages the gradients in `backward()`. Every trainer prints
the loss averaged over all trainers every 10 steps and at the end (`final loss 0.0101`);
trainer 0 saves the weights to the job's output directory (`output/` by hand). A
trainer exits 1 when the final loss is not below the threshold, which fails the job.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import paddle
import paddle.distributed as dist

ROWS = 2048
FEATURES = 8
NOISE = 0.1
SEED = 1
STEPS = int(os.environ.get("STEPS", "60"))
BATCH_SIZE = 64  # per trainer
LEARNING_RATE = 0.1
# The best mean squared error is about NOISE**2 (the noise added to the targets).
THRESHOLD = round(2 * NOISE**2, 12)


def log(message: str) -> None:
    print(message, flush=True)


def make_data() -> tuple[np.ndarray, np.ndarray]:
    """The same data set on every trainer: targets linear in the features, plus noise."""
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((ROWS, FEATURES)).astype("float32")
    weights = np.linspace(-2.0, 2.0, FEATURES, dtype="float32")
    y = x @ weights + 0.5 + NOISE * rng.standard_normal(ROWS).astype("float32")
    return x, y.reshape(-1, 1).astype("float32")


def mean_over_trainers(value: paddle.Tensor, world: int) -> float:
    total = value.detach().clone()
    if world > 1:
        dist.all_reduce(total)
    return float(total.item()) / world


def main() -> int:
    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    if world > 1:
        dist.init_parallel_env()
    rank = dist.get_rank() if world > 1 else 0
    place = "gpu" if paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0 else "cpu"
    paddle.set_device(place)
    backend = os.environ.get("PADDLE_DISTRI_BACKEND", "-")
    log(f"trainer {rank} of {world} on {place} (backend {backend})")

    paddle.seed(SEED)  # the same initial weights on every trainer
    x, y = make_data()
    mine_x, mine_y = paddle.to_tensor(x[rank::world]), paddle.to_tensor(y[rank::world])
    model: paddle.nn.Layer = paddle.nn.Linear(FEATURES, 1)
    if world > 1:
        model = paddle.DataParallel(model)
    optimizer = paddle.optimizer.SGD(learning_rate=LEARNING_RATE, parameters=model.parameters())
    rng = np.random.default_rng(SEED + rank)

    for step in range(1, STEPS + 1):
        batch = paddle.to_tensor(rng.integers(0, mine_x.shape[0], BATCH_SIZE))
        loss = paddle.nn.functional.mse_loss(model(mine_x[batch]), mine_y[batch])
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        if step % 10 == 0:
            log(f"step {step} loss {mean_over_trainers(loss, world):.6f}")

    with paddle.no_grad():
        final = paddle.nn.functional.mse_loss(model(paddle.to_tensor(x)), paddle.to_tensor(y))
    final_loss = mean_over_trainers(final, world)
    log(f"final loss {final_loss:.6f} (threshold {THRESHOLD})")
    if rank == 0:
        output = Path(os.environ.get("PADDLE_CLOUD_OUTPUT", "output"))
        output.mkdir(parents=True, exist_ok=True)
        layer = model._layers if isinstance(model, paddle.DataParallel) else model
        paddle.save(layer.state_dict(), str(output / "model.pdparams"))
        summary = {"final_loss": final_loss, "threshold": THRESHOLD, "trainers": world, "steps": STEPS}
        (output / "model.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if final_loss < THRESHOLD else 1


if __name__ == "__main__":
    sys.exit(main())
