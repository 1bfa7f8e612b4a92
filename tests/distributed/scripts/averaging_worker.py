"""A worker of tests/distributed/test_averaging_distributed.py: EMA and SWA under dist_sync.

Trains dist_worker's MLP (with BatchNorm) on its shard, the servers running the optimizer,
with an ExponentialMovingAverage, a StochasticWeightAveraging (BatchNorm's statistics from
its own shard) and, on rank 0, a Checkpoint at the end. Writes ``<out>/rank<r>.npz``: the
parameters after every step (``step<i>_<name>``) and every epoch (``epoch<i>_<name>``), and
the averages (``ema_<name>``, ``swa_<name>``, ``swa_aux_<name>``).
"""

import argparse
import os
import sys

import mxnet as mx
import numpy as np
from dist_worker import OPTIMIZER_PARAMS, data

from mxoid import (
    Checkpoint,
    ExponentialMovingAverage,
    Extension,
    FinishAfter,
    MainLoop,
    StochasticWeightAveraging,
)
from mxoid.distributed.sharding import shard


def network() -> mx.sym.Symbol:
    hidden = mx.sym.FullyConnected(mx.sym.Variable("data"), num_hidden=8, name="fc1")
    hidden = mx.sym.BatchNorm(hidden, name="bn1", fix_gamma=False)
    hidden = mx.sym.Activation(hidden, act_type="relu")
    return mx.sym.SoftmaxOutput(
        mx.sym.FullyConnected(hidden, num_hidden=3, name="fc2"), name="softmax"
    )


def initial_params():
    rng = np.random.RandomState(1)
    shapes = {"fc1_weight": (8, 10), "fc1_bias": (8,), "fc2_weight": (3, 8), "fc2_bias": (3,)}
    params = {name: mx.nd.array(rng.uniform(-0.3, 0.3, shape)) for name, shape in shapes.items()}
    params.update(bn1_gamma=mx.nd.ones(8), bn1_beta=mx.nd.zeros(8))
    return params


class Trajectory(Extension):
    """The parameters before training, after every step and at every epoch end."""

    def __init__(self):
        super().__init__(priority=-1)
        self.steps, self.epochs = [], []

    def _read(self):
        return {k: v.asnumpy() for k, v in self.main_loop.get_params()[0].items()}

    def before_training(self):
        self.steps.append(self._read())

    def after_update(self):
        self.steps.append(self._read())

    def after_epoch(self):
        self.epochs.append(self._read())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    kv = mx.kv.create("dist_sync")
    X, y = data(120, seed=0)
    train = shard(X, y, kvstore=kv, batch_size=10, label_name="softmax_label")
    bn_data = shard(X, y, kvstore=kv, batch_size=20, label_name="softmax_label")
    trajectory = Trajectory()
    ema = ExponentialMovingAverage(decay=0.9)
    swa = StochasticWeightAveraging(start_epoch=1, data=bn_data)
    saving = Checkpoint(os.path.join(args.out, "run"), after_training=True, after_epoch=False)
    loop = MainLoop(
        network(),
        train,
        optimizer_params=dict(OPTIMIZER_PARAMS),
        arg_params=initial_params(),
        kvstore=kv,
        extensions=[FinishAfter(after_n_epochs=3), trajectory, ema, swa, saving],
    )
    loop.run()
    found = {}
    for kind, values in (("step", trajectory.steps), ("epoch", trajectory.epochs)):
        for index, params in enumerate(values):
            found.update({f"{kind}{index}_{name}": value for name, value in params.items()})
    for prefix, average in (("ema", ema), ("swa", swa)):
        found.update({f"{prefix}_{n}": v.asnumpy() for n, v in average.get_params()[0].items()})
    found.update({f"swa_aux_{n}": v.asnumpy() for n, v in swa.get_params()[1].items()})
    np.savez(os.path.join(args.out, f"rank{kv.rank}.npz"), **found)
    print(f"rank {kv.rank} done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
