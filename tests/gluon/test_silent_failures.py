"""No silent wrong numbers with a Gluon block: each of these was a NaN, a wrong gradient or a
raw MXNet error, and is now a clear error naming the fix (or a right number)."""

import mxnet as mx
import numpy as np
import pytest
from conftest import classification_data
from mxnet import gluon
from mxnet.gluon import nn

from mxoid import DataCheck, Evaluate, FinishAfter, MainLoop, TrainingMonitoring
from mxoid.extensions.data_check import DataError


def dense():
    net = nn.HybridSequential()
    net.add(nn.Dense(8, activation="relu"), nn.Dense(3))
    net.initialize(mx.init.Xavier())
    return net


def loader(X, y, batch=16):
    return gluon.data.DataLoader(gluon.data.ArrayDataset(X, y), batch)


def loop(net, data, extensions=(), loss=None):
    return MainLoop(
        net,
        data,
        loss=loss or gluon.loss.SoftmaxCrossEntropyLoss(),
        extensions=[*extensions, FinishAfter(after_n_epochs=1)],
    )


@pytest.mark.parametrize("metric", ["ce", "nll_loss", "perplexity"])
def test_a_probability_metric_on_the_scores_is_refused_naming_the_loss_metric(metric):
    """'ce' on a block's scores recorded NaN: refused when the loop is built, naming 'loss'."""
    X, y = classification_data(64)
    for extension in (TrainingMonitoring(["acc", metric]), Evaluate({"v": loader(X, y)}, metric)):
        with pytest.raises(ValueError, match=r"reads probabilities.*the metric 'loss'"):
            loop(dense(), loader(X, y), [extension])
    # the loss metric is that cross-entropy
    monitored = loop(dense(), loader(X, y), [Evaluate({"v": loader(X, y)}, {"loss": "loss"})])
    monitored.run()
    assert np.isfinite(monitored.log.last("v_loss"))


class MeanLoss(gluon.loss.Loss):
    """A loss averaged over the batch: one value per batch, not per row."""

    def __init__(self, **kwargs):
        super().__init__(None, 0, **kwargs)

    def hybrid_forward(self, F, pred, label):
        return F.mean(F.pick(-F.log_softmax(pred), label))


def test_a_loss_of_one_value_per_batch_is_refused_naming_the_fix():
    """It trained with 1/batch_size of the intended gradient, silently."""
    X, y = classification_data(64)
    with pytest.raises(ValueError, match=r"not one value per row.*F.mean\(loss, axis="):
        loop(dense(), loader(X, y), loss=MeanLoss())


def test_float64_inputs_are_a_clear_error_naming_the_input_type_and_cast():
    """They failed in deferred initialization with MXNet's 'expected float64, got float32'."""
    X, y = classification_data(64)
    with pytest.raises(TypeError, match=r"input 'data' is float64.*x.astype\('float32'\)"):
        loop(dense(), loader(X.astype("float64"), y))
    loop(dense(), loader(X, y.astype("float64"))).run()  # float64 labels are fine


def test_datacheck_checks_the_labels_of_a_gluon_softmax_cross_entropy():
    """pick() clips a label out of range into it: DataCheck counts it instead."""
    X, y = classification_data(64)
    y = y.copy()
    y[20] = 7  # 3 classes
    checked = loop(dense(), loader(X, y), [DataCheck(error=True)])
    with pytest.raises(DataError, match=r"1 label outside the classes .*\(label\)"):
        checked.run()
    check = DataCheck(error=True)
    clean = loop(dense(), loader(*classification_data(64)), [check])
    clean.run()
    assert check.labels == ["label"]
    assert clean.log.last("train_labels_out_of_range", None) is None
