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
out the last partial batch of each bucket (and sentences longer than the
largest bucket).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import mxnet as mx
import numpy as np

__all__ = ["SentencePosition", "is_bucket_sentence_iter", "sentences_per_epoch"]


def is_bucket_sentence_iter(iterator: Any) -> bool:
    """Return whether ``iterator`` is MXNet's ``mx.rnn.BucketSentenceIter``."""
    return isinstance(iterator, mx.rnn.BucketSentenceIter)


def sentences_per_epoch(iterator: Any) -> Dict[str, int]:
    """Return ``{'used': ..., 'held': ...}``: the sentences an epoch trains on, of those kept."""
    used = len(iterator.idx) * iterator.batch_size
    return {"used": used, "held": int(sum(len(bucket) for bucket in iterator.data))}


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
