"""Train a network whose batches take tens of milliseconds on the engine, the host far ahead.

Two epochs of 150 batches, no bound on the host's lead: the host queues an epoch in a
moment, then waits seconds at its end for the devices (TrainingMonitoring reads its
sums). Prints ``QUEUED <n>`` as the host starts batch n, and at the end
``STOPPED <iterations_done> <epochs_done>`` (on interruption, before exit status 130).
"""

import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

from mxoid import Extension, FinishAfter, MainLoop, TrainingMonitoring  # noqa: E402


class Say(Extension):
    def before_batch(self, batch):
        coming = self.main_loop.status.iterations_done + 1
        if coming % 10 == 0:
            print(f"QUEUED {coming}", flush=True)

    def after_training(self):
        status = self.main_loop.status
        print(f"STOPPED {status.iterations_done} {status.epochs_done}", flush=True)


# MXNet's own operators (no Python on the engine, as a custom operator would need): wide
# layers, tens of milliseconds a batch on one thread.
hidden = mx.sym.var("data")
for layer in range(2):
    hidden = mx.sym.relu(mx.sym.FullyConnected(hidden, num_hidden=1024, name=f"fc{layer}"))
net = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(hidden, num_hidden=2, name="out"), name="softmax")
X = np.random.RandomState(0).rand(150 * 64, 1024).astype("float32")
y = (X[:, 0] > 0.5).astype("float32")
MainLoop(
    net,
    mx.io.NDArrayIter(X, y, batch_size=64, label_name="softmax_label"),
    max_batches_ahead=None,  # the host queues the whole epoch, then waits at its end
    extensions=[FinishAfter(after_n_epochs=2), TrainingMonitoring("acc"), Say()],
).run()
