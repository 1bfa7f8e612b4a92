"""Writing the training log to files as it grows: JSON lines and CSV.

The formats, and :func:`~mxoid.log_files.read_log` to read them back, are
in :mod:`mxoid.log_files`.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import json
import os
from datetime import datetime
from typing import IO, Any, Dict, Iterator, List, Optional

from ..log import files as log_files
from ..log.files import EPOCHS_DONE, ITERATION, RESERVED_NAMES, RUN
from ..log.records import plain_value
from .base import Extension

__all__ = ["CSVLog", "JSONLinesLog"]

_FIXES = {
    errno.ENOSPC: "free disk space or point the log at another disk",
    errno.EDQUOT: "free space within your disk quota",
    errno.EFBIG: "raise the file size limit (ulimit -f)",
    errno.EROFS: "the file system is read-only: point the log at a writable folder",
}


class _LogFileWriter(Extension):
    """Writes each row of the log once it is complete, one line per row.

    Row ``i`` is complete once the loop has moved past it: rows before the
    current one are written after each batch, and the rest (the current
    row) when training ends or fails. Every write is flushed; with
    ``fsync=True`` it also reaches the disk before training goes on.
    Subclasses open the file for a new run and write a row.
    """

    rank_zero_only = True

    def __init__(
        self,
        path: os.PathLike[str] | str,
        *,
        fsync: bool = False,
        name: Optional[str] = None,
        priority: float = 1000,
        rank_zero_only: Optional[bool] = None,
    ) -> None:
        super().__init__(name=name, priority=priority, rank_zero_only=rank_zero_only)
        self.path = os.fspath(path)
        self.fsync = fsync
        self.file: Optional[IO[str]] = None
        self.run = 0
        self._next_row = 0

    def before_training(self) -> None:
        with self._naming_the_file():
            self._start()

    def on_resumption(self) -> None:
        with self._naming_the_file():
            self._start()

    def after_batch(self, batch: Any) -> None:
        log = self.main_loop.log
        done = self.main_loop.status.iterations_done
        with self._naming_the_file():
            for iteration in range(self._next_row, done):
                if iteration in log:
                    self._write_row(iteration, log[iteration])
        self._next_row = max(self._next_row, done)

    def on_interrupt(self) -> None:
        # after_training follows and writes the current row.
        with self._naming_the_file():
            self._flush()

    def after_training(self) -> None:
        with self._naming_the_file():
            self._finish()

    def on_error(self, exception: BaseException) -> None:
        with self._naming_the_file():
            self._finish()

    @contextlib.contextmanager
    def _naming_the_file(self) -> Iterator[None]:
        """Re-raise an ``OSError`` of writing the file (a full disk names none) naming it."""
        try:
            yield
        except OSError as error:
            if error.filename is not None:
                raise
            fix = _FIXES.get(error.errno, "fix the cause; the rows written so far are whole")
            raise OSError(
                error.errno,
                f"{self.name} cannot write the log file {self.path}: "
                f"{error.strerror or error}; {fix}",
                self.path,
            ) from error

    def _start(self) -> None:
        self._close()
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        contents = None
        if os.path.exists(self.path):
            log_files.cut_torn_line(self.path)
            if os.path.getsize(self.path) > 0:
                contents = log_files.parse_log_file(self.path)
        self._open(contents)
        loop = self.main_loop
        if loop.resumed_from is not None and contents is not None:
            self.run = contents.runs
            self._catch_up(contents)
        self.run = (contents.runs if contents is not None else 0) + 1
        self._next_row = loop.status.iterations_done
        self._begin_run()
        self._flush()

    def _catch_up(self, contents: log_files.LogFileContents) -> None:
        """Write the rows before the resumed checkpoint that the file lacks.

        They come from the checkpoint's log: the interrupted process may have
        been killed after saving the checkpoint but before writing its last rows.
        """
        log = self.main_loop.log
        present = {row[ITERATION] for row in log_files.continued_rows(contents)}
        start = self.main_loop.status.iterations_done
        for iteration in log:
            if iteration < start and iteration not in present:
                self._write_row(iteration, log[iteration])

    def _finish(self) -> None:
        if self.file is None:
            return
        log = self.main_loop.log
        try:
            for iteration in log:
                if iteration >= self._next_row:
                    self._write_row(iteration, log[iteration])
            self._next_row = self.main_loop.status.iterations_done + 1
        finally:
            self._close()

    def _write_row(self, iteration: int, row: Dict[str, Any]) -> None:
        log, status = self.main_loop.log, self.main_loop.status
        # Checkpoints of mxoid 0.1 hold no epoch ends: the current count then.
        epochs = (
            log.epochs_done_at(iteration)
            if log.epoch_ends or not status.epochs_done
            else status.epochs_done
        )
        values = {ITERATION: iteration, EPOCHS_DONE: epochs}
        for name, value in row.items():
            if name in RESERVED_NAMES:
                raise ValueError(
                    f"{self.name}: record name {name!r} is reserved in log files "
                    f"({', '.join(RESERVED_NAMES)}); rename the record"
                )
            values[name] = plain_value(value)
        self._write_values(values)
        self._flush()

    def _flush(self) -> None:
        if self.file is not None:
            self.file.flush()
            if self.fsync:
                os.fsync(self.file.fileno())

    def _close(self) -> None:
        if self.file is not None:
            try:
                self._flush()
            finally:  # closed even when the flush failed (a full disk)
                file, self.file = self.file, None
                file.close()

    def _open(self, contents: Optional[log_files.LogFileContents]) -> None:
        """Open the file to append, after checking the format of what it holds."""
        raise NotImplementedError

    def _begin_run(self) -> None:
        """Mark the start of run ``self.run`` (JSON lines: a header line)."""

    def _write_values(self, values: Dict[str, Any]) -> None:
        raise NotImplementedError


class JSONLinesLog(_LogFileWriter):
    """Write the log to a JSON lines file: one object per row, as training goes.

    Each run starts with a header line ``{"run": k, "started": ...,
    "start_iteration": n}``, then one line per log row ``{"iteration": i,
    "epochs_done": e, "<record>": value, ...}``, written once the row is
    complete (when the next batch has been trained, or when training ends or
    fails) and flushed, so a crash loses at most the current row. A run
    appended to an existing file gets the next run number. NDArrays and
    NumPy numbers become Python numbers; NaN and infinities are written as
    the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``. The exact format
    is described in :mod:`mxoid.log_files`; read the file back with
    :func:`mxoid.log_files.read_log`. Only the worker of rank 0 writes.

    Parameters
    ----------
    path : str or path-like
    fsync : bool, default False
        Also force every line to the disk (``os.fsync``): survives a power
        loss, at the cost of a disk write per row.
    name, priority, rank_zero_only
        As for :class:`Extension`; the priority is 1000 by default, so that
        the last row holds what every other extension wrote when training
        ended (a checkpoint's ``checkpoint_saved_to`` included).

    Examples
    --------
    >>> from mxoid import JSONLinesLog
    >>> writer = JSONLinesLog("run/log.jsonl")  # the file is opened when training starts
    """

    def _open(self, contents: Optional[log_files.LogFileContents]) -> None:
        if contents is not None and contents.format != "jsonl":
            raise ValueError(f"{self.name}: {self.path} is a {contents.format} log, not JSON lines")
        self.file = open(self.path, "a", encoding="utf-8")

    def _begin_run(self) -> None:
        loop = self.main_loop
        header = {
            RUN: self.run,
            "started": datetime.now().astimezone().isoformat(timespec="seconds"),
            "start_iteration": loop.status.iterations_done,
        }
        if loop.resumed_from is not None:
            header[log_files.RESUMED_FROM] = loop.resumed_from
        self._write_line(header)

    def _write_values(self, values: Dict[str, Any]) -> None:
        self._write_line({name: log_files.encode_json_value(v) for name, v in values.items()})

    def _write_line(self, item: Dict[str, Any]) -> None:
        self.file.write(json.dumps(item, allow_nan=False, ensure_ascii=False) + "\n")


class CSVLog(_LogFileWriter):
    """Write the log to a CSV file: one line per row, as training goes.

    Columns: ``run``, ``iteration``, ``epochs_done``, then the records in
    the order they first appear; a cell is empty when its row has no such
    record. When a record appears that the header lacks, the file is
    rewritten with the wider header (through a temporary file and
    ``os.replace``, so it is never half-written), and stays valid CSV with
    one header. A run appended to an existing file gets the next number in
    the ``run`` column. Rows are written once complete and flushed, as in
    :class:`JSONLinesLog`; the exact format is described in
    :mod:`mxoid.log_files`. Only the worker of rank 0 writes.

    Parameters
    ----------
    path : str or path-like
    fsync : bool, default False
        Also force every line to the disk (``os.fsync``).
    name, priority, rank_zero_only
        As for :class:`Extension`; the priority is 1000 by default, so that
        the last row holds what every other extension wrote when training
        ended (a checkpoint's ``checkpoint_saved_to`` included).

    Examples
    --------
    >>> from mxoid import CSVLog
    >>> writer = CSVLog("run/log.csv")  # the file is opened when training starts
    """

    columns: List[str]

    def _open(self, contents: Optional[log_files.LogFileContents]) -> None:
        if contents is not None and contents.format != "csv":
            raise ValueError(f"{self.name}: {self.path} is a {contents.format} log, not CSV")
        self.columns = list(contents.columns) if contents is not None else []
        self.file = open(self.path, "a", encoding="utf-8", newline="")

    def _write_values(self, values: Dict[str, Any]) -> None:
        values = {RUN: self.run, **values}
        new = [name for name in values if name not in self.columns]
        if new:
            self._widen(self.columns + new)
        cells = [log_files.encode_csv_cell(values.get(name)) for name in self.columns]
        csv.writer(self.file, lineterminator="\n").writerow(cells)

    def _widen(self, columns: List[str]) -> None:
        """Rewrite the file with the header ``columns``, padding older lines with empty cells."""
        self._close()
        with open(self.path, encoding="utf-8", newline="") as f:
            lines = list(csv.reader(f))[1:]
        temporary = f"{self.path}.tmp{os.getpid()}"
        with open(temporary, "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(columns)
            writer.writerows(cells + [""] * (len(columns) - len(cells)) for cells in lines)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.path)
        self.columns = columns
        self.file = open(self.path, "a", encoding="utf-8", newline="")
