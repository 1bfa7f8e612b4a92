"""Write your own extension: the gradient norm of every parameter, as training goes.

``GradientNorms`` reads the loop's state -- the gradients the executor
manager computed for the last batch (``main_loop.manager.grad_arrays``), the
parameter names, the optimizer's gradient scale and the status counters --
every N batches. It writes one record per parameter into the log
(``grad_norm_fc1_weight``...) and keeps its own file, a CSV with a line per
measurement, opened when training starts and closed when it ends, even on an
error. It shows both ways of writing an extension: firing conditions passed
to the constructor plus :meth:`do`, and overridden hooks for the file::

    python examples/custom_extension.py
    python examples/custom_extension.py --every 5 --contexts cpu:0,cpu:1

Uses scikit-learn's bundled digits (``pip install -e '.[examples]'``).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from typing import IO, Any, List, Optional, Sequence

import common  # noqa: I100 (the examples' shared module, beside this script)
import mxnet as mx

from mxoid import Extension, FinishAfter, JSONLinesLog, MainLoop, Printing, TrainingMonitoring


class GradientNorms(Extension):
    """Record the L2 norm of the gradient of every parameter, every N batches.

    The norm is that of the gradient of the mean loss over the batch (what
    the optimizer applies, before weight decay): the per-device gradients
    summed, times the optimizer's ``rescale_grad``. Reading it waits for
    the device, so it is worth measuring only every few batches.

    Parameters
    ----------
    path : str
        The CSV file: ``iteration,epoch,<parameter>...`` then a line per measurement.
    every_n_batches : int, default 10
    **kwargs
        Other firing conditions and options of :class:`mxoid.Extension`.

    Examples
    --------
    >>> GradientNorms("runs/grad_norms.csv", every_n_batches=50)
    """

    rank_zero_only = True  # a file written by one worker only, in distributed training

    def __init__(self, path: str, every_n_batches: int = 10, **kwargs: Any) -> None:
        super().__init__(every_n_batches=every_n_batches, **kwargs)
        self.path = path
        self.file: Optional[IO[str]] = None
        self.writer: Any = None

    # Hooks overridden for the file. Each calls super() so that firing
    # conditions given for that hook still work.
    def before_training(self) -> None:
        super().before_training()
        self._open()

    def on_resumption(self) -> None:
        super().on_resumption()
        self._open()

    def after_training(self) -> None:
        super().after_training()
        self._close()

    def on_error(self, exception: BaseException) -> None:
        super().on_error(exception)
        self._close()

    def _open(self) -> None:
        new = not os.path.exists(self.path)
        self.file = open(self.path, "a", newline="", encoding="utf-8")
        self.writer = csv.writer(self.file, lineterminator="\n")
        if new:
            self.writer.writerow(["iteration", "epoch", *self.main_loop.manager.param_names])

    def _close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    # The measurement, fired by the every_n_batches condition.
    def do(self, which_callback: str, *args: Any) -> None:
        loop = self.main_loop
        norms = self.gradient_norms()
        row = loop.log.current_row
        for name, norm in zip(loop.manager.param_names, norms):
            row[f"grad_norm_{name}"] = norm
        self.writer.writerow(
            [
                loop.status.iterations_done,
                loop.status.epochs_done,
                *(f"{norm:.6g}" for norm in norms),
            ]
        )
        self.file.flush()

    def gradient_norms(self) -> List[float]:
        """The norm of each parameter's batch gradient, in ``manager.param_names`` order."""
        loop = self.main_loop
        # With a local updater behind a kvstore, the kvstore has already
        # replaced every device's gradient by the sum over devices; otherwise
        # each device holds the gradient of its own share of the batch.
        summed = loop.kvstore is not None and not loop.update_on_kvstore
        scale = loop.optimizer.rescale_grad
        norms = []
        for grads in loop.manager.grad_arrays:  # one list per parameter: a gradient per device
            total = grads[0].copyto(mx.cpu())
            if not summed:
                for grad in grads[1:]:
                    total += grad.copyto(mx.cpu())
            norms.append(float(total.norm().asscalar()) * scale)
        return norms


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=common.HelpFormatter
    )
    common.add_common_arguments(
        parser, epochs=5, batch_size=32, learning_rate=0.05, output_dir="runs/custom_extension"
    )
    parser.add_argument(
        "--every", type=int, default=10, help="measure the gradient norms every this many batches"
    )
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    common.seed_everything(args.seed)
    splits = common.digits_splits(seed=args.seed)
    paths = common.fresh_output(args.output_dir, resume=False)
    norms_path = os.path.join(args.output_dir, "grad_norms.csv")
    if os.path.exists(norms_path):
        os.remove(norms_path)
    loop = MainLoop(
        common.mlp(hidden=(64,)),
        common.iterator(splits["train"], args.batch_size, shuffle=True),
        contexts=args.contexts,
        optimizer="sgd",
        optimizer_params={"learning_rate": args.learning_rate, "momentum": 0.9},
        initializer=mx.init.Xavier(),
        extensions=[
            FinishAfter(after_n_epochs=args.epochs),
            TrainingMonitoring("acc"),
            GradientNorms(norms_path, every_n_batches=args.every),
            JSONLinesLog(paths["log"]),
            Printing(),
        ],
    )
    loop.run()
    names = loop.manager.param_names
    print(
        "newest gradient norms: "
        + ", ".join(f"{name} {loop.log.last(f'grad_norm_{name}'):.4g}" for name in names)
    )
    print(f"gradient norms: {norms_path}; log: {paths['log']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
