"""Ctrl-C and SIGTERM that stop training cleanly, as in Blocks.

The first Ctrl-C lets the current epoch finish; a second Ctrl-C, or a
SIGTERM (what a cluster sends before it kills a job), lets only the current
batch finish. A third Ctrl-C aborts at once with ``KeyboardInterrupt``.
The handlers only set flags on the loop status; the loop acts on them
between batches.
"""
from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any, Dict, Optional

from .log import TrainingStatus

__all__ = ["InterruptHandlers"]

logger = logging.getLogger(__name__)

EPOCH_MESSAGE = ("Ctrl-C received: training stops at the end of this epoch. "
                 "Press Ctrl-C again to stop after the current batch.")
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

    def __enter__(self) -> "InterruptHandlers":
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
