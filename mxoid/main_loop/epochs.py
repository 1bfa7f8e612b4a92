"""The training itself: a start, epochs of batches, an end.

:meth:`MainLoop.run <mxoid.MainLoop.run>` calls :func:`start_training`, then
:func:`run_epoch` and :func:`end_epoch` until a stop is requested, then
:func:`finish_training`. A batch (:func:`run_epoch`): ``before_batch`` ->
the batch copied into the devices -> forward -> backward -> ``after_backward``
(the training pass's outputs, labels and padding, before any evaluation) ->
the optimizer step (:func:`~mxoid.main_loop.accumulation.step_function`) ->
the host's lead bounded (:mod:`~mxoid.executor_manager.pacing`) -> counters ->
``after_batch`` -> stop requests. Nothing on that path waits for the devices.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from ..distributed.workers import pull_parameters
from ..log.files import RESUMED_FROM
from .accumulation import step_function, warn_open_group
from .interrupt import cut_short, epoch_interrupted

if TYPE_CHECKING:  # pragma: no cover
    from .loop import MainLoop

__all__ = ["end_epoch", "finish_training", "run_epoch", "start_training"]

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


_NO_BUCKET = object()  # before an epoch's first batch: whatever its bucket, look it up


def start_training(loop: MainLoop) -> None:
    """Fire ``before_training``, or ``on_resumption`` for a run that started before.

    A run that had finished (``run()`` called again) continues as a resumption
    in the same process: its status is cleared of the stop, and its row marked.
    """
    status = loop.status
    loop.log.batch_in_progress = False  # a batch that failed in an earlier run() is over
    again = status.training_finished
    if again:
        status.training_finished = status.stop_requested = False
        status.stop_reason = status.interrupted = None
        status.epoch_interrupt_received = False
        loop.log.current_row[RESUMED_FROM] = RUN_AGAIN
    if status.training_started:
        loop.dispatcher.fire("on_resumption")
    else:
        status.training_started = True
        loop.dispatcher.fire("before_training")
    if again and status.stop_requested:
        warnings.warn(NOTHING_MORE.format(reason=status.stop_reason), stacklevel=3)


def run_epoch(loop: MainLoop) -> bool:
    """Train the rest of the epoch; return False when a stop was requested mid-epoch."""
    status, manager, dispatcher, log = loop.status, loop.manager, loop.dispatcher, loop.log
    if not status.epoch_started:
        if status.epochs_done > 0:
            loop.data_position.reset()
        status.epoch_started = True
        status.iterations_done_in_epoch = 0
        dispatcher.fire("before_epoch")
    executors = manager.current
    buckets, bucket = loop.buckets, _NO_BUCKET
    step = step_function(status, manager, loop.update, dispatcher, loop.accumulate_batches)
    before_batch = dispatcher.runner("before_batch")
    after_backward = dispatcher.runner("after_backward")
    after_batch = dispatcher.runner("after_batch")
    queued = loop._pacer.queued if loop._pacer is not None else None
    collective, every = loop._collective, loop.stop_agreement_batches
    trained = status.iterations_done_in_epoch
    for batch in loop.train_data:
        loop.current_batch = batch
        if before_batch is not None:
            before_batch(batch)
        log.batch_in_progress = True  # records go to this batch's row until it is counted
        if buckets is not None and getattr(batch, "bucket_key", None) != bucket:
            executors = buckets.training_set(loop, batch)
            manager.use(executors)
            bucket = batch.bucket_key
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
        if status.stop_requested and not loop._stop_deferred():
            return False
        if (
            collective
            and status.iterations_done % every == 0
            and loop._agree_to_stop(epoch_end=False)
        ):
            return False
    if status.iterations_done_in_epoch == trained == 0:
        raise ValueError(NO_BATCHES)
    return True


def end_epoch(loop: MainLoop) -> None:
    """After an epoch's last batch: the devices agree, the ``after_epoch`` hooks run."""
    status = loop.status
    # As Module.fit: every device ends the epoch with the same model.
    loop.manager.reconcile_aux_states()
    loop.update.settle_buffers(loop.synchronize)
    status.epoch_started = False
    status.epochs_done += 1
    loop.log.epoch_ends.append(status.iterations_done)
    loop.dispatcher.fire("after_epoch")
    if loop._collective:
        loop._agree_to_stop(epoch_end=True)
    elif epoch_interrupted(status):
        loop.request_stop("interrupted by SIGINT")


def finish_training(loop: MainLoop) -> None:
    """When training stops: an interruption said, the devices agree, ``after_training``."""
    status, manager = loop.status, loop.manager
    if cut_short(status):
        loop.request_stop(f"interrupted by {status.interrupted}")
        loop.dispatcher.fire("on_interrupt")
    status.training_finished = True
    warn_open_group(status, loop.accumulate_batches)
    manager.reconcile_aux_states()
    loop.synchronize()
    if loop._collective and loop.update_on_kvstore:  # dist_async: every worker ends equal
        pull_parameters(loop.kvstore, manager.param_names, manager.param_arrays)
    loop.dispatcher.fire("after_training")
