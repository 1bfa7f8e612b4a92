"""Evaluate and TrainingMonitoring against NumPy and MXNet's own metrics."""

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS, classification_data, initial_params, mlp, two_heads
from monitored import (
    LEARNING,
    Check,
    CountHostSyncs,
    SyncProbe,
    dataset,
    iterator,
    module_accuracy,
    numpy_metrics,
    regression_target,
    two_head_loop,
)

from mxoid import Extension, FinishAfter, MainLoop
from mxoid.extensions.monitoring import Evaluate, TrainingMonitoring


def test_evaluate_two_outputs_on_two_iterators_equals_numpy_every_epoch():
    # valid: 84 rows by 16 -> last batch has 4 real rows (device 0: 4, device 1: 0);
    # test: 60 rows by 30, no padding, so Module.score is exact there.
    Xv, yv = dataset("valid")
    Xt, yt = dataset("test")
    evaluate = Evaluate(
        {"valid": iterator(Xv, yv, 16, last_batch_handle="pad"), "test": iterator(Xt, yt, 30)},
        metrics={"softmax": ["acc", "ce"], "reg_output": ["mse", "mae"]},
    )
    seen = []

    def check(loop):
        params = loop.get_params()[0]
        row = loop.log.current_row  # written by Evaluate in this same after_epoch
        for name, X, y in (("valid", Xv, yv), ("test", Xt, yt)):
            expected = numpy_metrics(params, X, y)
            for metric, value in expected.items():
                assert row[f"{name}_{metric}"] == pytest.approx(value, rel=1e-5, abs=1e-7), metric
        assert row["test_softmax_accuracy"] == module_accuracy(params, iterator(Xt, yt, 30))
        seen.append(dict(row))

    loop = two_head_loop([evaluate, Check(check), FinishAfter(after_n_epochs=3)])
    loop.run()
    assert len(seen) == 3
    assert sorted(k for k in seen[0] if k.startswith("valid")) == [
        "valid_reg_mae",
        "valid_reg_mse",
        "valid_softmax_accuracy",
        "valid_softmax_cross_entropy",
    ]
    # Training changed the weights, and each evaluation used the new ones.
    assert len({row["valid_reg_mse"] for row in seen}) == 3
    assert seen[-1]["valid_reg_mse"] < seen[0]["valid_reg_mse"]


def test_padding_rows_do_not_count():
    # The padded last batch repeats the first rows; counting them would change the means.
    X, y = dataset("valid")
    loop = two_head_loop([FinishAfter(after_n_epochs=1)])
    evaluate = Evaluate(
        {"valid": iterator(X, y, 16, last_batch_handle="pad")}, {"softmax": "ce", "reg": "mse"}
    )
    evaluate.attach(loop)
    records = evaluate.evaluate()
    expected = numpy_metrics(loop.get_params()[0], X, y)
    padded = numpy_metrics(
        loop.get_params()[0], np.concatenate([X, X[:12]]), np.concatenate([y, y[:12]])
    )
    assert records["valid_reg_mse"] == pytest.approx(expected["reg_mse"], rel=1e-5)
    assert records["valid_reg_mse"] != pytest.approx(padded["reg_mse"], rel=1e-3)
    assert records["valid_softmax_cross_entropy"] == pytest.approx(
        expected["softmax_cross_entropy"], rel=1e-5
    )


def test_evaluate_changes_neither_parameters_nor_training():
    def final_params(with_evaluate):
        X, y = dataset("train")
        extensions = [FinishAfter(after_n_epochs=2)]
        if with_evaluate:
            Xv, yv = dataset("other", 50)
            # 'same' has the training batch size, so it runs on the training executors.
            extensions.insert(
                0,
                Evaluate(
                    {
                        "same": iterator(Xv, yv, 20, last_batch_handle="pad"),
                        "other": iterator(Xv, yv, 15, last_batch_handle="pad"),
                    },
                    {"softmax": "acc", "reg": "mse"},
                    every_n_batches=2,
                ),
            )
        loop = two_head_loop(extensions, train=iterator(X, y, 20))
        loop.run()
        return {k: v.asnumpy() for k, v in loop.get_params()[0].items()}

    plain, evaluated = final_params(False), final_params(True)
    # Not bit-exact: MKLDNN kernels may round the last bit differently from one run to the
    # next in a process. One changed update or skipped batch moves weights by far more.
    for name in plain:
        np.testing.assert_allclose(plain[name], evaluated[name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_evaluate_accepts_eval_metric_objects_and_functions():
    X, y = dataset("valid")

    def mean_absolute_error(label, pred):
        return float(np.mean(np.abs(label - pred.ravel())))

    user_accuracy = mx.metric.Accuracy()
    evaluate = Evaluate(
        {"valid": iterator(X, y, 16, last_batch_handle="pad")},
        {"softmax": [user_accuracy, mx.metric.CrossEntropy()], "reg": mean_absolute_error},
    )
    loop = two_head_loop([evaluate, FinishAfter(after_n_epochs=1)])
    loop.run()
    expected = numpy_metrics(loop.get_params()[0], X, y)
    row = loop.log[loop.status.iterations_done]
    assert row["valid_softmax_accuracy"] == pytest.approx(expected["softmax_accuracy"], abs=1e-12)
    assert row["valid_softmax_cross_entropy"] == pytest.approx(
        expected["softmax_cross_entropy"], rel=1e-5
    )
    assert row["valid_reg_mean_absolute_error"] == pytest.approx(expected["reg_mae"], rel=1e-5)
    assert user_accuracy.num_inst == 0  # the user's object is copied, not updated


def test_evaluate_fires_every_epoch_unless_told_otherwise():
    X, y = dataset("train")
    Xv, yv = dataset("test", 30)
    every, second = (
        Evaluate({name: iterator(Xv, yv, 10)}, {"softmax": "acc"}, **kwargs)
        for name, kwargs in (("every", {}), ("second", {"every_n_epochs": 2}))
    )
    loop = two_head_loop([every, second, FinishAfter(after_n_epochs=4)], train=iterator(X, y, 20))
    loop.run()
    assert [i for i, row in loop.log.items() if "every_softmax_accuracy" in row] == [5, 10, 15, 20]
    assert [i for i, row in loop.log.items() if "second_softmax_accuracy" in row] == [10, 20]


def test_reduce_hook_sees_sums_and_counts_before_the_division():
    X, y = dataset("valid")
    loop = two_head_loop([FinishAfter(after_n_epochs=1)])
    evaluate = Evaluate({"valid": iterator(X, y, 16, last_batch_handle="pad")}, {"softmax": "acc"})
    evaluate.attach(loop)
    local = evaluate.evaluate()["valid_softmax_accuracy"]
    seen = []

    def two_workers_the_other_perfect(totals):
        seen.append(totals.copy())
        return totals + np.array([[84.0, 84.0]])

    evaluate.reduce = two_workers_the_other_perfect
    reduced = evaluate.evaluate()["valid_softmax_accuracy"]
    assert seen[0].shape == (1, 2) and seen[0][0, 1] == 84
    assert seen[0][0, 0] == pytest.approx(local * 84)
    assert reduced == pytest.approx((local * 84 + 84) / 168)


# ------------------------------------------------------- TrainingMonitoring
def test_training_monitoring_does_not_sync_per_batch(monkeypatch):
    X, y = dataset("train", 90)  # 5 batches of 20, the last one padded
    monitoring = TrainingMonitoring({"softmax": ["acc", "ce"], "reg": ["mse", "mae"]})
    counter = CountHostSyncs(monkeypatch)
    probe = SyncProbe(counter)
    loop = two_head_loop(
        [monitoring, probe, FinishAfter(after_n_epochs=2)], train=iterator(X, y, 20)
    )
    loop.run()
    epochs = []
    for hook, count in probe.notes:
        if hook == "before_epoch":
            epochs.append([count])
        else:
            epochs[-1].append(count)
    assert len(epochs) == 2
    for counts in epochs:
        start, batches, end = counts[0], counts[1:-1], counts[-1]
        assert len(batches) == 5
        assert batches == [start] * 5  # no host sync in any batch
        assert end > start  # the records were read at the end of the epoch
    assert loop.log[5]["train_softmax_accuracy"] >= 0


class OutputRecorder(Extension):
    """Copies, after every batch, the real rows of the outputs and labels."""

    def __init__(self):
        super().__init__()
        self.batches = []

    def after_batch(self, batch):
        manager = self.main_loop.manager
        valid = manager.valid_rows

        def real(arrays):
            return np.concatenate([a[:v].asnumpy() for a, v in zip(arrays, valid) if v])

        self.batches.append(
            {
                "iteration": self.main_loop.status.iterations_done,
                "prob": real(manager.outputs["softmax"]),
                "reg": real(manager.outputs["reg"]),
                "y": real(manager.labels["softmax_label"]),
                "t": real(manager.labels["reg_label"]),
            }
        )


@pytest.mark.parametrize("n", [100, 90])
def test_training_monitoring_equals_mxnet_accuracy_and_per_sample_means(n):
    X, y = dataset("train", n)  # 5 batches of 20; with n=90 the last is padded
    monitoring = TrainingMonitoring({"softmax": ["acc", "ce"], "reg": "mse"}, every_n_batches=3)
    recorder = OutputRecorder()
    loop = two_head_loop(
        [monitoring, recorder, FinishAfter(after_n_epochs=2)], train=iterator(X, y, 20)
    )
    loop.run()
    # Writes at batches 3, 6, 9 (every 3), each over the batches since the previous write,
    # and 5, 10 (epoch ends), each over its whole epoch (as Module.fit's Train-accuracy:
    # issue 40 made the epoch's figure the epoch's; it was the batches since the last write).
    written = sorted(i for i, row in loop.log.items() if "train_softmax_accuracy" in row)
    assert written == [3, 5, 6, 9, 10]
    start = epoch_start = 0
    for end in written:
        epoch_end = end in loop.log.epoch_ends
        first = epoch_start if epoch_end else start
        window = [b for b in recorder.batches if first < b["iteration"] <= end]
        accuracy = mx.metric.Accuracy()
        for b in window:
            accuracy.update([mx.nd.array(b["y"])], [mx.nd.array(b["prob"])])
        prob = np.concatenate([b["prob"] for b in window]).astype("float64")
        labels = np.concatenate([b["y"] for b in window]).astype(int)
        reg = np.concatenate([b["reg"] for b in window])[:, 0].astype("float64")
        target = np.concatenate([b["t"] for b in window])
        row = loop.log[end]
        if n == 100:
            assert row["train_softmax_accuracy"] == accuracy.get()[1]
        assert row["train_softmax_accuracy"] == pytest.approx(
            np.mean(prob.argmax(axis=1) == labels), abs=1e-12
        )
        assert row["train_softmax_cross_entropy"] == pytest.approx(
            np.mean(-np.log(prob[np.arange(len(labels)), labels] + 1e-12)), rel=1e-5
        )
        assert row["train_reg_mse"] == pytest.approx(np.mean((target - reg) ** 2), rel=1e-5)
        start = end
        epoch_start = end if epoch_end else epoch_start


# ------------------------------------------- the training graph computes the values
def test_training_metrics_are_computed_by_the_training_executors():
    """The per-row values come out of the training executors (a private head), and the
    backward pass adds them to running sums (gradients bound with grad_req='add'): the
    accumulator queues nothing for a batch, and what users see is unchanged."""
    X, y = dataset("train", 90)
    monitoring = TrainingMonitoring({"softmax": ["acc", "ce"], "reg": "mse"})
    loop = two_head_loop([monitoring, FinishAfter(after_n_epochs=1)], train=iterator(X, y, 20))
    accumulator = monitoring.accumulator
    assert accumulator._head is not None and not accumulator._calls[0]
    assert not accumulator._head_adds  # nothing queued per batch
    manager = loop.manager
    assert manager.output_names == ["softmax", "reg"] and set(manager.outputs) == {
        "softmax",
        "reg",
    }
    # two heads + the per-row values + the loss whose gradient is the running sums
    assert [len(e.outputs) for e in manager.executors] == [4, 4]
    assert [tuple(a.shape) for a in manager.private_outputs[0]] == [(10, 3), (10, 3)]
    (name,) = manager.running_sums
    assert accumulator._head_sums == manager.running_sums[name]
    assert name not in manager.param_names and loop.symbol.list_outputs() == [
        "softmax_output",
        "reg_output",
    ]
    loop.run()
    assert name not in loop.get_params()[0]
    # The values, padding left out, equal NumPy's and MXNet's: the tests above.
    assert 0 <= loop.log.last("train_softmax_accuracy") <= 1


@pytest.mark.parametrize("contexts", [1, 2])
def test_running_sums_in_the_backward_pass_equal_the_accumulators_own_operator(
    monkeypatch, contexts
):
    """The same run with the values summed by the backward pass (running sums) and by the
    accumulator's own operator per device and batch: the same records, padding included
    (90 rows by 20: the last batch is padded; a padded batch takes its padding rows back out,
    which may round the cross-entropy's last bit)."""
    X, y = dataset("train", 90)
    rows = []
    for graph in (True, False):
        if not graph:
            monkeypatch.setattr(TrainingMonitoring, "private_head", lambda self, *a: None)
        monitoring = TrainingMonitoring({"softmax": ["acc", "ce"], "reg": "mse"}, every_n_batches=2)
        loop = MainLoop(
            two_heads(),
            iterator(X, y, 20),
            contexts=TWO_CPUS[:contexts],
            arg_params=initial_params(two_heads(), (20, 10)),
            optimizer_params=dict(LEARNING),
            extensions=[monitoring, FinishAfter(after_n_epochs=2)],
        )
        assert (monitoring.accumulator._head is not None) == graph
        loop.run()
        rows.append([row for _, row in loop.log.items() if "train_reg_mse" in row])
    assert len(rows[0]) == len(rows[1]) == 6  # batches 2, 4, 5 (epoch end), 7, 9, 10
    for running, own in zip(*rows):
        assert running["train_softmax_accuracy"] == own["train_softmax_accuracy"]
        for name in ("train_softmax_cross_entropy", "train_reg_mse"):
            assert running[name] == pytest.approx(own[name], rel=1e-12, abs=0)


def test_evaluate_computes_the_values_in_the_evaluation_graph_for_every_shape():
    """Every iterator gets executors with a private head, sharing the parameters: one with
    another batch size, and one with the training shapes too (not the training executors,
    whose graph would need an operator call per device and batch for the metrics)."""
    Xv, yv = dataset("valid")
    evaluate = Evaluate(
        {"other": iterator(Xv, yv, 16), "same": iterator(Xv[:80], yv[:80], 20)},
        metrics={"softmax": ["acc", "ce"], "reg": "mse"},
    )
    loop = two_head_loop([evaluate, FinishAfter(after_n_epochs=1)])
    other, same = evaluate._accumulators["other"], evaluate._accumulators["same"]
    assert other._head is not None and not other._calls[0]
    assert other.manager is not loop.manager and other.manager.output_names == ["softmax", "reg"]
    assert same._head is not None and not same._calls[0]
    assert same.manager is not loop.manager and same.manager is not other.manager
    assert same.manager.param_arrays[0][0] is loop.manager.param_arrays[0][0]
    loop.run()
    row = loop.log[loop.status.iterations_done]
    params = loop.get_params()[0]
    # 84 rows by 16: the last batch has 4 real rows (device 0: 4, device 1: none).
    for name, X, y in (("other", Xv, yv), ("same", Xv[:80], yv[:80])):
        expected = numpy_metrics(params, X, y)
        assert row[f"{name}_softmax_accuracy"] == pytest.approx(
            expected["softmax_accuracy"], abs=1e-12
        )
        for metric in ("softmax_cross_entropy", "reg_mse"):
            assert row[f"{name}_{metric}"] == pytest.approx(expected[metric], rel=1e-5)


def test_an_extension_attached_later_uses_its_own_operator():
    X, y = dataset("train", 90)
    loop = two_head_loop([FinishAfter(after_n_epochs=1)], train=iterator(X, y, 20))
    late = TrainingMonitoring({"softmax": "acc"})
    late.attach(loop)
    assert late.accumulator._head is None and late.accumulator._calls[0]


@pytest.mark.parametrize("contexts", [1, 2])
def test_the_private_head_changes_no_parameter_and_no_checkpoint(tmp_path, contexts):
    """ResNet with BatchNorm: training with TrainingMonitoring ends bit for bit where
    training without it ends, and the checkpoint holds the user's symbol."""
    from networks import digits_images, initial_params, resnet

    from mxoid import Checkpoint
    from mxoid.checkpoint import latest_checkpoint

    images, labels = digits_images(96)
    images = np.repeat(images, 3, axis=1)
    net = resnet(units=(1,), filters=(4, 8))
    start = initial_params(net, (32, 3, 8, 8))
    results = []
    for extensions in ([], [TrainingMonitoring(["acc", "ce"])]):
        train = mx.io.NDArrayIter(images, labels, 32, shuffle=False, label_name="softmax_label")
        folder = tmp_path / str(len(extensions))
        loop = MainLoop(
            net,
            train,
            contexts=TWO_CPUS[:contexts],
            arg_params=start[0],
            aux_params=start[1],
            optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
            extensions=[FinishAfter(after_n_epochs=2), Checkpoint(str(folder)), *extensions],
        ).run()
        args, aux = loop.get_params()
        results.append({**{k: v.asnumpy() for k, v in args.items()}, **aux_numpy(aux)})
        saved = latest_checkpoint(str(folder))
        symbol = mx.sym.load(str(folder / saved.path / "model-symbol.json"))
        assert symbol.tojson() == net.tojson()
    assert results[0].keys() == results[1].keys()
    for name in results[0]:
        np.testing.assert_array_equal(results[0][name], results[1][name], err_msg=name)


def aux_numpy(aux):
    return {f"aux:{k}": v.asnumpy() for k, v in aux.items()}


def test_monitor_twins_fill_the_private_head_too():
    """On the batches Monitor runs on its twin executors, the private outputs are copied back
    with the others: the records equal those of the same run without Monitor."""
    from mxoid import Monitor

    X, y = dataset("train", 90)
    records = []
    for extra in ([], [Monitor("fc1_weight", every_n_batches=2)]):
        monitoring = TrainingMonitoring({"softmax": ["acc", "ce"]}, every_n_batches=1)
        loop = two_head_loop(
            [monitoring, FinishAfter(after_n_epochs=1), *extra], train=iterator(X, y, 20)
        ).run()
        records.append([row["train_softmax_cross_entropy"] for _, row in loop.log.items() if row])
    assert len(records[0]) == 5 and records[0] == records[1]


# ---------------------------------------------------------- one output, order
def test_one_output_names_and_order_within_after_epoch():
    X, y = dataset("train")
    Xv, yv = dataset("test", 30)
    seen = []

    def check(loop):
        row = loop.log.current_row  # both records were written earlier in this after_epoch
        seen.append((row["valid_accuracy"], row["train_accuracy"]))
        p = {k: v.asnumpy() for k, v in loop.get_params()[0].items()}
        hidden = np.maximum(Xv @ p["fc1_weight"].T + p["fc1_bias"], 0)
        scores = hidden @ p["fc2_weight"].T + p["fc2_bias"]
        assert row["valid_accuracy"] == pytest.approx(np.mean(scores.argmax(axis=1) == yv))

    net = mlp()
    loop = MainLoop(
        net,
        mx.io.NDArrayIter(X, y, batch_size=25, label_name="softmax_label"),
        contexts=TWO_CPUS,
        optimizer_params=dict(LEARNING),
        extensions=[
            Evaluate(
                {"valid": mx.io.NDArrayIter(Xv, yv, batch_size=8, label_name="softmax_label")},
                "acc",
            ),
            TrainingMonitoring(["acc"]),
            Check(check),
            FinishAfter(after_n_epochs=2),
        ],
    )
    loop.run()
    assert seen == [
        (loop.log[4]["valid_accuracy"], loop.log[4]["train_accuracy"]),
        (loop.log[8]["valid_accuracy"], loop.log[8]["train_accuracy"]),
    ]


def test_unknown_output_is_named_with_the_outputs():
    X, y = dataset("test", 40)
    with pytest.raises(ValueError, match=r"no output named 'softmx'.*\['softmax', 'reg'\]"):
        two_head_loop(
            [
                Evaluate({"valid": iterator(X, y, 20)}, {"softmx": "acc"}),
                FinishAfter(after_n_epochs=1),
            ]
        )


def test_metrics_without_output_names_need_a_single_output():
    with pytest.raises(ValueError, match="without output names.*2 outputs"):
        two_head_loop([TrainingMonitoring("acc"), FinishAfter(after_n_epochs=1)])


def test_missing_label_is_reported_with_its_expected_name():
    X, y = dataset("test", 40)
    only_class = mx.io.NDArrayIter(
        X, {"softmax_label": y, "regression": regression_target(X)}, batch_size=20
    )
    with pytest.raises(ValueError, match="iterator 'valid'.*'reg_label'"):
        two_head_loop(
            [Evaluate({"valid": only_class}, {"reg": "mse"}), FinishAfter(after_n_epochs=1)]
        )


def test_a_metric_given_twice_for_an_output_is_refused():
    with pytest.raises(ValueError, match="train_softmax_accuracy"):
        two_head_loop(
            [TrainingMonitoring({"softmax": ["acc", "accuracy"]}), FinishAfter(after_n_epochs=1)]
        )


# ------------------------------- evaluations in the hooks after the training pass
class EvaluateEveryBatch(Extension):
    """Evaluates on the loop's executors in a hook after every training pass."""

    def __init__(self, how, hook="after_batch"):
        super().__init__(**{hook: True})
        self.how = how

    def do(self, which_callback, *args):
        loop = self.main_loop
        valid = iterator(*dataset("valid", 47), 20 if self.how.endswith("20") else 7)
        if self.how.startswith("score"):  # a host metric: the training executors at 20
            loop.score(valid, {"softmax": mx.metric.Accuracy()})
        elif self.how.startswith("evaluate"):  # the device metrics, in the evaluation graph
            loop.score(valid, {"softmax": ["acc", "ce"], "reg": "mse"})
        else:
            loop.predict(valid)


class RecordBeforeTheHooks(OutputRecorder):
    """Records each batch's outputs in ``after_update``, before the hooks after it."""

    def after_update(self):
        super().after_batch(None)
        self.batches[-1]["iteration"] += 1  # counted after the update

    def after_batch(self, batch):
        pass


@pytest.mark.parametrize("contexts", [[mx.cpu(0)], TWO_CPUS], ids=["1ctx", "2ctx"])
@pytest.mark.parametrize(
    "how, hook",
    [
        ("score-20", "after_batch"),
        ("evaluate-7", "after_batch"),
        ("predict-20", "after_batch"),
        ("score-20", "after_update"),
    ],
)
def test_training_metrics_ignore_evaluations_in_hooks_after_the_training_pass(contexts, how, hook):
    # An evaluation at the training batch size runs on the training executors, one at
    # another size on executors sharing their memory: both replace the outputs, the
    # private head's values and the padding of the batch just trained. The training
    # metrics are those of the training passes all the same (90 rows: a padded last batch).
    X, y = dataset("train", 90)
    recorder = RecordBeforeTheHooks()  # first in the list: before the evaluation
    monitoring = TrainingMonitoring(
        {"softmax": ["acc", "ce", mx.metric.TopKAccuracy(top_k=3)], "reg": "mse"}
    )
    net = two_heads()
    loop = MainLoop(
        net,
        iterator(X, y, 20),
        contexts=contexts,
        optimizer_params=dict(LEARNING),
        arg_params=initial_params(net, (20, 10)),
        extensions=[
            recorder,
            EvaluateEveryBatch(how, hook),
            monitoring,
            FinishAfter(after_n_epochs=2),
        ],
    )
    loop.run()
    for end in (5, 10):
        window = [b for b in recorder.batches if end - 5 < b["iteration"] <= end]
        prob = np.concatenate([b["prob"] for b in window]).astype("float64")
        labels = np.concatenate([b["y"] for b in window]).astype(int)
        reg = np.concatenate([b["reg"] for b in window])[:, 0].astype("float64")
        target = np.concatenate([b["t"] for b in window])
        top_3 = mx.metric.TopKAccuracy(top_k=3)  # on the host, from the outputs
        for b in window:
            top_3.update([mx.nd.array(b["y"])], [mx.nd.array(b["prob"])])
        row = loop.log[end]
        assert row["train_softmax_accuracy"] == pytest.approx(
            np.mean(prob.argmax(axis=1) == labels), abs=1e-12
        )
        expected = np.mean(-np.log(prob[np.arange(len(labels)), labels] + 1e-12))
        assert row["train_softmax_cross_entropy"] == pytest.approx(expected, rel=1e-5)
        assert row["train_softmax_top_k_accuracy_3"] == top_3.get()[1]
        assert row["train_reg_mse"] == pytest.approx(np.mean((target - reg) ** 2), rel=1e-5)


# ------------------------------------------------- two extensions, one record name
def test_two_metric_extensions_writing_the_same_records_are_refused_naming_both():
    X, y = dataset("train", 100)
    epochs = TrainingMonitoring({"softmax": ["acc", "ce"]}, name="epochs")
    windows = TrainingMonitoring({"softmax": "ce"}, every_n_batches=3, name="windows")
    with pytest.raises(ValueError) as raised:
        two_head_loop([epochs, windows, FinishAfter(after_n_epochs=1)], iterator(X, y, 20))
    message = str(raised.value)
    assert "epochs and windows" in message and "['train_softmax_cross_entropy']" in message
    assert "prefix=" in message
    valid = iterator(*dataset("valid"), 20)
    with pytest.raises(ValueError, match=r"e1 and e2 would both write .*'valid_softmax_accuracy'"):
        two_head_loop(
            [
                Evaluate({"valid": valid}, {"softmax": "acc"}, name="e1"),
                Evaluate({"valid": valid}, {"softmax": "acc"}, name="e2", every_n_batches=2),
                FinishAfter(after_n_epochs=1),
            ],
            iterator(X, y, 20),
        )


def test_a_second_training_monitoring_with_its_own_prefix_writes_its_windows_beside():
    # Its records equal MXNet's metric over each window of 3 batches, and the epoch
    # records stay those of the whole epoch: the window extension's too, at the epoch's end
    # (issue 40: an epoch's write covers the epoch, as Module.fit's Train-accuracy).
    X, y = dataset("train", 100)
    recorder = OutputRecorder()
    epochs = TrainingMonitoring({"softmax": ["acc", "ce"]})
    windows = TrainingMonitoring({"softmax": "acc"}, every_n_batches=3, prefix="window")
    loop = two_head_loop(
        [recorder, epochs, windows, FinishAfter(after_n_epochs=1)], iterator(X, y, 20)
    )
    loop.run()
    assert [i for i, row in loop.log.items() if "window_softmax_accuracy" in row] == [3, 5]
    for start, end in ((0, 3), (0, 5)):
        accuracy = mx.metric.Accuracy()
        for b in recorder.batches[start:end]:
            accuracy.update([mx.nd.array(b["y"])], [mx.nd.array(b["prob"])])
        assert loop.log[end]["window_softmax_accuracy"] == accuracy.get()[1]
    accuracy = mx.metric.Accuracy()
    for b in recorder.batches:
        accuracy.update([mx.nd.array(b["y"])], [mx.nd.array(b["prob"])])
    assert loop.log[5]["train_softmax_accuracy"] == accuracy.get()[1]


@pytest.mark.parametrize("prefix", ["", None, 3])
def test_an_empty_or_non_string_prefix_is_refused(prefix):
    with pytest.raises(ValueError, match="prefix starts the record names"):
        TrainingMonitoring("acc", prefix=prefix)


def _batchnorm_dropout_net():
    data = mx.sym.var("data")
    net = mx.sym.FullyConnected(data, num_hidden=16, name="fc1")
    net = mx.sym.BatchNorm(net, fix_gamma=False, name="bn1")
    net = mx.sym.Dropout(mx.sym.Activation(net, act_type="relu"), p=0.5)
    net = mx.sym.FullyConnected(net, num_hidden=3, name="fc2")
    return mx.sym.SoftmaxOutput(net, name="softmax")


@pytest.mark.parametrize("contexts", [[mx.cpu(0)], TWO_CPUS], ids=["1ctx", "2ctx"])
def test_batchnorm_dropout_training_metrics_are_the_same_with_an_evaluation_before_them(contexts):
    # Evaluate at the training batch size after every batch, its hook before
    # TrainingMonitoring's: the records and the parameters are those of the loop
    # without it (Dropout's masks come from the same seed; 90 rows: a padded last batch).
    X, y = classification_data(n=90, seed=3)
    valid_X, valid_y = classification_data(n=47, seed=4)
    net = _batchnorm_dropout_net()

    def run(evaluate):
        mx.random.seed(11)
        train = mx.io.NDArrayIter(X, y, batch_size=20, label_name="softmax_label")
        valid = mx.io.NDArrayIter(valid_X, valid_y, batch_size=20, label_name="softmax_label")
        extensions = [Evaluate({"valid": valid}, ["acc"], every_n_batches=1)] if evaluate else []
        loop = MainLoop(
            net,
            train,
            contexts=contexts,
            optimizer_params=dict(LEARNING),
            arg_params=initial_params(net, (20, 10)),
            extensions=extensions
            + [TrainingMonitoring(["acc", "ce"]), FinishAfter(after_n_epochs=2)],
        )
        loop.run()
        records = [
            (i, r["train_accuracy"], r["train_cross_entropy"])
            for i, r in loop.log.items()
            if "train_accuracy" in r
        ]
        return records, loop.manager.get_params()

    records, (args, auxs) = run(evaluate=False)
    evaluated_records, (evaluated_args, evaluated_auxs) = run(evaluate=True)
    assert [i for i, *_ in records] == [5, 10]
    assert evaluated_records == records
    for name, array in args.items():
        np.testing.assert_array_equal(evaluated_args[name].asnumpy(), array.asnumpy(), name)
    # On two devices each evaluation first averages the devices' moving statistics (as
    # Module.fit's set_params does at epoch ends); the moving average is linear, so the
    # final average is the same up to float32 rounding.
    for name, array in auxs.items():
        np.testing.assert_allclose(
            evaluated_auxs[name].asnumpy(), array.asnumpy(), rtol=1e-6, atol=1e-7, err_msg=name
        )


def test_an_evaluation_repeated_gives_the_same_records_to_the_last_digit():
    """Each evaluation sums its own batches: a run resumed from a checkpoint (whose Evaluate
    starts from zero) writes the same records as the uninterrupted run. (Before, the sums
    went on across evaluations and each took the previous total off, which rounds
    differently once the totals are large: the 16th digit of valid_cross_entropy.)"""
    X, y = classification_data(n=2000, seed=5)
    net = mlp()
    params = {k: v * 6 for k, v in initial_params(net, (50, 10), seed=2).items()}  # confident
    loop = MainLoop(
        net,
        mx.io.NDArrayIter(X[:100], y[:100], batch_size=50, label_name="softmax_label"),
        arg_params=params,
        extensions=[FinishAfter(after_n_epochs=1)],
    )
    evaluate = Evaluate(
        {"valid": mx.io.NDArrayIter(X, y, batch_size=50, label_name="softmax_label")}, ["acc", "ce"]
    )
    evaluate.attach(loop)
    first = evaluate.evaluate()
    for _ in range(12):
        assert evaluate.evaluate() == first


def test_the_speedometer_recipe_prints_speed_and_windows_and_epochs_keep_module_fits_accuracy(
    capsys,
):
    """``Timing``, ``TrainingMonitoring`` and ``Printing`` every 6 batches, as
    ``mx.callback.Speedometer(batch_size, 6)``: each batch line says the samples per second
    (plain digits) and the accuracy over its 6 batches; the epoch's ``train_accuracy`` is the
    epoch's, equal to ``Module.fit``'s ``Train-accuracy`` on the same run (windows of 6 end
    mid-epoch: 20 batches an epoch)."""
    import logging
    import re

    from mxoid import Printing, Timing

    X, y = classification_data(n=400, seed=4)
    net = mlp()
    params = initial_params(net, (20, 10))

    def batches():
        np.random.seed(11)
        return mx.io.NDArrayIter(X, y, batch_size=20, shuffle=True, label_name="softmax_label")

    loop = MainLoop(
        net,
        batches(),
        optimizer_params={"learning_rate": 0.05},
        arg_params=params,
        extensions=[
            FinishAfter(after_n_epochs=3),
            Timing(every_n_batches=6),
            TrainingMonitoring("acc", every_n_batches=6),
            Printing(every_n_batches=6),
        ],
    ).run()
    lines = capsys.readouterr().out.splitlines()
    shape = (
        r"Batch \d+/20 · epoch \d/3 · \d+\.\d\d s · \d+ samples/s · train_acc (0\.\d{4}|1\.000)$"
    )
    batch_lines = [line for line in lines if line.startswith("Batch ")]
    assert len(batch_lines) == 10 and all(re.match(shape, line) for line in batch_lines)
    epoch_rows = [loop.log[i] for i in loop.log.epoch_ends]

    said = []

    class Lines(logging.Handler):
        def emit(self, record):
            said.append(record.getMessage())

    logger = logging.getLogger("module-fit-train-accuracy")
    logger.addHandler(Lines())
    logger.setLevel(logging.INFO)
    module = mx.mod.Module(mlp(), context=[mx.cpu()], logger=logger)
    module.fit(batches(), num_epoch=3, optimizer_params={"learning_rate": 0.05}, arg_params=params)
    theirs = [float(m.split("=")[1]) for m in said if "Train-accuracy" in m]
    ours = [row["train_accuracy"] for row in epoch_rows]
    assert len(theirs) == 3 and ours == pytest.approx(theirs, abs=1e-6)  # Module prints %f
    # The windows' records are the windows': the 18th batch's covers batches 13-18 alone.
    window = loop.log[18]["train_accuracy"]
    assert window != pytest.approx(ours[0], abs=1e-9) or ours[0] == 1.0
