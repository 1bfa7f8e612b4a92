"""Helpers of the monitoring and metrics tests: data, a two-head network trained by a loop,
and the same metrics computed with NumPy and with MXNet's Module."""

import logging
import threading

import mxnet as mx
import numpy as np
from conftest import TWO_CPUS, classification_data, initial_params, two_heads

from mxoid import Extension, MainLoop
from mxoid.executor_manager import waiting

LEARNING = {"learning_rate": 0.05, "momentum": 0.9}


class Lines(logging.Handler):
    """A logging handler that keeps each message (what mx.mon.Monitor and Module.fit log)."""

    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def regression_target(X):
    return (0.5 * X[:, 0] - 0.3 * X[:, 1]).astype("float32")


_X, _Y = classification_data(n=300, seed=0)
SPLITS = {
    "train": slice(0, 100),
    "valid": slice(100, 184),
    "test": slice(184, 244),
    "other": slice(244, 300),
}


def dataset(split, n=None):
    """Rows of one split of the same blobs (the first n rows when n is given)."""
    rows = SPLITS[split]
    return _X[rows][:n], _Y[rows][:n]


def iterator(X, y, batch_size, **kwargs):
    return mx.io.NDArrayIter(
        X, {"softmax_label": y, "reg_label": regression_target(X)}, batch_size=batch_size, **kwargs
    )


def numpy_forward(params, X):
    """The two_heads network by hand: class probabilities and regression output."""
    p = {k: v.asnumpy().astype("float64") for k, v in params.items()}
    hidden = np.tanh(X @ p["fc1_weight"].T + p["fc1_bias"])
    logits = hidden @ p["cls_weight"].T + p["cls_bias"]
    logits -= logits.max(axis=1, keepdims=True)
    prob = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return prob, (hidden @ p["regfc_weight"].T + p["regfc_bias"])[:, 0]


def numpy_metrics(params, X, y):
    prob, reg = numpy_forward(params, X)
    error = regression_target(X) - reg
    return {
        "softmax_accuracy": np.mean(prob.argmax(axis=1) == y),
        "softmax_cross_entropy": np.mean(-np.log(prob[np.arange(len(y)), y.astype(int)] + 1e-12)),
        "reg_mse": np.mean(error**2),
        "reg_mae": np.mean(np.abs(error)),
    }


def module_accuracy(params, it):
    """Module.score's accuracy on the softmax output of two_heads."""
    module = mx.mod.Module(
        two_heads(),
        label_names=["softmax_label", "reg_label"],
        context=mx.cpu(),
        logger=logging.getLogger("quiet"),
    )
    module.bind(it.provide_data, it.provide_label, for_training=False)
    module.set_params(params, {})
    metric = mx.metric.Accuracy(output_names=["softmax_output"], label_names=["softmax_label"])
    return dict(module.score(it, metric))["accuracy"]


def two_head_loop(extensions, train=None):
    """A loop training two_heads on two CPU contexts (batches of 20 by default)."""
    if train is None:
        train = iterator(*dataset("train"), 20)
    net = two_heads()
    return MainLoop(
        net,
        train,
        contexts=TWO_CPUS,
        optimizer_params=dict(LEARNING),
        arg_params=initial_params(net, (20, 10)),
        extensions=extensions,
    )


class Check(Extension):
    """Calls ``check(loop)`` at the end of each epoch, after the extensions before it."""

    def __init__(self, check):
        super().__init__(after_epoch=True)
        self.check = check

    def do(self, which_callback, *args):
        self.check(self.main_loop)


# ----------------------------------------------------------------- Evaluate


# ------------------------------------------------------------ host syncs
def on_the_loops_threads() -> bool:
    """Whether this call runs for the test's loop: on the main thread, or on mxoid's waiter
    thread, which runs the main thread's engine waits (:mod:`mxoid.executor_manager.waiting`).
    Another thread of the test process (one an earlier test left, a loader's) is not the
    loop's."""
    current = threading.current_thread()
    return current is threading.main_thread() or current is waiting._waiter


class CountHostSyncs:
    """Counts asnumpy / asscalar / wait_to_read / waitall calls the loop makes
    (:func:`on_the_loops_threads`)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        for owner, name in (
            (mx.nd.NDArray, "asnumpy"),
            (mx.nd.NDArray, "asscalar"),
            (mx.nd.NDArray, "wait_to_read"),
            (mx.nd, "waitall"),
        ):
            monkeypatch.setattr(owner, name, self._counting(getattr(owner, name)))

    def _counting(self, original):
        def counted(*args, **kwargs):
            if on_the_loops_threads():
                self.calls += 1
            return original(*args, **kwargs)

        return counted


class SyncProbe(Extension):
    """Notes the sync count at the start of each epoch, after each batch and after each epoch."""

    def __init__(self, counter):
        super().__init__()
        self.counter, self.notes = counter, []

    def before_epoch(self):
        self.notes.append(("before_epoch", self.counter.calls))

    def after_batch(self, batch):
        self.notes.append(("after_batch", self.counter.calls))

    def after_epoch(self):
        self.notes.append(("after_epoch", self.counter.calls))
