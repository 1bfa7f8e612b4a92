"""Extensions under mixed_precision='bfloat16': SWA's BatchNorm pass and Monitor read the
bfloat16 arrays of the converted graph as float32 numbers (by hand: NumPy with bfloat16's
rounding)."""

import mxnet as mx
import numpy as np
import pytest
from conftest import classification_data, initial_params

from mxoid import FinishAfter, MainLoop, Monitor, StochasticWeightAveraging
from mxoid.precision import bfloat16_support

NO_BFLOAT16 = bfloat16_support()
pytestmark = pytest.mark.skipif(
    NO_BFLOAT16 is not None,
    reason=f"this CPU does not compute bfloat16 in MXNet's MKLDNN ({NO_BFLOAT16})",
)


def bfloat16(a):
    """``a`` rounded to bfloat16 (to nearest, ties to even), as float32."""
    bits = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32)


def bn_net():
    data = mx.sym.Variable("data")
    hidden = mx.sym.FullyConnected(data, num_hidden=8, name="fc1")
    hidden = mx.sym.BatchNorm(hidden, name="bn1", fix_gamma=False)
    hidden = mx.sym.Activation(hidden, act_type="relu")
    return mx.sym.SoftmaxOutput(
        mx.sym.FullyConnected(hidden, num_hidden=3, name="fc2"), name="softmax"
    )


def loop_of(extensions, epochs=3):
    X, y = classification_data(n=120)
    net = bn_net()
    return MainLoop(
        net,
        mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label"),
        optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
        arg_params=initial_params(net, (20, 10)),
        extensions=[FinishAfter(after_n_epochs=epochs), *extensions],
        mixed_precision="bfloat16",
    )


def test_swa_recomputes_the_statistics_of_the_bfloat16_graph():
    """BatchNorm's input is the bfloat16 output of fc1: by hand, fc1 on bfloat16 inputs,
    rounded to bfloat16, its mean and variance on each batch of 30 averaged."""
    X, y = classification_data(n=120)
    bn_data = mx.io.NDArrayIter(X, y, batch_size=30, label_name="softmax_label")
    swa = StochasticWeightAveraging(start_epoch=1, data=bn_data)
    loop_of([swa]).run()
    arg, aux = ({k: v.asnumpy() for k, v in p.items()} for p in swa.get_params())
    weight, bias = bfloat16(arg["fc1_weight"]), bfloat16(arg["fc1_bias"])
    h = [bfloat16(bfloat16(X[i : i + 30]) @ weight.T + bias) for i in range(0, 120, 30)]
    for name, statistic in (("mean", np.mean), ("var", np.var)):
        expected = np.mean([statistic(b, axis=0) for b in h], 0)
        np.testing.assert_allclose(aux[f"bn1_moving_{name}"], expected, rtol=1e-4, atol=1e-6)


def test_monitor_records_numbers_for_the_bfloat16_arrays():
    """The first batch: its forward pass read fc1's initial weight through the cast."""
    monitor = Monitor(".*fc1_weight.*|fc1_output", every_n_batches=1)
    loop = loop_of([monitor, FinishAfter(after_n_batches=1)])
    initial = loop.get_params()[0]["fc1_weight"].asnumpy()
    row = loop.run().log[1]
    weight = loop.get_params()[0]["fc1_weight"].asnumpy()  # after the step

    def rms(a):
        return np.sqrt(np.mean(a.astype(np.float64) ** 2))

    assert row["monitor_fc1_weight_rms"] == pytest.approx(rms(weight), rel=1e-5)
    cast = row["monitor_fc1_weight_amp_cast_bfloat16_output_rms"]  # what fc1 computed with
    assert isinstance(cast, float) and cast == pytest.approx(rms(bfloat16(initial)), rel=1e-5)
    assert cast != pytest.approx(rms(initial), rel=1e-6)
    assert isinstance(row["monitor_fc1_output_rms"], float)
