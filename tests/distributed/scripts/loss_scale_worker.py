"""A worker training an MLP with BatchNorm on dist_sync under loss scaling.

Each worker reads its shard (rows ``rank, rank + 2, ...``); with ``--poison K`` rank 1's
K-th batch has an inf in its last row, so that only that worker's gradients overflow.
``--scale``: ``none``, ``static`` (2**10) or ``dynamic`` (from 2**10, growing every 4
steps). Writes ``<out>/rank<r>.npz`` (the final parameters) and ``<out>/rank<r>.json``
(the scale, and the skipped steps after each batch).
"""

import argparse
import json
import os

import mxnet as mx
import numpy as np

from mxoid import FinishAfter, MainLoop
from mxoid.distributed.sharding import shard_arrays
from mxoid.extensions import Extension
from mxoid.loss_scale import DynamicLossScale

BATCH, EPOCHS = 10, 3
SCALES = {
    "none": None,
    "static": 2.0**10,
    "dynamic": DynamicLossScale(initial=2.0**10, growth_interval=4),
}


def data():
    rng = np.random.RandomState(0)
    X = rng.randn(80, 6).astype("float32")
    y = ((X[:, 0] > 0).astype("float32") + (X[:, 1] > 0.5)).astype("float32")
    return X, y


def network():
    data = mx.sym.Variable("data")
    hidden = mx.sym.FullyConnected(data, num_hidden=12, name="fc1")
    hidden = mx.sym.BatchNorm(hidden, fix_gamma=False, name="bn1")
    hidden = mx.sym.Activation(hidden, act_type="relu", name="relu1")
    logits = mx.sym.FullyConnected(hidden, num_hidden=3, name="fc2")
    return mx.sym.SoftmaxOutput(logits, name="softmax")


class Poisoned(mx.io.NDArrayIter):
    """Its ``bad``-th batch (counted over the epochs) has an inf in its last row."""

    def __init__(self, X, y, bad):
        super().__init__(X, y, BATCH, label_name="softmax_label")
        self.bad, self.count = bad, 0

    def next(self):
        batch = super().next()
        self.count += 1
        if self.count == self.bad:
            data = batch.data[0].copy()
            data[-1] = np.inf
            batch = mx.io.DataBatch([data], batch.label, pad=batch.pad)
        return batch


class Skips(Extension):
    def __init__(self):
        super().__init__(after_batch=True)
        self.skipped = []

    def do(self, which_callback, *args):
        self.skipped.append(self.main_loop.status.skipped_updates)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--scale", choices=sorted(SCALES), required=True)
    parser.add_argument("--poison", type=int, default=0, help="rank 1's batch with an inf")
    parser.add_argument("--update-on-workers", action="store_true", help="update_on_kvstore=False")
    parser.add_argument("--kvstore", default="dist_sync")
    args = parser.parse_args()
    kv = mx.kv.create(args.kvstore)
    X, y = shard_arrays(list(data()), kv)
    train = Poisoned(X, y, args.poison if kv.rank == 1 else 0)
    mx.random.seed(3)
    skips = Skips()
    loop = MainLoop(
        network(),
        train,
        optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
        initializer=mx.init.Xavier(),
        kvstore=kv,
        update_on_kvstore=False if args.update_on_workers else None,
        extensions=[FinishAfter(after_n_epochs=EPOCHS), skips],
        loss_scale=SCALES[args.scale],
    ).run()
    args_, _ = loop.get_params()
    np.savez(
        os.path.join(args.out, f"rank{kv.rank}.npz"), **{k: v.asnumpy() for k, v in args_.items()}
    )
    with open(os.path.join(args.out, f"rank{kv.rank}.json"), "w") as out:
        json.dump(
            {
                "update_on_kvstore": loop.update_on_kvstore,
                "loss_scale": loop.status.loss_scale,
                "skipped": skips.skipped,
                "updates": loop.status.updates_done,
            },
            out,
        )


if __name__ == "__main__":
    main()
