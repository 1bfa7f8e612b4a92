"""Showing training as it goes: printed reports and a progress bar."""

from __future__ import annotations

import sys
from typing import IO, Any, Dict, Optional

import numpy as np
from tqdm import tqdm

from ..checkpoint.data_position import batches_per_epoch
from ..log.records import format_value
from .base import Extension

__all__ = ["Printing", "ProgressBar"]

RULE = "-" * 79
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
    """Print the loop status and the records of the current row, as Blocks does.

    By default after every epoch, when training resumes, is interrupted or
    ends, as in Blocks; add
    ``every_n_batches=N`` for reports between epochs. The report goes to
    standard output with ``tqdm.write`` (so a :class:`ProgressBar` on the
    screen is not broken) and is flushed at once, so it shows up in
    redirected output and cluster logs as it happens. Only the worker of
    rank 0 prints. It runs at priority 300 by default, after the extensions
    that write records and after checkpoints (priority 200), so the report
    says where the checkpoint went.

    Parameters
    ----------
    **kwargs
        Firing conditions and options of :class:`Extension`.

    Examples
    --------
    >>> from mxoid import Printing
    >>> report = Printing(every_n_batches=500)
    """

    rank_zero_only = True

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("priority", 300)
        kwargs.setdefault("after_epoch", True)
        kwargs.setdefault("after_training", True)
        kwargs.setdefault("on_resumption", True)
        kwargs.setdefault("on_interrupt", True)
        super().__init__(**kwargs)

    def do(self, which_callback: str, *args: Any) -> None:
        """Print the report: the hook's header, the loop status and the current row's records."""
        status = self.main_loop.status
        row = self.main_loop.log.get(status.iterations_done, {})
        lines = [RULE, HEADERS[which_callback], RULE, "Training status:"]
        lines += [f"\t {name}: {value}" for name, value in status.state_dict().items()]
        lines.append(f"Log records from the iteration {status.iterations_done}:")
        lines += [f"\t {name}: {format_value(value)}" for name, value in sorted(row.items())]
        tqdm.write("\n".join(lines), file=sys.stdout)
        sys.stdout.flush()


class ProgressBar(Extension):
    """A tqdm progress bar per epoch, with the newest records beside it.

    The bar's length is the number of batches of the previous epoch, or
    before the first epoch ends, what the training iterator says (see
    :func:`batches_per_epoch`); without either the bar counts batches with
    no total. Numeric records of the current row (Python or NumPy numbers;
    NDArrays are left out, as reading them would wait for the device) are
    shown after the bar and kept until a newer value comes. The bar is
    closed at the end of each epoch and when training ends, fails or is
    interrupted.

    Parameters
    ----------
    disable : bool or None, default None
        As tqdm's: ``None`` shows the bar only when ``file`` is a terminal
        (it stays quiet in redirected output and cluster logs), ``False``
        always shows it, ``True`` never.
    file : file object, optional
        Where the bar is drawn; standard error by default.
    name, priority, rank_zero_only
        As for :class:`Extension`; the priority is 300 by default, so the
        bar shows the records of the other extensions. Only the worker of
        rank 0 shows a bar.

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
        name: Optional[str] = None,
        priority: float = 300,
        rank_zero_only: Optional[bool] = None,
    ) -> None:
        super().__init__(name=name, priority=priority, rank_zero_only=rank_zero_only)
        self.disable = disable
        self.file = file
        self.bar: Optional[tqdm] = None
        self.postfix: Dict[str, str] = {}
        self._epoch_length: Optional[int] = None

    def before_epoch(self) -> None:
        """Open a new bar for the epoch, closing the previous one."""
        self._open(initial=0)

    def after_batch(self, batch: Any) -> None:
        """Advance the bar by one batch and show the row's numeric records beside it.

        A run resumed in the middle of an epoch opens its bar here, at the
        batches already done in the epoch.
        """
        if self.bar is None:  # resumed in the middle of an epoch
            self._open(initial=self.main_loop.status.iterations_done_in_epoch - 1)
        self._show_records()
        self.bar.update(1)

    def after_epoch(self) -> None:
        """Note the epoch's length for the next bar, show the last records, close the bar."""
        self._epoch_length = self.main_loop.status.iterations_done_in_epoch
        if self.bar is not None:
            self._show_records()
        self._close()

    def after_training(self) -> None:
        """Close the bar."""
        self._close()

    def on_interrupt(self) -> None:
        """Close the bar."""
        self._close()

    def on_error(self, exception: BaseException) -> None:
        """Close the bar."""
        self._close()

    def _open(self, initial: int) -> None:
        self._close()
        total = self._epoch_length or batches_per_epoch(self.main_loop.train_data)
        self.bar = tqdm(
            total=total,
            initial=initial,
            file=self.file,
            disable=self.disable,
            desc=f"epoch {self.main_loop.status.epochs_done + 1}",
            unit="batch",
            dynamic_ncols=True,
        )
        if self.postfix:
            self.bar.set_postfix(self.postfix, refresh=False)

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
            self.bar.set_postfix(self.postfix, refresh=False)

    def _close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
