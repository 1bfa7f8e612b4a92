"""Extensions that change how training proceeds: the learning rate, by schedule or on a plateau."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Union

import mxnet as mx

from ..distributed.servers import is_distributed
from ..log.records import LEARNING_RATE, MISSING, RecordReader, to_float
from .base import Extension
from .selection import BestValue

if TYPE_CHECKING:  # pragma: no cover
    from ..log import TrainingStatus

__all__ = ["LearningRateSchedule", "ReduceLROnPlateau", "check_rate_is_settable"]


def check_rate_is_settable(extension: Extension) -> None:
    """Raise when ``extension`` cannot set its loop's learning rate.

    Raises
    ------
    ValueError
        When the optimizer has its own ``lr_scheduler`` (it would override the
        rate), or runs on the servers of a distributed kvstore (out of reach).
    """
    loop = extension.main_loop
    if loop.optimizer.lr_scheduler is not None:
        raise ValueError(
            f"{extension.name}: the optimizer has its own lr_scheduler, which would "
            "override the rate set here; give the schedule to one of them only"
        )
    if loop.update_on_kvstore and is_distributed(loop.kvstore):
        raise ValueError(
            f"{extension.name}: with kvstore {loop.kvstore.type!r} and "
            "update_on_kvstore the optimizer runs on the servers, out of "
            "reach; pass update_on_kvstore=False to MainLoop"
        )


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
        check_rate_is_settable(self)

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


class ReduceLROnPlateau(Extension):
    """Lower the learning rate when a record has stopped improving, as Keras' and PyTorch's.

    Each time ``record`` is written (checked after every epoch by default),
    its value is compared with the best so far (the rule of
    :class:`~mxoid.extensions.selection.BestValue`: better by more than
    ``min_delta``). After ``patience`` checks in a row without improvement the
    rate becomes ``max(rate * factor, min_lr)``, then ``cooldown`` checks pass
    before the count starts again. The new rate is recorded as
    ``learning_rate``. The extension's state (best value, counts) is carried
    by checkpoints, so a resumed run lowers the rate when the uninterrupted
    one would. It runs at priority 10 by default, after the extensions that
    write records.

    Parameters
    ----------
    record : str
        E.g. ``'valid_cross_entropy'``.
    factor : float, default 0.1
        What the rate is multiplied by, between 0 and 1.
    patience : int, default 10
        Checks without improvement before lowering the rate.
    mode : {'min', 'max'}, default 'min'
    min_delta : float, default 0
    cooldown : int, default 0
        Checks after a reduction during which the count does not run.
    min_lr : float, default 0
        The rate never goes below it.
    **kwargs
        Firing conditions and options of :class:`Extension`.

    Examples
    --------
    >>> from mxoid import ReduceLROnPlateau
    >>> plateau = ReduceLROnPlateau("valid_cross_entropy", factor=0.5, patience=3, min_lr=1e-4)
    """

    def __init__(
        self,
        record: str,
        factor: float = 0.1,
        patience: int = 10,
        mode: str = "min",
        min_delta: float = 0.0,
        cooldown: int = 0,
        min_lr: float = 0.0,
        **kwargs: Any,
    ) -> None:
        if not 0 < factor < 1:
            raise ValueError(f"factor must be between 0 and 1, got {factor!r}")
        for name, value in (("patience", patience), ("cooldown", cooldown)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if not min_lr >= 0:
            raise ValueError(f"min_lr must be >= 0, got {min_lr!r}")
        kwargs.setdefault("priority", 10)
        kwargs.setdefault("after_epoch", True)
        super().__init__(**kwargs)
        self.reader = RecordReader(record, owner=self.name)
        self.best = BestValue(mode, min_delta)
        self.factor, self.patience, self.cooldown, self.min_lr = factor, patience, cooldown, min_lr
        self.checks_without_improvement = 0
        self.cooldown_left = 0

    def before_training(self) -> None:
        """Check that the learning rate can be set, then fire the conditions."""
        check_rate_is_settable(self)
        super().before_training()

    def on_resumption(self) -> None:
        """Check that the learning rate can be set, then fire the conditions."""
        check_rate_is_settable(self)
        super().on_resumption()

    def do(self, which_callback: str, *args: Any) -> None:
        """Take a new value of the record, and lower the rate after ``patience`` without gain."""
        log = self.main_loop.log
        value = self.reader.read(log)
        if value is MISSING:
            return
        # Keras' rule: a check in the cooldown counts for nothing.
        cooling = self.cooldown_left > 0
        if cooling:
            self.cooldown_left -= 1
            self.checks_without_improvement = 0
        if self.best.update(to_float(value, self.reader.name), log.status.iterations_done):
            self.checks_without_improvement = 0
        elif not cooling:
            self.checks_without_improvement += 1
            if self.checks_without_improvement >= self.patience:
                self._reduce()

    def _reduce(self) -> None:
        optimizer = self.main_loop.optimizer
        rate = max(optimizer.learning_rate * self.factor, self.min_lr)
        if rate < optimizer.learning_rate:
            optimizer.set_learning_rate(rate)
            self.main_loop.log.current_row[LEARNING_RATE] = rate
        self.checks_without_improvement = 0
        self.cooldown_left = self.cooldown

    def state_dict(self) -> Dict[str, Any]:
        """Return the best value, the counts and the row last checked.

        The rate itself is the optimizer's, saved with it.
        """
        return {
            **self.best.state_dict(),
            "checks_without_improvement": self.checks_without_improvement,
            "cooldown_left": self.cooldown_left,
            "checked_iteration": self.reader.checked_iteration,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.best.load_state_dict(state)
        self.checks_without_improvement = state["checks_without_improvement"]
        self.cooldown_left = state["cooldown_left"]
        self.reader.checked_iteration = state["checked_iteration"]
