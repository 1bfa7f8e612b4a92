"""A worker training dist_worker.py's model with a loop written by hand from mxoid's pieces.

The same network, data shards, initial parameters and optimizer as dist_worker.py's
MainLoop, on ``dist_sync`` with the optimizer on the servers (MXNet's own
``set_optimizer``): ``<out>/rank<r>.npz`` holds the final parameters.
"""

import argparse
import os
import sys

import mxnet as mx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dist_worker  # noqa: E402

from mxoid import DataParallelExecutorManager  # noqa: E402
from mxoid.distributed.sharding import shard  # noqa: E402
from mxoid.update import (  # noqa: E402
    create_kvstore,
    create_optimizer,
    initialize_kvstore,
    kvstore_keys,
    update_params_on_kvstore,
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    kvstore, on_kvstore = create_kvstore("dist_sync", 1)
    train = shard(
        *dist_worker.data(200, seed=0), kvstore=kvstore, batch_size=10, label_name="softmax_label"
    )
    net = dist_worker.network()
    manager = DataParallelExecutorManager(net, [mx.cpu()], train.provide_data, train.provide_label)
    params = dist_worker.initial_params()
    manager.set_params(params)
    optimizer = create_optimizer(
        "sgd",
        dict(dist_worker.OPTIMIZER_PARAMS),
        symbol=net,
        param_names=manager.param_names,
        num_devices=1,
        batch_size=10,
        kvstore=kvstore,
        update_on_kvstore=on_kvstore,
    )
    keys = kvstore_keys(kvstore, manager.param_names)
    initialize_kvstore(kvstore, manager.param_arrays, params, manager.param_names, on_kvstore, keys)
    kvstore.set_optimizer(optimizer)
    for _ in range(args.epochs):
        train.reset()
        for batch in train:
            manager.load_data_batch(batch)
            manager.forward(is_train=True)
            manager.backward()
            update_params_on_kvstore(manager.param_arrays, manager.grad_arrays, kvstore, keys)
    trained = {k: v.asnumpy() for k, v in manager.get_params()[0].items()}
    np.savez(os.path.join(args.out, f"rank{kvstore.rank}.npz"), **trained)
    print(f"rank {kvstore.rank} done", flush=True)


if __name__ == "__main__":
    main()
