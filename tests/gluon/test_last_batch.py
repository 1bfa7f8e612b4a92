"""A DataLoader's short last batch (``last_batch='keep'``) trained as Gluon trains it.

The reference is the hand-written Gluon loop: ``autograd.record()``, ``backward()``,
``trainer.step(batch.shape[0])``: the short batch's gradient averaged over its real rows,
BatchNorm's statistics from its real rows. On two devices Gluon's Trainer, at its first
step, copies device 0's BatchNorm running statistics over device 1's (it initializes its
kvstore then and pulls every parameter); the reference initializes its Trainer before
training (``_init_kvstore(); _init_params()``), so that each device keeps the statistics of
its own slices, as MXNet's executors do: that is the correct reference, and mxoid's average
of the devices' statistics is compared with the average of the reference's.
"""

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS
from mxnet import autograd, gluon
from mxnet.gluon import nn

from mxoid import FinishAfter, MainLoop

SAMPLES, BATCH, EPOCHS = 1000, 64, 3  # 15 batches of 64 and one of 40
SGD = {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4}


def data():
    rng = np.random.RandomState(0)
    X = rng.randn(SAMPLES, 8).astype("float32")
    y = (X[:, 0] + X[:, 1] > 0).astype("float32") + (X[:, 2] > 1)
    return X, y


def build():
    net = nn.HybridSequential(prefix="short_")
    with net.name_scope():
        net.add(nn.Dense(16, activation="relu"), nn.BatchNorm(), nn.Dense(3))
    mx.random.seed(1)
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 8)))
    return net


def loader():
    X, y = data()
    return gluon.data.DataLoader(gluon.data.ArrayDataset(X, y), BATCH, last_batch="keep")


def hand_loop(contexts):
    net = build()
    net.collect_params().reset_ctx(contexts)
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), "sgd", SGD)
    trainer._init_kvstore()  # see the module's documentation
    trainer._init_params()
    for _ in range(EPOCHS):
        for x, label in loader():
            xs = gluon.utils.split_and_load(x, contexts)
            ys = gluon.utils.split_and_load(label, contexts)
            with autograd.record():
                losses = [loss(net(a), b) for a, b in zip(xs, ys)]
            autograd.backward(losses)
            trainer.step(x.shape[0])
    return {k: [p.data(c).asnumpy() for c in contexts] for k, p in net.collect_params().items()}


@pytest.mark.parametrize("devices", [1, 2])
def test_the_short_last_batch_trains_at_its_real_size_as_gluon_does(devices):
    contexts = TWO_CPUS[:devices]
    reference = hand_loop(contexts)
    net = build()
    loop = MainLoop(
        net,
        loader(),
        loss=gluon.loss.SoftmaxCrossEntropyLoss(),
        contexts=contexts,
        optimizer_params=SGD,
        extensions=[FinishAfter(after_n_epochs=EPOCHS)],
    )
    loop.run()
    assert loop.update.optimizer.rescale_grad == 1.0 / BATCH  # given back after the short step
    assert any("running_var" in name for name in reference)
    for name, per_device in reference.items():
        mine = net.collect_params()[name].data().asnumpy()
        if devices == 1:  # bit for bit
            np.testing.assert_array_equal(mine, per_device[0], err_msg=name)
        else:
            expected = np.mean(per_device, axis=0) if "running" in name else per_device[0]
            np.testing.assert_allclose(mine, expected, rtol=1e-5, atol=1e-6, err_msg=name)


def test_an_ndarrayiter_padded_last_batch_keeps_module_fit_behaviour():
    """An NDArrayIter's padded last batch is trained padded (as Module.fit trains it):
    every batch on the training executors, the step averaged over the batch size."""
    X, y = data()
    loop = MainLoop(
        build(),
        mx.io.NDArrayIter(X, y, BATCH, label_name="label"),
        loss=gluon.loss.SoftmaxCrossEntropyLoss(),
        optimizer_params=SGD,
        extensions=[FinishAfter(after_n_epochs=1)],
    )
    loop.run()
    assert not loop.network.switches_graphs
    assert loop.manager.current is loop.manager.training_set
    assert loop.manager.executor_sets == {}
