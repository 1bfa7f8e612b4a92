"""The loop's counters and flags."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, Iterator, Optional

__all__ = ["TrainingStatus"]


@dataclass
class TrainingStatus(Mapping):
    """Where training stands; the same object is ``loop.status`` and ``loop.log.status``.

    Read it by attribute (``status.epochs_done``) or as a read-only mapping,
    as Blocks' status dict: ``status['epochs_done']``, ``keys()``,
    ``items()``, ``dict(status)``, ``json.dumps(dict(status))``. Only the
    loop and its signal handlers change it, by attribute.

    Counters are already updated when the hooks of that batch or epoch run:
    in ``after_batch`` of the first batch, ``iterations_done == 1``.

    Attributes
    ----------
    iterations_done : int
        Batches trained since the start of training (over all epochs).
    updates_done : int
        Optimizer steps taken: ``iterations_done`` unless gradients are
        accumulated over several batches (``MainLoop(accumulate_batches=k)``)
        or steps were skipped under loss scaling (``skipped_updates``).
    epochs_done : int
        Epochs completed.
    iterations_done_in_epoch : int
        Batches trained in the current epoch.
    epoch_started : bool
        True between ``before_epoch`` and the end of that epoch; stays True
        when training stops in the middle of an epoch.
    training_started, training_finished : bool
    stop_requested : bool
        An extension asked the loop to stop (:meth:`MainLoop.request_stop`).
    stop_reason : str or None
        Why, in the words of the extension that asked.
    epoch_interrupt_received : bool
        A first Ctrl-C arrived: training stops at the end of this epoch.
    interrupted : str or None
        The signal (``'SIGINT'``, ``'SIGTERM'``) that stopped training.
    rank, num_workers : int
        This worker's rank and the number of workers (1 unless distributed).
    loss_scale : float or None
        With loss scaling (``MainLoop(loss_scale=...)``, :mod:`mxoid.loss_scale`): the
        scale of the coming batches; None without.
    skipped_updates : int
        Optimizer steps skipped because a gradient overflowed under loss scaling: not
        counted in ``updates_done`` (as AMP's skipped steps do not advance the optimizer's
        update count, which MXNet's learning rate schedulers follow).
    """

    iterations_done: int = 0
    updates_done: int = 0
    epochs_done: int = 0
    iterations_done_in_epoch: int = 0
    epoch_started: bool = False
    training_started: bool = False
    training_finished: bool = False
    stop_requested: bool = False
    stop_reason: Optional[str] = None
    epoch_interrupt_received: bool = False
    interrupted: Optional[str] = None
    rank: int = 0
    num_workers: int = 1
    loss_scale: Optional[float] = None
    skipped_updates: int = 0

    def state_dict(self) -> Dict[str, Any]:
        """Return the status as a plain dict (JSON-serializable)."""
        return asdict(self)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore counters and flags from :meth:`state_dict`; unknown keys are ignored."""
        for key, value in state.items():
            if key in _FIELDS:
                setattr(self, key, value)

    def __getitem__(self, key: str) -> Any:
        """Blocks-style access: ``status['iterations_done']``."""
        if key not in _FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(_FIELDS)

    def __len__(self) -> int:
        return len(_FIELDS)

    def __contains__(self, key: object) -> bool:
        return key in _FIELDS


_FIELDS = tuple(f.name for f in fields(TrainingStatus))
