"""Splitting a data set between the workers of a distributed job, in equal parts.

Sharding is explicit: :class:`~mxoid.MainLoop` never re-shards an iterator it
is given. With ``dist_sync`` every worker must take the same number of steps
per epoch (a worker that stops pushing early leaves the others blocked), so
every worker gets the same number of rows;
:func:`~mxoid.checkpoint.data_position.batches_per_epoch` lets the
loop check the counts before training.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Union

import mxnet as mx
import numpy as np

__all__ = ["shard", "shard_arrays"]

ArrayLike = Union[np.ndarray, mx.nd.NDArray]
DataLike = Union[ArrayLike, Sequence[ArrayLike], Mapping[str, ArrayLike]]


def shard_arrays(
    data: DataLike,
    kvstore: Optional[mx.kv.KVStore] = None,
    *,
    rank: Optional[int] = None,
    num_workers: Optional[int] = None,
) -> DataLike:
    """Return this worker's equal share of every array in ``data``: rows ``rank, rank + n, ...``.

    With ``n`` workers and ``N`` rows, every worker gets ``N // n`` rows (the
    last ``N % n`` rows are left out), so every worker takes the same number
    of steps. Without shuffling, step ``k`` of the ``n`` workers with batch
    ``b`` covers the rows of step ``k`` of one process with batch ``n * b``.

    Parameters
    ----------
    data : array, list of arrays or dict of arrays
        NumPy arrays or NDArrays with the same number of rows, as given to
        ``mx.io.NDArrayIter``.
    kvstore : KVStore, optional
        Gives ``rank`` and ``num_workers`` (``kv.rank``, assigned by the
        scheduler, not the launch order).
    rank, num_workers : int, optional
        Instead of ``kvstore``.

    Returns
    -------
    The same structure, with NumPy arrays.
    """
    if kvstore is not None:
        rank, num_workers = kvstore.rank, kvstore.num_workers
    if rank is None or num_workers is None:
        raise ValueError("give a kvstore, or both rank and num_workers")
    if not 0 <= rank < num_workers:
        raise ValueError(f"rank {rank} is not in [0, {num_workers})")

    def one(array: ArrayLike) -> np.ndarray:
        array = array.asnumpy() if isinstance(array, mx.nd.NDArray) else np.asarray(array)
        usable = len(array) // num_workers * num_workers
        if usable == 0:
            raise ValueError(f"{len(array)} rows cannot be shared by {num_workers} workers")
        return array[:usable][rank::num_workers]

    if isinstance(data, Mapping):
        return {name: one(array) for name, array in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(one(array) for array in data)
    return one(data)


def shard(
    data: DataLike,
    label: Optional[DataLike] = None,
    *,
    kvstore: mx.kv.KVStore,
    batch_size: int,
    **iter_kwargs: Any,
) -> mx.io.NDArrayIter:
    """Return an ``mx.io.NDArrayIter`` over this worker's equal share of ``data`` and ``label``.

    See :func:`shard_arrays` for which rows. Every worker gets the same
    number of rows, hence of steps per epoch.

    Parameters
    ----------
    data, label : array, list of arrays or dict of arrays
    kvstore : KVStore
        The distributed kvstore the loop will use.
    batch_size : int
        Per worker.
    **iter_kwargs
        Passed to ``mx.io.NDArrayIter`` (``shuffle``, ``label_name``, ...).

    Examples
    --------
    .. code-block:: python

        kv = mx.kv.create("dist_sync")
        train = shard(X, y, kvstore=kv, batch_size=32, label_name="softmax_label")
        MainLoop(net, train, kvstore=kv, extensions=[FinishAfter(after_n_epochs=5)]).run()
    """
    label = None if label is None else shard_arrays(label, kvstore)
    return mx.io.NDArrayIter(
        shard_arrays(data, kvstore), label, batch_size=batch_size, **iter_kwargs
    )
