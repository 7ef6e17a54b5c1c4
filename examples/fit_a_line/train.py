"""fit_a_line: linear regression of housing prices with parameter servers, standard library only.

One program for every process of the job; `TRAINING_ROLE` says which it is:

- A parameter server (`PSERVER`) listens on `PADDLE_CURRENT_ENDPOINT` and holds one
  contiguous shard of the 14 parameters (13 weights, then the bias). Training is
  synchronous: it waits for one gradient from every trainer still training, applies
  their average with SGD, and only then answers them all with its new parameters.
- A trainer (`TRAINER`) reads its own CSV shards (`paddlecloud.dataset`), computes
  mini-batch gradients of the mean squared error, sends each server its slice, and
  trains on the parameters the servers send back. After the last pass every trainer
  evaluates the final model on the whole data set; trainer 0 saves it to the output
  directory. A trainer exits 1 when the final loss is not below the threshold.

Run by hand (no PaddleCloud variables) it is trainer 0 of 1 without parameter servers,
trains in this process, generates `data/` first if it is missing, and saves to `output/`:

    python train.py

The wire protocol (TCP, one connection per trainer and server): every message is a
4-byte big-endian length followed by that many bytes of a UTF-8 JSON object.

    trainer -> server                          server -> trainer
    {"op": "hello", "trainer": 1,              {"shard": [lo, hi], "size": 14,
     "trainers": 2}                             "params": [...]}
    {"op": "push", "grad": [...]}              {"params": [...]}  once the round is applied
    {"op": "done"}                             {"params": [...]}  once every trainer is done
    anything wrong                             {"error": "..."}, then the server hangs up

JSON floats round-trip exactly, and the server sums gradients in trainer order, so a
run's numbers are the same every time. A server counts a round complete when every
trainer that has not said "done" has pushed, so the first round waits for all of them;
a trainer that disconnects without "done" (it crashed) leaves the rounds, and on
restart it says hello again and continues from the current parameters.

Once every trainer has said "done" a server exits 0 after `FIT_A_LINE_PSERVER_LINGER`
seconds (default 10), or at once on SIGTERM or SIGINT. It lingers because a platform
stops parameter servers itself after the last trainer *exits*; a server exiting first,
while that trainer is still saving the model, would look like a server failure.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any

from make_data import FEATURES, NOISE

from paddlecloud import dataset, metrics, runtime

DATA = "data/housing-*.csv"  # in the package; FIT_A_LINE_DATA overrides (a glob)
MODEL_FILE = "model.json"
DEFAULT_PASSES = 10
BATCH_SIZE = 32
LEARNING_RATE = 0.02
# The prices are linear in the features plus Gaussian noise of standard deviation NOISE,
# so the best possible mean squared error is about NOISE**2; twice that is well within
# reach of a trained model and far below a model that has not learnt (the variance of the prices, about 18).
THRESHOLD = 2 * NOISE**2
DEFAULT_LINGER_SECONDS = 10.0
CONNECT_TIMEOUT_SECONDS = 60.0
MAX_MESSAGE_BYTES = 1 << 20
SIZE = len(FEATURES) + 1  # the weights, then the bias

Sample = tuple[list[float], float]


def log(message: str) -> None:
    print(message, flush=True)


# -- the wire protocol -------------------------------------------------------------------


class ProtocolError(Exception):
    """The peer sent something this protocol does not allow."""


class Closed(ProtocolError):
    """The peer hung up."""


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    body = json.dumps(message).encode()
    sock.sendall(struct.pack(">I", len(body)) + body)


def _recv_exactly(sock: socket.socket, count: int) -> bytes:
    chunks = []
    while count:
        chunk = sock.recv(min(count, 65536))
        if not chunk:
            raise Closed("connection closed")
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def receive(sock: socket.socket) -> dict[str, Any]:
    (length,) = struct.unpack(">I", _recv_exactly(sock, 4))
    if length > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {length} bytes is over the limit of {MAX_MESSAGE_BYTES}")
    try:
        message = json.loads(_recv_exactly(sock, length))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProtocolError(f"message is not JSON: {e}") from None
    if not isinstance(message, dict):
        raise ProtocolError("message is not a JSON object")
    if "error" in message:
        raise ProtocolError(f"the peer says: {message['error']}")
    return message


def floats(message: dict[str, Any], key: str, length: int) -> list[float]:
    values = message.get(key)
    if (
        not isinstance(values, list)
        or len(values) != length
        or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    ):
        raise ProtocolError(f"{key!r} must be a list of {length} numbers")
    return [float(v) for v in values]


def shard_bounds(index: int, count: int) -> tuple[int, int]:
    """The parameters [lo, hi) server `index` of `count` holds: contiguous, sizes differ by at most 1."""
    base, extra = divmod(SIZE, count)
    lo = index * base + min(index, extra)
    return lo, lo + base + (1 if index < extra else 0)


def sgd(params: Sequence[float], grad: Sequence[float]) -> list[float]:
    return [p - LEARNING_RATE * g for p, g in zip(params, grad, strict=True)]


# -- the parameter server ----------------------------------------------------------------


class Shard:
    """One server's slice of the parameters and the synchronous rounds that update it.

    Connection threads call `join`, `push`, `leave` and `done`; all state is guarded by
    one condition variable.
    """

    def __init__(self, index: int, lo: int, hi: int, trainers: int) -> None:
        self.index = index
        self.lo, self.hi = lo, hi
        self.trainers = trainers
        self.params = [0.0] * (hi - lo)
        self.rounds = 0
        self.all_done = threading.Event()
        self._cond = threading.Condition()
        # Rounds wait for every trainer from the start, so none trains alone before the
        # others have connected; one whose connection drops leaves until it says hello again.
        self._active: set[int] = set(range(trainers))
        self._done: set[int] = set()
        self._pending: dict[int, list[float]] = {}

    def join(self, trainer: int) -> list[float]:
        with self._cond:
            self._active.add(trainer)
            self._done.discard(trainer)
            log(f"pserver {self.index} serving trainer {trainer} (parameters {self.lo}..{self.hi - 1})")
            return list(self.params)

    def push(self, trainer: int, grad: list[float]) -> list[float]:
        """Add this trainer's gradient to the round; return the parameters once the round is applied."""
        with self._cond:
            if trainer not in self._active or trainer in self._pending:
                raise ProtocolError(f"trainer {trainer} pushed twice in one round or without hello")
            self._pending[trainer] = grad
            this_round = self.rounds
            self._apply_if_complete()
            # A later round cannot complete without this trainer, so these are this round's results.
            self._cond.wait_for(lambda: self.rounds > this_round)
            return list(self.params)

    def leave(self, trainer: int) -> None:
        """The trainer's connection ended without "done": the rounds go on without it."""
        with self._cond:
            if trainer in self._active:
                self._active.discard(trainer)
                log(f"pserver {self.index} lost trainer {trainer} before it was done")
                self._apply_if_complete()

    def done(self, trainer: int) -> list[float]:
        """The trainer has finished; return the final parameters once every trainer has."""
        with self._cond:
            self._active.discard(trainer)
            self._done.add(trainer)
            log(f"pserver {self.index} trainer {trainer} done ({len(self._done)} of {self.trainers})")
            self._apply_if_complete()
            if len(self._done) == self.trainers:
                log(f"pserver {self.index} all {self.trainers} trainers done after {self.rounds} rounds")
                self.all_done.set()
                self._cond.notify_all()
            self._cond.wait_for(self.all_done.is_set)
            return list(self.params)

    def _apply_if_complete(self) -> None:
        if not self._pending or self._pending.keys() != self._active:
            return
        # In trainer order, so the floating-point sum is the same on every run.
        grads = [self._pending[t] for t in sorted(self._pending)]
        mean = [math.fsum(column) / len(grads) for column in zip(*grads, strict=True)]
        self.params = sgd(self.params, mean)
        self._pending.clear()
        self.rounds += 1
        self._cond.notify_all()


def serve_trainer(conn: socket.socket, shard: Shard) -> None:
    """Answer one trainer's connection until it says "done" or hangs up."""
    trainer: int | None = None
    joined: int | None = None  # the trainer, once the shard counts it in
    finished = False
    with conn:
        try:
            try:
                hello = receive(conn)
            except (Closed, OSError):
                return  # a readiness probe (connect, then close), as the platform's
            trainer = hello.get("trainer")
            if hello.get("op") != "hello" or type(trainer) is not int:
                raise ProtocolError('the first message must be {"op": "hello", "trainer": <id>, ...}')
            if hello.get("trainers") != shard.trainers or not 0 <= trainer < shard.trainers:
                raise ProtocolError(
                    f"this server expects trainers 0..{shard.trainers - 1} of {shard.trainers}, "
                    f"not trainer {trainer} of {hello.get('trainers')}"
                )
            params = shard.join(trainer)
            joined = trainer
            send(conn, {"shard": [shard.lo, shard.hi], "size": SIZE, "params": params})
            while not finished:
                message = receive(conn)
                if message.get("op") == "push":
                    grad = floats(message, "grad", shard.hi - shard.lo)
                    send(conn, {"params": shard.push(trainer, grad)})
                elif message.get("op") == "done":
                    finished = True
                    send(conn, {"params": shard.done(trainer)})
                else:
                    raise ProtocolError(f"unknown op {message.get('op')!r}")
        except Closed:
            pass  # leave() below says so
        except ProtocolError as e:
            log(f"pserver {shard.index} refusing trainer {trainer}: {e}")
            with contextlib.suppress(OSError):
                send(conn, {"error": str(e)})
        except OSError as e:
            log(f"pserver {shard.index} lost the connection of trainer {trainer}: {e}")
        finally:
            if joined is not None and not finished:
                shard.leave(joined)


def run_pserver(info: runtime.RuntimeInfo, environ: dict[str, str]) -> int:
    endpoints = list(info.pserver_endpoints)
    me = info.current_endpoint
    if me is None or me not in endpoints:
        log(f"pserver: PADDLE_CURRENT_ENDPOINT={me!r} is not in PADDLE_PSERVERS_IP_PORT_LIST={endpoints}")
        return 2
    index = endpoints.index(me)
    lo, hi = shard_bounds(index, len(endpoints))
    shard = Shard(index, lo, hi, info.trainer_count)
    linger = float(environ.get("FIT_A_LINE_PSERVER_LINGER", DEFAULT_LINGER_SECONDS))
    stop = threading.Event()
    stopped_by: list[str] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopped_by.append(signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    host, _, port = me.rpartition(":")
    server = socket.create_server((host, int(port)))

    def accept_forever() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return  # closed: the server is stopping
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=serve_trainer, args=(conn, shard), daemon=True).start()

    def linger_then_stop() -> None:
        shard.all_done.wait()
        if not stop.wait(linger):
            stop.set()

    log(
        f"pserver {index} of {len(endpoints)} listening on {me}, holding parameters {lo}..{hi - 1} "
        f"of {SIZE} for {info.trainer_count} trainers"
    )
    threading.Thread(target=accept_forever, name="accept", daemon=True).start()
    threading.Thread(target=linger_then_stop, name="linger", daemon=True).start()
    stop.wait()  # the signal handlers run in this thread, between waits
    server.close()
    if stopped_by:
        log(f"pserver {index} stopped by {stopped_by[0]} after {shard.rounds} rounds")
    else:
        log(f"pserver {index} exiting: every trainer is done")
    return 0


# -- the trainer -------------------------------------------------------------------------


def load_csv(file: IO[bytes]) -> Iterator[Sample]:
    """A `cluster_files_reader` loader: the (features, price) rows of one make_data.py shard."""
    rows = csv.reader(io.TextIOWrapper(file, encoding="utf-8", newline=""))
    header = next(rows, None)
    if header != [*FEATURES, "PRICE"]:
        raise ValueError(f"{file.name}: the header is not that of make_data.py: {header}")
    for row in rows:
        values = [float(v) for v in row]
        yield values[:-1], values[-1]


def normalisation(samples: Sequence[Sample]) -> tuple[list[float], list[float]]:
    """Each feature's mean and standard deviation; `fsum` makes them exact, whatever the order."""
    columns = list(zip(*(x for x, _ in samples), strict=True))
    means = [math.fsum(c) / len(c) for c in columns]
    stds = [
        math.sqrt(math.fsum((v - m) ** 2 for v in c) / len(c)) or 1.0
        for c, m in zip(columns, means, strict=True)
    ]
    return means, stds


def normalise(samples: Sequence[Sample], means: Sequence[float], stds: Sequence[float]) -> list[Sample]:
    return [([(v - m) / s for v, m, s in zip(x, means, stds, strict=True)], y) for x, y in samples]


def predict(params: Sequence[float], x: Sequence[float]) -> float:
    return sum(w * v for w, v in zip(params[:-1], x, strict=True)) + params[-1]


def mse(params: Sequence[float], samples: Sequence[Sample]) -> float:
    return math.fsum((predict(params, x) - y) ** 2 for x, y in samples) / len(samples)


def gradient(params: Sequence[float], batch: Sequence[Sample]) -> tuple[list[float], float]:
    """The gradient of the batch's mean squared error, and that error."""
    grad = [0.0] * SIZE
    squares = 0.0
    for x, y in batch:
        error = predict(params, x) - y
        squares += error * error
        for i, v in enumerate(x):
            grad[i] += error * v
        grad[-1] += error
    return [2.0 * g / len(batch) for g in grad], squares / len(batch)


class LocalParameters:
    """No parameter servers: this process keeps the parameters and applies SGD itself."""

    def __init__(self) -> None:
        self.params = [0.0] * SIZE

    def step(self, grad: list[float]) -> list[float]:
        self.params = sgd(self.params, grad)
        return self.params

    def done(self) -> list[float]:
        return self.params


class ParameterServers:
    """The parameter servers of the job, one connection each, each holding a slice of the parameters."""

    def __init__(self, endpoints: Sequence[str], trainer: int, trainers: int) -> None:
        self.socks = [_connect(e) for e in endpoints]
        self.slices: list[tuple[int, int]] = []
        params: list[float] = []
        for sock in self.socks:
            send(sock, {"op": "hello", "trainer": trainer, "trainers": trainers})
        for endpoint, sock in zip(endpoints, self.socks, strict=True):
            reply = receive(sock)
            lo, hi = reply["shard"]
            if reply["size"] != SIZE or lo != len(params):
                raise ProtocolError(f"{endpoint} holds parameters {lo}..{hi - 1} of {reply['size']}")
            self.slices.append((lo, hi))
            params += floats(reply, "params", hi - lo)
        if len(params) != SIZE:
            raise ProtocolError(f"the parameter servers hold {len(params)} parameters, not {SIZE}")
        self.params = params

    def _exchange(self, messages: Sequence[dict[str, Any]]) -> list[float]:
        # Send to every server first, so they all work on the round at once.
        for sock, message in zip(self.socks, messages, strict=True):
            send(sock, message)
        params: list[float] = []
        for sock, (lo, hi) in zip(self.socks, self.slices, strict=True):
            params += floats(receive(sock), "params", hi - lo)
        self.params = params
        return params

    def step(self, grad: list[float]) -> list[float]:
        return self._exchange([{"op": "push", "grad": grad[lo:hi]} for lo, hi in self.slices])

    def done(self) -> list[float]:
        params = self._exchange([{"op": "done"} for _ in self.socks])
        for sock in self.socks:
            sock.close()
        return params


def _connect(endpoint: str) -> socket.socket:
    """Connect, retrying while the server starts (a platform may start trainers first)."""
    host, _, port = endpoint.rpartition(":")
    deadline = time.monotonic() + CONNECT_TIMEOUT_SECONDS
    delay = 0.05
    while True:
        try:
            sock = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_SECONDS)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
            continue
        sock.settimeout(None)  # a round waits for the slowest trainer, however slow
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


def data_pattern(info: runtime.RuntimeInfo, environ: dict[str, str]) -> str:
    """The data set's glob: FIT_A_LINE_DATA, else the shards in the job's input directory
    (`submit --input`), else data/ in the package. Run by hand with no data, make it first
    (make_data.py is deterministic)."""
    pattern = environ.get("FIT_A_LINE_DATA") or DATA
    if "FIT_A_LINE_DATA" not in environ and environ.get("PADDLE_CLOUD_INPUT"):
        pattern = os.path.join(environ["PADDLE_CLOUD_INPUT"], "housing-*.csv")
    if pattern == DATA and not info.in_paddlecloud and not list(Path().glob(DATA)):
        log("no data in data/: making it with make_data.py")
        subprocess.run([sys.executable, str(Path(__file__).with_name("make_data.py")), "data"], check=True)
    return pattern


def save_model(path: Path, model: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(model, indent=2) + "\n")
    os.replace(tmp, path)


def run_trainer(info: runtime.RuntimeInfo, environ: dict[str, str]) -> int:
    trainer = info.trainer_id or 0
    trainers = info.trainer_count
    passes = info.passes or DEFAULT_PASSES
    pattern = data_pattern(info, environ)
    # Every trainer derives the normalisation from the whole data set, so all of them use
    # exactly the same numbers whatever the number of trainers; its shards are its own.
    everything = list(dataset.cluster_files_reader(pattern, 1, 0, loader=load_csv)())
    if not everything:
        log(f"trainer {trainer}: no data matches {pattern!r} (make it with: python make_data.py data)")
        return 2
    means, stds = normalisation(everything)
    mine = normalise(
        list(dataset.cluster_files_reader(pattern, trainers, trainer, loader=load_csv)()), means, stds
    )
    if info.pserver_endpoints:
        model: LocalParameters | ParameterServers = ParameterServers(
            info.pserver_endpoints, trainer, trainers
        )
        where = f"{len(info.pserver_endpoints)} parameter servers"
    else:
        model = LocalParameters()
        where = "no parameter servers, training in this process"
    log(
        f"trainer {trainer} of {trainers}: {len(mine)} of {len(everything)} rows, {passes} passes, "
        f"batch {BATCH_SIZE}, learning rate {LEARNING_RATE}; {where}"
    )
    params = model.params
    for number in range(passes):
        losses = []
        for start in range(0, len(mine), BATCH_SIZE):
            batch = mine[start : start + BATCH_SIZE]
            grad, loss = gradient(params, batch)
            losses.append(loss * len(batch))
            params = model.step(grad)
        if mine:
            loss = math.fsum(losses) / len(mine)
            log(f"pass {number} trainer {trainer} loss {loss:.6f}")
            # The curve `paddlecloud metrics` and the dashboard show (docs/metrics.md).
            metrics.log(step=number, loss=loss)
    params = model.done()
    final = mse(params, normalise(everything, means, stds))
    ok = final < THRESHOLD
    log(
        f"trainer {trainer} final loss {final:.6f} on all {len(everything)} rows; threshold {THRESHOLD:g} "
        f"(2 x NOISE^2, NOISE={NOISE} in make_data.py): {'ok' if ok else 'NOT REACHED'}"
    )
    if trainer == 0:
        path = Path(info.output_dir or "output") / MODEL_FILE
        save_model(
            path,
            {
                "features": FEATURES,
                "weights": params[:-1],
                "bias": params[-1],
                "normalisation": {"mean": means, "std": stds},
                "final_loss": final,
                "threshold": THRESHOLD,
                "passes": passes,
                "trainers": trainers,
                "pservers": len(info.pserver_endpoints),
                "rows": len(everything),
            },
        )
        log(f"trainer 0 saved the model to {path}")
    return 0 if ok else 1


def main() -> int:
    environ = dict(os.environ)
    info = runtime.info(environ)
    if info.role is runtime.Role.PSERVER:
        return run_pserver(info, environ)
    try:
        return run_trainer(info, environ)
    except (ProtocolError, OSError) as e:
        # A parameter server that died or refused us, unreadable data: one line, and the job fails.
        log(f"trainer {info.trainer_id} failed: {type(e).__name__}: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
