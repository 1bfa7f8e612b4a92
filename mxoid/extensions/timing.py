"""Timing: seconds per batch and per epoch, samples per second, total time."""

from __future__ import annotations

from time import perf_counter
from typing import Any, List, Tuple

from ..log.records import (
    SAMPLES_PER_SECOND,
    TIME_EPOCH,
    TIME_PER_BATCH,
    TIME_TOTAL,
    TIMING_RECORDS,
)
from .base import Extension

__all__ = ["Timing"]


class Timing(Extension):
    """Record how long training takes.

    MXNet runs operations asynchronously: the host queues them and moves
    on, so a clock read without waiting measures how fast work is queued,
    not done. Timing waits for the engine (``main_loop.synchronize()``)
    before it reads the clock,
    but only when it writes records (every epoch by default, and every
    ``every_n_batches`` if given) and once when training starts or resumes;
    never per batch unless asked. Records:

    ``time_per_batch``
        Mean seconds per batch: over the epoch after an epoch, over the
        batches since the previous write after ``every_n_batches``.
    ``samples_per_second``
        Over the same batches: batches times the batch size (padding
        included, on this worker) divided by their seconds.
    ``time_epoch``
        Seconds from the start of the epoch (after a resumption in the
        middle of an epoch, from the resumption) to the end of its last
        batch; after epochs only.
    ``time_total``
        Seconds since training started, every extension included; a resumed
        run continues from the newest ``time_total`` in the log.

    Timing runs at priority -50 by default, so the epoch figures leave out
    the end-of-epoch work of other extensions (evaluation, checkpoints);
    ``time_total`` includes it.

    Parameters
    ----------
    **kwargs
        Firing conditions and options of :class:`Extension`, e.g.
        ``every_n_batches=100``.

    Examples
    --------
    >>> from mxoid import Timing
    >>> timing = Timing(every_n_batches=100)
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("priority", -50)
        kwargs.setdefault("after_epoch", True)
        super().__init__(**kwargs)
        self._started = 0.0
        self._total_before = 0.0
        self._epoch_start: Tuple[float, int] = (0.0, 0)
        self._last_write: Tuple[float, int] = (0.0, 0)

    @property
    def record_names(self) -> List[str]:
        """The timing records (:data:`mxoid.log.records.TIMING_RECORDS`)."""
        return list(TIMING_RECORDS)

    def before_training(self) -> None:
        """Wait for the engine and start the clocks, then fire the conditions."""
        self._start(0.0)
        super().before_training()

    def on_resumption(self) -> None:
        """Wait for the engine and start the clocks, then fire the conditions.

        ``time_total`` goes on from the newest ``time_total`` in the log.
        """
        self._start(float(self.main_loop.log.last(TIME_TOTAL, 0.0)))
        super().on_resumption()

    def before_epoch(self) -> None:
        """Note when the epoch starts (without waiting for the engine), then fire the conditions."""
        # No wait: the previous write (at the end of the last epoch) already waited.
        now = perf_counter()
        self._epoch_start = self._last_write = (now, self.main_loop.status.iterations_done)
        super().before_epoch()

    def _start(self, total_before: float) -> None:
        self.main_loop.synchronize()
        self._started = perf_counter()
        self._total_before = total_before
        iterations = self.main_loop.status.iterations_done
        self._epoch_start = self._last_write = (self._started, iterations)

    def do(self, which_callback: str, *args: Any) -> None:
        """Wait for the engine, read the clock and write the timing records into the row."""
        self.main_loop.synchronize()
        now = perf_counter()
        iterations = self.main_loop.status.iterations_done
        row = self.main_loop.log.current_row
        start = self._epoch_start if which_callback == "after_epoch" else self._last_write
        if which_callback == "after_epoch":
            row[TIME_EPOCH] = now - start[0]
        batches = iterations - start[1]
        if batches > 0 and now > start[0]:
            seconds = now - start[0]
            row[TIME_PER_BATCH] = seconds / batches
            row[SAMPLES_PER_SECOND] = batches * self.main_loop.manager.batch_size / seconds
        row[TIME_TOTAL] = self._total_before + now - self._started
        self._last_write = (now, iterations)
