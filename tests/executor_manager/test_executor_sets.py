"""Executor sets: the manager's training set, and the sets bound on first use for other inputs,
which share its arrays (the same ones) and its memory pool."""

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS, json_from_fresh_python, mlp
from networks import network

from mxoid import DataParallelExecutorManager
from mxoid.executor_manager.initialization import fixed_gammas


def manager_of(symbol, batch_size, contexts, **kwargs):
    return DataParallelExecutorManager(
        symbol,
        contexts,
        [("data", (batch_size, 10))],
        [("softmax_label", (batch_size,))],
        **kwargs,
    )


@pytest.mark.parametrize("contexts", [[mx.cpu(0)], TWO_CPUS], ids=["one", "two"])
def test_a_second_shape_shares_the_same_arrays_and_is_bound_once(contexts):
    manager = manager_of(mlp(), 8, contexts)
    other = manager.executor_set([("data", (12, 10))], [("softmax_label", (12,))])
    assert other is manager.executor_set([("data", (12, 10))], [("softmax_label", (12,))])
    assert list(manager.executor_sets.values()) == [other]
    training = manager.training_set
    for device, executor in enumerate(other.executors):
        for name in manager.param_names:
            assert executor.arg_dict[name] is training.executors[device].arg_dict[name]
            assert executor.grad_dict[name] is training.executors[device].grad_dict[name]
        for name in manager.aux_names:
            assert executor.aux_dict[name] is training.executors[device].aux_dict[name]
    # The training set's own shapes get the training set.
    assert manager.executor_set([("data", (8, 10))], [("softmax_label", (8,))]) is training
    assert other.grad_arrays == [[None] * len(other.executors)] * len(manager.param_names)
    with pytest.raises(RuntimeError, match="forward passes only"):
        other.backward()


def test_a_set_of_its_own_key_and_a_set_for_a_bucket_like_key():
    manager = manager_of(mlp(), 8, [mx.cpu()])
    keyed = manager.executor_set([("data", (4, 10))], [("softmax_label", (4,))], key=("bucket", 4))
    assert manager.executor_sets == {("bucket", 4): keyed}


def test_values_set_through_the_manager_are_what_every_set_computes_with():
    manager = manager_of(mlp(), 8, TWO_CPUS)
    other = manager.executor_set([("data", (3, 10))], [("softmax_label", (3,))])
    rng = np.random.RandomState(0)
    params = {
        n: mx.nd.array(rng.randn(*a[0].shape))
        for n, a in zip(manager.param_names, manager.param_arrays)
    }
    manager.set_params(params)
    X = rng.randn(3, 10).astype("float32")
    other.load_data_batch(mx.io.DataBatch([mx.nd.array(X)], [mx.nd.zeros(3)]))
    other.forward(is_train=False)
    by_hand = mlp().bind(
        mx.cpu(), {**params, "data": mx.nd.array(X), "softmax_label": mx.nd.zeros(3)}
    )
    by_hand.forward(is_train=False)
    got = np.concatenate([a.asnumpy() for a in other.outputs["softmax"]])
    np.testing.assert_allclose(got, by_hand.outputs[0].asnumpy(), rtol=1e-5, atol=1e-7)
    assert len(other.executors) == 2 and other.valid_rows == [2, 1]


def test_fixed_gammas_are_never_shared_with_a_forward_only_set():
    """BatchNorm(fix_gamma=True) writes 1 into its gamma in every forward pass: an evaluation
    sharing the training gamma would change what the next update and checkpoint see."""
    net = network("resnet")
    fixed = fixed_gammas(net)
    assert fixed and all(name.endswith("gamma") for name in fixed)
    manager = DataParallelExecutorManager(
        net, [mx.cpu()], [("data", (4, 1, 8, 8))], [("softmax_label", (4,))]
    )
    for name in fixed:
        manager.param_arrays[manager.param_names.index(name)][0][:] = 0.5
    evaluation = manager.executor_set([("data", (4, 1, 8, 8))], [("softmax_label", (4,))])
    assert evaluation is not manager.training_set  # even at the training shapes
    evaluation.forward(is_train=False)
    mx.nd.waitall()
    for name in fixed:
        index = manager.param_names.index(name)
        assert np.all(manager.param_arrays[index][0].asnumpy() == 0.5)
        assert evaluation.param_arrays[index][0] is not manager.param_arrays[index][0]
    shared = [n for n in manager.param_names if n not in fixed]
    index = manager.param_names.index(shared[0])
    assert evaluation.param_arrays[index][0] is manager.param_arrays[index][0]


GROWTH = r"""
import json, sys
sys.path.insert(0, {tests!r})
import mxnet as mx
from networks import resnet20
from mxoid import DataParallelExecutorManager

def peak():  # MiB: the peak resident memory since reset_peak() (VmHWM)
    with open("/proc/self/status") as status:
        return next(int(ln.split()[1]) for ln in status if ln.startswith("VmHWM:")) / 1024

def reset_peak():  # the peak so far (a freed workspace of the backward pass) set aside
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")

net = resnet20()
manager = DataParallelExecutorManager(
    net, [mx.cpu()], [("data", (64, 3, 28, 28))], [("softmax_label", (64,))]
)
manager.forward(is_train=True); manager.backward(); mx.nd.waitall()
manager.forward(is_train=False); mx.nd.waitall()
reset_peak()
before = peak()
inputs = [("data", (48, 3, 28, 28))], [("softmax_label", (48,))]
if {shared}:
    other = manager.executor_set(*inputs)
else:  # executors of their own: the same graph, shapes and gradients, another pool
    other = DataParallelExecutorManager(net, [mx.cpu()], *inputs)
other.forward(is_train=False); mx.nd.waitall()
print(json.dumps(peak() - before))
"""


def test_a_set_for_a_smaller_batch_allocates_from_the_training_sets_pool():
    """Measured in fresh processes (peak RSS): a shared set at batch 48 beside ResNet-20's
    training set at batch 64 adds almost nothing; executors of their own add their memory."""
    import os

    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    shared = json_from_fresh_python(GROWTH.format(tests=tests, shared=True))
    own = json_from_fresh_python(GROWTH.format(tests=tests, shared=False))
    assert own > 20 and shared < 0.2 * own, (shared, own)
