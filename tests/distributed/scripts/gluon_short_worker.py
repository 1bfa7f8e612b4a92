"""A worker training a Gluon MLP on dist_sync from a DataLoader whose last batch is short.

Each worker reads its shard (:func:`mxoid.distributed.sharding.shard_arrays`, rows
``rank, rank + 2, ...``) through a ``DataLoader`` of :data:`BATCH` rows, the last batch of
:data:`SHORT` rows (``last_batch='keep'``). The test imports :func:`data`, :func:`build`
and :func:`train` to train the same model in one process, on every row, with batches of
``2 * BATCH`` rows (step ``k`` of the two workers covers the rows of step ``k`` there).
Writes ``<out>/rank<r>.npz`` (the final parameters, the servers' copy) and
``<out>/rank<r>.json`` (the update's settings).
"""

import argparse
import json
import os

import mxnet as mx
import numpy as np
from mxnet import gluon
from mxnet.gluon import nn

from mxoid import FinishAfter, MainLoop
from mxoid.distributed.sharding import shard_arrays

BATCH, SHORT, WHOLE_BATCHES, EPOCHS = 8, 3, 4, 3
SAMPLES = 2 * (WHOLE_BATCHES * BATCH + SHORT)  # two workers' shards
SGD = {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3}


def data():
    rng = np.random.RandomState(0)
    X = rng.randn(SAMPLES, 6).astype("float32")
    y = ((X[:, 0] > 0).astype("float32") + (X[:, 1] > 0.5)).astype("float32")
    return X, y


def build():
    net = nn.HybridSequential(prefix="dist_")
    with net.name_scope():
        net.add(nn.Dense(12, activation="relu"), nn.Dense(3))
    mx.random.seed(3)
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 6)))
    return net


def train(X, y, batch_size, kvstore=None, update_on_kvstore=None):
    """Train :func:`build`'s network on ``(X, y)`` in order; return the loop and the net."""
    net = build()
    loader = gluon.data.DataLoader(gluon.data.ArrayDataset(X, y), batch_size, last_batch="keep")
    loop = MainLoop(
        net,
        loader,
        loss=gluon.loss.SoftmaxCrossEntropyLoss(),
        optimizer_params=dict(SGD),
        kvstore=kvstore,
        update_on_kvstore=update_on_kvstore,
        extensions=[FinishAfter(after_n_epochs=EPOCHS)],
    )
    loop.run()
    return loop, net


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--update-on-workers", action="store_true", help="update_on_kvstore=False")
    args = parser.parse_args()
    kv = mx.kv.create("dist_sync")
    X, y = shard_arrays(list(data()), kv)
    loop, net = train(X, y, BATCH, kv, False if args.update_on_workers else None)
    params = {name: p.data().asnumpy() for name, p in net.collect_params().items()}
    np.savez(os.path.join(args.out, f"rank{kv.rank}.npz"), **params)
    update = loop.update
    with open(os.path.join(args.out, f"rank{kv.rank}.json"), "w") as out:
        json.dump(
            {
                "update_on_kvstore": update.update_on_kvstore,
                "scales_on_workers": bool(update.server_gradients),
                "rescale_grad": update.optimizer.rescale_grad,
                "steps": loop.status.updates_done,
            },
            out,
        )


if __name__ == "__main__":
    main()
