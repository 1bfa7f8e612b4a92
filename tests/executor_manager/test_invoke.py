"""Prepared calls compute what MXNet's own calls compute, bit for bit."""

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS

from mxoid.executor_manager.invoke import PreparedCall, PreparedCopy, PreparedPushPull


def arrays(seed, shape=(7, 5), ctx=None):
    rng = np.random.RandomState(seed)
    return mx.nd.array(rng.uniform(-1, 1, shape), ctx=ctx or mx.cpu())


def test_a_prepared_update_equals_mx_nd_step_by_step_and_follows_new_settings():
    weight, grad, mom = arrays(0), arrays(1), mx.nd.zeros((7, 5))
    ours = [weight.copy(), mom.copy()]
    call = PreparedCall(
        "sgd_mom_update", [ours[0], grad, ours[1]], [ours[0]], momentum=0.9, rescale_grad=0.125
    )
    for step, lr in enumerate([0.1, 0.1, 0.05, 0.05]):
        mx.nd.sgd_mom_update(
            weight, grad, mom, out=weight, lr=lr, wd=1e-3, momentum=0.9, rescale_grad=0.125
        )
        call(lr=lr, wd=1e-3)
        np.testing.assert_array_equal(ours[0].asnumpy(), weight.asnumpy(), err_msg=str(step))
        np.testing.assert_array_equal(ours[1].asnumpy(), mom.asnumpy(), err_msg=str(step))
    assert call.handles == tuple(a.handle.value for a in (ours[0], grad, ours[1], ours[0]))


def test_a_prepared_call_reports_mxnet_errors():
    with pytest.raises(mx.base.MXNetError):
        PreparedCall("no_such_operator", [], [])
    total = mx.nd.zeros((3,))
    add = PreparedCall("broadcast_add", [total, mx.nd.ones((4,))], [total])
    with pytest.raises(mx.base.MXNetError):
        add()
        total.wait_to_read()


@pytest.mark.parametrize("keys", [[3, 4], ["fc1_weight", "fc1_bias"]])
def test_a_prepared_pushpull_equals_kvstore_pushpull(keys):
    results = []
    for prepared in (False, True):
        kvstore = mx.kv.create("local")
        grads = [[arrays(10 + i + k, ctx=c) for k, c in enumerate(TWO_CPUS)] for i in range(2)]
        outs = [[mx.nd.zeros((7, 5), ctx=c) for c in TWO_CPUS] for _ in range(2)]
        for key, out in zip(keys, outs):
            kvstore.init(key, out[0])
        calls = [
            PreparedPushPull(kvstore, key, grad, out, priority=-i)
            for i, (key, grad, out) in enumerate(zip(keys, grads, outs))
        ]
        for _ in range(2):
            for i, (key, grad, out) in enumerate(zip(keys, grads, outs)):
                if prepared:
                    calls[i]()
                else:
                    kvstore.pushpull(key, grad, out=out, priority=-i)
        results.append([o.asnumpy() for out in outs for o in out])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(results[1][0], results[1][1])  # both devices hold the sum


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_a_prepared_copy_equals_copyto_across_devices_and_types(dtype):
    """As NDArray.copyto: a new source each call, another device, the target's type."""
    rng = np.random.RandomState(2)
    target, reference = mx.nd.zeros((4, 3), ctx=TWO_CPUS[1]), mx.nd.zeros((4, 3), ctx=TWO_CPUS[1])
    copy = PreparedCopy(target)
    for _ in range(3):
        source = mx.nd.array(rng.uniform(-9, 9, (8, 3)), dtype=dtype)[2:6]  # a view
        copy(source)
        source.copyto(reference)
        np.testing.assert_array_equal(target.asnumpy(), reference.asnumpy())
    assert target.dtype == np.float32 and target.context == TWO_CPUS[1]


def test_a_prepared_copy_of_the_wrong_shape_raises_and_leaves_the_target():
    target = mx.nd.ones((2, 3))
    copy = PreparedCopy(target)
    with pytest.raises(mx.base.MXNetError):
        copy(mx.nd.zeros((3, 3)))
    np.testing.assert_array_equal(target.asnumpy(), np.ones((2, 3)))
