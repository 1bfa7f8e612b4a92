"""The main loop: epochs of batches, with hooks into extensions, and the loop's own state.

How it is built, in order (:meth:`MainLoop.__init__`): the settings checked,
the executors bound (with the private heads its extensions ask for), the
kvstore created, the checkpoint to resume from chosen
(:mod:`.resumption`), the initial parameters set, the optimizer step
prepared (:mod:`mxoid.update`), the log made, the extensions attached and
checked, and the checkpoint's state given back (:mod:`.state`). How it
trains: :mod:`.epochs`; the step after each batch: :mod:`.accumulation`; what
signals do: :mod:`.interrupt`.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import mxnet as mx

from ..checkpoint import CheckpointContents
from ..data.position import DataPosition
from ..distributed.servers import is_distributed
from ..distributed.workers import (
    allreduce_sums,
    check_equal_steps,
    check_same_checkpoint,
    exit_after_error,
)
from ..executor_manager import check_contexts
from ..executor_manager.pacing import DEFAULT_MAX_BATCHES_AHEAD, Pacer, check_max_batches_ahead
from ..extensions.base import Extension
from ..extensions.dispatch import HookDispatcher, check_extensions, check_record_names
from ..gluon import network_inputs
from ..log import TrainingLog, TrainingStatus
from ..log.files import RESUMED_FROM
from ..log.records import ERROR, TRAINING_FINISH_REQUESTED
from ..update import KVStoreLike, create_kvstore, prepare_update
from .accumulation import check_accumulate_batches
from .buckets import resolve_network
from .building import bind_training, check_inputs, set_initial_params
from .collective import agree_everywhere
from .epochs import end_epoch, finish_training, run_epoch, start_training
from .interrupt import InterruptHandlers, report_interruption
from .queries import LoopQueries
from .resumption import choose_checkpoint
from .state import loop_state, restore_loop_state

__all__ = ["MainLoop"]

logger = logging.getLogger("mxoid.main_loop")

LOOP_RECORDS = (TRAINING_FINISH_REQUESTED, RESUMED_FROM, ERROR)
"""The records the loop itself writes: no extension may write them."""


class MainLoop(LoopQueries):
    """Train a symbol on a data iterator, epoch after epoch, until an extension stops it.

    The loop owns a :class:`DataParallelExecutorManager` (one executor per
    context, each batch split across them) and the optimizer step
    (:class:`mxoid.update.Update`: the optimizer, the kvstore, the updater).
    Every batch it loads the data, runs forward and backward, and updates the
    parameters, either on the kvstore or with a local updater per device.
    Extensions see the whole loop (``extension.main_loop``) at the hooks
    ``before_training``, ``before_epoch``, ``before_batch``,
    ``after_backward``, ``before_update``, ``after_update``, ``after_batch``,
    ``after_epoch``, ``after_training`` (and ``on_resumption``,
    ``on_interrupt``, ``on_error``).

    Parameters
    ----------
    symbol : mx.sym.Symbol, callable or gluon.HybridBlock
        The network; several outputs with ``mx.sym.Group``. Or a
        ``BucketingModule``-style ``sym_gen(bucket_key) -> (symbol, data_names,
        label_names)`` for batches of several shapes (see :mod:`.buckets`). Or a
        Gluon ``HybridBlock`` with ``loss``: traced to a symbol, its parameter
        values taken, the trained ones written back when training ends
        (:mod:`mxoid.gluon`).
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
        False with ``dist_sync`` (the workers run it) makes resumption exact:
        the checkpoints then hold the optimizer states, which the servers'
        optimizer (the default of a dist kvstore) loses.
    work_load_list : list of float, optional
        Relative share of each device in a batch.
    extensions : sequence of Extension
        At least one of them must be able to stop training.
    resume_from : str or path-like, optional
        A :class:`~mxoid.extensions.Checkpoint` directory (its newest whole
        checkpoint) or one checkpoint folder: training resumes exactly where
        it left off (:mod:`mxoid.main_loop.state`: the training iterator must be
        built as for the interrupted run); ``on_resumption`` fires instead of
        ``before_training``. What it accepts: :mod:`mxoid.main_loop.resumption`.
        In distributed training every worker reads the one checkpoint rank 0
        wrote (a shared file system) and takes its own iterator position and
        random states from it (:mod:`mxoid.main_loop.ranks`).
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
        take one optimizer step per group, so that k batches of n train as one
        batch of k * n (``rescale_grad`` defaults to ``1 / (k * n * workers)``;
        ``status.updates_done`` counts the steps). See
        :mod:`mxoid.main_loop.accumulation`.
    max_batches_ahead : int, 'auto' or None, default 'auto'
        How many batches the host may queue ahead of the devices, whose input
        arrays stay in memory until the devices reach them: ``'auto'`` (as many
        as fit 64 MiB), an int (at least 2), or None (no bound). Evaluation and
        prediction keep the same bound. See :mod:`mxoid.executor_manager.pacing`.
    default_bucket_key : optional
        With a ``sym_gen``: the bucket whose executors are bound first
        (``train_data.default_bucket_key`` by default).
    loss : gluon.HybridBlock, optional
        With a Gluon block: the training objective, ``loss(output, label)`` per
        row (``gluon.loss.SoftmaxCrossEntropyLoss()``); its gradient summed over
        the batch and rescaled by ``1 / batch_size``, as ``trainer.step(batch_size)``.

    Attributes
    ----------
    manager : DataParallelExecutorManager
    update : mxoid.update.Update
        The optimizer step; ``optimizer``, ``kvstore``, ``update_on_kvstore``
        and ``updater`` are its attributes, and the loop's.
    kvstore : KVStore or None
        Sums gradients over devices and workers.
    update_on_kvstore : bool
        Whether the kvstore (or the servers) runs the optimizer.
    updater : mx.optimizer.Updater or None
        The local updater, when the kvstore does not update.
    status : TrainingStatus
    log : TrainingLog
    current_batch : mx.io.DataBatch or None
        The batch being trained, for extensions.
    run_id : str
        The run this loop trains, kept across resumptions (checkpoints carry it).
    resumed_from : str or None
        The checkpoint folder training resumed from.
    gluon : mxoid.gluon.GluonNetwork or None
        The traced Gluon block (None for a symbol).

    Notes
    -----
    Several devices and BatchNorm: each device updates its own moving
    statistics from its slice of the batch. At every epoch end (as
    ``Module.fit``), before every evaluation and checkpoint, in
    :meth:`get_params` and when training ends, the loop averages them over
    the devices and writes the average back (see
    :meth:`DataParallelExecutorManager.reconcile_aux_states`), so that what is
    evaluated, saved and returned is one network; a mid-epoch evaluation or
    checkpoint therefore changes the statistics the rest of the epoch starts
    from (on one device nothing). With a distributed kvstore each worker keeps
    its own statistics; rank 0's are saved (and every worker resumes with them).

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
        default_bucket_key: Any = None,
        loss: Any = None,
    ) -> None:
        kv = kvstore if isinstance(kvstore, mx.kv.KVStore) else None
        try:
            symbol, train_data, self.gluon = network_inputs(symbol, train_data, loss, initializer)
            if self.gluon is not None:
                arg_params, aux_params, fixed_param_names = self.gluon.loop_settings(
                    arg_params, aux_params, fixed_param_names
                )
            symbol, self.buckets = resolve_network(symbol, train_data, default_bucket_key)
            check_inputs(symbol, train_data, initializer)
            self.extensions = check_extensions(extensions)
            self.symbol, self.train_data = symbol, train_data
            self.contexts = check_contexts(contexts)
            self.accumulate_batches = check_accumulate_batches(accumulate_batches)
            self.max_batches_ahead = check_max_batches_ahead(max_batches_ahead)
            self.exit_on_interrupt = exit_on_interrupt
            self._start_run()
            self.manager, owners = bind_training(self, work_load_list, fixed_param_names)
            self.head_owners = {id(self.manager.training_set): owners}
            if self.gluon is not None:
                self.manager.evaluation_symbol = self.gluon.evaluation_symbol
            self._pacer = Pacer.of_training(self.manager, self.max_batches_ahead)
            kv, on_kvstore = create_kvstore(kvstore, len(self.contexts), update_on_kvstore)
            self._collective = is_distributed(kv)
            checkpoint = self._checkpoint_to_resume(resume_from, on_kvstore, kv)
            initial = set_initial_params(
                self.manager, symbol, initializer, arg_params, aux_params, allow_extra, checkpoint
            )
            self.update = prepare_update(
                self.manager,
                symbol,
                kv,
                on_kvstore,
                optimizer,
                optimizer_params,
                initial,
                accumulate_batches=accumulate_batches,
            )
            self.kvstore, self.updater = self.update.kvstore, self.update.updater
            self.update_on_kvstore = self.update.update_on_kvstore
            if self._collective:
                check_equal_steps(kv, train_data)
                check_same_checkpoint(kv, checkpoint and checkpoint.identity)
            self._attach_extensions(kv)
            if checkpoint is not None:
                self.load_state_dict(checkpoint)
        except BaseException as error:
            if is_distributed(kv):  # the other workers would wait for this one forever
                exit_after_error(error, kv.rank)
            raise

    def _start_run(self) -> None:
        self.run_id = uuid.uuid4().hex
        self.resumed_from: Optional[str] = None
        self.current_batch: Optional[mx.io.DataBatch] = None
        self.data_position = DataPosition(self.train_data)
        self._stop_everywhere = False

    def _checkpoint_to_resume(
        self,
        resume_from: Optional[os.PathLike[str] | str],
        on_kvstore: bool,
        kv: Optional[mx.kv.KVStore],
    ) -> Optional[CheckpointContents]:
        return choose_checkpoint(
            resume_from,
            self.checkpoint_directories,
            self.symbol,
            self.manager,
            self.data_position,
            update_on_kvstore=on_kvstore,
            accumulate_batches=self.accumulate_batches,
            states_on_servers=self._collective and on_kvstore,
            rank=kv.rank if self._collective else 0,
            num_workers=kv.num_workers if self._collective else 1,
        )

    def _attach_extensions(self, kv: Optional[mx.kv.KVStore]) -> None:
        """Make the log, attach every extension, and check that no two write one record."""
        self.log = TrainingLog()
        self.status: TrainingStatus = self.log.status
        if kv is not None:
            self.status.rank, self.status.num_workers = kv.rank, kv.num_workers
        self.dispatcher = HookDispatcher(self.extensions, rank=self.status.rank)
        for extension in self.extensions:
            extension.attach(self)
        check_record_names(self.extensions, reserved={"the loop": LOOP_RECORDS})

    @property
    def checkpoint_directories(self) -> List[str]:
        """The directories the loop's extensions write checkpoints into (see ``resume_from``)."""
        return [
            e.checkpoint_directory for e in self.extensions if e.checkpoint_directory is not None
        ]

    @property
    def optimizer(self) -> mx.optimizer.Optimizer:
        """The optimizer that updates the parameters (a resumption gives the checkpoint's)."""
        return self.update.optimizer

    def private_outputs(self, extension: Extension) -> Optional[List[mx.nd.NDArray]]:
        """Return, per device, the output of the private head ``extension`` asked for, or None.

        See :meth:`Extension.private_head`; an extension attached later has none.
        """
        current = self.manager.current
        index = self.head_owners.get(id(current), {}).get(id(extension))
        return None if index is None else current.private_outputs[index]

    def reduction(self, extension: Extension) -> Any:
        """Return a function summing ``extension``'s ``(sum, count)`` totals over the workers.

        :func:`mxoid.distributed.allreduce_sums`; None on one worker, and for an
        extension of rank 0 only (a reduction needs every worker).
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
            What training or a hook raised, once the ``on_error`` hooks ran and
            the log has the record ``error``. A distributed worker prints it and
            exits instead (:func:`mxoid.distributed.exit_after_error`).
        """
        status = self.status
        self._stop_everywhere = False
        try:
            with InterruptHandlers(status):
                start_training(self)
                while not status.stop_requested or self._stop_deferred():
                    if not run_epoch(self):
                        break
                    end_epoch(self)
                finish_training(self)
                if self.gluon is not None:  # the block is the model: it holds what was trained
                    self.gluon.write_back(*self.get_params())
        except BaseException as error:
            if isinstance(error, Exception):
                self._record_error(error)
            if self._collective:  # would hang at exit in ps-lite's finalize barrier
                exit_after_error(error, status.rank)
            raise
        if status.interrupted is not None:
            report_interruption(
                status,
                self.log.last("checkpoint_saved_to", None),
                self.checkpoint_directories,
                exit=self.exit_on_interrupt,
            )
        return self

    def request_stop(self, reason: str, *, every_rank: bool = False) -> None:
        """Ask the loop to stop: after this batch in ``after_batch``, this epoch in ``after_epoch``.

        The reason is kept in ``status.stop_reason`` and recorded in the log as
        ``training_finish_requested``. In distributed training the workers stop
        together, after the same batch: at the next agreement, at most
        :attr:`stop_agreement_batches` batches later (and at every epoch end),
        or at once with ``every_rank=True``, which says that every worker asks
        it at this very batch (a limit on batches or epochs).
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
        return agree_everywhere(self, epoch_end)

    def _record_error(self, error: Exception) -> None:
        origin = getattr(error, "mxoid_origin", None)
        where = f" (in extension {origin[0]!r}, hook {origin[1]})" if origin else ""
        self.log.current_row[ERROR] = f"{type(error).__name__}: {error}{where}"
        self.dispatcher.fire_on_error(error)

    # ------------------------------------------------------------ its state
    def state_dict(self) -> Dict[str, Any]:
        """Return the loop's state as plain JSON-ready data (:func:`.state.loop_state`).

        Parameters and optimizer states are saved apart, in MXNet's own formats.
        """
        return loop_state(self)

    def load_state_dict(self, checkpoint: CheckpointContents) -> None:
        """Continue the run of ``checkpoint`` (:func:`.state.restore_loop_state`).

        The parameters were set at construction; optimizer settings given to
        this loop that differ from the run's win, with a warning each.
        """
        restore_loop_state(self, checkpoint, stacklevel=4)
