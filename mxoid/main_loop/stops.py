"""Stop requests: who asked to stop and why, and every worker stopping after the same batch.

:class:`StopRequests` holds what :meth:`MainLoop.request_stop <mxoid.MainLoop.request_stop>`
does: the request kept in the status and the log, the stop deferred while a
request made on one worker alone waits for the others, and the agreement
through the kvstore every :attr:`StopRequests.every` batches and at every epoch
end in distributed training (one small exchange through the servers).
"""

from __future__ import annotations

import logging
import signal
from typing import Optional

import mxnet as mx

from ..distributed.workers import agree_to_stop
from ..log import TrainingLog
from ..log.records import TRAINING_FINISH_REQUESTED
from .interrupt import signal_number

__all__ = ["StopRequests"]

logger = logging.getLogger("mxoid.main_loop")


class StopRequests:
    """The loop's stop requests, and in distributed training the workers' agreement on them.

    Parameters
    ----------
    log : TrainingLog
        Where a request is recorded (``training_finish_requested``), and whose
        status holds it (``stop_requested``, ``stop_reason``).
    kvstore : KVStore, optional
        A distributed kvstore: the workers agree through it (None: one worker).
    every : int, default 20
        In distributed training, the workers agree every this many batches.

    Attributes
    ----------
    collective : bool
        Whether several workers agree (a distributed kvstore).
    everywhere : bool
        Whether every worker has this stop already: a request with
        ``every_rank=True``, or one the workers agreed on.
    """

    def __init__(
        self, log: TrainingLog, kvstore: Optional[mx.kv.KVStore] = None, every: int = 20
    ) -> None:
        self.log = log
        self.kvstore = kvstore
        self.collective = kvstore is not None
        self.every = every
        self.everywhere = False

    def start(self) -> None:
        """At the start of a run: no stop is agreed yet."""
        self.everywhere = False

    def request(self, reason: str, *, every_rank: bool = False) -> None:
        """Ask the loop to stop (:meth:`mxoid.MainLoop.request_stop`); the first reason stays."""
        status = self.log.status
        if every_rank:
            self.everywhere = True
        if status.stop_reason is None:
            status.stop_requested = True
            status.stop_reason = reason
            self.log.current_row[TRAINING_FINISH_REQUESTED] = reason
            logger.info("stop requested: %s", reason)

    def deferred(self) -> bool:
        """Return True while a stop asked on this worker alone waits for the workers to agree."""
        return self.collective and not self.everywhere

    def due(self, iterations_done: int) -> bool:
        """After a batch: return whether training stops now (in distributed training, agreed).

        A collective call every :attr:`every` batches, which every worker makes
        after the same batch.
        """
        if self.log.status.stop_requested and not self.deferred():
            return True
        return self.collective and iterations_done % self.every == 0 and self.agree(False)

    def agree(self, epoch_end: bool) -> bool:
        """Stop every worker when any worker asked to; return whether (a collective call).

        Each worker says whether it asked to stop, or was interrupted (its signal,
        or at an epoch end a first Ctrl-C); when one did, every worker records the
        stop, naming the rank and why, and stops after this same batch.
        """
        status = self.log.status
        agreed = agree_to_stop(
            self.kvstore,
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
            interrupted = status.interrupted
            what = f"was interrupted by {interrupted}" if interrupted else "asked to stop"
            self.request(f"rank {rank} {what}")
        self.everywhere = True
        return True
