"""The digits example as a distributed job: several workers and a parameter server.

Run it under the launcher, which starts a scheduler, the servers and the
workers on this machine (each worker runs this script)::

    mxoid launch -n 2 -- python examples/distributed.py
    python -m mxoid.distributed.launch -n 2 -s 1 --timeout 600 -- \\
        python examples/distributed.py --epochs 10

Each worker trains on its own equal share of the training split
(``mxoid.shard``), with gradients summed on the server (``dist_sync``: two
workers with batch 32 train like one process with batch 64). Evaluation
sums its totals over the workers, so every worker records the same
accuracies -- and EarlyStopping stops them all at the same epoch. Printing,
the progress bar, checkpoints and the JSON-lines log run on rank 0 only.

Uses scikit-learn's bundled digits (``pip install -e '.[examples]'``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

import common  # noqa: I100 (the examples' shared module, beside this script)
import mxnet as mx
import train_digits

from mxoid import shard

NOT_LAUNCHED = (
    "this script is a worker of a distributed job: run it with the launcher, e.g.\n"
    "  mxoid launch -n 2 -- python {script}"
)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=common.HelpFormatter
    )
    train_digits.add_arguments(parser)
    parser.add_argument("--kvstore", choices=("dist_sync", "dist_async"), default="dist_sync")
    parser.set_defaults(output_dir="runs/distributed")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if os.environ.get("DMLC_ROLE") != "worker":
        print("error: " + NOT_LAUNCHED.format(script=sys.argv[0]), file=sys.stderr)
        return 2
    kv = mx.kv.create(args.kvstore)  # first: the scheduler assigns the rank
    common.seed_everything(args.seed)
    splits = common.digits_splits(seed=args.seed)
    # Rank 0 writes the log and checkpoints; it alone clears the previous run's.
    paths = common.fresh_output(args.output_dir, resume=kv.rank != 0)
    train = shard(
        *splits["train"],
        kvstore=kv,
        batch_size=args.batch_size,
        shuffle=True,
        label_name="softmax_label",
    )
    evaluation = {
        name: shard(*splits[name], kvstore=kv, batch_size=50, label_name="softmax_label")
        for name in ("valid", "test")
    }
    loop = train_digits.build_loop(args, train, evaluation, paths, kvstore=kv)
    loop.run()
    print(
        f"worker {kv.rank} of {kv.num_workers}: test accuracy "
        f"{loop.log.last('test_accuracy'):.4f} after {loop.status.epochs_done} epochs",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
