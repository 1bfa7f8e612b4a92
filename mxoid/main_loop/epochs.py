"""The training itself: a start, epochs of batches, an end (:class:`Training`).

:meth:`MainLoop.run <mxoid.MainLoop.run>` calls :meth:`Training.start`, then
:meth:`Training.run_epoch` and :meth:`Training.end_epoch` until a stop is
requested, then :meth:`Training.finish`. A batch (:meth:`Training.run_epoch`):
``before_batch`` -> its executors (the network's, where batches switch graphs:
:meth:`mxoid.network.Network.training_set`; the step then averages the gradient
over their rows, :meth:`mxoid.update.Update.average_over`) -> the batch copied into the
devices -> forward -> backward -> ``after_backward`` (the training pass's
outputs, labels and padding, before any evaluation) -> the optimizer step
(:func:`~mxoid.main_loop.accumulation.step_function`) -> the host's lead
bounded (:mod:`~mxoid.executor_manager.pacing`) -> counters -> ``after_batch``
-> stop requests (:class:`~mxoid.main_loop.stops.StopRequests`). Nothing on
that path waits for the devices.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Optional

from ..distributed.workers import pull_parameters
from ..executor_manager import DataParallelExecutorManager
from ..executor_manager.pacing import Pacer
from ..extensions.dispatch import HookDispatcher
from ..log import TrainingLog
from ..log.files import RESUMED_FROM
from ..network import AskHeads, Network
from ..update import Update
from .accumulation import step_function, warn_open_group
from .interrupt import cut_short, epoch_interrupted
from .stops import StopRequests

__all__ = ["Training"]

RUN_AGAIN = "run() again in the same process"
"""The ``resumed_from`` record of a loop whose :meth:`MainLoop.run` is called once more."""
NOTHING_MORE = (
    "MainLoop.run() called again trains nothing more: {reason}. Raise the limit that stops it "
    "first (for instance finish_after.epoch_limit = ...), then call run() again"
)
NO_BATCHES = (
    "train_data yielded no batches in this epoch; is it empty, or already consumed (call "
    "train_data.reset() before the loop)?"
)


_NO_KEY = object()  # before an epoch's first batch: whatever its graph, look it up


class Training:
    """Epochs of batches over the loop's training data, with the hooks around each.

    Handed what it uses by :class:`~mxoid.MainLoop` (which owns each of them).

    Parameters
    ----------
    network : mxoid.network.Network
        What is trained, and which executors train a batch.
    manager : DataParallelExecutorManager
    update : mxoid.update.Update
        The optimizer step.
    log : TrainingLog
        The records, and the counters in its ``status``.
    dispatcher : HookDispatcher
        Fires the extensions' hooks.
    stops : StopRequests
        When training stops.
    data_position : mxoid.data.position.DataPosition
        The training iterator, reset at every epoch start but the first.
    pacer : Pacer or None
        Keeps the host at most ``max_batches_ahead`` batches ahead.
    accumulate_batches : int
        Batches per optimizer step.
    ask_heads : callable
        What a bucket's training executors bind for the extensions
        (:data:`~mxoid.network.AskHeads`).
    synchronize : callable
        Waits for the training step in flight.

    Attributes
    ----------
    current_batch : mx.io.DataBatch or None
        The batch being trained (``MainLoop.current_batch``, for extensions).
    """

    def __init__(
        self,
        network: Network,
        manager: DataParallelExecutorManager,
        update: Update,
        log: TrainingLog,
        dispatcher: HookDispatcher,
        stops: StopRequests,
        data_position: Any,
        pacer: Optional[Pacer],
        accumulate_batches: int,
        ask_heads: AskHeads,
        synchronize: Callable[[], None],
    ) -> None:
        self.network, self.manager, self.update = network, manager, update
        self.log, self.status, self.dispatcher = log, log.status, dispatcher
        self.stops, self.data_position, self.pacer = stops, data_position, pacer
        self.accumulate_batches = accumulate_batches
        self.ask_heads, self.synchronize = ask_heads, synchronize
        self.current_batch: Any = None

    def executors_for(self, batch: Any) -> Any:
        """Return the executor set that trains ``batch``: a bucket's, bound on first use.

        For an extension that acts on the training executors before the batch runs
        (``Monitor``'s twins, in ``before_batch``); the training set where one graph
        trains every batch.
        """
        if not self.network.switches_graphs:
            return self.manager.training_set
        return self.network.training_set(self.manager, batch, self.ask_heads)

    def start(self) -> None:
        """Fire ``before_training``, or ``on_resumption`` for a run that started before.

        A run that had finished (``run()`` called again) continues as a resumption
        in the same process: its status is cleared of the stop, and its row marked.
        """
        status = self.status
        self.stops.start()
        self.log.batch_in_progress = False  # a batch that failed in an earlier run() is over
        again = status.training_finished
        if again:
            status.training_finished = status.stop_requested = False
            status.stop_reason = status.interrupted = None
            status.epoch_interrupt_received = False
            self.log.current_row[RESUMED_FROM] = RUN_AGAIN
        if status.training_started:
            self.dispatcher.fire("on_resumption")
        else:
            status.training_started = True
            self.dispatcher.fire("before_training")
        if again and status.stop_requested:
            warnings.warn(NOTHING_MORE.format(reason=status.stop_reason), stacklevel=3)

    def run_epoch(self) -> bool:
        """Train the rest of the epoch; return False when a stop was requested mid-epoch."""
        status, manager, dispatcher = self.status, self.manager, self.dispatcher
        network, log = self.network, self.log
        if not status.epoch_started:
            if status.epochs_done > 0:
                self.data_position.reset()
            status.epoch_started = True
            status.iterations_done_in_epoch = 0
            dispatcher.fire("before_epoch")
        executors = manager.current
        switching, key = network.switches_graphs, _NO_KEY
        step = step_function(status, manager, self.update, dispatcher, self.accumulate_batches)
        before_batch = dispatcher.runner("before_batch")
        after_backward = dispatcher.runner("after_backward")
        after_batch = dispatcher.runner("after_batch")
        queued = self.pacer.queued if self.pacer is not None else None
        stop_due = self.stops.due
        trained = status.iterations_done_in_epoch
        for batch in self.data_position.iterator:
            self.current_batch = batch
            if before_batch is not None:
                before_batch(batch)
            log.batch_in_progress = True  # records go to this batch's row until it is counted
            if switching and network.key_of(batch) != key:
                executors = network.training_set(manager, batch, self.ask_heads)
                manager.use(executors)
                self.update.average_over(executors.batch_size)  # a short batch: its real rows
                key = network.key_of(batch)
            executors.load_data_batch(batch)
            executors.forward(is_train=True)
            manager.backward()
            if after_backward is not None:  # the training pass's, before any evaluation
                after_backward(batch)
            step()
            if queued is not None:
                queued()  # at most max_batches_ahead batches in flight
            status.iterations_done += 1
            log.batch_in_progress = False
            status.iterations_done_in_epoch += 1
            if after_batch is not None:
                after_batch(batch)
            if stop_due(status.iterations_done):
                self._whole_batches()
                return False
        self._whole_batches()
        if status.iterations_done_in_epoch == trained == 0:
            raise ValueError(NO_BATCHES)
        return True

    def _whole_batches(self) -> None:
        """After a short batch's executors (fewer rows): the training set and its step again."""
        manager = self.manager
        self.update.average_over()
        if manager.batch_size != manager.training_set.batch_size:
            manager.use(manager.training_set)

    def end_epoch(self) -> None:
        """After an epoch's last batch: the devices agree, the ``after_epoch`` hooks run."""
        status = self.status
        # As Module.fit: every device ends the epoch with the same model.
        self.manager.reconcile_aux_states()
        self.update.settle_buffers(self.synchronize)
        self.network.give_back(self.manager.get_params)  # a block holds each epoch's model
        status.epoch_started = False
        status.epochs_done += 1
        self.log.epoch_ends.append(status.iterations_done)
        self.dispatcher.fire("after_epoch")
        if self.stops.collective:
            self.stops.agree(epoch_end=True)
        elif epoch_interrupted(status):
            self.stops.request("interrupted by SIGINT")

    def finish(self) -> None:
        """When training stops: an interruption said, the devices agree, ``after_training``."""
        status, manager = self.status, self.manager
        if cut_short(status):
            self.stops.request(f"interrupted by {status.interrupted}")
            self.dispatcher.fire("on_interrupt")
        status.training_finished = True
        warn_open_group(status, self.accumulate_batches)
        manager.reconcile_aux_states()
        self.synchronize()
        if self.stops.collective and self.update.update_on_kvstore:  # dist_async: all end equal
            pull_parameters(self.update.kvstore, manager.param_names, manager.param_arrays)
        self.dispatcher.fire("after_training")
