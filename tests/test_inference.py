"""Inference without going back to Module: loop.predict, loop.score and Predictor, against
Module.predict and Module.score with the same parameters."""

import logging

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS
from networks import digits_images, initial_params, resnet

from mxoid import Checkpoint, Evaluate, Extension, FinishAfter, MainLoop, Predictor
from mxoid.checkpoint import list_checkpoints

BATCH = 32
DEVICES = {"one": [mx.cpu()], "two": TWO_CPUS}


def trained(devices, extensions=()):
    X, y = digits_images(256)
    np.random.seed(3)
    net = resnet()
    args, aux = initial_params(net, (BATCH, 1, 8, 8))
    return MainLoop(
        net,
        mx.io.NDArrayIter(X, y, batch_size=BATCH, shuffle=True, label_name="softmax_label"),
        contexts=DEVICES[devices],
        arg_params=args,
        aux_params=aux,
        optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
        extensions=[FinishAfter(after_n_epochs=2), *extensions],
    ).run()


def held_out(batch_size=BATCH, labels=False):
    X, y = digits_images()
    X, y = X[-100:], y[-100:]  # at 32 a batch, the last one is padded
    return mx.io.NDArrayIter(
        X, y if labels else None, batch_size=batch_size, label_name="softmax_label"
    )


def module_predict(loop, contexts):
    arg_params, aux_params = loop.get_params()
    module = mx.mod.Module(loop.symbol, context=contexts, logger=logging.getLogger("quiet"))
    it = held_out()
    module.bind(it.provide_data, [("softmax_label", (BATCH,))], for_training=False)
    module.set_params(arg_params, aux_params)
    return module.predict(it).asnumpy()


class Ragged(mx.io.DataIter):
    """Batches of 10, 10, 25 and 5 rows (the shapes change from batch to batch)."""

    def __init__(self, X, sizes=(10, 10, 25, 5)):
        super().__init__()
        self.X, self.sizes, self.index = X, sizes, 0
        self.provide_data = [mx.io.DataDesc("data", (sizes[0],) + X.shape[1:])]
        self.provide_label = []

    def reset(self):
        self.index = 0

    def next(self):
        if self.index == len(self.sizes):
            raise StopIteration
        start = sum(self.sizes[: self.index])
        rows = self.X[start : start + self.sizes[self.index]]
        self.index += 1
        return mx.io.DataBatch([mx.nd.array(rows)], pad=0)


@pytest.mark.parametrize("devices", ["one", "two"])
def test_loop_predict_equals_module_predict(devices):
    loop = trained(devices)
    ours = loop.predict(held_out())
    assert list(ours) == ["softmax"] and ours["softmax"].shape == (100, 10)
    np.testing.assert_allclose(
        ours["softmax"], module_predict(loop, DEVICES[devices]), rtol=1e-5, atol=1e-7
    )
    # With labels or without, at another batch size, by output name: the same.
    for again in (
        loop.predict(held_out(labels=True), outputs="softmax"),
        loop.predict(held_out(batch_size=7), outputs=["softmax_output"]),
    ):
        np.testing.assert_allclose(
            next(iter(again.values())), ours["softmax"], rtol=1e-5, atol=1e-7
        )
    with pytest.raises(ValueError, match="no output 'loss'"):
        loop.predict(held_out(), outputs="loss")


class PredictOnce(Extension):
    def do(self, which_callback, *args):
        self.outputs = self.main_loop.predict(held_out(batch_size=7))


@pytest.mark.parametrize(
    "devices, when",
    [("one", {"after_n_batches": 12}), ("two", {"after_n_epochs": 1})],
    ids=["one-device-mid-epoch", "two-devices-epoch-end"],
)
def test_predict_during_training_changes_nothing_of_it(devices, when):
    """(On several devices in the middle of an epoch it averages the BatchNorm statistics
    first, as Evaluate does: MainLoop's documentation says what that changes.)"""
    reference = trained(devices)
    predicting = PredictOnce(**when)
    loop = trained(devices, [predicting])
    assert predicting.outputs["softmax"].shape == (100, 10)
    for ours, expected in zip(loop.get_params(), reference.get_params()):
        for name in expected:
            np.testing.assert_array_equal(ours[name].asnumpy(), expected[name].asnumpy())


@pytest.mark.parametrize("devices", ["one", "two"])
def test_loop_score_gives_the_records_evaluate_writes(devices):
    evaluate = Evaluate({"valid": held_out(labels=True)}, ["acc", "ce"], after_training=True)
    loop = trained(devices, [evaluate])
    scored = loop.score(held_out(labels=True), ["acc", "ce"])
    assert scored == {
        "valid_accuracy": loop.log.last("valid_accuracy"),
        "valid_cross_entropy": loop.log.last("valid_cross_entropy"),
    }
    probabilities = loop.predict(held_out())["softmax"]
    labels = digits_images()[1][-100:]
    assert scored["valid_accuracy"] == pytest.approx(np.mean(probabilities.argmax(1) == labels))
    assert list(loop.score(held_out(labels=True), "acc", name="test")) == ["test_accuracy"]


def test_predictor_from_a_checkpoint_and_from_a_module_prefix(tmp_path):
    loop = trained("two", [Checkpoint(tmp_path / "checkpoints", after_training=True)])
    expected = loop.predict(held_out())["softmax"]
    arg_params, aux_params = loop.get_params()
    prefix = str(tmp_path / "module" / "resnet")
    (tmp_path / "module").mkdir()
    mx.model.save_checkpoint(prefix, 2, loop.symbol, arg_params, aux_params)
    folder = list_checkpoints(str(tmp_path / "checkpoints"))[-1]
    X = digits_images()[0][-50:]
    for source, contexts in (
        (tmp_path / "checkpoints", None),
        (folder, TWO_CPUS),
        (prefix, [mx.cpu()]),
    ):
        predictor = Predictor(source, contexts=contexts)
        got = predictor.predict(held_out())["softmax"]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
        # Batches of any size: executors per shape, reused.
        ragged = predictor.predict(Ragged(X))["softmax"]
        np.testing.assert_allclose(ragged, expected[-50:], rtol=1e-5, atol=1e-7)
        predictor.predict(Ragged(X))
        assert len(predictor._managers) == 4  # rows 32, 10, 25 and 5: bound once each


def test_batches_of_fewer_rows_than_devices_run_on_the_first_devices(tmp_path):
    """Batch 1 on two devices (inference one sample at a time, an evaluation iterator of
    batch 1, a last batch of one row): Module's executor group refuses it ("Too many
    slices"); here it runs on the first device, and larger batches keep both."""
    loop = trained("two", [Checkpoint(tmp_path / "checkpoints", after_training=True)])
    expected = loop.predict(held_out())["softmax"]
    X, y = digits_images()
    X, y = X[-100:], y[-100:]

    one_row = loop.predict(held_out(batch_size=1))["softmax"]
    np.testing.assert_allclose(one_row, expected, rtol=1e-5, atol=1e-7)

    predictor = Predictor(tmp_path / "checkpoints", contexts=TWO_CPUS)
    ragged = predictor.predict(Ragged(X[-50:], sizes=(1, 10, 1, 38)))["softmax"]
    np.testing.assert_allclose(ragged, expected[-50:], rtol=1e-5, atol=1e-7)
    devices = {key[0][1][0]: len(m.executors) for key, m in predictor._managers.items()}
    assert devices == {1: 1, 10: 2, 38: 2}  # the first batch's single row left both to the rest

    # Evaluate and loop.score at batch 1 on two devices: Module.score's records on one.
    arg_params, aux_params = loop.get_params()
    module = mx.mod.Module(loop.symbol, context=mx.cpu(), logger=logging.getLogger("quiet"))
    batch_one = mx.io.NDArrayIter(X, y, batch_size=1, label_name="softmax_label")
    module.bind(batch_one.provide_data, batch_one.provide_label, for_training=False)
    module.set_params(arg_params, aux_params)
    theirs = dict(module.score(batch_one, ["acc", "ce"]))
    ours = loop.score(batch_one, ["acc", "ce"])
    assert ours["valid_accuracy"] == pytest.approx(theirs["accuracy"], abs=1e-12)
    assert ours["valid_cross_entropy"] == pytest.approx(theirs["cross-entropy"], rel=1e-5)
    evaluate = Evaluate({"valid": batch_one}, ["acc"], after_training=True)
    evaluated = trained("two", [evaluate])
    assert evaluated.log.last("valid_accuracy") == pytest.approx(theirs["accuracy"], abs=1e-12)

    with pytest.raises(ValueError, match="a batch of 1 rows cannot be split across 2 devices"):
        MainLoop(
            loop.symbol,
            mx.io.NDArrayIter(X, y, batch_size=1, label_name="softmax_label"),
            contexts=TWO_CPUS,
            extensions=[FinishAfter(after_n_epochs=1)],
        )
