"""Extensions that end training: limits, early stopping, and a guard against NaN."""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Dict, List, Optional, Sequence, Union

import mxnet as mx
import numpy as np

from ..log.records import MISSING, NAN_DETECTED, RecordReader, counted, plain_value, to_float
from .base import Extension
from .selection import BestValue

__all__ = ["EarlyStopping", "FinishAfter", "NaNGuard"]

logger = logging.getLogger(__name__)


class FinishAfter(Extension):
    """Stop training after a number of epochs or batches, or after some time.

    The limits are checked with ``>=``, after every epoch (or batch) and when
    training resumes, so a run resumed past its limit trains no more and one
    resumed with a raised limit goes on to it. Any one limit is enough; with
    several, the first reached stops training.

    Parameters
    ----------
    after_n_epochs : int, optional
        Stop once this many epochs are done.
    after_n_batches : int, optional
        Stop once this many batches are done, in the middle of an epoch if
        need be.
    seconds : float, optional
        Stop after the first batch that ends this many seconds (wall clock)
        after training started. Time spent before a checkpoint counts after
        resumption (it is part of :meth:`state_dict`); the time between the
        interrupted run and the resumed one does not.
    **kwargs
        Other firing conditions and options of :class:`Extension`.

    Examples
    --------
    >>> from mxoid import FinishAfter
    >>> ten_epochs = FinishAfter(after_n_epochs=10)
    >>> an_hour = FinishAfter(seconds=3600)
    """

    stops_training = True

    def __init__(
        self,
        after_n_epochs: Optional[int] = None,
        after_n_batches: Optional[int] = None,
        seconds: Optional[float] = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("before_training", True)
        kwargs.setdefault("on_resumption", True)
        if after_n_epochs is not None:
            kwargs.setdefault("after_epoch", True)
        if after_n_batches is not None or seconds is not None:
            kwargs.setdefault("after_batch", True)
        # First, so that a misspelt keyword (after_n_epoch=2) is named, as for any extension.
        super().__init__(**kwargs)
        if after_n_epochs is None and after_n_batches is None and seconds is None:
            raise ValueError("FinishAfter needs after_n_epochs, after_n_batches or seconds")
        for name, value in (
            ("after_n_epochs", after_n_epochs),
            ("after_n_batches", after_n_batches),
        ):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        if seconds is not None and (
            isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0
        ):
            raise ValueError(f"seconds must be a positive number, got {seconds!r}")
        self.epoch_limit = after_n_epochs
        self.batch_limit = after_n_batches
        self.time_limit = seconds
        self._seconds_before = 0.0
        self._started: Optional[float] = None

    @property
    def planned_epochs(self) -> Optional[int]:
        """``after_n_epochs`` (:attr:`epoch_limit`, which may be raised before ``run()`` again)."""
        return self.epoch_limit

    def seconds_elapsed(self) -> float:
        """Seconds of training so far, including those before a resumption."""
        running = 0.0 if self._started is None else time.monotonic() - self._started
        return self._seconds_before + running

    def do(self, which_callback: str, *args: Any) -> None:
        """Request a stop when a limit is reached; start the clock when training (re)starts."""
        if which_callback in ("before_training", "on_resumption"):
            self._started = time.monotonic()
        status = self.main_loop.status
        if self.epoch_limit is not None and status.epochs_done >= self.epoch_limit:
            self.main_loop.request_stop(
                f"{self.name}: {counted(status.epochs_done, 'epoch')} done", every_rank=True
            )
        elif self.batch_limit is not None and status.iterations_done >= self.batch_limit:
            self.main_loop.request_stop(
                f"{self.name}: {counted(status.iterations_done, 'batch')} done", every_rank=True
            )
        elif self.time_limit is not None and self.seconds_elapsed() >= self.time_limit:
            self.main_loop.request_stop(
                f"{self.name}: time limit of {self.time_limit:g} s reached "
                f"({self.seconds_elapsed():.1f} s of training)"
            )

    def state_dict(self) -> Dict[str, Any]:
        """Return the seconds of training so far."""
        return {"seconds_elapsed": self.seconds_elapsed()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned; the clock restarts at resumption."""
        self._seconds_before = float(state.get("seconds_elapsed", 0.0))
        self._started = None


class EarlyStopping(Extension):
    """Stop training once a record has not improved for ``patience`` checks in a row.

    As Keras' and Ignite's ``EarlyStopping``: each time ``record`` is
    written (checked after every epoch by default; give
    ``every_n_batches=N`` or ``after_batch=True`` for records written
    between epochs), its value is compared with the best so far. An
    improvement resets the count of checks without one; when that count
    reaches ``patience``, a stop is requested and the reason (record, best
    value and its iteration, count) lands in the log as
    ``training_finish_requested``. NaN is never an improvement.

    Its state (best value, count, row last checked) is carried by
    checkpoints. On resumption it checks the record of the current row if
    it has not yet, and stops again if the count had already reached
    ``patience``. It runs at priority 10 by default, after the extensions
    that write records (priority 0).

    Parameters
    ----------
    record : str
        E.g. ``'valid_cross_entropy'``.
    patience : int
        Checks without improvement before stopping, at least 1.
    mode : {'min', 'max'}, default 'min'
        Whether lower or higher is better.
    min_delta : float, default 0
        The smallest change that counts as an improvement.
    **kwargs
        Firing conditions and options of :class:`Extension`.

    Attributes
    ----------
    best : BestValue
    checks_without_improvement : int

    Examples
    --------
    >>> from mxoid import EarlyStopping
    >>> stopper = EarlyStopping("valid_accuracy", patience=5, mode="max")
    """

    stops_training = True

    def __init__(
        self, record: str, patience: int, mode: str = "min", min_delta: float = 0.0, **kwargs: Any
    ) -> None:
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"patience must be an int >= 1, got {patience!r}")
        self.reader = RecordReader(record, owner=kwargs.get("name") or type(self).__name__)
        self.best = BestValue(mode, min_delta)
        self.patience = patience
        self.checks_without_improvement = 0
        kwargs.setdefault("priority", 10)
        kwargs.setdefault("after_epoch", True)
        kwargs.setdefault("on_resumption", True)
        super().__init__(**kwargs)

    def do(self, which_callback: str, *args: Any) -> None:
        """Compare a new value of the record with the best; stop when patience runs out."""
        log = self.main_loop.log
        value = self.reader.read(log)
        if value is not MISSING:
            if self.best.update(to_float(value, self.reader.name), log.status.iterations_done):
                self.checks_without_improvement = 0
            else:
                self.checks_without_improvement += 1
        if self.checks_without_improvement >= self.patience:
            self.main_loop.request_stop(self._reason())

    def _reason(self) -> str:
        record, count = self.reader.name, self.checks_without_improvement
        if self.best.value is None:
            return f"{self.name}: {record} has had no numeric value in {count} checks"
        return (
            f"{self.name}: {record} has not improved on {self.best.value:.6g} "
            f"(iteration {self.best.iteration}) for {count} checks "
            f"(patience {self.patience}, min_delta {self.best.min_delta:g})"
        )

    def state_dict(self) -> Dict[str, Any]:
        """Return the best value and its iteration, the count and the row last checked."""
        return {
            **self.best.state_dict(),
            "checks_without_improvement": self.checks_without_improvement,
            "checked_iteration": self.reader.checked_iteration,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.best.load_state_dict(state)
        self.checks_without_improvement = state["checks_without_improvement"]
        self.reader.checked_iteration = state["checked_iteration"]


class NaNGuard(Extension):
    """Stop training as soon as a record, or a parameter, is NaN or infinite.

    Each time one of ``records`` is written (checked after every epoch by
    default; give ``every_n_batches=N`` or ``after_batch=True`` for records
    written between epochs), its value, or every element of an array, must
    be finite. If not, NaNGuard writes the record ``nan_detected`` (the name
    of the record or parameter) into the current row, logs an error and
    requests a stop whose reason names the record and the iteration. A
    checkpoint running after it in the same hook must not save when the row
    holds ``nan_detected`` (:class:`~mxoid.extensions.Checkpoint` does not);
    NaNGuard runs at priority 5 by default, after the extensions that write
    records (priority 0) and before checkpoints (200). So that no NaN
    reaches a checkpoint, check at least whenever one is saved (e.g. the
    same ``every_n_batches``).

    By default (``check_parameters=True``) it also checks every parameter
    and auxiliary state (on every device) each time it fires, after waiting
    for the training step in flight (:meth:`MainLoop.synchronize`): one
    reduction per array on the devices and one read of the flags. This
    catches a network gone NaN while its loss record still looks finite
    (NaN inputs, for instance). ``NaNGuard()`` alone checks the parameters
    after every epoch.

    Parameters
    ----------
    records : str or sequence of str, optional
        E.g. ``'train_cross_entropy'``.
    check_parameters : bool, default True
    **kwargs
        Firing conditions and options of :class:`Extension`.

    Examples
    --------
    >>> from mxoid import NaNGuard
    >>> guard = NaNGuard("train_cross_entropy", every_n_batches=50)
    """

    stops_training = True

    def __init__(
        self, records: Union[str, Sequence[str]] = (), check_parameters: bool = True, **kwargs: Any
    ) -> None:
        names = [records] if isinstance(records, str) else list(records)
        if not names and not check_parameters:
            raise ValueError("NaNGuard needs records to watch or check_parameters=True")
        owner = kwargs.get("name") or type(self).__name__
        self.readers = [RecordReader(name, owner=owner) for name in names]
        self.check_parameters = check_parameters
        kwargs.setdefault("priority", 5)
        kwargs.setdefault("after_epoch", True)
        super().__init__(**kwargs)

    @property
    def record_names(self) -> List[str]:
        """``nan_detected``."""
        return [NAN_DETECTED]

    def do(self, which_callback: str, *args: Any) -> None:
        """Check the records' new values, then the parameters; stop at the first non-finite one."""
        log = self.main_loop.log
        for reader in self.readers:
            value = reader.read(log)
            if value is not MISSING and not _all_finite(value, reader.name):
                self._stop(reader.name, f"record {reader.name!r} is {plain_value(value)!r}")
                return
        if self.check_parameters:
            name = self._non_finite_parameter()
            if name is not None:
                self._stop(name, f"parameter {name!r} holds NaN or infinite values")

    def _non_finite_parameter(self) -> Optional[str]:
        loop = self.main_loop
        manager = loop.manager
        # Parameters are the same on every device; auxiliary states are each device's own.
        entries = [
            (name, copies[:1]) for name, copies in zip(manager.param_names, manager.param_arrays)
        ]
        entries += list(zip(manager.aux_names, manager.aux_arrays))
        if not entries:
            return None
        loop.synchronize()
        flags = [
            mx.nd.concat(
                *[mx.nd.contrib.isfinite(array).min().reshape((1,)) for array in copies], dim=0
            ).min()
            for _, copies in entries
        ]
        for (name, _), finite in zip(entries, mx.nd.concat(*flags, dim=0).asnumpy()):
            if not finite:
                return name
        return None

    def _stop(self, name: str, what: str) -> None:
        status = self.main_loop.status
        self.main_loop.log.current_row[NAN_DETECTED] = name
        message = (
            f"{self.name}: {what} at iteration {status.iterations_done} "
            f"({counted(status.epochs_done, 'epoch')} done); training stops"
        )
        logger.error(message)
        self.main_loop.request_stop(message)


def _all_finite(value: Any, name: str) -> bool:
    value = plain_value(value)
    if isinstance(value, list):
        return bool(np.all(np.isfinite(np.asarray(value, dtype=float))))
    return math.isfinite(to_float(value, name))
