"""FusedUpdater computes what the stock updater does: bit for bit, or within rounding."""

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS, classification_data, initial_params, mlp

from mxoid import Extension, FinishAfter, MainLoop
from mxoid.update.fused_updater import FusedSGDUpdater, FusedUpdater, fused_kernel

NAMES = ["fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"]
SHAPES = [(16, 10), (16,), (3, 16), (3,)]


def make_optimizer(name="sgd", **params):
    params = {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3, "rescale_grad": 1 / 8, **params}
    # sym=mlp(): biases get no weight decay, as MXNet decides from the symbol.
    return mx.optimizer.create(name, sym=mlp(), param_idx2name=dict(enumerate(NAMES)), **params)


def run(updater, steps=5, batched=True, keys=None, set_lr=None):
    rng = np.random.RandomState(0)
    weights = [mx.nd.array(rng.uniform(-1, 1, s)) for s in SHAPES]
    for step in range(steps):
        grads = [mx.nd.array(rng.uniform(-1, 1, s)) for s in SHAPES]
        if set_lr is not None and step == 2:
            updater.optimizer.set_learning_rate(set_lr)
        indices = keys or list(range(len(NAMES)))
        if batched:
            updater(indices, grads, weights)
        else:
            for index, grad, weight in zip(indices, grads, weights):
                updater(index, grad, weight)
    return [w.asnumpy() for w in weights]


@pytest.mark.parametrize("params", [{}, {"clip_gradient": 0.05}, {"wd": 0.0}])
@pytest.mark.parametrize("batched", [True, False])
def test_bit_identical_to_the_stock_updater(params, batched):
    stock = run(mx.optimizer.get_updater(make_optimizer(**params)), batched=batched)
    updater = FusedSGDUpdater(make_optimizer(**params))
    fused = run(updater, batched=batched)
    assert len(updater._plans) == len(NAMES)  # the fused path ran
    assert updater.optimizer.num_update == 5
    for a, b in zip(stock, fused):
        np.testing.assert_array_equal(a, b)


def test_bias_gets_no_weight_decay_and_lr_mult_applies():
    optimizer = make_optimizer(wd=0.5)
    optimizer.set_lr_mult({"fc2_weight": 0.0})
    initial = run(FusedSGDUpdater(make_optimizer(wd=0.5)), steps=0)
    fused = run(FusedSGDUpdater(optimizer))
    stock_optimizer = make_optimizer(wd=0.5)
    stock_optimizer.set_lr_mult({"fc2_weight": 0.0})
    stock = run(mx.optimizer.get_updater(stock_optimizer))
    np.testing.assert_array_equal(fused[2], initial[2])  # lr_mult 0: never moves
    for a, b in zip(stock, fused):
        np.testing.assert_array_equal(a, b)


def test_kvstore_string_keys_as_bytes_map_to_names():
    """The kvstore calls its updater with byte-string keys; weight decay must follow the names."""
    names = [name.encode() for name in NAMES]
    stock_optimizer = mx.optimizer.create(
        "sgd",
        learning_rate=0.1,
        momentum=0.9,
        wd=0.5,
        sym=mlp(),
        param_idx2name=dict(enumerate(NAMES)),
    )
    fused_optimizer = mx.optimizer.create(
        "sgd",
        learning_rate=0.1,
        momentum=0.9,
        wd=0.5,
        sym=mlp(),
        param_idx2name=dict(enumerate(NAMES)),
    )
    stock = run(mx.optimizer.get_updater(stock_optimizer), batched=False, keys=names)
    fused = run(FusedSGDUpdater(fused_optimizer), batched=False, keys=names)
    for a, b in zip(stock, fused):
        np.testing.assert_array_equal(a, b)


def test_learning_rate_set_during_training_is_used():
    stock = run(mx.optimizer.get_updater(make_optimizer()), set_lr=0.01)
    fused = run(FusedSGDUpdater(make_optimizer()), set_lr=0.01)
    for a, b in zip(stock, fused):
        np.testing.assert_array_equal(a, b)


def adam(**params):
    params = {"learning_rate": 0.01, "wd": 1e-3, "rescale_grad": 1 / 8, **params}
    return mx.optimizer.create("adam", sym=mlp(), param_idx2name=dict(enumerate(NAMES)), **params)


def nag(**params):
    return make_optimizer("nag", **params)


def sgd_with_scheduler(**params):
    scheduler = mx.lr_scheduler.MultiFactorScheduler(step=[2, 4], factor=0.5, base_lr=0.1)
    return make_optimizer(lr_scheduler=scheduler, **params)


FUSED = {
    "sgd momentum": (make_optimizer, "sgd_mom_update"),
    "nag momentum": (nag, "nag_mom_update"),
    "nag": (lambda **p: nag(momentum=0.0, **p), "sgd_update"),
    "adam": (adam, "adam_update"),
    "sgd momentum, scheduler": (sgd_with_scheduler, "sgd_mom_update"),
    "adam, scheduler": (
        lambda **p: adam(lr_scheduler=mx.lr_scheduler.FactorScheduler(2, 0.5, base_lr=0.01), **p),
        "adam_update",
    ),
}


@pytest.mark.parametrize("params", [{}, {"clip_gradient": 0.05}, {"wd": 0.0}])
@pytest.mark.parametrize("case", sorted(FUSED))
def test_every_fused_optimizer_is_bit_identical_to_the_stock_updater(case, params):
    build, kernel = FUSED[case]
    assert fused_kernel(build(**params)) == kernel
    stock_updater = mx.optimizer.get_updater(build(**params))
    stock = run(stock_updater, steps=6)
    updater = FusedUpdater(build(**params))
    fused = run(updater, steps=6)
    assert len(updater._plans) == len(NAMES)  # the fused path ran
    assert updater.optimizer.num_update == stock_updater.optimizer.num_update == 6
    assert updater.optimizer._index_update_count == stock_updater.optimizer._index_update_count
    for a, b in zip(stock, fused):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("params", [{}, {"clip_gradient": 0.05}, {"wd": 0.0}])
def test_sgd_without_momentum_matches_the_stock_updater_within_rounding(params):
    """sgd_update and MXNet's multi_sgd_update round differently: 1e-6 relative per step."""
    steps = 6
    stock = run(mx.optimizer.get_updater(make_optimizer(momentum=0.0, **params)), steps=steps)
    updater = FusedUpdater(make_optimizer(momentum=0.0, **params))
    fused = run(updater, steps=steps)
    assert len(updater._plans) == len(NAMES)
    for a, b in zip(stock, fused):
        np.testing.assert_allclose(a, b, rtol=1e-6 * steps, atol=1e-7 * steps)


def test_adam_lr_mult_and_learning_rate_set_during_training():
    def build():
        optimizer = adam()
        optimizer.set_lr_mult({"fc1_weight": 0.1, "fc2_weight": 0.0})
        return optimizer

    stock = run(mx.optimizer.get_updater(build()), set_lr=0.001)
    fused = run(FusedUpdater(build()), set_lr=0.001)
    initial = run(FusedUpdater(build()), steps=0)
    np.testing.assert_array_equal(fused[2], initial[2])
    for a, b in zip(stock, fused):
        np.testing.assert_array_equal(a, b)


def rmsprop():
    return mx.optimizer.create("rmsprop", learning_rate=0.01, param_idx2name=dict(enumerate(NAMES)))


@pytest.mark.parametrize(
    "build",
    [rmsprop, lambda: make_optimizer(multi_precision=True), lambda: adam(multi_precision=True)],
)
def test_other_optimizers_take_the_stock_path(build):
    assert fused_kernel(build()) is None
    stock = run(mx.optimizer.get_updater(build()))
    updater = FusedUpdater(build())
    fused = run(updater)
    assert not updater._plans
    for a, b in zip(stock, fused):
        np.testing.assert_array_equal(a, b)


def test_the_former_name_still_works():
    assert FusedSGDUpdater is FusedUpdater


@pytest.mark.parametrize("build", [make_optimizer, adam, nag])
def test_states_load_in_the_stock_updater_and_train_on_identically(build):
    """A checkpoint's optimizer states (Adam's moments, the update counts) load in Module."""
    fused = FusedUpdater(build())
    weights = run(fused, steps=3)
    saved = fused.get_states(dump_optimizer=True)
    stock = mx.optimizer.get_updater(build())
    stock.set_states(saved)
    assert stock.optimizer.num_update == 3
    assert stock.optimizer._index_update_count == fused.optimizer._index_update_count
    rng = np.random.RandomState(5)
    grads = [mx.nd.array(rng.uniform(-1, 1, s)) for s in SHAPES]
    after_stock = [mx.nd.array(w) for w in weights]
    after_fused = [mx.nd.array(w) for w in weights]
    stock(list(range(len(NAMES))), grads, after_stock)
    fused(list(range(len(NAMES))), grads, after_fused)
    for a, b in zip(after_stock, after_fused):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())


def test_states_round_trip_like_the_stock_updater():
    fused = FusedSGDUpdater(make_optimizer())
    run(fused, steps=3)
    saved = fused.get_states(dump_optimizer=True)
    stock = mx.optimizer.get_updater(make_optimizer())
    stock.set_states(saved)
    assert stock.optimizer.num_update == fused.optimizer.num_update == 3
    restored = FusedSGDUpdater(make_optimizer())
    restored.set_states(saved)
    for key in fused.states:
        np.testing.assert_array_equal(restored.states[key].asnumpy(), fused.states[key].asnumpy())


def kvstore_training(updater, steps=5):
    """Train NAMES on a 'local' kvstore over two devices; return both devices' weights."""
    contexts = [mx.cpu(0), mx.cpu(1)]
    rng = np.random.RandomState(0)
    kvstore = mx.kv.create("local")
    weights, grads = [], []
    for key, shape in enumerate(SHAPES):
        start = rng.uniform(-1, 1, shape)
        weights.append([mx.nd.array(start, ctx=c) for c in contexts])
        grads.append([mx.nd.zeros(shape, ctx=c) for c in contexts])
        kvstore.init(key, weights[key][0])
    kvstore._set_updater(updater)
    for step in range(steps):
        for key, shape in enumerate(SHAPES):
            for grad in grads[key]:  # the same arrays every step, as an executor's
                grad[:] = rng.uniform(-1, 1, shape)
            kvstore.pushpull(key, grads[key], out=weights[key])
        if step == 0 and isinstance(updater, FusedUpdater):  # as the loop at an epoch end
            mx.nd.waitall()
            updater.settle_buffers()
    return [[w.asnumpy() for w in pair] for pair in weights]


class CountingKernel:
    """The mx.nd kernel, counting its calls (those that did not take a prepared call)."""

    def __init__(self, function):
        self.function, self.calls = function, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.function(*args, **kwargs)


@pytest.mark.parametrize("build", [make_optimizer, adam, nag])
def test_on_a_kvstore_the_prepared_calls_serve_its_new_handles(build):
    """A kvstore passes new handles to its own buffers each step: the prepared call runs."""
    stock = kvstore_training(mx.optimizer.get_updater(build()))  # as kvstore.set_optimizer
    for kvstore_buffers, expected_kernel_calls in ((True, 0), (False, 4 * len(SHAPES))):
        updater = FusedUpdater(build(), kvstore_buffers=kvstore_buffers)
        updater._function = counting = CountingKernel(updater._function)
        fused = kvstore_training(updater)
        assert counting.calls == expected_kernel_calls
        assert updater.optimizer.num_update == 5
        for stock_pair, fused_pair in zip(stock, fused):
            for a, b in zip(stock_pair, fused_pair):
                np.testing.assert_array_equal(a, b)


def test_a_kvstore_updater_given_other_arrays_updates_those():
    """New storage for a key (not the kvstore's buffers): the mx.nd kernel on the arrays given."""
    fused = FusedUpdater(make_optimizer(), kvstore_buffers=True)
    fused._function = counting = CountingKernel(fused._function)
    stock = mx.optimizer.get_updater(make_optimizer())
    rng = np.random.RandomState(3)
    for _ in range(3):
        start, grad = rng.uniform(-1, 1, SHAPES[0]), rng.uniform(-1, 1, SHAPES[0])
        ours, theirs = mx.nd.array(start), mx.nd.array(start)  # new arrays every step
        fused(0, mx.nd.array(grad), ours)
        stock(0, mx.nd.array(grad), theirs)
        np.testing.assert_array_equal(ours.asnumpy(), theirs.asnumpy())
    assert counting.calls == 2  # the first step prepared on its arrays; then other storage


def test_a_fresh_kvstores_lazily_allocated_buffers_are_not_raced():
    """A new kvstore's buffers are allocated by the engine when its first copy runs; the
    updater must not allocate them from the Python thread meanwhile (as reading their data
    pointer too early would): fresh kvstores train as with the stock updater. (A race: this
    failed in five runs of six before the fix.)"""
    contexts = [mx.cpu(0), mx.cpu(1)]
    rng = np.random.RandomState(7)
    shapes = [(64, 256)] * 60
    starts = [rng.uniform(-1, 1, s) for s in shapes]
    grads = [[mx.nd.array(rng.uniform(-1, 1, s), ctx=c) for c in contexts] for s in shapes]

    def train(updater):
        kvstore = mx.kv.create("local")
        weights = [[mx.nd.array(w, ctx=c) for c in contexts] for w in starts]
        for key, pair in enumerate(weights):
            kvstore.init(key, pair[0])  # a copy into a buffer allocated when it runs
        kvstore._set_updater(updater)
        for step in range(3):
            for key, pair in enumerate(weights):
                kvstore.pushpull(key, grads[key], out=pair)
            if step == 0 and isinstance(updater, FusedUpdater):
                mx.nd.waitall()
                updater.settle_buffers()
        return [pair[1].asnumpy() for pair in weights]

    expected = train(mx.optimizer.get_updater(make_optimizer()))
    for _ in range(10):
        for ours, theirs in zip(
            train(FusedUpdater(make_optimizer(), kvstore_buffers=True)), expected
        ):
            np.testing.assert_array_equal(ours, theirs)


def test_kvstore_buffers_are_used_only_once_settled():
    """Until settle_buffers (after a wait for the engine), every call after the first takes the
    mx.nd kernel: nothing reads the pointers of buffers the engine may not have allocated."""
    updater = FusedUpdater(make_optimizer(), kvstore_buffers=True)
    updater._function = counting = CountingKernel(updater._function)
    kvstore_training(CallsOnly(updater), steps=3)
    assert counting.calls == 2 * len(SHAPES) and updater.buffers_to_settle
    mx.nd.waitall()
    updater.settle_buffers()
    assert not updater.buffers_to_settle


class CallsOnly:
    """An updater that forwards to another (so kvstore_training does not settle it)."""

    def __init__(self, updater):
        self.updater = updater

    def __call__(self, *args):
        self.updater(*args)


def test_the_loop_settles_the_kvstore_buffers_after_its_first_epoch():
    X, y = classification_data(n=100)
    net = mlp()
    counted = []

    class Count(Extension):
        def after_epoch(self):
            counted.append(counting.calls)

    loop = MainLoop(
        net,
        mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label"),
        contexts=TWO_CPUS,
        arg_params=initial_params(net, (20, 10)),
        optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
        extensions=[FinishAfter(after_n_epochs=3), Count()],
    )
    updater = loop.kvstore._updater
    assert isinstance(updater, FusedUpdater) and updater.kvstore_buffers
    updater._function = counting = CountingKernel(updater._function)
    loop.run()
    keys = len(loop.manager.param_names)
    assert counted == [4 * keys, 4 * keys, 4 * keys]  # epochs 2 and 3: prepared calls only
    assert not updater.buffers_to_settle


def _bulk_size() -> int:
    """The engine's bulk size on this thread now (MXNet returns the old one when it is set)."""
    size = mx.engine.set_bulk_size(0)
    mx.engine.set_bulk_size(size)
    return size


def test_engine_bulk_sets_the_size_and_puts_the_one_before_back():
    from mxoid.executor_manager.invoke import EngineBulk

    assert _bulk_size() == 0
    with EngineBulk(6):
        assert _bulk_size() == 6
        total = mx.nd.zeros((2,))
        for _ in range(4):
            total += 1  # held, then queued at the end of the block
    assert _bulk_size() == 0
    assert total.asnumpy().tolist() == [4.0, 4.0]


@pytest.mark.parametrize("build", [make_optimizer, adam, nag])
def test_a_steps_kernels_are_queued_as_one_engine_operation(build):
    """A step over a list of parameters queues its fused kernels in one bulk (one
    operation of MXNet's engine: each costs queuing, dependency tracking and a worker's
    pass), with the stock updater's results bit for bit."""
    updater = FusedUpdater(build())
    sizes = []
    update_one = updater._update_one

    def spy(*args):
        sizes.append(_bulk_size())
        update_one(*args)

    updater._update_one = spy
    mine = run(updater, steps=3)
    assert sizes == [len(NAMES)] * (3 * len(NAMES)) and _bulk_size() == 0
    stock = run(mx.optimizer.get_updater(build()), steps=3)
    for a, b in zip(mine, stock):
        np.testing.assert_array_equal(a, b)
