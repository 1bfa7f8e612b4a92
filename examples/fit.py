"""MXNet's example/image-classification/common/fit.py, on mxoid: the same options.

The script behind MXNet's ``train_mnist.py`` / ``train_cifar10.py`` /
``train_imagenet.py``, with the options that matter under the names it gives
them, each on its mxoid counterpart (the README's table "fit.py option ->
mxoid" lists them). It trains on scikit-learn's bundled digits, or on MNIST
with ``--data-dir``::

    python examples/fit.py                                     # LeNet on the digits, 5 epochs
    python examples/fit.py --gpus 0,1 --kv-store device        # as fit.py: GPUs 0 and 1
    python examples/fit.py --contexts cpu:0,cpu:1 --top-k 3 --monitor 50
    python examples/fit.py --lr 0.1 --lr-factor 0.1 --lr-step-epochs 3,4 --model-prefix runs/lenet
    python examples/fit.py --model-prefix runs/lenet --load-epoch 3 --num-epochs 6   # go on
    python examples/fit.py --pretrained runs/lenet --pretrained-epoch 6 \\
        --fixed-param-names conv1_weight,conv1_bias --num-epochs 2       # fine-tune

With ``--model-prefix P`` every ``--save-period`` epochs it writes what
fit.py's ``mx.callback.do_checkpoint`` writes (``P-symbol.json``,
``P-NNNN.params``, which Module and :class:`mxoid.Predictor` load), and
mxoid checkpoints in ``P-checkpoints/``, from which ``--load-epoch N``
resumes exactly (optimizer states, iterator position and all); with only
Module files there, ``--load-epoch N`` starts from ``P-NNNN.params`` at
epoch N, as fit.py does.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional, Sequence

import common  # noqa: I100 (the examples' shared module, beside this script)
import mxnet as mx

from mxoid import (
    Checkpoint,
    ClipGradientNorm,
    Evaluate,
    Extension,
    FinishAfter,
    JSONLinesLog,
    LearningRateSchedule,
    MainLoop,
    Monitor,
    Printing,
    TrainingMonitoring,
    load_params,
)
from mxoid.checkpoint.loading import checkpoint_of_epoch

INITIALIZERS = {
    # fit.py's default: Xavier(rnd_type='gaussian', factor_type='in', magnitude=2)
    "default": lambda: mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2),
    "xavier": lambda: mx.init.Xavier(),
    "msra": lambda: mx.init.MSRAPrelu(),
    "orthogonal": lambda: mx.init.Orthogonal(),
    "normal": lambda: mx.init.Normal(),
    "uniform": lambda: mx.init.Uniform(),
}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=common.HelpFormatter
    )
    data = parser.add_argument_group("data and network")
    data.add_argument("--data-dir", help="MNIST's four *-idx?-ubyte.gz files (default: the digits)")
    data.add_argument("--network", choices=("lenet", "mlp"), default="lenet")
    data.add_argument("--num-classes", type=int, default=10)
    data.add_argument("--batch-size", type=int, default=64)
    devices = parser.add_argument_group("devices")
    devices.add_argument(
        "--gpus", help="GPU ids as fit.py takes them, e.g. 0,1 (instead of --contexts)"
    )
    devices.add_argument(
        "--contexts",
        type=common.parse_contexts,
        default="cpu:0",  # a string default goes through parse_contexts too
        metavar="CTX,CTX",
        help="devices, e.g. cpu:0,cpu:1 (default: %(default)s)",
    )
    devices.add_argument(
        "--kv-store", default="local", help="kvstore type: local, device, dist_sync"
    )
    devices.add_argument(
        "--gc-type", default="none", choices=("none", "2bit"), help="gradient compression"
    )
    devices.add_argument("--gc-threshold", type=float, default=0.5)
    optimization = parser.add_argument_group("optimization")
    optimization.add_argument("--num-epochs", "--epochs", type=int, default=5)
    optimization.add_argument("--optimizer", default="sgd")
    optimization.add_argument("--lr", "--learning-rate", type=float, default=0.1)
    optimization.add_argument("--lr-factor", type=float, default=0.1)
    optimization.add_argument("--lr-step-epochs", default="", help="e.g. 30,60")
    optimization.add_argument("--mom", type=float, default=0.9, help="momentum (sgd, nag)")
    optimization.add_argument("--wd", type=float, default=1e-4)
    optimization.add_argument("--initializer", choices=sorted(INITIALIZERS), default="default")
    optimization.add_argument(
        "--accumulate-batches", type=int, default=1, help="sum k batches' gradients per step"
    )
    optimization.add_argument(
        "--max-grad-norm", type=float, help="clip the gradients by their global norm"
    )
    reporting = parser.add_argument_group("metrics and reports")
    reporting.add_argument("--top-k", type=int, default=0, help="also report top-k accuracy")
    reporting.add_argument("--loss", default="", help="also report these losses: ce, nll_loss")
    reporting.add_argument("--disp-batches", type=int, default=20)
    reporting.add_argument("--monitor", type=int, default=0, help="Monitor every N batches")
    saving = parser.add_argument_group("saving, resuming, fine-tuning")
    saving.add_argument("--model-prefix", help="save Module files and mxoid checkpoints here")
    saving.add_argument("--save-period", type=int, default=1)
    saving.add_argument("--load-epoch", type=int, help="resume from the model of this epoch")
    saving.add_argument("--pretrained", help="start from this model (prefix or checkpoint)")
    saving.add_argument("--pretrained-epoch", type=int)
    saving.add_argument(
        "--fixed-param-names", default="", help="comma-separated parameters never updated"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.gpus:
        args.contexts = [mx.gpu(int(i)) for i in args.gpus.split(",")]
    if args.load_epoch is not None and not args.model_prefix:
        parser.error("--load-epoch needs --model-prefix (where the models of each epoch are)")
    return args


class SaveModule(Extension):
    """What fit.py's ``mx.callback.do_checkpoint(prefix, period)`` writes, after each epoch."""

    def __init__(self, prefix: str, period: int) -> None:
        super().__init__(after_epoch=True)
        self.prefix, self.period = prefix, period

    def do(self, which_callback, *args):
        epoch = self.main_loop.status.epochs_done
        if epoch % self.period == 0:
            arg_params, aux_params = self.main_loop.get_params()
            mx.model.save_checkpoint(
                self.prefix, epoch, self.main_loop.symbol, arg_params, aux_params
            )


def pretrained_params(args: argparse.Namespace, symbol: mx.sym.Symbol, shape: tuple):
    """fit.py's --pretrained: the values whose shapes fit, the others drawn anew (a new head)."""
    arg_params, aux_params = load_params(args.pretrained, args.pretrained_epoch)
    arg_shapes, _, aux_shapes = symbol.infer_shape(data=shape)
    wanted = dict(zip(symbol.list_arguments(), arg_shapes))
    wanted.update(zip(symbol.list_auxiliary_states(), aux_shapes))
    redrawn = sorted(
        n for n, v in {**arg_params, **aux_params}.items() if n in wanted and v.shape != wanted[n]
    )
    if redrawn:
        print(f"pretrained {redrawn} have other shapes here: initialized anew")
    keep = {n: v for n, v in arg_params.items() if n not in redrawn}
    return keep, {n: v for n, v in aux_params.items() if n not in redrawn}


def metrics(args: argparse.Namespace) -> List:
    chosen: List = ["acc"]
    if args.top_k > 0:
        chosen.append(("top_k_accuracy", {"top_k": args.top_k}))
    chosen += [name for name in args.loss.split(",") if name]
    return chosen


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    common.seed_everything(args.seed)
    if args.data_dir:
        splits = common.read_mnist(args.data_dir)
        train_split, valid_split = splits["train"], splits["test"]
    else:
        splits = common.digits_splits(seed=args.seed)
        train_split, valid_split = splits["train"], splits["valid"]
    image_size = train_split[0].shape[-1]
    if args.network == "mlp":
        symbol = common.mlp(num_classes=args.num_classes)
    elif image_size <= 8:
        symbol = common.lenet(args.num_classes, channels=(16, 32), hidden=64, kernel=3)
    else:
        symbol = common.lenet(args.num_classes)
    train = common.iterator(train_split, args.batch_size, shuffle=True)
    valid = common.iterator(valid_split, args.batch_size)
    batches = -(-len(train_split[0]) // args.batch_size)
    steps_per_epoch = batches // args.accumulate_batches

    begin_epoch, resume_from, arg_params, aux_params = 0, None, None, None
    checkpoints = f"{args.model_prefix}-checkpoints" if args.model_prefix else None
    if args.load_epoch is not None:
        try:
            resume_from = checkpoint_of_epoch(checkpoints, args.load_epoch)
        except FileNotFoundError:  # Module files only: their parameters, as fit.py
            arg_params, aux_params = load_params(args.model_prefix, args.load_epoch)
            begin_epoch = args.load_epoch
    elif args.pretrained:
        arg_params, aux_params = pretrained_params(
            args, symbol, (args.batch_size,) + train_split[0].shape[1:]
        )

    # fit.py's _get_lr_scheduler: the rate drops by lr_factor at each of the step epochs.
    steps = [int(e) for e in args.lr_step_epochs.split(",") if e]
    rate = args.lr * args.lr_factor ** sum(1 for e in steps if e <= begin_epoch)
    schedule_steps = [steps_per_epoch * (e - begin_epoch) for e in steps if e > begin_epoch]
    if rate != args.lr:
        print(f"Adjust learning rate to {rate:e} for epoch {begin_epoch}")  # as fit.py says
    extensions = [
        FinishAfter(after_n_epochs=args.num_epochs - begin_epoch),
        TrainingMonitoring(metrics(args)),
        Evaluate({"valid": valid}, metrics(args)),
        Printing(every_n_batches=args.disp_batches),
    ]
    if schedule_steps:
        extensions.append(
            LearningRateSchedule(
                mx.lr_scheduler.MultiFactorScheduler(
                    step=schedule_steps, factor=args.lr_factor, base_lr=rate
                )
            )
        )
    if args.monitor > 0:
        extensions.append(Monitor(".*", every_n_batches=args.monitor))
    if args.max_grad_norm:
        extensions.append(ClipGradientNorm(args.max_grad_norm))
    if args.model_prefix:
        os.makedirs(os.path.dirname(os.path.abspath(args.model_prefix)), exist_ok=True)
        extensions += [
            SaveModule(args.model_prefix, args.save_period),
            Checkpoint(checkpoints, every_n_epochs=args.save_period, require_empty=False),
            JSONLinesLog(f"{args.model_prefix}-log.jsonl"),
        ]
    kvstore = mx.kv.create(args.kv_store)
    if args.gc_type != "none":
        kvstore.set_gradient_compression({"type": args.gc_type, "threshold": args.gc_threshold})
    optimizer_params = {"learning_rate": rate, "wd": args.wd}
    if args.optimizer in ("sgd", "nag", "dcasgd", "signum"):
        optimizer_params["momentum"] = args.mom
    loop = MainLoop(
        symbol,
        train,
        contexts=args.contexts,
        kvstore=kvstore,
        optimizer=args.optimizer,
        optimizer_params=optimizer_params,
        initializer=INITIALIZERS[args.initializer](),
        arg_params=arg_params,
        aux_params=aux_params,
        allow_extra=bool(args.pretrained),
        fixed_param_names=[n for n in args.fixed_param_names.split(",") if n],
        accumulate_batches=args.accumulate_batches,
        extensions=extensions,
        resume_from=resume_from,
    )
    loop.run()
    print(
        f"valid accuracy {loop.log.last('valid_accuracy'):.4f} after "
        f"{begin_epoch + loop.status.epochs_done} epochs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
