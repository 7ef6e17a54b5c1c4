"""Paddle parameter-server training (fleet, GEO-SGD) on CPU: linear regression on synthetic data.

One program for both roles, as Paddle's fleet expects: `fleet.init()` reads the role and
the endpoints from the runtime contract through `PaddleCloudRoleMaker` (TRAINING_ROLE,
PADDLE_PSERVERS_IP_PORT_LIST, PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ID, POD_IP,
PADDLE_PORT), so it runs unchanged under PaddleCloud and under
`python -m paddle.distributed.launch --server_num 2 --worker_num 2 train.py`.

A parameter server serves until it is stopped (fleet's servers never exit by
themselves; PaddleCloud stops them once every trainer exited 0). A trainer trains on
rows of its own in GEO-SGD mode (`a_sync` with `k_steps`: it trains locally and sends
what changed every K steps), prints its batch's loss every 50 steps, and at the end the
loss on held-out rows (`final loss 0.000101`). Trainer 0 writes `model.json` (the final
loss) to the job's output directory. A trainer exits 1 when the final loss is not below
the threshold, which fails the job.

Paddle 2.6.2: the 3.x CPU wheels have no parameter-server runtime, and 2.6.2's other
modes do not do here (async runs but does not learn, sync crashes in SendBarrierOp):
docs/paddle.md.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import paddle
import paddle.distributed.fleet as fleet

ROWS = 1024  # per trainer, and as many held out to measure the final loss on
FEATURES = 8
WEIGHTS = np.linspace(-2.0, 2.0, FEATURES, dtype="float32")
NOISE = 0.01
SEED = 1
STEPS = int(os.environ.get("STEPS", "300"))
K_STEPS = 10
BATCH_SIZE = 32
LEARNING_RATE = 0.05
THRESHOLD = 0.001  # the loss starts near 10; the best possible is about NOISE**2


def log(message: str) -> None:
    print(message, flush=True)


def make_rows(seed: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """`rows` rows drawn with `seed`: targets linear in the features (the same weights for
    every seed), plus noise."""
    rng = np.random.default_rng(seed)
    features = rng.standard_normal((rows, FEATURES)).astype("float32")
    targets = features @ WEIGHTS + 0.5 + NOISE * rng.standard_normal(rows).astype("float32")
    return features, targets.reshape(-1, 1).astype("float32")


def main() -> int:
    paddle.enable_static()
    fleet.init()  # PaddleCloudRoleMaker: the role and endpoints from the environment
    x = paddle.static.data(name="x", shape=[None, FEATURES], dtype="float32")
    y = paddle.static.data(name="y", shape=[None, 1], dtype="float32")
    prediction = paddle.static.nn.fc(x, size=1)
    loss = paddle.mean(paddle.nn.functional.square_error_cost(prediction, y))
    evaluate = paddle.static.default_main_program().clone(for_test=True)

    strategy = fleet.DistributedStrategy()
    strategy.a_sync = True
    strategy.a_sync_configs = {"k_steps": K_STEPS}  # GEO-SGD
    optimizer = fleet.distributed_optimizer(paddle.optimizer.SGD(learning_rate=LEARNING_RATE), strategy)
    optimizer.minimize(loss)

    if fleet.is_server():
        log(f"pserver {fleet.server_index()} of {fleet.server_num()} serving")
        fleet.init_server()
        fleet.run_server()  # until stopped
        return 0

    rank, world = fleet.worker_index(), fleet.worker_num()
    log(f"trainer {rank} of {world}, {fleet.server_num()} parameter servers")
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    fleet.init_worker()
    # Each trainer its own rows; the held-out ones are the same for all.
    mine_x, mine_y = make_rows(SEED + 1 + rank, ROWS)
    held_x, held_y = make_rows(SEED, ROWS)
    rng = np.random.default_rng(SEED + rank)
    main_program = paddle.static.default_main_program()
    for step in range(1, STEPS + 1):
        batch = rng.integers(0, len(mine_x), BATCH_SIZE)
        (value,) = exe.run(main_program, feed={"x": mine_x[batch], "y": mine_y[batch]}, fetch_list=[loss])
        if step % 50 == 0:
            log(f"step {step} loss {float(value):.6f}")
    (final,) = exe.run(evaluate, feed={"x": held_x, "y": held_y}, fetch_list=[loss])
    final_loss = float(final)
    log(f"final loss {final_loss:.6f} (threshold {THRESHOLD})")
    if rank == 0:
        output = Path(os.environ.get("PADDLE_CLOUD_OUTPUT", "output"))
        output.mkdir(parents=True, exist_ok=True)
        summary = {"final_loss": final_loss, "threshold": THRESHOLD, "trainers": world, "steps": STEPS}
        (output / "model.json").write_text(json.dumps(summary, indent=2) + "\n")
    fleet.stop_worker()
    return 0 if final_loss < THRESHOLD else 1


if __name__ == "__main__":
    sys.exit(main())
