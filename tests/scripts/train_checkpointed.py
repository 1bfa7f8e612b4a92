"""A training run with checkpoints, driven by the tests as a separate process.

Prints ``BATCH <n>`` after every batch and ``WRITING <path>`` when a
checkpoint write begins, so a test can send signals at chosen moments.
With ``--slow-write S`` each checkpoint write pauses S seconds half-way
(after the parameters, before the manifest), to widen the window in which
a test kills the process mid-write.
"""
import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from conftest import classification_data, initial_params, mlp  # noqa: E402

import mxoid.checkpoint  # noqa: E402
from mxoid import Checkpoint, Extension, FinishAfter, JSONLinesLog, MainLoop  # noqa: E402


class Announce(Extension):
    def __init__(self, delay):
        super().__init__()
        self.delay = delay

    def after_batch(self, batch):
        print(f"BATCH {self.main_loop.status.iterations_done}", flush=True)
        time.sleep(self.delay)


def slow_down_writes(seconds):
    original = mxoid.checkpoint._fsync_file

    def fsync_slowly(path):
        if path.endswith(".params"):
            print(f"WRITING {path}", flush=True)
            time.sleep(seconds)
        original(path)

    mxoid.checkpoint._fsync_file = fsync_slowly


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
    args = parser.parse_args()
    if args.slow_write:
        slow_down_writes(args.slow_write)
    X, y = classification_data(n=200)
    np.random.seed(5)
    train = mx.io.NDArrayIter(X, y, batch_size=20, shuffle=True, label_name="softmax_label")
    net = mlp()
    loop = MainLoop(net, train, contexts=[mx.cpu(0), mx.cpu(1)], optimizer="sgd",
                    optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
                    arg_params=initial_params(net, (20, 10)),
                    extensions=[FinishAfter(after_n_epochs=args.epochs), Announce(args.delay),
                                Checkpoint(args.directory, every_n_batches=args.every_n_batches,
                                           keep_last=2),
                                *([JSONLinesLog(args.log)] if args.log else [])],
                    resume_from=args.directory if args.resume else None)
    loop.run()
    if args.output:
        np.savez(args.output, **{k: v.asnumpy() for k, v in loop.get_params()[0].items()})
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
