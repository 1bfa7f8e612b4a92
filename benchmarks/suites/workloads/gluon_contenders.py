"""The gluon workload's contenders: ``f(spec, iterator, init, clock)`` each (:mod:`harness.worker`).

Every contender trains the same Gluon block (:func:`block`: the cell's network of
:mod:`suites.workloads.gluon_models`, its values set from
:func:`gluon_models.initial_values`, biases without weight decay as symbols have
them) with ``SoftmaxCrossEntropyLoss``, the cell's optimizer (momentum SGD, the loop
suite's rate) and ``trainer.step(rows)``'s scale, on the same data in the same
order; on two contexts each device takes half of each batch. The reference is the
hand-written Gluon loop (:data:`REFERENCE`); the symbol workload's Gluon contender is
the same loop with an accuracy metric. In the ``jitter`` cell the ``DataLoader``
contenders read the digits through a per-sample NumPy jitter (:func:`gluon_models.jitter`),
mxoid's loaders seeded alike (``DataLoaderIter(seed=0)``).

With ``GLUON_SUITE_VALIDATE=1`` in the environment (the suite's ``--check``), the
estimator and ``mxoid_gluon`` also evaluate a validation set after every epoch (the
estimator's ``val_data``, mxoid's ``Evaluate``) and write what they measured to
``validation.json`` in their folder, for the suite to compare.
"""

import json
import multiprocessing
import os

import mxnet as mx
import numpy as np
from harness.workload import clock_extension, contexts, everyday
from mxnet import autograd, gluon

from suites.workloads import gluon_models
from suites.workloads.symbol_contenders import optimizer_of

__all__ = ["CONTENDERS", "REFERENCE", "prepare"]

REFERENCE = "gluon_hybrid"  # harness.contest compares every contender with it
VALIDATE_ENV = "GLUON_SUITE_VALIDATE"
VALIDATION_SAMPLES = 200  # not a multiple of 32 or 128: a short last batch, padded or kept
VALIDATION_FILE = "validation.json"
LOADER_WORKERS = {"": 0, "_w2": 2}  # the DataLoader contenders: suffix -> num_workers
HAND_LOADER = ("gluon_hybrid_loader", "gluon_hybrid_acc_loader")  # the hand loops on a loader
# mxoid_gluon's TrainingMonitoring: the block's accuracy and the loss; the symbol
# workload's ['acc', 'ce'] would take the block's raw scores for probabilities (mxoid
# records train_ce as nan)
MONITORED = {"output": "acc", "loss": "loss"}
LOADERS: dict = {}  # contender -> its DataLoader or DataLoaderIter, built by prepare()


def prepare(spec: dict):
    """The cell's data, labels and initial parameters (:mod:`suites.workloads.gluon_models`),
    and the DataLoaders of the contenders reading one (:data:`LOADERS`): built here, in the
    worker's main thread, since a DataLoader with workers sets a signal handler when built
    (it refuses any other thread), and forks its workers before the contenders' threads
    start."""
    X, y = gluon_models.data(spec["model"], spec["samples"])
    init = gluon_models.initial_values(spec["model"])
    # A worker forked by the harness's fork server inherits its start method: its
    # DataLoaders' workers would start as fresh processes from the server (seconds
    # each, every object pickled). A script of a Gluon user forks them (Linux's default).
    multiprocessing.set_start_method("fork", force=True)
    LOADERS.clear()
    for name in spec.get("contenders") or [spec["contender"]]:
        for suffix, workers in LOADER_WORKERS.items():
            if name in (f"{hand}{suffix}" for hand in HAND_LOADER):
                LOADERS[name] = data_loader(spec, X, y, workers)
            elif name == f"mxoid_gluon_loader{suffix}":
                from mxoid.data import DataLoaderIter

                loader = data_loader(spec, X, y, workers)
                names = dict(data_names=("data",), label_names=("label",))
                LOADERS[name] = DataLoaderIter(loader, seed=0, **names)
    return X, y, init


def block(spec: dict, init: dict, ctxs=None, hybridize: bool = True) -> gluon.HybridBlock:
    """The cell's network as a Gluon HybridSequential, on ``ctxs`` (the default context
    if None), its values ``init``; hybridized (``static_alloc``, ``static_shape``)."""
    net = gluon_models.gluon_net(spec["model"])
    net.initialize(ctx=ctxs)
    gluon_models.finish_initialization(net, spec["model"], (ctxs or [None])[0])
    for name, param in net.collect_params().items():
        param.set_data(mx.nd.array(init[name]))
        if not name.endswith(("_weight", "_gamma")):
            param.wd_mult = 0.0  # as MXNet's optimizers treat a symbol's biases
    if hybridize:
        net.hybridize(static_alloc=True, static_shape=True)
    return net


def values(net: gluon.HybridBlock, ctx=None) -> dict:
    """The block's parameters as NumPy arrays (those of ``ctx``, or its first context)."""
    return {name: p.data(ctx).asnumpy() for name, p in net.collect_params().items()}


def loss_block(hybridize: bool = True) -> gluon.HybridBlock:
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    if hybridize:
        loss.hybridize(static_alloc=True, static_shape=True)
    return loss


def arrays(train_iter) -> tuple:
    """The training data and labels as NumPy arrays (from the worker's shared NDArrays)."""
    return train_iter.data[0][1].asnumpy(), train_iter.label[0][1].asnumpy()


def data_loader(spec: dict, X, y, num_workers: int = 0) -> gluon.data.DataLoader:
    """A DataLoader over the cell's data as Gluon users build one: an ``ArrayDataset`` of
    NumPy arrays (in the ``jitter`` cell transformed by :func:`gluon_models.jitter`), in
    order (``shuffle=False``), the cell's batch size (a short last batch kept)."""
    dataset = gluon.data.ArrayDataset(X, y)
    if spec["model"] == "jitter":
        dataset = dataset.transform_first(gluon_models.jitter)
    options = dict(batch_size=spec["batch_size"], shuffle=False, num_workers=num_workers)
    return gluon.data.DataLoader(dataset, **options)


def validating() -> bool:
    return os.environ.get(VALIDATE_ENV) == "1"


def validation_arrays(train_iter) -> tuple:
    """The validation set: the first :data:`VALIDATION_SAMPLES` training samples (the
    check compares two evaluations of one network, not how well it generalizes)."""
    X, y = arrays(train_iter)
    return X[:VALIDATION_SAMPLES], y[:VALIDATION_SAMPLES]


def write_validation(spec: dict, epochs: list) -> None:
    """``validation.json``: the cell, and per epoch ``{'accuracy', 'loss', 'samples'}``."""
    cell = {k: spec[k] for k in ("model", "batch_size", "contexts", "repeat") if k in spec}
    with open(os.path.join(spec["workdir"], VALIDATION_FILE), "w") as f:
        json.dump({"contender": spec["contender"], **cell, "epochs": epochs}, f)


# ------------------------------------------------------------------- Gluon by hand
def gluon_loop(spec, train_iter, init, clock, metric: bool = False, loader=None):
    """The hand-written Gluon loop: a hybridized net and loss, ``split_and_load``,
    ``autograd.record()``, ``backward``, ``trainer.step(x.shape[0])`` (``gluon.Trainer``
    with its default kvstore). ``metric``: ``mx.metric.Accuracy`` updated every batch,
    as Gluon users do (it reads the outputs back: the host waits for every batch).
    ``loader``: read this ``DataLoader`` instead of the iterator. A network with
    BatchNorm on several contexts: the Trainer's kvstore set up before training (its
    first step would copy device 0's running statistics over the others'), and the
    devices' running statistics averaged at the end, as mxoid and ``Module.fit`` average
    them at each epoch's end (the same: every device moves them as often)."""
    ctxs = contexts(spec["contexts"])
    net, loss_fn = block(spec, init, ctxs), loss_block()
    trainer = gluon.Trainer(net.collect_params(), *optimizer_of(spec))
    running = [p for name, p in net.collect_params().items() if "running_" in name]
    if running and len(ctxs) > 1:
        trainer._init_kvstore()
        trainer._init_params()
    accuracy = mx.metric.Accuracy()
    split_and_load = gluon.utils.split_and_load
    for _ in range(spec["epochs"]):
        if loader is None:
            train_iter.reset()
            batches = ((batch.data[0], batch.label[0]) for batch in train_iter)
        else:
            batches = loader
        for x, y in batches:
            data, label = split_and_load(x, ctxs), split_and_load(y, ctxs)
            with autograd.record():
                outputs = [net(part) for part in data]
                losses = [loss_fn(out, target) for out, target in zip(outputs, label)]
            autograd.backward(losses)
            trainer.step(x.shape[0])
            if metric:
                accuracy.update(label, outputs)
        if metric:
            accuracy.get()
            accuracy.reset()
        clock.tick()
    found = values(net, ctxs[0])
    for param in running if len(ctxs) > 1 else ():
        found[param.name] = np.mean([param.data(c).asnumpy() for c in ctxs], axis=0)
    return found


# ----------------------------------------------------------------------- mxoid
class _ValidationRecords:
    """An mxoid extension reading the Evaluate's records after every epoch (``samples``:
    the validation set's, all of which Evaluate counts)."""

    def __new__(cls, epochs: list, samples: int):
        from mxoid import Extension

        class ValidationRecords(Extension):
            def after_epoch(self) -> None:
                log = self.main_loop.log
                entry = {k: float(log.last(f"valid_{k}")) for k in ("accuracy", "loss")}
                epochs.append({**entry, "samples": samples})

        return ValidationRecords(name="benchmark_validation", priority=1e9)


def mxoid_gluon(spec, train_iter, init, clock, extensions: bool = True, loader=None):
    """``mxoid.MainLoop(net, train_iter, loss=...)``: the block (not hybridized; mxoid
    traces it), ``FinishAfter``, the everyday extensions unless ``extensions`` is False.
    ``loader``: read this ``DataLoaderIter`` (over a ``DataLoader``) instead."""
    from mxoid import Evaluate, FinishAfter, MainLoop

    net = block(spec, init, hybridize=False)
    made = [FinishAfter(after_n_epochs=spec["epochs"])]
    if extensions:
        made += everyday(spec, MONITORED)
    validation = []
    if validating() and extensions and loader is None:
        X, y = validation_arrays(train_iter)
        valid = mx.io.NDArrayIter(X, y, spec["batch_size"], label_name="softmax_label")
        metrics = {"output": "acc", "loss": "loss"}
        made += [Evaluate({"valid": valid}, metrics), _ValidationRecords(validation, len(y))]
    optimizer, params = optimizer_of(spec)
    loop = MainLoop(
        net,
        train_iter if loader is None else loader,
        loss=loss_block(hybridize=False),
        contexts=contexts(spec["contexts"]),
        optimizer=optimizer,
        optimizer_params=params,
        extensions=made + [clock_extension(clock)],
    )
    loop.run()
    if validation:
        write_validation(spec, validation)
    return values(net)


# ------------------------------------------------------------------- estimator
def estimator(spec, train_iter, init, clock):
    """``gluon.contrib.estimator.Estimator(net, loss, train_metrics=Accuracy(),
    trainer=..., context=...).fit(train_data=DataLoader, epochs=...)``: the hybridized
    net and loss, its default handlers (accuracy updated every batch, a log line an
    epoch); an epoch-end handler ticks the clock after all of them."""
    from mxnet.gluon.contrib.estimator import Estimator
    from mxnet.gluon.contrib.estimator.event_handler import EpochEnd

    class Clock(EpochEnd):
        priority = float("inf")  # after the estimator's own handlers

        def epoch_end(self, estimator, *args, **kwargs):
            clock.tick()

    class Validation(EpochEnd):
        priority = 0  # after the ValidationHandler (-1000)

        def __init__(self, epochs: list) -> None:
            self.epochs = epochs

        def epoch_end(self, estimator, *args, **kwargs):
            found = dict(metric.get() for metric in estimator.val_metrics)
            # float(): with NumPy 2 a metric's sums stay NumPy float32 scalars, which
            # json cannot write (a partial validation.json)
            entry = {k: float(found[f"validation {k}"]) for k in ("accuracy", "loss")}
            entry["samples"] = int(estimator.val_metrics[0].num_inst)
            self.epochs.append(entry)

    ctxs = contexts(spec["contexts"])
    net = block(spec, init, ctxs)
    trainer = gluon.Trainer(net.collect_params(), *optimizer_of(spec))
    val_metrics, val_data, handlers, validation = None, None, [Clock()], []
    if validating():
        X, y = validation_arrays(train_iter)
        dataset = gluon.data.ArrayDataset(X, y)
        val_data = gluon.data.DataLoader(dataset, batch_size=spec["batch_size"], shuffle=False)
        val_metrics = [mx.metric.Accuracy(), mx.metric.Loss()]
        handlers.insert(0, Validation(validation))
    loss = loss_block()
    trained = Estimator(
        net,
        loss,
        train_metrics=mx.metric.Accuracy(),
        val_metrics=val_metrics,
        trainer=trainer,
        context=ctxs,
    )
    loader = data_loader(spec, *arrays(train_iter))
    trained.fit(
        train_data=loader, val_data=val_data, epochs=spec["epochs"], event_handlers=handlers
    )
    if validation:
        write_validation(spec, validation)
    return values(net, ctxs[0])


CONTENDERS = {
    REFERENCE: gluon_loop,
    "gluon_hybrid_acc": lambda *a: gluon_loop(*a, metric=True),
    "mxoid_gluon": mxoid_gluon,
    "mxoid_gluon_bare": lambda *a: mxoid_gluon(*a, extensions=False),
    "estimator": estimator,
}
for _suffix in LOADER_WORKERS:
    for _name, _function in (
        ("gluon_hybrid_loader", gluon_loop),
        ("gluon_hybrid_acc_loader", lambda *a, **k: gluon_loop(*a, metric=True, **k)),
        ("mxoid_gluon_loader", mxoid_gluon),
    ):
        _name += _suffix
        CONTENDERS[_name] = lambda *a, f=_function, n=_name: f(*a, loader=LOADERS[n])
