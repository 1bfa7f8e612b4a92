"""The host's lead over the devices is bounded: training, evaluation and prediction queue at
most max_batches_ahead batches that the engine has not computed (each of which keeps its
input arrays alive), and without the bound they queue far more.

A custom operator that takes 5 ms on MXNet's engine makes the devices slower than the
host, so the loop runs ahead of them; the operator counts the forward passes the engine
has run."""

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS, classification_data, initial_params
from slow_ops import register_slow_identity

from mxoid import Extension, FinishAfter, MainLoop, Predictor
from mxoid.executor_manager.pacing import Pacer, auto_limit

FORWARDS = []  # one entry per forward pass of SlowCountedIdentity the engine has run


register_slow_identity("mxoid_slow_counted_identity", 0.005, FORWARDS)


def slow_net():
    data = mx.sym.Variable("data")
    slow = mx.sym.Custom(data, op_type="mxoid_slow_counted_identity")
    fc = mx.sym.FullyConnected(slow, num_hidden=3, name="fc")
    return mx.sym.SoftmaxOutput(fc, name="softmax")


class Lead(Extension):
    """At every batch: batches the loop has queued minus forward passes the engine ran."""

    def __init__(self, devices):
        super().__init__()
        self.devices, self.leads = devices, []

    def after_batch(self, batch):
        self.leads.append(self.main_loop.status.iterations_done - len(FORWARDS) // self.devices)


class Recording(mx.io.DataIter):
    """An NDArrayIter that records, at each batch it hands out, the lead of its consumer."""

    def __init__(self, X, y, batch_size, devices):
        super().__init__(batch_size)
        self.inner = mx.io.NDArrayIter(X, y, batch_size=batch_size, label_name="softmax_label")
        self.devices, self.handed, self.leads = devices, 0, []
        self.provide_data, self.provide_label = self.inner.provide_data, self.inner.provide_label

    def reset(self):
        self.inner.reset()  # (the leads recorded are kept: the consumer resets it after use)
        self.handed = 0
        FORWARDS.clear()

    def next(self):
        self.leads.append(self.handed - len(FORWARDS) // self.devices)
        batch = self.inner.next()
        self.handed += 1
        return batch


def loop_on(devices, limit, extensions=()):
    X, y = classification_data(n=600)  # 60 batches of 10 an epoch
    FORWARDS.clear()
    net = slow_net()
    return MainLoop(
        net,
        mx.io.NDArrayIter(X, y, batch_size=10, label_name="softmax_label"),
        contexts=TWO_CPUS if devices == 2 else [mx.cpu()],
        arg_params=initial_params(net, (10, 10)),
        max_batches_ahead=limit,
        extensions=[FinishAfter(after_n_epochs=1), *extensions],
    )


@pytest.mark.parametrize("devices", [1, 2])
def test_training_queues_at_most_max_batches_ahead(devices):
    bounded = Lead(devices)
    loop_on(devices, 8, [bounded]).run()
    assert max(bounded.leads) <= 8
    assert max(bounded.leads) >= 4  # it still runs ahead: the devices always have work
    free = Lead(devices)
    loop_on(devices, None, [free]).run()
    assert max(free.leads) > 30  # unbounded, the host queues most of the epoch


@pytest.mark.parametrize("limit", [8, None], ids=["bounded", "unbounded"])
def test_evaluation_and_prediction_keep_the_bound(tmp_path, limit):
    loop = loop_on(2, limit)
    loop.run()
    X, y = classification_data(n=600)
    for run in (
        lambda it: loop.score(it, ["acc"]),
        lambda it: loop.predict(it),
    ):
        recording = Recording(X, y, 10, 2)
        run(recording)
        if limit is None:
            assert max(recording.leads) > 30
        else:
            assert max(recording.leads) <= limit + 1  # counted before the batch is queued
    checkpoint = tmp_path / "model"
    mx.model.save_checkpoint(str(checkpoint), 1, loop.symbol, *loop.get_params())
    recording = Recording(X, y, 10, 1)
    Predictor(str(checkpoint), max_batches_ahead=limit).predict(recording)
    assert (max(recording.leads) <= 9) if limit else (max(recording.leads) > 30)


def test_a_bounded_loop_trains_what_an_unbounded_one_does():
    params = []
    for limit in (2, None):
        loop = loop_on(2, limit)
        loop.run()
        params.append({k: v.asnumpy() for k, v in loop.get_params()[0].items()})
    for name in params[0]:
        np.testing.assert_array_equal(params[0][name], params[1][name])


@pytest.mark.parametrize("bad", [0, 1, -3, 2.0, "8", "Auto", True])
def test_max_batches_ahead_must_be_an_int_of_at_least_two_auto_or_none(bad):
    with pytest.raises(ValueError, match="max_batches_ahead must be an int >= 2, 'auto'"):
        loop_on(1, bad)


def test_auto_lets_the_host_queue_64_mib_between_2_and_1024_batches():
    """The default: a long lead for small batches, a short one for large ones, each batch
    counted twice its inputs."""
    data = mx.sym.Variable("data")
    net = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(data, num_hidden=3), name="softmax")
    for shape, expected in (
        ((10, 10), 1024),  # 440 bytes a batch: the most
        ((4, 3, 256, 256), 64 * 2**20 // (2 * (4 * 3 * 256 * 256 * 4 + 4 * 4))),  # 10
        ((2, 1, 2048, 2048), 2),  # 32 MiB a batch: the least is 2
    ):
        X = np.zeros(shape, dtype=np.float32)
        y = np.zeros(shape[0], dtype=np.float32)
        loop = MainLoop(
            net,
            mx.io.NDArrayIter(X, y, batch_size=shape[0], label_name="softmax_label"),
            extensions=[FinishAfter(after_n_batches=1)],
        )
        assert loop.max_batches_ahead == "auto" and loop.training.pacer.limit == expected
        assert auto_limit(X.nbytes + y.nbytes) == expected


def test_a_pacer_marks_every_half_limit():
    output = mx.nd.zeros((4, 3))
    pacer = Pacer([output], limit=6)
    assert pacer.every == 3
    for _ in range(7):
        pacer.queued()
    assert pacer._pending == 1  # marked after the 3rd and the 6th batch: the second token


PEAK_SCRIPT = """
import sys
sys.path[:0] = sys.argv[1:4]  # the repository, benchmarks/, tests/
from harness import env
env.apply_thread_settings()  # before MXNet is imported
from harness import workload
import mxnet as mx
import numpy as np
from mxoid import FinishAfter, MainLoop
kind, limit = sys.argv[4], {"None": None, "auto": "auto"}.get(sys.argv[5], sys.argv[5])
limit = int(limit) if isinstance(limit, str) and limit != "auto" else limit
if kind == "slow":  # 120 batches of 32 images 3x88x88 (3 MB), a 5 ms operator each
    from slow_ops import register_slow_identity
    register_slow_identity("mxoid_slow_identity", 0.005, [])
    rng = np.random.default_rng(0)  # float32 drawn as such: no 720 MB float64 copy first
    X = rng.random((120 * 32, 3, 88, 88), dtype=np.float32)
    y = rng.integers(0, 3, 120 * 32).astype(np.float32)
    slow = mx.sym.Custom(mx.sym.Variable("data"), op_type="mxoid_slow_identity")
    net = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(slow, num_hidden=3, name="fc"), name="softmax")
    rows, epochs = 32, 1
else:  # an MLP 784-128-64-10, 128 batches of 128 rows (400 KB) an epoch
    X, y = workload.make_data("mlp", 128 * 128)
    net = workload.build_symbol("mlp")
    rows, epochs = 128, 2
loop = MainLoop(
    net,
    mx.io.NDArrayIter(X, y, batch_size=rows, label_name="softmax_label"),
    max_batches_ahead=limit,
    extensions=[FinishAfter(after_n_epochs=epochs)],
)
del X, y
mx.nd.waitall()
before = workload.rss_kib()
assert workload.reset_peak_rss()
loop.run()
print((workload.peak_rss_kib() - before) / 1024)
"""


def peak_growth_mib(kind, limit):
    """Peak resident memory (MiB over that before training) while ``kind`` trains with
    ``max_batches_ahead=limit``, in a process of its own: a process that trained before
    reuses the memory it kept, and would hide what the queue holds."""
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).parents[2]
    completed = subprocess.run(
        [sys.executable, "-c", PEAK_SCRIPT]
        + [str(root), str(root / "benchmarks"), str(root / "tests"), kind, str(limit)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return float(completed.stdout.split()[-1])


def test_the_bound_bounds_memory_where_an_unbounded_host_queues_the_epoch():
    """The README's claim: each queued batch keeps its inputs (120 batches of 3 MB on a
    network slower than its host), and 'auto' keeps 64 MiB (10 batches, counted twice)."""
    unbounded = peak_growth_mib("slow", None)
    auto = peak_growth_mib("slow", "auto")
    assert unbounded > 200  # most of the 120 batches' 360 MB queued at once
    assert auto < 64 + 40  # the inputs 'auto' allows, and the network's own arrays


def test_what_auto_queues_stays_within_64_mib_for_batches_of_400_kb():
    """Batches of 400 KB: a queued batch holds about twice its inputs there (the
    iterator's copy, and memory of the batches computed meanwhile not yet given back:
    1.9x measured), so 'auto' counts each twice (83 batches). What the lead holds, the
    peak over that of a lead of 2 batches, stays within 64 MiB; without the bound the
    host queues the epoch, and more than that."""
    least = peak_growth_mib("mlp", 2)
    auto = peak_growth_mib("mlp", "auto")
    unbounded = peak_growth_mib("mlp", None)
    assert auto - least < 64
    assert unbounded - least > 64
