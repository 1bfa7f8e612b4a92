"""The sweep suite: mxoid's host time per step against the hand loop's, by parameter arrays.

Deep, narrow networks of 10 to 200 arrays and a CIFAR ResNet-56 (173), negligible
compute, trained by the loop suite's hand loop and a bare MainLoop in alternating
rounds; mxoid's host time minus the hand loop's per array (target: under 1 us at 200).
Both must end with the same parameters (``rtol=1e-5``).
"""

import sys
from typing import Dict, List, Optional, Sequence

import mxnet as mx
import numpy as np
from harness import report, turns, workload

from suites.workloads.symbol_contenders import OPTIMIZERS, hand_loop, mxoid_loop

WIDTH, BATCH = 16, 32
RESNET, RESNET_BATCH, RESNET_SIDE = "resnet56", 8, 8
KEYS = ("arrays", "contexts", "batches", "epochs", "rounds")  # batches: an epoch's, ResNet's
MODES = {
    "full": ((10, 50, 100, 200, RESNET), (1, 2), (128, 32), 3, 9),
    "quick": ((10, 200, RESNET), (1,), (64, 8), 2, 2),
    "check": ((10, 50, RESNET), (1, 2), (8, 2), 1, 1),
}
TARGET_US_PER_ARRAY = 1.0
CONTENDERS = {"hand": hand_loop, "mxoid": mxoid_loop}


def deep_narrow(arrays: int) -> mx.sym.Symbol:
    """``arrays // 2`` FullyConnected layers (a weight and a bias each), the last of 10 units."""
    layers = arrays // 2
    net = mx.sym.Variable("data")
    for i in range(layers - 1):
        net = mx.sym.FullyConnected(net, num_hidden=WIDTH, name=f"fc{i}")
        net = mx.sym.Activation(net, act_type="relu")
    net = mx.sym.FullyConnected(net, num_hidden=10, name=f"fc{layers - 1}")
    return mx.sym.SoftmaxOutput(net, name="softmax")


def resnet56() -> mx.sym.Symbol:
    """The CIFAR ResNet-56 of He et al. (2016) (:func:`harness.workload.cifar_resnet`)."""
    return workload.cifar_resnet(9)


def case(arrays) -> tuple:
    """``(label, symbol, sample shape, batch size, number of parameter arrays)``."""
    if arrays == RESNET:
        symbol = resnet56()
        count = len(symbol.list_arguments()) - 2
        return f"ResNet-56 ({count})", symbol, (3, RESNET_SIDE, RESNET_SIDE), RESNET_BATCH, count
    return str(arrays), deep_narrow(arrays), (WIDTH,), BATCH, arrays


def initial(symbol: mx.sym.Symbol, shape: tuple, batch: int) -> Dict[str, np.ndarray]:
    """Uniform in +-0.3 for the narrow layers; Glorot-uniform weights for the ResNet's
    convolutions, BatchNorm's gamma 1 and beta 0."""
    rng = np.random.RandomState(1)
    shapes, _, _ = symbol.infer_shape(data=(batch,) + shape, softmax_label=(batch,))
    params = {}
    for name, param_shape in zip(symbol.list_arguments(), shapes):
        if name.endswith("_gamma"):
            params[name] = np.ones(param_shape, "float32")
        elif name.endswith("_beta"):
            params[name] = np.zeros(param_shape, "float32")
        elif name.endswith("_conv_weight"):
            fan_in = int(np.prod(param_shape[1:]))
            limit = np.sqrt(6.0 / (fan_in + param_shape[0] * int(np.prod(param_shape[2:]))))
            params[name] = rng.uniform(-limit, limit, param_shape).astype("float32")
        elif name not in ("data", "softmax_label"):
            params[name] = rng.uniform(-0.3, 0.3, param_shape).astype("float32")
    return params


def measure(network, devices: int, settings: dict, failures: List[str]) -> dict:
    """Both contenders on one network, round after round; the row of the table."""
    label, symbol, shape, batch_size, arrays = case(network)
    batches = settings["batches"][network == RESNET]
    rng = np.random.RandomState(0)
    X = rng.uniform(-1, 1, (batches * batch_size,) + shape).astype("float32")
    y = rng.randint(0, 10, batches * batch_size).astype("float32")
    init, params = initial(symbol, shape, batch_size), {}
    spec = dict(contexts=devices, batch_size=batch_size, epochs=settings["epochs"] + 1)
    spec["optimizer"] = "momentum"

    def run(name: str) -> tuple:
        """A warm-up epoch and the timed ones: us per step, wall and host thread."""
        clock = workload.EpochClock()
        iterator = mx.io.NDArrayIter(X, y, batch_size=batch_size, label_name="softmax_label")
        clock.tick()
        params[name] = CONTENDERS[name](spec, iterator, init, clock, symbol=symbol)
        steps = batches * (len(clock.stamps) - 2)
        wall = (clock.stamps[-1] - clock.stamps[1]) / steps * 1e6
        return wall, (clock.thread_stamps[-1] - clock.thread_stamps[1]) / steps * 1e6

    times = turns.interleave(run, list(CONTENDERS), settings["rounds"], turns.alternating)
    for name in params["hand"]:
        if not np.allclose(params["mxoid"][name], params["hand"][name], rtol=1e-5, atol=1e-6):
            failures.append(f"{label} arrays, {devices} ctx: {name} differs")
    row = {"network": "resnet56" if network == RESNET else "deep_narrow", "label": label}
    row.update(arrays=arrays, contexts=devices, batch_size=batch_size, input_shape=list(shape))
    for name, measured in times.items():
        wall, host = np.median(measured, axis=0)
        row[name] = {"us_per_step": float(wall), "host_us_per_step": float(host)}
        row[name]["rounds"] = [list(m) for m in measured]
    # Round by round: the two ran back to back, so a slow moment of the machine (which
    # slows the thread's CPU time too) falls on both.
    extra = np.median([m[1] - h[1] for m, h in zip(times["mxoid"], times["hand"])])
    row["host_us_per_array_over_hand"] = float(extra) / arrays
    return row


COLUMNS = (
    ("arrays", "{label}"),
    ("contexts", "{contexts}"),
    ("hand us/step", "{hand[us_per_step]:,.1f}"),
    ("mxoid us/step", "{mxoid[us_per_step]:,.1f}"),
    ("hand host us/step", "{hand[host_us_per_step]:,.1f}"),
    ("mxoid host us/step", "{mxoid[host_us_per_step]:,.1f}"),
    ("mxoid - hand host, us per array", "{host_us_per_array_over_hand:+.2f}"),
)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = report.parser(__doc__, "sweep").parse_args(argv)
    run = report.Run("sweep", args, argv)
    settings, failures, rows = dict(zip(KEYS, MODES[run.mode])), [], []
    for devices in settings["contexts"]:
        for network in settings["arrays"]:
            rows.append(measure(network, devices, settings, failures))
            extra = f"{rows[-1]['host_us_per_array_over_hand']:+.2f} us per array"
            print(f"{rows[-1]['label']:>15} arrays, {devices} ctx: mxoid host - hand's: {extra}")
    print(report.table_of(COLUMNS, rows, "rrrrrrr"))
    resnet = {"batch_size": RESNET_BATCH, "input_shape": [3, RESNET_SIDE, RESNET_SIDE]}
    fixed = {"width": WIDTH, "batch_size": BATCH, "target_us_per_array": TARGET_US_PER_ARRAY}
    settings = {**fixed, "resnet": resnet, "optimizer": OPTIMIZERS["momentum"][1], **settings}
    return run.finish(failures, settings, rows)
