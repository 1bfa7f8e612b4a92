"""Reading log records from extensions: freshness and conversion to plain Python values.

Extensions that react to a record (:class:`~mxoid.extensions.TrackBest`,
:class:`~mxoid.extensions.EarlyStopping`, :class:`~mxoid.extensions.NaNGuard`)
must read each value once, when it is written, and never count a stale value
again; :class:`RecordReader` does that. Extensions that show or store records
(printing, progress bars, log files) turn NDArrays and NumPy scalars into
Python values with :func:`plain_value`.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import sys
import warnings
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from .training_log import TrainingLog

__all__ = [
    "BEST_CHECKPOINT",
    "BEST_ITERATION",
    "BEST_SO_FAR",
    "CHECKPOINT_SAVED_TO",
    "ERROR",
    "LEARNING_RATE",
    "MARKER_SUFFIXES",
    "MISSING",
    "NAN_DETECTED",
    "NEW_BEST",
    "RESUMED_FROM",
    "SAMPLES_PER_SECOND",
    "TIME_EPOCH",
    "TIME_PER_BATCH",
    "TIME_TOTAL",
    "TIMING_RECORDS",
    "TRAINING_FINISH_REQUESTED",
    "RecordReader",
    "counted",
    "format_seconds",
    "format_value",
    "is_marker",
    "short_name",
    "plain_value",
    "to_float",
]

TRAINING_FINISH_REQUESTED = "training_finish_requested"
"""The record of a stop request: its reason (:meth:`mxoid.MainLoop.request_stop`)."""
CHECKPOINT_SAVED_TO = "checkpoint_saved_to"
"""The record of a checkpoint save: the folder (:class:`~mxoid.extensions.Checkpoint`)."""
NAN_DETECTED = "nan_detected"
"""The record :class:`~mxoid.extensions.NaNGuard` writes: the non-finite record or parameter."""
RESUMED_FROM = "resumed_from"
"""The record a resumed run writes into its first row: the checkpoint it resumed from."""
ERROR = "error"
"""The record of an error that stopped training: its type, message and origin."""
LEARNING_RATE = "learning_rate"
"""The record of :class:`~mxoid.extensions.LearningRateSchedule`: the rate set."""
GRADIENT_NORM = "gradient_norm"
"""Written by ClipGradientNorm: the global norm before clipping."""
MONITOR_PREFIX = "monitor_"
"""Of the records Monitor writes, ``monitor_<array>_<stat>``."""
TIME_PER_BATCH = "time_per_batch"
TIME_EPOCH = "time_epoch"
SAMPLES_PER_SECOND = "samples_per_second"
TIME_TOTAL = "time_total"
TIMING_RECORDS = (TIME_PER_BATCH, TIME_EPOCH, SAMPLES_PER_SECOND, TIME_TOTAL)
"""The records of :class:`~mxoid.extensions.Timing`."""
BEST_SO_FAR = "_best_so_far"
BEST_ITERATION = "_best_iteration"
NEW_BEST = "_new_best"
BEST_CHECKPOINT = "_best_checkpoint"
MARKER_SUFFIXES = (BEST_ITERATION, NEW_BEST, BEST_CHECKPOINT)
"""Endings of records that mark a row rather than measure: ``<record>_best_iteration``,
``<record>_new_best`` (TrackBest), ``<record>_best_checkpoint`` (Checkpoint)."""


def is_marker(name: str) -> bool:
    """Return whether record ``name`` marks a row (a best, a checkpoint) instead of measuring."""
    return name.endswith(MARKER_SUFFIXES)


MISSING = object()
"""Returned by :meth:`RecordReader.read` when there is no new value to read."""


class RecordReader:
    """Reads a record at most once per write, so that no value is counted twice.

    A value is new when it was written in the current row (the row of
    ``log.current_iteration``) and this reader has not read that row yet;
    a record written again in the same row is read once.

    Parameters
    ----------
    name : str
        The record.

    Attributes
    ----------
    checked_iteration : int or None
        The row last read; part of the state of the extensions that use it.
    """

    def __init__(self, name: str, owner: Optional[str] = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a record name must be a non-empty str, got {name!r}")
        self.name = name
        self.owner = owner
        self.checked_iteration: Optional[int] = None
        self._warned = False

    def read(self, log: TrainingLog) -> Any:
        """Return the new value of the record, or :data:`MISSING`; never creates a row.

        The first time it is read after an epoch has ended without the record
        ever having been written, a warning names it and the records with a
        similar name: a mistyped name would otherwise make its extension
        silently check nothing.
        """
        iteration = log.current_iteration
        written = log.last_iteration(self.name)
        if written is None and not self._warned and log.status.epochs_done >= 1:
            self._warn_missing(log)
        if iteration == self.checked_iteration or written != iteration:
            return MISSING
        self.checked_iteration = iteration
        return log.last(self.name)

    def _warn_missing(self, log: TrainingLog) -> None:
        self._warned = True
        names = log.record_names()
        close = difflib.get_close_matches(self.name, names, n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        who = f"{self.owner}: " if self.owner else ""
        warnings.warn(
            f"{who}record {self.name!r} has not been written in the first epoch"
            f"{hint} (the records so far: {names}). Until it is, nothing is checked",
            stacklevel=_first_frame_outside_mxoid(),
        )


def _first_frame_outside_mxoid() -> int:
    """Return the ``stacklevel`` of the first caller outside mxoid, for ``warnings.warn``.

    The user's ``loop.run()`` (or their own extension), however deep the loop's calls are.
    """
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame, level = sys._getframe(2), 2  # level 1: the function that calls warnings.warn
    while frame.f_back is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def plain_value(value: Any) -> Any:
    """Return ``value`` as a plain Python value: bool, int, float, str, None or a list of them.

    NDArrays and NumPy arrays of one element become a Python scalar (an
    NDArray is copied to the host, which waits for it to be computed); larger
    arrays become nested lists. Anything else that is not a plain value
    becomes its ``str``.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "asnumpy"):  # an MXNet NDArray (not imported here: mxoid show needs no MXNet)
        value = value.asnumpy()
    if isinstance(value, np.ndarray):
        return value.item() if value.size == 1 else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [plain_value(item) for item in value]
    return str(value)


def to_float(value: Any, name: str) -> float:
    """Return a record holding one number as a float.

    Raises
    ------
    TypeError
        If the record is not a single number (a string, None, a bool or an
        array of several elements).
    """
    value = plain_value(value)
    if isinstance(value, (bool, str, list)) or value is None:
        raise TypeError(f"record {name!r} must be a single number, got {value!r}")
    return float(value)


def format_value(value: Any, digits: int = 6, zeros: bool = False) -> str:
    """Return a short text for a record value: floats with ``digits`` significant digits.

    ``zeros=True`` keeps the trailing zeros (``0.9300`` rather than ``0.93``).
    A value of more digits before the point is rounded to a whole number, never
    written in e-notation (``12346``, not ``1.235e+04``: samples per second).

    >>> format_value(12345.6, digits=4), format_value(0.93, digits=4, zeros=True)
    ('12346', '0.9300')
    """
    value = plain_value(value)
    if isinstance(value, float) and math.isfinite(value):
        if abs(value) >= 10**digits:
            return f"{value:.0f}"
        return f"{value:{'#' if zeros else ''}.{digits}g}"
    return str(value)


SHORT_NAMES = (
    (re.compile(r"top_k_accuracy_(\d+)$"), r"top\1_acc"),
    (re.compile(r"accuracy$"), "acc"),
    (re.compile(r"cross_entropy$"), "ce"),
    (re.compile(r"perplexity$"), "ppl"),
)
"""How :func:`short_name` shortens the metric at the end of a record's name."""


def short_name(name: str) -> str:
    """Return a record's name as a console line shows it: ``valid_accuracy`` -> ``valid_acc``.

    ``accuracy`` -> ``acc``, ``cross_entropy`` -> ``ce``, ``top_k_accuracy_5`` ->
    ``top5_acc``, ``perplexity`` -> ``ppl``, at the end of the name; others as they are.

    >>> short_name("valid_cross_entropy"), short_name("train_top_k_accuracy_5")
    ('valid_ce', 'train_top5_acc')
    """
    for pattern, replacement in SHORT_NAMES:
        shorter = pattern.sub(replacement, name)
        if shorter != name:
            return shorter
    return name


def format_seconds(seconds: float) -> str:
    """Return a duration as people read it: ``0.31 s``, ``12.3 s``, ``4 min 05 s``, ``2 h 03 min``.

    >>> format_seconds(0.314), format_seconds(12.34), format_seconds(245), format_seconds(7390)
    ('0.31 s', '12.3 s', '4 min 05 s', '2 h 03 min')
    """
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {rest:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def counted(number: int, noun: str) -> str:
    """Return ``'1 epoch'``, ``'2 epochs'``, ``'3 batches'``: a number and its noun."""
    if number == 1:
        return f"{number} {noun}"
    return (
        f"{number} {noun}es"
        if noun.endswith(("ch", "sh", "s", "x")) and noun != "epoch"
        else f"{number} {noun}s"
    )
