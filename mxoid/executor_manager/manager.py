"""One executor per device, each batch split across the devices; executor sets sharing them."""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple, Union

import mxnet as mx
import numpy as np

from .binding import DataDescLike, as_descs
from .executor_set import ExecutorSet
from .initialization import check_fixed, fixed_gammas
from .parameters import copy_into_devices, host_average
from .private_heads import LOSS_SCALE_INPUT
from .seed import TWO_FORMS, is_seed_form, seed_arguments
from .waiting import wait_for

__all__ = ["DataParallelExecutorManager", "set_key"]

NO_BUCKET_MONITOR = (
    "install_monitor is not implemented for bucketing (sym_gen), as in MXNet's manager: "
    "install the monitor on a manager built without sym_gen"
)
ArrayLike = Union[mx.nd.NDArray, np.ndarray]


def set_key(
    data_shapes: Sequence[DataDescLike],
    label_shapes: Optional[Sequence[DataDescLike]],
    private_heads: Sequence[mx.sym.Symbol] = (),
) -> Tuple[Any, ...]:
    """Return the key of an executor set bound for these inputs and heads.

    Their names, shapes and types, and the heads' graphs: the default key of
    :meth:`DataParallelExecutorManager.executor_set`, and what a network adds
    its graph's key to (:meth:`mxoid.network.Network.forward_set`).
    """
    inputs = as_descs(data_shapes) + as_descs(label_shapes)
    return tuple((d.name, tuple(d.shape), np.dtype(d.dtype).str) for d in inputs) + tuple(
        head.tojson() for head in private_heads
    )


def _of_current(name: str, doc: str) -> Any:
    """Return a read-only attribute of the manager that is the current executor set's."""
    return property(lambda manager: getattr(manager.current, name), doc=doc)


class DataParallelExecutorManager:
    """Executors of one symbol on several devices, each training on a slice of the batch.

    Each context gets one executor; a batch of ``batch_size`` rows is split
    across them by ``work_load_list``. Gradients stay on their devices: the
    update functions (:mod:`mxoid.update`) sum them through a kvstore.

    The executors are held in executor sets (:class:`ExecutorSet`): the
    training set, bound with the manager for the inputs it is given, and
    sets bound on first use for other inputs (:meth:`executor_set`: an
    evaluation iterator of another batch size, a prediction batch, a bucket's
    graph), cached by their key, which share the training set's parameter,
    gradient and auxiliary arrays (the same arrays) and allocate from its
    memory pool, as ``BucketingModule`` binds each bucket with a
    ``shared_module``. The batch methods and attributes
    (:meth:`load_data_batch`, :meth:`forward`, :meth:`backward`,
    :attr:`outputs`, :attr:`labels`, :attr:`valid_rows`) are those of the
    current set (:meth:`use`), the training set by default.

    MXNet's own form is taken too, as ``mx.executor_manager.DataParallelExecutorManager``
    takes it (positionally or by keyword): ``DataParallelExecutorManager(symbol, ctx,
    train_data, arg_names, param_names, aux_names, work_load_list=None, logger=None,
    sym_gen=None)``, told from mxoid's by a third argument with ``provide_data`` (a
    DataIter) or any of MXNet's keywords (:mod:`.seed`). The names must be the symbol's
    (``param_names``: every argument that is not an input). With ``sym_gen``,
    :meth:`load_data_batch` switches to the batch's bucket (``sym_gen(batch.bucket_key)``,
    bound on first use and sharing the training set's arrays) as MXNet's manager does.
    :meth:`install_monitor`, :meth:`copy_to` and :meth:`update_metric` are MXNet's.

    Parameters
    ----------
    symbol : mx.sym.Symbol
        The network, with one output or several (``mx.sym.Group``).
    contexts : sequence of mx.Context
        The devices, e.g. ``[mx.cpu(0), mx.cpu(1)]``.
    data_shapes, label_shapes : sequence of DataDesc or (name, shape)
        The inputs, as ``DataIter.provide_data`` / ``provide_label`` give them.
        The first dimension is the batch size.
    work_load_list : sequence of float, optional
        Relative share of each device. Even by default.
    shared_manager : DataParallelExecutorManager, optional
        Share ``shared_manager``'s training arrays and memory, for forward
        passes only (what :meth:`executor_set` does within one manager). A
        forward-only manager runs a batch of fewer rows than devices on the
        first devices, one row each; a training batch needs a row per device.
    fixed_param_names : sequence of str, optional
        Parameters that get no gradient (``grad_req='null'``, which also saves
        their backward work) and are never updated: their ``grad_arrays``
        entries hold ``None``, as ``Module``'s do. A name that is not a
        parameter is a ``ValueError`` naming the closest ones.
    grad_req : {'write', 'add'}, default 'write'
        How the other parameters' gradients are written: ``'add'`` sums them
        over backward passes until they are zeroed (gradient accumulation).
    for_training : bool, default True
        False binds no gradient at all (inference).
    private_heads : sequence of mx.sym.Symbol, optional
        Extra outputs computed after the symbol's own, for mxoid's use (see
        :mod:`~mxoid.executor_manager.private_heads`), in :attr:`private_outputs`.
    head_owners : sequence of object, optional
        Who asked for each private head (:meth:`ExecutorSet.private_output_of`).
    ctx, train_data, arg_names, param_names, aux_names, logger, sym_gen
        MXNet's form (see above), instead of ``contexts``, ``data_shapes`` and
        ``label_shapes``.

    Attributes
    ----------
    training_set : ExecutorSet
        The executors bound with the manager.
    current : ExecutorSet
        The set the batch methods run on (the training set).
    param_arrays, grad_arrays, aux_arrays : list of list of NDArray
        One list per parameter (auxiliary state), one array per device; a
        fixed parameter's gradients are ``None``. Every set shares them.
    fixed_param_names : list of str
        The parameters that are never updated.
    sym_gen : callable or None
        MXNet's form's ``sym_gen``: a bucket key's symbol.
    outputs, labels, valid_rows, pad, training_pass, private_outputs
        The current set's (see :class:`ExecutorSet`): the outputs of the last
        forward pass by name, the labels and real rows of the loaded batch on
        each device, whether the pass was for training.

    Examples
    --------
    .. code-block:: python

        manager = DataParallelExecutorManager(net, [mx.cpu(0), mx.cpu(1)],
                                              it.provide_data, it.provide_label)
        manager.set_params(arg_params, aux_params)
        manager.load_data_batch(next(it)); manager.forward(is_train=True); manager.backward()
        valid = manager.executor_set(valid_it.provide_data, valid_it.provide_label)
        valid.load_data_batch(next(valid_it)); valid.forward(is_train=False)
    """

    def __init__(
        self,
        symbol: mx.sym.Symbol,
        contexts: Optional[Sequence[mx.Context]] = None,
        data_shapes: Optional[Sequence[DataDescLike]] = None,
        label_shapes: Optional[Sequence[DataDescLike]] = None,
        *seed_args: Any,
        work_load_list: Optional[Sequence[float]] = None,
        shared_manager: Optional[DataParallelExecutorManager] = None,
        fixed_param_names: Sequence[str] = (),
        grad_req: str = "write",
        for_training: bool = True,
        private_heads: Sequence[mx.sym.Symbol] = (),
        head_owners: Sequence[Any] = (),
        ctx: Optional[Sequence[mx.Context]] = None,
        train_data: Optional[mx.io.DataIter] = None,
        arg_names: Optional[Sequence[str]] = None,
        param_names: Optional[Sequence[str]] = None,
        aux_names: Optional[Sequence[str]] = None,
        logger: Optional[logging.Logger] = None,
        sym_gen: Optional[Callable[[Any], mx.sym.Symbol]] = None,
    ) -> None:
        seed_keywords = dict(
            ctx=ctx,
            train_data=train_data,
            arg_names=arg_names,
            param_names=param_names,
            aux_names=aux_names,
            logger=logger,
            sym_gen=sym_gen,
        )
        self.sym_gen, self._default_bucket_key = None, None
        if is_seed_form(data_shapes, seed_args, seed_keywords):  # MXNet's own form
            seed = seed_arguments(
                symbol,
                (contexts, data_shapes, label_shapes, *seed_args),
                {**seed_keywords, "work_load_list": work_load_list},
            )
            contexts, data_shapes, label_shapes = seed.contexts, seed.data_shapes, seed.label_shapes
            work_load_list = seed.work_load_list
            self.sym_gen, self._default_bucket_key = seed.sym_gen, seed.default_bucket_key
        elif contexts is None or data_shapes is None:
            raise TypeError(f"{TWO_FORMS}: contexts and data_shapes are missing")
        if grad_req not in ("write", "add"):
            raise ValueError(f"grad_req must be 'write' or 'add', got {grad_req!r}")
        contexts = list(contexts)
        if not contexts:
            raise ValueError("contexts is empty; pass at least one, e.g. contexts=[mx.cpu()]")
        if work_load_list is None:
            work_load_list = [1] * len(contexts)
        if len(work_load_list) != len(contexts):
            raise ValueError(
                f"work_load_list has {len(work_load_list)} entries for "
                f"{len(contexts)} contexts; give one per context"
            )
        self.symbol = symbol
        self.shared_manager = shared_manager
        inputs = {d.name for d in as_descs(data_shapes) + as_descs(label_shapes)}
        param_names = [
            n for n in symbol.list_arguments() if n not in inputs and n != LOSS_SCALE_INPUT
        ]
        self.training_set = ExecutorSet(
            symbol,
            contexts,
            data_shapes,
            label_shapes,
            work_load_list,
            shared=None if shared_manager is None else shared_manager.training_set,
            fixed_param_names=check_fixed(fixed_param_names, param_names),
            grad_req=grad_req,
            for_training=for_training and shared_manager is None,
            private_heads=private_heads,
            head_owners=head_owners,
        )
        self.current = self.training_set
        trained = self.training_set
        self.param_names, self.aux_names = trained.param_names, trained.aux_names
        self.fixed_param_names = trained.fixed_param_names
        self.param_arrays, self.aux_arrays = trained.param_arrays, trained.aux_arrays
        self.grad_arrays = trained.grad_arrays
        self.grad_req, self.for_training = grad_req, trained.for_training
        # True while every device holds the same auxiliary states (set_params,
        # reconcile_aux_states); a backward pass makes each device's its own.
        self._aux_agree = True
        self._root = self if shared_manager is None else shared_manager._root
        self._sets: Dict[Hashable, ExecutorSet] = {}
        self._fixed_gammas = fixed_gammas(symbol) if self.for_training else []
        self._grads_by_device: Optional[List[List[mx.nd.NDArray]]] = None

    # ------------------------------------------------------------ executor sets
    def executor_set(
        self,
        data_shapes: Sequence[DataDescLike],
        label_shapes: Optional[Sequence[DataDescLike]] = None,
        private_heads: Sequence[mx.sym.Symbol] = (),
        *,
        key: Optional[Hashable] = None,
        symbol: Optional[mx.sym.Symbol] = None,
        for_training: bool = False,
        head_owners: Sequence[Any] = (),
    ) -> ExecutorSet:
        """Return the executor set for these inputs, bound on first use and cached.

        It shares the training set's parameter, gradient and auxiliary arrays
        and its memory pool. ``symbol``: another graph of the same parameters
        (a bucket's, from ``sym_gen``; a Gluon block traced in predict mode,
        where it branches on ``autograd.is_training()``: which graph serves
        which inputs is the loop's network's to say, :mod:`mxoid.network`);
        by default the manager's symbol. ``for_training=True`` binds it for
        training too, with the gradients the training set has (a bucket's
        set: use it with :meth:`use`). A set for forward passes
        (``is_train=False``) only has gammas of its own where BatchNorm has
        ``fix_gamma`` (:func:`~mxoid.executor_manager.initialization.fixed_gammas`: every
        forward pass writes 1 into them), so that evaluating never changes
        training; without private heads or such gammas, inputs of the training
        set's own shapes get the training set itself. ``key`` names the set in
        the cache; by default the inputs' names, shapes and types, and the
        heads (:func:`set_key`). ``head_owners``: who asked for each private
        head (:meth:`ExecutorSet.private_output_of`).
        """
        data_descs, label_descs = as_descs(data_shapes), as_descs(label_shapes)
        if (
            symbol is None
            and not for_training
            and self.training_set.same_inputs(data_descs, label_descs)
            and not private_heads
            and not self._fixed_gammas
        ):
            return self.training_set
        if key is None:
            key = set_key(data_descs, label_descs, private_heads)
        found = self._sets.get(key)
        if found is None:
            trained = self.training_set
            found = self._sets[key] = ExecutorSet(
                self.symbol if symbol is None else symbol,
                trained.contexts,
                data_descs,
                label_descs,
                trained.work_load_list,
                shared=trained,
                fixed_param_names=self.fixed_param_names,
                grad_req=self.grad_req,
                for_training=for_training,
                private_heads=private_heads,
                head_owners=head_owners,
            )
        return found

    def use(self, executors: ExecutorSet) -> None:
        """Run the batch methods and attributes on ``executors`` from now on.

        The training set, or a set of :meth:`executor_set` bound ``for_training``
        (a bucket's).
        """
        if not executors.for_training:
            raise ValueError("the manager's current executors train: use a set bound for_training")
        self.current = executors

    def evaluation_manager(
        self,
        data_shapes: Sequence[DataDescLike],
        label_shapes: Optional[Sequence[DataDescLike]] = None,
        private_heads: Sequence[mx.sym.Symbol] = (),
    ) -> ExecutorSet:
        """Return :meth:`executor_set` (its name in mxoid 0.3)."""
        return self.executor_set(data_shapes, label_shapes, private_heads)

    @property
    def executor_sets(self) -> Dict[Hashable, ExecutorSet]:
        """The sets bound for other inputs, by key (the training set is not among them)."""
        return dict(self._sets)

    def same_inputs(
        self,
        data_shapes: Sequence[DataDescLike],
        label_shapes: Optional[Sequence[DataDescLike]] = None,
    ) -> bool:
        """Return whether inputs of these names and shapes are the training set's own."""
        return self.training_set.same_inputs(data_shapes, label_shapes)

    # ---------------------------------------------- the current set's batches
    executors = _of_current("executors", "The current set's executors, one per device.")
    contexts = _of_current("contexts", "The devices of the current set.")
    data_descs = _of_current("data_descs", "The current set's data inputs.")
    label_descs = _of_current("label_descs", "The current set's label inputs.")
    data_names = _of_current("data_names", "The names of the data inputs.")
    label_names = _of_current("label_names", "The names of the label inputs.")
    arg_names = _of_current("arg_names", "The symbol's arguments: inputs and parameters.")
    output_names = _of_current("output_names", "The outputs, without MXNet's ``_output``.")
    metric_outputs = _of_current("metric_outputs", "The outputs metrics bind to by default.")
    batch_size = _of_current("batch_size", "Rows of a batch of the current set.")
    work_load_list = _of_current("work_load_list", "Each device's share of a batch.")
    slices = _of_current("slices", "Each device's rows of a batch of the current set.")
    outputs = _of_current("outputs", "The outputs of the last forward pass (OutputArrays).")
    labels = _of_current("labels", "The label slice on each device of the loaded batch.")
    valid_rows = _of_current("valid_rows", "Real (not padding) rows of the loaded batch.")
    pad = _of_current("pad", "Padding rows at the end of the loaded batch.")
    training_pass = _of_current("training_pass", "Whether the last pass was for training.")
    private_outputs = _of_current("private_outputs", "Per private head, its first output.")

    @property
    def running_sums(self) -> Dict[str, List[mx.nd.NDArray]]:
        """The running sums of the training set's private heads, by name, one array per device.

        Named ``_mxoid_running_sums...`` (see
        :data:`~mxoid.executor_manager.private_heads.RUNNING_SUMS_PREFIX`); the
        executors add every training batch's values to them: an argument's
        gradients bound with ``grad_req='add'``, or an auxiliary state that the
        head's operator adds to in forward passes for training only. Never
        parameters, never checkpointed, never zeroed by the manager.
        """
        return self.training_set.running_sums

    @property
    def running_sum_names(self) -> List[str]:
        """The names of :attr:`running_sums`."""
        return list(self.training_set.running_sums)

    def load_data_batch(self, batch: mx.io.DataBatch, labels: bool = True) -> None:
        """Copy a batch's data and labels into the current set, one slice per device.

        ``labels=False`` copies the data only (inference: a forward pass with
        ``is_train=False`` does not read the labels).
        """
        if self.sym_gen is not None:
            self.use(self._bucket_set(batch))
        self.current.load_data_batch(batch, labels)

    def _bucket_set(self, batch: mx.io.DataBatch) -> ExecutorSet:
        """Return the training set of ``batch``'s bucket, bound on first use (MXNet's form).

        The default bucket's is the training set; another key's binds
        ``sym_gen(key)`` for the batch's inputs, sharing the training set's arrays.
        """
        key = batch.bucket_key
        if key == self._default_bucket_key:
            return self.training_set
        found = self._sets.get(("sym_gen", key))
        if found is None:
            found = self.executor_set(
                batch.provide_data,
                batch.provide_label,
                symbol=self.sym_gen(key),
                for_training=True,
                key=("sym_gen", key),
            )
        return found

    def update_metric(
        self, metric: mx.metric.EvalMetric, labels: Sequence[Any], pre_sliced: bool = False
    ) -> None:
        """Update ``metric`` with each device's outputs of the last forward pass, as MXNet's.

        ``labels``: the batch's labels (``batch.label``), sliced here per device;
        with ``pre_sliced=True``, one list of labels per device.
        """
        current = self.current
        per_device = zip(*current.outputs.values()) if current.outputs else ()
        for device, (outputs, rows) in enumerate(zip(per_device, current.slices)):
            sliced = labels[device] if pre_sliced else [label[rows] for label in labels]
            metric.update(sliced, list(outputs))

    def install_monitor(self, monitor: mx.monitor.Monitor) -> None:
        """Install ``monitor`` (``mx.monitor.Monitor``) on the training set's executors, as MXNet's.

        mxoid's own loop has the :class:`~mxoid.extensions.Monitor` extension.
        """
        if self.sym_gen is not None:
            raise NotImplementedError(NO_BUCKET_MONITOR)
        for executor in self.training_set.executors:
            monitor.install(executor)

    def forward(self, is_train: bool = False) -> None:
        """Run the current set's forward pass on every device (asynchronously)."""
        self.current.forward(is_train)

    def backward(self) -> None:
        """Run the backward pass of the current set on every device (asynchronously)."""
        # (the training set's devices: a set of fewer changes its devices' states alone)
        self._aux_agree = self.training_set._single or not self.aux_names
        self.current.backward()

    def zero_grads(self) -> None:
        """Set every gradient to zero (after an update, with ``grad_req='add'``)."""
        if self._grads_by_device is None:
            self._grads_by_device = [
                [grads[k] for grads in self.grad_arrays if grads[k] is not None]
                for k in range(len(self.training_set.executors))
            ]
        for device_grads in self._grads_by_device:
            if device_grads:
                mx.nd.reset_arrays(*device_grads, num_arrays=len(device_grads))

    # ------------------------------------------------------- twin executors
    def bind_twins(self) -> List[mx.executor.Executor]:
        """Bind, per device, a second executor that shares every array of the training one.

        Parameters, gradients, auxiliary states, inputs and the memory pool
        are the training executor's, so a forward and backward pass on the
        twin trains exactly as one on the training executor would, where
        :func:`~mxoid.executor_manager.devices.one_random_generator` holds
        (elsewhere the twin's ``Dropout`` draws from other random generators
        than the executor's). What the twin adds is a place to install a
        monitor callback (``executor.set_monitor_callback``) that costs nothing
        on the batches that do not use it. See :meth:`use_twins_once`.
        """
        if self.shared_manager is not None or not self.for_training:
            raise RuntimeError("twins are bound for training managers only")
        return self.current.bind_twins()

    def use_twins_once(self, twins: List[mx.executor.Executor]) -> None:
        """Run the next forward and backward pass on ``twins`` (from :meth:`bind_twins`).

        After that backward pass the twins' outputs are copied into
        :attr:`outputs`, and the training executors are used again.
        """
        self.current.use_twins_once(twins)

    # -------------------------------------------------------------- parameters
    def set_params(
        self,
        arg_params: Mapping[str, ArrayLike],
        aux_params: Optional[Mapping[str, ArrayLike]] = None,
    ) -> None:
        """Copy parameter values into every device.

        Parameters
        ----------
        arg_params, aux_params : dict of str to NDArray or numpy array
            Values by name. Names the symbol does not have raise ``ValueError``;
            parameters not given keep their current values.
        """
        copy_into_devices("arg_params", arg_params, self.param_names, self.param_arrays)
        copy_into_devices("aux_params", aux_params or {}, self.aux_names, self.aux_arrays)
        if aux_params and set(aux_params) == set(self.aux_names):
            self._root._aux_agree = True

    def copy_to(
        self, arg_params: Dict[str, mx.nd.NDArray], aux_params: Dict[str, mx.nd.NDArray]
    ) -> None:
        """Write the devices' average of each parameter and auxiliary state into these arrays.

        MXNet's manager's ``copy_to``, with its arithmetic (``(0 + a0 + a1 + ...) / n``,
        cast to the target's type), after waiting for the engine (:meth:`synchronize`).
        """
        self.synchronize()
        for targets, names, arrays in (
            (arg_params, self.param_names, self.param_arrays),
            (aux_params, self.aux_names, self.aux_arrays),
        ):
            for name, block in zip(names, arrays):
                host_average(block).astype(targets[name].dtype).copyto(targets[name])

    def get_params(self) -> Tuple[Dict[str, mx.nd.NDArray], Dict[str, mx.nd.NDArray]]:
        """Return ``(arg_params, aux_params)`` as host copies, like ``Module.get_params()``.

        Waits for the work in flight first (:meth:`synchronize`). Parameters
        are identical on every device and are read from the first; auxiliary
        states (e.g. BatchNorm statistics) are averaged over the devices, as
        ``Module.get_params()`` averages them (nothing is written back; see
        :meth:`reconcile_aux_states`).
        """
        self.synchronize()
        cpu = mx.cpu()
        arg_params = {
            n: arrays[0].copyto(cpu) for n, arrays in zip(self.param_names, self.param_arrays)
        }
        return arg_params, self._host_aux_states()

    def _host_aux_states(self) -> Dict[str, mx.nd.NDArray]:
        agree = self._root._aux_agree  # then the first device's are every device's
        return {
            name: arrays[0].copyto(mx.cpu()) if agree else host_average(arrays)
            for name, arrays in zip(self.aux_names, self.aux_arrays)
        }

    def synchronize(self) -> None:
        """Wait until every operation queued on MXNet's engine is computed.

        This is mxoid's one rule for the asynchronous engine: whatever reads
        parameters, auxiliary states or outputs to the host, saves them, or
        runs the executors for anything but the next training step
        (evaluation, ``get_params``, checkpoints, NaN checks, metric reads)
        calls this first. The training step itself never does: batches are
        only queued, and the engine orders them by the arrays each operation
        declares. Two things escape that order in MXNet 1.9.1:

        - BatchNorm writes its ``moving_mean`` / ``moving_var`` in the
          backward pass without declaring the write to the engine, so a read
          issued right after the backward (a ``copyto``, ``asnumpy``,
          ``mx.model.save_checkpoint``) can see the values from before it.
          (``Module.fit`` falls into this at each epoch end: its
          ``get_params()`` / ``set_params()`` can write stale statistics back.)
        - MKLDNN's operators, run for evaluation on executors whose training
          work is still in flight, corrupt that work (parameters that differ
          from run to run, or NaN).

        Waiting for the whole engine (``mx.nd.waitall()``) is the only wait
        that covers the undeclared write (a signal is handled at once meanwhile:
        :mod:`.waiting`). An extension that reads the network calls
        ``main_loop.synchronize()`` (the same thing) first.
        """
        wait_for(mx.nd.waitall)

    def reconcile_aux_states(self) -> None:
        """Make every device hold the same auxiliary states: their average.

        Each device updates its own BatchNorm statistics from its slice of the
        batch. This waits for the engine (:meth:`synchronize`), averages every
        auxiliary state over the devices as :meth:`get_params` does, and writes
        the average back to every device, as ``Module.fit`` does at each epoch
        end. Nothing to do on one device, or without auxiliary states.
        """
        root = self._root
        if root._aux_agree:
            return
        self.synchronize()
        averaged = self._host_aux_states()
        for name, arrays in zip(self.aux_names, self.aux_arrays):
            for target in arrays:
                averaged[name].copyto(target)
        root._aux_agree = True
