"""A worker of the distributed tests: trains a small MLP with MainLoop on a dist kvstore.

Run by ``mxoid launch`` from tests/test_distributed.py; the test imports
:func:`network`, :func:`data` and :func:`initial_params` to train the same
model in one process. Each worker writes ``<out>/rank<r>.json`` (its records
and whether it holds the servers' parameters) and ``<out>/rank<r>.npz``
(its final parameters).
"""

import argparse
import json
import os
import signal
import sys
import threading
import time

import mxnet as mx
import numpy as np

from mxoid import Checkpoint, Evaluate, Extension, FinishAfter, JSONLinesLog, MainLoop
from mxoid.distributed.sharding import shard, shard_arrays

OPTIMIZER_PARAMS = {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3}
ADAM_PARAMS = {"learning_rate": 0.01, "wd": 1e-3}


def network(dropout: float = 0.0) -> mx.sym.Symbol:
    data = mx.sym.Variable("data")
    hidden = mx.sym.Activation(
        mx.sym.FullyConnected(data, num_hidden=16, name="fc1"), act_type="relu"
    )
    if dropout:  # draws MXNet random numbers: each worker's own
        hidden = mx.sym.Dropout(hidden, p=dropout)
    return mx.sym.SoftmaxOutput(
        mx.sym.FullyConnected(hidden, num_hidden=3, name="fc2"), name="softmax"
    )


def data(n: int, seed: int):
    rng = np.random.RandomState(seed)
    y = rng.randint(0, 3, size=n)
    X = np.random.RandomState(0).randn(3, 10)[y] * 0.6 + rng.randn(n, 10)
    return X.astype("float32"), y.astype("float32")


def initial_params():
    rng = np.random.RandomState(1)
    shapes = {"fc1_weight": (16, 10), "fc1_bias": (16,), "fc2_weight": (3, 16), "fc2_bias": (3,)}
    return {name: mx.nd.array(rng.uniform(-0.3, 0.3, shape)) for name, shape in shapes.items()}


class Act(Extension):
    """At batch ``at`` on rank ``rank``: note the time in ``<out>/acted``, then raise or
    kill this process."""

    def __init__(self, action: str, at: int, rank: int, out: str) -> None:
        super().__init__(after_batch=True)
        self.action, self.at, self.rank, self.out = action, at, rank, out

    def do(self, which_callback, *args):
        status = self.main_loop.status
        if status.rank != self.rank or status.iterations_done != self.at:
            return
        print(f"rank {status.rank}: {self.action} at batch {status.iterations_done}", flush=True)
        with open(os.path.join(self.out, "acted"), "w") as acted:
            acted.write(repr(time.time()))
        if self.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("extension failure on purpose")


class Misbehave(Extension):
    """On rank ``rank`` at batch ``at``: call sys.exit(0), or send this process SIGTERM."""

    def __init__(self, action: str, at: int, rank: int) -> None:
        super().__init__(after_batch=True)
        self.action, self.at, self.rank = action, at, rank

    def do(self, which_callback, *args):
        status = self.main_loop.status
        if status.rank != self.rank or status.iterations_done != self.at:
            return
        print(f"rank {status.rank}: {self.action} at batch {status.iterations_done}", flush=True)
        if self.action == "exit":
            sys.exit(0)
        os.kill(os.getpid(), signal.SIGTERM)


class Slow(Extension):
    """Sleeps after every batch, and says which batch it trained."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def after_batch(self, batch):
        print(f"BATCH {self.main_loop.status.iterations_done}", flush=True)
        time.sleep(self.seconds)


class Hold(Extension):
    """After batch ``at`` and its checkpoint (Checkpoint's priority is 200): wait until
    killed, so that a kill lands after that checkpoint and before the next, without
    sleeping through the batches before it."""

    def __init__(self, at: int) -> None:
        super().__init__(priority=300)
        self.at = at

    def after_batch(self, batch):
        if self.main_loop.status.iterations_done == self.at:
            print(f"HOLDING after batch {self.at}", flush=True)
            threading.Event().wait()


class Touch(Extension):
    """Writes ``<out>/<name>_rank<r>`` after training."""

    def __init__(self, out: str, **kwargs) -> None:
        super().__init__(after_training=True, **kwargs)
        self.out = out

    def do(self, which_callback, *args):
        path = os.path.join(self.out, f"{self.name}_rank{self.main_loop.status.rank}")
        open(path, "w").close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kvstore", default="dist_sync")
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batches", type=int, help="FinishAfter(after_n_batches=) as well")
    parser.add_argument("--out", required=True)
    parser.add_argument("--act", choices=("raise", "kill"))
    parser.add_argument("--act-at", type=int, default=5)
    parser.add_argument("--unequal", action="store_true", help="rank 1 gets fewer rows")
    parser.add_argument("--misbehave", choices=("exit", "sigterm"))
    parser.add_argument("--bad-argument-on-rank", type=int)
    parser.add_argument(
        "--raise-after-create-on-rank", type=int, help="raise right after mx.kv.create, there"
    )
    parser.add_argument("--seconds-on-rank-0", type=float, help="FinishAfter(seconds=) on rank 0")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to sleep per batch")
    parser.add_argument("--hold-after", type=int, help="wait to be killed after this batch")
    parser.add_argument("--checkpoint", help="a Checkpoint directory")
    parser.add_argument("--log", help="a JSONLinesLog path")
    parser.add_argument("--accumulate", type=int, default=1, help="accumulate_batches")
    parser.add_argument("--update-on-workers", action="store_true", help="update_on_kvstore=False")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    parser.add_argument("--shuffle", action="store_true", help="each rank shuffles its shard")
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--checkpoint-every", type=int, default=5, help="batches between saves")
    parser.add_argument("--resume-from", help="MainLoop's resume_from")
    parser.add_argument(
        "--resume-only-on-rank", type=int, help="the other ranks pass no resume_from"
    )
    parser.add_argument(
        "--save-start",
        action="store_true",
        help="write <out>/start_rank<r>.npz (parameters) and .states (the workers' optimizer) "
        "once MainLoop is built: right after a resumption",
    )
    args = parser.parse_args(argv)

    kv = mx.kv.create(args.kvstore)
    print(f"rank {kv.rank} of {kv.num_workers}", flush=True)
    if args.raise_after_create_on_rank == kv.rank:
        raise ValueError(f"cannot load the data on rank {kv.rank} (on purpose)")
    X, y = data(200, seed=0)
    if args.shuffle:  # every rank its own shuffle: its own NumPy random state
        np.random.seed(100 + kv.rank)
        mx.random.seed(200 + kv.rank)
    if args.unequal:
        X, y = shard_arrays([X, y], kv)
        keep = len(X) - (30 if kv.rank == 1 else 0)
        train = mx.io.NDArrayIter(
            X[:keep], y[:keep], batch_size=args.batch_size, label_name="softmax_label"
        )
    else:
        train = shard(
            X,
            y,
            kvstore=kv,
            batch_size=args.batch_size,
            label_name="softmax_label",
            shuffle=args.shuffle,
        )
    valid = shard(*data(60, seed=5), kvstore=kv, batch_size=10, label_name="softmax_label")
    extensions = [
        FinishAfter(after_n_epochs=args.epochs, after_n_batches=args.batches),
        Evaluate({"valid": valid}, metrics=["acc", "ce"]),
        Touch(args.out, name="everyone"),
        Touch(args.out, name="rank_zero", rank_zero_only=True),
    ]
    if args.act:
        extensions.append(Act(args.act, args.act_at, rank=1, out=args.out))
    if args.misbehave:
        extensions.append(Misbehave(args.misbehave, args.act_at, rank=1))
    if args.seconds_on_rank_0 and kv.rank == 0:
        extensions.append(FinishAfter(seconds=args.seconds_on_rank_0, name="TimeLimit"))
    if args.delay:
        extensions.append(Slow(args.delay))
    if args.checkpoint:
        extensions.append(Checkpoint(args.checkpoint, every_n_batches=args.checkpoint_every))
    if args.hold_after:
        extensions.append(Hold(args.hold_after))
    if args.log:
        extensions.append(JSONLinesLog(args.log))
    contexts = "cpu" if args.bad_argument_on_rank == kv.rank else None
    adam = args.optimizer == "adam"
    loop = MainLoop(
        network(args.dropout),
        train,
        optimizer=args.optimizer,
        optimizer_params=dict(ADAM_PARAMS if adam else OPTIMIZER_PARAMS),
        arg_params=initial_params(),
        kvstore=kv,
        extensions=extensions,
        contexts=contexts,
        accumulate_batches=args.accumulate,
        update_on_kvstore=False if args.update_on_workers else None,
        resume_from=None if args.resume_only_on_rank not in (None, kv.rank) else args.resume_from,
    )
    if args.save_start:
        start = {name: value.asnumpy() for name, value in loop.get_params()[0].items()}
        np.savez(os.path.join(args.out, f"start_rank{kv.rank}.npz"), **start)
        states = loop.update.states()
        if states is not None:
            with open(os.path.join(args.out, f"start_rank{kv.rank}.states"), "wb") as handle:
                handle.write(states)
    loop.run()

    params = {name: value.asnumpy() for name, value in loop.get_params()[0].items()}
    mx.nd.waitall()
    kv._barrier()
    on_servers = {}
    for name, value in params.items():
        pulled = mx.nd.zeros(value.shape)
        kv.pull(name, out=pulled)
        on_servers[name] = pulled.asnumpy()
    holds_servers = all(np.array_equal(params[name], on_servers[name]) for name in params)
    records = {str(iteration): dict(row) for iteration, row in loop.log.items()}
    with open(os.path.join(args.out, f"rank{kv.rank}.json"), "w") as out:
        json.dump(
            {
                "holds_servers": holds_servers,
                "records": records,
                "status": loop.status.state_dict(),
                "ssh_connection": os.environ.get("SSH_CONNECTION"),
                "node_host": os.environ.get("DMLC_NODE_HOST"),
            },
            out,
            default=float,
        )
    np.savez(os.path.join(args.out, f"rank{kv.rank}.npz"), **params)
    print(f"rank {kv.rank} done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
