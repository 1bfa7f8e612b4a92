"""Train with the recipes together: warmup + cosine, an EMA, and a checkpoint average.

LeNet on scikit-learn's bundled digits (split 70/15/15 into train, valid and
test, as ``examples/train_digits.py``), with three pieces of published
recipes (GluonCV's, Sockeye's, PyTorch's EMA callbacks):

- ``LearningRateSchedule(WarmupCosine(...))``: the rate rises linearly over the
  first ``--warmup-epochs``, then falls along a half cosine to 0 at the last step;
- ``ExponentialMovingAverage(decay)``: an average of the parameters after every
  step, evaluated with ``Evaluate(..., parameters=ema)``;
- a checkpoint every epoch, and, after training, the mean of the best
  ``--average`` of them by valid cross-entropy (``average_checkpoints``, as
  ``mxoid average DIR --best 3 --by valid_cross_entropy --min -o OUT``), written
  in MXNet's format and evaluated from those files (``mx.mod.Module.load``).

It prints the test accuracy of the final parameters, of the EMA and of the
checkpoint average, and how far each average moves it from the final one::

    pip install -e '.[examples]'
    python examples/recipes.py                         # a few seconds on two CPU cores
    python examples/recipes.py --contexts cpu:0,cpu:1 --epochs 20
    mxoid show runs/recipes/log.jsonl                  # the records per epoch

On the 270 test images one image is 0.0037 of accuracy: on the digits the three
are close, and which is ahead changes with ``--seed``; the averages matter more
where training is noisier (larger rates, smaller batches, longer runs).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Dict, Optional, Sequence

import common  # noqa: I100 (the examples' shared module, beside this script)
import mxnet as mx
import numpy as np

from mxoid import (
    Checkpoint,
    Evaluate,
    ExponentialMovingAverage,
    FinishAfter,
    JSONLinesLog,
    LearningRateSchedule,
    MainLoop,
    Printing,
    TrainingMonitoring,
    average_checkpoints,
)
from mxoid.checkpoint.averaging import choose_checkpoints, write_average
from mxoid.schedules import WarmupCosine


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Records: train_/valid_/test_ and ema_valid_/ema_test_ accuracy and "
        "cross_entropy, per epoch; the learning rate per step.",
        formatter_class=common.HelpFormatter,
    )
    common.add_common_arguments(
        parser, epochs=10, batch_size=32, learning_rate=0.1, output_dir="runs/recipes"
    )
    parser.add_argument(
        "--warmup-epochs",
        type=float,
        default=1.0,
        help="epochs of linear warmup before the cosine (default: %(default)s)",
    )
    parser.add_argument(
        "--ema-decay",
        type=float,
        default=0.99,
        help="the EMA's decay per step (default: %(default)s)",
    )
    parser.add_argument(
        "--average",
        type=int,
        default=3,
        metavar="N",
        help="average the best N checkpoints by valid cross-entropy (default: %(default)s)",
    )
    return parser.parse_args(argv)


def build_loop(
    args: argparse.Namespace,
    train: mx.io.DataIter,
    evaluation: Dict[str, mx.io.DataIter],
    paths: Dict[str, str],
    ema: ExponentialMovingAverage,
) -> MainLoop:
    """The digits loop with warmup + cosine, the EMA evaluated beside the parameters."""
    steps_per_epoch = math.ceil(train.num_data / args.batch_size)  # NDArrayIter pads the last
    total = args.epochs * steps_per_epoch
    warmup = max(1, min(total - 1, round(args.warmup_epochs * steps_per_epoch)))
    schedule = WarmupCosine(warmup=warmup, total=total, base_lr=args.learning_rate)
    ema_evaluation = {f"ema_{name}": iterator for name, iterator in evaluation.items()}
    extensions = [
        FinishAfter(after_n_epochs=args.epochs),
        LearningRateSchedule(schedule),
        ema,
        TrainingMonitoring(["acc", "ce"]),
        Evaluate(evaluation, metrics=["acc", "ce"]),
        Evaluate(ema_evaluation, metrics=["acc", "ce"], parameters=ema, name="ema"),
        Checkpoint(paths["checkpoints"], keep_last=None),  # every epoch's, to choose from
        JSONLinesLog(paths["log"]),
        Printing(),
    ]
    return MainLoop(
        common.network("lenet", image_size=8),
        train,
        contexts=args.contexts,
        optimizer="sgd",
        optimizer_params={"learning_rate": args.learning_rate, "momentum": 0.9, "wd": 1e-4},
        initializer=mx.init.Xavier(),
        extensions=extensions,
    )


def accuracy_of_files(prefix: str, split: common.Arrays, contexts: Sequence[mx.Context]) -> float:
    """The accuracy on ``split`` of the model in ``<prefix>-symbol.json``/``-0000.params``.

    ``Module.predict`` drops the samples NDArrayIter pads the last batch with
    (``Module.score`` would count them).
    """
    iterator = common.iterator(split, 100)
    module = mx.mod.Module.load(prefix, 0, context=list(contexts))
    module.bind(
        data_shapes=iterator.provide_data, label_shapes=iterator.provide_label, for_training=False
    )
    predicted = module.predict(iterator).asnumpy().argmax(axis=1)
    return float(np.mean(predicted == split[1]))


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.average < 1 or args.average > args.epochs:
        raise SystemExit(f"error: --average must be in 1..--epochs ({args.epochs})")
    common.seed_everything(args.seed)
    splits = common.digits_splits(seed=args.seed)
    paths = common.fresh_output(args.output_dir, resume=False)
    train = common.iterator(splits["train"], args.batch_size, shuffle=True)
    evaluation = {name: common.iterator(splits[name], 100) for name in ("valid", "test")}
    ema = ExponentialMovingAverage(decay=args.ema_decay)
    loop = build_loop(args, train, evaluation, paths, ema)
    loop.run()

    # The best N checkpoints by valid cross-entropy (never the test split), averaged.
    folders = choose_checkpoints(
        paths["checkpoints"], args.average, by="valid_cross_entropy", mode="min"
    )
    averaged = os.path.join(args.output_dir, "averaged")
    write_average(averaged, folders, average_checkpoints(folders))

    final = loop.log.last("test_accuracy")
    moving = loop.log.last("ema_test_accuracy")
    mean = accuracy_of_files(averaged, splits["test"], args.contexts)
    chosen = ", ".join(os.path.basename(folder) for folder in folders)
    print(f"test accuracy after {loop.status.epochs_done} epochs (warmup + cosine):")
    rows = [
        ("final parameters", final),
        (f"EMA (decay {args.ema_decay})", moving),
        (f"average of best {len(folders)}", mean),
    ]
    for label, accuracy in rows:
        added = f"  ({accuracy - final:+.4f})" if label != rows[0][0] else ""
        print(f"  {label:<22} {accuracy:.4f}{added}")
    print(f"averaged: {chosen}")
    print(f"written: {averaged}-symbol.json, {averaged}-0000.params (mx.mod.Module.load)")
    print(f"log: {paths['log']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
