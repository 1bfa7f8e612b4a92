"""Helpers for extension tests: a small loop, and an extension writing scripted records."""

import mxnet as mx
from conftest import classification_data, initial_params, mlp

from mxoid import Extension, MainLoop


def small_loop(
    extensions,
    n=100,
    batch_size=25,
    learning_rate=0.1,
    contexts=None,
    optimizer_params=None,
    **kwargs,
):
    """A MainLoop on the conftest MLP: n samples, n / batch_size batches per epoch, plain SGD."""
    X, y = classification_data(n=n)
    data = mx.io.NDArrayIter(X, y, batch_size=batch_size, label_name="softmax_label")
    net = mlp()
    return MainLoop(
        net,
        data,
        contexts=contexts,
        arg_params=initial_params(net, (batch_size, 10)),
        optimizer_params=optimizer_params or {"learning_rate": learning_rate},
        extensions=extensions,
        **kwargs,
    )


class Script(Extension):
    """Writes ``values[k]`` into record ``name`` at its k-th firing (after epochs by default)."""

    def __init__(self, name, values, **kwargs):
        kwargs.setdefault("after_epoch", True)
        super().__init__(**kwargs)
        self.record, self.values, self.fired = name, list(values), 0

    def do(self, which_callback, *args):
        if self.fired < len(self.values):
            self.main_loop.log.current_row[self.record] = self.values[self.fired]
        self.fired += 1
