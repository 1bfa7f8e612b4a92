"""The networks people train: BatchNorm, depthwise convolutions and Dropout, on one and two
devices, with evaluation at the training batch size, checkpoints and resumption.

The reference is MXNet's own ``Module.fit``, with its BatchNorm race taken out:
MXNet 1.9.1's BatchNorm writes ``moving_mean`` / ``moving_var`` in its backward
pass without declaring the write to the engine, and ``Module.fit`` reads them at
each epoch end (``get_params()``, then ``set_params()`` on every device) without
waiting, so it can write stale statistics back. :class:`WaitingModule` waits for
the engine before that read; nothing else of ``Module`` changes.
"""

import logging
import os
import shutil
import threading

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS
from networks import NETWORKS, digits_images, fix_gamma_names, initial_params, network, resnet20

from mxoid import Checkpoint, Evaluate, Extension, FinishAfter, MainLoop, TrainingMonitoring
from mxoid.checkpoint import list_checkpoints, read_checkpoint

BATCH = 32
OPTIMIZER_PARAMS = {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4}
DEVICES = {"one": [mx.cpu()], "two": TWO_CPUS}
SEED = 7


def train_iter(n=128, seed=3):
    X, y = digits_images(n)
    np.random.seed(seed)
    return mx.io.NDArrayIter(X, y, batch_size=BATCH, shuffle=True, label_name="softmax_label")


def valid_iter(batch_size=BATCH):
    X, y = digits_images()
    # 100 samples: at batch 32 the last batch is padded, and padding must not count.
    return mx.io.NDArrayIter(X[-100:], y[-100:], batch_size=batch_size, label_name="softmax_label")


def host(params):
    return {name: value.asnumpy() for name, value in params.items()}


def make_loop(name, contexts, extensions, kvstore="local", resume_from=None, n=128, **options):
    net = network(name)
    args, aux = initial_params(net, (BATCH, 1, 8, 8))
    mx.random.seed(SEED)
    return MainLoop(
        net,
        train_iter(n),
        contexts=contexts,
        kvstore=kvstore,
        arg_params=args,
        aux_params=aux,
        optimizer="sgd",
        optimizer_params=dict(OPTIMIZER_PARAMS),
        extensions=extensions,
        resume_from=resume_from,
        exit_on_interrupt=False,
        **options,
    )


def loop_params(loop):
    args, aux = loop.get_params()
    return host(args), host(aux)


def assert_same(a, b, skip=(), exact=True):
    assert a.keys() == b.keys()
    for key in sorted(set(a) - set(skip)):
        if exact:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        else:
            np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-6, err_msg=key)


# --------------------------------------------------------- against Module.fit
class WaitingModule(mx.mod.Module):
    """``Module`` whose epoch-end parameter sync waits for the engine first (the race removed)."""

    def get_params(self):
        mx.nd.waitall()
        return super().get_params()


def module_fit(name, contexts, kvstore, epochs, module_class=WaitingModule, eval_data=None):
    net = network(name)
    args, aux = initial_params(net, (BATCH, 1, 8, 8))
    mx.random.seed(SEED)
    module = module_class(net, context=contexts, logger=logging.getLogger("quiet"))
    module.fit(
        train_iter(),
        num_epoch=epochs,
        optimizer="sgd",
        optimizer_params=dict(OPTIMIZER_PARAMS),
        arg_params=args,
        aux_params=aux,
        kvstore=kvstore,
        eval_data=eval_data,
        eval_metric=["acc", "ce"],
    )
    mx.nd.waitall()
    got_args, got_aux = module.get_params()
    return host(got_args), host(got_aux)


CONFIGURATIONS = [("one", "local"), ("two", "local"), ("two", "device")]


@pytest.mark.parametrize("devices,kvstore", CONFIGURATIONS)
@pytest.mark.parametrize("name", NETWORKS)
def test_parameters_and_statistics_equal_module_fit(name, devices, kvstore):
    """Two epochs of four batches: the epoch-end averaging of the devices' statistics included."""
    loop = make_loop(name, DEVICES[devices], [FinishAfter(after_n_epochs=2)], kvstore=kvstore)
    start_args, start_aux = loop_params(loop)
    ours = loop_params(loop.run())
    theirs = module_fit(name, DEVICES[devices], kvstore, epochs=2)
    for key in start_args:
        if key not in fix_gamma_names(network(name)):
            assert not np.array_equal(ours[0][key], start_args[key]), key
    assert_same(ours[0], theirs[0])
    assert_same(ours[1], theirs[1])
    for key in start_aux:  # the statistics moved: there was something to get wrong
        assert not np.array_equal(ours[1][key], start_aux[key]), key


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "mxnet-operators"])
@pytest.mark.parametrize("devices", ["one", "two"])
def test_mobilenet_with_evaluation_equals_module_fit_with_eval_data(devices, fused, monkeypatch):
    """MXNet's depthwise-convolution network with BatchNorm(fix_gamma=True): an Evaluate at the
    training batch size after every epoch, computed with mxoid's fused operator or with
    MXNet's, leaves training as it was; mxoid equals Module.fit with eval_data (whose
    get_params() returns the host copy taken before its score; its executors hold the
    gammas its score wrote 1 into)."""
    from mxoid.metrics import native

    if not fused:
        monkeypatch.setattr(native, "available", lambda: False)
    evaluate = Evaluate({"valid": valid_iter()}, ["acc", "ce"])
    loop = make_loop("mobilenet", DEVICES[devices], [FinishAfter(after_n_epochs=2), evaluate])
    ours = loop_params(loop.run())
    plain = loop_params(
        make_loop("mobilenet", DEVICES[devices], [FinishAfter(after_n_epochs=2)]).run()
    )
    theirs = module_fit("mobilenet", DEVICES[devices], "local", epochs=2, eval_data=valid_iter())
    assert "valid_accuracy" in loop.log[8]
    assert_same(ours[0], plain[0])
    assert_same(ours[1], plain[1])
    assert_same(ours[0], theirs[0])
    assert_same(ours[1], theirs[1])


class BackwardGate(mx.operator.CustomOp):
    """The identity, whose backward pass waits for :data:`GATE` (at most a minute)."""

    def forward(self, is_train, req, in_data, out_data, aux):
        self.assign(out_data[0], req[0], in_data[0])

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        GATE.wait(timeout=60)
        self.assign(in_grad[0], req[0], out_grad[0])


@mx.operator.register("mxoid_backward_gate")
class BackwardGateProp(mx.operator.CustomOpProp):
    def __init__(self):
        super().__init__(need_top_grad=True)

    def create_operator(self, ctx, shapes, dtypes):
        return BackwardGate()


GATE = threading.Event()


class GateOpeningModule(mx.mod.Module):
    """Stock ``Module``, but it opens :data:`GATE` once its epoch-end ``get_params()`` has
    returned (its copies pushed to the engine, not waited for)."""

    def get_params(self):
        params = super().get_params()
        GATE.set()
        return params


def test_module_fit_itself_saves_stale_batchnorm_statistics():
    """What the README says of Module.fit. ResNet-20 on 3x28x28 images, one epoch of three
    batches: at the epoch end Module.fit copies the statistics while the last backward pass
    is still writing them, and writes the stale copy back; mxoid waits (and equals the
    waiting Module, above).

    How long the last backward pass runs decides whether the race shows: here the
    backward pass of the last batch is held (an identity operator before the loss waits
    for a gate) until Module.fit has pushed its copy, as a slower device or a busy machine
    holds it. Were MXNet's copy ordered after the backward pass, it would wait for the
    gate, see the new statistics, and this test would fail."""
    net = resnet20()
    fc, label = net.get_children()
    gated = mx.sym.SoftmaxOutput(
        mx.sym.Custom(fc, op_type="mxoid_backward_gate"), label, name="softmax"
    )
    rng = np.random.RandomState(0)
    X, y = rng.rand(96, 3, 28, 28).astype("float32"), rng.randint(0, 10, 96).astype("float32")
    args, aux = initial_params(net, (BATCH, 3, 28, 28))

    def close_gate_before_last_batch(params):
        if params.nbatch == 1:
            GATE.clear()

    results = {}
    runs = (
        ("waiting", WaitingModule, net, None),
        ("stock", GateOpeningModule, gated, close_gate_before_last_batch),
    )
    GATE.set()
    for name, module_class, symbol, callback in runs:
        module = module_class(symbol, context=[mx.cpu()], logger=logging.getLogger("quiet"))
        try:
            module.fit(
                mx.io.NDArrayIter(X, y, BATCH, label_name="softmax_label"),
                num_epoch=1,
                optimizer="sgd",
                optimizer_params=dict(OPTIMIZER_PARAMS),
                arg_params=args,
                aux_params=aux,
                batch_end_callback=callback,
            )
            mx.nd.waitall()
        finally:
            GATE.set()
        results[name] = host(module.get_params()[1])
    loop = MainLoop(
        net,
        mx.io.NDArrayIter(X, y, BATCH, label_name="softmax_label"),
        arg_params=args,
        aux_params=aux,
        optimizer_params=dict(OPTIMIZER_PARAMS),
        extensions=[FinishAfter(after_n_epochs=1)],
    ).run()
    ours = loop_params(loop)[1]
    assert_same(ours, results["waiting"])
    right, wrong = results["waiting"], results["stock"]
    errors = {
        k: np.abs(wrong[k] - right[k]).max() / np.abs(right[k]).max()
        for k in right
        if k.endswith("moving_var")
    }
    assert max(errors.values()) > 0.05, errors


# ----------------------------------------------------------------- evaluation
class EveryDeviceAfterWait(Extension):
    """After each checkpoint: the checkpoint's files, and every device's arrays read after
    waiting for the whole engine."""

    def __init__(self, seen):
        super().__init__(priority=250, after_batch=True, after_epoch=True, after_training=True)
        self.seen = seen

    def do(self, which_callback, *args):
        row = self.main_loop.log.current_row
        if "checkpoint_saved_to" not in row:
            return
        mx.nd.waitall()
        manager = self.main_loop.manager
        devices = [
            (
                {n: a[k].asnumpy() for n, a in zip(manager.param_names, manager.param_arrays)},
                {n: a[k].asnumpy() for n, a in zip(manager.aux_names, manager.aux_arrays)},
            )
            for k in range(len(manager.contexts))
        ]
        self.seen.append((row["checkpoint_saved_to"], devices))


@pytest.mark.parametrize("with_evaluate", [False, True])
@pytest.mark.parametrize("devices", ["one", "two"])
@pytest.mark.parametrize("name", NETWORKS)
def test_every_checkpoint_holds_what_every_device_holds(tmp_path, name, devices, with_evaluate):
    seen = []
    extensions = [
        FinishAfter(after_n_epochs=2),
        Checkpoint(str(tmp_path), every_n_batches=3, keep_last=None),
        EveryDeviceAfterWait(seen),
    ]
    if with_evaluate:
        extensions.append(Evaluate({"valid": valid_iter()}, ["acc", "ce"]))
    make_loop(name, DEVICES[devices], extensions).run()
    assert len(seen) >= 4  # batches 3 and 6, epochs 1 (4) and 2 (8)
    for path, device_arrays in seen:
        saved = read_checkpoint(path)
        for args, aux in device_arrays:
            assert_same(host(saved.arg_params), args)
            assert_same(host(saved.aux_params), aux)


def predict_with_module(path, contexts):
    """Load a checkpoint folder with mx.mod.Module and predict the validation samples."""
    epoch = read_checkpoint(path).loop_state["status"]["epochs_done"]
    module = mx.mod.Module.load(
        os.path.join(path, "model"), epoch, context=contexts, logger=logging.getLogger("quiet")
    )
    it = valid_iter()
    module.bind(it.provide_data, it.provide_label, for_training=False)
    return module.predict(it).asnumpy()  # Module.predict drops the padding


def accuracy_and_cross_entropy(probabilities):
    _, y = digits_images()
    labels = y[-100:].astype(int)
    accuracy = float((probabilities.argmax(axis=1) == labels).mean())
    cross_entropy = float(-np.log(probabilities[np.arange(100), labels] + 1e-12).mean())
    return accuracy, cross_entropy


@pytest.mark.parametrize("devices", ["one", "two"])
@pytest.mark.parametrize("name", NETWORKS)
def test_a_checkpoint_loaded_in_module_predicts_what_evaluate_recorded(tmp_path, name, devices):
    loop = make_loop(
        name,
        DEVICES[devices],
        [
            FinishAfter(after_n_epochs=2),
            Evaluate({"valid": valid_iter()}, ["acc", "ce"]),
            Checkpoint(str(tmp_path), keep_last=None),
        ],
    ).run()
    for iteration in (4, 8):
        row = loop.log[iteration]
        accuracy, cross_entropy = accuracy_and_cross_entropy(
            predict_with_module(row["checkpoint_saved_to"], [mx.cpu()])
        )
        assert row["valid_accuracy"] == pytest.approx(accuracy, abs=1e-9)
        assert row["valid_cross_entropy"] == pytest.approx(cross_entropy, rel=1e-5)


@pytest.mark.parametrize("name", NETWORKS)
def test_two_device_evaluation_equals_one_device_evaluation_of_get_params(name):
    evaluate = Evaluate({"valid": valid_iter(), "small": valid_iter(batch_size=10)}, ["acc", "ce"])
    loop = make_loop(
        name,
        TWO_CPUS,
        [
            FinishAfter(after_n_batches=6),
            evaluate,
            Evaluate({"mid": valid_iter()}, ["acc", "ce"], every_n_batches=6, name="mid"),
        ],
    ).run()
    args, aux = loop.get_params()
    one = make_loop(name, [mx.cpu()], [FinishAfter(after_n_epochs=1)])
    one.manager.set_params(args, aux)
    reference = Evaluate({"valid": valid_iter()}, ["acc", "ce"])
    reference.attach(one)
    expected = reference.evaluate()
    records = loop.log[6]
    for prefix in ("mid", "valid", "small"):
        if f"{prefix}_accuracy" not in records:
            continue
        assert records[f"{prefix}_accuracy"] == pytest.approx(expected["valid_accuracy"], abs=1e-9)
        assert records[f"{prefix}_cross_entropy"] == pytest.approx(
            expected["valid_cross_entropy"], rel=1e-5
        )
    assert "mid_accuracy" in records


@pytest.mark.parametrize("executors", ["own", "training"])
@pytest.mark.parametrize("devices", ["one", "two"])
@pytest.mark.parametrize("name", NETWORKS)
def test_evaluation_at_the_training_batch_size_does_not_change_training(name, devices, executors):
    """Evaluation at the training shapes, under MKLDNN, on executors of its own that share the
    training parameters and memory pool (device metrics: computed in their graph), or on
    the training executors themselves (a host metric: no graph to put it in) unless the
    network has BatchNorms with fix_gamma: a forward pass writes 1 into their gamma, so an
    evaluation gets gammas of its own. Every parameter and statistic must come out equal
    (before that rule, the fix_gamma gammas of ResNet and MobileNet did not)."""
    plain = loop_params(make_loop(name, DEVICES[devices], [FinishAfter(after_n_epochs=3)]).run())
    metrics = ["acc", "ce"] if executors == "own" else [mx.metric.Accuracy()]
    evaluated_loop = make_loop(
        name,
        DEVICES[devices],
        [
            FinishAfter(after_n_epochs=3),
            Evaluate({"valid": valid_iter()}, metrics),
            TrainingMonitoring(["acc", "ce"]),
        ],
    )
    evaluation_set = evaluated_loop.extensions[1]._accumulators["valid"].manager
    training_set = evaluated_loop.manager.training_set
    fixed = fix_gamma_names(network(name))
    assert (evaluation_set is training_set) == (executors == "training" and not fixed)
    shared = [n for n in training_set.param_names if n not in fixed]
    for name_ in shared:  # the same arrays, not copies
        index = training_set.param_names.index(name_)
        assert evaluation_set.param_arrays[index][0] is training_set.param_arrays[index][0]
    evaluated = loop_params(evaluated_loop.run())
    assert "valid_accuracy" in evaluated_loop.log[12]
    assert_same(plain[0], evaluated[0])
    assert_same(plain[1], evaluated[1])


@pytest.mark.parametrize("name", NETWORKS)
def test_waiting_for_the_engine_every_batch_changes_nothing_trained(name):
    """The bound on the host's lead at its tightest (max_batches_ahead=2: a mark and a wait
    after every training and evaluation batch) against no bound, on two devices, with
    Evaluate at the training batch size and TrainingMonitoring: the same parameters,
    BatchNorm statistics and records, bit for bit."""

    def run(limit):
        extensions = [
            FinishAfter(after_n_epochs=2),
            Evaluate({"valid": valid_iter()}, ["acc", "ce"]),
            TrainingMonitoring(["acc", "ce"]),
        ]
        loop = make_loop(name, TWO_CPUS, extensions, max_batches_ahead=limit).run()
        records = [
            {k: v for k, v in row.items() if k.startswith(("valid_", "train_"))}
            for _, row in loop.log.items()
        ]
        return loop_params(loop), records

    (tight_args, tight_aux), tight_records = run(2)
    (free_args, free_aux), free_records = run(None)
    assert_same(tight_args, free_args)
    assert_same(tight_aux, free_aux)
    assert tight_records == free_records and any(tight_records)


# ----------------------------------------------------------------- resumption
def resumable_extensions(directory, epochs):
    return [
        FinishAfter(after_n_epochs=epochs),
        TrainingMonitoring(["acc", "ce"], every_n_batches=3),
        Evaluate({"valid": valid_iter()}, ["acc", "ce"]),
        Checkpoint(str(directory), every_n_batches=3, keep_last=None),
    ]


def comparable_rows(loop):
    rows = {}
    for iteration, row in loop.log.items():
        rows[iteration] = {
            k: (os.path.basename(v).split("-", 2)[2] if k == "checkpoint_saved_to" else v)
            for k, v in row.items()
            if k != "resumed_from"
        }
    return rows


@pytest.mark.parametrize("where", ["mid-epoch", "epoch boundary"])
@pytest.mark.parametrize("devices", ["one", "two"])
@pytest.mark.parametrize("name", NETWORKS)
def test_resumption_is_bit_identical(tmp_path, name, devices, where):
    full = make_loop(name, DEVICES[devices], resumable_extensions(tmp_path / "full", 3)).run()
    # Batch 6 is in the middle of epoch 2; batch 4 ends epoch 1 (saved after every epoch).
    wanted = "epoch0001-batch00000006" if where == "mid-epoch" else "epoch0001-batch00000004"
    (source,) = [p for p in list_checkpoints(str(tmp_path / "full")) if p.endswith(wanted)]
    os.makedirs(tmp_path / "cut")
    shutil.copytree(source, tmp_path / "cut" / os.path.basename(source))
    np.random.seed(99)
    mx.random.seed(99)  # whatever ran in between: resumption restores the random states
    resumed = make_loop(
        name,
        DEVICES[devices],
        resumable_extensions(tmp_path / "cut", 3),
        resume_from=str(tmp_path / "cut"),
    )
    assert resumed.resumed_from is not None
    resumed.run()
    full_params, resumed_params = loop_params(full), loop_params(resumed)
    assert_same(full_params[0], resumed_params[0])
    assert_same(full_params[1], resumed_params[1])
    assert comparable_rows(full) == comparable_rows(resumed)
    assert "train_cross_entropy" in resumed.log[9] and "valid_accuracy" in resumed.log[12]
