"""Prefetch: the same batches read ahead on a thread, and resumption as exact as without it."""

import gc
import threading
import time

import mxnet as mx
import numpy as np
import pytest
from checkpointing import assert_identical, make_loop, params_of
from conftest import TWO_CPUS, classification_data, initial_params, mlp

from mxoid import Evaluate, FinishAfter, MainLoop
from mxoid.data import Prefetch


class CountingIter(mx.io.DataIter):
    """Shuffles with NumPy's global generator at reset; counts the batches read."""

    def __init__(self, X, y, batch_size, sleep=0.0, fail_at=None):
        super().__init__(batch_size)
        self.X, self.y = X, y
        self.order = np.arange(len(X))
        self.cursor = 0
        self.reads = 0
        self.sleep, self.fail_at = sleep, fail_at

    @property
    def provide_data(self):
        return [mx.io.DataDesc("data", (self.batch_size, self.X.shape[1]))]

    @property
    def provide_label(self):
        return [mx.io.DataDesc("softmax_label", (self.batch_size,))]

    def reset(self):
        np.random.shuffle(self.order)
        self.cursor = 0

    def next(self):
        if self.cursor + self.batch_size > len(self.X):
            raise StopIteration
        self.reads += 1
        if self.reads == self.fail_at:
            raise OSError("image 17 cannot be decoded")
        time.sleep(self.sleep)
        rows = self.order[self.cursor : self.cursor + self.batch_size]
        self.cursor += self.batch_size
        return mx.io.DataBatch([mx.nd.array(self.X[rows])], [mx.nd.array(self.y[rows])], pad=0)


class StatefulIter(CountingIter):
    """An iterator that saves and restores its own position."""

    def state_dict(self):
        return {"order": self.order.tolist(), "cursor": self.cursor}

    def load_state_dict(self, state):
        self.order, self.cursor = np.array(state["order"]), state["cursor"]


class DeterministicIter(CountingIter):
    """Replayed on resumption (no state_dict); its resets depend on NumPy's state only."""

    resets_are_deterministic = True


def labels(iterator):
    return [batch.label[0].asnumpy().tolist() for batch in iterator]


def threads():
    return [t for t in threading.enumerate() if t.name == "mxoid-prefetch"]


def wait_until(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def ndarray_iter(X, y, **kwargs):
    kwargs = {"batch_size": 20, "shuffle": True, "label_name": "softmax_label", **kwargs}
    return mx.io.NDArrayIter(X, y, **kwargs)


# ------------------------------------------------------------ the same batches
@pytest.mark.parametrize("handle", ["pad", "discard", "roll_over"])
def test_same_batches_in_the_same_order_across_resets(handle):
    X, y = classification_data(n=110)
    np.random.seed(3)
    plain = ndarray_iter(X, y, last_batch_handle=handle)
    np.random.seed(3)
    wrapped = Prefetch(ndarray_iter(X, y, last_batch_handle=handle), depth=3)
    assert wrapped.provide_data == plain.provide_data
    assert wrapped.provide_label == plain.provide_label
    for epoch in range(3):
        assert labels(wrapped) == labels(plain)
        for iterator in (plain, wrapped):  # both shuffle from NumPy's generator
            np.random.seed(10 + epoch)
            iterator.reset()
    if handle != "roll_over":
        assert len(wrapped) == len(labels(plain))
    assert wait_until(lambda: not threads())


def test_reset_in_the_middle_of_an_epoch_drops_what_was_read_ahead():
    X, y = classification_data(n=200)
    np.random.seed(4)
    plain = CountingIter(X, y, 20)
    np.random.seed(4)
    wrapped = Prefetch(CountingIter(X, y, 20))
    for _ in range(2):
        assert next(wrapped).label[0].asnumpy().tolist() == next(plain).label[0].asnumpy().tolist()
    for iterator in (plain, wrapped):
        np.random.seed(9)
        iterator.reset()
    assert labels(wrapped) == labels(plain)


def test_reads_ahead_up_to_depth_and_no_further():
    X, y = classification_data(n=200)
    inner = CountingIter(X, y, 20)
    wrapped = Prefetch(inner, depth=3)
    assert inner.reads == 0  # nothing read before the first batch is asked for
    next(wrapped)
    assert wait_until(lambda: inner.reads == 1 + 3)
    time.sleep(0.3)
    assert inner.reads == 1 + 3
    next(wrapped)
    assert wait_until(lambda: inner.reads == 2 + 3)


def test_reading_overlaps_with_the_consumer():
    """A slow iterator: the consumer's own work and the reading go on at once."""
    X, y = classification_data(n=200)
    inner = CountingIter(X, y, 20, sleep=0.05)
    wrapped = Prefetch(inner, depth=2)
    next(wrapped)
    time.sleep(0.2)  # the consumer computing: the thread reads the next two meanwhile
    started = time.monotonic()
    next(wrapped)
    next(wrapped)
    assert time.monotonic() - started < 0.05  # both were ready (reading them takes 0.1 s)


def test_a_reading_error_is_raised_where_its_batch_is_asked_for():
    X, y = classification_data(n=200)
    wrapped = Prefetch(CountingIter(X, y, 20, fail_at=3))
    next(wrapped), next(wrapped)
    with pytest.raises(OSError, match="image 17 cannot be decoded") as info:
        next(wrapped)
    assert any(frame.name == "next" for frame in __import__("traceback").extract_tb(info.tb))
    assert wait_until(lambda: not threads())


def test_a_dropped_prefetch_stops_its_thread():
    X, y = classification_data(n=200)
    wrapped = Prefetch(CountingIter(X, y, 20))
    next(wrapped)
    assert threads()
    del wrapped
    gc.collect()
    assert wait_until(lambda: not threads())


def test_bad_arguments():
    X, y = classification_data(n=40)
    with pytest.raises(ValueError, match="depth must be an int >= 1, got 0"):
        Prefetch(ndarray_iter(X, y), depth=0)
    with pytest.raises(TypeError, match="Prefetch wraps an mx.io.DataIter, not list"):
        Prefetch([1, 2, 3])


# ------------------------------------------------------------ in training
def test_training_on_prefetched_batches_equals_training_without():
    X, y = classification_data(n=200)
    net = mlp()
    args = initial_params(net, (20, 10))
    results = []
    for wrap in (lambda it: it, Prefetch):
        np.random.seed(5)
        loop = MainLoop(
            net,
            wrap(ndarray_iter(X, y)),
            contexts=TWO_CPUS,
            arg_params=args,
            optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
            extensions=[
                FinishAfter(after_n_epochs=3),
                Evaluate({"valid": wrap(ndarray_iter(X[:60], y[:60], shuffle=False))}, "ce"),
            ],
        ).run()
        results.append((params_of(loop), loop.log.last("valid_cross_entropy")))
    assert_identical(results[0][0], results[1][0])
    assert results[0][1] == results[1][1]


FACTORIES = {
    "NDArrayIter": lambda X, y: Prefetch(ndarray_iter(X, y)),
    "NDArrayIter roll_over": lambda X, y: Prefetch(
        ndarray_iter(X[:190], y[:190], last_batch_handle="roll_over"), depth=4
    ),
    "own state": lambda X, y: Prefetch(StatefulIter(X, y, 20)),
    "replayed": lambda X, y: Prefetch(DeterministicIter(X, y, 20), depth=5),
}


@pytest.mark.parametrize("kind", sorted(FACTORIES))
@pytest.mark.parametrize("cut", [15, 20])  # in the middle of epoch 2, at its end
def test_a_checkpoint_keeps_the_batches_read_ahead(tmp_path, kind, cut):
    """Stopped at batch 15 with batches 16-17 (or more) read ahead, the resumed run trains
    on 16 next: it ends bit for bit where the uninterrupted run ends."""
    factory = FACTORIES[kind]
    full = make_loop(tmp_path / "full", FinishAfter(after_n_epochs=3), iterator_factory=factory)
    full.run()
    make_loop(tmp_path / "cut", FinishAfter(after_n_batches=cut), iterator_factory=factory).run()
    resumed = make_loop(
        tmp_path / "cut", FinishAfter(after_n_epochs=3), iterator_factory=factory, resume=True
    )
    assert resumed.status.iterations_done == cut
    resumed.run()
    assert resumed.status.iterations_done == full.status.iterations_done
    assert_identical(params_of(full), params_of(resumed))


def test_prefetched_ndarrayiter_trains_as_the_bare_one_through_a_resumption(tmp_path):
    bare = make_loop(tmp_path / "bare", FinishAfter(after_n_epochs=3)).run()
    factory = FACTORIES["NDArrayIter"]
    make_loop(tmp_path / "cut", FinishAfter(after_n_batches=13), iterator_factory=factory).run()
    resumed = make_loop(
        tmp_path / "cut", FinishAfter(after_n_epochs=3), iterator_factory=factory, resume=True
    ).run()
    assert_identical(params_of(bare), params_of(resumed))
