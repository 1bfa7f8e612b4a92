"""The parameter servers of a distributed job, as mxoid sets them up.

MXNet's ``dist_sync`` / ``dist_async`` kvstores run a parameter server in
separate processes (started by :mod:`mxoid.distributed.launch`). mxoid gives
them a :class:`ServerOptimizer`: the user's optimizer on the parameter keys,
and an exact gather on mxoid's own reduction keys, so that workers can
exchange numbers (:mod:`mxoid.distributed.workers`) while the servers hold an
optimizer.

Notes
-----
How a reduction works. A reduction key holds one row per worker plus a flag
column. A worker pushes its values in its own row with the flag set, zeros
elsewhere. On the servers, :class:`ServerOptimizer` copies the flagged rows
into the stored array and marks them as merged; with ``dist_sync`` the
servers first sum the pushes of all workers, which, one non-zero row per
worker, is exact. After the pull (and barriers with ``dist_async``) every
worker holds the same rows and sums them in rank order, so every worker gets
bit-identical results. Reduction keys are created after the parameters, so
they never shift the optimizer's index-to-name map: the kvstore numbers keys
in the order they are first initialized, and every key numbered
``num_param_keys`` or above is a reduction key.

Server processes must import mxoid before they start serving, which
``import mxnet`` with ``DMLC_ROLE=server`` does not allow (the import itself
runs the server loop): start them with :func:`run_server`, which is what
``mxoid launch`` and ``python -m mxoid.distributed.launch --role server`` do.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Optional, Set

import mxnet as mx

__all__ = [
    "MERGED",
    "ServerOptimizer",
    "is_asynchronous",
    "is_distributed",
    "run_server",
    "set_server_optimizer",
]

MERGED = 2.0
"""Flag the servers' :class:`ServerOptimizer` writes into the rows it merged."""

ASYNC_NEEDS_SERVER_UPDATE = (
    "{kind} needs update_on_kvstore=True: with asynchronous updates the servers must run the "
    "optimizer (each push would otherwise overwrite the previous one)"
)


def is_distributed(kvstore: Optional[mx.kv.KVStore]) -> bool:
    """Return True for a kvstore of MXNet's parameter server (``dist_*``)."""
    return kvstore is not None and "dist" in kvstore.type


def is_asynchronous(kvstore: Optional[mx.kv.KVStore]) -> bool:
    """Return True for ``dist_async``.

    There each worker's push is applied alone, without waiting for the
    others (``dist_sync`` sums every worker's push first).
    """
    return is_distributed(kvstore) and "async" in kvstore.type


# kvstore -> its reduction keys created so far, for kvstores whose servers run ServerOptimizer.
reduction_keys: weakref.WeakKeyDictionary[mx.kv.KVStore, Set[str]] = weakref.WeakKeyDictionary()


class ServerOptimizer:
    """The update rule the parameter servers run on behalf of mxoid.

    Keys numbered below ``num_param_keys`` are parameters: the wrapped
    optimizer updates them (or, without one, the pushed value replaces the
    stored one, which is what a server without an optimizer does). Keys
    numbered from ``num_param_keys`` on are mxoid's reduction keys: the rows
    whose flag (last column) is set replace the stored rows and are marked
    as merged. The servers unpickle this object, so it must stay importable
    from ``mxoid.distributed``.

    Parameters
    ----------
    optimizer : mx.optimizer.Optimizer or None
        The user's optimizer, with its index-to-name map; None when the
        workers update the parameters themselves.
    num_param_keys : int
        How many parameters the workers put on the kvstore, first.
    num_workers : int
        Rows of a reduction key (the servers see every key flattened).
    """

    aggregate_num = 0  # the servers update one key at a time

    def __init__(
        self, optimizer: Optional[mx.optimizer.Optimizer], num_param_keys: int, num_workers: int
    ) -> None:
        self.optimizer = optimizer
        self.num_param_keys = num_param_keys
        self.num_workers = num_workers
        self.multi_precision = bool(optimizer is not None and optimizer.multi_precision)

    def _set_current_context(self, device_id: int) -> None:
        if self.optimizer is not None:
            self.optimizer._set_current_context(device_id)

    def create_state_multi_precision(self, index: int, weight: mx.nd.NDArray) -> Any:
        """Return the wrapped optimizer's state for a parameter; None for a reduction key."""
        if index < self.num_param_keys and self.optimizer is not None:
            return self.optimizer.create_state_multi_precision(index, weight)
        return None

    def update_multi_precision(
        self, index: int, weight: mx.nd.NDArray, grad: mx.nd.NDArray, state: Any
    ) -> None:
        """Update the stored ``weight`` of key ``index`` with the pushed ``grad``."""
        if index >= self.num_param_keys:
            shape = (self.num_workers, -1)
            stored, pushed = weight.asnumpy().reshape(shape), grad.asnumpy().reshape(shape)
            rows = pushed[:, -1] != 0
            stored[rows] = pushed[rows]
            stored[rows, -1] = MERGED
            weight[:] = stored.reshape(weight.shape)
        elif self.optimizer is None:
            weight[:] = grad
        else:
            self.optimizer.update_multi_precision(index, weight, grad, state)


def set_server_optimizer(
    kvstore: mx.kv.KVStore, optimizer: Optional[mx.optimizer.Optimizer], num_param_keys: int
) -> None:
    """Give the servers a :class:`ServerOptimizer`, once the parameters are on the kvstore.

    A collective call, on every worker. Rank 0 sends it, then all workers
    meet at a barrier, so that no worker pushes before the servers have it
    (``dist_async`` applies every push at once).

    Parameters
    ----------
    kvstore : KVStore
        A distributed kvstore.
    optimizer : mx.optimizer.Optimizer or None
        The optimizer the servers run on the parameters; None when the
        workers update them (``update_on_kvstore=False``, ``dist_sync`` only).
    num_param_keys : int
        How many parameter keys were initialized, before any reduction key.

    Raises
    ------
    ValueError
        For ``dist_async`` without an optimizer on the servers.
    """
    if optimizer is None and is_asynchronous(kvstore):
        raise ValueError(ASYNC_NEEDS_SERVER_UPDATE.format(kind=kvstore.type))
    if kvstore.rank == 0:
        kvstore.set_optimizer(ServerOptimizer(optimizer, num_param_keys, kvstore.num_workers))
    kvstore._barrier()
    reduction_keys[kvstore] = set()


def run_server(role: str) -> None:
    """Run this process as a ps-lite ``'server'`` or ``'scheduler'`` until the workers finish.

    The process must have been started with every ``DMLC_*`` variable but
    ``DMLC_ROLE``: ``import mxnet`` with ``DMLC_ROLE=server`` runs the server
    loop inside the import, before mxoid can be imported, and such a server
    cannot unpickle :class:`ServerOptimizer`. This sets ``DMLC_ROLE`` once
    mxnet and mxoid are imported, then serves, with a controller that also
    saves and loads the optimizer states for checkpoints
    (:class:`~mxoid.distributed.server_states.StatesServer`).
    """
    if role not in ("server", "scheduler"):
        raise ValueError(f"role must be 'server' or 'scheduler', not {role!r}")
    from .server_states import StatesServer  # its controller saves and loads the states

    os.environ["DMLC_ROLE"] = role
    StatesServer(mx.kv.create("dist")).run()
