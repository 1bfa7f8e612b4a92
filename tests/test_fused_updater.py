"""FusedSGDUpdater computes exactly what MXNet's stock updater does."""

import mxnet as mx
import numpy as np
import pytest
from conftest import mlp

from mxoid.fused_updater import FusedSGDUpdater

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


def adam():
    return mx.optimizer.create(
        "adam",
        learning_rate=0.01,
        rescale_grad=1 / 8,
        sym=mlp(),
        param_idx2name=dict(enumerate(NAMES)),
    )


def sgd_with_scheduler():
    return make_optimizer(lr_scheduler=mx.lr_scheduler.FactorScheduler(step=2, factor=0.5))


@pytest.mark.parametrize(
    "build",
    [adam, sgd_with_scheduler, lambda: make_optimizer("nag"), lambda: make_optimizer(momentum=0.0)],
)
def test_other_optimizers_take_the_stock_path(build):
    stock = run(mx.optimizer.get_updater(build()))
    updater = FusedSGDUpdater(build())
    fused = run(updater)
    assert not updater._plans
    for a, b in zip(stock, fused):
        np.testing.assert_array_equal(a, b)


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
