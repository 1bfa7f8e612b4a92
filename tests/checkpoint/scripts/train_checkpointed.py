"""A training run with checkpoints, driven by the tests as a separate process.

Prints ``BATCH <n>`` after every batch and ``WRITING <path>`` when a
checkpoint write begins, so a test can send signals at chosen moments.
With ``--slow-write S`` each checkpoint write pauses S seconds half-way
(after the parameters, before the manifest), to widen the window in which
a test kills the process mid-write. ``--kill-at POINT --kill-batch N`` makes
the process SIGKILL itself at a chosen point of the save at batch N:
``manifest`` (everything written but the manifest), ``rename`` (the folder
complete, not yet renamed into place), ``saved`` (renamed into place, before
the log writer wrote the previous row), or ``retire`` (between the two
renames that replace ``best``). ``--prefetch N`` reads N batches ahead on a
background thread (``mxoid.Prefetch``).
"""

import argparse
import os
import signal
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from conftest import classification_data, initial_params, mlp  # noqa: E402

import mxoid.checkpoint.format  # noqa: E402
from mxoid import (
    Checkpoint,
    Evaluate,
    Extension,
    FinishAfter,
    JSONLinesLog,  # noqa: E402
    MainLoop,
    Prefetch,
)


class Announce(Extension):
    def __init__(self, delay):
        super().__init__()
        self.delay = delay

    def after_batch(self, batch):
        print(f"BATCH {self.main_loop.status.iterations_done}", flush=True)
        time.sleep(self.delay)


def slow_down_writes(seconds):
    original = mxoid.checkpoint.format._fsync_file

    def fsync_slowly(path):
        if path.endswith(".params"):
            print(f"WRITING {path}", flush=True)
            time.sleep(seconds)
        original(path)

    mxoid.checkpoint.format._fsync_file = fsync_slowly


def kill_at(point, batch):
    """SIGKILL this process at ``point`` of the checkpoint save of batch ``batch``."""
    state = {"batch": 0}
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)  # noqa: E731

    class Watch(Extension):
        def __init__(self):
            super().__init__(priority=-100)

        def after_batch(self, batch_):
            state["batch"] = self.main_loop.status.iterations_done

    class KillAfterSave(Extension):  # runs after Checkpoint (200), before the log writer
        def __init__(self):
            super().__init__(priority=500)

        def after_batch(self, batch_):
            if point == "saved" and state["batch"] == batch:
                die()

    if point in ("manifest", "rename"):
        original_dump, original_rename = mxoid.checkpoint.format.json.dump, os.rename

        def dump(obj, handle, **kwargs):
            if point == "manifest" and state["batch"] == batch and "files" in obj:
                die()
            return original_dump(obj, handle, **kwargs)

        def rename(source, target):
            if point == "rename" and state["batch"] == batch and ".tmp-" in source:
                die()
            return original_rename(source, target)

        mxoid.checkpoint.format.json.dump = dump
        mxoid.checkpoint.format.os.rename = rename
    if point == "retire":
        original = os.rename

        def rename(source, target):
            original(source, target)
            if state["batch"] >= batch and source.endswith("/best") and ".retired-" in target:
                die()

        mxoid.checkpoint.format.os.rename = rename
    return [Watch(), KillAfterSave()]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--every-n-batches", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to sleep per batch")
    parser.add_argument("--slow-write", type=float, default=0.0)
    parser.add_argument("--output", help="save the final parameters here (.npz)")
    parser.add_argument("--log", help="also write the log here (JSON lines)")
    parser.add_argument(
        "--best",
        action="store_true",
        help="evaluate after every epoch and keep the best checkpoint",
    )
    parser.add_argument("--kill-at", choices=("manifest", "rename", "saved", "retire"))
    parser.add_argument("--kill-batch", type=int, default=6)
    parser.add_argument(
        "--prefetch", type=int, default=0, help="read this many batches ahead (mxoid.Prefetch)"
    )
    args = parser.parse_args()
    if args.slow_write:
        slow_down_writes(args.slow_write)
    X, y = classification_data(n=200)
    np.random.seed(5)
    train = mx.io.NDArrayIter(X, y, batch_size=20, shuffle=True, label_name="softmax_label")
    if args.prefetch:
        train = Prefetch(train, depth=args.prefetch)
    net = mlp()
    extensions = [
        FinishAfter(after_n_epochs=args.epochs),
        Announce(args.delay),
        Checkpoint(
            args.directory,
            every_n_batches=args.every_n_batches,
            keep_last=2,
            save_best_of="valid_cross_entropy" if args.best else None,
        ),
        *([JSONLinesLog(args.log)] if args.log else []),
    ]
    if args.best:
        Xv, yv = (part[:60] for part in classification_data(n=200))  # improves as it trains
        extensions.append(
            Evaluate(
                {"valid": mx.io.NDArrayIter(Xv, yv, batch_size=20, label_name="softmax_label")},
                ["acc", "ce"],
                every_n_batches=5,
            )
        )
    if args.kill_at:
        extensions += kill_at(args.kill_at, args.kill_batch)
    loop = MainLoop(
        net,
        train,
        contexts=[mx.cpu(0), mx.cpu(1)],
        optimizer="sgd",
        optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
        arg_params=initial_params(net, (20, 10)),
        extensions=extensions,
        resume_from=args.directory if args.resume else None,
    )
    loop.run()
    if args.output:
        np.savez(args.output, **{k: v.asnumpy() for k, v in loop.get_params()[0].items()})
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
