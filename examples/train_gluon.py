"""Train a Gluon network with mxoid: the block, its loss and a DataLoader, as they are.

A Gluon ``HybridBlock`` (a small convolutional network with BatchNorm and Dropout, or
the model zoo's ResNet-18 for small images) learns scikit-learn's bundled digits
(1,797 8x8 images, no download) from a ``gluon.data.DataLoader`` whose transform
shifts each training image by up to a pixel at random. ``MainLoop(net, loader,
loss=...)`` traces the block, trains it with every extension (evaluation on
DataLoaders, checkpoints Gluon loads, early stopping, the log) and writes the trained
values back into the block, which then predicts the test split by itself::

    pip install -e '.[examples]'
    python examples/train_gluon.py                          # about 20 s on 2 CPU cores
    python examples/train_gluon.py --network resnet18 --contexts cpu:0,cpu:1
    python examples/train_gluon.py --workers 2              # the loader forks 2 workers

Each sample's random shift is drawn from a seed of its own (the run's seed, the epoch,
the sample), so a run gives the same numbers each time, with or without workers, and
``--resume`` continues a run exactly. A checkpoint folder holds ``net.params``
(``net.load_parameters``) and ``net-symbol.json`` (``gluon.SymbolBlock.imports``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")  # MXNet's notice of its MKLDNN backend

import common  # noqa: E402,I100 (the examples' shared module, beside this script)
import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from mxnet import gluon  # noqa: E402
from mxnet.gluon import nn  # noqa: E402
from mxnet.gluon.data import ArrayDataset, DataLoader  # noqa: E402

from mxoid import (  # noqa: E402
    Checkpoint,
    EarlyStopping,
    Evaluate,
    FinishAfter,
    JSONLinesLog,
    MainLoop,
    Printing,
    ProgressBar,
    TrainingMonitoring,
)

METRICS = {"output": "acc", "loss": "loss"}  # records <split>_accuracy and <split>_loss


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Records: train_/valid_/test_ accuracy and loss, per epoch.",
        formatter_class=common.HelpFormatter,
    )
    parser.add_argument("--network", choices=("convnet", "resnet18"), default="convnet")
    common.add_common_arguments(
        parser, epochs=20, batch_size=32, learning_rate=0.05, output_dir="runs/gluon"
    )
    parser.add_argument(
        "--workers", type=int, default=0, help="DataLoader worker processes (default: 0)"
    )
    parser.add_argument(
        "--patience", type=int, default=4, help="epochs without a lower valid loss (default: 4)"
    )
    parser.add_argument("--resume", action="store_true", help="continue the last run")
    return parser.parse_args(argv)


def network(name: str) -> gluon.HybridBlock:
    """The Gluon network, initialized as Gluon users do (deferred shapes)."""
    if name == "resnet18":
        net = gluon.model_zoo.vision.get_resnet(1, 18, classes=10, thumbnail=True)
    else:
        net = nn.HybridSequential()
        with net.name_scope():
            net.add(
                nn.Conv2D(32, kernel_size=3, padding=1),
                nn.BatchNorm(),
                nn.Activation("relu"),
                nn.MaxPool2D(pool_size=2),
                nn.Flatten(),
                nn.Dropout(0.2),
                nn.Dense(64, activation="relu"),
                nn.Dense(10),
            )
    net.initialize(mx.init.Xavier())
    return net


def shift(image: np.ndarray) -> np.ndarray:
    """Move an 8x8 digit by up to a pixel in each direction (zeros come in)."""
    dy, dx = np.random.randint(-1, 2, size=2)
    moved = np.roll(image.asnumpy() if hasattr(image, "asnumpy") else image, (dy, dx), (1, 2))
    if dy:
        moved[:, 0 if dy > 0 else -1, :] = 0
    if dx:
        moved[:, :, 0 if dx > 0 else -1] = 0
    return moved


def loaders(args: argparse.Namespace):
    """DataLoaders of the train (shuffled, shifted), valid and test splits."""
    splits = common.digits_splits(seed=args.seed)
    train = ArrayDataset(*splits["train"]).transform_first(shift)
    kept = dict(batch_size=args.batch_size, num_workers=args.workers)
    evaluation = {
        name: DataLoader(ArrayDataset(*splits[name]), batch_size=100) for name in ("valid", "test")
    }
    return DataLoader(train, shuffle=True, last_batch="rollover", **kept), evaluation, splits


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    common.seed_everything(args.seed)
    paths = common.fresh_output(args.output_dir, args.resume)
    train, evaluation, splits = loaders(args)
    net = network(args.network)
    loop = MainLoop(
        net,
        train,
        loss=gluon.loss.SoftmaxCrossEntropyLoss(),
        contexts=args.contexts,
        optimizer_params={"learning_rate": args.learning_rate, "momentum": 0.9, "wd": 1e-4},
        resume_from=paths["checkpoints"] if args.resume else None,
        extensions=[
            FinishAfter(after_n_epochs=args.epochs),
            TrainingMonitoring(METRICS),
            Evaluate(evaluation, METRICS),
            EarlyStopping("valid_loss", patience=args.patience),
            Checkpoint(paths["checkpoints"], keep_last=2, save_best_of="valid_accuracy"),
            JSONLinesLog(paths["log"]),
            Printing(),
            ProgressBar(),
        ],
    )
    loop.run()
    test_x, test_y = splits["test"]  # the block itself, trained: no loop needed to predict
    predicted = net(mx.nd.array(test_x)).asnumpy().argmax(axis=1)
    print(
        f"test accuracy {loop.log.last('test_accuracy'):.4f} (Evaluate), "
        f"{float((predicted == test_y).mean()):.4f} (net(x) after training), "
        f"after {loop.status.epochs_done} epochs\nlog: {paths['log']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
