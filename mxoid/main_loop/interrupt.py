"""Ctrl-C and SIGTERM that stop training cleanly, as in Blocks.

What a signal means, from its handler to the exit message and status.

The first Ctrl-C lets the current epoch finish; a second Ctrl-C, or a
SIGTERM (what a cluster sends before it kills a job), lets only the current
batch finish. A third Ctrl-C aborts at once with ``KeyboardInterrupt``.
The handlers only set flags on the loop status; the loop acts on them
between batches (:func:`epoch_interrupted` after an epoch, :func:`cut_short`
when training ends). A run that was cut short says so and how to resume
(:func:`interruption_message`), and exits with 128 + the signal number
(:func:`exit_status`).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any, Dict, Optional, Sequence

from ..log.records import counted
from ..log.status import TrainingStatus

__all__ = [
    "InterruptHandlers",
    "cut_short",
    "epoch_interrupted",
    "exit_status",
    "interruption_message",
    "report_interruption",
    "signal_number",
]

logger = logging.getLogger(__name__)

EPOCH_MESSAGE = (
    "Ctrl-C received: training stops at the end of this epoch. "
    "Press Ctrl-C again to stop after the current batch."
)
BATCH_MESSAGE = "{signal} received: training stops after the current batch."


class InterruptHandlers:
    """Install the training signal handlers for the duration of a ``with`` block.

    Outside the main thread signals cannot be handled; the block then does
    nothing. The previous handlers are restored on exit.

    Parameters
    ----------
    status : TrainingStatus
        Receives ``epoch_interrupt_received``, ``interrupted`` and
        ``stop_requested``.
    """

    def __init__(self, status: TrainingStatus) -> None:
        self.status = status
        self._previous: Dict[int, Any] = {}
        self._sigint_count = 0

    def __enter__(self) -> InterruptHandlers:
        if threading.current_thread() is threading.main_thread():
            self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_sigint)
            self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _on_sigint(self, signum: int, frame: Optional[FrameType]) -> None:
        self._sigint_count += 1
        if self._sigint_count == 1:
            logger.warning(EPOCH_MESSAGE)
            self.status.epoch_interrupt_received = True
        elif self._sigint_count == 2:
            self._stop_after_batch("SIGINT")
        else:
            raise KeyboardInterrupt

    def _on_sigterm(self, signum: int, frame: Optional[FrameType]) -> None:
        self._stop_after_batch("SIGTERM")

    def _stop_after_batch(self, name: str) -> None:
        logger.warning(BATCH_MESSAGE.format(signal=name))
        status = self.status
        if status.interrupted is None:
            status.interrupted = name
        status.stop_requested = True


def signal_number(name: Optional[str]) -> int:
    """Return the number of signal ``name`` (``'SIGTERM'`` -> 15); 0 for None."""
    return int(getattr(signal, name)) if name else 0


def exit_status(name: str) -> int:
    """Return the exit status of a process stopped by signal ``name``, as a shell reports it."""
    return 128 + signal_number(name)


def epoch_interrupted(status: TrainingStatus) -> bool:
    """After an epoch: a first Ctrl-C arrived, and nothing else stops training now.

    Marks the status as interrupted by SIGINT when so.
    """
    if status.epoch_interrupt_received and not status.stop_requested:
        status.interrupted = "SIGINT"
        return True
    return False


def cut_short(status: TrainingStatus) -> bool:
    """When training ends: whether a signal cut it short.

    A signal that arrives when an extension has already asked to stop at the
    same point (the last epoch ends, a limit is reached) cut nothing short:
    the run is finished, not interrupted, and ``status.interrupted`` is cleared.
    """
    if status.interrupted is None:
        return False
    if status.stop_reason is not None and not status.stop_reason.startswith(
        ("interrupted by", "rank ")
    ):
        logger.info("%s arrived as training finished (%s)", status.interrupted, status.stop_reason)
        status.interrupted = None
        return False
    return True


def interruption_message(
    status: TrainingStatus, saved: Optional[str], directories: Sequence[str]
) -> str:
    """Return what an interrupted run tells its user: where it stopped, and how to resume.

    Parameters
    ----------
    saved : str or None
        The newest checkpoint folder this process saved.
    directories : sequence of str
        The loop's checkpoint directories (rank 0 writes them in distributed training).
    """
    if saved:
        where = (
            f"The last checkpoint is {saved}; resume with "
            f"MainLoop(..., resume_from={os.path.dirname(os.path.abspath(saved))!r})."
        )
    elif directories and status.rank != 0:
        where = (
            f"Rank 0 saves the checkpoints; resume with "
            f"MainLoop(..., resume_from={directories[0]!r})."
        )
    else:
        where = (
            "No checkpoint was saved: add mxoid.extensions.Checkpoint(directory) to "
            "resume interrupted runs."
        )
    return (
        f"Training interrupted by {status.interrupted} after "
        f"{counted(status.epochs_done, 'epoch')} and {counted(status.iterations_done, 'batch')}"
        f". {where}"
    )


def report_interruption(
    status: TrainingStatus, saved: Optional[str], directories: Sequence[str], exit: bool
) -> None:
    """After training cut short by a signal: say how to resume, then exit if ``exit``.

    The message (:func:`interruption_message`) goes to standard error; the exit
    status is 128 + the signal number (:func:`exit_status`), as a shell
    reports a process the signal killed.
    """
    print(interruption_message(status, saved, directories), file=sys.stderr, flush=True)
    if exit:
        raise SystemExit(exit_status(status.interrupted))
