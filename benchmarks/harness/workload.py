"""What the suites train: the MLP and LeNet, their data and parameters, clocks, memory.

Synthetic MNIST-shaped data and Glorot-uniform parameters, fixed seeds; the epoch clock
stamps after ``mx.nd.waitall()``. Imports MXNet: apply the thread settings first.
"""

import functools
import math
import os
import time
from typing import Dict, List, Optional

import mxnet as mx
import numpy as np

NUM_CLASSES = 10
DATA_SEED, PARAM_SEED = 0, 1
EVERYDAY_NAMES = ("TrainingMonitoring", "ProgressBar", "Printing", "Timing", "JSONLinesLog")


def build_symbol(model: str) -> mx.sym.Symbol:
    """The MLP 784-128-64-10 (ReLU) or LeNet (tanh, max pooling), softmax output 'softmax'."""
    fc, act = mx.sym.FullyConnected, mx.sym.Activation
    net = mx.sym.Variable("data")
    if model == "mlp":
        net = act(fc(net, num_hidden=128, name="fc1"), act_type="relu", name="relu1")
        net = act(fc(net, num_hidden=64, name="fc2"), act_type="relu", name="relu2")
        net = fc(net, num_hidden=NUM_CLASSES, name="fc3")
    elif model == "lenet":
        for i, filters in ((1, 20), (2, 50)):
            net = mx.sym.Convolution(net, kernel=(5, 5), num_filter=filters, name=f"conv{i}")
            net = act(net, act_type="tanh", name=f"tanh{i}")
            net = mx.sym.Pooling(
                net, pool_type="max", kernel=(2, 2), stride=(2, 2), name=f"pool{i}"
            )
        net = mx.sym.Flatten(net, name="flatten")
        net = act(fc(net, num_hidden=500, name="fc1"), act_type="tanh", name="tanh3")
        net = fc(net, num_hidden=NUM_CLASSES, name="fc2")
    else:
        raise ValueError(f"unknown model {model!r}; use 'mlp' or 'lenet'")
    return mx.sym.SoftmaxOutput(net, name="softmax")


def cifar_resnet(blocks: int) -> mx.sym.Symbol:
    """The CIFAR ResNet of He et al. (2016) with ``blocks`` blocks a stage (3: ResNet-20,
    9: ResNet-56): convolutions without bias, each followed by
    BatchNorm (trainable gamma); the first block of stages 2 and 3 halves the resolution
    and takes a 1x1 convolution (and BatchNorm) as its shortcut."""

    def conv_bn(x, channels, kernel, stride, name):
        pad = (kernel // 2, kernel // 2)
        shape = dict(kernel=(kernel, kernel), pad=pad, stride=(stride, stride))
        x = mx.sym.Convolution(x, num_filter=channels, no_bias=True, name=f"{name}_conv", **shape)
        return mx.sym.BatchNorm(x, fix_gamma=False, momentum=0.9, name=f"{name}_bn")

    def relu(x):
        return mx.sym.Activation(x, act_type="relu")

    net = relu(conv_bn(mx.sym.Variable("data"), 16, 3, 1, "stem"))
    for stage, channels in enumerate((16, 32, 64)):
        for block in range(blocks):
            name, stride = f"s{stage}b{block}", 2 if stage > 0 and block == 0 else 1
            body = conv_bn(
                relu(conv_bn(net, channels, 3, stride, f"{name}a")), channels, 3, 1, f"{name}b"
            )
            shortcut = conv_bn(net, channels, 1, stride, f"{name}s") if stride == 2 else net
            net = relu(body + shortcut)
    net = mx.sym.Pooling(net, global_pool=True, pool_type="avg", kernel=(1, 1))
    net = mx.sym.FullyConnected(mx.sym.flatten(net), num_hidden=10, name="fc")
    return mx.sym.SoftmaxOutput(net, name="softmax")


def sample_shape(model: str) -> tuple:
    return (784,) if model == "mlp" else (1, 28, 28)


def make_data(model: str, num_samples: int, seed: int = DATA_SEED):
    """Synthetic MNIST-shaped data: 10 noisy prototypes, values in [0, 1], fixed seed."""
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, NUM_CLASSES, size=num_samples)
    prototypes = rng.rand(NUM_CLASSES, 784).astype(np.float32)
    images = rng.rand(num_samples, 784).astype(np.float32)
    images *= 0.5
    images += 0.5 * prototypes[labels]
    return images.reshape((num_samples,) + sample_shape(model)), labels.astype(np.float32)


def initial_params(model: str, seed: int = PARAM_SEED) -> Dict[str, np.ndarray]:
    """Glorot-uniform weights and zero biases, drawn in sorted name order with a fixed seed."""
    symbol = build_symbol(model)
    arg_shapes, _, _ = symbol.infer_shape(data=(1,) + sample_shape(model))
    shapes = dict(zip(symbol.list_arguments(), arg_shapes))
    rng = np.random.RandomState(seed)
    params = {}
    for name in sorted(set(shapes) - {"data", "softmax_label"}):
        shape = shapes[name]
        if name.endswith("_bias"):
            params[name] = np.zeros(shape, np.float32)
        else:
            bound = math.sqrt(6.0 / (int(np.prod(shape[1:])) + shape[0]))
            params[name] = rng.uniform(-bound, bound, shape).astype(np.float32)
    return params


def param_names(symbol: mx.sym.Symbol) -> List[str]:
    return [n for n in symbol.list_arguments() if n not in ("data", "softmax_label")]


def contexts(count: int) -> List[mx.Context]:
    return [mx.cpu(i) for i in range(count)]


class EpochClock:
    """Epoch-end stamps after ``mx.nd.waitall()`` (queued work counts): wall-clock
    (``stamps``), CPU time of the process, every thread (``cpu_stamps``), and of the
    Python thread that trains (``thread_stamps``: the host work)."""

    def __init__(self) -> None:
        self.stamps, self.cpu_stamps, self.thread_stamps = [], [], []

    def tick(self, *_ignored) -> None:
        mx.nd.waitall()
        self.stamps.append(time.perf_counter())
        self.cpu_stamps.append(time.process_time())
        self.thread_stamps.append(time.thread_time())


def clock_extension(clock: EpochClock):
    """An mxoid extension stamping the end of each epoch, after every other extension."""
    from mxoid import Extension

    class EpochClockExtension(Extension):
        def after_epoch(self) -> None:
            clock.tick()

    return EpochClockExtension(name="benchmark_clock", priority=float("inf"))


def everyday_extensions(workdir: str, monitored=None):
    """``{name: make(tag='')}`` of the everyday extensions mxoid has, configured as a user
    would (TrainingMonitoring of ``monitored``, ``['acc', 'ce']`` unless given; ProgressBar
    forced on and drawn into /dev/null); and notes on missing ones."""
    import mxoid.extensions as package

    def make(name: str, cls: type, tag: str = ""):
        if name == "TrainingMonitoring":
            return cls(["acc", "ce"] if monitored is None else monitored)
        if name == "ProgressBar":
            return cls(disable=False, file=open(os.devnull, "w"))
        return cls(os.path.join(workdir, f"log{tag}.jsonl")) if name == "JSONLinesLog" else cls()

    found = {n: getattr(package, n) for n in EVERYDAY_NAMES if hasattr(package, n)}
    notes = [f"{n} missing: not in mxoid.extensions" for n in EVERYDAY_NAMES if n not in found]
    return {name: functools.partial(make, name, cls) for name, cls in found.items()}, notes


def everyday(spec: dict, monitored=None) -> list:
    """The everyday extensions of a contender (:func:`everyday_extensions`, in its folder),
    made; their names (and those missing) noted in ``spec['notes']``."""
    factories, notes = everyday_extensions(spec["workdir"], monitored)
    names = [
        f"{n}({monitored})" if monitored and n == "TrainingMonitoring" else n for n in factories
    ]
    spec["notes"] += notes + ["extensions: " + ", ".join(names)]
    return [make() for make in factories.values()]


def rss_kib() -> int:
    """The resident memory of this process, in KiB."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def reset_peak_rss() -> bool:
    """Make the current resident memory the process's peak (``VmHWM``; writing 5 to
    ``/proc/self/clear_refs``, Linux 4.0 and later), so that the peak read after
    training is training's, not that of making the data. False where refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return peak_rss_kib() is not None


def peak_rss_kib() -> Optional[int]:
    """``VmHWM`` of ``/proc/self/status`` in KiB (None where absent)."""
    try:
        with open("/proc/self/status") as status:
            return next((int(ln.split()[1]) for ln in status if ln.startswith("VmHWM:")), None)
    except OSError:
        return None
