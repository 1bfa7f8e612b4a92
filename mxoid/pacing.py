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
engine writes once the batch's forward pass is computed) into a token, and
before the next copy waits for the previous token. The host is thus never
more than ``limit`` batches ahead of the devices' forward passes, and a host
that is not ahead (the devices keep up) finds the token computed and does not
block.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import mxnet as mx

from .invoke import PreparedCall

__all__ = ["DEFAULT_MAX_BATCHES_AHEAD", "Pacer", "check_max_batches_ahead"]

DEFAULT_MAX_BATCHES_AHEAD = 64
"""The default of ``MainLoop(max_batches_ahead=...)``: a wait every 32 batches at most."""


def check_max_batches_ahead(value: Optional[int]) -> Optional[int]:
    """Return ``value`` if it is None or an int of at least 2; raise ``ValueError`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise ValueError(
            f"max_batches_ahead must be an int >= 2 (or None for no bound), got {value!r}"
        )
    return value


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
        check_max_batches_ahead(limit)
        self.limit = limit
        self.every = limit // 2
        firsts = [array.reshape((-1,))[:1] for array in outputs]  # views, made once
        self._tokens: List[List[mx.nd.NDArray]] = [
            [mx.nd.zeros((1,), first.context, first.dtype) for first in firsts] for _ in range(2)
        ]
        self._copies = [
            [PreparedCall("_copyto", [first], [token]) for first, token in zip(firsts, tokens)]
            for tokens in self._tokens
        ]
        self._pending: Optional[int] = None
        self._batches = 0

    @classmethod
    def of(cls, manager: Any, limit: Optional[int]) -> Optional[Pacer]:
        """Return a pacer on ``manager``'s first output (an array per device), or None."""
        if limit is None:
            return None
        return cls(manager.outputs[manager.output_names[0]], limit)

    def queued(self) -> None:
        """Count a batch queued; at every ``every``-th, :meth:`mark`."""
        self._batches += 1
        if self._batches == self.every:
            self._batches = 0
            self.mark()

    def mark(self) -> None:
        """Wait for the previous mark's batch to be computed, then mark the batch just queued."""
        pending = self._pending
        if pending is not None:
            for token in self._tokens[pending]:
                token.wait_to_read()
        position = 0 if pending is None else 1 - pending
        for copy in self._copies[position]:
            copy()
        self._pending = position
