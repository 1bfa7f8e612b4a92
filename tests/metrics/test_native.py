"""mxoid's fused metric operator: built from C++ on first use, the same values as MXNet's.

The metric head computes accuracy and cross-entropy with about ten MXNet operators
per device and batch; ``mxoid.metrics.native`` builds one operator that computes
them bit for bit the same, and the head falls back to MXNet's operators wherever
the operator cannot be built, loaded or applied.
"""

import json
import os
import shutil
import textwrap

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS, json_from_fresh_python
from monitored import LEARNING, dataset

from mxoid import Evaluate, FinishAfter, MainLoop, TrainingMonitoring
from mxoid.metrics import create_metrics, native
from mxoid.metrics.device import _accuracy_float32, _negative_log_likelihood
from mxoid.metrics.head import per_row_head

HAS_COMPILER = bool(os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++"))
needs_compiler = pytest.mark.skipif(
    not HAS_COMPILER, reason="no C++ compiler here: the fused operator cannot be built"
)


def _ops(symbol):
    return [node["op"] for node in json.loads(symbol.tojson())["nodes"] if node["op"] != "null"]


def _symbol_values(pred, label, shape, columns):
    """The per-row values as the head builds them from MXNet's operators (float32 inputs)."""
    build = {"accuracy": _accuracy_float32, "cross_entropy": _negative_log_likelihood}
    sums = [build[c](pred, label, shape, shape[:1])[0] for c in columns]
    return mx.sym.cast(mx.sym.stack(*sums, axis=1), dtype="float64")


@needs_compiler
@pytest.mark.parametrize("columns", [["accuracy", "cross_entropy"], ["cross_entropy", "accuracy"]])
def test_the_fused_operator_computes_mxnets_values_bit_for_bit(columns):
    """Scores with ties, zeros, denormals, infinities and NaNs, and labels fractional,
    negative, out of range, beyond int32, infinite and NaN: every value equal, NaN where
    MXNet's is NaN."""
    assert native.available(), native.unavailable_reason()
    rng = np.random.RandomState(0)
    rows, classes = 400, 7
    pred = rng.rand(rows, classes).astype(np.float32)
    pred[:50] /= pred[:50].sum(axis=1, keepdims=True)
    special = [0.0, 1.0, 1e-40, 1e-12, np.inf, -np.inf, np.nan, -0.0, 3.4e38, -3.4e38, -5.0]
    pick = rng.rand(rows, classes) < 0.15
    pred[pick] = rng.choice(special, size=int(pick.sum()))
    pred[60:70] = 0.5  # all tied
    pred[70:75] = -np.inf
    label = rng.randint(0, classes, rows).astype(np.float32)
    odd = [0.7, 1.99, 2.5, -0.5, -1.0, 6.0, 7.0, 1e10, -1e10, 3e9, np.nan, np.inf, -np.inf]
    label[: len(odd) * 10] = np.repeat(odd, 10)
    p, lab = mx.sym.var("p"), mx.sym.var("lab")
    fused = native.metric_rows(p, lab, columns)
    reference = _symbol_values(p, lab, (rows, classes), columns)
    assert _ops(fused) == ["mxoid_metric_rows"] and len(_ops(reference)) > 8
    inputs = {"p": mx.nd.array(pred), "lab": mx.nd.array(label)}
    got, want = (s.bind(mx.cpu(), inputs) for s in (fused, reference))
    with np.errstate(invalid="ignore"):
        got, want = (e.forward()[0].asnumpy() for e in (got, want))
    assert got.dtype == want.dtype == np.float64 and got.shape == (rows, len(columns))
    np.testing.assert_array_equal(got, want)  # NaN where NaN, bit-equal elsewhere
    assert np.isnan(want).any() and np.isinf(want).any()  # the specials were exercised
    assert 0 < want[:, columns.index("accuracy")].mean() < 1


@needs_compiler
def test_the_summing_operator_adds_its_values_while_counting_and_only_then():
    """mxoid_metric_sums gives mxoid_metric_rows's values, and adds them to the sums it
    keeps (an auxiliary state) in the forward passes where its switch is not 0."""
    assert native.available(), native.unavailable_reason()
    rng = np.random.RandomState(3)
    p, lab = mx.sym.var("p"), mx.sym.var("lab")
    columns = ["accuracy", "cross_entropy"]
    counting, sums = mx.sym.var("on", dtype="float64"), mx.sym.var("sums", dtype="float64")
    symbol = native.metric_sums(p, lab, columns, counting, sums)
    assert symbol.list_auxiliary_states() == ["sums"] and "on" in symbol.list_arguments()
    pred = mx.nd.array(rng.rand(6, 4).astype(np.float32))
    label = mx.nd.array(rng.randint(0, 4, 6).astype(np.float32))
    on = mx.nd.ones((1,), dtype="float64")
    executor = symbol.bind(
        mx.cpu(),
        {"p": pred, "lab": label, "on": on},
        aux_states={"sums": mx.nd.zeros((6, 2), dtype="float64")},
    )
    values = native.metric_rows(p, lab, columns).bind(mx.cpu(), {"p": pred, "lab": label})
    want = values.forward()[0].asnumpy()
    for switch, passes in ((1, 2), (0, 3), (1, 1)):
        on[:] = switch
        for _ in range(passes):
            np.testing.assert_array_equal(executor.forward(is_train=False)[0].asnumpy(), want)
    np.testing.assert_array_equal(executor.aux_dict["sums"].asnumpy(), 3 * want)


@needs_compiler
def test_the_head_takes_the_fused_operator_only_where_it_computes_the_same_values():
    assert native.available(), native.unavailable_reason()
    data = mx.sym.var("data")
    net = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(data, num_hidden=4), name="softmax")
    shapes = {"data": (8, 5), "softmax_label": (8,)}

    def head(names, running_sums="_mxoid_running_sums0", **kwargs):
        metrics = [("softmax", m) for m in create_metrics(names)]
        return per_row_head(net, metrics, ["softmax_label"], shapes, [4, 4], running_sums, **kwargs)

    fused = _ops(head(["acc", "ce", "nll_loss", "f1"]))  # a host metric is not in the head
    # With running sums, one operator computes the values and adds them: no MakeLoss and
    # nothing in the backward pass; without, the one that computes them.
    assert fused.count("mxoid_metric_sums") == 1 and "argmax" not in fused
    assert "MakeLoss" not in fused and "mxoid_metric_rows" not in fused
    values = _ops(head(["acc", "ce"], running_sums=None))
    assert values.count("mxoid_metric_rows") == 1 and "mxoid_metric_sums" not in values
    for others in (
        head(["acc", "top_k_accuracy_2"]),  # a metric it does not compute
        head(["acc", "ce"], input_types={"softmax_label": "float64"}),  # not float32
        head(["acc", "ce"], native=False),
    ):
        assert "mxoid_metric" not in " ".join(_ops(others)) and "argmax" in _ops(others)
        assert "MakeLoss" in _ops(others)  # the backward pass adds the values


def _monitored_loop(net, X, y, arg_params):
    """Two epochs of batches of 20 with TrainingMonitoring (acc, ce) every 2 batches, and
    after every batch an Evaluate with a host metric at the training batch size: forward
    passes of the training executors, which must not count in the training sums."""
    again = mx.io.NDArrayIter(X[:40], y[:40], 20, label_name="softmax_label")
    return MainLoop(
        net,
        mx.io.NDArrayIter(X, y, 20, label_name="softmax_label"),
        arg_params=arg_params,
        optimizer_params=dict(LEARNING),
        extensions=[
            TrainingMonitoring(["acc", "ce"], every_n_batches=2),
            Evaluate({"again": again}, [mx.metric.Accuracy()], every_n_batches=1),
            FinishAfter(after_n_epochs=2),
        ],
    )


@needs_compiler
def test_training_records_are_the_same_with_and_without_the_fused_operator(monkeypatch):
    """TrainingMonitoring and Evaluate, padded batches included, record the same values
    whether the head takes the fused operator or MXNet's (the values are bit-equal, the
    sums add them in the same order)."""
    X, y = dataset("train", 90)
    Xv, yv = dataset("valid")
    records = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(native, "available", lambda: False)
        data = mx.sym.var("data")
        fc = mx.sym.FullyConnected(data, num_hidden=3, name="fc")
        net = mx.sym.SoftmaxOutput(fc, name="softmax")
        weight = np.linspace(-1, 1, 30, dtype=np.float32).reshape(3, 10)
        loop = _monitored_loop(
            net, X, y, {"fc_weight": mx.nd.array(weight), "fc_bias": mx.nd.zeros(3)}
        )
        assert ("mxoid_metric_sums" in loop.manager.training_set.bound_symbol.tojson()) == fused
        assert loop.extensions[1]._accumulators["again"].manager is loop.manager.training_set
        loop.run()
        valid = mx.io.NDArrayIter(Xv, yv, 20, label_name="softmax_label", last_batch_handle="pad")
        scored = loop.score(valid, ["acc", "ce"])
        trained = {
            (i, name): value
            for i in loop.log
            for name, value in loop.log[i].items()
            if name.startswith(("train_", "again_"))
        }
        records.append((trained, scored))
    assert records[0] == records[1]
    # acc and ce at batches 2 and 4 and each epoch end; the evaluation after every batch
    assert len(records[0][0]) == 2 * 2 * 3 + 2 * 5
    assert set(records[0][1]) == {"valid_accuracy", "valid_cross_entropy"}


def test_the_operator_serves_one_cpu_with_mxnets_one_random_generator(monkeypatch):
    """MXNet gives a library's operators a parallel random generator: on one CPU with
    MXNet's one generator that changes nothing; executors on two CPUs would wait for each
    other, and with several generators the operator would take one a Dropout gets
    without it. The operator has no GPU code."""
    monkeypatch.delenv("MXNET_CPU_PARALLEL_RAND_COPY", raising=False)
    assert native.suits(None) and native.suits([mx.cpu(0)]) and native.suits([mx.cpu(1)])
    assert not native.suits([mx.cpu(0), mx.cpu(1)])
    assert not native.suits([mx.gpu(0)]) and not native.suits([mx.cpu(0), mx.gpu(0)])
    for one in ("1", " 1", "01"):
        monkeypatch.setenv("MXNET_CPU_PARALLEL_RAND_COPY", one)
        assert native.suits([mx.cpu(0)])
    for copies in ("2", "4", "two", ""):
        monkeypatch.setenv("MXNET_CPU_PARALLEL_RAND_COPY", copies)
        assert not native.suits([mx.cpu(0)]) and not native.suits([mx.cpu(0), mx.cpu(1)])


@needs_compiler
@pytest.mark.parametrize("copies", [None, "2"])
def test_on_two_cpus_the_head_takes_mxnets_operators(monkeypatch, copies):
    if copies is None:
        monkeypatch.delenv("MXNET_CPU_PARALLEL_RAND_COPY", raising=False)
    else:
        monkeypatch.setenv("MXNET_CPU_PARALLEL_RAND_COPY", copies)
    X, y = dataset("train", 40)
    loops = [
        MainLoop(
            mx.sym.SoftmaxOutput(
                mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=3), name="softmax"
            ),
            mx.io.NDArrayIter(X, y, 20, label_name="softmax_label"),
            contexts=TWO_CPUS[:n],
            extensions=[TrainingMonitoring(["acc", "ce"]), FinishAfter(after_n_epochs=1)],
        )
        for n in (1, 2)
    ]
    one, two = (loop.manager.training_set.bound_symbol.tojson() for loop in loops)
    assert "mxoid_metric" not in two
    assert ("mxoid_metric_sums" in one) == (copies is None)
    assert native.available()


@needs_compiler
def test_the_summing_head_leaves_batchnorm_and_dropout_training_unchanged(monkeypatch):
    """A network with BatchNorm and Dropout, evaluated at the training batch size after
    every batch: with the summing operator or MXNet's operators in the head, the same
    parameters, BatchNorm statistics and records (the head changes no random stream and
    no auxiliary state of the network's own)."""
    X, y = dataset("train", 80)
    runs = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(native, "available", lambda: False)
        mx.random.seed(7)
        data = mx.sym.var("data")
        net = mx.sym.FullyConnected(data, num_hidden=8, name="fc1")
        net = mx.sym.BatchNorm(net, fix_gamma=False, name="bn")
        net = mx.sym.Dropout(mx.sym.Activation(net, act_type="relu"), p=0.3)
        net = mx.sym.SoftmaxOutput(
            mx.sym.FullyConnected(net, num_hidden=3, name="fc2"), name="softmax"
        )
        rng = np.random.RandomState(0)
        loop = _monitored_loop(
            net,
            X,
            y,
            {
                "fc1_weight": mx.nd.array(rng.randn(8, X.shape[1]).astype(np.float32) * 0.3),
                "fc1_bias": mx.nd.zeros(8),
                "bn_gamma": mx.nd.ones(8),
                "bn_beta": mx.nd.zeros(8),
                "fc2_weight": mx.nd.array(rng.randn(3, 8).astype(np.float32) * 0.3),
                "fc2_bias": mx.nd.zeros(3),
            },
        )
        assert ("mxoid_metric_sums" in loop.manager.training_set.bound_symbol.tojson()) == fused
        loop.run()
        arg, aux = loop.manager.get_params()
        records = {(i, k): v for i in loop.log for k, v in loop.log[i].items() if "_" in k}
        runs.append(({**arg, **aux}, records))
    (params, records), (params_mx, records_mx) = runs
    assert set(params) == set(params_mx) and "bn_moving_mean" in params
    for name in params:
        np.testing.assert_array_equal(params[name].asnumpy(), params_mx[name].asnumpy(), name)
    trained = {
        key: value for key, value in records.items() if key[1].startswith(("train_", "again_"))
    }
    assert len(trained) >= 2 * 2 * 2 + 2 * 4
    assert trained == {key: records_mx[key] for key in trained}


SEVERAL_GENERATORS = textwrap.dedent(
    """
    import json, mxnet as mx, numpy as np
    from mxoid import MainLoop, FinishAfter, TrainingMonitoring
    from mxoid.metrics import native
    X = np.random.RandomState(0).rand(80, 6).astype("float32")
    y = np.floor(X[:, 0] * 3).astype("float32")

    def train(contexts, monitored):
        net = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=8, name="fc1")
        net = mx.sym.BatchNorm(net, fix_gamma=False, name="bn")
        net = mx.sym.Dropout(mx.sym.Activation(net, act_type="relu"), p=0.5)
        net = mx.sym.FullyConnected(net, num_hidden=3, name="fc2")
        loop = MainLoop(
            mx.sym.SoftmaxOutput(net, name="softmax"),
            mx.io.NDArrayIter(X, y, 20, label_name="softmax_label"),
            contexts=contexts,
            optimizer_params={"learning_rate": 0.1},
            extensions=[TrainingMonitoring(["acc", "ce"])] * monitored
            + [FinishAfter(after_n_epochs=2)],
        )
        fused = "mxoid_metric" in loop.manager.training_set.bound_symbol.tojson()
        loop.run()
        arg, aux = loop.manager.get_params()
        return fused, {k: v.asnumpy() for k, v in {**arg, **aux}.items()}

    runs = {}
    for monitored in (True, False):
        mx.random.seed(3)
        two = train([mx.cpu(0), mx.cpu(1)], monitored)
        mx.random.seed(3)
        one = train([mx.cpu(0)], monitored)
        following = train([mx.cpu(0)], monitored)  # the next loop, without a new seed
        runs[monitored] = {"two": two, "one": one, "following": following}
    print(json.dumps({
        "available": native.available(),
        "fused": [name for name, (fused, _) in runs[True].items() if fused],
        "same": {
            name: all(np.array_equal(params[k], runs[False][name][1][k]) for k in params)
            for name, (_, params) in runs[True].items()
        },
    }))
    """
)


@needs_compiler
def test_monitoring_changes_no_dropout_mask_when_mxnet_has_several_random_generators():
    """With MXNET_CPU_PARALLEL_RAND_COPY=2, MXNet hands its CPU random generators out in
    turn as operators are bound, a library's operators included. A network with Dropout
    and BatchNorm, on two CPUs, and on one CPU for two loops in a row, trains to the same
    parameters and statistics with TrainingMonitoring as without (the fused operator,
    which would take a generator, stands aside)."""
    report = json_from_fresh_python(SEVERAL_GENERATORS, MXNET_CPU_PARALLEL_RAND_COPY="2")
    assert report["available"] and report["fused"] == []
    assert report["same"] == {"two": True, "one": True, "following": True}


def _operator_counts(loop, tmp_path):
    """Run ``loop`` under MXNet's profiler; return how many times each operator ran."""
    mx.nd.waitall()
    mx.profiler.set_config(
        profile_imperative=True,
        profile_symbolic=True,
        aggregate_stats=True,
        filename=str(tmp_path / "profile.json"),
    )
    mx.profiler.set_state("run")
    try:
        loop.run()
        mx.nd.waitall()
    finally:
        mx.profiler.set_state("stop")
    stats = json.loads(mx.profiler.dumps(reset=True, format="json"))
    return {name: entry["Count"] for name, entry in stats["Time"].get("operator", {}).items()}


@needs_compiler
def test_the_counting_switch_is_written_only_when_passes_change_between_training_and_not(
    tmp_path,
):
    """The summing operator's switch costs one operator (``_full``) when the loop binds
    it on, then one each time the forward passes change between training and evaluation
    on the training executors: nothing for a run of training batches, whatever its
    length (counted by MXNet's own profiler)."""
    X, y = dataset("train", 200)

    def loop(batches, evaluate_every=None):
        extensions = [TrainingMonitoring(["acc", "ce"]), FinishAfter(after_n_batches=batches)]
        if evaluate_every:
            again = mx.io.NDArrayIter(X[:40], y[:40], 20, label_name="softmax_label")
            extensions.append(
                Evaluate({"again": again}, [mx.metric.Accuracy()], every_n_batches=evaluate_every)
            )
        made = MainLoop(
            mx.sym.SoftmaxOutput(
                mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=3), name="softmax"
            ),
            mx.io.NDArrayIter(X, y, 20, label_name="softmax_label"),
            extensions=extensions,
        )
        assert "mxoid_metric_sums" in made.manager.training_set.bound_symbol.tojson()
        return made

    short, long = (_operator_counts(loop(n), tmp_path) for n in (4, 9))
    assert short.get("_full") == long.get("_full") == 1
    # Evaluations after batches 3 and 6, each followed by training (off, then on), and
    # after batch 9, the last (off).
    evaluated = _operator_counts(loop(9, evaluate_every=3), tmp_path)
    assert evaluated.get("_full") == 1 + 2 * 2 + 1
