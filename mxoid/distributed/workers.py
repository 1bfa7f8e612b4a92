"""What a worker of a distributed job does beside training.

That is: exchanges with the other workers, and the checks and the endings
that keep a job from hanging.

- :func:`allgather` and :func:`allreduce_sums`: exact exchanges of float64
  numbers through the servers' reduction keys (see
  :mod:`mxoid.distributed.servers`), every value carried bit for bit as three
  integers below 2^24 (the servers' arithmetic is float32, which holds those
  exactly: 2^24 + 1 itself would come back as 2^24);
  the metric extensions sum their totals with them, and the loop agrees on
  stopping with them (:func:`agree_to_stop`); :func:`allgather_json`: every
  worker's plain data (a checkpoint's per-rank states), and
  :func:`check_same_checkpoint`: every worker resumes from the same checkpoint;
- :func:`check_equal_steps`: with ``dist_sync`` every worker must take the
  same number of steps per epoch, or the job hangs;
- :func:`pull_parameters` (every worker ends with the servers' parameters)
  and :func:`exit_after_error` (a failed worker exits instead of hanging in
  ps-lite's finalize barrier);
- :func:`tell_launcher_rank`: under ``mxoid launch``, the launcher labels this
  worker's output with its rank once it knows it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from typing import Any, List, NoReturn, Optional, Sequence, Tuple

import mxnet as mx
import numpy as np

from ..data.position import batches_per_epoch
from .agent import AGENT_TAG, LAUNCHER_VARIABLE
from .servers import MERGED, is_asynchronous, is_distributed, reduction_keys

__all__ = [
    "agree_to_stop",
    "allgather",
    "allgather_json",
    "allreduce_sums",
    "check_equal_steps",
    "check_same_checkpoint",
    "exit_after_error",
    "pull_parameters",
    "tell_launcher_rank",
]

logger = logging.getLogger(__name__)

_KEY_PREFIX = "__mxoid_reduce__/"
_BIGARRAY_BOUND = int(os.environ.get("MXNET_KVSTORE_BIGARRAY_BOUND", "1000000"))

SERVERS_NOT_MXOID = (
    "the parameter servers did not merge mxoid's reduction key, so they do not run "
    "mxoid.distributed.ServerOptimizer (a server started with 'import mxnet' cannot unpickle "
    "it, and then applies no optimizer either). Start servers with 'mxoid launch', or on each "
    "server host with 'python -m mxoid.distributed.launch --role server' and DMLC_ROLE unset"
)
UNEQUAL_STEPS = (
    "workers would take unequal numbers of steps per epoch ({counts}); dist_sync would then "
    "hang when the shortest worker stops pushing. Give every worker the same number of "
    "batches: shard the data with mxoid.shard(...), or wrap each worker's "
    "iterator in mx.io.ResizeIter(iterator, size=steps)"
)
UNKNOWN_STEPS = (
    "cannot count the batches per epoch of {kinds}, so mxoid cannot check that every worker "
    "takes the same number of steps (unequal counts hang dist_sync). Use an mx.io.NDArrayIter "
    "(e.g. from mxoid.shard) or wrap the iterator in mx.io.ResizeIter"
)
DIFFERENT_CHECKPOINTS = (
    "the workers would resume from different checkpoints ({choices}); every worker must read "
    "the one checkpoint rank 0 wrote. Put the checkpoint directory on a file system every "
    "host shares (or copy rank 0's checkpoint folder to the same path on every host) and "
    "give every worker the same resume_from"
)
_JSON_CHUNK = 1 << 16  # float64 values an allgather_json call carries at most
_BYTES_PER_VALUE = 3  # 24-bit integers: exact even where the servers hold float32 copies
_PARTS = 3  # a float64's 64 bits travel as three integers below 2^24 (24 + 24 + 16 bits)
_PART_BITS = 24
NOT_SET_UP = (
    "this kvstore has no mxoid servers set up yet: create the MainLoop (or call "
    "set_server_optimizer) before reducing across workers, so that reduction keys are "
    "numbered after the parameters"
)


_told_rank: List[int] = []


def tell_launcher_rank(kvstore: Optional[mx.kvstore.KVStore]) -> None:
    """Tell ``mxoid launch`` the rank of this worker, once: it labels the output with it.

    ps-lite's scheduler assigns the ranks (hosts in descending order of
    their address, then ports ascending), not the launcher; on one host the
    launcher gives the workers ascending ports in launch order, so that
    ranks equal launch indices unless a port was taken meanwhile. The line
    (on stderr, hidden from the output) is written only in a process the
    launcher started, for a distributed kvstore.
    """
    if kvstore is None or not is_distributed(kvstore) or _told_rank:
        return
    if os.environ.get(LAUNCHER_VARIABLE) != "1" or os.environ.get("DMLC_ROLE") != "worker":
        return
    _told_rank.append(kvstore.rank)
    sys.stderr.write(f"{AGENT_TAG}rank {kvstore.rank}\n")
    sys.stderr.flush()


def allgather(kvstore: Optional[mx.kv.KVStore], name: str, values: Any) -> np.ndarray:
    """Return every worker's ``values``, one row per rank; every worker gets the same array.

    A collective call: every worker must make it, in the same order, with
    the same ``name`` and the same number of values. Without a distributed
    kvstore it returns ``values`` as the only row. Every value comes back bit
    for bit (counts above 2^24 included): it travels as three integers below
    2^24, which the servers' float32 arithmetic holds exactly.

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
    rows = _gather_rows(kvstore, name, split_exactly(values.ravel()))
    return join_exactly(rows).reshape((kvstore.num_workers,) + shape)


def split_exactly(values: np.ndarray) -> np.ndarray:
    """Return float64 ``values`` as three times as many integers below 2^24 (exact in float32).

    >>> split_exactly(np.array([2.0**24 + 1])).astype(int).tolist()
    [0, 16, 16752]
    """
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)
    mask = np.uint64((1 << _PART_BITS) - 1)
    parts = [(bits >> np.uint64(_PART_BITS * n)) & mask for n in range(_PARTS)]
    return np.stack(parts, axis=-1).reshape(-1).astype(np.float64)


def join_exactly(rows: np.ndarray) -> np.ndarray:
    """Return the float64 values :func:`split_exactly` made each row of ``rows`` from."""
    ints = rows.astype(np.uint64).reshape(rows.shape[:-1] + (-1, _PARTS))
    bits = np.zeros(ints.shape[:-1], dtype=np.uint64)
    for n in range(_PARTS):
        bits |= ints[..., n] << np.uint64(_PART_BITS * n)
    return bits.view(np.float64)


def _gather_rows(kvstore: mx.kv.KVStore, name: str, values: np.ndarray) -> np.ndarray:
    """Return every worker's 1-d ``values``, one row per rank.

    Exact only for values float32 holds exactly (integers below 2^24): the
    servers' arithmetic is float32.
    """
    size = values.size
    key = _reduction_key(kvstore, name, size)
    rows = np.zeros((kvstore.num_workers, size + 1))
    rows[kvstore.rank, :size] = values
    rows[kvstore.rank, size] = 1.0
    kvstore.push(key, mx.nd.array(rows, dtype=np.float64))
    if is_asynchronous(kvstore):  # each push is applied alone: wait for everybody's
        mx.nd.waitall()
        kvstore._barrier()
    out = mx.nd.zeros(rows.shape, dtype=np.float64)
    kvstore.pull(key, out=out)
    gathered = out.asnumpy()
    if is_asynchronous(kvstore):  # nobody pushes the next round before everybody pulled this one
        kvstore._barrier()
    if not (gathered[:, size] == MERGED).all():
        raise RuntimeError(SERVERS_NOT_MXOID)
    return gathered[:, :size]


def allreduce_sums(kvstore: Optional[mx.kv.KVStore], name: str, values: Any) -> np.ndarray:
    """Sum ``values`` over the workers; every worker gets the same, bit-identical sums.

    The sums are float64 sums, in rank order, of every worker's exact values
    (:func:`allgather`): what one process would compute from the same numbers.

    A collective call, like :func:`allgather`; the result has the shape of
    ``values``. :func:`prepare_workers` makes it the ``reduce`` of the metric
    extensions, so that evaluation sums and counts are summed over the
    workers before the division. Without a distributed kvstore it returns
    ``values`` (as float64).

    Examples
    --------
    .. code-block:: python

        loss_sum, count = allreduce_sums(loop.kvstore, "valid_loss", [loss_sum, count])
    """
    return allgather(kvstore, name, values).sum(axis=0)


def allgather_json(kvstore: Optional[mx.kv.KVStore], name: str, value: Any) -> List[Any]:
    """Return every worker's ``value`` (plain JSON-ready data), in rank order.

    A collective call, like :func:`allgather`: every worker must make it, in
    the same order, with the same ``name``; the values may differ in size.
    The JSON text travels as 3 bytes per value (exactly: the servers may
    update float32 copies of float64 arrays), first its length,
    then in calls of at most 65536 values (the kvstore never splits them
    across servers); sizes are rounded up to powers of two, so few reduction
    keys are ever created. Without a distributed kvstore it returns ``[value]``.
    """
    if not is_distributed(kvstore):
        return [value]
    data = json.dumps(value, separators=(",", ":")).encode()
    lengths = [int(n) for n in allgather(kvstore, f"{name}/length", [len(data)])[:, 0]]
    needed = max(1, -(-max(lengths) // _BYTES_PER_VALUE))
    limit = min(_JSON_CHUNK, _BIGARRAY_BOUND // kvstore.num_workers - 2)
    size = min(1 << (limit.bit_length() - 1), 1 << max(6, (needed - 1).bit_length()))
    packed = _pack(data)
    parts = []
    for start in range(0, needed, size):
        part = np.zeros(size)
        piece = packed[start : start + size]
        part[: len(piece)] = piece
        parts.append(_gather_rows(kvstore, f"{name}/json", part))  # already 24-bit integers
    rows = np.concatenate(parts, axis=1)
    return [json.loads(_unpack(row, length)) for row, length in zip(rows, lengths)]


def _pack(data: bytes) -> np.ndarray:
    """Return ``data`` as float64 values, 3 bytes (a 24-bit integer) each."""
    padded = np.frombuffer(data + b"\0" * (-len(data) % _BYTES_PER_VALUE), dtype=np.uint8)
    values = np.zeros(len(padded) // _BYTES_PER_VALUE, dtype=np.uint64)
    for column in padded.reshape(-1, _BYTES_PER_VALUE).T.astype(np.uint64):
        values = (values << np.uint64(8)) | column
    return values.astype(np.float64)


def _unpack(values: np.ndarray, length: int) -> bytes:
    """Return the first ``length`` bytes that :func:`_pack` packed into ``values``."""
    ints = values.astype(np.uint64)
    columns = np.zeros((len(ints), _BYTES_PER_VALUE), dtype=np.uint8)
    for index in range(_BYTES_PER_VALUE - 1, -1, -1):
        columns[:, index] = (ints & np.uint64(0xFF)).astype(np.uint8)
        ints = ints >> np.uint64(8)
    return columns.tobytes()[:length]


def check_same_checkpoint(
    kvstore: mx.kv.KVStore, checkpoint: Optional[Tuple[Optional[str], Any, int, str]]
) -> None:
    """Raise on every worker when the workers would not resume from the same checkpoint.

    A collective call (:func:`allgather_json`). ``checkpoint`` is what this
    worker would resume from: (run, sequence number, batches done, path), or
    None to start anew. Every worker must read the one checkpoint rank 0
    wrote: on a file system they share.

    Raises
    ------
    ValueError
        When they differ (a worker that cannot see rank 0's checkpoints).
    """
    choices = allgather_json(kvstore, "resumed_from", checkpoint)
    if all(_same_checkpoint(choice, choices[0]) for choice in choices):
        return
    described = ", ".join(
        f"rank {rank}: " + ("none (a new run)" if c is None else f"{c[3]} (batch {c[2]})")
        for rank, c in enumerate(choices)
    )
    raise ValueError(DIFFERENT_CHECKPOINTS.format(choices=described))


def _same_checkpoint(one: Any, other: Any) -> bool:
    """Whether two workers' choices name the same checkpoint (its path may differ by host)."""
    if one is None or other is None:
        return one is other
    return list(one[:3]) == list(other[:3])


def _reduction_key(kvstore: mx.kv.KVStore, name: str, size: int) -> str:
    """Return the key of reduction ``name`` with ``size`` values.

    The key is created at first use (collectively).
    """
    if kvstore not in reduction_keys:
        raise RuntimeError(NOT_SET_UP)
    known = reduction_keys[kvstore]
    key = f"{_KEY_PREFIX}{name}/{size}"
    if key not in known:
        if kvstore.num_workers * (size + 1) >= _BIGARRAY_BOUND:
            raise ValueError(
                f"reduction {name!r} is too large ({size} values): the kvstore "
                "would split it across servers"
            )
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
    steps = batches_per_epoch(train_data)
    counts = allgather(kvstore, "steps_per_epoch", -1 if steps is None else steps)
    if is_asynchronous(kvstore):
        return
    if (counts < 0).any():
        if kvstore.rank == 0:
            logger.warning(UNKNOWN_STEPS.format(kinds=type(train_data).__name__))
        return
    if (counts != counts[0]).any():
        described = ", ".join(f"rank {rank}: {int(count)}" for rank, count in enumerate(counts))
        raise ValueError(UNEQUAL_STEPS.format(counts=described))


def pull_parameters(
    kvstore: mx.kv.KVStore, param_names: Sequence[str], param_arrays: List[List[mx.nd.NDArray]]
) -> None:
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


def exit_after_error(error: BaseException, rank: int, during: str = "during training") -> NoReturn:
    """Report ``error`` on stderr and end this worker now.

    The exit status is 1, the code of a ``SystemExit`` (1 for 0: ending alone
    is a failure), or 130 for ``KeyboardInterrupt``.

    A worker that raises would otherwise hang at interpreter exit in
    ps-lite's finalize barrier, waiting for workers that wait for it. Output
    buffers and logging handlers are flushed, then the process ends with
    ``os._exit``; a launcher (``mxoid launch``) then stops the others.
    ``during`` says where, in the message (see :mod:`mxoid.distributed.exits`).
    """
    status = 1
    if isinstance(error, SystemExit):
        # Exiting alone, even with status 0, leaves the other workers waiting for this one.
        status = error.code if isinstance(error.code, int) and error.code else 1
        print(
            f"mxoid: worker of rank {rank} called sys.exit({error.code!r}) {during}; "
            f"exiting with status {status} without waiting for the other workers, which "
            "cannot go on without it",
            file=sys.stderr,
        )
    elif isinstance(error, KeyboardInterrupt):
        status = 128 + 2
        print(
            f"mxoid: worker of rank {rank} was interrupted (KeyboardInterrupt); exiting "
            "without waiting for the other workers",
            file=sys.stderr,
        )
    else:
        traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
        print(
            f"mxoid: worker of rank {rank} failed ({type(error).__name__}: {error}); exiting "
            "without waiting for the other workers",
            file=sys.stderr,
        )
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def agree_to_stop(
    kvstore: mx.kv.KVStore, wants_to_stop: bool, signal_number: int, epoch_interrupt: bool
) -> Optional[Tuple[int, int, bool]]:
    """Tell every worker whether any of them wants to stop; None when none does.

    A collective call (one :func:`allgather`). Otherwise ``(rank, signal, epoch_interrupt)``:
    the first rank that wants to stop, the first signal number any worker received (0 for
    none), and whether any worker received a first Ctrl-C (stop at the end of the epoch).
    """
    rows = allgather(
        kvstore,
        "stop_agreement",
        [float(wants_to_stop), float(signal_number), float(epoch_interrupt)],
    )
    wanting = np.flatnonzero(rows[:, 0])
    if not len(wanting):
        return None
    signals = [int(number) for number in rows[:, 1] if number]
    return int(wanting[0]), (signals[0] if signals else 0), bool(rows[:, 2].any())
