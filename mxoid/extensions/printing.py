"""Showing training as it goes: printed reports (the progress bar is in :mod:`.progress`)."""

from __future__ import annotations

import codecs
import fnmatch
import logging
import sys
from time import perf_counter
from typing import Any, List, Optional, Sequence

import numpy as np
from tqdm import tqdm

from ..data.position import batches_per_epoch
from ..log.records import (
    BEST_SO_FAR,
    MONITOR_PREFIX,
    SAMPLES_PER_SECOND,
    TIMING_RECORDS,
    RecordReader,
    counted,
    format_seconds,
    format_value,
    is_marker,
    short_name,
)
from .base import Extension
from .progress import ProgressBar

__all__ = ["Printing", "ProgressBar"]

RULE = "-" * 79
SEPARATOR = " · "
WIDTH = 100  # lines with records are shorter, by default
# Left out of the lines by default, besides Timing's records and the markers.
HIDDEN_PREFIXES, HIDDEN_SUFFIXES = (MONITOR_PREFIX,), (BEST_SO_FAR,)
HEADERS = {
    "before_training": "BEFORE FIRST EPOCH",
    "on_resumption": "TRAINING RESUMED",
    "before_epoch": "BEFORE ANOTHER EPOCH",
    "before_batch": "BEFORE ANOTHER BATCH",
    "after_batch": "AFTER ANOTHER BATCH",
    "after_epoch": "AFTER ANOTHER EPOCH",
    "after_training": "TRAINING HAS BEEN FINISHED",
    "on_interrupt": "TRAINING INTERRUPTED",
    "on_error": "TRAINING FAILED",
}


class Printing(Extension):
    """Print how training goes: a line when it starts, one short line per epoch, one at the end.

    The lines, as Keras and Lightning users expect them::

        Training starts: 47 batches per epoch of 32 samples on 2 devices (cpu(0), cpu(1)).
        Epoch 1/20 · 0.41 s · train_acc 0.6123 · valid_acc 0.8111 · valid_ce 0.6521
        Batch 30/47 · epoch 2/20 · 0.21 s · train_acc 0.7828      (with every_n_batches)
        Training finished after 20 epochs and 940 batches (8.21 s): FinishAfter: 20 epochs done.

    A batch line shows Timing's ``samples_per_second`` after the seconds where the
    row has it: with ``Timing(every_n_batches=20)``,
    ``TrainingMonitoring("acc", every_n_batches=20)`` and ``Printing(every_n_batches=20)``,
    ``mx.callback.Speedometer(batch_size, 20)``'s line (the accuracy over those 20
    batches; the epoch's line keeps the epoch's)::

        Batch 20/47 · epoch 1/20 · 0.05 s · 12804 samples/s · train_acc 0.7828

    ``Epoch i/N``: N is the fewest :attr:`~Extension.planned_epochs` of the loop's
    extensions (a :class:`~mxoid.extensions.FinishAfter`'s epoch limit), when one plans.
    The seconds are the epoch's own (from its start to the line, evaluation and
    checkpoint included; on a batch line, since the epoch started); the last line
    gives the total. Records are the numbers of the row at 4 significant digits, names
    shortened (:func:`~mxoid.log.records.short_name`: ``valid_acc``, ``valid_ce``). By
    default the records extensions react to (EarlyStopping's, ``Checkpoint``'s
    ``save_best_of``...) come first, then the others in the order written, as many as
    fit in 100 columns, shown in the order written; Monitor's (``monitor_*``), Timing's,
    ``*_best_so_far`` and the markers (``*_new_best``...) are left out. Everything is in
    ``loop.log`` and the log files. ``records=[...]`` chooses them (names or patterns, in
    that order, however long the line). A resumed run starts with ``Training resumes
    from <checkpoint> after 3 epochs and 141 batches.``, an interrupted one ends with
    ``Training interrupted by SIGINT after ...``. ``verbose=True`` prints Blocks' report
    instead: the whole status and every record of the row, under a header per hook.

    Lines go to standard output with ``tqdm.write`` (a :class:`ProgressBar` on the screen
    is not broken), flushed at once, or to ``logger`` (Python ``logging``) at level INFO.
    Only the worker of rank 0 prints. It runs at priority 300 by default, after the
    extensions that write records and after checkpoints (priority 200).

    Parameters
    ----------
    records : str or sequence of str, optional
        The records to show, by name or pattern (``fnmatch``: ``"valid_*"``,
        ``"monitor_*"``; ``"*"`` for every number of the row); by default as above.
    verbose : bool, default False
        Blocks' multi-line report.
    logger : logging.Logger, optional
        Send the lines there instead of standard output.
    **kwargs
        Firing conditions and options of :class:`Extension`; by default when
        training starts or resumes, after every epoch, on interruption and
        when training ends. Add ``every_n_batches=N`` for lines between epochs.

    Examples
    --------
    >>> import logging
    >>> from mxoid import Printing
    >>> report = Printing(every_n_batches=500)
    >>> to_the_log = Printing(logger=logging.getLogger("training"))
    >>> chosen = Printing(records=["valid_accuracy", "train_*"])
    """

    rank_zero_only = True

    def __init__(
        self,
        records: Optional[Sequence[str]] = None,
        verbose: bool = False,
        logger: Optional[logging.Logger] = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("priority", 300)
        for hook in ("before_training", "on_resumption", "after_epoch", "on_interrupt"):
            kwargs.setdefault(hook, True)
        kwargs.setdefault("after_training", True)
        super().__init__(**kwargs)
        self.records = [records] if isinstance(records, str) else records and list(records)
        self.verbose = verbose
        self.logger = logger
        self._started = self._epoch_started = perf_counter()

    def before_epoch(self) -> None:
        """Note when the epoch starts, then fire the conditions."""
        self._epoch_started = perf_counter()
        super().before_epoch()

    def do(self, which_callback: str, *args: Any) -> None:
        """Print the line (or with ``verbose``, the report) of this hook."""
        if which_callback in ("before_training", "on_resumption"):
            self._started = self._epoch_started = perf_counter()
        text = self.report(which_callback) if self.verbose else self.line(which_callback)
        if text is None:
            return
        if self.logger is not None:
            self.logger.info(text)
        else:
            if codecs.lookup(getattr(sys.stdout, "encoding", None) or "utf-8").name == "ascii":
                text = text.replace("·", "|")  # an ASCII terminal has no "·"
            tqdm.write(text, file=sys.stdout)
            sys.stdout.flush()

    def line(self, which_callback: str) -> Optional[str]:
        """Return the one-line message of a hook (None: nothing to say at that hook)."""
        loop = self.main_loop
        status = loop.status
        seconds = format_seconds(perf_counter() - self._started)
        done = (
            f"{counted(status.epochs_done, 'epoch')} and {counted(status.iterations_done, 'batch')}"
        )
        if which_callback == "before_training":
            batches = batches_per_epoch(loop.train_data)
            contexts = ", ".join(str(c) for c in loop.contexts)
            per_epoch = f"{batches} batches per epoch of " if batches else "batches of "
            return (
                f"Training starts: {per_epoch}{loop.manager.batch_size} samples on "
                f"{counted(len(loop.contexts), 'device')} ({contexts})."
            )
        if which_callback == "on_resumption":
            return f"Training resumes from {loop.resumed_from} after {done}."
        if which_callback == "after_epoch":
            return self._with_records(f"Epoch {self._of_epochs(status.epochs_done)}")
        if which_callback in ("after_batch", "before_batch"):
            batches = batches_per_epoch(loop.train_data)
            return self._with_records(
                f"Batch {status.iterations_done_in_epoch}{f'/{batches}' if batches else ''}"
                f"{SEPARATOR}epoch {self._of_epochs(status.epochs_done + 1)}",
                speed=True,
            )
        if which_callback == "after_training":
            if status.interrupted:
                return f"Training interrupted by {status.interrupted} after {done} ({seconds})."
            return f"Training finished after {done} ({seconds}): {status.stop_reason}."
        if which_callback == "on_error":
            return f"Training failed after {done}: {loop.log.current_row.get('error')}."
        return None  # on_interrupt: the line at the end says it

    def _of_epochs(self, epoch: int) -> str:
        """``3/20`` with the epochs the extensions plan (FinishAfter's), ``3`` without."""
        planned = (extension.planned_epochs for extension in self.main_loop.extensions)
        limits = [epochs for epochs in planned if epochs is not None]
        return f"{epoch}/{min(limits)}" if limits else str(epoch)

    def _with_records(self, head: str, speed: bool = False) -> str:
        """``head · seconds of the epoch · records``.

        ``speed``: after the seconds, Timing's ``samples_per_second`` where the row has it
        (``1234 samples/s``, as ``mx.callback.Speedometer`` prints it).
        """
        seconds = format_seconds(perf_counter() - self._epoch_started)
        row = self.main_loop.log.get(self.main_loop.status.iterations_done, {})
        rate = row.get(SAMPLES_PER_SECOND) if speed else None
        if isinstance(rate, (int, float, np.number)) and np.isfinite(rate):
            seconds = f"{seconds}{SEPARATOR}{float(rate):.0f} samples/s"
        numbers = {
            name: value
            for name, value in row.items()
            if isinstance(value, (int, float, np.number)) and not isinstance(value, bool)
        }
        if self.records is not None:
            chosen = [n for p in self.records for n in numbers if fnmatch.fnmatchcase(n, p)]
        else:
            chosen = self._fitting(len(head), [n for n in numbers if _shown_by_default(n)])
        items = [_item(name, numbers[name]) for name in dict.fromkeys(chosen)]
        return SEPARATOR.join([head, seconds, *items])

    def _fitting(self, head: int, names: List[str]) -> List[str]:
        """Return the records that fit in ``WIDTH`` columns, in the row's order.

        The records extensions react to (through a RecordReader: EarlyStopping, TrackBest,
        Checkpoint's save_best_of...) go in first, then the others in the row's order. The
        seconds are counted 10 characters wide and each value 8 ("0.001234"), so that the
        same records fit on every line, whatever their values.
        """
        watched = {
            reader.name
            for extension in self.main_loop.extensions
            for value in vars(extension).values()
            for reader in (value[:64] if isinstance(value, list) else [value])  # NaNGuard's
            if isinstance(reader, RecordReader)
        }
        length, kept = head + len(SEPARATOR) + 10, set()
        for name in sorted(names, key=lambda name: name not in watched):
            length += len(SEPARATOR) + len(short_name(name)) + 1 + 8
            if length >= WIDTH:
                break
            kept.add(name)
        return [name for name in names if name in kept]

    def report(self, which_callback: str) -> str:
        """Return Blocks' report of a hook: a header, the status and the current row's records."""
        status = self.main_loop.status
        row = self.main_loop.log.get(status.iterations_done, {})
        lines = [RULE, HEADERS[which_callback], RULE, "Training status:"]
        lines += [f"\t {name}: {value}" for name, value in status.state_dict().items()]
        lines.append(f"Log records from the iteration {status.iterations_done}:")
        lines += [f"\t {name}: {format_value(value)}" for name, value in sorted(row.items())]
        return "\n".join(lines)


def _shown_by_default(name: str) -> bool:
    hidden = name.startswith(HIDDEN_PREFIXES) or name.endswith(HIDDEN_SUFFIXES)
    return not (hidden or name in TIMING_RECORDS or is_marker(name))


def _item(name: str, value: Any) -> str:
    return f"{short_name(name)} {format_value(value, digits=4, zeros=True)}"
