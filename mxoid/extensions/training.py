"""Extensions that change how training proceeds: the learning-rate schedule."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import mxnet as mx

from ..distributed.servers import is_distributed
from ..log.records import LEARNING_RATE
from .base import Extension

if TYPE_CHECKING:  # pragma: no cover
    from ..log import TrainingStatus

__all__ = ["LearningRateSchedule"]


Schedule = Union[mx.lr_scheduler.LRScheduler, Callable[["TrainingStatus"], float]]


class LearningRateSchedule(Extension):
    """Set the optimizer's learning rate before each batch (or epoch) from a schedule.

    The schedule is either an ``mx.lr_scheduler.LRScheduler``, called as the
    optimizer would call it, with the number of the coming update (1 for the
    first batch), or any callable of the loop status (``status.epochs_done``,
    ``status.iterations_done``...) returning the rate. An ``LRScheduler``
    uses its own ``base_lr`` (e.g. ``FactorScheduler(step=100, factor=0.5,
    base_lr=0.1)``): unlike passing it to the optimizer, the optimizer's
    ``learning_rate`` does not overwrite it. ``lr_mult`` settings of the
    optimizer still apply on top of the rate.

    The rate is set with ``optimizer.set_learning_rate`` on the loop's
    optimizer, which is the one that updates the parameters both with a
    local updater and with ``update_on_kvstore`` on a local kvstore (the
    kvstore's updater holds the same object). It also fires when training
    resumes, so a resumed run continues on the schedule.

    The record ``learning_rate`` is written whenever the rate changes (and
    the first time it is set), in the current row: a rate set before batch
    ``i + 1`` lands in row ``i`` (row 0 for the first batch). Between two
    records the rate is the older one.

    Parameters
    ----------
    schedule : mx.lr_scheduler.LRScheduler or callable
    every : {'batch', 'epoch'}, default 'batch'
        Set the rate before every batch or before every epoch.
    **kwargs
        Firing conditions and options of :class:`Extension`.

    Raises
    ------
    ValueError
        When training starts, if the optimizer has its own ``lr_scheduler``
        (it would ignore the rate set here), or if the optimizer runs on the
        servers of a distributed kvstore (``dist_*`` with
        ``update_on_kvstore``): the servers hold a copy of the optimizer that
        this extension cannot reach; use ``update_on_kvstore=False`` there.
        During training, if the schedule returns a negative or non-finite rate.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxoid import LearningRateSchedule
    >>> halving = mx.lr_scheduler.FactorScheduler(step=500, factor=0.5, base_lr=0.1)
    >>> schedule = LearningRateSchedule(halving)
    >>> decay = LearningRateSchedule(lambda status: 0.1 * 0.9 ** status.epochs_done, every="epoch")
    """

    def __init__(self, schedule: Schedule, every: str = "batch", **kwargs: Any) -> None:
        if not callable(schedule):
            raise TypeError(
                f"schedule must be an mx.lr_scheduler.LRScheduler or a callable of the "
                f"loop status, not {type(schedule).__name__}"
            )
        if every not in ("batch", "epoch"):
            raise ValueError(f"every must be 'batch' or 'epoch', got {every!r}")
        self.schedule = schedule
        self.every = every
        self._recorded: Optional[float] = None
        kwargs.setdefault(f"before_{every}", True)
        kwargs.setdefault("on_resumption", True)
        super().__init__(**kwargs)

    def before_training(self) -> None:
        """Check that the rate set here reaches the optimizer, then fire the conditions."""
        self._check_optimizer()
        super().before_training()

    def on_resumption(self) -> None:
        """Check that the rate set here reaches the optimizer, then fire the conditions."""
        self._check_optimizer()
        super().on_resumption()

    def _check_optimizer(self) -> None:
        loop = self.main_loop
        if loop.optimizer.lr_scheduler is not None:
            raise ValueError(
                f"{self.name}: the optimizer has its own lr_scheduler, which would "
                "override the rate set here; give the schedule to one of them only"
            )
        if loop.update_on_kvstore and is_distributed(loop.kvstore):
            raise ValueError(
                f"{self.name}: with kvstore {loop.kvstore.type!r} and "
                "update_on_kvstore the optimizer runs on the servers, out of "
                "reach; pass update_on_kvstore=False to MainLoop"
            )

    def current_rate(self) -> float:
        """Return the rate the schedule gives for the coming batch."""
        status = self.main_loop.status
        if isinstance(self.schedule, mx.lr_scheduler.LRScheduler):
            rate = self.schedule(status.iterations_done + 1)
        else:
            rate = self.schedule(status)
        rate = float(rate)
        if not (math.isfinite(rate) and rate >= 0):
            raise ValueError(
                f"{self.name}: the schedule gave learning rate {rate!r} at iteration "
                f"{status.iterations_done}; it must be finite and >= 0"
            )
        return rate

    def do(self, which_callback: str, *args: Any) -> None:
        """Set the optimizer's rate from the schedule; record it when it changed."""
        rate = self.current_rate()
        self.main_loop.optimizer.set_learning_rate(rate)
        if rate != self._recorded:
            self.main_loop.log.current_row[LEARNING_RATE] = rate
            self._recorded = rate
