"""The main loop: epochs of batches, with hooks into extensions, and the loop's own state."""

from __future__ import annotations

import logging
import os
import signal
import sys
import uuid
import warnings
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import mxnet as mx
import numpy as np

from .checkpoint import CheckpointContents, find_checkpoint
from .checkpoint.compatibility import check_resumable
from .checkpoint.data_position import DataPosition
from .checkpoint.loop_state import loop_state, restore_loop_state
from .devices import check_contexts, split_batch
from .distributed.servers import is_distributed
from .distributed.workers import (
    agree_to_stop,
    allreduce_sums,
    check_equal_steps,
    exit_after_error,
    pull_parameters,
)
from .executor_manager import DataParallelExecutorManager
from .extensions.base import Extension
from .extensions.dispatch import HookDispatcher, check_extensions
from .extensions.metrics_extension import check_distinct_records
from .extensions.monitoring import private_heads, training_pass_reader
from .extensions.saveload import Checkpoint
from .initialization import initial_params
from .interrupt import (
    InterruptHandlers,
    cut_short,
    epoch_interrupted,
    exit_status,
    interruption_message,
    signal_number,
)
from .log import TrainingLog, TrainingStatus
from .log.files import RESUMED_FROM
from .log.records import TRAINING_FINISH_REQUESTED
from .pacing import DEFAULT_MAX_BATCHES_AHEAD, Pacer, check_max_batches_ahead
from .update import KVStoreLike, create_kvstore, prepare_update

__all__ = ["MainLoop"]

logger = logging.getLogger(__name__)

RUN_AGAIN = "run() again in the same process"
"""The ``resumed_from`` record of a loop whose :meth:`MainLoop.run` is called once more."""
NOTHING_MORE = (
    "MainLoop.run() called again trains nothing more: {reason}. Raise the limit that stops it "
    "first (for instance finish_after.epoch_limit = ...), then call run() again"
)


class MainLoop:
    """Train a symbol on a data iterator, epoch after epoch, until an extension stops it.

    The loop owns a :class:`DataParallelExecutorManager` (one executor per
    context, each batch split across them) and the optimizer step
    (:class:`mxoid.update.Update`: the optimizer, the kvstore, the updater).
    Every batch it loads the data, runs forward and backward, and updates the
    parameters, either on the kvstore or with a local updater per device.
    Extensions see the whole loop (``extension.main_loop``) at the hooks
    ``before_training``, ``before_epoch``, ``before_batch``,
    ``before_update``, ``after_update``, ``after_batch``, ``after_epoch``,
    ``after_training`` (and ``on_resumption``, ``on_interrupt``, ``on_error``).

    Parameters
    ----------
    symbol : mx.sym.Symbol
        The network; several outputs with ``mx.sym.Group``.
    train_data : mx.io.DataIter
        Training batches; its ``provide_data`` / ``provide_label`` name the
        symbol's inputs. It is reset at the start of every epoch but the first.
    contexts : Context or list of Context, optional
        Devices; ``[mx.cpu()]`` by default.
    optimizer : str or mx.optimizer.Optimizer, default 'sgd'
        A name, with ``optimizer_params``, or an optimizer object (its own
        ``lr_mult`` / ``wd_mult`` are kept, as ``Module`` keeps them).
    optimizer_params : dict, optional
        E.g. ``{'learning_rate': 0.1, 'momentum': 0.9}``. ``rescale_grad``
        defaults to ``1 / batch_size`` (times the number of workers with
        ``dist_sync``), as in ``Module.fit``.
    initializer : mx.init.Initializer, optional
        For parameters not in ``arg_params``; ``mx.init.Uniform(0.01)`` by default.
    arg_params, aux_params : dict of str to NDArray, optional
        Initial values.
    kvstore : None, str or KVStore, default 'local'
        How gradients from several devices (or workers) are summed.
    update_on_kvstore : bool, optional
        Where the optimizer runs; see :func:`mxoid.update.create_kvstore`.
    work_load_list : list of float, optional
        Relative share of each device in a batch.
    extensions : sequence of Extension
        At least one of them must be able to stop training.
    resume_from : str or path-like, optional
        A :class:`~mxoid.extensions.Checkpoint` directory (its newest whole
        checkpoint) or one checkpoint folder: training resumes exactly where
        it left off (parameters, optimizer states, counters, log, extension
        states, random states and the position of the training iterator,
        which must be built as for the interrupted run); ``on_resumption``
        fires instead of ``before_training``. What it accepts, and what must
        match, is in :mod:`mxoid.checkpoint.directory` and :meth:`load_state_dict`.
    exit_on_interrupt : bool, default True
        After Ctrl-C or SIGTERM has stopped training cleanly (``on_interrupt``
        and ``after_training`` hooks run), exit the process with status
        128 + signal number and a message saying how to resume. False makes
        :meth:`run` return instead.
    fixed_param_names : sequence of str, optional
        Parameters that are never updated, as ``Module``'s: they get no
        gradient (and cost no backward work for themselves) and keep their
        values through checkpoints and resumption. A name the network lacks is
        a ``ValueError`` naming the closest ones.
    allow_extra : bool, default False
        Ignore (and log) ``arg_params`` / ``aux_params`` the network lacks, as
        ``Module``'s ``allow_extra``: for a pretrained model with another head.
    accumulate_batches : int, default 1
        Sum the gradients of this many consecutive batches on the devices and
        take one optimizer step per group; ``rescale_grad`` defaults to
        ``1 / (accumulate_batches * batch_size * workers)``, so that k batches
        of n train as one batch of k * n. ``status.iterations_done`` counts
        batches, ``status.updates_done`` optimizer steps (what learning-rate
        schedules count, as MXNet's optimizers do). A group may span the end
        of an epoch: every step sums exactly k batches. When training ends in
        the middle of a group, that group's gradients are not applied (a
        warning says so); a checkpoint taken in the middle of a group keeps
        them, and training resumed from it continues the group exactly.
    max_batches_ahead : int, 'auto' or None, default 'auto'
        How many batches the host may queue ahead of the devices. mxoid does
        not wait for the engine in an epoch, and each batch queued keeps its
        input arrays until the devices reach it; every ``max_batches_ahead //
        2`` batches the loop waits for the batch that many batches back (see
        :mod:`mxoid.pacing`), so memory stays bounded on a host faster than
        its devices. ``'auto'``: as many batches as fit 64 MiB, each counted
        twice its inputs (between 2 and 1024; :func:`mxoid.pacing.auto_limit`);
        an int (at least 2) sets it; None: no bound
        (the whole epoch may be queued). Evaluation and prediction keep the
        same bound, for their own batches.

    Attributes
    ----------
    manager : DataParallelExecutorManager
    update : mxoid.update.Update
        The optimizer step; ``optimizer``, ``kvstore``, ``update_on_kvstore``
        and ``updater`` are its attributes.
    status : TrainingStatus
    log : TrainingLog
    current_batch : mx.io.DataBatch or None
        The batch being trained, for extensions.
    run_id : str
        The run this loop trains, kept across resumptions (checkpoints carry it).
    resumed_from : str or None
        The checkpoint folder training resumed from.

    Notes
    -----
    Several devices and BatchNorm. Parameters are the same on every device
    after every update, but each device updates its own auxiliary states
    (BatchNorm's moving statistics) from its slice of the batch. At every
    epoch end (as ``Module.fit``), before every evaluation and checkpoint,
    in :meth:`get_params` and when training ends, the loop averages them
    over the devices and writes the average back to every device, so that
    what is evaluated, what is saved and what :meth:`get_params` returns
    are one and the same network. Between those points the devices' statistics
    drift apart again. A mid-epoch evaluation or checkpoint therefore
    changes the statistics the rest of the epoch starts from (on one device
    it changes nothing). With a distributed kvstore each worker keeps its
    own statistics; rank 0's are saved.

    Examples
    --------
    .. code-block:: python

        loop = MainLoop(net, train_iter, contexts=[mx.cpu(0), mx.cpu(1)],
                        optimizer_params={"learning_rate": 0.1},
                        extensions=[FinishAfter(after_n_epochs=5)])
        loop.run()
        arg_params, aux_params = loop.get_params()
    """

    stop_agreement_batches: int = 20
    """In distributed training, the workers agree every this many batches (and at every epoch
    end) on whether one of them asked to stop; a stop asked on one worker takes effect on all
    at the next agreement. Each agreement is one small exchange through the servers."""

    def __init__(
        self,
        symbol: mx.sym.Symbol,
        train_data: mx.io.DataIter,
        *,
        contexts: Union[None, mx.Context, Sequence[mx.Context]] = None,
        optimizer: Union[str, mx.optimizer.Optimizer] = "sgd",
        optimizer_params: Optional[Dict[str, Any]] = None,
        initializer: Optional[mx.init.Initializer] = None,
        arg_params: Optional[Mapping[str, mx.nd.NDArray]] = None,
        aux_params: Optional[Mapping[str, mx.nd.NDArray]] = None,
        kvstore: KVStoreLike = "local",
        update_on_kvstore: Optional[bool] = None,
        work_load_list: Optional[Sequence[float]] = None,
        extensions: Sequence[Extension] = (),
        resume_from: Optional[os.PathLike[str] | str] = None,
        exit_on_interrupt: bool = True,
        fixed_param_names: Optional[Sequence[str]] = None,
        allow_extra: bool = False,
        accumulate_batches: int = 1,
        max_batches_ahead: Union[int, str, None] = DEFAULT_MAX_BATCHES_AHEAD,
    ) -> None:
        kv = kvstore if isinstance(kvstore, mx.kv.KVStore) else None
        try:
            _check_inputs(symbol, train_data, initializer)
            self.extensions = check_extensions(extensions)
            self.symbol = symbol
            self.train_data = train_data
            self.contexts = check_contexts(contexts)
            self.exit_on_interrupt = exit_on_interrupt
            self.run_id = uuid.uuid4().hex
            self.resumed_from: Optional[str] = None
            self.current_batch: Optional[mx.io.DataBatch] = None
            if (
                isinstance(accumulate_batches, bool)
                or not isinstance(accumulate_batches, int)
                or accumulate_batches < 1
            ):
                raise ValueError(
                    f"accumulate_batches must be an int >= 1, got {accumulate_batches!r}"
                )
            self.accumulate_batches = accumulate_batches
            self.max_batches_ahead = check_max_batches_ahead(max_batches_ahead)
            heads = private_heads(
                self.extensions,
                symbol,
                train_data.provide_data,
                train_data.provide_label,
                _rows_per_device(train_data, len(self.contexts), work_load_list),
                self.contexts,
            )
            self._private_heads = {id(extension): i for i, (extension, _) in enumerate(heads)}
            self.manager = DataParallelExecutorManager(
                symbol,
                self.contexts,
                train_data.provide_data,
                train_data.provide_label,
                work_load_list=work_load_list,
                fixed_param_names=fixed_param_names or (),
                grad_req="add" if accumulate_batches > 1 else "write",
                private_heads=[head for _, head in heads],
            )
            self._pacer = Pacer.of(self.manager, self.max_batches_ahead)
            kv, on_kvstore = create_kvstore(kvstore, len(self.contexts), update_on_kvstore)
            self._collective = is_distributed(kv)
            self._stop_everywhere = False
            self.data_position = DataPosition(train_data)
            checkpoint = find_checkpoint(
                resume_from,
                [e.directory for e in self.extensions if isinstance(e, Checkpoint)],
                lambda contents: check_resumable(
                    contents,
                    self.symbol,
                    self.manager,
                    self.data_position,
                    update_on_kvstore=on_kvstore,
                    accumulate_batches=self.accumulate_batches,
                    states_on_servers=self._collective and on_kvstore,
                ),
            )
            if checkpoint is not None:
                arg_params, aux_params = checkpoint.arg_params, checkpoint.aux_params
            arg_values, aux_values = initial_params(
                self.manager,
                symbol,
                initializer,
                arg_params,
                aux_params,
                allow_extra=allow_extra or checkpoint is not None,
            )
            # Before the kvstore is initialized: with several devices it holds
            # the master copy, which would overwrite values set later.
            self.manager.set_params(arg_values, aux_values)
            self.update = prepare_update(
                self.manager,
                symbol,
                kv,
                on_kvstore,
                optimizer,
                optimizer_params,
                arg_values,
                accumulate_batches=accumulate_batches,
            )
            if self._collective:
                check_equal_steps(kv, train_data)
            self.log = TrainingLog()
            self.status: TrainingStatus = self.log.status
            if kv is not None:
                self.status.rank, self.status.num_workers = kv.rank, kv.num_workers
            self.dispatcher = HookDispatcher(self.extensions, rank=self.status.rank)
            for extension in self.extensions:
                extension.attach(self)
            check_distinct_records(self.extensions)
            if checkpoint is not None:
                self.load_state_dict(checkpoint)
        except BaseException as error:
            if is_distributed(kv):  # the other workers would wait for this one forever
                exit_after_error(error, kv.rank)
            raise

    # ------------------------------------------------------ the optimizer step
    @property
    def optimizer(self) -> mx.optimizer.Optimizer:
        """The optimizer that updates the parameters."""
        return self.update.optimizer

    @property
    def kvstore(self) -> Optional[mx.kv.KVStore]:
        """The kvstore summing gradients over devices and workers, or None."""
        return self.update.kvstore

    @property
    def update_on_kvstore(self) -> bool:
        """Whether the kvstore (or the servers) runs the optimizer."""
        return self.update.update_on_kvstore

    @property
    def updater(self) -> Optional[mx.optimizer.Updater]:
        """The local updater, when the kvstore does not update."""
        return self.update.updater

    def private_outputs(self, extension: Extension) -> Optional[List[mx.nd.NDArray]]:
        """Return, per device, the private output computed for ``extension``, or None.

        The training executors compute a private head for each
        :class:`~mxoid.extensions.TrainingMonitoring` given to the loop (its
        per-row metric values); an extension attached later has none.
        """
        index = self._private_heads.get(id(extension))
        return None if index is None else self.manager.private_outputs[index]

    def reduction(self, extension: Extension) -> Any:
        """Return what ``extension`` uses to sum its ``(sum, count)`` totals over the workers.

        None without a distributed kvstore, or for an extension that runs on
        rank 0 only (a reduction needs every worker); otherwise a function
        of the totals (:func:`mxoid.distributed.allreduce_sums` on this kvstore).
        """
        if not self._collective or extension.rank_zero_only:
            return None
        return lambda totals: allreduce_sums(self.kvstore, extension.name, totals)

    # -------------------------------------------------------------- training
    def run(self) -> MainLoop:
        """Train until an extension requests a stop; return the loop.

        Raises
        ------
        Exception
            Whatever training or a hook raised, after the ``on_error`` hooks ran
            and the error was recorded in the log (record ``error``). On a
            distributed kvstore the worker instead prints the traceback and
            exits (:func:`mxoid.distributed.exit_after_error`): it would
            otherwise hang at exit, waiting for the other workers.
        """
        status = self.status
        fire = self.dispatcher.fire
        self._stop_everywhere = False
        again = status.training_finished
        if again:  # run() once more: a continuation, as a resumption in this process
            status.training_finished = status.stop_requested = False
            status.stop_reason = status.interrupted = None
            status.epoch_interrupt_received = False
            self.log.current_row[RESUMED_FROM] = RUN_AGAIN
        try:
            with InterruptHandlers(status):
                if status.training_started:
                    fire("on_resumption")
                else:
                    status.training_started = True
                    fire("before_training")
                if again and status.stop_requested:
                    warnings.warn(NOTHING_MORE.format(reason=status.stop_reason), stacklevel=2)
                while not status.stop_requested or self._stop_deferred():
                    if not status.epoch_started:
                        if status.epochs_done > 0:
                            self.data_position.reset()
                        status.epoch_started = True
                        status.iterations_done_in_epoch = 0
                        fire("before_epoch")
                    if not self._run_epoch():
                        break
                    # As Module.fit: every device ends the epoch with the same model.
                    self.manager.reconcile_aux_states()
                    self.update.settle_buffers(self.synchronize)
                    status.epoch_started = False
                    status.epochs_done += 1
                    self.log.epoch_ends.append(status.iterations_done)
                    fire("after_epoch")
                    if self._collective:
                        self._agree_to_stop(epoch_end=True)
                    elif epoch_interrupted(status):
                        self.request_stop("interrupted by SIGINT")
                if cut_short(status):
                    self.request_stop(f"interrupted by {status.interrupted}")
                    fire("on_interrupt")
                status.training_finished = True
                self._warn_open_group()
                self.manager.reconcile_aux_states()
                self.synchronize()
                if self._collective and self.update_on_kvstore:
                    pull_parameters(
                        self.kvstore, self.manager.param_names, self.manager.param_arrays
                    )  # dist_async: end equal
                fire("after_training")
        except BaseException as error:
            if isinstance(error, Exception):
                self._record_error(error)
            if self._collective:  # would hang at exit in ps-lite's finalize barrier
                exit_after_error(error, status.rank)
            raise
        if status.interrupted is not None:
            saved = self.log.last("checkpoint_saved_to", None)
            directories = [e.directory for e in self.extensions if isinstance(e, Checkpoint)]
            print(interruption_message(status, saved, directories), file=sys.stderr, flush=True)
            if self.exit_on_interrupt:
                raise SystemExit(exit_status(status.interrupted))
        return self

    def _run_epoch(self) -> bool:
        """Train the rest of the epoch; return False when a stop was requested mid-epoch."""
        status = self.status
        manager = self.manager
        step = self._step_function()
        before_batch = self.dispatcher.runner("before_batch")
        after_batch = self.dispatcher.runner("after_batch")
        read_training_pass = training_pass_reader(self.dispatcher.extensions)
        queued = self._pacer.queued if self._pacer is not None else None
        trained = status.iterations_done_in_epoch
        for batch in self.train_data:
            self.current_batch = batch
            if before_batch is not None:
                before_batch(batch)
            manager.load_data_batch(batch)
            manager.forward(is_train=True)
            manager.backward()
            if read_training_pass is not None:  # before any hook can evaluate
                read_training_pass()
            step()
            if queued is not None:
                queued()  # at most max_batches_ahead batches in flight
            status.iterations_done += 1
            status.iterations_done_in_epoch += 1
            if after_batch is not None:
                after_batch(batch)
            if status.stop_requested and not self._stop_deferred():
                return False
            if (
                self._collective
                and status.iterations_done % self.stop_agreement_batches == 0
                and self._agree_to_stop(epoch_end=False)
            ):
                return False
        if status.iterations_done_in_epoch == trained == 0:
            raise ValueError(
                "train_data yielded no batches in this epoch; is it empty, or "
                "already consumed (call train_data.reset() before the loop)?"
            )
        return True

    def _step_function(self) -> Callable[[], None]:
        """Return what the loop calls after each backward pass: the update, when due.

        Without gradient accumulation and update hooks, the optimizer step and a
        count, nothing else. With ``accumulate_batches=k`` the step comes after
        every k-th batch (a group may span an epoch end), then the gradients are
        zeroed; ``before_update`` / ``after_update`` fire around it.
        """
        status, manager, update = self.status, self.manager, self.update
        before = self.dispatcher.runner("before_update")
        after = self.dispatcher.runner("after_update")
        k = self.accumulate_batches
        if k == 1 and before is None and after is None:
            step = update.step

            def plain() -> None:
                step()
                status.updates_done += 1

            return plain

        def grouped() -> None:
            if status.iterations_done + 1 - status.updates_done * k < k:
                return  # the group goes on: the gradients add up
            if before is not None:
                if update.reduce is not None:
                    update.reduce()
                before()
                update.apply()
            else:
                update.step()
            status.updates_done += 1
            if after is not None:
                after()
            if k > 1:
                manager.zero_grads()

        return grouped

    def _open_group(self) -> int:
        """Return how many batches of an unfinished accumulation group are trained."""
        status = self.status
        return status.iterations_done - status.updates_done * self.accumulate_batches

    def _warn_open_group(self) -> None:
        open_batches = self._open_group()
        if open_batches:
            warnings.warn(
                f"training ended {open_batches} batch(es) into a group of accumulate_batches="
                f"{self.accumulate_batches}: their gradients were not applied (a checkpoint "
                "keeps them, and training resumed from it completes the group)",
                stacklevel=3,
            )

    def request_stop(self, reason: str, *, every_rank: bool = False) -> None:
        """Ask the loop to stop.

        It stops after this batch when called in ``after_batch``, after this
        epoch when called in ``after_epoch``.

        The reason is kept in ``status.stop_reason`` and recorded in the log as
        ``training_finish_requested``.

        In distributed training the workers stop together, after the same
        batch: a stop asked on one worker takes effect on every worker at the
        next agreement, at most :attr:`stop_agreement_batches` batches later
        (and at every epoch end). ``every_rank=True`` says that every worker
        asks it at this very batch (a limit on batches or epochs), so it takes
        effect at once.
        """
        status = self.status
        if every_rank:
            self._stop_everywhere = True
        if status.stop_reason is None:
            status.stop_requested = True
            status.stop_reason = reason
            self.log.current_row[TRAINING_FINISH_REQUESTED] = reason
            logger.info("stop requested: %s", reason)

    def _stop_deferred(self) -> bool:
        """Return True while a stop asked on this worker alone waits for the workers to agree."""
        return self._collective and not self._stop_everywhere

    def _agree_to_stop(self, epoch_end: bool) -> bool:
        """Stop every worker when any worker asked to; return whether (a collective call)."""
        status = self.status
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
            what = (
                f"was interrupted by {status.interrupted}"
                if status.interrupted
                else "asked to stop"
            )
            self.request_stop(f"rank {rank} {what}")
        self._stop_everywhere = True
        return True

    def _record_error(self, error: Exception) -> None:
        origin = getattr(error, "mxoid_origin", None)
        where = f" (in extension {origin[0]!r}, hook {origin[1]})" if origin else ""
        self.log.current_row["error"] = f"{type(error).__name__}: {error}{where}"
        self.dispatcher.fire_on_error(error)

    # ------------------------------------------------------------ the network
    def synchronize(self) -> None:
        """Wait for the training step in flight to be computed.

        The per-batch path never waits; whatever reads the network to the
        host, saves it or runs it for anything but training must call this
        first (why: :meth:`DataParallelExecutorManager.synchronize`). The
        built-in extensions do; so should your own before reading
        ``manager.param_arrays``, ``aux_arrays`` or ``outputs``.
        """
        self.manager.synchronize()

    def get_params(self) -> Tuple[Dict[str, mx.nd.NDArray], Dict[str, mx.nd.NDArray]]:
        """Return ``(arg_params, aux_params)``, the model being trained, as host copies.

        Waits for the training step in flight. On several devices, each
        device's BatchNorm statistics (auxiliary states) are first averaged
        and written back to every device (see the Notes of
        :class:`MainLoop`), so the model returned is the one every device
        then holds, evaluates and checkpoints.
        """
        self.manager.reconcile_aux_states()
        return self.manager.get_params()

    # ------------------------------------------------------------- inference
    def predict(
        self, iterator: mx.io.DataIter, outputs: Optional[Union[str, Sequence[str]]] = None
    ) -> Dict[str, np.ndarray]:
        """Return output name -> NumPy array over the iterator's real samples.

        The network runs forward (``is_train=False``) on the loop's devices with
        its current parameters (and, on several devices, the averaged BatchNorm
        statistics, as :class:`~mxoid.extensions.Evaluate` runs it), as
        ``Module.predict`` with ``merge_batches=True``: the padding of a last
        batch is dropped. ``outputs`` picks some outputs (``'softmax'`` or
        ``'softmax_output'``); all by default. The iterator needs no labels;
        batches of other sizes than training get executors of their own,
        sharing the parameters. The iterator is reset before and after.
        """
        from .inference import batch_key, input_descs, predict_outputs

        manager = self.manager
        managers: Dict[tuple, DataParallelExecutorManager] = {}

        def manager_for(batch: mx.io.DataBatch) -> DataParallelExecutorManager:
            data = list(zip(manager.data_names, batch.data))
            key = batch_key(data)
            if key not in managers:
                managers[key] = manager.evaluation_manager(
                    *input_descs(self.symbol, data, manager.label_names)
                )
            return managers[key]

        manager.reconcile_aux_states()
        self.synchronize()
        try:
            return predict_outputs(
                manager_for, iterator, outputs, manager.output_names, self.max_batches_ahead
            )
        finally:
            self.synchronize()

    def score(
        self, iterator: mx.io.DataIter, metrics: Any, name: str = "valid"
    ) -> Dict[str, float]:
        """Return the records :class:`~mxoid.extensions.Evaluate` computes on ``iterator`` now.

        ``metrics`` as Evaluate takes them; records are named
        ``<name>_<metric>`` (``<name>_<output>_<metric>`` with several
        outputs). Nothing is written into the log. With a distributed kvstore
        every worker must call it (the totals are summed over the workers).
        """
        from .extensions.evaluation import Evaluate

        evaluation = Evaluate({name: iterator}, metrics, name=f"score_{name}")
        evaluation.attach(self)
        return evaluation.evaluate()

    def pending_gradients(self) -> Optional[Dict[str, mx.nd.NDArray]]:
        """Return the gradients summed so far in an unfinished group of accumulated batches.

        Host copies by ``'<device>:<parameter>'``, for a checkpoint taken in the
        middle of a group; None when no group is open (or nothing accumulates).
        """
        if self._open_group() == 0:
            return None
        self.synchronize()
        manager = self.manager
        return {
            f"{device}:{name}": grads[device].copyto(mx.cpu())
            for name, grads in zip(manager.param_names, manager.grad_arrays)
            if grads[0] is not None
            for device in range(len(self.contexts))
        }

    def optimizer_states(self) -> Optional[bytes]:
        """Return the optimizer and its states as MXNet dumps them.

        None with a distributed kvstore (whose states live on the servers).
        """
        return self.update.states()

    # ------------------------------------------------------------ its state
    def state_dict(self) -> Dict[str, Any]:
        """Return the loop's state as plain JSON-ready data, for a checkpoint.

        Holds the log with the status, each extension's ``state_dict()``, the
        random states, the training iterator's position, and what
        :meth:`load_state_dict` checks; see :func:`mxoid.checkpoint.loop_state.loop_state`.
        Parameters and optimizer states are saved apart, in MXNet's own formats
        (see :mod:`mxoid.checkpoint.format`).
        """
        return loop_state(self)

    def load_state_dict(self, checkpoint: CheckpointContents) -> None:
        """Continue the run of ``checkpoint``.

        Restore its optimizer states, log, status, extension states, iterator
        position and random states (the parameters are set at construction);
        see :func:`mxoid.checkpoint.loop_state.restore_loop_state`. What must
        match was checked when the checkpoint was chosen (see
        :func:`~mxoid.checkpoint.compatibility.check_resumable`); optimizer
        settings given to this loop that differ from those the run started with
        win, with a warning each.
        """
        restore_loop_state(self, checkpoint, stacklevel=4)

    # -------------------------------------------------------------- profile
    def profile(self) -> List[tuple]:
        """Return ``(extension, hook, calls, seconds)`` per dispatched hook, slowest first."""
        return self.dispatcher.profile()

    def print_profile(self) -> None:
        """Print the time each extension spent in each hook."""
        print(f"{'extension':<24}{'hook':<18}{'calls':>10}{'seconds':>12}{'us/call':>10}")
        for name, hook, calls, seconds in self.profile():
            per_call = 1e6 * seconds / calls if calls else 0.0
            print(f"{name:<24}{hook:<18}{calls:>10}{seconds:>12.4f}{per_call:>10.1f}")


def _check_inputs(symbol: Any, train_data: Any, initializer: Any) -> None:
    if not isinstance(symbol, mx.sym.Symbol):
        raise TypeError(f"symbol must be an mx.sym.Symbol, not {type(symbol).__name__}")
    for attribute in ("provide_data", "provide_label", "reset"):
        if not hasattr(train_data, attribute):
            raise TypeError(
                f"train_data must be an mx.io.DataIter (it has no {attribute}); "
                f"got {type(train_data).__name__}"
            )
    if initializer is not None and not isinstance(initializer, mx.init.Initializer):
        raise TypeError(
            f"initializer must be an mx.init.Initializer such as mx.init.Xavier(), "
            f"not {type(initializer).__name__} ({initializer!r})"
        )


def _rows_per_device(
    train_data: mx.io.DataIter, devices: int, work_load_list: Optional[Sequence[float]]
) -> List[int]:
    """Return how many rows of a training batch each device gets (as the manager splits it).

    Empty when the inputs are not right: the manager then says what is wrong.
    """
    shares = list(work_load_list) if work_load_list is not None else [1] * devices
    try:
        batch_size = int(list(train_data.provide_data)[0][1][0])
        if not devices or len(shares) != devices:
            return []
        return [s.stop - s.start for s in split_batch(batch_size, shares)]
    except (ValueError, TypeError, IndexError):
        return []
