"""Training on MXNet's distributed kvstore (ps-lite): servers, reductions, failures.

MXNet's ``dist_sync`` / ``dist_async`` kvstores run a parameter server in
separate processes (see :mod:`mxoid.launch`; data is split between workers
with :mod:`mxoid.sharding`). This module holds what mxoid adds around them:

- :func:`prepare_workers`, which :class:`~mxoid.MainLoop` calls once the
  parameters are on a distributed kvstore: it gives the servers a
  :class:`ServerOptimizer` (the user's optimizer on the parameter keys, an
  exact gather on mxoid's own reduction keys, so that workers can exchange
  numbers while the servers hold an optimizer), checks that every worker
  takes the same number of steps per epoch, and makes the metric extensions
  (``Evaluate``, ``TrainingMonitoring``) sum over the workers;
- :func:`allgather` and :func:`allreduce_sums`, the exchanges themselves;
- :func:`pull_parameters` (every worker ends with the servers' parameters)
  and :func:`exit_after_error` (a failed worker exits instead of hanging in
  ps-lite's finalize barrier).

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
``mxoid launch`` and ``python -m mxoid.launch --role server`` do.
"""
from __future__ import annotations

import functools
import logging
import os
import sys
import traceback
import weakref
from typing import Any, List, NoReturn, Optional, Sequence, Set

import mxnet as mx
import numpy as np

from .sharding import steps_per_epoch

__all__ = [
    "ServerOptimizer",
    "allgather",
    "allreduce_sums",
    "check_equal_steps",
    "exit_after_error",
    "is_distributed",
    "prepare_workers",
    "pull_parameters",
    "run_server",
    "set_server_optimizer",
]

logger = logging.getLogger(__name__)

MERGED = 2.0
"""Flag the servers' :class:`ServerOptimizer` writes into the rows it merged."""

_KEY_PREFIX = "__mxoid_reduce__/"
_BIGARRAY_BOUND = int(os.environ.get("MXNET_KVSTORE_BIGARRAY_BOUND", "1000000"))

SERVERS_NOT_MXOID = (
    "the parameter servers did not merge mxoid's reduction key, so they do not run "
    "mxoid.distributed.ServerOptimizer (a server started with 'import mxnet' cannot unpickle "
    "it, and then applies no optimizer either). Start servers with 'mxoid launch', or on each "
    "server host with 'python -m mxoid.launch --role server' and DMLC_ROLE unset")
UNEQUAL_STEPS = (
    "workers would take unequal numbers of steps per epoch ({counts}); dist_sync would then "
    "hang when the shortest worker stops pushing. Give every worker the same number of "
    "batches: shard the data with mxoid.shard(...), or wrap each worker's "
    "iterator in mx.io.ResizeIter(iterator, size=steps)")
UNKNOWN_STEPS = (
    "cannot count the batches per epoch of {kinds}, so mxoid cannot check that every worker "
    "takes the same number of steps (unequal counts hang dist_sync). Use an mx.io.NDArrayIter "
    "(e.g. from mxoid.shard) or wrap the iterator in mx.io.ResizeIter")
ASYNC_NEEDS_SERVER_UPDATE = (
    "{kind} needs update_on_kvstore=True: with asynchronous updates the servers must run the "
    "optimizer (each push would otherwise overwrite the previous one)")
NOT_SET_UP = (
    "this kvstore has no mxoid servers set up yet: create the MainLoop (or call "
    "set_server_optimizer) before reducing across workers, so that reduction keys are "
    "numbered after the parameters")

# kvstore -> its reduction keys created so far, for kvstores whose servers run ServerOptimizer.
_reduction_keys: "weakref.WeakKeyDictionary[mx.kv.KVStore, Set[str]]" = weakref.WeakKeyDictionary()


def is_distributed(kvstore: Optional[mx.kv.KVStore]) -> bool:
    """True for a kvstore of MXNet's parameter server (``dist_*``)."""
    return kvstore is not None and "dist" in kvstore.type


def _is_async(kvstore: mx.kv.KVStore) -> bool:
    return "async" in kvstore.type


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

    def __init__(self, optimizer: Optional[mx.optimizer.Optimizer], num_param_keys: int,
                 num_workers: int) -> None:
        self.optimizer = optimizer
        self.num_param_keys = num_param_keys
        self.num_workers = num_workers
        self.multi_precision = bool(optimizer is not None and optimizer.multi_precision)

    def _set_current_context(self, device_id: int) -> None:
        if self.optimizer is not None:
            self.optimizer._set_current_context(device_id)

    def create_state_multi_precision(self, index: int, weight: mx.nd.NDArray) -> Any:
        """The wrapped optimizer's state for a parameter; None for a reduction key."""
        if index < self.num_param_keys and self.optimizer is not None:
            return self.optimizer.create_state_multi_precision(index, weight)
        return None

    def update_multi_precision(self, index: int, weight: mx.nd.NDArray, grad: mx.nd.NDArray,
                               state: Any) -> None:
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


def set_server_optimizer(kvstore: mx.kv.KVStore, optimizer: Optional[mx.optimizer.Optimizer],
                         num_param_keys: int) -> None:
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
    if optimizer is None and _is_async(kvstore):
        raise ValueError(ASYNC_NEEDS_SERVER_UPDATE.format(kind=kvstore.type))
    if kvstore.rank == 0:
        kvstore.set_optimizer(ServerOptimizer(optimizer, num_param_keys, kvstore.num_workers))
    kvstore._barrier()
    _reduction_keys[kvstore] = set()


def prepare_workers(kvstore: mx.kv.KVStore, optimizer: Optional[mx.optimizer.Optimizer],
                    num_param_keys: int, train_data: Any, extensions: Sequence[Any]) -> None:
    """Set up training on a distributed kvstore; :class:`~mxoid.MainLoop` calls it on every worker.

    Call it once the parameters are on the kvstore, before any push. It
    gives the servers their :class:`ServerOptimizer`
    (:func:`set_server_optimizer`), checks the steps per epoch
    (:func:`check_equal_steps`), and gives every extension that has a
    ``reduce`` attribute left at None (``Evaluate``, ``TrainingMonitoring``)
    the sum over workers, so that every worker records the same numbers.
    Extensions that run on rank 0 only get none: a reduction needs every
    worker.
    """
    set_server_optimizer(kvstore, optimizer, num_param_keys)
    check_equal_steps(kvstore, train_data)
    for extension in extensions:
        if getattr(extension, "reduce", False) is None and not extension.rank_zero_only:
            extension.reduce = functools.partial(allreduce_sums, kvstore, extension.name)


def allgather(kvstore: Optional[mx.kv.KVStore], name: str, values: Any) -> np.ndarray:
    """Return every worker's ``values``, one row per rank; every worker gets the same array.

    A collective call: every worker must make it, in the same order, with
    the same ``name`` and the same number of values. Without a distributed
    kvstore it returns ``values`` as the only row.

    Parameters
    ----------
    kvstore : KVStore or None
    name : str
        With the number of values, names the reduction key; the first call
        with a name and size creates it (every worker must make that call).
    values : array_like
        Converted to float64.

    Returns
    -------
    np.ndarray
        Shape ``(num_workers,) + values.shape``, float64.

    Raises
    ------
    RuntimeError
        When the servers do not run :class:`ServerOptimizer`.
    """
    values = np.asarray(values, dtype=np.float64)
    shape = values.shape
    if not is_distributed(kvstore):
        return values[None, ...]
    values = values.ravel()
    size = values.size
    key = _reduction_key(kvstore, name, size)
    rows = np.zeros((kvstore.num_workers, size + 1))
    rows[kvstore.rank, :size] = values
    rows[kvstore.rank, size] = 1.0
    kvstore.push(key, mx.nd.array(rows, dtype=np.float64))
    if _is_async(kvstore):  # each push is applied alone: wait for everybody's
        mx.nd.waitall()
        kvstore._barrier()
    out = mx.nd.zeros(rows.shape, dtype=np.float64)
    kvstore.pull(key, out=out)
    gathered = out.asnumpy()
    if _is_async(kvstore):  # nobody pushes the next round before everybody pulled this one
        kvstore._barrier()
    if not (gathered[:, size] == MERGED).all():
        raise RuntimeError(SERVERS_NOT_MXOID)
    return gathered[:, :size].reshape((kvstore.num_workers,) + shape)


def allreduce_sums(kvstore: Optional[mx.kv.KVStore], name: str, values: Any) -> np.ndarray:
    """Sum ``values`` over the workers; every worker gets the same, bit-identical sums.

    A collective call, like :func:`allgather`; the result has the shape of
    ``values``. :func:`prepare_workers` makes it the ``reduce`` of the metric
    extensions, so that evaluation sums and counts are summed over the
    workers before the division. Without a distributed kvstore it returns
    ``values`` (as float64).

    Examples
    --------
    >>> loss_sum, count = allreduce_sums(loop.kvstore, "valid_loss", [loss_sum, count])
    """
    return allgather(kvstore, name, values).sum(axis=0)


def _reduction_key(kvstore: mx.kv.KVStore, name: str, size: int) -> str:
    """The key of reduction ``name`` with ``size`` values, created at first use (collectively)."""
    if kvstore not in _reduction_keys:
        raise RuntimeError(NOT_SET_UP)
    known = _reduction_keys[kvstore]
    key = f"{_KEY_PREFIX}{name}/{size}"
    if key not in known:
        if kvstore.num_workers * (size + 1) >= _BIGARRAY_BOUND:
            raise ValueError(f"reduction {name!r} is too large ({size} values): the kvstore "
                             "would split it across servers")
        kvstore.init(key, mx.nd.zeros((kvstore.num_workers, size + 1), dtype=np.float64))
        known.add(key)
    return key


def check_equal_steps(kvstore: mx.kv.KVStore, train_data: Any) -> None:
    """Raise on every worker when the workers would take unequal numbers of steps per epoch.

    A collective call (one :func:`allgather`), which also checks that the
    servers run :class:`ServerOptimizer`. With ``dist_async`` unequal counts
    do not hang, so only the server check applies. When some iterator cannot
    tell its length (:func:`steps_per_epoch`), rank 0 logs a warning.

    Raises
    ------
    ValueError
        With ``dist_sync``, when the counts differ.
    """
    steps = steps_per_epoch(train_data)
    counts = allgather(kvstore, "steps_per_epoch", -1 if steps is None else steps)
    if _is_async(kvstore):
        return
    if (counts < 0).any():
        if kvstore.rank == 0:
            logger.warning(UNKNOWN_STEPS.format(kinds=type(train_data).__name__))
        return
    if (counts != counts[0]).any():
        described = ", ".join(f"rank {rank}: {int(count)}" for rank, count in enumerate(counts))
        raise ValueError(UNEQUAL_STEPS.format(counts=described))


def pull_parameters(kvstore: mx.kv.KVStore, param_names: Sequence[str],
                    param_arrays: List[List[mx.nd.NDArray]]) -> None:
    """Give every device of every worker the servers' current parameters.

    A collective call: pushes in flight are finished first, then the workers
    meet at a barrier, then each pulls. With ``dist_async`` this is what
    makes all workers end training with the same parameters.
    """
    mx.nd.waitall()  # a barrier does not wait for pushes in flight
    kvstore._barrier()
    for name, arrays in zip(param_names, param_arrays):
        kvstore.pull(name, out=arrays, priority=0)
    mx.nd.waitall()


def exit_after_error(error: BaseException, rank: int) -> NoReturn:
    """Report ``error`` on stderr and end this worker now: status 1, the code of a
    ``SystemExit`` (1 for 0: ending alone is a failure), 130 for ``KeyboardInterrupt``.

    A worker that raises would otherwise hang at interpreter exit in
    ps-lite's finalize barrier, waiting for workers that wait for it. Output
    buffers and logging handlers are flushed, then the process ends with
    ``os._exit``; a launcher (``mxoid launch``) then stops the others.
    """
    status = 1
    if isinstance(error, SystemExit):
        # Exiting alone, even with status 0, leaves the other workers waiting for this one.
        status = error.code if isinstance(error.code, int) and error.code else 1
        print(f"mxoid: worker of rank {rank} called sys.exit({error.code!r}) during training; "
              f"exiting with status {status} without waiting for the other workers, which "
              "cannot go on without it", file=sys.stderr)
    elif isinstance(error, KeyboardInterrupt):
        status = 128 + 2
        print(f"mxoid: worker of rank {rank} was interrupted (KeyboardInterrupt); exiting "
              "without waiting for the other workers", file=sys.stderr)
    else:
        traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
        print(f"mxoid: worker of rank {rank} failed ({type(error).__name__}: {error}); exiting "
              "without waiting for the other workers", file=sys.stderr)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def run_server(role: str) -> None:
    """Run this process as a ps-lite ``'server'`` or ``'scheduler'`` until the workers finish.

    The process must have been started with every ``DMLC_*`` variable but
    ``DMLC_ROLE``: ``import mxnet`` with ``DMLC_ROLE=server`` runs the server
    loop inside the import, before mxoid can be imported, and such a server
    cannot unpickle :class:`ServerOptimizer`. This sets ``DMLC_ROLE`` once
    mxnet and mxoid are imported, then serves.
    """
    if role not in ("server", "scheduler"):
        raise ValueError(f"role must be 'server' or 'scheduler', not {role!r}")
    os.environ["DMLC_ROLE"] = role
    mx.kv.KVStoreServer(mx.kv.create("dist")).run()
