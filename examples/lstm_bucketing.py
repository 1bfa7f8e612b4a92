"""MXNet's LSTM language model with bucketing, on English text Python itself ships.

``example/rnn/bucketing/lstm_bucketing.py`` trains on the Penn Treebank with
``BucketingModule.fit``; this trains the same network (an embedding, stacked
``LSTMCell`` s unrolled per bucket length, a softmax over the vocabulary at
every step) with ``MainLoop(sym_gen, ...)`` on the help texts of Python's
standard library (``pydoc_data.topics``, about 0.5 MB: nothing to download),
split by sentence into train, valid and test. Sentences go into buckets by
length (``mx.rnn.BucketSentenceIter``); each bucket's executors are bound on
first use and share the default bucket's parameters and memory. Evaluate
reports valid and test perplexity (padding never counts) after every epoch::

    pip install -e '.[examples]'
    python examples/lstm_bucketing.py                          # about a minute, 2 CPU cores
    python examples/lstm_bucketing.py --contexts cpu:0,cpu:1
    python examples/lstm_bucketing.py --help                   # the full settings

The last line compares the test perplexity with the unigram baseline (word
frequencies of the training sentences, no context), which the model beats
well within the default epochs.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import re
from typing import Dict, List, Optional, Sequence, Tuple

os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")  # MXNet's notice of its MKLDNN backend

import common  # noqa: E402,I100 (the examples' shared module, beside this script)
import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

from mxoid import (  # noqa: E402
    ClipGradientNorm,
    Evaluate,
    FinishAfter,
    MainLoop,
    Printing,
    TrainingMonitoring,
)

PAD, UNKNOWN = 0, 1  # the padding label (never counts), and words outside the vocabulary
PERPLEXITY = ("perplexity", {"ignore_label": PAD})


def sentences_of_python_help() -> List[List[str]]:
    """The sentences of Python's own help texts, as lists of lowercase words and marks."""
    from pydoc_data.topics import topics

    text = " ".join(topics[name] for name in sorted(topics)).lower()
    return [re.findall(r"[a-z]+|[0-9]+|[^\sa-z0-9]", s) for s in re.split(r"[.!?]\s+", text)]


def encode(
    sentences: List[List[str]], vocabulary: int, shortest: int, longest: int
) -> Tuple[List[List[int]], Dict[str, int]]:
    """Word ids (the most frequent words of the sentences; the rest UNKNOWN), per sentence."""
    kept = [s for s in sentences if shortest <= len(s) <= longest]
    counts = collections.Counter(word for s in kept for word in s)
    ids = {word: i + 2 for i, (word, _) in enumerate(counts.most_common(vocabulary - 2))}
    return [[ids.get(word, UNKNOWN) for word in s] for s in kept], ids


def split(encoded: List[List[int]], seed: int) -> Dict[str, List[List[int]]]:
    order = np.random.RandomState(seed).permutation(len(encoded))
    tenth = len(encoded) // 10
    parts = {"valid": order[:tenth], "test": order[tenth : 2 * tenth], "train": order[2 * tenth :]}
    return {name: [encoded[i] for i in index] for name, index in parts.items()}


def unigram_perplexity(train: List[List[int]], test: List[List[int]], vocabulary: int) -> float:
    """Perplexity of the next words of ``test`` under ``train``'s word frequencies (add-one)."""
    counts = np.ones(vocabulary)
    for sentence in train:
        np.add.at(counts, sentence[1:], 1)
    log_p = np.log(counts / counts.sum())
    predicted = [word for sentence in test for word in sentence[1:]]
    return math.exp(-np.mean(log_p[predicted]))


def sym_gen_of(vocabulary: int, hidden: int, embed: int, layers: int):
    """MXNet's ``sym_gen`` of lstm_bucketing.py: the network unrolled for a bucket length."""
    stack = mx.rnn.SequentialRNNCell()
    for layer in range(layers):
        stack.add(mx.rnn.LSTMCell(num_hidden=hidden, prefix=f"lstm_l{layer}_"))

    def sym_gen(seq_len: int):
        data, label = mx.sym.Variable("data"), mx.sym.Variable("softmax_label")
        embedded = mx.sym.Embedding(data, input_dim=vocabulary, output_dim=embed, name="embed")
        stack.reset()
        outputs, _ = stack.unroll(seq_len, inputs=embedded, merge_outputs=True)
        pred = mx.sym.FullyConnected(
            mx.sym.Reshape(outputs, shape=(-1, hidden)), num_hidden=vocabulary, name="pred"
        )
        label = mx.sym.Reshape(label, shape=(-1,))
        softmax = mx.sym.SoftmaxOutput(pred, label, name="softmax")
        return softmax, ("data",), ("softmax_label",)

    return sym_gen


def buckets_of(args: argparse.Namespace) -> List[int]:
    return [int(b) for b in args.buckets.split(",")]


def train(args: argparse.Namespace) -> Dict[str, float]:
    common.seed_everything(args.seed)
    encoded, _ = encode(sentences_of_python_help(), args.vocabulary, 3, max(buckets_of(args)))
    parts = split(encoded, args.seed)
    iterators = {
        name: mx.rnn.BucketSentenceIter(
            parts[name], args.batch_size, buckets=buckets_of(args), invalid_label=PAD
        )
        for name in ("valid", "test", "train")
    }
    sym_gen = sym_gen_of(args.vocabulary, args.num_hidden, args.num_embed, args.num_layers)
    loop = MainLoop(
        sym_gen,
        iterators["train"],
        contexts=common.parse_contexts(args.contexts),
        optimizer="adam",
        optimizer_params={"learning_rate": args.lr},
        initializer=mx.init.Xavier(factor_type="in", magnitude=2.34),
        extensions=[
            FinishAfter(after_n_epochs=args.epochs),
            TrainingMonitoring(mx.metric.Perplexity(PAD)),
            Evaluate({"valid": iterators["valid"], "test": iterators["test"]}, PERPLEXITY),
            ClipGradientNorm(args.clip),
            Printing(),
        ],
    ).run()
    baseline = unigram_perplexity(parts["train"], parts["test"], args.vocabulary)
    test = loop.log.last("test_perplexity")
    print(f"test perplexity {test:.1f}; the unigram baseline {baseline:.1f}", flush=True)
    return {"test_perplexity": test, "unigram_perplexity": baseline}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", default="cpu:0", help="e.g. cpu:0,cpu:1")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--buckets", default="10,20,30,40", help="sentence lengths")
    parser.add_argument("--vocabulary", type=int, default=2000, help="words kept, ids included")
    parser.add_argument("--num-hidden", type=int, default=128)
    parser.add_argument("--num-embed", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.005, help="Adam's learning rate")
    parser.add_argument("--clip", type=float, default=5.0, help="the gradients' global norm")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, float]:
    return train(parse_args(argv))


if __name__ == "__main__":
    main()
