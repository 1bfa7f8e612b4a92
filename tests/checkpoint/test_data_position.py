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


def test_a_replay_from_a_checkpoint_keeping_the_last_reset_states_only_is_warned_of():
    """mxoid 0.4 kept the random states of the last reset only: replaying two resets from it
    cannot be exact, and says so."""
    import sys
    import warnings

    import pytest

    from mxoid.checkpoint.random_state import get_random_states
    from mxoid.data.position import DataPosition

    sys.path.insert(0, __file__.rsplit("/", 2)[0])
    from buckets import PairKeyIter, bucket_iter

    position = DataPosition(PairKeyIter(bucket_iter()))
    old = {"kind": "replay", "epoch_start_random": get_random_states(), "shapes": None}
    with pytest.warns(UserWarning, match="keeps the random states of its last reset only"):
        position.restore(old, epochs_done=2, epoch_started=True, batches_done_in_epoch=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # each reset's own states: nothing to say
        new = {**old, "epoch_start_randoms": [get_random_states()] * 2}
        DataPosition(PairKeyIter(bucket_iter())).restore(new, 2, True, 0)
