"""Monitor against what mx.mon.Monitor prints in Module.fit, batch for batch."""

import logging
import re

import mxnet as mx
import numpy as np
import pytest
from conftest import TWO_CPUS
from monitored import CountHostSyncs, SyncProbe
from networks import digits_images, dropout_lenet, initial_params

from mxoid import FinishAfter, MainLoop, Monitor

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


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


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
