"""The main loop: epochs of batches, with hooks into extensions, and the loop's own state.

How it is built, in order (:meth:`MainLoop.__init__`): what it trains made a
:class:`~mxoid.network.Network` (:func:`mxoid.network.as_network`: a symbol,
a ``sym_gen`` or a Gluon block), the settings checked, the executors bound
(with the private heads its extensions ask for), the kvstore created, the
checkpoint to resume from chosen (:mod:`.resumption`), the initial parameters
set, the optimizer step prepared (:mod:`mxoid.update`), the log made, the
extensions attached and checked, the stop requests (:mod:`.stops`) and the
training (:class:`~mxoid.main_loop.epochs.Training`) made, and the
checkpoint's state given back (:mod:`.state`). How it trains: :mod:`.epochs`;
the step after each batch: :mod:`.accumulation`; what signals do:
:mod:`.interrupt`.
"""

from __future__ import annotations

import os
import uuid
import warnings
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import mxnet as mx
import numpy as np

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
from ..log import TrainingLog, TrainingStatus
from ..log.files import RESUMED_FROM
from ..log.records import ERROR, TRAINING_FINISH_REQUESTED
from ..loss_scale import ScaledGraphs, check_loss_scale
from ..network import as_network, legacy_view
from ..precision import check_mixed_precision
from ..update import KVStoreLike, create_kvstore, loop_scaler, prepare_update
from .accumulation import check_accumulate_batches, pending_gradients
from .building import bind_training, check_inputs, heads_asker, set_initial_params
from .epochs import Training
from .interrupt import InterruptHandlers, report_interruption
from .ranks import gather_rank_states
from .resumption import choose_checkpoint
from .server_optimizer import server_states_file
from .state import loop_state, restore_loop_state
from .stops import StopRequests

__all__ = ["MainLoop"]

LOOP_RECORDS = (TRAINING_FINISH_REQUESTED, RESUMED_FROM, ERROR)
"""The records the loop itself writes: no extension may write them."""
DEPRECATED = (
    "MainLoop.{name} is deprecated since mxoid 0.5: ask loop.network, what the loop trains "
    "(mxoid.network)"
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
    ``after_backward``, ``before_update``, ``after_update``, ``after_batch``,
    ``after_epoch``, ``after_training`` (and ``on_resumption``,
    ``on_interrupt``, ``on_error``).

    Parameters
    ----------
    symbol : mx.sym.Symbol, callable or gluon.HybridBlock
        The network; several outputs with ``mx.sym.Group``. Or a
        ``BucketingModule``-style ``sym_gen(bucket_key) -> (symbol, data_names,
        label_names)`` for batches of several shapes (see
        :mod:`mxoid.network.buckets`). Or a Gluon ``HybridBlock`` with ``loss``:
        traced to a symbol, its parameter values taken, the trained ones written
        back when training ends (:mod:`mxoid.network.gluon`). Each becomes the
        loop's :attr:`network` (:mod:`mxoid.network`).
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
        Resumption is exact with ``dist_sync`` either way: the checkpoints hold
        the optimizer states, rank 0's (False: the workers run it) or the
        servers' (the default of a dist kvstore: :mod:`.server_optimizer`).
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
    mixed_precision : {None, 'bfloat16', 'float16'}, default None
        Compute in this type where MXNet's automatic mixed precision does
        (``mx.contrib.amp``; its ``target_dtype``): convolutions and fully
        connected layers, and the dtype-neutral operators between them. The
        parameters, their gradients, the optimizer's states, checkpoints and
        :meth:`get_params` stay float32. ``'bfloat16'`` on CPUs with AVX-512
        (checked when the loop is built: a ``ValueError`` says why not);
        ``'float16'`` on GPUs. Every kind of network (a symbol, a ``sym_gen``,
        a Gluon block) and every extension as in float32. See
        :mod:`mxoid.precision`.
    loss_scale : 'auto', 'dynamic', float, DynamicLossScale or None, default 'auto'
        Loss scaling (:mod:`mxoid.loss_scale`): the loss's gradient multiplied
        by a scale in the graph and divided out in the step, a step
        whose gradients overflowed skipped on every device. ``'dynamic'``:
        MXNet AMP's rule (from ``2**16``, halved on an overflow, doubled after
        2000 clean steps; :class:`mxoid.loss_scale.DynamicLossScale` sets the
        numbers); a float: a fixed scale; ``'auto'``: ``'dynamic'`` under
        ``mixed_precision='float16'``, else None (float32 and bfloat16 need
        none). It costs one host sync per step (and, with ``dist_sync`` and the
        optimizer on the servers, one exchange between the workers); not with
        ``dist_async``.

    Attributes
    ----------
    network : mxoid.network.Network
        What the loop trains: which graph and which executors serve a batch or
        an evaluation, what goes back to the user's block
        (:mod:`mxoid.network`); every built-in extension asks it.
    symbol : mx.sym.Symbol
        The graph of the training executors (a sym_gen's default bucket's; a
        block's, traced in training mode with its loss).
    train_data : mx.io.DataIter
        The training iterator (a Gluon ``DataLoader`` read through
        :class:`~mxoid.data.DataLoaderIter`).
    contexts : list of Context
    extensions : list of Extension
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
    data_position : mxoid.data.position.DataPosition
        Where the training iterator stands (checkpoints keep it).
    dispatcher : HookDispatcher
        Fires the extensions' hooks (their order, conditions and states).
    stops : StopRequests
        The stop requests (:meth:`request_stop`) and, in distributed
        training, the workers' agreement on them.
    training : mxoid.main_loop.epochs.Training
        The epochs of batches (:meth:`run`).
    accumulate_batches, max_batches_ahead, exit_on_interrupt
        As given.
    mixed_precision : str or None
        The compute type given (None: float32).
    gluon, buckets
        Deprecated (mxoid 0.4): ``network`` where it is a Gluon block's or a
        sym_gen's, else None.

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

    default_stop_agreement_batches: int = 20
    """The :attr:`stop_agreement_batches` of a new loop."""

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
        mixed_precision: Optional[str] = None,
        loss_scale: Any = "auto",
    ) -> None:
        kv = kvstore if isinstance(kvstore, mx.kv.KVStore) else None
        try:
            precision = check_mixed_precision(mixed_precision, check_contexts(contexts))
            self.mixed_precision = None if precision is None else precision.dtype
            scaling = check_loss_scale(loss_scale, self.mixed_precision)
            graphs = precision if scaling is None else ScaledGraphs(precision)
            self.network = as_network(
                symbol, train_data, loss, initializer, default_bucket_key, graphs
            )
            symbol, train_data = self.network.symbol, self.network.train_data
            arg_params, aux_params, fixed_param_names = self.network.loop_settings(
                arg_params, aux_params, fixed_param_names
            )
            check_inputs(symbol, train_data, initializer)
            self.extensions = check_extensions(extensions)
            self.symbol, self.train_data = symbol, train_data
            self.contexts = check_contexts(contexts)
            self.accumulate_batches = check_accumulate_batches(accumulate_batches)
            self.max_batches_ahead = check_max_batches_ahead(max_batches_ahead)
            self.exit_on_interrupt = exit_on_interrupt
            self._start_run()
            ask_heads = heads_asker(self.extensions, self.contexts, work_load_list)
            self.manager = bind_training(self, ask_heads, work_load_list, fixed_param_names)
            kv, on_kvstore = create_kvstore(kvstore, len(self.contexts), update_on_kvstore)
            distributed = is_distributed(kv)
            checkpoint = self._checkpoint_to_resume(resume_from, on_kvstore, kv, distributed)
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
            if scaling is not None:
                self.update.loss_scaler = loop_scaler(scaling, self.manager, self.update, kv)
            self.kvstore, self.updater = self.update.kvstore, self.update.updater
            self.update_on_kvstore = self.update.update_on_kvstore
            if distributed:
                check_equal_steps(kv, train_data)
                check_same_checkpoint(kv, checkpoint and checkpoint.identity)
            self._attach_extensions(kv, distributed)
            self.training = Training(
                self.network,
                self.manager,
                self.update,
                self.log,
                self.dispatcher,
                self.stops,
                self.data_position,
                Pacer.of_training(self.manager, self.max_batches_ahead),
                self.accumulate_batches,
                ask_heads,
                self.synchronize,
            )
            if checkpoint is not None:
                self.load_state_dict(checkpoint)
        except BaseException as error:
            if is_distributed(kv):  # the other workers would wait for this one forever
                exit_after_error(error, kv.rank)
            raise

    def _start_run(self) -> None:
        self.run_id = uuid.uuid4().hex
        self.resumed_from: Optional[str] = None
        self.data_position = DataPosition(self.train_data)

    def _checkpoint_to_resume(
        self,
        resume_from: Optional[os.PathLike[str] | str],
        on_kvstore: bool,
        kv: Optional[mx.kv.KVStore],
        distributed: bool,
    ) -> Optional[CheckpointContents]:
        return choose_checkpoint(
            resume_from,
            self.checkpoint_directories,
            self.symbol,
            self.manager,
            self.data_position,
            update_on_kvstore=on_kvstore,
            accumulate_batches=self.accumulate_batches,
            states_on_servers=distributed and on_kvstore,
            rank=kv.rank if distributed else 0,
            num_workers=kv.num_workers if distributed else 1,
            names=self.network.checkpoint_names,
        )

    def _attach_extensions(self, kv: Optional[mx.kv.KVStore], distributed: bool) -> None:
        """Make the log and the stop requests, attach every extension, check the record names.

        ``distributed``: the workers agree on stops through ``kv``.
        """
        self.log = TrainingLog()
        self.status: TrainingStatus = self.log.status
        if kv is not None:
            self.status.rank, self.status.num_workers = kv.rank, kv.num_workers
        if self.update.loss_scaler is not None:
            self.status.loss_scale = self.update.loss_scaler.scale
        every = self.default_stop_agreement_batches
        self.stops = StopRequests(self.log, kv if distributed else None, every)
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
        return self.manager.current.private_output_of(extension)

    def reduction(self, extension: Extension) -> Any:
        """Return a function summing ``extension``'s ``(sum, count)`` totals over the workers.

        :func:`mxoid.distributed.allreduce_sums`; None on one worker, and for an
        extension of rank 0 only (a reduction needs every worker).
        """
        if not self.stops.collective or extension.rank_zero_only:
            return None
        return lambda totals: allreduce_sums(self.kvstore, extension.name, totals)

    @property
    def stop_agreement_batches(self) -> int:
        """How often the workers agree on stopping, in distributed training.

        Every this many batches (and at every epoch end) they agree on whether
        one of them asked to stop; a stop asked on one worker takes effect on
        all at the next agreement. Each agreement is one small exchange through
        the servers.
        """
        return self.stops.every

    @stop_agreement_batches.setter
    def stop_agreement_batches(self, value: int) -> None:
        self.stops.every = value

    @property
    def current_batch(self) -> Optional[mx.io.DataBatch]:
        """The batch being trained, for extensions (None before the first)."""
        training = getattr(self, "training", None)
        return None if training is None else training.current_batch

    @property
    def gluon(self) -> Any:
        """Deprecated: ``network``, where it is a Gluon block's (else None)."""
        warnings.warn(DEPRECATED.format(name="gluon"), DeprecationWarning, stacklevel=2)
        return legacy_view(self.network, "gluon")

    @property
    def buckets(self) -> Any:
        """Deprecated: ``network``, where it is a sym_gen's buckets (else None)."""
        warnings.warn(DEPRECATED.format(name="buckets"), DeprecationWarning, stacklevel=2)
        return legacy_view(self.network, "buckets")

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
        status, training, stops = self.status, self.training, self.stops
        try:
            with InterruptHandlers(status):
                training.start()
                while not status.stop_requested or stops.deferred():
                    if not training.run_epoch():
                        break
                    training.end_epoch()
                training.finish()
                self.network.give_back(self.get_params)  # a block is the model: it gets them
        except BaseException as error:
            if isinstance(error, Exception):
                self._record_error(error)
            if stops.collective:  # would hang at exit in ps-lite's finalize barrier
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
        self.stops.request(reason, every_rank=every_rank)

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

    def checkpoint_files(
        self, arg_params: Dict[str, mx.nd.NDArray], aux_params: Dict[str, mx.nd.NDArray]
    ) -> Dict[str, Callable[[str], Any]]:
        """Return the files a checkpoint holds beside MXNet's, by name.

        Each extension's (:meth:`Extension.checkpoint_files`: an average's model), then
        the network's (a Gluon block's, :meth:`mxoid.network.GluonNetwork.checkpoint_files`;
        none for a symbol). With ``dist_sync`` and the optimizer on the servers, the
        servers' optimizer states too (:func:`.server_optimizer.server_states_file`: rank 0
        asks the servers).
        """
        files: Dict[str, Callable[[str], Any]] = {}
        for extension in self.extensions:
            files.update(extension.checkpoint_files(arg_params, aux_params))
        # The network's last: a Gluon block is set to the values it is given, the model's.
        files.update(self.network.checkpoint_files(arg_params, aux_params))
        return {**files, **server_states_file(self)}

    def gather_rank_states(self, mxnet_seed: int) -> Optional[List[Dict[str, Any]]]:
        """Return every worker's random states and iterator position, in rank order.

        A collective call in distributed training, which every worker makes at
        the same batch (:func:`mxoid.main_loop.ranks.gather_rank_states`); None
        on one worker. ``mxnet_seed``: the seed this worker gives MXNet there.
        """
        return gather_rank_states(self, mxnet_seed)

    def optimizer_states(self) -> Optional[bytes]:
        """Return the optimizer and its states as MXNet dumps them (None: on the servers)."""
        return self.update.states()

    # ------------------------------------------------------------ the network
    def synchronize(self) -> None:
        """Wait for the training step in flight: before reading, saving or evaluating the network.

        The per-batch path never waits; an extension that reads
        ``manager.param_arrays``, ``aux_arrays`` or ``outputs`` calls this
        first (why: :meth:`DataParallelExecutorManager.synchronize`).
        """
        self.manager.synchronize()

    def get_params(self) -> Tuple[Dict[str, mx.nd.NDArray], Dict[str, mx.nd.NDArray]]:
        """Return ``(arg_params, aux_params)``, the model being trained, as host copies.

        Waits for the step in flight; BatchNorm statistics are first averaged
        over the devices and written back (the Notes of :class:`MainLoop`).
        """
        self.manager.reconcile_aux_states()
        return self.manager.get_params()

    def pending_gradients(self) -> Optional[Dict[str, mx.nd.NDArray]]:
        """Return the gradients of an unfinished accumulation group (see :mod:`.accumulation`)."""
        return pending_gradients(self.status, self.manager, self.accumulate_batches)

    # ------------------------------------------------------------- inference
    def predict(
        self, iterator: mx.io.DataIter, outputs: Optional[Union[str, Sequence[str]]] = None
    ) -> Dict[str, np.ndarray]:
        """Return output name -> NumPy array over the iterator's real samples, as of now.

        As ``Module.predict(merge_batches=True)``: the padding of a last batch
        is dropped; ``outputs`` picks some (``'softmax'``); the iterator needs
        no labels and is reset before and after. A Gluon ``DataLoader`` (of data
        and labels, or data alone) is read in order through
        :class:`mxoid.data.DataLoaderIter`, its arrays named as the training inputs.
        See :func:`mxoid.inference.predict_on`.
        """
        from ..data.loader import as_input_iter
        from ..inference import predict_on

        names = self.manager.data_names, self.manager.label_names
        iterator = as_input_iter(iterator, *names)
        return predict_on(self.manager, self.network, iterator, outputs, self.max_batches_ahead)

    def score(
        self, iterator: mx.io.DataIter, metrics: Any, name: str = "valid", parameters: Any = None
    ) -> Dict[str, float]:
        """Return the records :class:`~mxoid.extensions.Evaluate` computes on ``iterator`` now.

        ``metrics`` as Evaluate takes them; records ``<name>_<metric>``; nothing
        is logged. ``parameters``: an average to evaluate instead of the
        parameters (:class:`~mxoid.ExponentialMovingAverage`). In distributed
        training every worker calls it.
        """
        from ..inference import score_on

        return score_on(self, iterator, metrics, name, parameters)

    # -------------------------------------------------------------- profile
    def profile(self) -> List[tuple]:
        """Return ``(extension, hook, calls, seconds)`` per dispatched hook, slowest first."""
        return self.dispatcher.profile()

    def print_profile(self) -> None:
        """Print the time each extension spent in each hook."""
        self.dispatcher.print_profile()
