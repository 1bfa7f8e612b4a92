"""The main loop: epochs of batches, with hooks into extensions."""
from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import uuid
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import mxnet as mx
import numpy as np

from .data_position import DataPosition
from .dispatch import HookDispatcher
from .distributed import (
    allgather,
    exit_after_error,
    is_distributed,
    prepare_workers,
    pull_parameters,
)
from .executor_manager import DataParallelExecutorManager
from .extensions.base import Extension
from .initialization import initial_params
from .interrupt import InterruptHandlers
from .log import TrainingLog, TrainingStatus
from .extensions.saveload import Checkpoint
from .resumption import (
    check_compatible,
    checkpoint_folder,
    find_checkpoint,
    loop_state,
    optimizer_settings,
    optimizer_states,
    restore_loop,
)
from .update import (
    KVStoreLike,
    create_kvstore,
    create_optimizer,
    initialize_kvstore,
    kvstore_keys,
    local_update,
    update_params_on_kvstore,
)
from .updater import create_updater

__all__ = ["MainLoop"]

logger = logging.getLogger(__name__)

NOTHING_STOPS = (
    "nothing can stop this loop: none of its extensions requests a stop. Add "
    "FinishAfter(after_n_epochs=...) (or EarlyStopping, NaNGuard...), or set "
    "stops_training = True on your own extension that calls main_loop.request_stop()")


class MainLoop:
    """Train a symbol on a data iterator, epoch after epoch, until an extension stops it.

    The loop owns a :class:`DataParallelExecutorManager` (one executor per
    context, each batch split across them), the optimizer and the kvstore.
    Every batch it loads the data, runs forward and backward, and updates the
    parameters, either on the kvstore or with a local updater per device.
    Extensions see the whole loop (``extension.main_loop``) at the hooks
    ``before_training``, ``before_epoch``, ``before_batch``, ``after_batch``,
    ``after_epoch``, ``after_training`` (and ``on_resumption``,
    ``on_interrupt``, ``on_error``).

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
    resume_from : str, optional
        A :class:`~mxoid.extensions.Checkpoint` folder: training resumes
        exactly where its newest whole checkpoint left it (parameters,
        optimizer states, counters, log, extension states, random states and
        the position of the training iterator, which must be built as for the
        interrupted run). ``on_resumption`` fires instead of
        ``before_training``. With no whole checkpoint there yet, training
        starts from scratch with a warning.
    exit_on_interrupt : bool, default True
        After Ctrl-C or SIGTERM has stopped training cleanly (``on_interrupt``
        and ``after_training`` hooks run), exit the process with status
        128 + signal number and a message saying how to resume. False makes
        :meth:`run` return instead.

    Attributes
    ----------
    manager : DataParallelExecutorManager
    optimizer : mx.optimizer.Optimizer
    kvstore : KVStore or None
    update_on_kvstore : bool
    updater : callable or None
        The local updater, when the kvstore does not update.
    status : TrainingStatus
    log : TrainingLog
    current_batch : mx.io.DataBatch or None
        The batch being trained, for extensions.

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
    >>> loop = MainLoop(net, train_iter, contexts=[mx.cpu(0), mx.cpu(1)],
    ...                 optimizer_params={'learning_rate': 0.1},
    ...                 extensions=[FinishAfter(after_n_epochs=5)])
    >>> loop.run()
    >>> arg_params, aux_params = loop.get_params()
    """

    stop_agreement_batches: int = 20
    """In distributed training, the workers agree every this many batches (and at every epoch
    end) on whether one of them asked to stop; a stop asked on one worker takes effect on all
    at the next agreement. Each agreement is one small exchange through the servers."""

    def __init__(self, symbol: mx.sym.Symbol, train_data: mx.io.DataIter, *,
                 contexts: Union[None, mx.Context, Sequence[mx.Context]] = None,
                 optimizer: Union[str, mx.optimizer.Optimizer] = "sgd",
                 optimizer_params: Optional[Dict[str, Any]] = None,
                 initializer: Optional[mx.init.Initializer] = None,
                 arg_params: Optional[Mapping[str, mx.nd.NDArray]] = None,
                 aux_params: Optional[Mapping[str, mx.nd.NDArray]] = None,
                 kvstore: KVStoreLike = "local", update_on_kvstore: Optional[bool] = None,
                 work_load_list: Optional[Sequence[float]] = None,
                 extensions: Sequence[Extension] = (), resume_from: Optional[str] = None,
                 exit_on_interrupt: bool = True) -> None:
        given_kvstore = kvstore if isinstance(kvstore, mx.kv.KVStore) else None
        try:
            self._check_inputs(symbol, train_data, initializer)
            self.extensions = _check_extensions(extensions)
            self.symbol = symbol
            self.train_data = train_data
            self.contexts = _check_contexts(contexts)
            self.exit_on_interrupt = exit_on_interrupt
            self.run_id = uuid.uuid4().hex
            self.manager = DataParallelExecutorManager(
                symbol, self.contexts, train_data.provide_data, train_data.provide_label,
                work_load_list=work_load_list)
            self.kvstore, self.update_on_kvstore = create_kvstore(
                kvstore, len(self.contexts), update_on_kvstore)
            self._collective = is_distributed(self.kvstore)
            self._stop_everywhere = False
            self.data_position = DataPosition(train_data)
            checkpoint = find_checkpoint(
                resume_from, [e.directory for e in self.extensions if isinstance(e, Checkpoint)],
                functools.partial(check_compatible, self))
            if checkpoint is not None:
                arg_params, aux_params = checkpoint.arg_params, checkpoint.aux_params
            self._set_up_training(initializer, arg_params, aux_params, optimizer,
                                  optimizer_params)
            self.log = TrainingLog()
            self.status: TrainingStatus = self.log.status
            if self.kvstore is not None:
                self.status.rank = self.kvstore.rank
                self.status.num_workers = self.kvstore.num_workers
            self.current_batch: Optional[mx.io.DataBatch] = None
            for extension in self.extensions:
                extension.main_loop = self
            self.dispatcher = HookDispatcher(self.extensions, rank=self.status.rank)
            self.resumed_from: Optional[str] = None
            if checkpoint is not None:
                restore_loop(self, checkpoint)
                self.resumed_from = checkpoint.path
        except BaseException as error:
            kv = getattr(self, "kvstore", None) or given_kvstore
            if is_distributed(kv):  # the other workers would wait for this one forever
                exit_after_error(error, kv.rank)
            raise

    # ----------------------------------------------------------------- setup
    @staticmethod
    def _check_inputs(symbol: Any, train_data: Any, initializer: Any) -> None:
        if not isinstance(symbol, mx.sym.Symbol):
            raise TypeError(f"symbol must be an mx.sym.Symbol, not {type(symbol).__name__}")
        for attribute in ("provide_data", "provide_label", "reset"):
            if not hasattr(train_data, attribute):
                raise TypeError(f"train_data must be an mx.io.DataIter (it has no {attribute}); "
                                f"got {type(train_data).__name__}")
        if initializer is not None and not isinstance(initializer, mx.init.Initializer):
            raise TypeError(f"initializer must be an mx.init.Initializer such as "
                            f"mx.init.Xavier(), not {type(initializer).__name__} "
                            f"({initializer!r})")

    def _set_up_training(self, initializer: Optional[mx.init.Initializer],
                         arg_params: Optional[Mapping[str, mx.nd.NDArray]],
                         aux_params: Optional[Mapping[str, mx.nd.NDArray]],
                         optimizer: Union[str, mx.optimizer.Optimizer],
                         optimizer_params: Optional[Dict[str, Any]]) -> None:
        """Initial parameters on the devices, the optimizer, the kvstore and the updater."""
        manager = self.manager
        arg_values, aux_values = initial_params(manager, self.symbol, initializer,
                                                 arg_params, aux_params)
        # Before the kvstore is initialized: with several devices it holds
        # the master copy, which would overwrite values set later.
        manager.set_params(arg_values, aux_values)
        self.optimizer = create_optimizer(
            optimizer, optimizer_params, symbol=self.symbol, param_names=manager.param_names,
            num_devices=len(self.contexts), batch_size=manager.batch_size, kvstore=self.kvstore,
            update_on_kvstore=self.update_on_kvstore)
        self.optimizer_settings = optimizer_settings(self.optimizer)
        if self.kvstore is not None:
            initialize_kvstore(self.kvstore, manager.param_arrays, arg_values,
                               manager.param_names, self.update_on_kvstore,
                               kvstore_keys(self.kvstore, manager.param_names))
            if is_distributed(self.kvstore):  # the servers' optimizer, equal steps, reductions
                prepare_workers(self.kvstore, self.optimizer if self.update_on_kvstore else None,
                                len(manager.param_names), self.train_data, self.extensions)
            elif self.update_on_kvstore:
                # What kvstore.set_optimizer does on one machine, with the faster updater.
                self.kvstore._set_updater(create_updater(self.optimizer))
        self.updater = None if self.update_on_kvstore else create_updater(self.optimizer)
        self._update = self._make_update()

    # ----------------------------------------------------------------- setup
    def _make_update(self):
        manager = self.manager
        keys = kvstore_keys(self.kvstore, manager.param_names)
        if self.update_on_kvstore:
            return functools.partial(update_params_on_kvstore, manager.param_arrays,
                                     manager.grad_arrays, self.kvstore, keys)
        return local_update(manager.param_arrays, manager.grad_arrays, self.updater,
                            len(self.contexts), self.kvstore, keys)

    # -------------------------------------------------------------- training
    def run(self) -> "MainLoop":
        """Train until an extension requests a stop; return the loop.

        Raises
        ------
        Exception
            Whatever training or a hook raised, after the ``on_error`` hooks ran
            and the error was recorded in the log (record ``error``). On a
            distributed kvstore the worker instead prints the traceback and
            exits with status 1 (:func:`mxoid.distributed.exit_after_error`):
            it would otherwise hang at exit, waiting for the other workers.
        """
        status = self.status
        fire = self.dispatcher.fire
        self._stop_everywhere = False
        try:
            with InterruptHandlers(status):
                if status.training_started:
                    fire("on_resumption")
                else:
                    status.training_started = True
                    fire("before_training")
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
                    status.epoch_started = False
                    status.epochs_done += 1
                    self.log.epoch_ends.append(status.iterations_done)
                    fire("after_epoch")
                    if self._collective:
                        self._agree_to_stop(epoch_end=True)
                    elif status.epoch_interrupt_received and not status.stop_requested:
                        status.interrupted = "SIGINT"  # the first Ctrl-C: the epoch is done
                        self.request_stop("interrupted by SIGINT")
                self._end_interruption()
                status.training_finished = True
                self.manager.reconcile_aux_states()
                self.synchronize()
                if is_distributed(self.kvstore) and self.update_on_kvstore:
                    pull_parameters(self.kvstore, self.manager.param_names,
                                    self.manager.param_arrays)  # dist_async: end equal
                fire("after_training")
        except BaseException as error:
            if is_distributed(self.kvstore):  # would hang at exit in ps-lite's finalize barrier
                if isinstance(error, Exception):
                    self._handle_error(error)
                exit_after_error(error, status.rank)
            if not isinstance(error, Exception):
                raise
            self._handle_error(error)
            raise
        if status.interrupted is not None:
            self._report_interruption()
        return self

    def _end_interruption(self) -> None:
        """Decide whether a signal cut training short, and if so fire ``on_interrupt``.

        A signal that arrives when an extension has already asked to stop at
        the same point (the last epoch ends, a limit is reached) cut nothing
        short: the run is finished, not interrupted.
        """
        status = self.status
        if status.interrupted is None:
            return
        if status.stop_reason is not None and not status.stop_reason.startswith(
                ("interrupted by", "rank ")):
            logger.info("%s arrived as training finished (%s)", status.interrupted,
                        status.stop_reason)
            status.interrupted = None
            return
        self.request_stop(f"interrupted by {status.interrupted}")
        self.dispatcher.fire("on_interrupt")

    def _run_epoch(self) -> bool:
        """Train the rest of the epoch; return False when a stop was requested mid-epoch."""
        status = self.status
        manager = self.manager
        update = self._update
        before_batch = self.dispatcher.runner("before_batch")
        after_batch = self.dispatcher.runner("after_batch")
        trained = status.iterations_done_in_epoch
        for batch in self.train_data:
            self.current_batch = batch
            if before_batch is not None:
                before_batch(batch)
            manager.load_data_batch(batch)
            manager.forward(is_train=True)
            manager.backward()
            update()
            status.iterations_done += 1
            status.iterations_done_in_epoch += 1
            if after_batch is not None:
                after_batch(batch)
            if status.stop_requested and not self._stop_deferred():
                return False
            if (self._collective and status.iterations_done % self.stop_agreement_batches == 0
                    and self._agree_to_stop(epoch_end=False)):
                return False
        if status.iterations_done_in_epoch == trained == 0:
            raise ValueError("train_data yielded no batches in this epoch; is it empty, or "
                             "already consumed (call train_data.reset() before the loop)?")
        return True

    def request_stop(self, reason: str, *, every_rank: bool = False) -> None:
        """Ask the loop to stop: after this batch when called in ``after_batch``,
        after this epoch when called in ``after_epoch``.

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
            self.log.current_row["training_finish_requested"] = reason
            logger.info("stop requested: %s", reason)

    def _stop_deferred(self) -> bool:
        """True while a stop asked on this worker alone waits for the workers to agree."""
        return self._collective and not self._stop_everywhere

    def _agree_to_stop(self, epoch_end: bool) -> bool:
        """A collective call: stop every worker when any worker asked to; return whether."""
        status = self.status
        signal_number = int(getattr(signal, status.interrupted)) if status.interrupted else 0
        wants = status.stop_requested or (epoch_end and status.epoch_interrupt_received)
        rows = allgather(self.kvstore, "stop_agreement", [float(wants), float(signal_number),
                                                          float(epoch_end and
                                                                status.epoch_interrupt_received)])
        if not rows[:, 0].any():
            return False
        signals = [int(number) for number in rows[:, 1] if number]
        if status.interrupted is None and (signals or rows[:, 2].any()):
            status.interrupted = signal.Signals(signals[0] if signals else signal.SIGINT).name
        if status.stop_reason is None:
            first = int(np.flatnonzero(rows[:, 0])[0])
            what = (f"was interrupted by {status.interrupted}" if status.interrupted
                    else "asked to stop")
            self.request_stop(f"rank {first} {what}")
        self._stop_everywhere = True
        return True

    def _report_interruption(self) -> None:
        status = self.status
        saved = self.log.last("checkpoint_saved_to", None)
        directories = [e.directory for e in self.extensions if isinstance(e, Checkpoint)]
        if saved:
            where = (f"The last checkpoint is {saved}; resume with "
                     f"MainLoop(..., resume_from={checkpoint_folder(saved)!r}).")
        elif directories and status.rank != 0:
            where = (f"Rank 0 saves the checkpoints; resume with "
                     f"MainLoop(..., resume_from={directories[0]!r}).")
        else:
            where = ("No checkpoint was saved: add mxoid.extensions.Checkpoint(directory) to "
                     "resume interrupted runs.")
        message = (f"Training interrupted by {status.interrupted} after "
                   f"{_count(status.epochs_done, 'epoch')} and "
                   f"{_count(status.iterations_done, 'batch')}. {where}")
        print(message, file=sys.stderr, flush=True)
        if self.exit_on_interrupt:
            raise SystemExit(128 + int(getattr(signal, status.interrupted)))

    def _handle_error(self, error: BaseException) -> None:
        origin = getattr(error, "mxoid_origin", None)
        where = f" (in extension {origin[0]!r}, hook {origin[1]})" if origin else ""
        self.log.current_row["error"] = f"{type(error).__name__}: {error}{where}"
        for handler in self.dispatcher.handlers["on_error"]:
            try:
                handler.method(error)
            except Exception as secondary:  # an on_error hook must not hide the first error
                logger.error("on_error of %r failed: %s", handler.extension.name, secondary)

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> Dict[str, Any]:
        """Return the loop's state as plain JSON-ready data, for a checkpoint.

        Holds the log (with the status), each extension's ``state_dict()``,
        NumPy's and Python's random states and the training iterator's
        position. Parameters and optimizer states are saved apart, in MXNet's
        own formats (see :mod:`mxoid.checkpoint`).
        """
        return loop_state(self)

    def optimizer_states(self) -> Optional[bytes]:
        """Return the optimizer and its states as MXNet dumps them, or None with a
        distributed kvstore (whose states live on the servers)."""
        return optimizer_states(self)

    # ------------------------------------------------------------ parameters
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
        :class:`MainLoop`), so the model returned is the one
        every device then holds, evaluates and checkpoints.
        """
        self.manager.reconcile_aux_states()
        return self.manager.get_params()

    def profile(self) -> List[tuple]:
        """Return ``(extension, hook, calls, seconds)`` per dispatched hook, slowest first."""
        return self.dispatcher.profile()

    def print_profile(self) -> None:
        """Print the time each extension spent in each hook."""
        print(f"{'extension':<24}{'hook':<18}{'calls':>10}{'seconds':>12}{'us/call':>10}")
        for name, hook, calls, seconds in self.profile():
            per_call = 1e6 * seconds / calls if calls else 0.0
            print(f"{name:<24}{hook:<18}{calls:>10}{seconds:>12.4f}{per_call:>10.1f}")


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else ("es" if noun.endswith("ch") else "s"))


def _check_contexts(contexts: Any) -> List[mx.Context]:
    if contexts is None:
        return [mx.cpu()]
    if isinstance(contexts, mx.Context):
        contexts = [contexts]
    if isinstance(contexts, (str, bytes)) or not isinstance(contexts, (list, tuple)):
        raise TypeError(f"contexts must be an mx.Context or a list of them, e.g. [mx.cpu()] or "
                        f"[mx.gpu(0), mx.gpu(1)]; got {contexts!r}")
    contexts = list(contexts)
    for context in contexts:
        if not isinstance(context, mx.Context):
            raise TypeError(f"contexts must be mx.Context objects such as mx.cpu() or "
                            f"mx.gpu(0); got {context!r} in {contexts!r}")
    gpus = [c for c in contexts if c.device_type == "gpu"]
    if gpus:
        available = mx.context.num_gpus()
        missing = [c for c in gpus if c.device_id >= available]
        if missing:
            where = ("this MXNet is a CPU-only build (install a CUDA build, e.g. mxnet-cu112, "
                     "or use mx.cpu())" if available == 0 else f"this machine has {available}")
            raise ValueError(f"contexts {missing} name GPUs that do not exist: {where}")
    if len(set(map(str, contexts))) != len(contexts):
        raise ValueError(f"contexts {contexts} name a device twice; give each device once")
    return contexts


def _check_extensions(extensions: Sequence[Extension]) -> List[Extension]:
    if isinstance(extensions, Extension):
        raise TypeError(f"extensions must be a list of extensions; got a single "
                        f"{type(extensions).__name__}: pass extensions=[{extensions.name}(...)]")
    if isinstance(extensions, (str, bytes)) or not hasattr(extensions, "__iter__"):
        raise TypeError(f"extensions must be a list of mxoid.Extension objects, not "
                        f"{type(extensions).__name__}")
    extensions = list(extensions)
    for extension in extensions:
        if not isinstance(extension, Extension):
            raise TypeError(f"extensions must be mxoid.Extension instances; got "
                            f"{type(extension).__name__} ({extension!r})")
    if not any(extension.stops_training for extension in extensions):
        raise ValueError(NOTHING_STOPS)
    for attribute, what in (("path", "log file"), ("directory", "checkpoint directory")):
        seen: Dict[str, Extension] = {}
        for extension in extensions:
            value = getattr(extension, attribute, None)
            if not isinstance(value, str):
                continue
            key = os.path.abspath(value)
            if key in seen:
                raise ValueError(f"{seen[key].name} and {extension.name} both write the "
                                 f"{what} {value}: they would overwrite each other; give each "
                                 "its own")
            seen[key] = extension
    return extensions
