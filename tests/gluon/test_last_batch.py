"""A DataLoader's short last batch (``last_batch='keep'``) trained as Gluon trains it.

The reference is the hand-written Gluon loop: ``autograd.record()``, ``backward()``,
``trainer.step(batch.shape[0])``: the short batch's gradient averaged over its real rows,
BatchNorm's statistics from its real rows. On two devices Gluon's Trainer, at its first
step, copies device 0's BatchNorm running statistics over device 1's (it initializes its
kvstore then and pulls every parameter); the reference initializes its Trainer before
training (``_init_kvstore(); _init_params()``), so that each device keeps the statistics of
its own slices, as MXNet's executors do: that is the correct reference, and mxoid's average
of the devices' statistics is compared with the average of the reference's.

A short batch of fewer rows than devices (1 row on two) is one Gluon's ``split_and_load``
refuses (``even_split=False`` too: "Too many slices"); a Gluon user who trains it writes: the
rows on the devices that get one (``split_and_load(x, contexts[:rows])``), the other devices'
gradients zeroed, ``trainer.step(rows, ignore_stale_grad=True)`` (the Trainer's kvstore sums
every device's gradient and updates every device). That is the reference mxoid is held to.
There the devices' BatchNorm statistics move by different numbers of steps an epoch (the
second device's skip the short batch), so averaging them at each epoch's end, as mxoid and
``Module.fit`` do, is not averaging them once at the end: that reference averages them at
each epoch's end too.
"""

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS
from mxnet import autograd, gluon
from mxnet.gluon import nn

from mxoid import FinishAfter, MainLoop, TrainingMonitoring

SAMPLES, BATCH, EPOCHS = 1000, 64, 3  # 15 batches of 64 and one of 40
SGD = {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4}


def data(samples=SAMPLES):
    rng = np.random.RandomState(0)
    X = rng.randn(samples, 8).astype("float32")
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


def loader(samples=SAMPLES, batch=BATCH):
    X, y = data(samples)
    return gluon.data.DataLoader(gluon.data.ArrayDataset(X, y), batch, last_batch="keep")


def hand_loop(contexts, samples=SAMPLES, average_each_epoch=False):
    net = build()
    params = net.collect_params()
    params.reset_ctx(contexts)
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(params, "sgd", SGD)
    trainer._init_kvstore()  # see the module's documentation
    trainer._init_params()
    for _ in range(EPOCHS):
        for x, label in loader(samples):
            rows = x.shape[0]
            used = contexts[:rows]  # fewer rows than devices: the devices that get one
            xs = gluon.utils.split_and_load(x, used)
            ys = gluon.utils.split_and_load(label, used)
            with autograd.record():
                losses = [loss(net(a), b) for a, b in zip(xs, ys)]
            autograd.backward(losses)
            for context in contexts[rows:]:  # the others add nothing to this step
                assert trainer._update_on_kvstore  # which sums every device's, updates all
                for p in params.values():
                    if p.grad_req != "null":
                        p.grad(context)[:] = 0
            trainer.step(rows, ignore_stale_grad=len(used) < len(contexts))
        for p in params.values():
            if average_each_epoch and "running" in p.name:  # (set_data would reset the kvstore)
                average = sum(p.data(c).copyto(mx.cpu()) for c in contexts) / len(contexts)
                for c in contexts:
                    average.copyto(p.data(c))
    return {k: [p.data(c).asnumpy() for c in contexts] for k, p in params.items()}


def assert_as_the_hand_loop(net, reference, devices):
    assert any("running_var" in name for name in reference)
    for name, per_device in reference.items():
        mine = net.collect_params()[name].data().asnumpy()
        if devices == 1:  # bit for bit
            np.testing.assert_array_equal(mine, per_device[0], err_msg=name)
        else:
            expected = np.mean(per_device, axis=0) if "running" in name else per_device[0]
            np.testing.assert_allclose(mine, expected, rtol=1e-5, atol=1e-6, err_msg=name)


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
    assert_as_the_hand_loop(net, reference, devices)


def test_a_short_batch_of_fewer_rows_than_devices_trains_on_the_devices_that_get_one():
    """15 batches of 64 and one of 1 row, on two devices: that row trains on the first
    device, the second adds nothing to the step (its gradient of the batch before is not
    summed in), the step averages over 1 row; the second device's BatchNorm statistics
    stay as the batch before left them (each epoch's end then averages the two)."""
    samples = 15 * BATCH + 1
    reference = hand_loop(TWO_CPUS, samples, average_each_epoch=True)
    net = build()
    loop = MainLoop(
        net,
        loader(samples),
        loss=gluon.loss.SoftmaxCrossEntropyLoss(),
        contexts=TWO_CPUS,
        optimizer_params=SGD,
        extensions=[FinishAfter(after_n_epochs=EPOCHS)],
    )
    loop.run()
    short = [s for s in loop.manager.executor_sets.values() if s.batch_size == 1]
    assert [s.contexts for s in short] == [TWO_CPUS[:1]]
    assert_as_the_hand_loop(net, reference, devices=2)


def test_batches_of_fewer_rows_than_devices_are_refused_naming_the_fix():
    """Every batch of 1 row on two devices: refused when the loop is built (a device would
    never train), naming the rows, the devices and both fixes."""
    with pytest.raises(ValueError) as error:
        MainLoop(
            build(),
            loader(batch=1),
            loss=gluon.loss.SoftmaxCrossEntropyLoss(),
            contexts=TWO_CPUS,
            extensions=[FinishAfter(after_n_epochs=1)],
        )
    message = str(error.value)
    for part in (
        "have 1 row(s)",
        "2 devices [cpu(0), cpu(1)]",
        "at least 2",
        "DataLoader(batch_size=...)",
        "contexts=[cpu(0)]",
    ):
        assert part in message, message


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


def test_the_records_of_a_short_batch_of_fewer_rows_than_devices_count_its_rows():
    """TrainingMonitoring over epochs of 15 batches of 64 and one of 1 row: on two devices
    (that row on the first) the records of one device, every row counted once."""
    samples = 15 * BATCH + 1
    X, y = data(samples)

    def records(contexts):
        net = nn.HybridSequential(prefix="rows_")
        with net.name_scope():
            net.add(nn.Dense(16, activation="relu"), nn.Dense(3))
        mx.random.seed(1)
        net.initialize(mx.init.Xavier())
        monitoring = TrainingMonitoring({"output": "acc", "loss": "loss"}, after_epoch=True)
        loop = MainLoop(
            net,
            gluon.data.DataLoader(gluon.data.ArrayDataset(X, y), BATCH),
            loss=gluon.loss.SoftmaxCrossEntropyLoss(),
            contexts=contexts,
            optimizer_params=SGD,
            extensions=[FinishAfter(after_n_epochs=2), monitoring],
        )
        loop.run()
        rows = [loop.log.row(i) for i in loop.log.epoch_ends]
        return [(row["train_accuracy"], row["train_loss"]) for row in rows]

    one, two = records(TWO_CPUS[:1]), records(TWO_CPUS)
    for (accuracy_one, loss_one), (accuracy_two, loss_two) in zip(one, two):
        assert accuracy_two == accuracy_one
        assert round(accuracy_two * samples) == pytest.approx(accuracy_two * samples, abs=1e-6)
        assert loss_two == pytest.approx(loss_one, rel=1e-6)
