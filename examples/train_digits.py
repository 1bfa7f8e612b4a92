"""Train LeNet (or an MLP) on real handwritten digits, with no download.

The data is scikit-learn's bundled ``load_digits`` (1,797 8x8 images of the
digits 0-9), split 70/15/15 into train, valid and test. The loop evaluates
accuracy and cross-entropy on the valid and test splits after every epoch,
prints a report, shows a progress bar on a terminal, saves checkpoints (and
the best one by valid accuracy), stops early when the valid cross-entropy
stops improving, and writes every record to ``<output-dir>/log.jsonl``::

    pip install -e '.[examples]'
    python examples/train_digits.py                       # LeNet, one CPU context
    python examples/train_digits.py --contexts cpu:0,cpu:1 --network mlp
    python examples/train_digits.py --resume              # continue the last run
    mxoid show runs/digits/log.jsonl                      # the records per epoch
    mxoid plot runs/digits/log.jsonl -o curves.png        # learning curves

The defaults take a few seconds on two CPU cores and reach 97-99% test
accuracy (LeNet); every seed is fixed, so a run gives the same numbers each
time. ``examples/distributed.py`` trains the same loop under ``mxoid launch``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, Optional, Sequence

import common  # noqa: I100 (the examples' shared module, beside this script)
import mxnet as mx

from mxoid import (
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of the digits example (shared with examples/distributed.py)."""
    parser.add_argument("--network", choices=("lenet", "mlp"), default="lenet")
    common.add_common_arguments(
        parser, epochs=30, batch_size=32, learning_rate=0.05, output_dir="runs/digits"
    )
    parser.add_argument(
        "--patience",
        type=int,
        default=5,
        help="epochs without a better valid cross-entropy before stopping",
    )


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Records: train_/valid_/test_ accuracy and cross_entropy, per epoch.",
        formatter_class=common.HelpFormatter,
    )
    add_arguments(parser)
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest checkpoint in OUTPUT_DIR/checkpoints "
        "(otherwise a previous run there is replaced)",
    )
    return parser.parse_args(argv)


def build_loop(
    args: argparse.Namespace,
    train: mx.io.DataIter,
    evaluation: Dict[str, mx.io.DataIter],
    paths: Dict[str, str],
    **loop_options: Any,
) -> MainLoop:
    """The digits training loop on ``train``, evaluated on the ``evaluation`` iterators.

    ``paths`` are those of :func:`common.fresh_output`; ``loop_options`` go to
    MainLoop (``resume_from=``, ``kvstore=``...).
    """
    extensions = [
        FinishAfter(after_n_epochs=args.epochs),
        TrainingMonitoring(["acc", "ce"]),
        Evaluate(evaluation, metrics=["acc", "ce"]),
        EarlyStopping("valid_cross_entropy", patience=args.patience),
        Checkpoint(paths["checkpoints"], keep_last=2, save_best_of="valid_accuracy"),
        JSONLinesLog(paths["log"]),
        Printing(),
        ProgressBar(),
    ]
    return MainLoop(
        common.network(args.network, image_size=8),
        train,
        contexts=args.contexts,
        optimizer="sgd",
        optimizer_params={"learning_rate": args.learning_rate, "momentum": 0.9, "wd": 1e-4},
        initializer=mx.init.Xavier(),
        extensions=extensions,
        **loop_options,
    )


def summary(loop: MainLoop, log_path: str) -> str:
    """The closing lines: final accuracies, and how to look at the log."""
    log = loop.log
    return (
        f"test accuracy {log.last('test_accuracy'):.4f}, "
        f"valid accuracy {log.last('valid_accuracy'):.4f} "
        f"after {loop.status.epochs_done} epochs\n"
        f"log: {log_path}  (see it with: mxoid show {log_path}; "
        f"plot it with: mxoid plot {log_path} -o curves.png)"
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    common.seed_everything(args.seed)
    splits = common.digits_splits(seed=args.seed)
    paths = common.fresh_output(args.output_dir, args.resume)
    train = common.iterator(splits["train"], args.batch_size, shuffle=True)
    evaluation = {name: common.iterator(splits[name], 100) for name in ("valid", "test")}
    loop = build_loop(
        args, train, evaluation, paths, resume_from=paths["checkpoints"] if args.resume else None
    )
    loop.run()
    print(summary(loop, paths["log"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
