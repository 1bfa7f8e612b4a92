"""A bound on how far the host runs ahead of the devices.

mxoid never waits for the engine in the middle of an epoch, so on a fast host
the Python thread can queue batch after batch long before the devices compute
them. MXNet's engine has no bound of its own, and every batch queued keeps its
input arrays (``NDArrayIter`` copies each batch out of its data, on the
engine) until the devices get to it: a small network on a large in-memory
data set could queue a whole epoch, 100 KB a batch for MNIST at batch 32, a
gigabyte or more for larger inputs. Module.fit with a metric does not run
ahead (it reads every batch's outputs); mxoid keeps its lead, but bounds it.

:class:`Pacer` does it with one small copy and one wait every ``limit / 2``
batches: it copies one element of each device's first output (which the
engine writes once the batch's forward pass is computed) into a token
(:class:`BatchMarks`, which ProgressBar uses too), and before the next copy
waits for the previous token. The host is thus never
more than ``limit`` batches ahead of the devices' forward passes, and a host
that is not ahead (the devices keep up) finds the token computed and does not
block. By default (``'auto'``) the limit is the number of batches that fit in
64 MiB, each counted twice its inputs (:func:`auto_limit`): small batches keep a
long lead and wait rarely, large ones a short lead. Twice, because a queued
batch holds more than its inputs: the iterator's copy waits for the devices,
and the memory of the batches computed meanwhile is not all given back at once
(measured on MLP training from ``NDArrayIter``: 1.2x the inputs per batch of
lead at 100 KB a batch, 1.9x at 400 KB).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Union

import mxnet as mx
import numpy as np

from .invoke import PreparedCall
from .waiting import wait_for

__all__ = [
    "AUTO_LIMITS",
    "BatchMarks",
    "DEFAULT_MAX_BATCHES_AHEAD",
    "QUEUED_BATCH_FACTOR",
    "QUEUED_INPUT_BUDGET",
    "Pacer",
    "auto_limit",
    "check_max_batches_ahead",
]

DEFAULT_MAX_BATCHES_AHEAD = "auto"
"""The default of ``MainLoop(max_batches_ahead=...)``: see :func:`auto_limit`."""
QUEUED_INPUT_BUDGET = 64 * 2**20
"""The memory ``'auto'`` lets the host queue ahead of the devices: 64 MiB."""
QUEUED_BATCH_FACTOR = 2
"""What a queued batch holds, as a multiple of its inputs, in ``'auto'``'s count."""
AUTO_LIMITS = (2, 1024)
"""The least and the most batches ``'auto'`` lets the host queue ahead."""

Limit = Union[int, str, None]


def check_max_batches_ahead(value: Limit) -> Limit:
    """Return ``value`` if it is None, ``'auto'`` or an int of at least 2; raise ``ValueError``."""
    if value is None or value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise ValueError(
            "max_batches_ahead must be an int >= 2, 'auto' (the default) or None (no "
            f"bound), got {value!r}"
        )
    return value


def auto_limit(batch_bytes: int) -> int:
    """Return the batches of ``batch_bytes`` of input each that fit :data:`QUEUED_INPUT_BUDGET`.

    Each counted :data:`QUEUED_BATCH_FACTOR` times its inputs, within
    :data:`AUTO_LIMITS`: 334 batches of MNIST images at batch 32 (100 KB each),
    83 at batch 128, 2 (the least) of ImageNet's 224 x 224 images at batch 32
    (19 MB each), 1024 at most.

    >>> from mxoid.pacing import auto_limit
    >>> auto_limit(32 * 784 * 4), auto_limit(128 * 784 * 4), auto_limit(32 * 3 * 224 * 224 * 4)
    (334, 83, 2)
    >>> auto_limit(10)
    1024
    """
    least, most = AUTO_LIMITS
    held = QUEUED_BATCH_FACTOR * max(1, int(batch_bytes))
    return max(least, min(most, QUEUED_INPUT_BUDGET // held))


def _input_bytes(manager: Any) -> int:
    """Return the bytes of one batch of the manager's inputs (data and labels)."""
    total = 0
    for desc in list(manager.data_descs) + list(manager.label_descs):
        rows = 1
        for size in desc.shape:
            rows *= int(size)
        total += rows * np.dtype(desc.dtype).itemsize
    return total


class BatchMarks:
    """Tokens the engine writes once a batch's forward pass is computed, on every device.

    :meth:`mark` queues, after the work queued so far, a copy of one element of
    each device's output into a token set (two sets, used in turn), and
    returns its position; :meth:`wait` waits for a set. Waiting for a mark
    waits for that batch's forward pass alone, not for the work queued after
    it (``wait_to_read`` on the output itself would). A mark stays valid until
    the second mark after it reuses its set.

    Parameters
    ----------
    outputs : sequence of NDArray
        One output array per device, the one every forward pass writes (the
        executors' bound output arrays).

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxoid.pacing import BatchMarks
    >>> marks = BatchMarks([mx.nd.ones((4, 3))])
    >>> marks.wait(marks.mark())
    """

    def __init__(self, outputs: Sequence[mx.nd.NDArray]) -> None:
        firsts = [array.reshape((-1,))[:1] for array in outputs]  # views, made once
        self._tokens: List[List[mx.nd.NDArray]] = [
            [mx.nd.zeros((1,), first.context, first.dtype) for first in firsts] for _ in range(2)
        ]
        self._copies = [
            [PreparedCall("_copyto", [first], [token]) for first, token in zip(firsts, tokens)]
            for tokens in self._tokens
        ]
        self._next = 0

    @classmethod
    def of(cls, manager: Any) -> BatchMarks:
        """Return marks on ``manager``'s first output (an array per device)."""
        return cls(manager.outputs[manager.output_names[0]])

    def mark(self) -> int:
        """Mark the batch just queued; return the mark's position."""
        position = self._next
        self._next = 1 - position
        for copy in self._copies[position]:
            copy()
        return position

    def wait(self, position: int) -> None:
        """Wait until the batch marked at ``position`` is computed on every device.

        Signals are handled while it waits (:func:`~mxoid.executor_manager.waiting.wait_for`).
        """
        tokens = self._tokens[position]
        wait_for(lambda: [token.wait_to_read() for token in tokens])


class Pacer:
    """Keep the host at most ``limit`` batches ahead of the devices' forward passes.

    Call :meth:`queued` after queuing each batch's forward pass. Every
    ``every``-th batch (``limit // 2``) it calls :meth:`mark`, which waits for
    the token of the mark before (the batch ``every`` batches back), then
    queues a token for this batch. Between marks the host queues ``every - 1``
    more batches, so at most ``limit`` are queued and not yet computed.

    Parameters
    ----------
    outputs : sequence of NDArray
        One output array per device, the one every forward pass writes (the
        executors' bound output arrays).
    limit : int
        At least 2.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxoid.pacing import Pacer
    >>> output = mx.nd.zeros((4, 3))
    >>> pacer = Pacer([output], limit=8)
    >>> pacer.every
    4
    >>> for batch in range(8):
    ...     pacer.queued()  # marks after the 4th and the 8th, waiting for the 4th's token
    """

    def __init__(self, outputs: Sequence[mx.nd.NDArray], limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 2:
            raise ValueError(f"a pacer's limit must be an int >= 2, got {limit!r}")
        self.limit = limit
        self.every = limit // 2
        self._marks = BatchMarks(outputs)
        self._pending: Optional[int] = None
        self._batches = 0

    @classmethod
    def of(cls, manager: Any, limit: Limit) -> Optional[Pacer]:
        """Return a pacer on ``manager``'s first output (an array per device); None for None.

        ``'auto'`` takes :func:`auto_limit` of the manager's batch of inputs.
        """
        if limit is None:
            return None
        if limit == "auto":
            limit = auto_limit(_input_bytes(manager))
        return cls(manager.outputs[manager.output_names[0]], int(limit))

    @classmethod
    def of_training(cls, manager: Any, limit: Limit) -> Optional[Pacer]:
        """Return a pacer on the training passes of ``manager``, whichever executor set runs them.

        Its marks are on each device's first gradient (every executor set,
        a bucket's included, shares it, and every backward pass writes it); on
        the first output where no parameter has a gradient.
        """
        grads = next((g for g in manager.grad_arrays if g[0] is not None), None)
        if limit is None or grads is None:
            return cls.of(manager, limit)
        if limit == "auto":
            limit = auto_limit(_input_bytes(manager))
        return cls(grads, int(limit))

    def queued(self) -> None:
        """Count a batch queued; at every ``every``-th, :meth:`mark`."""
        self._batches += 1
        if self._batches == self.every:
            self._batches = 0
            self.mark()

    def mark(self) -> None:
        """Wait for the previous mark's batch to be computed, then mark the batch just queued."""
        if self._pending is not None:
            self._marks.wait(self._pending)
        self._pending = self._marks.mark()
