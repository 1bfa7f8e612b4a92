"""The symbol workload's contenders: ``f(spec, iterator, init, clock)`` (:mod:`harness.worker`).

All run the cell's optimizer (:data:`OPTIMIZERS`), weight decay on ``*_weight`` and
``*_gamma`` only, ``rescale_grad = 1 / batch``; on two contexts the batch is halved.
"""

import functools
import logging
import math
import warnings

import mxnet as mx
from harness.workload import (
    build_symbol,
    clock_extension,
    contexts,
    everyday,
    initial_params,
    make_data,
    param_names,
)

# A cell's optimizer: name -> (MXNet optimizer, its parameters, the hand loop's kernel).
OPTIMIZERS = {
    "momentum": ("sgd", {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4}, "sgd_mom_update"),
    "sgd": ("sgd", {"learning_rate": 0.05, "wd": 1e-4}, "sgd_update"),
    "adam": ("adam", {"learning_rate": 0.001, "wd": 1e-4}, "adam_update"),
}
ADAM_BETAS, ADAM_EPSILON = (0.9, 0.999), 1e-8  # MXNet's Adam defaults


def prepare(spec: dict):
    """The cell's data, labels and initial parameters (NumPy; fixed seeds)."""
    X, y = make_data(spec["model"], spec["samples"])
    return X, y, initial_params(spec["model"])


def optimizer_of(spec: dict):
    """The cell's ``(MXNet optimizer name, its parameters)``; momentum SGD by default."""
    name, params, _ = OPTIMIZERS[spec.get("optimizer", "momentum")]
    return name, dict(params)


def fused_step(optimizer: str, rescale: float):
    """``(new_state, step)``: ``step(weight, grad, state, wd, t)`` runs the optimizer's
    fused kernel on one parameter, in place, at MXNet's rate for its ``t``-th update
    (Adam's bias correction as ``Adam.update`` computes it)."""
    _, params, kernel_name = OPTIMIZERS[optimizer]
    kernel, lr = getattr(mx.nd, kernel_name), params["learning_rate"]

    def zeros(weight):
        return mx.nd.zeros(weight.shape, ctx=weight.context)

    if optimizer == "momentum":
        mom = params["momentum"]

        def step(w, g, state, wd, t):
            kernel(w, g, state, out=w, lr=lr, momentum=mom, wd=wd, rescale_grad=rescale)

        return zeros, step
    if optimizer == "sgd":

        def step(w, g, state, wd, t):
            kernel(w, g, out=w, lr=lr, wd=wd, rescale_grad=rescale)

        return (lambda weight: None), step
    (b1, b2), eps, rs = ADAM_BETAS, ADAM_EPSILON, rescale

    def step(w, g, state, wd, t):
        rate = lr * (math.sqrt(1.0 - b2**t) / (1.0 - b1**t))
        kernel(
            w, g, *state, out=w, lr=rate, wd=wd, beta1=b1, beta2=b2, epsilon=eps, rescale_grad=rs
        )

    return (lambda weight: (zeros(weight), zeros(weight))), step


def hand_loop(spec, train_iter, init, clock, stock_updater: bool = False, symbol=None):
    """The floor: ``simple_bind`` executors (one per context, each bound on its slice of
    the batch), ``copyto``, forward, backward, and the update of :func:`_update_step`.
    ``symbol``: another network than the cell's model (its sample shape: the data's)."""
    symbol = build_symbol(spec["model"]) if symbol is None else symbol
    ctxs, batch_size = contexts(spec["contexts"]), spec["batch_size"]
    step = batch_size // len(ctxs)
    slices = [slice(k * step, (k + 1) * step) for k in range(len(ctxs))]
    slices[-1] = slice(slices[-1].start, batch_size)  # the last takes what is left
    names, shape = param_names(symbol), train_iter.provide_data[0].shape[1:]
    grad_req = {n: ("write" if n in names else "null") for n in symbol.list_arguments()}
    executors = []
    for ctx, slc in zip(ctxs, slices):
        rows = slc.stop - slc.start
        shapes = dict(data=(rows,) + shape, softmax_label=(rows,))
        executor = symbol.simple_bind(ctx, grad_req=grad_req, **shapes)
        for name in names:
            executor.arg_dict[name][:] = init[name]
        executors.append(executor)
    weights = [[e.arg_dict[n] for n in names] for e in executors]
    grads = [[e.grad_dict[n] for n in names] for e in executors]
    update = _update_step(spec, symbol, names, weights, grads, stock_updater)
    targets = [(e.arg_dict["data"], e.arg_dict["softmax_label"]) for e in executors]
    for _ in range(spec["epochs"]):
        train_iter.reset()
        for batch in train_iter:
            if len(executors) == 1:
                batch.data[0].copyto(targets[0][0])
                batch.label[0].copyto(targets[0][1])
            else:
                data, label = batch.data[0], batch.label[0]
                for slc, (data_target, label_target) in zip(slices, targets):
                    data[slc].copyto(data_target)
                    label[slc].copyto(label_target)
            for executor in executors:
                executor.forward(is_train=True)
            for executor in executors:
                executor.backward()
            update()
        clock.tick()
    return {n: w.asnumpy() for n, w in zip(names, weights[0])}


def _update_step(spec, symbol, names, weights, grads, stock_updater: bool):
    """The hand loop's update of a step, as a function: one call of the fused kernel per
    parameter (:func:`fused_step`) on one context; on two a ``'local'`` kvstore sums the
    gradients and updates once with the same kernel (``_set_updater``), a ``pushpull`` per
    parameter. ``stock_updater``: MXNet's updater, as Module, FeedForward and mxoid use it."""
    optimizer_name, params = optimizer_of(spec)
    rescale = 1.0 / spec["batch_size"]
    wds = [params["wd"] if n.endswith(("_weight", "_gamma")) else 0.0 for n in names]
    new_state, step = fused_step(spec.get("optimizer", "momentum"), rescale)

    options = dict(sym=symbol, param_idx2name=dict(enumerate(names)), rescale_grad=rescale)
    stock = functools.partial(mx.optimizer.create, optimizer_name, **options, **params)

    if len(weights) == 1:
        if stock_updater:
            updater, indices = mx.optimizer.get_updater(stock()), list(range(len(names)))
            return lambda: updater(indices, grads[0], weights[0])
        steps = [(w, g, new_state(w), wd) for w, g, wd in zip(weights[0], grads[0], wds)]
        updates = [0]  # every parameter is updated at every step

        def fused():
            updates[0] += 1
            for weight, grad, state, wd in steps:
                step(weight, grad, state, wd, updates[0])

        return fused
    kvstore = mx.kv.create("local")
    for i in range(len(names)):
        kvstore.init(i, weights[0][i])
    if stock_updater:
        kvstore.set_optimizer(stock())
    else:
        states, counts = {}, {}

        def kvstore_updater(key, grad, weight):
            if key not in states:
                states[key], counts[key] = new_state(weight), 0
            counts[key] += 1
            step(weight, grad, states[key], wds[key], counts[key])

        kvstore._set_updater(kvstore_updater)
    pushpulls = [(i, [g[i] for g in grads], [w[i] for w in weights], -i) for i in range(len(names))]

    def pushpull():
        for key, device_grads, device_weights, priority in pushpulls:
            kvstore.pushpull(key, device_grads, out=device_weights, priority=priority)

    return pushpull


def _quiet_logger() -> logging.Logger:
    logging.getLogger("mxoid_benchmark_quiet").setLevel(logging.WARNING)
    return logging.getLogger("mxoid_benchmark_quiet")


def module_fit(spec, train_iter, init, clock, metric="acc"):
    """``mx.mod.Module.fit`` with kvstore ``'local'`` (MXNet's defaults otherwise)."""
    context, logger = contexts(spec["contexts"]), _quiet_logger()
    module = mx.mod.Module(build_symbol(spec["model"]), context=context, logger=logger)
    optimizer, params = optimizer_of(spec)
    arg_params = {k: mx.nd.array(v) for k, v in init.items()}
    options = dict(optimizer=optimizer, optimizer_params=params, arg_params=arg_params)
    options.update(kvstore="local", eval_metric=metric, epoch_end_callback=clock.tick)
    module.fit(train_iter, num_epoch=spec["epochs"], **options)
    return {k: v.asnumpy() for k, v in module.get_params()[0].items()}


def feedforward_fit(spec, train_iter, init, clock):
    """The legacy ``mx.model.FeedForward.fit``, accuracy metric (its default)."""
    optimizer, params = optimizer_of(spec)
    arg_params = {k: mx.nd.array(v) for k, v in init.items()}
    options = dict(num_epoch=spec["epochs"], optimizer=optimizer, arg_params=arg_params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx = contexts(spec["contexts"])
        model = mx.model.FeedForward(
            build_symbol(spec["model"]), ctx=ctx, aux_params={}, **options, **params
        )
        fit = dict(eval_metric="acc", epoch_end_callback=clock.tick, logger=_quiet_logger())
        model.fit(train_iter, kvstore="local", **fit)
    return {k: v.asnumpy() for k, v in model.arg_params.items()}


def gluon_loop(spec, train_iter, init, clock):
    """The gluon workload's hand-written hybridized Gluon loop (``split_and_load``,
    ``gluon.Trainer`` with its default kvstore, biases with ``wd_mult = 0`` as symbols
    have them), accuracy updated every batch."""
    from suites.workloads import gluon_contenders  # imports this module

    return gluon_contenders.gluon_loop(spec, train_iter, init, clock, metric=True)


def main_loop(spec, train_iter, init, clock, extensions=(), symbol=None):
    """mxoid's MainLoop with ``FinishAfter``, ``extensions`` and the epoch clock (not run)."""
    from mxoid import FinishAfter, MainLoop

    optimizer, params = optimizer_of(spec)
    arg_params = {k: mx.nd.array(v) for k, v in init.items()}
    options = dict(optimizer=optimizer, optimizer_params=params, arg_params=arg_params)
    stop = FinishAfter(after_n_epochs=spec["epochs"])
    options.update(kvstore="local", extensions=[stop, *extensions, clock_extension(clock)])
    symbol = build_symbol(spec["model"]) if symbol is None else symbol
    return MainLoop(symbol, train_iter, contexts=contexts(spec["contexts"]), **options)


def mxoid_loop(spec, train_iter, init, clock, extensions=(), symbol=None):
    """mxoid's MainLoop run: FinishAfter only, unless given ``extensions``."""
    loop = main_loop(spec, train_iter, init, clock, extensions, symbol)
    loop.run()
    return {k: v.asnumpy() for k, v in loop.get_params()[0].items()}


def mxoid_everyday(spec, train_iter, init, clock):
    """mxoid's MainLoop with the everyday extensions it has."""
    return mxoid_loop(spec, train_iter, init, clock, everyday(spec))


CONTENDERS = {
    "hand": hand_loop,
    "hand_twin": hand_loop,  # the hand loop again: the design's noise floor (A/A)
    "hand_stock_updater": lambda *a: hand_loop(*a, stock_updater=True),
    "module_fit_acc": module_fit,
    # an empty CompositeEvalMetric: its update does nothing, nothing is read back
    "module_fit_nometric": lambda *a: module_fit(*a, metric=mx.metric.CompositeEvalMetric()),
    "feedforward": feedforward_fit,
    "gluon": gluon_loop,
    "mxoid_bare": mxoid_loop,
    "mxoid_everyday": mxoid_everyday,
}
