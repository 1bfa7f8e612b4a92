"""Train LeNet (or an MLP) on MNIST, read from the four standard files.

DIR must hold ``train-images-idx3-ubyte.gz``, ``train-labels-idx1-ubyte.gz``,
``t10k-images-idx3-ubyte.gz`` and ``t10k-labels-idx1-ubyte.gz`` (as
published, gzip-compressed IDX); nothing is downloaded. The loop trains on
the 60,000 training images and evaluates on the 10,000 test images after
every epoch, on one device or several (``--contexts cpu:0,cpu:1``)::

    python examples/train_mnist.py --data-dir DIR                  # 1 epoch, a small LeNet
    python examples/train_mnist.py --data-dir DIR --contexts cpu:0,cpu:1
    python examples/train_mnist.py --data-dir DIR --network mlp
    python examples/train_mnist.py --data-dir DIR --epochs 10 --channels 20,50 --hidden 500 \\
        --lr-decay 0.8                                             # the full run: >= 99%

The defaults (one epoch of a LeNet with 16 and 32 filters) take about half a
minute on two CPU cores and reach about 98% test accuracy; the full run
(LeCun's sizes, ten epochs) reaches 99%.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

import common  # noqa: I100 (the examples' shared module, beside this script)
import mxnet as mx

from mxoid import (
    Checkpoint,
    Evaluate,
    FinishAfter,
    JSONLinesLog,
    LearningRateSchedule,
    MainLoop,
    Printing,
    ProgressBar,
    Timing,
    TrainingMonitoring,
)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=common.HelpFormatter
    )
    parser.add_argument(
        "--data-dir",
        required=True,
        metavar="DIR",
        help="folder holding the four MNIST *-idx?-ubyte.gz files",
    )
    parser.add_argument("--network", choices=("lenet", "mlp"), default="lenet")
    parser.add_argument(
        "--channels", default="16,32", help="filters of LeNet's two convolutions (LeCun's: 20,50)"
    )
    parser.add_argument(
        "--hidden", type=int, default=128, help="units of LeNet's hidden layer (LeCun's: 500)"
    )
    common.add_common_arguments(
        parser, epochs=1, batch_size=128, learning_rate=0.1, output_dir="runs/mnist"
    )
    parser.add_argument(
        "--lr-decay",
        type=float,
        default=1.0,
        help="multiply the learning rate by this after every epoch",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest checkpoint in OUTPUT_DIR/checkpoints",
    )
    args = parser.parse_args(argv)
    try:
        args.channels = tuple(int(c) for c in args.channels.split(","))
    except ValueError:
        parser.error(f"--channels takes two numbers such as 20,50, not {args.channels!r}")
    if len(args.channels) != 2:
        parser.error(f"--channels takes two numbers such as 20,50, not {args.channels}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    splits = common.read_mnist(args.data_dir)
    common.seed_everything(args.seed)
    paths = common.fresh_output(args.output_dir, args.resume)
    if args.network == "lenet":
        symbol = common.lenet(channels=args.channels, hidden=args.hidden)
    else:
        symbol = common.mlp()
    rate, decay = args.learning_rate, args.lr_decay
    extensions = [
        FinishAfter(after_n_epochs=args.epochs),
        LearningRateSchedule(lambda status: rate * decay**status.epochs_done, every="epoch"),
        TrainingMonitoring(["acc", "ce"]),
        Evaluate({"test": common.iterator(splits["test"], 1000)}, metrics=["acc", "ce"]),
        Timing(),
        Checkpoint(paths["checkpoints"], keep_last=1),
        JSONLinesLog(paths["log"]),
        Printing(),
        ProgressBar(),
    ]
    loop = MainLoop(
        symbol,
        common.iterator(splits["train"], args.batch_size, shuffle=True),
        contexts=args.contexts,
        optimizer="sgd",
        optimizer_params={"momentum": 0.9, "wd": 1e-4},
        initializer=mx.init.Xavier(),
        extensions=extensions,
        resume_from=paths["checkpoints"] if args.resume else None,
    )
    loop.run()
    print(
        f"test accuracy {loop.log.last('test_accuracy'):.4f} after {loop.status.epochs_done} "
        f"epochs on {len(args.contexts)} context(s); log: {paths['log']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
