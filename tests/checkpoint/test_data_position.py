"""How many batches an epoch of an iterator has, when it can tell."""

import mxnet as mx
import numpy as np

from mxoid.data.position import batches_per_epoch


def test_batches_per_epoch():
    X = np.zeros((25, 2))
    assert batches_per_epoch(mx.io.NDArrayIter(X, batch_size=10)) == 3
    assert batches_per_epoch(mx.io.NDArrayIter(X, batch_size=10, last_batch_handle="discard")) == 2
    rolling = mx.io.NDArrayIter(X, batch_size=10, last_batch_handle="roll_over")
    assert batches_per_epoch(rolling) is None
    assert batches_per_epoch(mx.io.ResizeIter(mx.io.NDArrayIter(X, batch_size=10), 7)) == 7
    assert batches_per_epoch(object()) is None
