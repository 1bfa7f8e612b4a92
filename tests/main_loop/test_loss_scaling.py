"""Loss scaling (MainLoop(loss_scale=...), mxoid.loss_scale), tested on CPUs in float32.

A power-of-two scale commutes with floating-point rounding: float32 training with it equals
training without it bit for bit, which shows the scale enters every gradient and leaves every
update. Overflows are made two ways: a scale so large that float32 gradients overflow, and an
inf in one batch's rows on one device; the skipped step is checked against the parameters and
optimizer states before it, and the scale's course against MXNet AMP's own LossScaler fed the
same overflows. float16 itself needs a GPU: its test skips here.
"""

import json
import logging
import os
import pickle

import mxnet as mx
import numpy as np
import pytest
from checkpointing import assert_identical
from conftest import TWO_CPUS, classification_data

from mxoid import Checkpoint, FinishAfter, MainLoop
from mxoid.checkpoint import latest_checkpoint
from mxoid.extensions import Extension
from mxoid.loss_scale import (
    LOSS_OPERATORS,
    SCALE_NAME,
    DynamicLossScale,
    check_loss_scale,
    with_loss_scale,
    without_loss_scale,
)

DEVICES = {"one": [mx.cpu(0)], "two": TWO_CPUS}
BATCH = 20
KVSTORES = {  # (kvstore, update_on_kvstore)
    "local": ("local", None),
    "local-on-kvstore": ("local", True),
    "device": ("device", False),
}


def bn_mlp():
    """A perceptron with BatchNorm and a softmax output."""
    data = mx.sym.Variable("data")
    hidden = mx.sym.FullyConnected(data, num_hidden=16, name="fc1")
    hidden = mx.sym.BatchNorm(hidden, fix_gamma=False, name="bn1")
    hidden = mx.sym.Activation(hidden, act_type="relu", name="relu1")
    logits = mx.sym.FullyConnected(hidden, num_hidden=3, name="fc2")
    return mx.sym.SoftmaxOutput(logits, name="softmax")


def host(params):
    return {k: v.asnumpy() for k, v in params.items()}


class Trajectory(Extension):
    """After every batch: each device's parameters, the optimizer's states, the scale."""

    def __init__(self):
        super().__init__(after_batch=True, priority=300)
        self.rows = []

    def do(self, which_callback, *args):
        loop = self.main_loop
        loop.synchronize()
        manager = loop.manager
        devices = [
            {n: a[k].asnumpy() for n, a in zip(manager.param_names, manager.param_arrays)}
            for k in range(len(manager.contexts))
        ]
        statistics = {n: a[0].asnumpy() for n, a in zip(manager.aux_names, manager.aux_arrays)}
        states, _ = pickle.loads(loop.optimizer_states())
        states = {i: [s.asnumpy() for s in _flat(v)] for i, v in states.items()}
        status = loop.status
        self.rows.append(
            {
                "devices": devices,
                "statistics": statistics,
                "states": states,
                "scale": status.loss_scale,
                "skipped": status.skipped_updates,
                "updates": status.updates_done,
                "num_update": loop.optimizer.num_update,
            }
        )


def _flat(value):
    if value is None:
        return []
    if isinstance(value, (tuple, list)):
        return [a for v in value for a in _flat(v)]
    return [value]


def symbol_loop(contexts, scale, stop, kvstore="local", update_on_kvstore=None, **options):
    X, y = options.pop("data", None) or classification_data(n=200)
    net = options.pop("net", None)
    np.random.seed(5)
    mx.random.seed(1)
    train = mx.io.NDArrayIter(X, y, batch_size=BATCH, shuffle=True, label_name="softmax_label")
    return MainLoop(
        bn_mlp() if net is None else net,
        train,
        contexts=contexts,
        optimizer=options.pop("optimizer", "sgd"),
        optimizer_params=options.pop("optimizer_params", {"learning_rate": 0.1, "momentum": 0.9}),
        initializer=mx.init.Xavier(),
        kvstore=kvstore,
        update_on_kvstore=update_on_kvstore,
        extensions=[stop, *options.pop("extensions", ())],
        loss_scale=scale,
        **options,
    )


def all_values(loop):
    args, aux = loop.get_params()
    return {**host(args), **host(aux)}


def last_gradients(loop):
    loop.synchronize()
    manager = loop.manager
    return {
        f"{k}:{n}": g[k].asnumpy()
        for n, g in zip(manager.param_names, manager.grad_arrays)
        for k in range(len(manager.contexts))
    }


# ------------------------------------------------------------------ the graph
@pytest.mark.parametrize("op", LOSS_OPERATORS)
def test_each_loss_operator_ignores_its_head_gradient_and_the_scale_is_exact(op):
    """Why the scale goes before the loss operator; forward bit for bit, backward times s."""
    x, label = mx.sym.Variable("x"), mx.sym.Variable("label")
    hidden = mx.sym.FullyConnected(x, num_hidden=4, name="fc")
    hidden = mx.sym.BatchNorm(hidden, fix_gamma=False, name="bn")
    one_label = op in ("SoftmaxOutput", "SVMOutput")
    head = getattr(mx.sym, op)(hidden) if "ake" in op else getattr(mx.sym, op)(hidden, label)
    net = mx.sym.Group([head, mx.sym.BlockGrad(hidden, name="features")])
    scaled = with_loss_scale(net)
    assert SCALE_NAME in scaled.list_arguments() and scaled.list_outputs() == net.list_outputs()
    assert without_loss_scale(scaled).tojson() == net.tojson()
    rng = np.random.RandomState(0)
    inputs = {"x": rng.randn(6, 5), "label": rng.randint(0, 4, (6,) if one_label else (6, 4))}

    def run(symbol, scale, head_gradient=None):
        names = symbol.list_arguments()
        shapes = {n: v.shape for n, v in inputs.items() if n in names}
        requests = {n: "null" if n in inputs or n == SCALE_NAME else "write" for n in names}
        ex = symbol.simple_bind(mx.cpu(), grad_req=requests, **shapes)
        values = np.random.RandomState(1)
        for name, array in ex.arg_dict.items():
            if name in inputs:
                array[:] = inputs[name]
            elif name == SCALE_NAME:
                array[:] = scale
            else:
                array[:] = values.randn(*array.shape)
        ex.forward(is_train=True)
        ex.backward(head_gradient)
        outputs = [o.asnumpy() for o in ex.outputs]
        return outputs, {n: g.asnumpy() for n, g in ex.grad_dict.items() if g is not None}

    outputs, gradients = run(net, None)
    twice = [mx.nd.ones(o.shape) * 2 for o in outputs]
    assert_identical(gradients, run(net, None, twice)[1])  # the head gradient is ignored
    scaled_outputs, scaled_gradients = run(scaled, 2.0**12)
    for ours, theirs in zip(scaled_outputs, outputs):
        np.testing.assert_array_equal(ours, theirs)
    assert scaled_gradients.keys() == gradients.keys()
    for name, gradient in gradients.items():
        assert np.any(gradient != 0), name
        np.testing.assert_array_equal(scaled_gradients[name], gradient * 2.0**12, err_msg=name)


def test_a_head_that_takes_its_gradient_or_no_loss_is_refused_by_name():
    data = mx.sym.Variable("data")
    regression = mx.sym.sum(mx.sym.FullyConnected(data, num_hidden=2, name="fc"), name="total")
    with pytest.raises(ValueError, match="head 'total' .sum. takes the gradient.*MakeLoss"):
        with_loss_scale(mx.sym.Group([mx.sym.MakeLoss(regression), regression]))
    with pytest.raises(ValueError, match="no loss operator to scale.*loss_scale=None"):
        with_loss_scale(mx.sym.BlockGrad(data))


def test_the_settings_are_checked():
    assert check_loss_scale("auto", None) is None
    assert check_loss_scale("auto", "bfloat16") is None
    assert isinstance(check_loss_scale("auto", "float16"), DynamicLossScale)
    assert check_loss_scale("dynamic", None).initial == 2.0**16
    assert check_loss_scale(1024, None) == 1024.0
    assert check_loss_scale(2.0**127, None) == 2.0**127
    for wrong in ("static", 0, -2.0, float("inf"), 2.0**128, True):
        with pytest.raises(ValueError, match="give 'dynamic'.*a positive float.*or None"):
            check_loss_scale(wrong, None)
    with pytest.raises(ValueError, match="0 < initial <= maximum <= 3.4e38"):
        DynamicLossScale(initial=2.0**30, maximum=2.0**24)
    with pytest.raises(ValueError, match="float32's largest"):
        DynamicLossScale(initial=2.0**30, maximum=2.0**128)
    with pytest.raises(ValueError, match="growth_interval must be an int >= 1"):
        DynamicLossScale(growth_interval=0)


# ------------------------------------------------------- float32, bit for bit
SCALES = {
    "static": 2.0**10,
    "dynamic": "dynamic",
    "growing": DynamicLossScale(initial=8.0, growth_interval=4),
}


@pytest.mark.parametrize("kvstore", sorted(KVSTORES))
@pytest.mark.parametrize("devices", ["one", "two"])
def test_float32_with_a_power_of_two_scale_trains_bit_for_bit_as_without(devices, kvstore):
    """Three epochs of SGD with momentum (10 batches each) with BatchNorm: the parameters and
    statistics equal, and the last gradients are the scale times the unscaled ones."""
    kind, on_kvstore = KVSTORES[kvstore]
    stop = FinishAfter(after_n_epochs=3)
    plain = symbol_loop(DEVICES[devices], None, stop, kind, on_kvstore).run()
    expected, plain_gradients = all_values(plain), last_gradients(plain)
    assert plain.status.loss_scale is None
    for name, scale in SCALES.items():
        loop = symbol_loop(DEVICES[devices], scale, FinishAfter(after_n_epochs=3), kind, on_kvstore)
        loop.run()
        assert_identical(all_values(loop), expected)
        final = {"static": 2.0**10, "dynamic": 2.0**16, "growing": 8.0 * 2**7}[name]
        assert loop.status.loss_scale == final and loop.status.skipped_updates == 0
        gradients = last_gradients(loop)  # the last step's scale is the final one
        for key, gradient in plain_gradients.items():
            np.testing.assert_array_equal(gradients[key], gradient * final, err_msg=key)
        assert loop.status.updates_done == plain.status.updates_done == 30


def dropout_bn_mlp():
    """A perceptron with BatchNorm and Dropout (its masks from MXNet's generator)."""
    data = mx.sym.Variable("data")
    hidden = mx.sym.FullyConnected(data, num_hidden=16, name="fc1")
    hidden = mx.sym.BatchNorm(hidden, fix_gamma=False, name="bn1")
    hidden = mx.sym.Dropout(mx.sym.Activation(hidden, act_type="relu"), p=0.3, name="drop1")
    logits = mx.sym.FullyConnected(hidden, num_hidden=3, name="fc2")
    return mx.sym.SoftmaxOutput(logits, name="softmax")


def test_dropout_and_batchnorm_on_two_devices_with_validation_train_bit_for_bit_as_without():
    """Dropout draws the same masks with the scale in the graph (it adds no random draw), and
    Evaluate at the training batch size reads the same outputs: parameters, statistics and
    records equal."""
    from mxoid import Evaluate

    X, y = classification_data(n=200)
    results = {}
    for scale in (None, "dynamic"):
        valid = mx.io.NDArrayIter(X[:60], y[:60], batch_size=BATCH, label_name="softmax_label")
        evaluate = Evaluate({"valid": valid}, metrics=["acc", "ce"])
        stop = FinishAfter(after_n_epochs=2)
        loop = symbol_loop(TWO_CPUS, scale, stop, net=dropout_bn_mlp(), extensions=[evaluate])
        loop.run()
        records = [
            {k: v for k, v in loop.log[i].items() if k.startswith("valid_")} for i in loop.log
        ]
        results[scale] = (all_values(loop), records, loop.status.updates_done)
    assert any(results[None][1]) and results["dynamic"][1] == results[None][1]
    assert results["dynamic"][2] == results[None][2] == 20
    assert_identical(results["dynamic"][0], results[None][0])


def test_adam_and_accumulated_batches_train_bit_for_bit_as_without():
    options = {"optimizer": "adam", "optimizer_params": {"learning_rate": 0.01}}
    runs = [
        symbol_loop(
            TWO_CPUS, scale, FinishAfter(after_n_epochs=3), accumulate_batches=3, **dict(options)
        ).run()
        for scale in (None, DynamicLossScale(initial=2.0**5, growth_interval=2))
    ]
    assert_identical(all_values(runs[1]), all_values(runs[0]))
    assert runs[1].status.loss_scale == 2.0**5 * 2**5  # 10 steps of 3 batches, doubled every 2
    assert runs[1].status.updates_done == 10


@pytest.mark.parametrize("devices", ["one", "two"])
def test_buckets_train_bit_for_bit_as_without(devices):
    from buckets import OPTIMIZER_PARAMS, bucket_iter, initial_params, sym_gen_of

    def run(scale):
        sym_gen = sym_gen_of()
        return MainLoop(
            sym_gen,
            bucket_iter(),
            contexts=DEVICES[devices],
            optimizer_params=dict(OPTIMIZER_PARAMS),
            arg_params=initial_params(sym_gen),
            extensions=[FinishAfter(after_n_epochs=2)],
            loss_scale=scale,
        ).run()

    plain, scaled = run(None), run(DynamicLossScale(initial=2.0**4, growth_interval=5))
    assert len(scaled.manager.executor_sets) > 1  # other buckets' sets, sharing the scale
    assert_identical(host(scaled.get_params()[0]), host(plain.get_params()[0]))
    assert scaled.status.loss_scale > 2.0**4 and scaled.status.skipped_updates == 0


def gluon_net():
    from mxnet import gluon

    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"))
    net.add(gluon.nn.Dense(3))
    return net


@pytest.mark.parametrize("devices", ["one", "two"])
def test_a_gluon_block_trains_bit_for_bit_as_without(devices):
    from mxnet import gluon

    X, y = classification_data(n=200)
    trained = {}
    for scale in (None, "dynamic", 2.0**7):
        mx.random.seed(1)
        net = gluon_net()
        net.initialize(mx.init.Xavier())
        np.random.seed(5)
        train = mx.io.NDArrayIter(X, y, batch_size=BATCH, shuffle=True, label_name="label")
        loop = MainLoop(
            net,
            train,
            loss=gluon.loss.SoftmaxCrossEntropyLoss(),
            contexts=DEVICES[devices],
            optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
            extensions=[FinishAfter(after_n_epochs=2)],
            loss_scale=scale,
        ).run()
        assert loop.status.loss_scale == (
            None if scale is None else {"dynamic": 2.0**16}.get(scale, scale)
        )
        trained[scale] = {  # by position: each block's names are its own (dense0, dense4...)
            str(i): p.data().asnumpy() for i, p in enumerate(net.collect_params().values())
        }
    assert_identical(trained["dynamic"], trained[None])
    assert_identical(trained[2.0**7], trained[None])


def test_a_rescale_grad_mxnet_cannot_read_exactly_divides_the_gradients_instead():
    """MXNet reads rescale_grad from text with dmlc-core's float parser: (1/60) / 256 is read
    one ulp off, and some values (1/43 / 2**18) are read by no nearby text at all."""
    from mxoid.update.loss_scaler import _as_read, exact_rescale

    target = _as_read(1 / 60) / np.float32(256)
    assert abs(_as_read(1 / 60 / 256) - target) == np.spacing(target)  # one ulp off
    found = exact_rescale(1 / 60, 256.0)
    assert found is not None and _as_read(found) == _as_read(1 / 60) / np.float32(256)
    assert exact_rescale(1 / 43, 2.0**18) is None
    X, y = classification_data(n=172)
    runs = {}
    for scale in (None, 2.0**18):
        np.random.seed(5)
        mx.random.seed(1)
        train = mx.io.NDArrayIter(X, y, batch_size=43, shuffle=True, label_name="softmax_label")
        runs[scale] = MainLoop(
            bn_mlp(),
            train,
            contexts=TWO_CPUS,
            optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
            initializer=mx.init.Xavier(),
            extensions=[FinishAfter(after_n_epochs=2)],
            loss_scale=scale,
        ).run()
    assert runs[2.0**18].update.divide_gradients
    assert runs[2.0**18].optimizer.rescale_grad == 1 / 43
    assert_identical(all_values(runs[2.0**18]), all_values(runs[None]))


# ------------------------------------------------------------------ overflows
def amp_scales(skipped, initial, growth_interval, maximum):
    """The scale after each step, by MXNet AMP's own LossScaler fed the same overflows."""
    from mxnet.contrib.amp.loss_scaler import LossScaler

    class Parameter:  # what has_overflow reads of a Gluon Parameter: its gradients
        def __init__(self, value):
            self._grad = [mx.nd.array([value])]

    scaler = LossScaler()
    scaler._loss_scale = scaler._next_loss_scale = initial
    scaler._scale_seq_len = growth_interval
    scaler._max_loss_scale = maximum
    scales = []
    for overflow in skipped:
        assert scaler.has_overflow([Parameter(np.inf if overflow else 1.0)]) == overflow
        scales.append(scaler._next_loss_scale)
    return scales


def assert_step_skipped(before, after):
    """Every device's parameters and every optimizer state as before the step."""
    for ours, theirs in zip(before["devices"], after["devices"]):
        assert_identical(ours, theirs)
    assert before["states"].keys() == after["states"].keys()
    for index, states in before["states"].items():
        for mine, other in zip(states, after["states"][index]):
            np.testing.assert_array_equal(mine, other)


@pytest.mark.parametrize("kvstore", sorted(KVSTORES))
def test_a_scale_that_overflows_float32_skips_steps_and_halves_until_it_fits(kvstore):
    """From 2**127 the gradients overflow: the first steps are skipped on both devices (their
    parameters and momentum as before), each halving the scale, then training goes on and the
    scale doubles every 3 clean steps, as AMP's LossScaler does with the same overflows."""
    kind, on_kvstore = KVSTORES[kvstore]
    rule = DynamicLossScale(initial=2.0**127, growth_interval=3, maximum=2.0**127)
    trajectory = Trajectory()
    loop = symbol_loop(
        TWO_CPUS, rule, FinishAfter(after_n_batches=20), kind, on_kvstore, extensions=[trajectory]
    ).run()
    rows = trajectory.rows
    skipped = [b["skipped"] > a["skipped"] for a, b in zip([{"skipped": 0}] + rows, rows)]
    assert skipped[0] and not all(skipped)
    for i, skip in enumerate(skipped):
        if skip and i > 0:
            assert_step_skipped(rows[i - 1], rows[i])
            # BatchNorm's moving statistics took the skipped batch's forward pass, as in AMP.
            moving = rows[i]["statistics"]["bn1_moving_mean"]
            assert not np.array_equal(rows[i - 1]["statistics"]["bn1_moving_mean"], moving)
    assert all(
        not np.array_equal(rows[0]["devices"][0][n], rows[-1]["devices"][0][n])
        for n in rows[0]["devices"][0]
    )
    assert [row["scale"] for row in rows] == amp_scales(skipped, 2.0**127, 3, 2.0**127)
    status = loop.status
    assert status.skipped_updates == sum(skipped)
    assert status.updates_done == 20 - sum(skipped) == loop.optimizer.num_update
    for values in loop.get_params()[0].values():
        assert np.isfinite(values.asnumpy()).all()


class Poison(mx.io.DataIter):
    """An NDArrayIter whose batch ``bad`` has inf in its last row: on the last device only."""

    def __init__(self, inner, bad):
        super().__init__(inner.batch_size)
        self.inner, self.bad, self.count = inner, bad, 0
        self.provide_data, self.provide_label = inner.provide_data, inner.provide_label

    def reset(self):
        self.inner.reset()

    def next(self):
        batch = self.inner.next()
        self.count += 1
        if self.count == self.bad:
            data = batch.data[0].copy()
            data[-1] = np.inf
            batch = mx.io.DataBatch([data], batch.label, pad=batch.pad)
        return batch


@pytest.mark.parametrize("accumulate", [1, 2])
@pytest.mark.parametrize("kvstore", sorted(KVSTORES))
def test_an_inf_on_one_device_skips_the_step_on_every_device(kvstore, accumulate):
    """Batch 6's last row is inf: the second device's gradients are NaN, the first device's are
    not (update_on_kvstore: nothing summed before the check); the step is skipped on both."""
    from conftest import mlp

    kind, on_kvstore = KVSTORES[kvstore]
    X, y = classification_data(n=200)
    np.random.seed(5)
    inner = mx.io.NDArrayIter(X, y, batch_size=BATCH, shuffle=True, label_name="softmax_label")
    trajectory = Trajectory()
    loop = MainLoop(
        mlp(),
        Poison(inner, bad=6),
        contexts=TWO_CPUS,
        optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
        initializer=mx.init.Xavier(),
        kvstore=kind,
        update_on_kvstore=on_kvstore,
        accumulate_batches=accumulate,
        extensions=[FinishAfter(after_n_batches=10), trajectory],
        loss_scale=DynamicLossScale(initial=2.0**10, growth_interval=100),
    ).run()
    rows = trajectory.rows
    assert [r["skipped"] for r in rows] == [0] * 5 + [1] * 5
    assert [r["scale"] for r in rows] == [2.0**10] * 5 + [2.0**9] * 5
    assert_step_skipped(rows[4], rows[5])  # batch 6 (a step's last batch either way)
    assert not np.array_equal(
        rows[5]["devices"][0]["fc1_weight"], rows[-1]["devices"][0]["fc1_weight"]
    )
    assert loop.status.updates_done == 10 // accumulate - 1 == loop.optimizer.num_update
    for values in loop.get_params()[0].values():
        assert np.isfinite(values.asnumpy()).all()
    # The skipped group is over: the next group sums batches 7 and 8 alone.
    assert loop.status.iterations_done - (loop.status.updates_done + 1) * accumulate == 0


# ---------------------------------------------------------- checkpoints
def test_a_run_stopped_and_resumed_mid_epoch_equals_the_uninterrupted_one(tmp_path):
    """Two devices, BatchNorm, Adam; the scale starts overflowing, then grows every 3 steps:
    parameters, statistics, the scale and the skipped steps bit for bit."""
    rule = DynamicLossScale(initial=2.0**127, growth_interval=3, maximum=2.0**127)
    own = 1 / 40  # a rescale_grad of one's own: resumption keeps the checkpoint's optimizer's
    options = {
        "optimizer": "adam",
        "optimizer_params": {"learning_rate": 0.01, "rescale_grad": own},
    }

    def loop(directory, stop, resume=False):
        saving = Checkpoint(str(directory), every_n_batches=4)
        return symbol_loop(
            TWO_CPUS,
            rule,
            stop,
            extensions=[saving],
            resume_from=str(directory) if resume else None,
            **dict(options),
        )

    full = loop(tmp_path / "full", FinishAfter(after_n_epochs=3)).run()
    loop(tmp_path / "cut", FinishAfter(after_n_batches=16)).run()
    again = loop(tmp_path / "cut", FinishAfter(after_n_epochs=3), resume=True)
    assert again.resumed_from is not None and again.status.loss_scale < 2.0**127
    again.run()
    assert_identical(all_values(again), all_values(full))
    for name in ("loss_scale", "skipped_updates", "updates_done"):
        assert getattr(again.status, name) == getattr(full.status, name), name
    assert full.status.skipped_updates > 0
    # A run with a fixed scale (its rescale_grad divided by it) resumed without loss scaling:
    # the loop's own rescale_grad again, no scale in the status.
    static = Checkpoint(str(tmp_path / "static"), every_n_batches=3)
    symbol_loop(
        TWO_CPUS, 2.0**10, FinishAfter(after_n_batches=6), extensions=[static], **dict(options)
    ).run()
    X, y = classification_data(n=200)
    plain = MainLoop(
        bn_mlp(),
        mx.io.NDArrayIter(X, y, batch_size=BATCH, label_name="softmax_label"),
        contexts=TWO_CPUS,
        extensions=[FinishAfter(after_n_epochs=4)],
        resume_from=str(tmp_path / "static"),
        loss_scale=None,
        **dict(options),
    )
    assert plain.optimizer.rescale_grad == own and plain.status.loss_scale is None


def test_checkpoints_hold_the_network_as_given_for_module_and_gluon(tmp_path):
    from mxnet import gluon

    from mxoid import ExponentialMovingAverage

    loop = symbol_loop(
        [mx.cpu()],
        "dynamic",
        FinishAfter(after_n_epochs=1),
        extensions=[Checkpoint(str(tmp_path / "s")), ExponentialMovingAverage(0.9)],
    ).run()
    folder = latest_checkpoint(str(tmp_path / "s")).path
    for name in ("model-symbol.json", "ema-symbol.json"):  # the averaged model's too
        with open(os.path.join(folder, name)) as handle:
            assert json.loads(handle.read()) == json.loads(bn_mlp().tojson()), name
    with open(os.path.join(folder, "loop.json")) as handle:
        assert json.load(handle)["loss_scale"] == {
            "scale": 2.0**16,
            "clean_steps": 10,
            "skipped": 0,
        }
    module = mx.mod.Module.load(os.path.join(folder, "model"), 1, logging.getLogger("quiet"))
    X, y = classification_data(n=200)
    valid = mx.io.NDArrayIter(X, y, batch_size=BATCH, label_name="softmax_label")
    module.bind(valid.provide_data, valid.provide_label, for_training=False)
    np.testing.assert_array_equal(module.predict(valid).asnumpy(), loop.predict(valid)["softmax"])
    block = gluon.SymbolBlock.imports(
        os.path.join(folder, "model-symbol.json"),
        ["data", "softmax_label"],
        os.path.join(folder, "model-0001.params"),
    )
    assert SCALE_NAME not in block.collect_params()
    assert SCALE_NAME not in loop.get_params()[0]
    # A Gluon block's checkpoint: net-symbol.json and net.params, as Gluon exports it.
    mx.random.seed(1)
    net = gluon_net()
    net.initialize(mx.init.Xavier())
    MainLoop(
        net,
        mx.io.NDArrayIter(X, y, batch_size=BATCH, label_name="label"),
        loss=gluon.loss.SoftmaxCrossEntropyLoss(),
        extensions=[FinishAfter(after_n_epochs=1), Checkpoint(str(tmp_path / "g"))],
        loss_scale="dynamic",
    ).run()
    folder = latest_checkpoint(str(tmp_path / "g")).path
    with open(os.path.join(folder, "net-symbol.json")) as handle:
        assert "_mxoid" not in handle.read()
    expected = net(mx.nd.array(X)).asnumpy()
    imported = gluon.SymbolBlock.imports(
        f"{folder}/net-symbol.json", ["data"], f"{folder}/model-0001.params"
    )
    np.testing.assert_allclose(imported(mx.nd.array(X)).asnumpy(), expected, rtol=1e-5, atol=1e-6)
    again = gluon_net()
    again.load_parameters(f"{folder}/net.params")
    np.testing.assert_array_equal(again(mx.nd.array(X)).asnumpy(), expected)


def test_a_loop_trained_with_loss_scaling_exports_the_network_as_given(tmp_path):
    """ONNX from the loop: the scale is no input, onnxruntime computes what loop.predict does."""
    onnx = pytest.importorskip("onnx", reason="exporting needs onnx: pip install 'mxoid[onnx]'")
    pytest.importorskip("onnxruntime", reason="checking needs onnxruntime: 'mxoid[onnx]'")
    if not hasattr(onnx, "mapping"):  # pragma: no cover
        pytest.skip(f"onnx {onnx.__version__} lacks onnx.mapping (MXNet's exporter): onnx<1.19")
    from mxoid.export import export_onnx

    loop = symbol_loop([mx.cpu()], "dynamic", FinishAfter(after_n_epochs=1)).run()
    [exported] = export_onnx(loop, tmp_path / "model.onnx")
    assert exported.inputs == {"data": ("batch", 10)} and exported.outputs == ["softmax"]
    assert exported.max_difference < 1e-5
    model = onnx.load(exported.path)
    assert [i.name for i in model.graph.input] == ["data"]


# ------------------------------------------------------------ float16 on a GPU
AMP_GLUON_LOOP = r"""
import json, os
import mxnet as mx, numpy as np
from mxnet import autograd, gluon
from mxnet.contrib import amp

amp.init(target_dtype="float16")  # patches MXNet's operators: in a process of its own
arrays = np.load(os.environ["LOSS_SCALE_DIGITS"])
Xt, yt, Xv, yv = (arrays[k] for k in ("Xt", "yt", "Xv", "yv"))
ctx = mx.gpu(0)
mx.random.seed(1)
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Dense(64), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"), gluon.nn.Dense(10))
net.initialize(mx.init.Xavier())
net(mx.nd.zeros((1, 64)))
net.collect_params().reset_ctx(ctx)
net.hybridize(static_alloc=True)
trainer = gluon.Trainer(
    net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9}, kvstore=None
)
amp.init_trainer(trainer)
scaler, skipped = trainer._amp_loss_scaler, []
check = scaler.has_overflow

def counting(params):
    overflow = check(params)
    skipped.append(bool(overflow))
    return overflow

scaler.has_overflow = counting
loss_function = gluon.loss.SoftmaxCrossEntropyLoss()
np.random.seed(5)
train = mx.io.NDArrayIter(Xt, yt, int(os.environ["LOSS_SCALE_BATCH"]), shuffle=True)
for epoch in range(int(os.environ["LOSS_SCALE_EPOCHS"])):
    train.reset()
    for batch in train:
        x, y = batch.data[0].as_in_context(ctx), batch.label[0].as_in_context(ctx)
        with autograd.record():
            loss = loss_function(net(x), y)
            with amp.scale_loss(loss, trainer) as scaled:
                autograd.backward(scaled)
        trainer.step(x.shape[0])
predicted = net(mx.nd.array(Xv, ctx=ctx)).argmax(axis=1).asnumpy()
print(json.dumps({"accuracy": float((predicted == yv).mean()), "skipped": sum(skipped),
                  "steps": len(skipped), "scale": scaler.loss_scale}))
"""


@pytest.mark.skipif(
    mx.context.num_gpus() == 0,
    reason="mixed_precision='float16' (with its dynamic loss scaling) needs a GPU; this "
    "machine has none",
)
def test_float16_on_a_gpu_trains_as_mxnets_amp_gluon_loop(tmp_path):
    """A Gluon MLP with BatchNorm, 10 epochs of the digits on one GPU: MainLoop's float16 with
    its default dynamic loss scaling against a hand-written Gluon loop with MXNet's AMP
    (amp.init, init_trainer, scale_loss; in a process of its own, amp.init patches MXNet).
    The two convert the graph differently (AMP's symbol conversion against its operator
    patching), so they are compared by held-out accuracy and by the steps they skipped."""
    from conftest import json_from_fresh_python
    from mxnet import gluon
    from networks import digits_images

    X, y = digits_images()
    X = X.reshape(len(X), -1)
    order = np.random.RandomState(0).permutation(len(X))
    X, y = X[order], y[order]
    Xt, yt, Xv, yv = X[:1400], y[:1400], X[1400:], y[1400:]
    np.savez(tmp_path / "digits.npz", Xt=Xt, yt=yt, Xv=Xv, yv=yv)
    batch, epochs = 50, 10
    amp_run = json_from_fresh_python(
        AMP_GLUON_LOOP,
        LOSS_SCALE_DIGITS=str(tmp_path / "digits.npz"),
        LOSS_SCALE_BATCH=str(batch),
        LOSS_SCALE_EPOCHS=str(epochs),
    )
    ours = {}
    for precision in (None, "float16"):
        mx.random.seed(1)
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Dense(64), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"))
        net.add(gluon.nn.Dense(10))
        net.initialize(mx.init.Xavier())
        np.random.seed(5)
        loop = MainLoop(
            net,
            mx.io.NDArrayIter(Xt, yt, batch, shuffle=True, label_name="label"),
            loss=gluon.loss.SoftmaxCrossEntropyLoss(),
            contexts=[mx.gpu(0)],
            optimizer_params={"learning_rate": 0.05, "momentum": 0.9},
            extensions=[FinishAfter(after_n_epochs=epochs)],
            mixed_precision=precision,
        ).run()
        predicted = net(mx.nd.array(Xv)).argmax(axis=1).asnumpy()
        ours[precision] = (float((predicted == yv).mean()), loop.status)
        assert all(p.data().dtype == np.float32 for p in net.collect_params().values())
    accuracy, status = ours["float16"]
    print("float16 loop:", accuracy, status.skipped_updates, status.loss_scale, "AMP:", amp_run)
    assert status.loss_scale is not None and 1 <= status.loss_scale <= 2.0**24  # 'auto': dynamic
    assert np.log2(status.loss_scale) == int(np.log2(status.loss_scale))
    assert status.updates_done + status.skipped_updates == amp_run["steps"]
    assert abs(status.skipped_updates - amp_run["skipped"]) <= 2, amp_run
    assert accuracy >= amp_run["accuracy"] - 0.01, amp_run
    assert accuracy >= ours[None][0] - 0.01, ours[None][0]


def test_the_metric_extensions_record_what_they_record_without_loss_scaling():
    """TrainingMonitoring's private heads and Evaluate's forward passes read the graph with the
    scale (its forward is exact): the same records, bit for bit; DataCheck still finds the
    softmax's labels."""
    from mxoid import DataCheck, Evaluate, TrainingMonitoring

    X, y = classification_data(n=200)
    logs = {}
    for scale in (None, "dynamic"):
        valid = mx.io.NDArrayIter(X[:60], y[:60], batch_size=BATCH, label_name="softmax_label")
        extensions = [
            TrainingMonitoring(["acc", "ce"], every_n_batches=5),
            Evaluate({"valid": valid}, metrics=["acc", "ce"]),
            DataCheck(),
        ]
        loop = symbol_loop(TWO_CPUS, scale, FinishAfter(after_n_epochs=2), extensions=extensions)
        loop.run()
        logs[scale] = [
            {k: v for k, v in loop.log[i].items() if k.startswith(("train_", "valid_"))}
            for i in loop.log
        ]
    assert any(row for row in logs[None]) and logs["dynamic"] == logs[None]


@pytest.mark.parametrize("devices", ["one", "two"])
def test_bfloat16_with_loss_scaling_trains_bit_for_bit_as_without(devices):
    """bfloat16 needs no loss scaling, but takes it: a power of two commutes with bfloat16's
    rounding as with float32's (the same exponent range)."""
    from mxoid.precision import bfloat16_support

    if bfloat16_support() is not None:
        pytest.skip(f"this CPU does not compute bfloat16 in MXNet's MKLDNN ({bfloat16_support()})")
    trained = {}
    for scale in (None, DynamicLossScale(initial=2.0**6, growth_interval=5)):
        stop = FinishAfter(after_n_epochs=2)
        loop = symbol_loop(DEVICES[devices], scale, stop, mixed_precision="bfloat16").run()
        trained[scale is None] = all_values(loop)
        assert loop.mixed_precision == "bfloat16"
    assert_identical(trained[False], trained[True])
    assert loop.status.loss_scale == 2.0**6 * 2**4  # 20 steps, doubled every 5
