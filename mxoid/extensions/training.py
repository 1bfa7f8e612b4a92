"""Extensions that change how training proceeds: the learning rate, the gradients.

The rate by schedule or on a plateau; the gradients clipped by their global norm.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Union

import mxnet as mx

from ..distributed.servers import is_distributed
from ..log.records import GRADIENT_NORM, LEARNING_RATE, MISSING, RecordReader, to_float
from .base import Extension
from .selection import BestValue

if TYPE_CHECKING:  # pragma: no cover
    from ..log import TrainingStatus

__all__ = [
    "ClipGradientNorm",
    "LearningRateSchedule",
    "ReduceLROnPlateau",
    "check_rate_is_settable",
]


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
    first batch; with ``accumulate_batches`` it counts optimizer steps,
    ``status.updates_done + 1``), or any callable of the loop status (``status.epochs_done``,
    ``status.iterations_done``...) returning the rate. An ``LRScheduler``
    uses its own ``base_lr`` (e.g. ``FactorScheduler(step=100, factor=0.5,
    base_lr=0.1)``): unlike passing it to the optimizer, the optimizer's
    ``learning_rate`` does not overwrite it. ``lr_mult`` settings of the
    optimizer still apply on top of the rate.

    The rate is set with ``optimizer.set_learning_rate`` on the loop's
    optimizer, which is the one that updates the parameters both with a
    local updater and with ``update_on_kvstore`` on a local kvstore (the
    kvstore's updater holds the same object). It also fires when training
    resumes, so a resumed run continues on the schedule: an ``LRScheduler``'s
    own counters and rates are in the checkpoints (:meth:`state_dict`), and
    :mod:`mxoid.schedules` (warmup, Noam, inverse square root, cosine) depend
    on the step alone.

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

    @property
    def record_names(self) -> List[str]:
        """``learning_rate``."""
        return [LEARNING_RATE]

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
            rate = self.schedule(status.updates_done + 1)
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

    def state_dict(self) -> Dict[str, Any]:
        """Return the rate last recorded and an ``LRScheduler``'s own counters and rates.

        MXNet's schedulers change themselves as they are called (``FactorScheduler``'s
        ``base_lr`` and ``count``, ``MultiFactorScheduler``'s ``cur_step_ind``): their
        plain attributes are saved, so a resumed run continues the schedule exactly.
        """
        state: Dict[str, Any] = {"recorded": self._recorded}
        if isinstance(self.schedule, mx.lr_scheduler.LRScheduler):
            state["scheduler"] = {k: v for k, v in vars(self.schedule).items() if _plain(v)}
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self._recorded = state.get("recorded")
        for name, value in state.get("scheduler", {}).items():
            setattr(self.schedule, name, list(value) if isinstance(value, list) else value)


def _plain(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


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

    @property
    def record_names(self) -> List[str]:
        """``learning_rate``."""
        return [LEARNING_RATE]

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


class ClipGradientNorm(Extension):
    """Clip the gradients by their global norm before every optimizer step.

    At ``before_update`` the norm ``||g||`` of every trainable parameter's
    gradient, over the whole network, is computed on the devices, of the
    gradient the optimizer is about to use: the sum over the batch (and the
    devices, the workers, the accumulated batches) times the optimizer's
    ``rescale_grad``, i.e. the gradient of the mean loss. When it exceeds
    ``max_norm`` every gradient is multiplied by ``max_norm / ||g||``, as
    ``gluon.utils.clip_global_norm`` and PyTorch's ``clip_grad_norm_`` do.
    Everything stays on the devices: unlike Gluon's ``clip_global_norm``,
    which reads the norm to the host each call, no batch waits for the engine
    (only a batch whose norm is recorded reads it, after the step).

    With the update on the workers (``update_on_kvstore=False``) the
    gradients are already summed over devices and workers; with a local
    kvstore updating, the devices' gradients are summed on the first device
    for the norm (the kvstore sums the scaled parts). On the servers of a
    distributed kvstore (``dist_*`` with ``update_on_kvstore``) the sum over
    workers is out of reach: that is a ``ValueError`` when the loop attaches
    the extension.

    Parameters
    ----------
    max_norm : float
        Positive.
    record_every : int, optional
        Write the norm (before clipping) as the record ``gradient_norm`` into
        the row of every ``record_every``-th optimizer step's batch.
    **kwargs
        Options of :class:`Extension` (``name``, ``priority``); it acts at
        every step, so firing conditions are not taken.

    Examples
    --------
    >>> from mxoid import ClipGradientNorm
    >>> clip = ClipGradientNorm(max_norm=5.0, record_every=100)
    """

    def __init__(self, max_norm: float, record_every: Optional[int] = None, **kwargs: Any) -> None:
        if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)):
            raise TypeError(f"max_norm must be a number, got {type(max_norm).__name__}")
        if not (math.isfinite(max_norm) and max_norm > 0):
            raise ValueError(f"max_norm must be finite and > 0, got {max_norm!r}")
        if record_every is not None and (
            isinstance(record_every, bool) or not isinstance(record_every, int) or record_every < 1
        ):
            raise ValueError(f"record_every must be an int >= 1 or None, got {record_every!r}")
        super().__init__(**kwargs)
        self.max_norm = float(max_norm)
        self.record_every = record_every
        self._pending: Optional[mx.nd.NDArray] = None

    @property
    def record_names(self) -> List[str]:
        """``gradient_norm``, with ``record_every``."""
        return [GRADIENT_NORM] if self.record_every else []

    def attach(self, loop: Any) -> None:
        """Check that the gradients' sum is within reach, and collect the arrays."""
        super().attach(loop)
        if is_distributed(loop.kvstore) and loop.update_on_kvstore:
            raise ValueError(
                f"{self.name}: with a distributed kvstore updating on the servers the gradients "
                "are summed over the workers out of reach of the workers; pass "
                "update_on_kvstore=False to MainLoop to clip by the global norm"
            )
        manager = loop.manager
        trainable = [grads for grads in manager.grad_arrays if grads[0] is not None]
        self._devices = list(manager.contexts)
        self._by_device = [[grads[k] for grads in trainable] for k in range(len(self._devices))]
        # Where the norm is taken: the first device's gradients hold the sum,
        # unless the kvstore sums them (then each device holds its part).
        self._summed_here = not loop.update_on_kvstore or len(self._devices) == 1

    def before_update(self) -> None:
        """Scale the gradients on every device by ``min(1, max_norm / norm)``."""
        first = self._devices[0]
        if self._summed_here:
            arrays = self._by_device[0]
        else:
            arrays = [
                mx.nd.add_n(*(device[i].as_in_context(first) for device in self._by_device))
                for i in range(len(self._by_device[0]))
            ]
        if not arrays:
            return
        squares = mx.nd.multi_sum_sq(*arrays, num_arrays=len(arrays))
        norm = mx.nd.sqrt(mx.nd.sum(squares)) * self.main_loop.optimizer.rescale_grad
        scale = mx.nd.minimum(self.max_norm / (norm + 1e-12), 1.0)
        for ctx, grads in zip(self._devices, self._by_device):
            factor = scale if ctx == first else scale.as_in_context(ctx)
            for grad in grads:
                grad *= factor
        status = self.main_loop.status
        if self.record_every and (status.updates_done + 1) % self.record_every == 0:
            self._pending = norm

    def after_batch(self, batch: Any) -> None:
        """Write the norm recorded at this batch's step, if any (the one host read)."""
        if self._pending is not None:
            self.main_loop.log.current_row[GRADIENT_NORM] = float(self._pending.asscalar())
            self._pending = None
