"""DataCheck: non-finite inputs and out-of-range labels counted on the devices, against NumPy."""

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS, classification_data, initial_params, mlp

from mxoid import Checkpoint, DataCheck, FinishAfter, MainLoop
from mxoid.extensions import DataError

pytestmark = pytest.mark.adversarial

CONTEXTS = {"one": [mx.cpu(0)], "two": TWO_CPUS}


def bad_data():
    """100 samples, batches of 20: NaNs and an inf in batches 3 and 5 (1-based), labels 7 and
    -1 and 1.5 for 3 classes in batches 4 and 5."""
    X, y = classification_data(n=100, seed=2)
    X[45, 2] = np.nan
    X[47, :3] = np.inf
    X[93, 0] = np.nan
    y[61], y[99], y[83] = 7, -1, 1.5
    return X, y


def loop_of(extensions, contexts, X, y, **kwargs):
    net = mlp()
    return MainLoop(
        net,
        mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label"),
        contexts=contexts,
        arg_params=initial_params(net, (20, 10)),
        extensions=extensions,
        **kwargs,
    )


def by_hand(X, y, classes=3):
    nonfinite = int((~np.isfinite(X)).sum())
    bad = int((~((y >= 0) & (y < classes) & (y == np.floor(y)))).sum())
    bad_rows = np.flatnonzero(
        (~np.isfinite(X)).any(axis=1) | ~((y >= 0) & (y < classes) & (y == np.floor(y)))
    )
    return nonfinite, bad, int(bad_rows[0] // 20) + 1


@pytest.mark.parametrize("devices", ["one", "two"])
def test_the_counts_and_the_first_batch_equal_numpys(devices):
    X, y = bad_data()
    nonfinite, bad, first = by_hand(X, y)
    assert (nonfinite, bad, first) == (5, 3, 3)
    with pytest.warns(UserWarning) as warned:
        loop = loop_of([FinishAfter(after_n_epochs=2), DataCheck()], CONTEXTS[devices], X, y).run()
    messages = [str(w.message) for w in warned if "training data" in str(w.message)]
    assert len(messages) == 2  # one per epoch
    assert "5 non-finite values" in messages[0] and "3 labels outside" in messages[0]
    assert "first in batch 3 of training" in messages[0] and "softmax_label" in messages[0]
    assert "first in batch 8 of training" in messages[1]  # batch 3 of the second epoch
    assert (
        loop.log[5]["train_data_nonfinite"] == 5 and loop.log[5]["train_labels_out_of_range"] == 3
    )
    assert loop.log[10]["train_data_nonfinite"] == 5


def test_clean_data_writes_nothing_and_trains_as_without_the_check():
    X, y = classification_data(n=100, seed=2)
    checked = loop_of([FinishAfter(after_n_epochs=2), DataCheck(error=True)], TWO_CPUS, X, y).run()
    plain = loop_of([FinishAfter(after_n_epochs=2)], TWO_CPUS, X, y).run()
    assert "train_data_nonfinite" not in checked.log.record_names()
    for name, value in plain.get_params()[0].items():
        np.testing.assert_array_equal(value.asnumpy(), checked.get_params()[0][name].asnumpy())


def test_error_true_raises_naming_the_problem_at_the_first_check():
    X, y = bad_data()
    with pytest.raises(DataError, match="holds 5 non-finite values .* first in batch 3"):
        loop_of([FinishAfter(after_n_epochs=2), DataCheck(error=True)], [mx.cpu()], X, y).run()


def test_an_ignored_label_is_not_out_of_range():
    X, y = classification_data(n=40, seed=2)
    y[3] = -1
    data = mx.sym.var("data")
    net = mx.sym.SoftmaxOutput(
        mx.sym.FullyConnected(data, num_hidden=3, name="fc"),
        name="softmax",
        use_ignore=True,
        ignore_label=-1,
    )
    loop = MainLoop(
        net,
        mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label"),
        extensions=[FinishAfter(after_n_epochs=1), DataCheck(error=True)],
    )
    loop.run()


def test_a_resumed_run_reports_what_the_uninterrupted_one_does(tmp_path):
    """Labels only (a NaN input would leave NaN parameters, which no checkpoint keeps)."""
    X, y = classification_data(n=100, seed=2)
    y[23], y[61], y[99] = 1.5, 7, -1  # batches 2, 4 and 5

    def run(stop, resume):
        extensions = [stop, DataCheck(), Checkpoint(str(tmp_path / resume))]
        return loop_of(extensions, TWO_CPUS, X, y, resume_from=str(tmp_path / resume))

    with pytest.warns(UserWarning) as uninterrupted:
        whole = run(FinishAfter(after_n_epochs=1), "whole").run()
    run(FinishAfter(after_n_batches=3), "cut").run()  # before any check: counts in the checkpoint
    with pytest.warns(UserWarning) as warned:
        resumed = run(FinishAfter(after_n_epochs=1), "cut").run()
    said = [
        [str(w.message) for w in ws if "training data" in str(w.message)]
        for ws in (uninterrupted, warned)
    ]
    assert said[0] == said[1] and len(said[0]) == 1
    assert "3 labels outside" in said[0][0] and "first in batch 2" in said[0][0]
    assert (
        resumed.log[5]["train_labels_out_of_range"]
        == whole.log[5]["train_labels_out_of_range"]
        == 3
    )
