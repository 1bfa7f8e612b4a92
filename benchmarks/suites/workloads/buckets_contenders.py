"""The buckets workload's contenders: ``f(spec, iterator, init, clock)`` (:mod:`harness.worker`).

Every contender trains MXNet's LSTM language model of ``examples/lstm_bucketing.py`` (its
``sym_gen_of``: an embedding, stacked ``LSTMCell`` s unrolled per bucket length, a
softmax over the vocabulary at every step; sizes :data:`suites.workloads.buckets.MODELS`) from the
same values, on the same sentences in the same order, with the loop suite's momentum SGD
(weight decay on ``*_weight`` only, ``rescale_grad = 1 / batch``; on two contexts each
takes half of each batch). The sentences (:func:`suites.workloads.buckets.make_sentences`) come as
the worker's shared arrays, padded rows and lengths; each contender reads them through a
``BucketSentenceIter`` of its own (:class:`SentenceIter`) over ``spec['buckets']``.
"""

import os
import random
import sys

import mxnet as mx
import numpy as np
from harness.env import ROOT
from harness.workload import PARAM_SEED, contexts, everyday

from suites.workloads import buckets, symbol_contenders
from suites.workloads.symbol_contenders import mxoid_loop, optimizer_of

sys.path.insert(0, os.path.join(ROOT, "examples"))
import lstm_bucketing  # noqa: E402 (the example's network, beside its shared module)

__all__ = ["CONTENDERS", "prepare"]

PAD = lstm_bucketing.PAD  # the padding label, which no metric counts
MONITORED = [lstm_bucketing.PERPLEXITY]  # mxoid_everyday's TrainingMonitoring: no padding


def prepare(spec: dict):
    """The sentences as padded rows and their lengths, and the initial parameters."""
    rows, lengths = buckets.make_sentences(spec["samples"], spec["model"])
    return rows, lengths, initial_params(spec)


def network(spec: dict):
    """The cell's ``sym_gen`` (a fresh one: its cells' symbols are its own)."""
    sizes = buckets.MODELS[spec["model"]]
    return lstm_bucketing.sym_gen_of(
        sizes["vocabulary"], sizes["hidden"], sizes["embed"], sizes["layers"]
    )


def initial_params(spec: dict) -> dict:
    """Uniform in [-0.1, 0.1], drawn in sorted name order with a fixed seed (NumPy)."""
    symbol, data_names, label_names = network(spec)(buckets.LONGEST)
    inputs = {name: (spec["batch_size"], buckets.LONGEST) for name in data_names + label_names}
    shapes = dict(zip(symbol.list_arguments(), symbol.infer_shape(**inputs)[0]))
    rng = np.random.RandomState(PARAM_SEED)
    return {
        name: rng.uniform(-0.1, 0.1, shapes[name]).astype(np.float32)
        for name in sorted(set(shapes) - set(inputs))
    }


class SentenceIter(mx.rnn.BucketSentenceIter):
    """MXNet's ``BucketSentenceIter``, its shuffles drawn from generators of its own.

    Its ``reset`` shuffles with Python's and NumPy's global generators; contenders in
    turns in one process reset theirs between each other's epochs, so each would see
    another order. This one swaps in its own states (seeded alike for every
    contender) around MXNet's ``reset`` and puts the global ones back: every
    contender that resets it as often sees the same batches in the same order.
    """

    def __init__(self, sentences, batch_size: int, bucket_keys, seed: int = buckets.DATA_SEED):
        self._states = (random.Random(seed).getstate(), np.random.RandomState(seed).get_state())
        super().__init__(sentences, batch_size, buckets=list(bucket_keys), invalid_label=PAD)

    def reset(self) -> None:
        saved = random.getstate(), np.random.get_state()
        random.setstate(self._states[0])
        np.random.set_state(self._states[1])
        try:
            super().reset()
        finally:
            self._states = random.getstate(), np.random.get_state()
            random.setstate(saved[0])
            np.random.set_state(saved[1])


def sentence_iter(spec: dict, train_iter) -> SentenceIter:
    """The contender's iterator over the worker's sentences (``spec['buckets']``)."""
    rows, lengths = train_iter.data[0][1].asnumpy(), train_iter.label[0][1].asnumpy()
    sentences = [row[: int(n)] for row, n in zip(rows, lengths)]
    keys = spec.get("buckets", buckets.BUCKETS)
    return SentenceIter(sentences, spec["batch_size"], keys)


# ------------------------------------------------------------------ the floor
def hand(spec, train_iter, init, clock):
    """The floor: what ``BucketingModule.switch_bucket`` binds, by hand. The longest
    bucket's executors first (``simple_bind``, one per context on its slice of the
    batch), every other bucket's on its first batch, sharing their parameters and
    gradients (``shared_arg_names``, ``shared_exec``) and memory (``shared_buffer``);
    ``copyto``, forward, backward, and the loop suite's update (the fused
    ``sgd_mom_update`` per parameter; on two contexts through a ``'local'`` kvstore).
    The iterator is reset at the start of every epoch but the first, as MainLoop does."""
    sym_gen, ctxs, data = network(spec), contexts(spec["contexts"]), sentence_iter(spec, train_iter)
    slices = mx.executor_manager._split_input_slice(spec["batch_size"], [1] * len(ctxs))
    pools, sets = [{} for _ in ctxs], {}

    def bind(key):
        symbol, data_names, label_names = sym_gen(key)
        inputs = list(data_names) + list(label_names)
        names = [n for n in symbol.list_arguments() if n not in inputs]
        requests = {n: ("null" if n in inputs else "write") for n in symbol.list_arguments()}
        shared = sets.get(data.default_bucket_key, (None, [None] * len(ctxs)))[1]
        executors = [
            symbol.simple_bind(
                ctx,
                grad_req=requests,
                shared_arg_names=names,
                shared_exec=shared[k],
                shared_buffer=pools[k],
                **{name: (part.stop - part.start, key) for name in inputs},
            )
            for k, (ctx, part) in enumerate(zip(ctxs, slices))
        ]
        targets = [
            [(executor.arg_dict[name], index, part) for index, name in enumerate(inputs)]
            for executor, part in zip(executors, slices)
        ]
        sets[key] = (targets, executors)
        return symbol, names, executors

    symbol, names, default = bind(data.default_bucket_key)
    for executor in default:
        for name in names:
            executor.arg_dict[name][:] = init[name]
    weights = [[e.arg_dict[n] for n in names] for e in default]
    grads = [[e.grad_dict[n] for n in names] for e in default]
    update = symbol_contenders._update_step(spec, symbol, names, weights, grads, False)
    for epoch in range(spec["epochs"]):
        if epoch:
            data.reset()
        for batch in data:
            if batch.bucket_key not in sets:
                bind(batch.bucket_key)
            targets, executors = sets[batch.bucket_key]
            arrays = list(batch.data) + list(batch.label)
            for executor, copies in zip(executors, targets):  # each context: its slice, its forward
                for target, index, part in copies:
                    arrays[index][part].copyto(target)
                executor.forward(is_train=True)
            for executor in executors:
                executor.backward()
            update()
        clock.tick()
    return dict(zip(names, (weight.asnumpy() for weight in weights[0])))


# ------------------------------------------------------------------ MXNet's own
def bucketing_fit(spec, train_iter, init, clock, metric=None):
    """``mx.mod.BucketingModule(sym_gen, default_bucket_key=...).fit`` with kvstore
    ``'local'``; ``metric``: MXNet's ``Perplexity(ignore_label=0)`` (its ``update`` reads a
    sum back every batch), or an empty ``CompositeEvalMetric`` (nothing read back)."""
    data = sentence_iter(spec, train_iter)
    module = mx.mod.BucketingModule(
        network(spec),
        default_bucket_key=data.default_bucket_key,
        context=contexts(spec["contexts"]),
        logger=symbol_contenders._quiet_logger(),
    )
    optimizer, optimizer_params = optimizer_of(spec)
    module.fit(
        data,
        eval_metric=metric or mx.metric.CompositeEvalMetric(),
        epoch_end_callback=clock.tick,
        kvstore="local",
        optimizer=optimizer,
        optimizer_params=optimizer_params,
        arg_params={name: mx.nd.array(value) for name, value in init.items()},
        num_epoch=spec["epochs"],
    )
    return {name: value.asnumpy() for name, value in module.get_params()[0].items()}


# ---------------------------------------------------------------------- mxoid
def mxoid(spec, train_iter, init, clock, extensions: bool = True):
    """``mxoid.MainLoop(sym_gen, iterator, ...)`` (the loop suite's settings, kvstore
    ``'local'``): ``FinishAfter``, and the everyday extensions unless ``extensions`` is False."""
    made = everyday(spec, MONITORED) if extensions else []
    data = sentence_iter(spec, train_iter)
    return mxoid_loop(spec, data, init, clock, made, symbol=network(spec))


CONTENDERS = {
    "hand": hand,
    "bucketing_fit_metric": lambda *a: bucketing_fit(*a, metric=mx.metric.Perplexity(PAD)),
    "bucketing_fit_nometric": bucketing_fit,
    "mxoid_bare": lambda *a: mxoid(*a, extensions=False),
    "mxoid_everyday": mxoid,
}
