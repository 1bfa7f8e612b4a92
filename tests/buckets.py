"""Helpers of the bucketing tests: MXNet's LSTM language model per bucket, and its data.

The network is ``example/rnn/bucketing/lstm_bucketing.py``'s (an embedding, a
``SequentialRNNCell`` of ``LSTMCell`` unrolled per bucket length, one softmax
over the vocabulary per token), small; the data are sentences of random tokens
(1 to ``VOCAB - 1``; 0 is the padding label) drawn with a fixed seed.
"""

import logging
import random

import mxnet as mx
import numpy as np

VOCAB, HIDDEN, EMBED = 20, 16, 8
BUCKETS = [4, 8, 12]
BATCH = 8
OPTIMIZER_PARAMS = {"learning_rate": 0.5, "momentum": 0.9}


def sym_gen_of(hidden=HIDDEN, vocab=VOCAB):
    """A fresh ``sym_gen(seq_len) -> (symbol, data_names, label_names)``."""
    stack = mx.rnn.SequentialRNNCell()
    stack.add(mx.rnn.LSTMCell(num_hidden=hidden, prefix="lstm_l0_"))

    def sym_gen(seq_len):
        data, label = mx.sym.Variable("data"), mx.sym.Variable("softmax_label")
        embed = mx.sym.Embedding(data=data, input_dim=vocab, output_dim=EMBED, name="embed")
        stack.reset()
        outputs, _ = stack.unroll(seq_len, inputs=embed, merge_outputs=True)
        pred = mx.sym.FullyConnected(
            mx.sym.Reshape(outputs, shape=(-1, hidden)), num_hidden=vocab, name="pred"
        )
        label = mx.sym.Reshape(label, shape=(-1,))
        return (
            mx.sym.SoftmaxOutput(data=pred, label=label, name="softmax"),
            ("data",),
            ("softmax_label",),
        )

    return sym_gen


def sentences(n=120, seed=0, longest=12):
    rng = np.random.RandomState(seed)
    return [list(rng.randint(1, VOCAB, size=rng.randint(3, longest + 1))) for _ in range(n)]


def bucket_iter(seed=1, n=120, batch_size=BATCH, buckets=None, data_seed=0):
    """A BucketSentenceIter built with NumPy's and Python's generators seeded (it shuffles)."""
    np.random.seed(seed)
    random.seed(seed)
    return mx.rnn.BucketSentenceIter(
        sentences(n, data_seed), batch_size, buckets=list(buckets or BUCKETS), invalid_label=0
    )


def initial_params(sym_gen, seed=3):
    symbol, _, _ = sym_gen(max(BUCKETS))
    shapes, _, _ = symbol.infer_shape(
        data=(BATCH, max(BUCKETS)), softmax_label=(BATCH, max(BUCKETS))
    )
    rng = np.random.RandomState(seed)
    return {
        name: mx.nd.array(rng.uniform(-0.1, 0.1, shape))
        for name, shape in zip(symbol.list_arguments(), shapes)
        if name not in ("data", "softmax_label")
    }


def bucketing_module_fit(contexts, epochs, train, **fit):
    """BucketingModule.fit on the same network and initial parameters; its parameters."""
    sym_gen = sym_gen_of()
    module = mx.mod.BucketingModule(
        sym_gen,
        default_bucket_key=train.default_bucket_key,
        context=contexts,
        logger=logging.getLogger("quiet"),
    )
    module.fit(
        train,
        num_epoch=epochs,
        optimizer="sgd",
        optimizer_params=dict(OPTIMIZER_PARAMS),
        arg_params=initial_params(sym_gen),
        **fit,
    )
    mx.nd.waitall()
    return {name: value.asnumpy() for name, value in module.get_params()[0].items()}


class Replay(mx.io.DataIter):
    """The batches of one pass over ``iterator``, the same ones every pass (``reset`` rewinds).

    A BucketSentenceIter leaves out each bucket's last partial batch, and which
    sentences those are depends on its shuffle: two passes over it see other
    sentences. Comparisons read one pass, replayed.
    """

    def __init__(self, iterator):
        super().__init__(iterator.batch_size)
        iterator.reset()
        self.batches = list(iterator)
        self.provide_data, self.provide_label = iterator.provide_data, iterator.provide_label
        self.default_bucket_key = iterator.default_bucket_key

    def __iter__(self):
        return iter(self.batches)

    def reset(self):
        pass


def token_batches(batch_size, n=32, length=8, seed=0):
    """Batches of bucket ``length`` (not the default bucket) in a fixed order."""
    rng = np.random.RandomState(seed)
    tokens = rng.randint(1, 20, size=(n, length)).astype("float32")
    labels = np.concatenate([tokens[:, 1:], np.zeros((n, 1), "float32")], axis=1)
    return [
        mx.io.DataBatch(
            [mx.nd.array(tokens[i : i + batch_size])],
            [mx.nd.array(labels[i : i + batch_size])],
            pad=0,
            bucket_key=length,
            provide_data=[mx.io.DataDesc("data", (batch_size, length))],
            provide_label=[mx.io.DataDesc("softmax_label", (batch_size, length))],
        )
        for i in range(0, n, batch_size)
    ]


class Batches(mx.io.DataIter):
    """Given batches, the same each epoch; the default bucket is the longest (12)."""

    default_bucket_key = max(BUCKETS)

    def __init__(self, batches):
        size = batches[0].data[0].shape[0]
        super().__init__(size)
        self.batches = batches
        self.provide_data = [mx.io.DataDesc("data", (size, max(BUCKETS)))]
        self.provide_label = [mx.io.DataDesc("softmax_label", (size, max(BUCKETS)))]

    def __iter__(self):
        return iter(self.batches)

    def reset(self):
        pass


class PairKeyIter(mx.io.DataIter):
    """A BucketSentenceIter whose bucket keys are pairs, as Sockeye's (source, target): a
    wrapper without state_dict, replayed on resumption."""

    resets_are_deterministic = True  # its shuffle draws from the generators resumption restores

    def __init__(self, iterator):
        super().__init__(iterator.batch_size)
        self.iterator = iterator
        self.provide_data, self.provide_label = iterator.provide_data, iterator.provide_label
        self.default_bucket_key = (iterator.default_bucket_key,) * 2

    def reset(self):
        self.iterator.reset()

    def next(self):
        batch = self.iterator.next()
        batch.bucket_key = (batch.bucket_key,) * 2
        return batch
