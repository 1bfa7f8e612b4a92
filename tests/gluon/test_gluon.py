"""A Gluon HybridBlock trained by MainLoop: the same training as a hand-written Gluon loop,
the block holding the result, checkpoints Gluon loads, evaluation in predict mode.

The reference is Gluon's own loop (``autograd.record()``, ``loss.backward()``,
``trainer.step(batch_size)``), with the same initial values, data order and optimizer.
On two devices Gluon's Trainer, at its first step, copies device 0's BatchNorm running
statistics over the other devices' (it initializes its kvstore then and pulls every
parameter); the reference initializes its Trainer before training instead, so that each
device keeps the statistics of its own slices, as MXNet's executors do, and mxoid's
average of them (the loop's Notes) is compared with the average of the reference's.
"""

import glob
import os

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS, classification_data
from mxnet import autograd, gluon
from mxnet.gluon import nn

from mxoid import Checkpoint, Evaluate, FinishAfter, MainLoop, TrainingMonitoring

BATCH = 16
SGD = {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4}


def dense_net(seed=1):
    """A HybridSequential of Dense layers with BatchNorm, parameters drawn with ``seed``."""
    net = nn.HybridSequential(prefix="dense_")
    with net.name_scope():
        net.add(nn.Dense(16, activation="relu"), nn.BatchNorm(), nn.Dense(3))
    mx.random.seed(seed)
    net.initialize(mx.init.Xavier())
    return net


def zoo_net(seed=1):
    """Gluon's model-zoo ResNet-18 for small images, initialized with deferred shapes."""
    net = gluon.model_zoo.vision.get_resnet(1, 18, classes=4, thumbnail=True, prefix="zoo_")
    mx.random.seed(seed)
    net.initialize(mx.init.Xavier())
    return net


def images(n=32, seed=0):
    rng = np.random.RandomState(seed)
    return rng.rand(n, 3, 12, 12).astype("float32"), rng.randint(0, 4, n).astype("float32")


def gluon_loop(net, X, y, contexts, epochs):
    """Train ``net`` as a Gluon user does; return each parameter's values per device."""
    net(mx.nd.zeros((1,) + X.shape[1:]))  # deferred shapes, as a first forward pass
    net.collect_params().reset_ctx(contexts)
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), "sgd", SGD)
    trainer._init_kvstore()  # see the module's documentation
    trainer._init_params()
    for _ in range(epochs):
        for start in range(0, len(X), BATCH):
            xs = gluon.utils.split_and_load(mx.nd.array(X[start : start + BATCH]), contexts)
            ys = gluon.utils.split_and_load(mx.nd.array(y[start : start + BATCH]), contexts)
            with autograd.record():
                losses = [loss(net(a), b) for a, b in zip(xs, ys)]
            autograd.backward(losses)
            trainer.step(BATCH)
    return {k: [p.data(c).asnumpy() for c in contexts] for k, p in net.collect_params().items()}


def mxoid_loop(net, X, y, contexts, epochs, extensions=()):
    loop = MainLoop(
        net,
        mx.io.NDArrayIter(X, y, BATCH, label_name="label"),
        loss=gluon.loss.SoftmaxCrossEntropyLoss(),
        contexts=contexts,
        optimizer_params=SGD,
        extensions=[*extensions, FinishAfter(after_n_epochs=epochs)],
    )
    loop.run()
    return loop


def assert_same_training(reference, net):
    """The block's parameters equal the reference's (running statistics: their mean)."""
    for name, per_device in reference.items():
        mine = net.collect_params()[name].data().asnumpy()
        expected = np.mean(per_device, axis=0) if "running" in name else per_device[0]
        np.testing.assert_allclose(mine, expected, rtol=2e-5, atol=1e-6, err_msg=name)
    assert any("running_mean" in name for name in reference)


@pytest.mark.parametrize("devices", [1, 2])
@pytest.mark.parametrize("build, data", [(dense_net, "blobs"), (zoo_net, "images")])
def test_a_block_trains_as_a_hand_written_gluon_loop(build, data, devices):
    X, y = classification_data(64) if data == "blobs" else images()
    contexts = TWO_CPUS[:devices]
    reference = gluon_loop(build(), X, y, contexts, epochs=2)
    net = build()
    mxoid_loop(net, X, y, contexts, epochs=2)
    assert_same_training(reference, net)
    if devices == 1:  # one device: bit for bit
        for name, (values,) in reference.items():
            np.testing.assert_array_equal(net.collect_params()[name].data().asnumpy(), values)


def test_after_run_the_block_predicts_as_the_loop_and_checkpoints_load_in_gluon(tmp_path):
    """``net(x)`` right after ``run()``; a checkpoint folder read by ``load_parameters``
    (a new instance: another prefix) and by ``SymbolBlock.imports``."""
    X, y = images()
    net = zoo_net()
    loop = mxoid_loop(net, X, y, [mx.cpu()], 2, [Checkpoint(str(tmp_path), every_n_epochs=1)])
    predicted = loop.predict(mx.io.NDArrayIter(X, y, BATCH, label_name="label"))
    assert sorted(predicted) == ["loss", "output"]
    direct = net(mx.nd.array(X)).asnumpy()
    np.testing.assert_allclose(direct, predicted["output"], rtol=1e-5, atol=1e-6)
    folder = sorted(glob.glob(str(tmp_path / "checkpoint-*")))[-1]
    assert {"net.params", "net-symbol.json", "model-0002.params"} <= set(os.listdir(folder))
    again = gluon.model_zoo.vision.get_resnet(1, 18, classes=4, thumbnail=True)
    again.load_parameters(os.path.join(folder, "net.params"))
    np.testing.assert_array_equal(again(mx.nd.array(X)).asnumpy(), direct)
    imported = gluon.SymbolBlock.imports(
        os.path.join(folder, "net-symbol.json"), ["data"], os.path.join(folder, "model-0002.params")
    )
    np.testing.assert_array_equal(imported(mx.nd.array(X)).asnumpy(), direct)


class Scaled(gluon.HybridBlock):
    """A block that branches on ``autograd.is_training()``: its outputs tripled in training."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(3)

    def hybrid_forward(self, F, x):
        y = self.dense(x)
        return y * 3 if autograd.is_training() else y


def test_evaluation_runs_the_block_in_predict_mode_and_records_the_loss():
    """Evaluate and predict trace the block in predict mode; the metrics given without an
    output name bind to the block's output, ``'loss'`` to the loss: the records equal
    Gluon's own predict-mode loss and NumPy's accuracy over every sample."""
    X, y = classification_data(40)
    net = Scaled()
    net.initialize()
    valid = mx.io.NDArrayIter(X, y, 16, label_name="label")  # a padded last batch
    monitor = TrainingMonitoring({"output": "acc", "loss": "loss"})
    evaluate = Evaluate({"valid": valid}, {"output": "acc", "loss": "loss"})
    loop = mxoid_loop(net, X, y, [mx.cpu()], 1, [monitor, evaluate])
    assert loop.network.evaluation_symbol is not None and loop.manager.metric_outputs == ["output"]
    out = net(mx.nd.array(X))
    loss = gluon.loss.SoftmaxCrossEntropyLoss()(out, mx.nd.array(y)).asnumpy()
    assert loop.log.last("valid_loss") == pytest.approx(float(loss.mean()), rel=1e-6)
    assert loop.log.last("valid_accuracy") == float((out.asnumpy().argmax(1) == y).mean())
    np.testing.assert_allclose(loop.predict(valid)["output"], out.asnumpy(), rtol=1e-5)
    records = loop.log[loop.status.iterations_done]
    assert {"train_accuracy", "train_loss", "valid_accuracy", "valid_loss"} <= set(records)


def test_parameter_settings_of_gluon_are_honoured():
    """``grad_req='null'`` keeps a parameter, ``lr_mult`` scales its steps, as Gluon's
    Trainer does; a block never initialized is initialized with ``initializer``."""
    X, y = classification_data(64)

    def build():
        net = dense_net()
        net[0].weight.grad_req = "null"
        net[2].bias.lr_mult = 0.0
        net[2].weight.lr_mult = 0.5
        return net

    reference = gluon_loop(build(), X, y, [mx.cpu()], 1)
    net = build()
    loop = MainLoop(
        net,
        mx.io.NDArrayIter(X, y, BATCH, label_name="label"),
        loss=gluon.loss.SoftmaxCrossEntropyLoss(),
        optimizer_params=SGD,
        extensions=[FinishAfter(after_n_epochs=1)],
    )
    first = net[0].weight.data().asnumpy().copy()  # its shape is known once traced
    loop.run()
    assert "dense_dense0_weight" in loop.manager.fixed_param_names
    np.testing.assert_array_equal(net[0].weight.data().asnumpy(), first)
    assert_same_training(reference, net)
    fresh = nn.HybridSequential()
    fresh.add(nn.Dense(3))
    MainLoop(
        fresh,
        mx.io.NDArrayIter(X, y, BATCH, label_name="label"),
        loss=gluon.loss.SoftmaxCrossEntropyLoss(),
        initializer=mx.init.Constant(0.25),
        extensions=[FinishAfter(after_n_batches=1)],
    )
    assert (fresh[0].weight.data().asnumpy() == 0.25).all()


def test_multipliers_set_after_a_first_forward_pass_are_honoured():
    """GluonCV's "no weight decay on beta, gamma and bias" (``wd_mult = 0.0`` on
    ``collect_params('.*beta|.*gamma|.*bias')``), set after a first forward pass of a block
    of deferred shapes (which caches each Parameter's symbol with the multipliers of that
    moment), and an ``lr_mult`` set then: honoured as Gluon's Trainer honours them (mxoid
    read the cached ``wd_mult`` 1.0 and decayed them)."""
    X, y = classification_data(64)

    def build():
        net = dense_net()
        net(mx.nd.zeros((1, X.shape[1])))  # deferred shapes: Gluon traces the block once
        for param in net.collect_params(".*beta|.*gamma|.*bias").values():
            param.wd_mult = 0.0
        net[2].weight.lr_mult = 0.5
        return net

    reference = gluon_loop(build(), X, y, [mx.cpu()], 2)
    net = build()
    loop = mxoid_loop(net, X, y, [mx.cpu()], epochs=2)
    assert loop.update.optimizer.wd_mult["dense_batchnorm0_beta"] == 0.0
    for name, (values,) in reference.items():  # one device: bit for bit
        np.testing.assert_array_equal(net.collect_params()[name].data().asnumpy(), values)


class Imperative(gluon.Block):
    def forward(self, x):
        return x


@pytest.mark.adversarial
def test_what_cannot_be_traced_is_refused_with_the_fix():
    X, y = classification_data(32)
    data = mx.io.NDArrayIter(X, y, BATCH, label_name="label")
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    with pytest.raises(TypeError, match="make it a gluon.HybridBlock"):
        MainLoop(Imperative(), data, loss=loss, extensions=[FinishAfter(after_n_epochs=1)])
    with pytest.raises(TypeError, match=r"needs its loss: MainLoop\(net, train_data, loss="):
        MainLoop(dense_net(), data, extensions=[FinishAfter(after_n_epochs=1)])
    with pytest.raises(TypeError, match="the loss .function. must be a gluon.HybridBlock"):
        MainLoop(
            dense_net(),
            data,
            loss=lambda pred, label: pred,
            extensions=[FinishAfter(after_n_epochs=1)],
        )
    symbol = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=3))
    with pytest.raises(TypeError, match="loss= is for a Gluon block"):
        MainLoop(symbol, data, loss=loss, extensions=[FinishAfter(after_n_epochs=1)])


def dropout_net(seed=1):
    """Dense layers with BatchNorm and Dropout: the masks come from MXNet's generator."""
    net = nn.HybridSequential(prefix="drop_")
    with net.name_scope():
        net.add(nn.Dense(16, activation="relu"), nn.BatchNorm(), nn.Dropout(0.3), nn.Dense(3))
    mx.random.seed(seed)
    net.initialize(mx.init.Xavier())
    return net


def resumable_loop(directory, stop, resume=False):
    X, y = classification_data(100)
    np.random.seed(5)  # the iterator's shuffle
    mx.random.seed(11)
    return MainLoop(
        dropout_net(),
        mx.io.NDArrayIter(X, y, 20, shuffle=True, label_name="label"),
        loss=gluon.loss.SoftmaxCrossEntropyLoss(),
        optimizer="adam",
        contexts=TWO_CPUS,
        resume_from=directory if resume else None,
        extensions=[
            TrainingMonitoring({"output": "acc", "loss": "loss"}),
            Checkpoint(directory, every_n_batches=3),
            FinishAfter(**stop),
        ],
    )


def test_a_gluon_run_resumed_mid_epoch_ends_bit_identical(tmp_path):
    """Stopped after 6 batches (its checkpoint mid-epoch), resumed in a new loop of a
    new block: the parameters, BatchNorm statistics and records equal an uninterrupted
    run's, bit for bit (Dropout's masks and the shuffle included)."""
    whole = resumable_loop(str(tmp_path / "whole"), {"after_n_epochs": 3}).run()
    resumable_loop(str(tmp_path / "cut"), {"after_n_batches": 6}).run()
    resumed = resumable_loop(str(tmp_path / "cut"), {"after_n_epochs": 3}, resume=True).run()
    assert resumed.resumed_from.endswith("epoch0001-batch00000006")  # 1 batch into epoch 2
    for name, value in whole.network.parameters.items():
        np.testing.assert_array_equal(
            resumed.network.parameters[name].data().asnumpy(), value.data().asnumpy(), name
        )
    for row in (10, 15):  # the ends of epochs 2 and 3
        assert resumed.log[row]["train_accuracy"] == whole.log[row]["train_accuracy"]
        assert resumed.log[row]["train_loss"] == whole.log[row]["train_loss"]


def test_a_shuffling_dataloader_feeds_the_loop_as_it_feeds_a_gluon_loop():
    """The same DataLoader (shuffled, after the same NumPy seed) through the hand-written
    Gluon loop and through MainLoop: the same batches in the same order, the same
    parameters, bit for bit; Evaluate reads a DataLoader too."""
    X, y = classification_data(64)

    def loader(shuffle=True):
        return gluon.data.DataLoader(gluon.data.ArrayDataset(X, y), BATCH, shuffle=shuffle)

    reference = dense_net()
    reference(mx.nd.zeros((1, X.shape[1])))
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(reference.collect_params(), "sgd", SGD)
    np.random.seed(3)
    for _ in range(2):
        for data, label in loader():
            with autograd.record():
                value = loss(reference(data), label)
            value.backward()
            trainer.step(BATCH)
    net = dense_net()
    np.random.seed(3)
    loop = MainLoop(
        net,
        loader(),
        loss=loss,
        optimizer_params=SGD,
        extensions=[Evaluate({"valid": loader(False)}, "acc"), FinishAfter(after_n_epochs=2)],
    )
    assert loop.manager.data_names == ["data"] and loop.manager.label_names == ["label"]
    loop.run()
    for name, param in reference.collect_params().items():
        np.testing.assert_array_equal(
            net.collect_params()[name].data().asnumpy(), param.data().asnumpy()
        )
    accuracy = (net(mx.nd.array(X)).asnumpy().argmax(1) == y).mean()
    assert loop.log.last("valid_accuracy") == pytest.approx(accuracy, abs=1e-12)
