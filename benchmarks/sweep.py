"""Per-step host time against the number of parameter arrays: mxoid against the hand loop.

A deep, narrow network (``FullyConnected`` layers of 16 units with ReLU, batch
32, 16 input features: the compute is negligible) with 10, 50, 100 and 200
parameter arrays, and a CIFAR ResNet-56 (3 stages of 9 basic blocks, 16/32/64
channels, BatchNorm after every convolution: 170 parameter arrays and 110
auxiliary states) on 8x8 inputs at batch 8, so its compute stays small,
trained with momentum SGD by two contenders in one process, interleaved in
rounds:

- ``hand``: the floor of ``run.py``: ``simple_bind`` executors, ``copyto``,
  forward, backward, one ``mx.nd.sgd_mom_update`` per parameter on one context
  (on two, a ``'local'`` kvstore sums the gradients and updates, one
  ``pushpull`` per parameter);
- ``mxoid``: a bare ``MainLoop`` (``FinishAfter`` only).

Each run is a warm-up epoch and timed epochs; per step it reports the wall time
and the Python thread's CPU time (``time.thread_time()``: the host work, the
ceiling on an accelerator), medians over the rounds, and mxoid's host time
minus the hand loop's per parameter array, the median of the rounds'
differences (the target: under 1 us at 200 arrays).

Usage::

    python benchmarks/sweep.py            # full: a few minutes
    python benchmarks/sweep.py --quick    # under 30 s
    python benchmarks/sweep.py --check    # both end with the same parameters

``--check`` exits with status 1 when they do not (``rtol=1e-5``); speed never
changes the exit status.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import standalone  # noqa: E402, I001  (first: the thread settings, before MXNet is imported)

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

import mxoid  # noqa: E402

NAME = "sweep"
WIDTH = 16
BATCH = 32
PARAMS = {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4}
RESNET = "resnet56"
RESNET_BATCH, RESNET_SIDE = 8, 8
MODES = {
    "full": {
        "arrays": (10, 50, 100, 200, RESNET),
        "contexts": (1, 2),
        "batches": 128,
        "resnet_batches": 32,
        "epochs": 3,
        "rounds": 9,
    },
    "quick": {
        "arrays": (10, 200, RESNET),
        "contexts": (1,),
        "batches": 64,
        "resnet_batches": 8,
        "epochs": 2,
        "rounds": 2,
    },
    "check": {
        "arrays": (10, 50, RESNET),
        "contexts": (1, 2),
        "batches": 8,
        "resnet_batches": 2,
        "epochs": 1,
        "rounds": 1,
    },
}
TARGET_US_PER_ARRAY = 1.0


def deep_narrow(arrays: int) -> mx.sym.Symbol:
    """``arrays // 2`` FullyConnected layers (a weight and a bias each), the last of 10 units."""
    layers = arrays // 2
    net = mx.sym.Variable("data")
    for i in range(layers - 1):
        net = mx.sym.Activation(
            mx.sym.FullyConnected(net, num_hidden=WIDTH, name=f"fc{i}"), act_type="relu"
        )
    net = mx.sym.FullyConnected(net, num_hidden=10, name=f"fc{layers - 1}")
    return mx.sym.SoftmaxOutput(net, name="softmax")


def resnet56() -> mx.sym.Symbol:
    """The CIFAR ResNet-56 of He et al. (2016): 3 stages of 9 basic blocks, 16/32/64 channels.

    Every convolution (without bias) is followed by BatchNorm (trainable gamma);
    the first block of the second and third stages halves the resolution and
    takes a 1x1 convolution (and BatchNorm) as its shortcut.
    """

    def conv_bn(x, channels, kernel, stride, name):
        pad = (kernel // 2, kernel // 2)
        x = mx.sym.Convolution(
            x, num_filter=channels, kernel=(kernel, kernel), stride=(stride, stride), pad=pad,
            no_bias=True, name=f"{name}_conv",
        )  # fmt: skip
        return mx.sym.BatchNorm(x, fix_gamma=False, momentum=0.9, name=f"{name}_bn")

    net = mx.sym.Activation(conv_bn(mx.sym.Variable("data"), 16, 3, 1, "stem"), act_type="relu")
    for stage, channels in enumerate((16, 32, 64)):
        for block in range(9):
            name = f"s{stage}b{block}"
            stride = 2 if stage > 0 and block == 0 else 1
            body = mx.sym.Activation(conv_bn(net, channels, 3, stride, f"{name}a"), act_type="relu")
            body = conv_bn(body, channels, 3, 1, f"{name}b")
            shortcut = conv_bn(net, channels, 1, stride, f"{name}s") if stride == 2 else net
            net = mx.sym.Activation(body + shortcut, act_type="relu")
    net = mx.sym.Pooling(net, global_pool=True, pool_type="avg", kernel=(1, 1))
    net = mx.sym.FullyConnected(mx.sym.flatten(net), num_hidden=10, name="fc")
    return mx.sym.SoftmaxOutput(net, name="softmax")


def case(arrays) -> tuple:
    """``(label, symbol, sample shape, batch size, number of parameter arrays)``."""
    if arrays == RESNET:
        symbol = resnet56()
        count = len(symbol.list_arguments()) - 2
        return f"ResNet-56 ({count})", symbol, (3, RESNET_SIDE, RESNET_SIDE), RESNET_BATCH, count
    return str(arrays), deep_narrow(arrays), (WIDTH,), BATCH, arrays


def data(batches: int, shape: tuple, batch: int):
    rng = np.random.RandomState(0)
    X = rng.uniform(-1, 1, (batches * batch,) + shape).astype("float32")
    y = rng.randint(0, 10, batches * batch).astype("float32")
    return X, y


def initial(symbol: mx.sym.Symbol, shape: tuple, batch: int) -> Dict[str, np.ndarray]:
    """Uniform in +-0.3 for the narrow layers; Glorot-uniform weights for the ResNet's
    convolutions, BatchNorm's gamma 1 and beta 0."""
    rng = np.random.RandomState(1)
    shapes, _, _ = symbol.infer_shape(data=(batch,) + shape, softmax_label=(batch,))
    params = {}
    for name, param_shape in zip(symbol.list_arguments(), shapes):
        if name in ("data", "softmax_label"):
            continue
        if name.endswith("_gamma"):
            params[name] = np.ones(param_shape, "float32")
        elif name.endswith("_beta"):
            params[name] = np.zeros(param_shape, "float32")
        elif name.endswith("_conv_weight"):
            fan_in = int(np.prod(param_shape[1:]))
            fan_out = param_shape[0] * int(np.prod(param_shape[2:]))
            limit = np.sqrt(6.0 / (fan_in + fan_out))
            params[name] = rng.uniform(-limit, limit, param_shape).astype("float32")
        else:
            params[name] = rng.uniform(-0.3, 0.3, param_shape).astype("float32")
    return params


class Clock:
    """Wall and Python-thread CPU time of the timed epochs (the first epoch warms up)."""

    def __init__(self) -> None:
        self.marks: List[tuple] = []

    def tick(self) -> None:
        mx.nd.waitall()
        self.marks.append((time.perf_counter(), time.thread_time()))

    def per_step(self, batches: int) -> tuple:
        (w0, c0), (w1, c1) = self.marks[1], self.marks[-1]
        steps = batches * (len(self.marks) - 2)
        return (w1 - w0) / steps * 1e6, (c1 - c0) / steps * 1e6


def hand(symbol, X, y, init, devices: int, epochs: int, clock: Clock, batch_size: int):
    ctxs = [mx.cpu(i) for i in range(devices)]
    names = [n for n in symbol.list_arguments() if n not in ("data", "softmax_label")]
    rows = batch_size // devices
    grad_req = {n: ("write" if n in names else "null") for n in symbol.list_arguments()}
    executors = []
    for ctx in ctxs:
        executor = symbol.simple_bind(
            ctx, grad_req=grad_req, data=(rows,) + X.shape[1:], softmax_label=(rows,)
        )
        for name in names:
            executor.arg_dict[name][:] = init[name]
        executors.append(executor)
    weights = [[e.arg_dict[n] for n in names] for e in executors]
    grads = [[e.grad_dict[n] for n in names] for e in executors]
    rescale, lr, momentum = 1.0 / batch_size, PARAMS["learning_rate"], PARAMS["momentum"]
    # Weight decay on *_weight and *_gamma only, as MXNet's optimizers decide for symbols.
    wds = [PARAMS["wd"] if n.endswith(("_weight", "_gamma")) else 0.0 for n in names]
    kvstore = None
    if devices == 1:
        moms = [mx.nd.zeros(w.shape, ctx=w.context) for w in weights[0]]
        steps = list(zip(weights[0], grads[0], moms, wds))
    else:
        kvstore = mx.kv.create("local")
        for i in range(len(names)):
            kvstore.init(i, weights[0][i])
        states: Dict[int, mx.nd.NDArray] = {}

        def update(key, grad, weight):
            if key not in states:
                states[key] = mx.nd.zeros(weight.shape, ctx=weight.context)
            mx.nd.sgd_mom_update(
                weight,
                grad,
                states[key],
                out=weight,
                lr=lr,
                momentum=momentum,
                wd=wds[key],
                rescale_grad=rescale,
            )

        kvstore._set_updater(update)
        pushpulls = [
            (i, [g[i] for g in grads], [w[i] for w in weights], -i) for i in range(len(names))
        ]
    it = mx.io.NDArrayIter(X, y, batch_size=batch_size, label_name="softmax_label")
    clock.tick()
    for _ in range(epochs):
        it.reset()
        for batch in it:
            for k, executor in enumerate(executors):
                part = slice(k * rows, (k + 1) * rows)
                batch.data[0][part].copyto(executor.arg_dict["data"])
                batch.label[0][part].copyto(executor.arg_dict["softmax_label"])
            for executor in executors:
                executor.forward(is_train=True)
            for executor in executors:
                executor.backward()
            if kvstore is None:
                for weight, grad, mom, wd in steps:
                    mx.nd.sgd_mom_update(
                        weight,
                        grad,
                        mom,
                        out=weight,
                        lr=lr,
                        momentum=momentum,
                        wd=wd,
                        rescale_grad=rescale,
                    )
            else:
                for key, device_grads, device_weights, priority in pushpulls:
                    kvstore.pushpull(key, device_grads, out=device_weights, priority=priority)
        clock.tick()
    return {n: w.asnumpy() for n, w in zip(names, weights[0])}


class Tick(mxoid.Extension):
    def __init__(self, clock: Clock) -> None:
        super().__init__(after_epoch=True)
        self.clock = clock

    def do(self, which_callback, *args):
        self.clock.tick()


def with_mxoid(symbol, X, y, init, devices: int, epochs: int, clock: Clock, batch_size: int):
    it = mx.io.NDArrayIter(X, y, batch_size=batch_size, label_name="softmax_label")
    loop = mxoid.MainLoop(
        symbol,
        it,
        contexts=[mx.cpu(i) for i in range(devices)],
        arg_params={n: mx.nd.array(v) for n, v in init.items()},
        optimizer_params=dict(PARAMS),
        extensions=[mxoid.FinishAfter(after_n_epochs=epochs), Tick(clock)],
    )
    clock.tick()
    loop.run()
    return {n: v.asnumpy() for n, v in loop.get_params()[0].items()}


CONTENDERS = {"hand": hand, "mxoid": with_mxoid}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = standalone.argument_parser(__doc__, NAME)
    args = parser.parse_args(argv)
    mode = standalone.mode_of(args)
    settings = MODES[mode]
    load = standalone.OtherLoad()
    results, failures = [], []
    for devices in settings["contexts"]:
        for network in settings["arrays"]:
            label, symbol, shape, batch_size, arrays = case(network)
            batches = settings["resnet_batches" if network == RESNET else "batches"]
            X, y = data(batches, shape, batch_size)
            init = initial(symbol, shape, batch_size)
            times: Dict[str, List[tuple]] = {name: [] for name in CONTENDERS}
            params = {}
            for round_ in range(settings["rounds"]):
                order = list(CONTENDERS) if round_ % 2 == 0 else list(CONTENDERS)[::-1]
                for name in order:
                    clock = Clock()
                    params[name] = CONTENDERS[name](
                        symbol, X, y, init, devices, settings["epochs"] + 1, clock, batch_size
                    )
                    times[name].append(clock.per_step(batches))
            for name in params["hand"]:
                if not np.allclose(
                    params["mxoid"][name], params["hand"][name], rtol=1e-5, atol=1e-6
                ):
                    failures.append(f"{label} arrays, {devices} ctx: {name} differs")
            row = {
                "network": "resnet56" if network == RESNET else "deep_narrow",
                "label": label,
                "arrays": arrays,
                "contexts": devices,
                "batch_size": batch_size,
                "input_shape": list(shape),
            }
            for name, measured in times.items():
                row[name] = {
                    "us_per_step": float(np.median([m[0] for m in measured])),
                    "host_us_per_step": float(np.median([m[1] for m in measured])),
                    "rounds": [list(m) for m in measured],
                }
            # Round by round: the two ran back to back, so a slow moment of the
            # machine (which slows the thread's CPU time too) falls on both.
            extra = float(np.median([m[1] - h[1] for m, h in zip(times["mxoid"], times["hand"])]))
            row["host_us_per_array_over_hand"] = extra / arrays
            results.append(row)
            hand_row, ours = row["hand"], row["mxoid"]
            print(
                f"{label:>15} arrays, {devices} ctx: hand {hand_row['us_per_step']:8.1f} us/step "
                f"(host {hand_row['host_us_per_step']:8.1f}), mxoid {ours['us_per_step']:8.1f} "
                f"(host {ours['host_us_per_step']:8.1f}); mxoid host - hand host: "
                f"{extra / arrays:+.2f} us per array",
                flush=True,
            )
    print()
    print(format_table(results))
    return standalone.finish(
        NAME,
        args,
        load,
        {
            "width": WIDTH,
            "batch_size": BATCH,
            "resnet": {"batch_size": RESNET_BATCH, "input_shape": [3, RESNET_SIDE, RESNET_SIDE]},
            "optimizer": PARAMS,
            "target_us_per_array": TARGET_US_PER_ARRAY,
            **settings,
        },
        results,
        failures,
    )


def format_table(results: List[dict]) -> str:
    lines = [
        "| arrays | contexts | hand us/step | mxoid us/step | hand host us/step "
        "| mxoid host us/step | mxoid - hand host, us per array |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.get('label', r['arrays'])} | {r['contexts']} | {r['hand']['us_per_step']:,.1f} "
            f"| {r['mxoid']['us_per_step']:,.1f} | {r['hand']['host_us_per_step']:,.1f} "
            f"| {r['mxoid']['host_us_per_step']:,.1f} | {r['host_us_per_array_over_hand']:+.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
