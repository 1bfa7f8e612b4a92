"""A worker training the bucketing LSTM on dist_sync, its batches in buckets of its own.

Rank 0's batches are of buckets 4 and 8, rank 1's of 8 and 12, as many on each: every
worker takes the same steps. Writes ``<out>/rank<r>.npz`` and ``<out>/rank<r>.steps``.
"""

import argparse
import os
import sys

import mxnet as mx
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from buckets import Batches, initial_params, sym_gen_of, token_batches  # noqa: E402

from mxoid import FinishAfter, MainLoop  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    kv = mx.kv.create("dist_sync")
    lengths = (4, 8) if kv.rank == 0 else (8, 12)
    batches = [b for length in lengths for b in token_batches(4, 16, length, seed=kv.rank)]
    sym_gen = sym_gen_of()
    loop = MainLoop(
        sym_gen,
        Batches(batches),
        kvstore=kv,
        optimizer="sgd",
        optimizer_params={"learning_rate": 0.5, "momentum": 0.9},
        arg_params=initial_params(sym_gen),
        extensions=[FinishAfter(after_n_epochs=2)],
    ).run()
    params = {k: v.asnumpy() for k, v in loop.get_params()[0].items()}
    np.savez(os.path.join(args.out, f"rank{kv.rank}.npz"), **params)
    with open(os.path.join(args.out, f"rank{kv.rank}.steps"), "w") as out:
        out.write(f"{loop.status.updates_done} {sorted(k[1] for k in loop.manager.executor_sets)}")


if __name__ == "__main__":
    main()
