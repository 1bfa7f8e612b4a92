"""Metrics computed on the devices, and the accumulator of their sums, against NumPy and MXNet."""

import json

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS, classification_data, mlp
from monitored import dataset, iterator, numpy_forward, regression_target, two_head_loop

from mxoid import FinishAfter, MainLoop
from mxoid.extensions.monitoring import Evaluate, TrainingMonitoring
from mxoid.metrics import DeviceMetric, HostMetric, MetricAccumulator, create_metrics


def test_other_device_metrics_equal_numpy_and_mxnet():
    X, y = dataset("valid")
    loop = two_head_loop([FinishAfter(after_n_epochs=1)])
    loop.run()
    evaluate = Evaluate(
        {"valid": iterator(X, y, 16, last_batch_handle="pad")},
        {"softmax": ["top_k_accuracy_2", "nll_loss"], "reg": "rmse"},
    )
    evaluate.attach(loop)
    records = evaluate.evaluate()
    params = loop.get_params()[0]
    prob, reg = numpy_forward(params, X)
    top2 = np.argsort(-prob, axis=1)[:, :2]
    assert records["valid_softmax_top_k_accuracy_2"] == pytest.approx(
        np.mean((top2 == y[:, None]).any(axis=1)), abs=1e-12
    )
    mxnet_top2 = mx.metric.TopKAccuracy(top_k=2)
    mxnet_top2.update([mx.nd.array(y)], [mx.nd.array(prob)])
    assert records["valid_softmax_top_k_accuracy_2"] == pytest.approx(
        mxnet_top2.get()[1], abs=1e-12
    )
    assert records["valid_softmax_nll_loss"] == pytest.approx(
        np.mean(-np.log(prob[np.arange(len(y)), y.astype(int)] + 1e-12)), rel=1e-5
    )
    assert records["valid_reg_rmse"] == pytest.approx(
        np.sqrt(np.mean((regression_target(X) - reg) ** 2)), rel=1e-5
    )


def test_a_user_device_metric_is_computed_on_the_devices():
    def squared_log_error(pred, label, pred_shape, label_shape):
        diff = mx.sym.log1p(mx.sym.abs(pred)) - mx.sym.log1p(
            mx.sym.abs(mx.sym.reshape(label, shape=pred_shape))
        )
        return mx.sym.sum(mx.sym.square(diff), axis=1), pred_shape[1]

    X, y = dataset("valid")
    loop = two_head_loop([FinishAfter(after_n_epochs=1)])
    evaluate = Evaluate(
        {"valid": iterator(X, y, 16, last_batch_handle="pad")},
        {"reg": DeviceMetric("msle", squared_log_error)},
    )
    evaluate.attach(loop)
    _, reg = numpy_forward(loop.get_params()[0], X)
    expected = np.mean((np.log1p(np.abs(reg)) - np.log1p(np.abs(regression_target(X)))) ** 2)
    assert evaluate.evaluate()["valid_reg_msle"] == pytest.approx(expected, rel=1e-5)
    # Batches of 16 on two devices: 8 rows each, so the graph can compute it.
    assert evaluate._accumulators["valid"]._head is not None


def squared_log_error(pred, label, pred_shape, label_shape):
    """A user metric that writes the device's shapes into its graph."""
    diff = mx.sym.log1p(mx.sym.abs(pred)) - mx.sym.log1p(
        mx.sym.abs(mx.sym.reshape(label, shape=pred_shape))
    )
    return mx.sym.sum(mx.sym.square(diff), axis=1), pred_shape[1]


def test_devices_with_other_shapes_keep_the_metric_out_of_the_graph():
    """work_load_list [1, 3]: 5 and 15 rows. A metric built for one device's shapes cannot
    run in the shared graph; it is computed per device instead, with the same values."""
    from conftest import initial_params, two_heads

    X, y = dataset("train", 100)
    net = two_heads()
    loops = []
    for work_load in ([1, 3], [1, 1]):
        monitoring = TrainingMonitoring(
            {"reg": [DeviceMetric("msle", squared_log_error), "mse"]}, every_n_batches=1
        )
        loop = MainLoop(
            net,
            iterator(X, y, 20),
            contexts=TWO_CPUS,
            work_load_list=work_load,
            arg_params=initial_params(net, (20, 10)),
            optimizer_params={"learning_rate": 0.0},
            extensions=[monitoring, FinishAfter(after_n_epochs=1)],
        )
        assert (monitoring.accumulator._head is None) == (work_load == [1, 3])
        loops.append(loop.run())
    uneven, even = (
        [row for _, row in loop.log.items() if "train_reg_msle" in row] for loop in loops
    )
    for a, b in zip(uneven, even):  # the same parameters throughout (rate 0)
        assert a["train_reg_msle"] == pytest.approx(b["train_reg_msle"], rel=1e-6)
        assert a["train_reg_mse"] == pytest.approx(b["train_reg_mse"], rel=1e-6)


# -------------------------------------------------------------------- errors
def test_unknown_metric_name_fails_at_construction():
    with pytest.raises(ValueError, match="unknown metric 'accurcy'"):
        TrainingMonitoring("accurcy")
    with pytest.raises(TypeError, match="a metric is a name"):
        create_metrics([3])


def test_shapes_a_metric_cannot_compare_are_refused():
    with pytest.raises(
        ValueError,
        match="metric 'mse' cannot compare an output of shape "
        r"\(10, 3\) with a label of shape \(10,\)",
    ):
        two_head_loop([TrainingMonitoring({"softmax": "mse"}), FinishAfter(after_n_epochs=1)])


def test_metric_names_follow_mxnet_in_snake_case():
    names = [
        m.name
        for m in create_metrics(
            [
                "acc",
                "ce",
                "cross-entropy",
                "nll_loss",
                "rmse",
                "top_k_accuracy_3",
                "f1",
                mx.metric.MAE(),
            ]
        )
    ]
    assert names == [
        "accuracy",
        "cross_entropy",
        "cross_entropy",
        "nll_loss",
        "rmse",
        "top_k_accuracy_3",
        "f1",
        "mae",
    ]
    kinds = [type(m) for m in create_metrics(["acc", "f1", mx.metric.MAE(), len])]
    assert kinds == [DeviceMetric, HostMetric, HostMetric, HostMetric]


def test_accumulator_on_a_bare_manager_matches_numpy():
    X, y = classification_data(n=50)
    net = mlp()
    it = mx.io.NDArrayIter(X, y, batch_size=16, label_name="softmax_label")  # padded last batch
    loop = MainLoop(net, it, contexts=TWO_CPUS, extensions=[FinishAfter(after_n_epochs=1)])
    manager = loop.manager.evaluation_manager(it.provide_data, it.provide_label)
    accumulator = MetricAccumulator(manager, [("softmax_output", m) for m in create_metrics("acc")])
    predictions = []
    for batch in it:
        manager.load_data_batch(batch)
        manager.forward()
        accumulator.update()
        predictions.append(np.concatenate([o.asnumpy() for o in manager.outputs["softmax"]]))
    prob = np.concatenate(predictions)[:50]
    assert accumulator.rows == 50
    assert accumulator.values() == [pytest.approx(np.mean(prob.argmax(axis=1) == y), abs=1e-12)]
    accumulator.reset()
    assert accumulator.rows == 0 and accumulator.totals()[0, 0] == 0


def _run_batches(manager, accumulator, it):
    predictions, labels = [], []
    it.reset()
    for batch in it:
        manager.load_data_batch(batch)
        manager.forward()
        accumulator.update()
        valid = batch.data[0].shape[0] - batch.pad
        outputs = [output.asnumpy() for output in manager.outputs["softmax"]]
        predictions.append(np.concatenate(outputs)[:valid])
        labels.append(batch.label[0].asnumpy()[:valid])
    return np.concatenate(predictions), np.concatenate(labels)


@pytest.mark.parametrize("head", [True, False])
def test_a_reset_right_after_a_read_queues_nothing_and_later_reads_stay_exact(head):
    """The sums read become the baseline (the devices keep them), so a write at an epoch
    end wakes no idle engine; a reset with no read since the last batch zeroes them; a
    state saved between the two restores the baseline with the sums."""
    X, y = classification_data(n=48)
    it = mx.io.NDArrayIter(X, y, batch_size=16, label_name="softmax_label")
    loop = MainLoop(mlp(), it, contexts=TWO_CPUS, extensions=[FinishAfter(after_n_epochs=1)])
    manager = loop.manager.evaluation_manager(it.provide_data, it.provide_label)
    metrics = [("softmax", m) for m in create_metrics(["acc", "ce"])]
    if head:
        from mxoid.metrics.head import per_row_head

        graph = per_row_head(
            loop.symbol, metrics, ["softmax_label"], {"data": (16, 10), "softmax_label": (16,)}, [8]
        )
        manager = loop.manager.evaluation_manager(
            it.provide_data, it.provide_label, private_heads=[graph]
        )
        accumulator = MetricAccumulator(manager, metrics, manager.private_outputs[0])
    else:
        accumulator = MetricAccumulator(manager, metrics)

    def expected(prob, labels):
        picked = prob[np.arange(len(labels)), labels.astype(int)]
        per_row = -np.log(picked + np.float32(1e-12))  # in float32, as on the devices
        return [np.mean(prob.argmax(axis=1) == labels), np.mean(per_row.astype(np.float64))]

    def device_sums():  # the arrays the devices add to (the newest of the two sets without head)
        current = accumulator._sums[accumulator._parity]
        return accumulator._head_sums or [array for sums in current for array in sums]

    for epoch in range(3):
        params = {k: v * (1 + epoch) for k, v in loop.get_params()[0].items()}
        loop.manager.set_params(params, {})  # the evaluation set shares the arrays
        prob, labels = _run_batches(manager, accumulator, it)
        assert accumulator.values() == pytest.approx(expected(prob, labels), rel=1e-6)
        accumulator.reset()
        assert accumulator.rows == 0 and not accumulator.totals()[:, 0].any()
        # nothing zeroed on the devices: they still hold every batch read so far
        assert any(np.abs(array.asnumpy()).sum() > 0 for array in device_sums())
    state = accumulator.state_dict()
    prob, labels = _run_batches(manager, accumulator, it)
    accumulator.load_state_dict(state)  # back to just after the reset
    assert accumulator.rows == 0 and not accumulator.totals()[:, 0].any()
    _run_batches(manager, accumulator, it)  # a batch added: the next reset must zero
    accumulator.reset()
    assert all(np.abs(array.asnumpy()).sum() == 0 for array in device_sums())
    prob, labels = _run_batches(manager, accumulator, it)
    assert accumulator.values() == pytest.approx(expected(prob, labels), rel=1e-6)


def test_metrics_with_arguments_by_name_as_mx_metric_create_takes_them():
    X, y = dataset("valid")
    loop = two_head_loop([FinishAfter(after_n_epochs=1)])
    loop.run()
    top2 = ("top_k_accuracy", {"top_k": 2})
    f1 = ("f1", {"average": "micro"})
    created = create_metrics([top2, f1])
    assert isinstance(created[0], DeviceMetric) and created[0].name == "top_k_accuracy_2"
    assert isinstance(created[1], HostMetric)
    assert [m.name for m in create_metrics(top2)] == ["top_k_accuracy_2"]  # alone, not a list
    records = loop.score(iterator(X, y, 16, last_batch_handle="pad"), {"softmax": [top2]})
    prob, _ = numpy_forward(loop.get_params()[0], X)
    mxnet_top2 = mx.metric.create("top_k_accuracy", top_k=2)
    mxnet_top2.update([mx.nd.array(y)], [mx.nd.array(prob)])
    assert records == pytest.approx({"valid_softmax_top_k_accuracy_2": mxnet_top2.get()[1]})
    with pytest.raises(ValueError, match=r"mx.metric.create\('acc', \*\*\{'top_k': 2\}\) fails"):
        create_metrics(("acc", {"top_k": 2}))


def _head_operators(head):
    return [node["op"] for node in json.loads(head.tojson())["nodes"] if node["op"] != "null"]


def test_accuracy_of_float32_outputs_takes_fewer_operators_and_counts_every_label_as_mxnet():
    """Where the output and the label are float32, the accuracy's hits are argmax against
    the label truncated toward zero, and all the values are cast at once (two operators
    fewer in the graph for accuracy and cross-entropy); MXNet's Accuracy casts both to
    int32. Labels that are fractional, negative, out of range, huge or NaN count the same
    in both."""
    from mxoid.metrics.head import per_row_head

    X, y = dataset("valid")
    y = y.copy()
    y[:12] = [0.7, 1.99, 2.5, -0.5, -1.0, 3.0, 7.0, 1e10, -1e10, np.nan, np.inf, 2.0]
    loop = two_head_loop([FinishAfter(after_n_epochs=1)])
    loop.run()
    evaluate = Evaluate({"valid": iterator(X, y, 21)}, {"softmax": ["acc", "ce"]})
    evaluate.attach(loop)
    records = evaluate.evaluate()
    (prob,) = loop.predict(iterator(X, y, 21), outputs="softmax").values()
    with np.errstate(invalid="ignore"):
        mxnet_accuracy = mx.metric.Accuracy()
        mxnet_accuracy.update([mx.nd.array(y)], [mx.nd.array(prob)])
    assert records["valid_softmax_accuracy"] == mxnet_accuracy.get()[1]
    assert 0 < mxnet_accuracy.get()[1] < 1

    metrics = [("softmax", m) for m in create_metrics(["acc", "ce"])]
    shapes = {"data": (21, X.shape[1]), "softmax_label": (21,), "reg_label": (21,)}
    lean = per_row_head(
        loop.symbol, metrics, ["softmax_label", "reg_label"], shapes, [11, 10], native=False
    )
    robust = per_row_head(
        loop.symbol,
        metrics,
        ["softmax_label", "reg_label"],
        shapes,
        [11, 10],
        input_types={"softmax_label": "float64"},
    )
    assert _head_operators(lean).count("Cast") == 1 and "fix" in _head_operators(lean)
    assert _head_operators(robust).count("Cast") == 4
    assert len(_head_operators(robust)) - len(_head_operators(lean)) == 2


def test_the_loss_metric_is_summed_on_the_devices_as_mxnets_loss_reads_it():
    """'loss' (a Gluon block's record of its loss) was MXNet's Loss on the host, a sync per
    batch; on the devices it is the same mean of the output's values over the real rows."""
    [metric] = create_metrics("loss")
    assert isinstance(metric, DeviceMetric) and metric.name == "loss"
    X, y = classification_data(n=50)
    it = mx.io.NDArrayIter(X, y, batch_size=16, label_name="softmax_label")  # padded last batch
    loop = MainLoop(mlp(), it, contexts=TWO_CPUS, extensions=[FinishAfter(after_n_epochs=1)])
    manager = loop.manager.evaluation_manager(it.provide_data, it.provide_label)
    on_devices = MetricAccumulator(manager, [("softmax_output", metric)])
    on_host = MetricAccumulator(manager, [("softmax_output", HostMetric(mx.metric.Loss()))])
    for batch in it:
        manager.load_data_batch(batch)
        manager.forward()
        on_devices.update()
        on_host.update()
    assert on_devices.rows == on_host.rows == 50
    assert on_devices.values() == [pytest.approx(on_host.values()[0], rel=1e-6)]


def test_the_loss_metric_of_a_loss_already_averaged_stays_mxnets_on_the_host():
    """A MakeLoss of a mean gives one value per batch, not per row: MXNet's Loss reads it."""
    X, y = classification_data(n=40)
    fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=1, name="fc")
    diff = mx.sym.reshape(fc, shape=(-1,)) - mx.sym.var("lin_label")
    symbol = mx.sym.MakeLoss(mx.sym.mean(mx.sym.square(diff)), name="lin")
    it = mx.io.NDArrayIter(X, y, batch_size=16, label_name="lin_label")
    loop = MainLoop(symbol, it, extensions=[FinishAfter(after_n_epochs=1)])
    manager = loop.manager.evaluation_manager(it.provide_data, it.provide_label)
    made = MetricAccumulator(manager, [("lin_output", m) for m in create_metrics("loss")])
    assert isinstance(made.metrics[0], HostMetric) and made.metrics[0].name == "loss"
    reference = MetricAccumulator(manager, [("lin_output", HostMetric(mx.metric.Loss()))])
    it.reset()
    for batch in it:
        manager.load_data_batch(batch)
        manager.forward()
        made.update()
        reference.update()
    assert made.values() == reference.values() and np.isfinite(made.values()[0])
