"""A training loop of your own, from mxoid's pieces: two optimizers for two parameter groups.

``MainLoop`` takes one optimizer. Fine-tuning often wants two: a small learning
rate for a network's body, a larger one (or another rule) for its new head. This
script writes the loop by hand from the pieces MainLoop is built of (the split
of MXNet's ``_train_multi_device`` "so they can be reused"):

- ``DataParallelExecutorManager``: one executor per device, each batch split;
- ``create_kvstore``, ``kvstore_keys``, ``initialize_kvstore``: the kvstore that sums
  the devices' gradients (None on one device);
- ``create_optimizer``: the rescaling and the index map the update functions use;
- ``update_params``: sum the gradients through the kvstore, then one local
  updater per device; here once per parameter group, each with its optimizer.

The body (``fc1``, ``fc2``) trains with SGD and momentum, the head (``fc3``) with
Adam, on scikit-learn's digits (nothing to download)::

    pip install -e '.[examples]'
    python examples/own_loop.py                          # one CPU context
    python examples/own_loop.py --contexts cpu:0,cpu:1   # each batch split over two

Each epoch prints the valid accuracy, computed on an executor set of the
manager (it shares the parameters and memory of the training executors).
"""

from __future__ import annotations

import argparse
from typing import Dict, List, Optional, Sequence

import common  # noqa: I100 (the examples' shared module, beside this script)
import mxnet as mx
import numpy as np

from mxoid import DataParallelExecutorManager
from mxoid.update import (
    create_kvstore,
    create_optimizer,
    initialize_kvstore,
    kvstore_keys,
    update_params,
)

HEAD = ("fc3_weight", "fc3_bias")


def network() -> mx.sym.Symbol:
    data = mx.sym.flatten(mx.sym.var("data"))
    for index, width in enumerate((64, 32), start=1):
        data = mx.sym.relu(mx.sym.FullyConnected(data, num_hidden=width, name=f"fc{index}"))
    logits = mx.sym.FullyConnected(data, num_hidden=10, name="fc3")
    return mx.sym.SoftmaxOutput(logits, name="softmax")


def train(args: argparse.Namespace) -> Dict[str, object]:
    common.seed_everything(args.seed)
    splits = common.digits_splits()
    train_iter = common.iterator(splits["train"], args.batch_size, shuffle=True)
    valid_iter = common.iterator(splits["valid"], args.batch_size)
    contexts = common.parse_contexts(args.contexts)
    net = network()
    manager = DataParallelExecutorManager(
        net, contexts, train_iter.provide_data, train_iter.provide_label
    )
    initializer = mx.init.Xavier()
    params = {}
    for name, arrays in zip(manager.param_names, manager.param_arrays):
        params[name] = mx.nd.zeros(arrays[0].shape)
        initializer(mx.init.InitDesc(name), params[name])
    manager.set_params(params)

    # The kvstore sums the devices' gradients; the optimizers run on each device.
    kvstore, _ = create_kvstore("local", len(contexts), update_on_kvstore=False)
    keys = kvstore_keys(kvstore, manager.param_names)
    if kvstore is not None:  # None on one device: nothing to sum
        initialize_kvstore(kvstore, manager.param_arrays, params, manager.param_names, False, keys)
    groups = []
    body = [n for n in manager.param_names if n not in HEAD]
    for names, optimizer, settings in (
        (body, "sgd", {"learning_rate": args.lr, "momentum": 0.9, "wd": 1e-4}),
        (list(HEAD), "adam", {"learning_rate": args.head_lr}),
    ):
        index = [manager.param_names.index(name) for name in names]
        optimizer = create_optimizer(
            optimizer,
            settings,
            symbol=net,
            param_names=names,  # the indices update_params gives this group's updater
            num_devices=len(contexts),
            batch_size=args.batch_size,
            kvstore=kvstore,
            update_on_kvstore=False,
        )
        groups.append(
            (
                [manager.param_arrays[i] for i in index],
                [manager.grad_arrays[i] for i in index],
                mx.optimizer.get_updater(optimizer),
                [keys[i] for i in index],
            )
        )

    valid = manager.executor_set(valid_iter.provide_data, valid_iter.provide_label)
    accuracy = 0.0
    for epoch in range(args.epochs):
        train_iter.reset()
        for batch in train_iter:
            manager.load_data_batch(batch)
            manager.forward(is_train=True)
            manager.backward()
            for param_arrays, grad_arrays, updater, group_keys in groups:
                update_params(
                    param_arrays, grad_arrays, updater, len(contexts), kvstore, group_keys
                )
        accuracy = evaluate(manager, valid, valid_iter)
        print(f"epoch {epoch + 1}/{args.epochs}: valid accuracy {accuracy:.3f}", flush=True)
    return {"valid_accuracy": accuracy, "initial": params, "trained": manager.get_params()[0]}


def evaluate(manager: DataParallelExecutorManager, executors, iterator) -> float:
    """Accuracy over the real samples of ``iterator`` (padding left out)."""
    manager.synchronize()  # no evaluation while a training step is in flight
    iterator.reset()
    correct, total = 0, 0
    for batch in iterator:
        executors.load_data_batch(batch)
        executors.forward(is_train=False)
        labels = batch.label[0].asnumpy()
        predicted = np.concatenate(
            [out.asnumpy().argmax(axis=1) for out in executors.outputs["softmax"]]
        )
        real = executors.batch_size - (batch.pad or 0)
        correct += int((predicted[:real] == labels[:real]).sum())
        total += real
    return correct / total


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", default="cpu:0", help="e.g. cpu:0,cpu:1")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05, help="the body's SGD learning rate")
    parser.add_argument("--head-lr", type=float, default=0.005, help="the head's Adam rate")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> Dict[str, object]:
    return train(parse_args(argv))


if __name__ == "__main__":
    main()
