"""Monitor against what mx.mon.Monitor prints in Module.fit, batch for batch."""

import logging
import re
import textwrap

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS, json_from_fresh_python
from monitored import CountHostSyncs, Lines, SyncProbe
from networks import digits_images, dropout_lenet, initial_params

from mxoid import Evaluate, FinishAfter, MainLoop, Monitor

BATCH = 32
DEVICES = {"one": [mx.cpu()], "two": TWO_CPUS}
OPTIMIZER_PARAMS = {"learning_rate": 0.1, "momentum": 0.9}
# The gradient of SoftmaxOutput with respect to its label: MXNet never writes it, so
# whatever memory it sits on is what both monitors see. A pooling "workspace" output is
# MKLDNN's scratch memory: its contents depend on which kernel ran last on it.
UNDEFINED = {"softmax_backward_output1", "pool1_workspace", "pool2_workspace"}


def digits_iter():
    X, y = digits_images(192)
    np.random.seed(3)
    return mx.io.NDArrayIter(X, y, batch_size=BATCH, shuffle=True, label_name="softmax_label")


def monitored_loop(devices, extensions):
    net = dropout_lenet()
    args, aux = initial_params(net, (BATCH, 1, 8, 8))
    mx.random.seed(7)
    return MainLoop(
        net,
        digits_iter(),
        contexts=DEVICES[devices],
        arg_params=args,
        aux_params=aux,
        optimizer_params=dict(OPTIMIZER_PARAMS),
        extensions=[FinishAfter(after_n_epochs=1), *extensions],
    )


def module_fit_monitor(devices, every, pattern, stat_func=None):
    """What mx.mon.Monitor prints in Module.fit: batch -> name -> value (the first device's).

    Its step starts at 1 so that it fires on batches every, 2 * every, ... as Monitor
    does; it prints the step after the batch, i.e. the batch number + 1."""
    net = dropout_lenet()
    args, aux = initial_params(net, (BATCH, 1, 8, 8))
    monitor = mx.mon.Monitor(every, stat_func=stat_func, pattern=pattern)
    monitor.step = 1
    handler = Lines()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        mx.random.seed(7)
        module = mx.mod.Module(net, context=DEVICES[devices], logger=logging.getLogger("quiet"))
        module.fit(
            digits_iter(),
            num_epoch=1,
            optimizer_params=dict(OPTIMIZER_PARAMS),
            arg_params=args,
            aux_params=aux,
            monitor=monitor,
        )
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    printed = {}
    for line in handler.lines:
        match = re.match(r"Batch:\s+(\d+) (\S+)\s+(\S+)", line)
        if match:
            batch = int(match.group(1)) - 1
            printed.setdefault(batch, {}).setdefault(match.group(2), float(match.group(3)))
    return printed


@pytest.mark.parametrize("devices", ["one", "two"])
def test_monitor_records_equal_what_mx_mon_prints_in_module_fit(devices):
    loop = monitored_loop(devices, [Monitor(".*", every_n_batches=2)]).run()
    printed = module_fit_monitor(devices, 2, ".*")
    assert sorted(printed) == [2, 4, 6]
    for batch, values in printed.items():
        ours = {
            key[len("monitor_") : -len("_rms")]: value
            for key, value in loop.log[batch].items()
            if key.startswith("monitor_")
        }
        assert set(ours) == set(values)
        # Outputs of the forward and backward pass, then weights after the step.
        assert {"conv1_output", "fc1_backward_output1", "fc1_weight", "data"} <= set(ours)
        for name in set(values) - UNDEFINED:
            assert ours[name] == pytest.approx(values[name], rel=1e-5), (batch, name)
    unmonitored = dict(loop.log.items()).get(1, {})
    assert not any(k.startswith("monitor_") for k in unmonitored)


def test_monitor_with_a_pattern_and_another_statistic():
    def max_abs(x):
        return mx.nd.max(mx.nd.abs(x))

    loop = monitored_loop("one", [Monitor(".*weight|.*backward.*", 3, stat="max_abs")]).run()
    printed = module_fit_monitor("one", 3, ".*weight|.*backward.*", stat_func=max_abs)
    assert sorted(printed) == [3, 6]
    for batch, values in printed.items():
        ours = {k: v for k, v in loop.log[batch].items() if k.startswith("monitor_")}
        assert set(ours) == {f"monitor_{name}_max_abs" for name in values}
        for name in set(values) - UNDEFINED:
            assert ours[f"monitor_{name}_max_abs"] == pytest.approx(values[name], rel=1e-6)


def test_training_is_bit_identical_with_and_without_the_monitor():
    """Dropout included: the monitored batches run on twins of the executors, same arrays."""
    plain = monitored_loop("two", []).run()
    monitored = monitored_loop("two", [Monitor(every_n_batches=2)]).run()
    theirs = monitored.get_params()[0]
    for name, value in plain.get_params()[0].items():
        np.testing.assert_array_equal(value.asnumpy(), theirs[name].asnumpy(), err_msg=name)


def test_monitor_costs_no_host_sync_on_the_other_batches(monkeypatch):
    counter = CountHostSyncs(monkeypatch)
    probe = SyncProbe(counter)
    monitored_loop("one", [Monitor(every_n_batches=3), probe]).run()
    counts = [count for hook, count in probe.notes if hook == "after_batch"]
    increments = np.diff([probe.notes[0][1]] + counts)
    assert [bool(i) for i in increments] == [False, False, True] * 2


def test_monitor_checks_its_arguments():
    with pytest.raises(ValueError, match="every_n_batches"):
        Monitor(every_n_batches=0)
    with pytest.raises(ValueError, match="unknown stat 'median'"):
        Monitor(stat="median")
    with pytest.raises(ValueError, match="not a regular expression"):
        Monitor("(")


SEVERAL_GENERATORS = textwrap.dedent(
    """
    import json, mxnet as mx, numpy as np
    from mxoid import Evaluate, Extension, FinishAfter, MainLoop, Monitor
    X = np.random.RandomState(0).rand(80, 6).astype("float32")
    y = np.floor(X[:, 0] * 3).astype("float32")

    def train(*extensions, contexts=(mx.cpu(0),)):
        mx.random.seed(3)
        net = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=8, name="fc1")
        net = mx.sym.Activation(net, act_type="relu", name="relu")
        net = mx.sym.Dropout(net, p=0.5, name="drop")
        net = mx.sym.FullyConnected(net, num_hidden=3, name="fc2")
        loop = MainLoop(
            mx.sym.SoftmaxOutput(net, name="softmax"),
            mx.io.NDArrayIter(X, y, 20, label_name="softmax_label"),
            contexts=list(contexts),
            optimizer_params={"learning_rate": 0.1},
            extensions=[*extensions, FinishAfter(after_n_epochs=2)],
        ).run()
        params = {k: v.asnumpy() for k, v in loop.get_params()[0].items()}
        records = {
            (i, k): v for i in loop.log for k, v in loop.log[i].items() if k.startswith("monitor_")
        }
        return params, records

    def kept(records):  # less the label's gradient, which MXNet never writes
        return {k: v for k, v in records.items() if k[1] != "monitor_softmax_backward_output1_rms"}

    plain, _ = train()
    monitored, records = train(Monitor(every_n_batches=3))
    # An evaluation on the training executors (a host metric, the training batch size)
    # after every batch, its hook before the Monitor's.
    again = mx.io.NDArrayIter(X[40:], y[40:], 20, label_name="softmax_label")
    evaluate = Evaluate({"again": again}, [mx.metric.Accuracy()], every_n_batches=1)
    evaluated, evaluated_records = train(evaluate, Monitor(every_n_batches=3))
    # And one in a before_batch hook after the Monitor's, before the batch's training pass.
    class ScoreFirst(Extension):
        def before_batch(self, batch):
            again = mx.io.NDArrayIter(X[40:], y[40:], 20, label_name="softmax_label")
            self.main_loop.score(again, [mx.metric.Accuracy()])

    _, scored_records = train(Monitor(every_n_batches=3), ScoreFirst())
    two = [mx.cpu(0), mx.cpu(1)]
    plain_two = train(contexts=two)[0]
    monitored_two = train(Monitor(every_n_batches=3), contexts=two)[0]
    print(json.dumps({
        "same": all(np.array_equal(plain[k], monitored[k]) for k in plain),
        "same_evaluated": all(np.array_equal(plain[k], evaluated[k]) for k in plain),
        "same_two": all(np.array_equal(plain_two[k], monitored_two[k]) for k in plain),
        "batches": sorted({i for i, _ in records}),
        "names": sorted({k for _, k in records}),
        "same_records": kept(evaluated_records) == kept(records),
        "same_scored_records": kept(scored_records) == kept(records),
    }))
    """
)


def test_with_several_cpu_random_generators_the_monitor_leaves_dropout_as_it_was():
    """With MXNET_CPU_PARALLEL_RAND_COPY=2 (and on GPUs, where MXNet keeps several by
    default) a twin's Dropout would draw from another generator than its executor's: the
    callback sits on the training executor, which trains as without the Monitor (on one
    CPU context and on two), and evaluations on the training executors before and after a
    monitored batch's training pass leave its records."""
    report = json_from_fresh_python(SEVERAL_GENERATORS, MXNET_CPU_PARALLEL_RAND_COPY="2")
    assert report["same"] and report["same_evaluated"] and report["same_two"]
    assert report["batches"] == [3, 6] and report["same_records"]
    assert report["same_scored_records"]
    assert {"monitor_drop_output_rms", "monitor_fc1_backward_output1_rms"} <= set(report["names"])


def test_an_evaluation_on_the_training_executors_leaves_the_monitored_batch_records():
    """Evaluate's hook before the Monitor's, a host metric at the training batch size:
    its forward passes load its own batches into the training executors' inputs. The
    Monitor's records are still those of the batch it watched, inputs included."""
    X, y = digits_images(64)

    def records(*extensions):
        loop = monitored_loop("one", [*extensions, Monitor(every_n_batches=2)]).run()
        return {
            (i, k): v
            for i in loop.log
            for k, v in loop.log[i].items()
            if k.startswith("monitor_") and k[len("monitor_") : -len("_rms")] not in UNDEFINED
        }

    again = mx.io.NDArrayIter(X, y, batch_size=BATCH, label_name="softmax_label")
    evaluated = records(Evaluate({"again": again}, [mx.metric.Accuracy()], every_n_batches=1))
    plain = records()
    assert {"monitor_data_rms", "monitor_softmax_label_rms"} <= {k for _, k in plain}
    assert evaluated == plain
