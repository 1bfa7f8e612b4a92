"""Stopping every worker together in distributed training."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

from ..distributed.workers import agree_to_stop
from .interrupt import signal_number

if TYPE_CHECKING:  # pragma: no cover
    from .loop import MainLoop

__all__ = ["agree_everywhere"]


def agree_everywhere(loop: MainLoop, epoch_end: bool) -> bool:
    """Stop every worker when any worker asked to; return whether (a collective call).

    Each worker says whether it asked to stop, or was interrupted (its signal,
    or at an epoch end a first Ctrl-C); when one did, every worker records the
    stop, naming the rank and why, and stops after this same batch.
    """
    status = loop.status
    agreed = agree_to_stop(
        loop.kvstore,
        status.stop_requested or (epoch_end and status.epoch_interrupt_received),
        signal_number(status.interrupted),
        epoch_end and status.epoch_interrupt_received,
    )
    if agreed is None:
        return False
    rank, number, epoch_interrupt = agreed
    if status.interrupted is None and (number or epoch_interrupt):
        status.interrupted = signal.Signals(number).name if number else "SIGINT"
    if status.stop_reason is None:
        what = f"was interrupted by {status.interrupted}" if status.interrupted else "asked to stop"
        loop.request_stop(f"rank {rank} {what}")
    loop._stop_everywhere = True
    return True
