"""A worker that only reduces: writes ``<out>/sums<rank>.json`` with what allgather and
allreduce_sums returned for values float32 cannot hold (issue 39.3).

Run under ``mxoid launch -n 2`` (dist_sync, one server); the values are made from the rank
so that the test can compute the exact answers in one process.
"""

import json
import os
import sys

import mxnet as mx
import numpy as np

from mxoid.distributed import allgather, allreduce_sums
from mxoid.distributed.servers import set_server_optimizer


def values(rank):
    """This rank's values: counts above 2^24, and sums whose float32 rounding differs."""
    return np.array([2.0**24 + 1 + rank, 2.0**53 - 1 - rank, 0.1 * (rank + 1), 1e-30, 3e38 * 10])


def main(out):
    kvstore = mx.kv.create("dist_sync")
    set_server_optimizer(kvstore, None, 0)
    mine = values(kvstore.rank)
    gathered = allgather(kvstore, "exact", mine)
    sums = allreduce_sums(kvstore, "exact_sums", mine)
    count = allreduce_sums(kvstore, "count", 2**24 + 1)
    report = {
        "rank": kvstore.rank,
        "gathered": gathered.view(np.uint64).tolist(),
        "sums": sums.view(np.uint64).tolist(),
        "count": float(count),
    }
    with open(os.path.join(out, f"sums{kvstore.rank}.json"), "w") as file:
        json.dump(report, file)


if __name__ == "__main__":
    main(sys.argv[1])
