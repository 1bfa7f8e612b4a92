"""Where an ``mx.rnn.BucketSentenceIter`` stands, so that training resumes it exactly.

Its ``reset()`` shuffles the list of its batches (``idx``, Python's global
generator) and, in place, each bucket's sentences (NumPy's global generator):
the shuffles pile up, epoch after epoch, so replaying resets from another
random state would not give the same order. :class:`SentencePosition` keeps,
instead, each bucket's order as a permutation of the order it had when training
started (a freshly built, identically seeded iterator has it again), learnt at
each reset from the same NumPy state the iterator drew from, and the batch
list and cursor as they are: a resumption puts all three back and rebuilds
the arrays the batches are cut from, as ``reset()`` builds them.

It also says how much of the data an epoch uses: the iterator silently leaves
out the last partial batch of each bucket (and, when it is built, the sentences
longer than its largest bucket: :func:`bucket_sentence_iter` counts those).

For evaluation, :class:`SentencesInOrder` reads the same iterator's own
per-bucket arrays instead of its batches: every sentence once, bucket by
bucket in a fixed order, each bucket's last partial batch padded as
``NDArrayIter`` pads; it never resets or shuffles the iterator.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Sequence

import mxnet as mx
import numpy as np

__all__ = [
    "SentencePosition",
    "SentencesInOrder",
    "bucket_sentence_iter",
    "is_bucket_sentence_iter",
    "sentences_per_epoch",
]

TOO_LONG = "sentences_too_long"
"""The attribute :func:`bucket_sentence_iter` sets: how many sentences the iterator left out
when it was built, for being longer than its largest bucket."""


def is_bucket_sentence_iter(iterator: Any) -> bool:
    """Return whether ``iterator`` is MXNet's ``mx.rnn.BucketSentenceIter``."""
    return isinstance(iterator, mx.rnn.BucketSentenceIter)


def sentences_per_epoch(iterator: Any) -> Dict[str, Optional[int]]:
    """Return the sentences an epoch trains on (``used``), of those kept (``held``).

    ``too_long``: the sentences left out when the iterator was built, for
    being longer than its largest bucket (None where the iterator was not
    built by :func:`bucket_sentence_iter`, which counts them).
    """
    used = len(iterator.idx) * iterator.batch_size
    held = int(sum(len(bucket) for bucket in iterator.data))
    return {"used": used, "held": held, "too_long": getattr(iterator, TOO_LONG, None)}


def bucket_sentence_iter(sentences: Sequence[Sequence[int]], *args: Any, **kwargs: Any) -> Any:
    """Return ``mx.rnn.BucketSentenceIter(sentences, ...)`` that knows what it left out.

    The same iterator, built with the same arguments (and the same draws from
    the global generators), with the attribute ``sentences_too_long``: how
    many of ``sentences`` are longer than its largest bucket, which MXNet's
    iterator only prints. The loop's warning of left-out sentences counts them.
    """
    iterator = mx.rnn.BucketSentenceIter(sentences, *args, **kwargs)
    longest = max(iterator.buckets)
    setattr(iterator, TOO_LONG, sum(1 for sentence in sentences if len(sentence) > longest))
    return iterator


class SentencesInOrder(mx.io.DataIter):
    """Every sentence of a ``BucketSentenceIter`` once, for evaluation, in a fixed order.

    Bucket by bucket (in the order of ``iterator.buckets``), each bucket's
    sentences in the lexicographic order of their tokens, whatever the
    iterator's shuffles did; batches of ``iterator.batch_size``, a bucket's
    last partial batch padded as ``NDArrayIter(last_batch_handle='pad')``
    pads (with the bucket's first sentences again, ``pad`` saying how many:
    evaluation never counts them, :meth:`~mxoid.MainLoop.predict` drops
    them). The labels are the iterator's (each token's next, then
    ``invalid_label``), in its layout. Read from ``iterator.data``: the
    iterator is never reset, and nothing is drawn from any random generator.

    Parameters
    ----------
    iterator : mx.rnn.BucketSentenceIter
    """

    def __init__(self, iterator: Any) -> None:
        super().__init__(iterator.batch_size)
        self.source = iterator
        self.provide_data = iterator.provide_data
        self.provide_label = iterator.provide_label
        self.default_bucket_key = iterator.default_bucket_key
        self._batches: Optional[Iterator[mx.io.DataBatch]] = None

    @property
    def sentences(self) -> int:
        """How many sentences a pass yields (the padding not counted)."""
        return int(sum(len(bucket) for bucket in self.source.data))

    def reset(self) -> None:
        """Start again from the first bucket (the iterator read is not reset)."""
        self._batches = None

    def next(self) -> mx.io.DataBatch:
        """Return the next batch (``StopIteration`` after the last bucket's)."""
        if self._batches is None:
            self._batches = self._generate()
        return next(self._batches)

    def _generate(self) -> Iterator[mx.io.DataBatch]:
        it, size = self.source, self.batch_size
        for key, bucket in zip(it.buckets, it.data):
            rows = len(bucket)
            if rows == 0:
                continue
            ordered = bucket[np.lexsort(bucket.T[::-1])]  # column 0 first: whatever shuffles did
            label = np.empty_like(ordered)
            label[:, :-1] = ordered[:, 1:]
            label[:, -1] = it.invalid_label
            for start in range(0, rows, size):
                taken = np.arange(start, start + size) % rows  # NDArrayIter's pad: from the top
                yield self._batch(key, ordered[taken], label[taken], max(0, start + size - rows))

    def _batch(self, key: Any, data: np.ndarray, label: np.ndarray, pad: int) -> mx.io.DataBatch:
        it = self.source
        if it.major_axis == 1:
            data, label = data.T, label.T
        return mx.io.DataBatch(
            [mx.nd.array(data, dtype=it.dtype)],
            [mx.nd.array(label, dtype=it.dtype)],
            pad=pad,
            bucket_key=key,
            provide_data=[mx.io.DataDesc(it.data_name, data.shape, layout=it.layout)],
            provide_label=[mx.io.DataDesc(it.label_name, label.shape, layout=it.layout)],
        )


class SentencePosition:
    """The position of one ``BucketSentenceIter`` (see the module's documentation)."""

    def __init__(self, iterator: Any) -> None:
        self.iterator = iterator
        self._orders: Optional[List[np.ndarray]] = None

    def reset(self) -> None:
        """Reset the iterator for a new epoch, learning the order it shuffled each bucket into."""
        before = np.random.get_state()
        self.iterator.reset()
        after = np.random.get_state()
        np.random.set_state(before)  # the same draws, on the rows' numbers
        shuffles = []
        for bucket in self.iterator.data:
            order = np.arange(len(bucket))
            np.random.shuffle(order)
            shuffles.append(order)
        np.random.set_state(after)
        if self._orders is None:
            self._orders = shuffles
        else:
            self._orders = [total[order] for total, order in zip(self._orders, shuffles)]

    def state_dict(self) -> Dict[str, Any]:
        """Return the position as plain data."""
        it = self.iterator
        return {
            "idx": [[int(i), int(j)] for i, j in it.idx],
            "curr_idx": int(it.curr_idx),
            "orders": None if self._orders is None else [o.tolist() for o in self._orders],
            "sizes": [len(bucket) for bucket in it.data],
            "sentences_per_epoch": sentences_per_epoch(it),
        }

    def problem(self, state: Dict[str, Any]) -> Optional[str]:
        """Return what is inconsistent in ``state`` for this iterator, naming the field; or None."""
        it = self.iterator
        sizes = [len(bucket) for bucket in it.data]
        if state.get("sizes") != sizes:
            return f"sizes' are {state.get('sizes')}, this iterator's buckets hold {sizes}"
        idx = state.get("idx")
        if not isinstance(idx, list) or sorted(map(tuple, idx)) != sorted(map(tuple, it.idx)):
            return "idx' is not an order of this iterator's batches"
        if not isinstance(state.get("curr_idx"), int) or not 0 <= state["curr_idx"] <= len(idx):
            return f"curr_idx' is {state.get('curr_idx')!r}, outside its {len(idx)} batches"
        orders = state.get("orders")
        if orders is not None and (
            len(orders) != len(sizes)
            or any(sorted(o) != list(range(n)) for o, n in zip(orders, sizes))
        ):
            return "orders' are not orders of the buckets' sentences"
        return None

    def restore(self, state: Dict[str, Any]) -> None:
        """Put a freshly built iterator where :meth:`state_dict` found the old one."""
        it = self.iterator
        if state["orders"] is not None:
            self._orders = [np.asarray(o, dtype=np.int64) for o in state["orders"]]
            it.data = [bucket[order] for bucket, order in zip(it.data, self._orders)]
        it.idx = [tuple(pair) for pair in state["idx"]]
        it.curr_idx = state["curr_idx"]
        it.nddata, it.ndlabel = [], []
        for bucket in it.data:  # what BucketSentenceIter.reset builds from its data
            label = np.empty_like(bucket)
            label[:, :-1] = bucket[:, 1:]
            label[:, -1] = it.invalid_label
            it.nddata.append(mx.nd.array(bucket, dtype=it.dtype))
            it.ndlabel.append(mx.nd.array(label, dtype=it.dtype))
