"""A job resumed by another number of workers (mxoid.main_loop.resizing): its helpers.

The jobs themselves: tests/distributed/test_resized_resumption.py.
"""

import mxnet as mx
import numpy as np
import pytest

from mxoid.checkpoint.format import ResumeError
from mxoid.data.position import DataPosition
from mxoid.main_loop.ranks import saved_workers
from mxoid.main_loop.resizing import derived_seed, follow_worker_count


def ranks(count):
    return [{"random": {"seed": rank}, "data_position": {}} for rank in range(count)]


def test_the_number_of_workers_that_saved_a_checkpoint():
    assert saved_workers({"rank_states": ranks(3)}) == 3
    assert saved_workers({"status": {"num_workers": 2}}) == 2  # an earlier mxoid's: rank 0's
    assert saved_workers({"status": {}}) == 1


def test_each_worker_gets_its_own_seed_derived_from_the_checkpoint():
    state = {"rank_states": ranks(2)}
    seeds = [derived_seed(state, rank, 3) for rank in range(3)]
    assert len(set(seeds)) == 3
    assert seeds == [derived_seed(state, rank, 3) for rank in range(3)]  # the same again
    assert derived_seed({"rank_states": ranks(4)}, 0, 3) != seeds[0]  # another checkpoint
    assert all(0 <= seed < 2**31 for seed in seeds)


def settings(rescale_grad):
    return {"type": "SGD", "settings": {"rescale_grad": rescale_grad, "momentum": 0.9}}


def test_the_default_rescaling_follows_the_number_of_workers():
    state = {"rank_states": ranks(2), "batch_size": 10, "accumulate_batches": 2}
    started = settings(1 / (2 * 10 * 2))["settings"]
    kept, rescale = follow_worker_count(state, started, settings(1 / (2 * 10 * 3)), 3)
    assert rescale == 1 / 60 and kept == {**started, "rescale_grad": 1 / 60}
    # the same number of workers, or a rescale_grad of one's own: the resume policy decides
    assert follow_worker_count(state, started, settings(1 / 40), 2) == (started, None)
    own = settings(0.5)["settings"]
    assert follow_worker_count(state, own, settings(0.5), 3) == (own, None)
    assert follow_worker_count(state, started, settings(0.5), 3) == (started, None)


def shard(rows, shuffle=False):
    data = np.arange(rows * 2, dtype="float32").reshape(rows, 2)
    return mx.io.NDArrayIter(data, np.zeros(rows), batch_size=10, shuffle=shuffle)


def test_a_resharded_iterator_is_checked_for_its_inputs_only():
    saved = DataPosition(shard(100)).state_dict()
    position = DataPosition(shard(66))
    with pytest.raises(ResumeError, match="it had 100 samples"):
        position.check(saved, "here")
    position.check(saved, "here", resharded=True)  # another share of the same data
    other = DataPosition(mx.io.NDArrayIter(np.zeros((66, 3)), np.zeros(66), batch_size=10))
    with pytest.raises(ResumeError, match="its inputs were"):
        other.check(saved, "here", resharded=True)


class Counting(mx.io.DataIter):
    """Neither an NDArrayIter nor one with state_dict: read to skip."""

    def __init__(self):
        super().__init__(batch_size=1)
        self.read = 0

    def reset(self):
        self.read = 0

    def next(self):
        if self.read == 5:
            raise StopIteration
        self.read += 1
        return mx.io.DataBatch([mx.nd.zeros((1, 1))])


@pytest.mark.parametrize("iterator", [shard(66, shuffle=True), Counting()], ids=["nd", "other"])
def test_skipping_the_rest_of_an_epoch(iterator):
    position = DataPosition(iterator)
    position.skip_epoch()
    assert list(iterator) == []
    position.reset()  # the next epoch: whole
    assert len(list(iterator)) == (7 if isinstance(iterator, mx.io.NDArrayIter) else 5)
