"""The contenders of the benchmark: one training loop each, run in a fresh process.

``run.py`` runs :func:`run_worker` once per contender and cell, each time in
a new process (forked from a fork server that has imported this module, or,
with ``--spawn``, ``python contenders.py SPEC.json``), with the thread settings
already in the environment. The worker builds
the same synthetic data and the same initial parameters as every other
contender, trains a warm-up epoch and the timed epochs, and writes the epoch
times, its peak memory and its final parameters next to the spec.

Every contender of a cell runs the same optimizer math: the cell's optimizer
(:data:`OPTIMIZERS`: SGD with momentum, plain SGD, or Adam), weight decay on
``*_weight`` (and ``*_gamma``) parameters only (MXNet's default for symbols),
gradients summed over the batch and rescaled by ``1 / batch_size``. On two
contexts the batch is split in two halves and the gradients of both halves are
summed.
"""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import sys
import time
from typing import Dict, List, Optional

import numpy as np

# run.py puts the thread settings in the environment; a worker started by
# hand gets the same defaults before MXNet reads them at import.
from run import THREAD_SETTINGS  # noqa: E402  (run.py imports no MXNet)

for _name, _value in THREAD_SETTINGS.items():
    os.environ.setdefault(_name, _value)

import mxnet as mx  # noqa: E402

__all__ = [
    "CONTENDERS",
    "EQUAL_TO_HAND",
    "OPTIMIZER_PARAMS",
    "OPTIMIZERS",
    "build_symbol",
    "make_data",
    "initial_params",
    "run_worker",
]

OPTIMIZER_PARAMS = {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4}
# A cell's optimizer: name -> (MXNet optimizer, its parameters, the fused kernel the
# hand loop calls once per parameter). "momentum" is the default cell.
OPTIMIZERS = {
    "momentum": ("sgd", OPTIMIZER_PARAMS, "sgd_mom_update"),
    "sgd": ("sgd", {"learning_rate": 0.05, "wd": 1e-4}, "sgd_update"),
    "adam": ("adam", {"learning_rate": 0.001, "wd": 1e-4}, "adam_update"),
}
ADAM_BETAS, ADAM_EPSILON = (0.9, 0.999), 1e-8  # MXNet's Adam defaults
NUM_CLASSES = 10
DATA_SEED = 0
PARAM_SEED = 1
EVERYDAY_NAMES = ("TrainingMonitoring", "ProgressBar", "Printing", "Timing", "JSONLinesLog")
# Where each everyday extension is being written, for a note when it is not yet
# exported by mxoid.extensions.
EVERYDAY_MODULES = {
    "TrainingMonitoring": "monitoring",
    "ProgressBar": "printing",
    "Printing": "printing",
    "Timing": "timing",
    "JSONLinesLog": "log_writers",
}


# --------------------------------------------------------------------- models
def build_symbol(model: str) -> mx.sym.Symbol:
    """The MLP 784-128-64-10 or LeNet (tanh, max pooling), with a softmax output."""
    data = mx.sym.Variable("data")
    if model == "mlp":
        net = mx.sym.Activation(
            mx.sym.FullyConnected(data, num_hidden=128, name="fc1"), act_type="relu", name="relu1"
        )
        net = mx.sym.Activation(
            mx.sym.FullyConnected(net, num_hidden=64, name="fc2"), act_type="relu", name="relu2"
        )
        net = mx.sym.FullyConnected(net, num_hidden=NUM_CLASSES, name="fc3")
    elif model == "lenet":
        net = data
        for i, filters in ((1, 20), (2, 50)):
            net = mx.sym.Convolution(net, kernel=(5, 5), num_filter=filters, name=f"conv{i}")
            net = mx.sym.Activation(net, act_type="tanh", name=f"tanh{i}")
            net = mx.sym.Pooling(
                net, pool_type="max", kernel=(2, 2), stride=(2, 2), name=f"pool{i}"
            )
        net = mx.sym.Flatten(net, name="flatten")
        net = mx.sym.Activation(
            mx.sym.FullyConnected(net, num_hidden=500, name="fc1"), act_type="tanh", name="tanh3"
        )
        net = mx.sym.FullyConnected(net, num_hidden=NUM_CLASSES, name="fc2")
    else:
        raise ValueError(f"unknown model {model!r}; use 'mlp' or 'lenet'")
    return mx.sym.SoftmaxOutput(net, name="softmax")


def gluon_net(model: str):
    """The same network as a Gluon HybridSequential, its parameters named as the symbol's."""
    from mxnet import gluon

    nn = gluon.nn
    net = nn.HybridSequential(prefix="")
    with net.name_scope():
        if model == "mlp":
            net.add(
                nn.Dense(128, activation="relu", in_units=784, prefix="fc1_"),
                nn.Dense(64, activation="relu", in_units=128, prefix="fc2_"),
                nn.Dense(NUM_CLASSES, in_units=64, prefix="fc3_"),
            )
        else:
            net.add(
                nn.Conv2D(20, 5, activation="tanh", in_channels=1, prefix="conv1_"),
                nn.MaxPool2D(2, 2),
                nn.Conv2D(50, 5, activation="tanh", in_channels=20, prefix="conv2_"),
                nn.MaxPool2D(2, 2),
                nn.Dense(500, activation="tanh", in_units=800, prefix="fc1_"),
                nn.Dense(NUM_CLASSES, in_units=500, prefix="fc2_"),
            )
    return net


def sample_shape(model: str) -> tuple:
    return (784,) if model == "mlp" else (1, 28, 28)


# ----------------------------------------------------------------------- data
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
    for name in sorted(shapes):
        if name in ("data", "softmax_label"):
            continue
        shape = shapes[name]
        if name.endswith("_bias"):
            params[name] = np.zeros(shape, np.float32)
        else:
            fan_out, fan_in = shape[0], int(np.prod(shape[1:]))
            bound = math.sqrt(6.0 / (fan_in + fan_out))
            params[name] = rng.uniform(-bound, bound, shape).astype(np.float32)
    return params


def param_names(symbol: mx.sym.Symbol) -> List[str]:
    return [n for n in symbol.list_arguments() if n not in ("data", "softmax_label")]


def contexts(count: int) -> List[mx.Context]:
    return [mx.cpu(i) for i in range(count)]


def even_slices(batch_size: int, count: int) -> List[slice]:
    step = batch_size // count
    return [slice(k * step, batch_size if k == count - 1 else (k + 1) * step) for k in range(count)]


class EpochClock:
    """Epoch-end timestamps taken after ``mx.nd.waitall()``, so queued work is counted:
    wall-clock (``stamps``), CPU time of the whole process, every thread
    (``cpu_stamps``), and CPU time of the Python thread that trains
    (``thread_stamps``: the host work, the throughput ceiling on an accelerator)."""

    def __init__(self) -> None:
        self.stamps: List[float] = []
        self.cpu_stamps: List[float] = []
        self.thread_stamps: List[float] = []

    def tick(self, *_ignored) -> None:
        mx.nd.waitall()
        self.stamps.append(time.perf_counter())
        self.cpu_stamps.append(time.process_time())
        self.thread_stamps.append(time.thread_time())


# ------------------------------------------------------------------ contenders
def optimizer_of(spec):
    """The cell's ``(MXNet optimizer name, its parameters)``; momentum SGD by default."""
    name, params, _ = OPTIMIZERS[spec.get("optimizer", "momentum")]
    return name, dict(params)


def fused_step(optimizer: str, rescale: float):
    """``(new_state, step)`` for the hand loop: one fused MXNet kernel per parameter.

    ``step(weight, grad, state, wd, t)`` runs the kernel of :data:`OPTIMIZERS` on
    one parameter, in place, with the learning rate MXNet's optimizer would use
    at its ``t``-th update of that parameter (Adam's bias correction, computed as
    ``Adam.update`` computes it); ``new_state(weight)`` makes its state.
    """
    _, params, kernel_name = OPTIMIZERS[optimizer]
    kernel = getattr(mx.nd, kernel_name)
    lr = params["learning_rate"]

    def zeros(weight):
        return mx.nd.zeros(weight.shape, ctx=weight.context)

    if optimizer == "momentum":
        momentum = params["momentum"]

        def step(weight, grad, state, wd, t):
            kernel(
                weight,
                grad,
                state,
                out=weight,
                lr=lr,
                momentum=momentum,
                wd=wd,
                rescale_grad=rescale,
            )

        return zeros, step
    if optimizer == "sgd":

        def step(weight, grad, state, wd, t):
            kernel(weight, grad, out=weight, lr=lr, wd=wd, rescale_grad=rescale)

        return (lambda weight: None), step
    beta1, beta2 = ADAM_BETAS

    def step(weight, grad, state, wd, t):
        kernel(
            weight,
            grad,
            state[0],
            state[1],
            out=weight,
            lr=lr * (math.sqrt(1.0 - beta2**t) / (1.0 - beta1**t)),
            wd=wd,
            beta1=beta1,
            beta2=beta2,
            epsilon=ADAM_EPSILON,
            rescale_grad=rescale,
        )

    return (lambda weight: (zeros(weight), zeros(weight))), step


def hand_loop(spec, train_iter, init, clock, stock_updater: bool = False):
    """The floor: ``simple_bind`` executors and a fused update per parameter.

    One executor per context, each bound on its slice of the batch.

    On one context the update is one call of the cell's fused kernel
    (``mx.nd.sgd_mom_update``, ``sgd_update`` or ``adam_update``, see
    :func:`fused_step`) per parameter, states kept by hand. On two, the
    gradients are summed through a ``'local'`` kvstore that also runs the
    update, once, on the summed gradient, with an updater that calls the same
    kernel (set with ``kvstore._set_updater``, as MXNet's kvstore tutorial
    does); one ``pushpull`` per parameter pushes both gradients and pulls the
    new weights into both executors.

    With ``stock_updater``, MXNet's stock updater runs the same math instead:
    ``mx.optimizer.get_updater`` called with the lists of parameters on one
    context, ``kvstore.set_optimizer`` on two, as ``Module``, ``FeedForward``
    and mxoid use it.
    """
    symbol = build_symbol(spec["model"])
    ctxs = contexts(spec["contexts"])
    batch_size = spec["batch_size"]
    slices = even_slices(batch_size, len(ctxs))
    names = param_names(symbol)
    shape = sample_shape(spec["model"])
    grad_req = {n: ("write" if n in names else "null") for n in symbol.list_arguments()}
    executors = []
    for ctx, slc in zip(ctxs, slices):
        rows = slc.stop - slc.start
        executor = symbol.simple_bind(
            ctx, grad_req=grad_req, data=(rows,) + shape, softmax_label=(rows,)
        )
        for name in names:
            executor.arg_dict[name][:] = init[name]
        executors.append(executor)
    weights = [[e.arg_dict[n] for n in names] for e in executors]
    grads = [[e.grad_dict[n] for n in names] for e in executors]
    data_targets = [e.arg_dict["data"] for e in executors]
    label_targets = [e.arg_dict["softmax_label"] for e in executors]
    optimizer_name, params = optimizer_of(spec)
    rescale = 1.0 / batch_size
    wds = [params["wd"] if n.endswith(("_weight", "_gamma")) else 0.0 for n in names]
    new_state, step = fused_step(spec.get("optimizer", "momentum"), rescale)

    def stock_optimizer():
        return mx.optimizer.create(
            optimizer_name,
            sym=symbol,
            param_idx2name=dict(enumerate(names)),
            rescale_grad=rescale,
            **params,
        )

    kvstore = None
    t = 0  # updates so far (every parameter is updated at every step)
    if len(ctxs) == 1:
        if stock_updater:
            updater = mx.optimizer.get_updater(stock_optimizer())
            indices = list(range(len(names)))
            device_weights, device_grads = weights[0], grads[0]
        else:
            steps = [(w, g, new_state(w), wd) for w, g, wd in zip(weights[0], grads[0], wds)]
    else:
        kvstore = mx.kv.create("local")
        for i in range(len(names)):
            kvstore.init(i, weights[0][i])
        if stock_updater:
            kvstore.set_optimizer(stock_optimizer())
        else:
            states, counts = {}, {}

            def kvstore_updater(key, grad, weight):
                if key not in states:
                    states[key], counts[key] = new_state(weight), 0
                counts[key] += 1
                step(weight, grad, states[key], wds[key], counts[key])

            kvstore._set_updater(kvstore_updater)
        pushpulls = [
            (i, [g[i] for g in grads], [w[i] for w in weights], -i) for i in range(len(names))
        ]
    for _ in range(spec["epochs"]):
        train_iter.reset()
        for batch in train_iter:
            if kvstore is None:
                batch.data[0].copyto(data_targets[0])
                batch.label[0].copyto(label_targets[0])
            else:
                data, label = batch.data[0], batch.label[0]
                for slc, data_target, label_target in zip(slices, data_targets, label_targets):
                    data[slc].copyto(data_target)
                    label[slc].copyto(label_target)
            for executor in executors:
                executor.forward(is_train=True)
            for executor in executors:
                executor.backward()
            if kvstore is not None:
                for key, device_grads, device_weights, priority in pushpulls:
                    kvstore.pushpull(key, device_grads, out=device_weights, priority=priority)
            elif stock_updater:
                updater(indices, device_grads, device_weights)
            else:
                t += 1
                for weight, grad, state, wd in steps:
                    step(weight, grad, state, wd, t)
        clock.tick()
    return {n: w.asnumpy() for n, w in zip(names, weights[0])}


def hand_stock_updater(spec, train_iter, init, clock):
    return hand_loop(spec, train_iter, init, clock, stock_updater=True)


def module_fit(spec, train_iter, init, clock, metric):
    """``mx.mod.Module.fit`` with kvstore ``'local'`` (MXNet's defaults otherwise)."""
    module = mx.mod.Module(
        build_symbol(spec["model"]), context=contexts(spec["contexts"]), logger=_quiet_logger()
    )
    optimizer, params = optimizer_of(spec)
    module.fit(
        train_iter,
        num_epoch=spec["epochs"],
        optimizer=optimizer,
        optimizer_params=params,
        arg_params={k: mx.nd.array(v) for k, v in init.items()},
        kvstore="local",
        eval_metric=metric,
        epoch_end_callback=clock.tick,
    )
    return {k: v.asnumpy() for k, v in module.get_params()[0].items()}


def module_fit_accuracy(spec, train_iter, init, clock):
    return module_fit(spec, train_iter, init, clock, "acc")


def module_fit_no_metric(spec, train_iter, init, clock):
    return module_fit(spec, train_iter, init, clock, mx.metric.CompositeEvalMetric())


def feedforward_fit(spec, train_iter, init, clock):
    """The legacy ``mx.model.FeedForward.fit``, accuracy metric (its default)."""
    import warnings

    optimizer, params = optimizer_of(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        model = mx.model.FeedForward(
            build_symbol(spec["model"]),
            ctx=contexts(spec["contexts"]),
            num_epoch=spec["epochs"],
            optimizer=optimizer,
            arg_params={k: mx.nd.array(v) for k, v in init.items()},
            aux_params={},
            **params,
        )
        model.fit(
            train_iter,
            eval_metric="acc",
            epoch_end_callback=clock.tick,
            kvstore="local",
            logger=_quiet_logger(),
        )
    return {k: v.asnumpy() for k, v in model.arg_params.items()}


def gluon_trainer(spec, train_iter, init, clock):
    """A hybridized Gluon net and ``gluon.Trainer``, accuracy metric updated every batch.

    ``hybridize(static_alloc=True, static_shape=True)`` on the net and the loss,
    ``split_and_load`` over the contexts, ``Trainer`` with its default kvstore;
    biases get ``wd_mult = 0`` as symbols do.
    """
    from mxnet import autograd, gluon

    ctxs = contexts(spec["contexts"])
    net = gluon_net(spec["model"])
    net.initialize(ctx=ctxs)
    params = net.collect_params()
    for name, param in params.items():
        param.set_data(mx.nd.array(init[name]))
        if not name.endswith(("_weight", "_gamma")):
            param.wd_mult = 0.0
    net.hybridize(static_alloc=True, static_shape=True)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    loss_fn.hybridize(static_alloc=True, static_shape=True)
    trainer = gluon.Trainer(params, *optimizer_of(spec))
    metric = mx.metric.Accuracy()
    batch_size = spec["batch_size"]
    split_and_load = gluon.utils.split_and_load
    for _ in range(spec["epochs"]):
        train_iter.reset()
        metric.reset()
        for batch in train_iter:
            data = split_and_load(batch.data[0], ctxs)
            label = split_and_load(batch.label[0], ctxs)
            with autograd.record():
                outputs = [net(x) for x in data]
                losses = [loss_fn(out, y) for out, y in zip(outputs, label)]
            autograd.backward(losses)
            trainer.step(batch_size)
            metric.update(label, outputs)
        metric.get()
        clock.tick()
    return {name: param.data(ctxs[0]).asnumpy() for name, param in params.items()}


def _clock_extension(clock):
    from mxoid import Extension

    class EpochClockExtension(Extension):
        """Stamps the end of each epoch, after every other extension."""

        def after_epoch(self) -> None:
            clock.tick()

    return EpochClockExtension(name="benchmark_clock", priority=float("inf"))


def mxoid_loop(spec, train_iter, init, clock, extensions=()):
    from mxoid import FinishAfter, MainLoop

    optimizer, params = optimizer_of(spec)
    loop = MainLoop(
        build_symbol(spec["model"]),
        train_iter,
        contexts=contexts(spec["contexts"]),
        optimizer=optimizer,
        optimizer_params=params,
        arg_params={k: mx.nd.array(v) for k, v in init.items()},
        kvstore="local",
        extensions=[
            FinishAfter(after_n_epochs=spec["epochs"]),
            *extensions,
            _clock_extension(clock),
        ],
    )
    loop.run()
    return {k: v.asnumpy() for k, v in loop.get_params()[0].items()}


def mxoid_bare(spec, train_iter, init, clock):
    """mxoid's MainLoop with FinishAfter only (and the benchmark's epoch clock)."""
    return mxoid_loop(spec, train_iter, init, clock)


def find_everyday_extensions():
    """Return ``{name: class}`` of the everyday extensions mxoid has, and notes on the rest.

    Looked up by name in ``mxoid.extensions``; one that exists in its module
    but is not exported yet is used with a note, one that does not exist is
    skipped with a note.
    """
    import importlib

    import mxoid.extensions as package

    found, notes = {}, []
    for name in EVERYDAY_NAMES:
        cls = getattr(package, name, None)
        if cls is None:
            module_name = f"mxoid.extensions.{EVERYDAY_MODULES[name]}"
            try:
                cls = getattr(importlib.import_module(module_name), name, None)
            except ImportError:
                cls = None
            if cls is not None:
                notes.append(f"{name} taken from {module_name} (not exported by mxoid.extensions)")
        if cls is None:
            notes.append(f"{name} missing: not in mxoid.extensions")
        else:
            found[name] = cls
    return found, notes


def build_everyday(name: str, cls: type, workdir: str, tag: str = ""):
    """One everyday extension, configured as a user would configure it."""
    if name == "TrainingMonitoring":
        return cls(["acc", "ce"])
    if name == "ProgressBar":
        # A user's bar is drawn on a terminal; a worker's output is a file, where
        # the bar would stay quiet, so it is forced on and drawn into /dev/null.
        return cls(disable=False, file=open(os.devnull, "w"))
    if name == "JSONLinesLog":
        return cls(os.path.join(workdir, f"log{tag}.jsonl"))
    return cls()


def everyday_extensions(workdir: str, tag: str = ""):
    """The everyday extensions mxoid has today; returns (extensions, notes)."""
    found, notes = find_everyday_extensions()
    extensions = []
    for name, cls in found.items():
        try:
            extensions.append(build_everyday(name, cls, workdir, tag))
        except Exception as error:  # an API still changing: report, do not crash the run
            notes.append(
                f"{name} skipped: its constructor failed ({type(error).__name__}: {error})"
            )
    return extensions, notes


def mxoid_everyday(spec, train_iter, init, clock):
    """mxoid's MainLoop with the everyday extensions that exist today."""
    extensions, notes = everyday_extensions(spec["workdir"])
    spec["notes"].extend(notes)
    spec["notes"].append("extensions: " + ", ".join(type(e).__name__ for e in extensions))
    return mxoid_loop(spec, train_iter, init, clock, extensions)


CONTENDERS = {
    "hand": (
        hand_loop,
        "hand-written simple_bind loop, the cell's fused kernel per parameter "
        "(on the kvstore with two contexts)",
    ),
    "hand_stock_updater": (hand_stock_updater, "hand-written loop, MXNet's stock updater"),
    "module_fit_acc": (module_fit_accuracy, "Module.fit, accuracy metric"),
    "module_fit_nometric": (module_fit_no_metric, "Module.fit, empty CompositeEvalMetric"),
    "feedforward": (feedforward_fit, "FeedForward.fit, accuracy metric"),
    "gluon": (gluon_trainer, "Gluon hybridized + Trainer, accuracy metric"),
    "mxoid_bare": (mxoid_bare, "mxoid MainLoop, FinishAfter only"),
    "mxoid_everyday": (mxoid_everyday, "mxoid MainLoop, everyday extensions"),
    "hand_twin": (
        hand_loop,
        "the hand loop again: two contenders doing the same work, the design's noise floor",
    ),
}
"""Name -> (training function, one-line description)."""

EQUAL_TO_HAND = (
    "hand_twin",
    "hand_stock_updater",
    "module_fit_acc",
    "module_fit_nometric",
    "feedforward",
    "mxoid_bare",
    "mxoid_everyday",
)
"""Contenders that compute exactly what the hand loop computes (same graph, same
update order, same data order), so their final parameters must match it."""


def _quiet_logger() -> logging.Logger:
    logger = logging.getLogger("mxoid_benchmark_quiet")
    logger.setLevel(logging.WARNING)
    return logger


# --------------------------------------------------------------------- worker
def _rss_kib() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _reset_peak_rss() -> bool:
    """Make the current resident memory the process's peak (Linux 4.0 and later).

    Writing 5 to ``/proc/self/clear_refs`` resets ``VmHWM``, so the peak read
    after training is training's, not that of making the data set before it
    (``ru_maxrss`` holds the process's whole life). False where refused.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return _peak_rss_kib() is not None


def _peak_rss_kib() -> Optional[int]:
    """``VmHWM`` of ``/proc/self/status`` in KiB (None where absent)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def run_worker(spec_path: str) -> None:
    """Train one contender as ``spec_path`` describes; write ``result.json`` and ``params.npz``.

    A spec naming several ``contenders`` trains them in turns in this process
    (:func:`interleave.run_interleaved_worker`).
    """
    with open(spec_path) as f:
        spec = json.load(f)
    if "contenders" in spec:
        import interleave

        interleave.run_interleaved_worker(spec_path)
        return
    spec["notes"] = []
    function = CONTENDERS[spec["contender"]][0]
    X, y = make_data(spec["model"], spec["samples"])
    train_iter = mx.io.NDArrayIter(
        X, y, batch_size=spec["batch_size"], shuffle=False, label_name="softmax_label"
    )
    del X, y
    init = initial_params(spec["model"])
    rss_before = _rss_kib()
    training_peak = _reset_peak_rss()
    if not training_peak:
        spec["notes"].append(
            "peak memory: the process's whole life (ru_maxrss; /proc/self/clear_refs refused)"
        )
    clock = EpochClock()
    clock.tick()
    params = function(spec, train_iter, init, clock)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    peak_kib = (_peak_rss_kib() if training_peak else None) or usage.ru_maxrss
    finite = bool(all(np.isfinite(v).all() for v in params.values()))
    np.savez(os.path.join(spec["workdir"], "params.npz"), **params)
    result = {
        "epoch_stamps": clock.stamps,
        "epoch_cpu_stamps": clock.cpu_stamps,
        "epoch_thread_stamps": clock.thread_stamps,
        "peak_rss_kib": peak_kib,
        "rss_before_training_kib": rss_before,
        "finite": finite,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "notes": spec["notes"],
        "mxnet": mx.__version__,
    }
    with open(os.path.join(spec["workdir"], "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: contenders.py SPEC.json (run.py starts the workers)")
    run_worker(sys.argv[1])
