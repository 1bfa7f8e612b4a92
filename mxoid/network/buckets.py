"""Buckets: a network built per bucket key by ``sym_gen``, as ``BucketingModule`` takes it.

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
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple

import mxnet as mx

from ..data.sentences import is_bucket_sentence_iter, sentences_per_epoch
from ..executor_manager import LOSS_SCALE_INPUT, DataParallelExecutorManager, ExecutorSet
from .base import AskHeads, Network

__all__ = ["BucketNetwork", "Buckets", "resolve_network"]

SymGen = Callable[[Any], Tuple[mx.sym.Symbol, Sequence[str], Sequence[str]]]

NO_BUCKET_KEY = (
    "the batch has no bucket_key, but the loop was given a sym_gen: each batch must say its "
    "bucket (mx.rnn.BucketSentenceIter's do; a DataBatch(..., bucket_key=key, "
    "provide_data=..., provide_label=...) of your own iterator must too)"
)
LEFT_OUT = (
    "train_data (an mx.rnn.BucketSentenceIter) trains on {used} of its {held} sentences an "
    "epoch: it leaves out the last partial batch of each bucket (batches of {batch_size}: "
    "{partial} sentences), and, when it was built, {too_long} longer than its largest bucket "
    "({longest} tokens){total}. Choose buckets (or a batch size) that divide the sentences "
    "more evenly and reach the longest, or accept it"
)
TOO_LONG_UNCOUNTED = (
    "the sentences (it printed how many; build it with mxoid.data.sentences."
    "bucket_sentence_iter to have them counted here)"
)
NOT_THE_LARGEST = (
    "default_bucket_key={key!r}: its graph does not take train_data's provide_data {shapes} "
    "(the shapes of train_data's default bucket {theirs!r}, its largest), as MXNet reports: "
    "{error}. The default bucket's executors are bound first, for the largest shapes, as "
    "MXNet's memory pool needs: pass default_bucket_key={theirs!r} (or leave it out)"
)
OTHER_PARAMETER = (
    "bucket {key!r}: sym_gen({key!r}) has the parameter {name!r}, which the default bucket "
    "{default!r}'s graph does not have (its parameters: {known}). Every bucket's parameters "
    "are the default bucket's, shared: {name!r} would never be initialized, trained or "
    "saved. Name the parameters of every bucket alike (one cell or variable per parameter, "
    "not one per bucket)"
)
NO_DEFAULT_KEY = (
    "MainLoop(sym_gen, ...) needs default_bucket_key=..., the bucket whose executors are bound "
    "first (the longest, as BucketingModule's); train_data has no default_bucket_key either"
)


def resolve_network(
    network: Any, train_data: Any, default_bucket_key: Optional[Hashable]
) -> Tuple[Any, Optional[BucketNetwork]]:
    """Return ``(symbol, buckets)``: ``network`` itself and None, or a sym_gen's default bucket.

    Kept from mxoid 0.4 (:func:`mxoid.network.as_network` answers for every kind now).
    """
    if isinstance(network, mx.sym.Symbol) or not callable(network):
        if default_bucket_key is not None:
            raise TypeError("default_bucket_key is for a sym_gen, not a symbol")
        return network, None
    buckets = BucketNetwork(network, train_data, default_bucket_key, stacklevel=4)
    return buckets.symbol, buckets


def _names(descs: Sequence[Any]) -> List[str]:
    return [d[0] if isinstance(d, tuple) else d.name for d in descs or ()]


def _warn_left_out(train_data: Any, stacklevel: int) -> None:
    """Warn of the sentences an epoch of a ``BucketSentenceIter`` leaves out, and why."""
    coverage = sentences_per_epoch(train_data)
    used, held, too_long = coverage["used"], coverage["held"], coverage["too_long"]
    if used < held or too_long:
        left = held - used + (too_long or 0)
        warnings.warn(
            LEFT_OUT.format(
                used=used,
                held=held,
                batch_size=train_data.batch_size,
                partial=held - used,
                too_long=TOO_LONG_UNCOUNTED if too_long is None else too_long,
                longest=max(train_data.buckets),
                total="" if too_long is None else f": {left} left out in all",
            ),
            stacklevel=stacklevel,
        )


class BucketNetwork(Network):
    """The buckets of a loop: ``sym_gen``, the default key, each bucket's training executors.

    Parameters
    ----------
    sym_gen : callable
        ``sym_gen(bucket_key) -> (symbol, data_names, label_names)``.
    train_data : mx.io.DataIter
        Batches that say their ``bucket_key`` (and their own ``provide_data``
        / ``provide_label``).
    default_key : hashable, optional
        The bucket of the manager's training set (``train_data.default_bucket_key``
        by default): the longest, as ``BucketingModule``'s.
    precision : mxoid.precision.MixedPrecision, optional
        How the graphs compute: each bucket's converted when generated.

    Attributes
    ----------
    symbol : mx.sym.Symbol
        The default bucket's graph.
    """

    switches_graphs = True

    def __init__(
        self,
        sym_gen: SymGen,
        train_data: Any,
        default_key: Optional[Hashable] = None,
        *,
        stacklevel: int = 3,
        precision: Any = None,
    ) -> None:
        self.precision = precision
        if default_key is None:
            default_key = getattr(train_data, "default_bucket_key", None)
        if default_key is None:
            raise ValueError(NO_DEFAULT_KEY)
        if is_bucket_sentence_iter(train_data):
            _warn_left_out(train_data, stacklevel + 1)
        self.sym_gen = sym_gen
        self.default_key = default_key
        self._symbols: Dict[Hashable, mx.sym.Symbol] = {}
        self._training: Dict[Hashable, ExecutorSet] = {}
        data, labels = train_data.provide_data, train_data.provide_label
        self._inputs = set(_names(data)) | set(_names(labels))
        super().__init__(self.symbol_of(default_key, data, labels), train_data)
        self._check_default(data, labels)
        for key in getattr(train_data, "buckets", None) or ():  # every bucket it says it has
            self.symbol_of(key, data, labels)

    def _check_default(self, data: Sequence[Any], labels: Sequence[Any]) -> None:
        """Raise when the default bucket's graph cannot take ``train_data.provide_data``."""
        arguments = set(self.symbol.list_arguments())
        shapes = {d[0] if isinstance(d, tuple) else d.name: tuple(d[1]) for d in [*data, *labels]}
        shapes = {name: shape for name, shape in shapes.items() if name in arguments}
        try:
            self.symbol.infer_shape(**shapes)
        except mx.base.MXNetError as error:
            theirs = getattr(self.train_data, "default_bucket_key", "the largest")
            first = str(error).strip().splitlines()[0]
            raise ValueError(
                NOT_THE_LARGEST.format(
                    key=self.default_key, shapes=shapes, theirs=theirs, error=first
                )
            ) from None

    def _parameters(self, symbol: mx.sym.Symbol) -> List[str]:
        names = symbol.list_arguments()
        return [n for n in names if n not in self._inputs and n != LOSS_SCALE_INPUT]

    def state(self) -> Dict[str, Any]:
        """Return the default bucket's key, which a checkpoint's files are named after."""
        return {"default_bucket_key": self.default_key}

    def key_of(self, batch: Any) -> Optional[Hashable]:
        """Return ``batch.bucket_key`` (None where the batch says none)."""
        return getattr(batch, "bucket_key", None)

    def default_key_of(self, iterator: Any) -> Optional[Hashable]:
        """Return ``iterator.default_bucket_key`` (the bucket of its ``provide_data``), or ours."""
        return getattr(iterator, "default_bucket_key", self.default_key)

    def graph(
        self, key: Optional[Hashable] = None, data_descs: Any = None, label_descs: Any = None
    ) -> mx.sym.Symbol:
        """Return bucket ``key``'s graph (None: the default bucket's)."""
        if key is None or key == self.default_key:
            return self.symbol
        return self.symbol_of(key, data_descs, label_descs)

    def symbol_of(
        self, key: Hashable, data_descs: Sequence[Any], label_descs: Any
    ) -> mx.sym.Symbol:
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
        if key != self.default_key and self._symbols:
            known = self._parameters(self.symbol)
            for name in self._parameters(symbol):
                if name not in known:
                    raise ValueError(
                        OTHER_PARAMETER.format(
                            key=key, name=name, default=self.default_key, known=known
                        )
                    )
        symbol = self._symbols[key] = self.converted(symbol, [*data_names, *label_names])
        return symbol

    def training_set(
        self, manager: DataParallelExecutorManager, batch: Any, ask_heads: AskHeads
    ) -> ExecutorSet:
        """Return the training executors of ``batch``'s bucket, bound on first use.

        With the private heads the loop's extensions ask for (``ask_heads``),
        sharing the default bucket's arrays and memory pool.
        """
        key = getattr(batch, "bucket_key", None)
        if key is None:
            raise ValueError(NO_BUCKET_KEY)
        if key == self.default_key:
            return manager.training_set
        found = self._training.get(key)
        if found is not None:
            return found
        data, labels = batch.provide_data, batch.provide_label
        symbol = self.symbol_of(key, data, labels)
        heads, owners = ask_heads(symbol, data, labels, key)
        try:
            found = manager.executor_set(
                data,
                labels,
                heads,
                key=("bucket", key),
                symbol=symbol,
                for_training=True,
                head_owners=owners,
            )
        except ValueError as error:
            raise ValueError(
                f"bucket {key!r}: {error} (every bucket's parameters must have the shapes of "
                f"the default bucket {self.default_key!r}'s)"
            ) from None
        self._training[key] = found
        return found

    @property
    def graph_keys(self) -> List[Hashable]:
        """Every bucket whose graph is known (train_data's and those met), the default first."""
        return [self.default_key] + [key for key in self._symbols if key != self.default_key]

    @property
    def bound_keys(self) -> List[Hashable]:
        """The buckets bound so far for training, the default one first."""
        return [self.default_key] + list(self._training)


Buckets = BucketNetwork
"""The name of :class:`BucketNetwork` in mxoid 0.4 (``mxoid.main_loop.buckets.Buckets``)."""
