"""A progress bar per epoch that counts the batches the engine has computed."""

from __future__ import annotations

import shutil
from time import perf_counter
from typing import IO, Any, Dict, List, Optional, Tuple

import numpy as np
from tqdm import tqdm

from ..data.position import batches_per_epoch
from ..executor_manager.pacing import BatchMarks
from ..log.records import format_value
from .base import Extension

__all__ = ["ProgressBar"]


class ProgressBar(Extension):
    """A tqdm progress bar per epoch, counting computed batches, with the newest records.

    MXNet's engine computes batches after the loop has handed them over, so a count of
    batches handed over runs ahead of the work. The bar counts a batch once its outputs
    are computed on every device, and catches up at most every ``mininterval`` seconds,
    when tqdm would redraw anyway: it then waits for the batch it marked at its previous
    catch-up, counts it and those before it, and marks the current batch (a copy of one
    output element per device, :class:`~mxoid.executor_manager.pacing.BatchMarks`).
    Between catch-ups it does not touch the engine. So the count never includes a batch
    the engine has not computed, trails the loop by the batches handed over since the
    previous catch-up, and the loop never runs further ahead of the engine than that.
    Waiting rarely is what keeps the bar cheap: a wait that blocks costs the Python
    thread 70-150 us of CPU time to sleep and wake up (measured on a 2-core virtual
    machine), and blocking a few times per epoch instead of every few batches took
    60-200 us of host time per batch off the MLP benchmark. ``mininterval=0`` catches up
    at every batch (a count one batch behind the loop, and a wait per batch).

    The bar's length is the number of batches of the previous epoch, or before the first
    epoch ends, what the training iterator says (see
    :func:`~mxoid.data.position.batches_per_epoch`); without either the bar counts
    batches with no total. Numeric records of the current row (Python or NumPy numbers;
    NDArrays are left out, as reading them would wait for the device) are shown after
    the bar, as many as fit the terminal's width, and kept until a newer value comes. At
    the end of each epoch the bar counts every batch and closes; it is closed too when
    training ends, fails or is interrupted. A bar tqdm disables (not on a terminal, or
    ``disable=True``) does not catch up during the epoch.

    Parameters
    ----------
    disable : bool or None, default None
        As tqdm's: ``None`` shows the bar only when ``file`` is a terminal
        (it stays quiet in redirected output and cluster logs), ``False``
        always shows it, ``True`` never.
    file : file object, optional
        Where the bar is drawn; standard error by default.
    mininterval : float, default 0.1
        Seconds between catch-ups (and tqdm's redraws), as tqdm's.
    name, priority, rank_zero_only
        As for :class:`Extension`; the priority is 300 by default, so the
        bar shows the records of the other extensions. Only the worker of
        rank 0 shows a bar.

    Attributes
    ----------
    computed : int
        Batches of the epoch counted so far.

    Examples
    --------
    >>> from mxoid import ProgressBar
    >>> bar = ProgressBar()                # on a terminal only
    >>> bar = ProgressBar(disable=False)   # always
    """

    rank_zero_only = True

    def __init__(
        self,
        *,
        disable: Optional[bool] = None,
        file: Optional[IO[str]] = None,
        mininterval: float = 0.1,
        name: Optional[str] = None,
        priority: float = 300,
        rank_zero_only: Optional[bool] = None,
    ) -> None:
        super().__init__(name=name, priority=priority, rank_zero_only=rank_zero_only)
        if not isinstance(mininterval, (int, float)) or mininterval < 0:
            raise ValueError(f"mininterval must be a number of seconds >= 0, got {mininterval!r}")
        self.disable = disable
        self.file = file
        self.mininterval = float(mininterval)
        self.bar: Optional[tqdm] = None
        self.postfix: Dict[str, str] = {}
        self.computed = 0
        self._epoch_length: Optional[int] = None
        self._caught_up = 0.0  # perf_counter() of the last catch-up (or of the bar's opening)
        self._mark: Optional[Tuple[int, int]] = None  # (mark, batches of the epoch)
        self._marks: Optional[BatchMarks] = None

    def before_epoch(self) -> None:
        """Open a new bar for the epoch, closing the previous one."""
        self._open(initial=0)

    def after_batch(self, batch: Any) -> None:
        """Catch up if ``mininterval`` has passed since the last time, show the records.

        A run resumed in the middle of an epoch opens its bar here, at the
        batches already done in the epoch.
        """
        if self.bar is None:  # resumed in the middle of an epoch
            self._open(initial=self.main_loop.status.iterations_done_in_epoch - 1)
        if self.bar.disable:  # nothing is drawn: nothing to count until the epoch ends
            return
        if perf_counter() - self._caught_up >= self.mininterval:
            self._catch_up()
        self._show_records()

    def after_epoch(self) -> None:
        """Count every batch of the epoch, note its length for the next bar, close the bar."""
        self._epoch_length = self.main_loop.status.iterations_done_in_epoch
        if self.bar is not None:
            self._drain()
            self._show_records()
        self._close()

    def after_training(self) -> None:
        """Count the batches left in flight, then close the bar."""
        if self.bar is not None:
            self._drain()
        self._close()

    def on_interrupt(self) -> None:
        """Count the batches left in flight, then close the bar."""
        self.after_training()

    def on_error(self, exception: BaseException) -> None:
        """Close the bar (without waiting for the engine, which may hold the error)."""
        self._close()

    def _catch_up(self) -> None:
        """Count up to the batch marked last time (waiting for it), then mark this one."""
        if self._mark is not None:
            mark, batches = self._mark
            self._batch_marks().wait(mark)
            self._count(batches - self.computed)
        self._mark = (self._batch_marks().mark(), self.main_loop.status.iterations_done_in_epoch)
        self._caught_up = perf_counter()

    def _batch_marks(self) -> BatchMarks:
        """Return the marks on the loop's outputs (made at the first use)."""
        if self._marks is None:
            self._marks = BatchMarks.of(self.main_loop.manager)
        return self._marks

    def _drain(self) -> None:
        """Wait for the engine (every batch handed over is computed) and count them all.

        ``main_loop.synchronize()``, not a mark and a wait: at the end of an
        epoch another extension has most often waited already (Timing, the
        metrics), and a wait with nothing queued costs nothing, where a new
        mark would wake the engine's idle worker for a copy (hundreds of
        microseconds of the loop's time on a CPU).
        """
        done = self.main_loop.status.iterations_done_in_epoch
        if done > self.computed:
            self.main_loop.synchronize()
            self._count(done - self.computed)
        self._mark = None

    def _count(self, batches: int) -> None:
        if batches > 0:
            self.computed += batches
            self.bar.update(batches)

    def _open(self, initial: int) -> None:
        self._close()
        total = self._epoch_length or batches_per_epoch(self.main_loop.train_data)
        self.computed = initial
        self.bar = tqdm(
            total=total,
            initial=initial,
            file=self.file,
            disable=self.disable,
            mininterval=self.mininterval,
            desc=f"epoch {self.main_loop.status.epochs_done + 1}",
            unit="batch",
            dynamic_ncols=True,
        )
        self._caught_up = perf_counter()
        if self.postfix:
            self.bar.set_postfix_str(self._postfix_text(), refresh=False)

    def _show_records(self) -> None:
        row = self.main_loop.log.get(self.main_loop.status.iterations_done)
        if not row:
            return
        numbers = {
            name: format_value(value)
            for name, value in row.items()
            if isinstance(value, (int, float, np.number)) and not isinstance(value, bool)
        }
        if numbers:
            self.postfix.update(numbers)
            self.bar.set_postfix_str(self._postfix_text(), refresh=False)

    def _postfix_text(self) -> str:
        """Return the records that fit beside a readable bar on this terminal."""
        width = shutil.get_terminal_size((100, 24)).columns
        room = max(0, width - 60)  # the description, the counts, the times and a bar
        shown: List[str] = []
        for name, value in self.postfix.items():
            item = f"{name}={value}"
            if len(", ".join(shown + [item])) > room:
                break
            shown.append(item)
        return ", ".join(shown)

    def _close(self) -> None:
        self._mark = None
        if self.bar is not None:
            self.bar.close()
            self.bar = None
