"""The points of training where :class:`~mxoid.extensions.Checkpoint` saves, on every worker.

In distributed training rank 0 writes the checkpoints, and every worker gives
it its own random states and iterator position at each save: a collective
exchange (:meth:`mxoid.MainLoop.gather_rank_states`), which every worker must
make at the same batch, the same number of times, in the same order as its
other exchanges, or the job hangs. :class:`SavePoints` makes it at most once
per point of training (batches and epochs done, in an epoch or at its end),
whichever hooks of the point save, so that the count depends only on where
saves may happen, never on what one worker decided there (a save skipped
because nothing changed, a stop's reason).
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import mxnet as mx

if TYPE_CHECKING:  # pragma: no cover
    from ..log.status import TrainingStatus
    from ..main_loop import MainLoop
    from .base import Extension

__all__ = ["SavePoints", "check_best_everywhere", "counters", "mxnet_seed"]

NOT_EVERYWHERE = (
    "Checkpoint(save_best_of={record!r}): in distributed training every worker takes part in "
    "each save, so the record must be one every worker writes (Evaluate's or "
    "TrainingMonitoring's, summed over the workers); no extension running on every worker "
    "declares it"
)


def counters(status: TrainingStatus) -> List[Any]:
    """Return what tells two saves apart: the same counters, the same state.

    The stop's reason is among them: a signal sets ``interrupted`` during the
    batch whose periodic save then runs, and the loop records the stop (its
    ``training_finish_requested``) only after that batch's hooks, so the save
    on interruption holds more than the periodic one.
    """
    return [
        status.iterations_done,
        status.epochs_done,
        status.epoch_started,
        status.interrupted,
        status.stop_reason,
    ]


def check_best_everywhere(record: Optional[str], extensions: Sequence[Extension]) -> None:
    """Refuse a ``save_best_of`` record that not every worker writes: saves are collective.

    Raises
    ------
    ValueError
        When no extension running on every worker declares ``record``.
    """
    if record is not None and not any(
        record in e.record_names for e in extensions if not e.rank_zero_only
    ):
        raise ValueError(NOT_EVERYWHERE.format(record=record))


def mxnet_seed(status: TrainingStatus) -> int:
    """Return the seed a save gives MXNet: from the counters (and the rank, but rank 0's)."""
    rank = f":{status.rank}" if status.rank else ""
    text = f"{status.iterations_done}:{status.epochs_done}{rank}"
    return zlib.crc32(text.encode()) & 0x7FFFFFFF


class SavePoints:
    """Every worker's own state at the current point of training, gathered once per point."""

    def __init__(self) -> None:
        self._point: Optional[Tuple[int, int, bool]] = None
        self._states: Optional[List[Dict[str, Any]]] = None

    def gather(self, loop: MainLoop) -> Optional[List[Dict[str, Any]]]:
        """Return every worker's state here, by rank (None on one worker).

        The first call at a point gathers (a collective call); a worker other
        than rank 0 then reseeds MXNet with its :func:`mxnet_seed`, as rank 0
        does once it has written the checkpoint.
        """
        status = loop.status
        point = (status.iterations_done, status.epochs_done, bool(status.epoch_started))
        if point != self._point:
            seed = mxnet_seed(status)
            self._states = loop.gather_rank_states(seed)
            self._point = point
            if self._states is not None and status.rank != 0:
                mx.random.seed(seed)
        return self._states
