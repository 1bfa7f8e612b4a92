"""Writing log records as TensorBoard scalars (with tensorboardX)."""

from __future__ import annotations

import fnmatch
import itertools
import os
import time
from typing import Any, Dict, Optional, Sequence, Set

from ..log.records import plain_value
from .base import Extension

__all__ = ["TENSORBOARD_EXTRA", "TensorBoard"]

_FILES = itertools.count(1)  # tells apart the files a process starts in the same second

TENSORBOARD_EXTRA = (
    "TensorBoard needs tensorboardX, which is not installed: "
    "pip install 'mxoid[tensorboard]' (or: pip install tensorboardX)"
)


class TensorBoard(Extension):
    """Write the numeric records of the log to TensorBoard event files, as training goes.

    Every record holding a number (Python, NumPy or a one-element NDArray;
    not a bool, a string or an array) becomes a scalar whose tag is the
    record name and whose step is the iteration of its row
    (``status.iterations_done`` when it was written): ``valid_accuracy``
    written after epoch 3 of 100 batches is the point (300, value) of the
    tag ``valid_accuracy``. Records written after an epoch are written and
    flushed at once, so TensorBoard shows them during training; others when
    the next batch is done, and the rest when training ends or fails. Each
    value is written once. Writes are synchronous (tensorboardX's
    ``EventsWriter``, no background thread), so a flush means the events
    are in the file.

    Each run (and each resumption) starts a new event file. On resumption
    from a checkpoint, the file starts with a restart marker at the resumed
    iteration, as ``SummaryWriter(purge_step=...)`` writes it, so that
    TensorBoard discards what the interrupted run wrote from there on
    instead of drawing it twice. Only the worker of rank 0 writes.

    Needs tensorboardX (``pip install 'mxoid[tensorboard]'``); view the
    files with ``tensorboard --logdir LOGDIR``.

    Parameters
    ----------
    logdir : str or path-like
        The folder of the event files; created if needed.
    records : sequence of str, optional
        Names or shell patterns (``'valid_*'``) of the records to write;
        every numeric record by default.
    flush_secs : float, default 30
        Also flush when this many seconds passed since the last flush (checked
        after each batch); files are flushed after every epoch anyway.
    name, priority, rank_zero_only
        As for :class:`Extension`; the priority is 1000 by default, as for the
        log writers, so that each row holds what every other extension wrote.

    Raises
    ------
    ImportError
        At construction, naming the extra to install, when tensorboardX is missing.

    Attributes
    ----------
    writer : tensorboardX.event_file_writer.EventsWriter or None
        The event file, open while training runs.

    Examples
    --------
    .. code-block:: python

        MainLoop(net, train, extensions=[FinishAfter(after_n_epochs=10),
                                         Evaluate({"valid": valid}, "acc"),
                                         TensorBoard("runs/tb")])
    """

    rank_zero_only = True

    def __init__(
        self,
        logdir: os.PathLike[str] | str,
        records: Optional[Sequence[str]] = None,
        *,
        flush_secs: float = 30,
        name: Optional[str] = None,
        priority: float = 1000,
        rank_zero_only: Optional[bool] = None,
    ) -> None:
        try:
            from tensorboardX import summary
            from tensorboardX.event_file_writer import EventsWriter
            from tensorboardX.proto import event_pb2
        except ImportError:
            raise ImportError(TENSORBOARD_EXTRA) from None
        if isinstance(records, str):
            records = [records]
        super().__init__(name=name, priority=priority, rank_zero_only=rank_zero_only)
        self.logdir = os.fspath(logdir)
        self.records = list(records) if records is not None else None
        self.flush_secs = flush_secs
        self.writer: Optional[Any] = None
        self._events_writer, self._summary, self._event_pb2 = EventsWriter, summary, event_pb2
        self._flushed = 0.0
        self._next_row = 0  # rows before this one are written in full
        self._written: Set[str] = set()  # records of row _next_row already written

    # ------------------------------------------------------------------ hooks
    def before_training(self) -> None:
        """Start a new event file."""
        self._open(purge_step=None)

    def on_resumption(self) -> None:
        """Start a new event file, beginning with a restart marker at the resumed iteration."""
        self._open(purge_step=self.main_loop.status.iterations_done)

    def after_batch(self, batch: Any) -> None:
        """Write the rows before the current one, and flush if ``flush_secs`` have passed."""
        done = self.main_loop.status.iterations_done
        if done > self._next_row:
            self._write_rows(until=done)
        if time.monotonic() - self._flushed >= self.flush_secs:
            self._flush()

    def after_epoch(self) -> None:
        """Write the rows up to the current one (which may still get records), and flush."""
        self._write_rows(until=self.main_loop.status.iterations_done + 1, partial=True)
        self._flush()

    def on_interrupt(self) -> None:
        """Flush the event file."""
        self._flush()

    def after_training(self) -> None:
        """Write the rows not yet written, and close the event file."""
        self._finish()

    def on_error(self, exception: BaseException) -> None:
        """Write the rows not yet written, and close the event file."""
        self._finish()

    # ---------------------------------------------------------------- writing
    def _open(self, purge_step: Optional[int]) -> None:
        self._close()
        os.makedirs(self.logdir, exist_ok=True)
        # TensorBoard reads the files in name order: the second they were
        # started, then (within a process) the order they were started in.
        self.writer = self._events_writer(
            os.path.join(self.logdir, "events"), f".{os.getpid()}.{next(_FILES):06d}.mxoid"
        )
        if purge_step is not None:
            self.writer.write_event(
                self._event_pb2.Event(
                    wall_time=time.time(),
                    step=purge_step,
                    session_log=self._event_pb2.SessionLog(status=self._event_pb2.SessionLog.START),
                )
            )
        self._flush()
        self._next_row = self.main_loop.status.iterations_done
        self._written = set()

    def _write_rows(self, until: int, partial: bool = False) -> None:
        """Write rows ``_next_row`` to ``until - 1``.

        With ``partial``, the last of them may still get records, so it stays
        the next row.
        """
        if self.writer is None:
            return
        log = self.main_loop.log
        for iteration in range(self._next_row, until):
            if iteration in log:
                self._write_row(iteration, log[iteration])
            if not (partial and iteration == until - 1):
                self._next_row, self._written = iteration + 1, set()

    def _write_row(self, iteration: int, row: Dict[str, Any]) -> None:
        for name, value in row.items():
            if name in self._written or not self._wanted(name):
                continue
            number = _number(value)
            if number is not None:
                self.writer.write_event(
                    self._event_pb2.Event(
                        wall_time=time.time(),
                        step=iteration,
                        summary=self._summary.scalar(name, number),
                    )
                )
                if iteration == self._next_row:
                    self._written.add(name)

    def _wanted(self, name: str) -> bool:
        return self.records is None or any(
            fnmatch.fnmatchcase(name, pattern) for pattern in self.records
        )

    def _finish(self) -> None:
        if self.writer is None:
            return
        try:
            last = max(list(self.main_loop.log) + [self._next_row])
            self._write_rows(until=last + 1)
        finally:
            self._close()

    def _flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()
        self._flushed = time.monotonic()

    def _close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _number(value: Any) -> Optional[float]:
    """Return the record as a float when it holds one number (not a bool), else None."""
    if isinstance(value, (str, bool)) or value is None:
        return None
    value = plain_value(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None
