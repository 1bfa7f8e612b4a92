"""Which network the loop was given: :func:`as_network` (a symbol, a ``sym_gen`` or a block)."""

from __future__ import annotations

from typing import Any, Hashable, Optional

import mxnet as mx

from .base import Network
from .buckets import BucketNetwork
from .gluon import GluonNetwork, network_inputs

__all__ = ["as_network", "legacy_view"]


def as_network(
    network: Any,
    train_data: Any,
    loss: Any = None,
    initializer: Optional[mx.init.Initializer] = None,
    default_bucket_key: Optional[Hashable] = None,
    precision: Any = None,
) -> Network:
    """Return the :class:`Network` of what :class:`~mxoid.MainLoop` was given to train.

    A Gluon ``HybridBlock`` (with ``loss``) is traced (:class:`GluonNetwork`;
    a ``DataLoader`` is read through :class:`mxoid.data.DataLoaderIter`); a
    callable that is not a symbol is a ``sym_gen`` (:class:`BucketNetwork`, whose
    default bucket is ``default_bucket_key`` or ``train_data``'s); anything else
    is a symbol (:class:`Network`; the loop checks its type). ``precision``
    (:class:`mxoid.precision.MixedPrecision`, or None for float32): how every
    graph of the network computes.
    """
    if isinstance(network, Network):
        return network
    symbol, train_data, traced = network_inputs(network, train_data, loss, initializer, precision)
    if traced is None and callable(symbol) and not isinstance(symbol, mx.sym.Symbol):
        return BucketNetwork(
            symbol, train_data, default_bucket_key, stacklevel=4, precision=precision
        )
    if default_bucket_key is not None:
        raise TypeError("default_bucket_key is for a sym_gen, not a symbol")
    return Network(symbol, train_data, precision) if traced is None else traced


def legacy_view(network: Network, kind: str) -> Any:
    """Return ``network`` if it is of ``kind`` (``'buckets'``, ``'gluon'``), else None.

    What the loop's ``buckets`` and ``gluon`` attributes of mxoid 0.4 answer
    (deprecated: ask ``loop.network``).
    """
    kinds = {"buckets": BucketNetwork, "gluon": GluonNetwork}
    return network if isinstance(network, kinds[kind]) else None
