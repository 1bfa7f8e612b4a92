"""Model selection: keeping track of the best value of a record."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

from ..log.records import BEST_ITERATION, BEST_SO_FAR, MISSING, NEW_BEST, RecordReader, to_float
from .base import Extension

__all__ = ["BestValue", "TrackBest"]

MODES = ("min", "max")


class BestValue:
    """The best value seen so far, where lower (``'min'``) or higher (``'max'``) is better.

    A value improves on the best when it beats it by more than ``min_delta``;
    the first number seen is always an improvement, NaN never is.

    Parameters
    ----------
    mode : {'min', 'max'}, default 'min'
    min_delta : float, default 0
        The smallest change that counts as an improvement.

    Attributes
    ----------
    value : float or None
        The best value, None before the first number.
    iteration : int or None
        The iteration (log row) of the best value.
    """

    def __init__(self, mode: str = "min", min_delta: float = 0.0) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        if (
            isinstance(min_delta, bool)
            or not isinstance(min_delta, (int, float))
            or not min_delta >= 0
        ):
            raise ValueError(f"min_delta must be a number >= 0, got {min_delta!r}")
        self.mode = mode
        self.min_delta = float(min_delta)
        self.value: Optional[float] = None
        self.iteration: Optional[int] = None

    def improves(self, value: float) -> bool:
        """Return True when ``value`` beats the best by more than ``min_delta``."""
        if math.isnan(value):
            return False
        if self.value is None:
            return True
        if self.mode == "min":
            return value < self.value - self.min_delta
        return value > self.value + self.min_delta

    def update(self, value: float, iteration: int) -> bool:
        """Keep ``value`` as the best if it improves on it; return whether it did."""
        if not self.improves(value):
            return False
        self.value, self.iteration = value, iteration
        return True

    def state_dict(self) -> Dict[str, Any]:
        """Return the best value and its iteration."""
        return {"value": self.value, "iteration": self.iteration}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.value, self.iteration = state["value"], state["iteration"]


class TrackBest(Extension):
    """Record the best value of a record so far, and the iteration where it was reached.

    Each time ``record`` is written (checked after every epoch by default;
    give ``every_n_batches=N`` or ``after_batch=True`` for records written
    between epochs), writes ``<record>_best_so_far`` (the best value) and
    ``<record>_best_iteration`` (its row in the log) into the current row,
    and ``<record>_new_best = True`` when the value is a new best, as Blocks'
    ``TrackTheBest`` flag: ``OnLogRecord('<record>_new_best')`` is the firing
    condition of an extension that acts on the best model (a checkpoint, for
    instance). Unlike Blocks', ``<record>_best_so_far`` is the value.

    The extension runs at priority 10 by default: after the extensions that
    write records (priority 0), before log writers and checkpoints.

    Parameters
    ----------
    record : str
        E.g. ``'valid_softmax_accuracy'``.
    mode : {'min', 'max'}, default 'min'
        Whether lower or higher is better.
    **kwargs
        Firing conditions and options of :class:`Extension`.

    Attributes
    ----------
    best : BestValue
        ``best.value`` and ``best.iteration``.

    Examples
    --------
    >>> from mxoid import TrackBest
    >>> best = TrackBest("valid_accuracy", mode="max")
    >>> best.new_best_name
    'valid_accuracy_new_best'
    """

    def __init__(self, record: str, mode: str = "min", **kwargs: Any) -> None:
        self.reader = RecordReader(record)
        self.best = BestValue(mode)
        self.best_so_far_name = record + BEST_SO_FAR
        self.best_iteration_name = record + BEST_ITERATION
        self.new_best_name = record + NEW_BEST
        kwargs.setdefault("priority", 10)
        kwargs.setdefault("after_epoch", True)
        kwargs.setdefault("on_resumption", True)
        super().__init__(**kwargs)

    @property
    def record_names(self) -> List[str]:
        """``<record>_new_best``, ``<record>_best_so_far`` and ``<record>_best_iteration``."""
        return [self.new_best_name, self.best_so_far_name, self.best_iteration_name]

    def do(self, which_callback: str, *args: Any) -> None:
        """Take a new value of the record, if any, and write the best so far into the row.

        ``<record>_new_best`` is written too when the value improved on the best.
        """
        log = self.main_loop.log
        value = self.reader.read(log)
        if value is MISSING:
            return
        if self.best.update(to_float(value, self.reader.name), log.status.iterations_done):
            log.current_row[self.new_best_name] = True
        if self.best.value is not None:
            log.current_row[self.best_so_far_name] = self.best.value
            log.current_row[self.best_iteration_name] = self.best.iteration

    def state_dict(self) -> Dict[str, Any]:
        """Return the best value, its iteration and the row last checked."""
        return {**self.best.state_dict(), "checked_iteration": self.reader.checked_iteration}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.best.load_state_dict(state)
        self.reader.checked_iteration = state["checked_iteration"]
