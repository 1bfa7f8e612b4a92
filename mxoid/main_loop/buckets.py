"""Bucketing: a network built per bucket key by ``sym_gen``, as ``BucketingModule`` takes it.

``MainLoop(sym_gen, train_data, default_bucket_key=...)``: ``sym_gen(key)``
returns ``(symbol, data_names, label_names)`` for the batches of a bucket
(sequences of one length, say); each batch carries its ``bucket_key`` and its
own ``provide_data`` / ``provide_label``, as ``mx.rnn.BucketSentenceIter``'s
do. The default bucket's executors are the manager's training set, bound
first, on every device; another bucket's are bound on first use and cached,
sharing the default bucket's parameter, gradient and auxiliary arrays and its
memory pool (:meth:`~mxoid.DataParallelExecutorManager.executor_set`), as
``BucketingModule.switch_bucket`` binds each with a ``shared_module``.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple

import mxnet as mx

from ..data.sentences import is_bucket_sentence_iter, sentences_per_epoch
from ..executor_manager import ExecutorSet
from .building import head_request, private_heads

if TYPE_CHECKING:  # pragma: no cover
    from .loop import MainLoop

__all__ = ["Buckets", "resolve_network"]

SymGen = Callable[[Any], Tuple[mx.sym.Symbol, Sequence[str], Sequence[str]]]

NO_BUCKET_KEY = (
    "the batch has no bucket_key, but the loop was given a sym_gen: each batch must say its "
    "bucket (mx.rnn.BucketSentenceIter's do; a DataBatch(..., bucket_key=key, "
    "provide_data=..., provide_label=...) of your own iterator must too)"
)
LEFT_OUT = (
    "train_data (an mx.rnn.BucketSentenceIter) trains on {used} of its {held} sentences an "
    "epoch: it leaves out the last partial batch of each bucket (batches of {batch_size}). "
    "Choose buckets (or a batch size) that divide the sentences more evenly, or accept it"
)
NO_DEFAULT_KEY = (
    "MainLoop(sym_gen, ...) needs default_bucket_key=..., the bucket whose executors are bound "
    "first (the longest, as BucketingModule's); train_data has no default_bucket_key either"
)


def resolve_network(
    network: Any, train_data: Any, default_bucket_key: Optional[Hashable]
) -> Tuple[Any, Optional[Buckets]]:
    """Return ``(symbol, buckets)``: ``network`` itself and None, or a sym_gen's default bucket."""
    if isinstance(network, mx.sym.Symbol) or not callable(network):
        if default_bucket_key is not None:
            raise TypeError("default_bucket_key is for a sym_gen, not a symbol")
        return network, None
    if default_bucket_key is None:
        default_bucket_key = getattr(train_data, "default_bucket_key", None)
    if default_bucket_key is None:
        raise ValueError(NO_DEFAULT_KEY)
    if is_bucket_sentence_iter(train_data):
        coverage = sentences_per_epoch(train_data)
        if coverage["used"] < coverage["held"]:
            warnings.warn(
                LEFT_OUT.format(**coverage, batch_size=train_data.batch_size), stacklevel=3
            )
    buckets = Buckets(network, default_bucket_key)
    symbol = buckets.symbol(default_bucket_key, train_data.provide_data, train_data.provide_label)
    return symbol, buckets


def _names(descs: Sequence[Any]) -> List[str]:
    return [d[0] if isinstance(d, tuple) else d.name for d in descs or ()]


class Buckets:
    """The buckets of a loop: ``sym_gen``, the default key, each bucket's training executors.

    Parameters
    ----------
    sym_gen : callable
        ``sym_gen(bucket_key) -> (symbol, data_names, label_names)``.
    default_key : hashable
        The bucket of the manager's training set.
    """

    def __init__(self, sym_gen: SymGen, default_key: Hashable) -> None:
        self.sym_gen = sym_gen
        self.default_key = default_key
        self._symbols: Dict[Hashable, mx.sym.Symbol] = {}
        self._training: Dict[Hashable, ExecutorSet] = {}

    def symbol(self, key: Hashable, data_descs: Sequence[Any], label_descs: Any) -> mx.sym.Symbol:
        """Return bucket ``key``'s symbol, checking its inputs against the batch's."""
        symbol = self._symbols.get(key)
        if symbol is not None:
            return symbol
        generated = self.sym_gen(key)
        if not (isinstance(generated, tuple) and len(generated) == 3):
            raise TypeError(
                f"sym_gen({key!r}) must return (symbol, data_names, label_names), as "
                f"BucketingModule's; it returned {type(generated).__name__}"
            )
        symbol, data_names, label_names = generated
        given_data, given_labels = _names(data_descs), _names(label_descs)
        if sorted(data_names) != sorted(given_data) or not set(label_names) <= set(given_labels):
            raise ValueError(
                f"sym_gen({key!r}) returns the inputs data_names={list(data_names)}, "
                f"label_names={list(label_names)}, but the batches of bucket {key!r} provide "
                f"data {given_data} and labels {given_labels}: name them alike"
            )
        self._symbols[key] = symbol
        return symbol

    def training_set(self, loop: MainLoop, batch: mx.io.DataBatch) -> ExecutorSet:
        """Return the training executors of ``batch``'s bucket, bound on first use."""
        key = getattr(batch, "bucket_key", None)
        if key is None:
            raise ValueError(NO_BUCKET_KEY)
        manager = loop.manager
        if key == self.default_key:
            return manager.training_set
        found = self._training.get(key)
        if found is not None:
            return found
        data, labels = batch.provide_data, batch.provide_label
        symbol = self.symbol(key, data, labels)
        request = head_request(symbol, data, labels, manager.contexts, manager.work_load_list, key)
        heads = private_heads(loop.extensions, request)
        try:
            found = manager.executor_set(
                data,
                labels,
                [head for _, head in heads],
                key=("bucket", key),
                symbol=symbol,
                for_training=True,
            )
        except ValueError as error:
            raise ValueError(
                f"bucket {key!r}: {error} (every bucket's parameters must have the shapes of "
                f"the default bucket {self.default_key!r}'s)"
            ) from None
        loop.head_owners[id(found)] = {id(e): i for i, (e, _) in enumerate(heads)}
        self._training[key] = found
        return found

    @property
    def bound_keys(self) -> List[Hashable]:
        """The buckets bound so far for training, the default one first."""
        return [self.default_key] + list(self._training)
