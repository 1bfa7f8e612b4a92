"""One network, two heads: the digit's class, and the mean intensity of its pixels.

A shared hidden layer feeds a softmax head (``softmax``: which digit, 0-9)
and a linear-regression head (``intensity``: the mean pixel value of the
image, in [0, 1]), grouped with ``mx.sym.Group``. Metrics are bound to each
output by name -- accuracy and cross-entropy for the class, MSE and MAE for
the intensity -- on the training batches and on two evaluation iterators
(valid and test, with batch sizes unlike training's and a padded last
batch). Records are named ``<iterator>_<output>_<metric>``, e.g.
``valid_softmax_accuracy`` and ``test_intensity_mae``::

    python examples/multi_output.py
    python examples/multi_output.py --contexts cpu:0,cpu:1 --epochs 30

Uses scikit-learn's bundled digits (``pip install -e '.[examples]'``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, Optional, Sequence

import common  # noqa: I100 (the examples' shared module, beside this script)
import mxnet as mx
import numpy as np

from mxoid import Evaluate, FinishAfter, JSONLinesLog, MainLoop, Printing, TrainingMonitoring

METRICS = {"softmax": ["acc", "ce"], "intensity": ["mse", "mae"]}


def two_heads(num_hidden: int = 64, num_classes: int = 10) -> mx.sym.Symbol:
    """A shared ReLU layer, then a softmax head and a linear-regression head."""
    data = mx.sym.Flatten(mx.sym.Variable("data"))
    hidden = mx.sym.Activation(
        mx.sym.FullyConnected(data, num_hidden=num_hidden, name="fc1"),
        act_type="relu",
        name="relu1",
    )
    digit = mx.sym.SoftmaxOutput(
        mx.sym.FullyConnected(hidden, num_hidden=num_classes, name="class_fc"), name="softmax"
    )
    intensity = mx.sym.LinearRegressionOutput(
        mx.sym.FullyConnected(hidden, num_hidden=1, name="intensity_fc"), name="intensity"
    )
    return mx.sym.Group([digit, intensity])


def two_label_iterator(
    images: np.ndarray, digits: np.ndarray, batch_size: int, shuffle: bool = False
) -> mx.io.NDArrayIter:
    """Labels named after the outputs: 'softmax_label' (the digit), 'intensity_label'."""
    intensity = images.reshape(len(images), -1).mean(axis=1, keepdims=True)
    labels: Dict[str, np.ndarray] = {"softmax_label": digits, "intensity_label": intensity}
    return mx.io.NDArrayIter(
        images, labels, batch_size=batch_size, shuffle=shuffle, last_batch_handle="pad"
    )


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=common.HelpFormatter
    )
    common.add_common_arguments(
        parser, epochs=15, batch_size=32, learning_rate=0.05, output_dir="runs/multi_output"
    )
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    common.seed_everything(args.seed)
    splits = common.digits_splits(seed=args.seed)
    paths = common.fresh_output(args.output_dir, resume=False)
    train = two_label_iterator(*splits["train"], batch_size=args.batch_size, shuffle=True)
    evaluation = {
        "valid": two_label_iterator(*splits["valid"], batch_size=64),
        "test": two_label_iterator(*splits["test"], batch_size=100),
    }
    loop = MainLoop(
        two_heads(),
        train,
        contexts=args.contexts,
        optimizer="sgd",
        optimizer_params={"learning_rate": args.learning_rate, "momentum": 0.9},
        initializer=mx.init.Xavier(),
        extensions=[
            FinishAfter(after_n_epochs=args.epochs),
            TrainingMonitoring(METRICS),
            Evaluate(evaluation, metrics=METRICS),
            JSONLinesLog(paths["log"]),
            Printing(every_n_epochs=5, after_epoch=False),
        ],
    )
    loop.run()
    shown = ("softmax_accuracy", "intensity_mae")
    print(f"{'':8}" + "".join(f"{name:>22}" for name in shown))
    for prefix in ("train", "valid", "test"):
        values = [loop.log.last(f"{prefix}_{name}") for name in shown]
        print(f"{prefix:8}" + "".join(f"{value:>22.4f}" for value in values))
    print(f"log: {os.path.join(args.output_dir, 'log.jsonl')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
