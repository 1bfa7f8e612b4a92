"""One executor per device, each batch split across the devices."""

from __future__ import annotations

import difflib
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import mxnet as mx
import numpy as np

from .devices import (  # noqa: F401 (check_contexts and one_random_generator: their old home)
    check_contexts,
    forward_work_load,
    one_random_generator,
    split_batch,
)
from .errors import clean_mxnet_message
from .invoke import PreparedCopy, backward_pass, forward_pass
from .private_heads import COUNTING_SUFFIX, RUNNING_SUMS_PREFIX, PrivateHeads  # noqa: F401 (their old home)

__all__ = [
    "DataParallelExecutorManager",
    "OutputArrays",
    "output_short_name",
]

DataDescLike = Union[mx.io.DataDesc, Tuple[str, Tuple[int, ...]]]
ArrayLike = Union[mx.nd.NDArray, np.ndarray]

_OUTPUT_SUFFIX = "_output"


def output_short_name(name: str) -> str:
    """Return an output name without MXNet's ``_output`` suffix.

    ``softmax_output`` -> ``softmax``.
    """
    return name[: -len(_OUTPUT_SUFFIX)] if name.endswith(_OUTPUT_SUFFIX) else name


class OutputArrays(dict):
    """The outputs of the last batch: output name -> one NDArray per device.

    The last forward pass's: an evaluation on these executors (at the training
    batch size), or on executors sharing their memory (other sizes), replaces
    them. An extension that reads a training batch's outputs reads them before
    any evaluation of that batch's hooks (earlier in the list, or a hook before).

    Keys are output names without the ``_output`` suffix (``'softmax'``);
    the full name (``'softmax_output'``) is accepted as well.
    """

    def __missing__(self, key: str) -> List[mx.nd.NDArray]:
        short = output_short_name(key)
        if short != key and short in self:
            return self[short]
        raise KeyError(f"no output named {key!r}; the symbol's outputs are {sorted(self)}")

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or (
            isinstance(key, str) and dict.__contains__(self, output_short_name(key))
        )


def _check_fixed(names: Sequence[str], param_names: Sequence[str]) -> List[str]:
    """Return ``names`` as a list, or raise naming the closest parameters of a mistyped one."""
    if isinstance(names, str):
        names = [names]
    names = list(names or ())
    for name in names:
        if name not in param_names:
            close = difflib.get_close_matches(name, param_names, n=3, cutoff=0.5)
            hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise ValueError(
                f"fixed_param_names has {name!r}, which is not a parameter of the "
                f"network{hint} Its parameters are {list(param_names)}"
            )
    return names


def _as_descs(shapes: Optional[Iterable[DataDescLike]]) -> List[mx.io.DataDesc]:
    descs = []
    for item in shapes or ():
        if isinstance(item, mx.io.DataDesc):
            descs.append(item)
        else:
            name, shape = item[0], item[1]
            descs.append(mx.io.DataDesc(name, tuple(shape)))
    return descs


class DataParallelExecutorManager:
    """Executors of one symbol on several devices, each training on a slice of the batch.

    Each context gets one executor; a batch of ``batch_size`` rows is split
    across them by ``work_load_list``. Gradients stay on their devices: the
    update functions (:mod:`mxoid.update`) sum them through a kvstore.

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
        Bind executors for other input shapes (an evaluation iterator with
        another batch size) that share the parameter, gradient and auxiliary
        arrays of ``shared_manager`` instead of copying them. Such a manager is
        used for forward passes only. A manager for forward passes only (this
        one, or one with ``for_training=False``) given a batch of fewer rows
        than devices binds the first ``batch_size`` devices, one row each
        (:func:`~mxoid.devices.forward_work_load`); a training batch must have at least one
        row per device.
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
        Extra outputs computed by the executors after the symbol's own (behind
        ``BlockGrad``, reading only the symbol's arrays), for mxoid's use: the
        per-row metric values of :class:`~mxoid.extensions.TrainingMonitoring`
        and :class:`~mxoid.extensions.Evaluate`. They are in
        :attr:`private_outputs`, not in :attr:`outputs`.

    Attributes
    ----------
    param_arrays, grad_arrays, aux_arrays : list of list of NDArray
        One list per parameter (auxiliary state), one array per device; a
        fixed parameter's gradients are ``None``.
    fixed_param_names : list of str
        The parameters that are never updated.
    outputs : OutputArrays
        Output name -> one array per device, filled by :meth:`forward`.
    private_outputs : list of list of NDArray
        Per private head, its first output, one array per device.
    running_sums : dict of str to list of NDArray
        A private head's running sums, named ``_mxoid_running_sums...`` (see
        :data:`~mxoid.private_heads.RUNNING_SUMS_PREFIX`), one array per device, to which the
        executors add every training batch's values: an argument's gradients,
        bound with ``grad_req='add'`` (each backward pass adds to them), or an
        auxiliary state that the head's operator adds to in forward passes for
        training only (:data:`~mxoid.private_heads.COUNTING_SUFFIX`). Never parameters, never
        checkpointed, never zeroed by the manager.
    training_pass : bool
        Whether the last forward pass was for training (``is_train=True``);
        the backward pass after it belongs to it.
    labels : dict of str to list of NDArray
        Label name -> the label slice on each device for the loaded batch.
    valid_rows : list of int
        Rows of the loaded batch that are real (not padding), per device.

    Examples
    --------
    .. code-block:: python

        manager = DataParallelExecutorManager(net, [mx.cpu(0), mx.cpu(1)],
                                              it.provide_data, it.provide_label)
        manager.set_params(arg_params, aux_params)
        manager.load_data_batch(next(it)); manager.forward(is_train=True); manager.backward()
    """

    def __init__(
        self,
        symbol: mx.sym.Symbol,
        contexts: Sequence[mx.Context],
        data_shapes: Sequence[DataDescLike],
        label_shapes: Optional[Sequence[DataDescLike]] = None,
        *,
        work_load_list: Optional[Sequence[float]] = None,
        shared_manager: Optional[DataParallelExecutorManager] = None,
        fixed_param_names: Sequence[str] = (),
        grad_req: str = "write",
        for_training: bool = True,
        private_heads: Sequence[mx.sym.Symbol] = (),
    ) -> None:
        if grad_req not in ("write", "add"):
            raise ValueError(f"grad_req must be 'write' or 'add', got {grad_req!r}")
        self.symbol = symbol
        # What the executors run: the symbol, and the private heads after its outputs.
        self._private = PrivateHeads(symbol, private_heads, for_training and shared_manager is None)
        self._bound_symbol = self._private.symbol
        self.running_sum_names = self._private.sum_names
        self.contexts = list(contexts)
        if not self.contexts:
            raise ValueError("contexts is empty; pass at least one, e.g. contexts=[mx.cpu()]")
        self.data_descs = _as_descs(data_shapes)
        self.label_descs = _as_descs(label_shapes)
        if not self.data_descs:
            raise ValueError("no data shapes given; pass the iterator's provide_data")
        self.data_names = [d.name for d in self.data_descs]
        self.label_names = [d.name for d in self.label_descs]
        self.arg_names = symbol.list_arguments()
        self.aux_names = symbol.list_auxiliary_states()
        self._check_input_names()
        inputs = set(self.data_names) | set(self.label_names)
        self.param_names = [n for n in self.arg_names if n not in inputs]
        self.fixed_param_names = _check_fixed(fixed_param_names, self.param_names)
        self.grad_req = grad_req
        self.for_training = for_training
        self.output_names = [output_short_name(n) for n in symbol.list_outputs()]
        self.batch_size = int(self.data_descs[0].shape[0])
        for desc in self.data_descs + self.label_descs:
            if not desc.shape or desc.shape[0] != self.batch_size:
                raise ValueError(
                    f"the symbol rejects the input shapes: {desc.name!r} has shape "
                    f"{tuple(desc.shape)} but {self.data_names[0]!r} has a batch of "
                    f"{self.batch_size}; every input needs the batch size as its first dimension"
                )
        if work_load_list is None:
            work_load_list = [1] * len(self.contexts)
        if len(work_load_list) != len(self.contexts):
            raise ValueError(
                f"work_load_list has {len(work_load_list)} entries for "
                f"{len(self.contexts)} contexts; give one per context"
            )
        if shared_manager is not None or not for_training:
            work_load_list = forward_work_load(self.batch_size, work_load_list)
            self.contexts = self.contexts[: len(work_load_list)]
        self.work_load_list = list(work_load_list)
        self.slices = split_batch(self.batch_size, self.work_load_list)
        self.shared_manager = shared_manager
        self.executors = [self._bind(i, ctx) for i, ctx in enumerate(self.contexts)]

        execs = self.executors
        self.param_arrays = [[e.arg_dict[n] for e in execs] for n in self.param_names]
        self.grad_arrays = [[e.grad_dict.get(n) for e in execs] for n in self.param_names]
        self.aux_arrays = [[e.aux_dict[n] for e in execs] for n in self.aux_names]
        self.outputs = OutputArrays(
            (name, [e.outputs[j] for e in execs]) for j, name in enumerate(self.output_names)
        )
        self._private.attach(execs)
        self.training_pass = False
        self.private_outputs = self._private.outputs
        self.running_sums = self._private.running_sums
        self.labels: Dict[str, List[mx.nd.NDArray]] = {
            n: [e.arg_dict[n] for e in execs] for n in self.label_names
        }
        self._data_targets = [[e.arg_dict[n] for e in execs] for n in self.data_names]
        self._label_targets = [self.labels[n] for n in self.label_names]
        self._single = len(execs) == 1
        # True while every device holds the same auxiliary states (set_params,
        # reconcile_aux_states); a backward pass makes each device's its own.
        self._aux_agree = True
        self._root = self if shared_manager is None else shared_manager._root
        self._pad = 0
        self.valid_rows = [s.stop - s.start for s in self.slices]
        self._evaluation_managers: Dict[tuple, DataParallelExecutorManager] = {}
        self._next_pass: Optional[List[mx.executor.Executor]] = None
        self._grads_by_device: Optional[List[List[mx.nd.NDArray]]] = None
        # One prepared copy per input array and device, into its executor's array.
        self._data_copies = [[PreparedCopy(t) for t in ts] for ts in self._data_targets]
        self._label_copies = [[PreparedCopy(t) for t in ts] for ts in self._label_targets]

    # ------------------------------------------------------------------ binding
    def _check_input_names(self) -> None:
        known = set(self.arg_names)
        for kind, names in (("data", self.data_names), ("label", self.label_names)):
            for name in names:
                if name not in known:
                    raise ValueError(
                        f"the iterator provides {kind} {name!r}, which the symbol does not take; "
                        f"the symbol's arguments are {self.arg_names}. Rename the iterator's "
                        f"{kind} (e.g. NDArrayIter(..., {kind}_name=...)) to match the symbol"
                    )
        given = set(self.data_names) | set(self.label_names)
        missing = [
            n
            for n in self.arg_names
            if n not in given and (n.endswith("_label") or n in ("data", "label"))
        ]
        if missing:
            raise ValueError(
                f"the symbol takes {missing} as input but the iterator provides only "
                f"{sorted(given)}; name the iterator's data and label after the symbol's inputs"
            )

    def _grad_req(self, name: str, inputs: Mapping[str, tuple]) -> str:
        """Return how ``name``'s gradient is written: ``'null'`` or ``grad_req``.

        ``'null'`` for inputs and fixed parameters (no gradient, and no backward
        work for them), and for everything when not for training.
        """
        if not self.for_training or name in inputs or name in self.fixed_param_names:
            return "null"
        return self._private.grad_req(name) or self.grad_req

    def _input_shapes(self, device: int) -> Tuple[Dict[str, tuple], Dict[str, np.dtype]]:
        rows = self.slices[device].stop - self.slices[device].start
        shapes = {d.name: (rows,) + tuple(d.shape[1:]) for d in self.data_descs + self.label_descs}
        types = {d.name: d.dtype for d in self.data_descs + self.label_descs}
        return shapes, types

    def _bind(self, device: int, ctx: mx.Context) -> mx.executor.Executor:
        shapes, types = self._input_shapes(device)
        try:
            if self.shared_manager is None:
                names = self._bound_symbol.list_arguments()  # the heads' after the symbol's
                grad_req = {n: self._grad_req(n, shapes) for n in names}
                return self._bound_symbol.simple_bind(
                    ctx, grad_req=grad_req, type_dict=types, **shapes
                )
            return self._bind_shared(device, ctx, shapes, types)
        except (mx.base.MXNetError, RuntimeError) as error:
            raise ValueError(
                f"the symbol rejects the input shapes {shapes}: {clean_mxnet_message(error)}"
            ) from None

    def _bind_shared(
        self, device: int, ctx: mx.Context, shapes: Dict[str, tuple], types: Dict[str, np.dtype]
    ) -> mx.executor.Executor:
        # Parameters are bound with gradient arrays (the shared ones, so no
        # memory is added): an executor bound with grad_req='null' is fused by
        # MXNet's MKLDNN subgraph backend, which caches the weights at its
        # first forward and then silently uses stale weights.
        base = self.shared_manager.executors[device]
        symbol = self._bound_symbol
        arg_shapes, _, _ = symbol.infer_shape(**shapes)
        arg_types, _, _ = symbol.infer_type(**types)
        args, grads, grad_req = {}, {}, {}
        for name, shape, dtype in zip(self.arg_names, arg_shapes, arg_types):
            if name in shapes:
                args[name] = mx.nd.zeros(shape, ctx, dtype=dtype)
                grad_req[name] = "null"
            else:
                args[name] = base.arg_dict[name]
                if args[name].shape != tuple(shape):
                    raise ValueError(
                        f"parameter {name!r} has shape {tuple(shape)} for these inputs "
                        f"but {args[name].shape} in training; it cannot be shared"
                    )
                if base.grad_dict.get(name) is None:  # a fixed parameter: it never changes
                    grad_req[name] = "null"
                else:
                    grads[name] = base.grad_dict[name]
                    grad_req[name] = "write"
        return symbol.bind(
            ctx,
            args=args,
            args_grad=grads,
            grad_req=grad_req,
            aux_states=[base.aux_dict[n] for n in self.aux_names],
            shared_exec=base,
        )

    def evaluation_manager(
        self,
        data_shapes: Sequence[DataDescLike],
        label_shapes: Optional[Sequence[DataDescLike]] = None,
        private_heads: Sequence[mx.sym.Symbol] = (),
    ) -> DataParallelExecutorManager:
        """Return a manager for other input shapes that shares this one's parameters.

        The manager is bound once per distinct set of shapes (and of private
        heads) and reused. It is meant for forward passes (``is_train=False``)
        only. Without private heads, inputs of this manager's shapes get this
        manager itself.
        """
        data_descs, label_descs = _as_descs(data_shapes), _as_descs(label_shapes)
        if self.same_inputs(data_descs, label_descs) and not private_heads:
            return self
        key = tuple(
            (d.name, tuple(d.shape), np.dtype(d.dtype).str) for d in data_descs + label_descs
        ) + tuple(head.tojson() for head in private_heads)
        if key not in self._evaluation_managers:
            self._evaluation_managers[key] = DataParallelExecutorManager(
                self.symbol,
                self.contexts,
                data_descs,
                label_descs,
                work_load_list=self.work_load_list,
                shared_manager=self,
                private_heads=private_heads,
            )
        return self._evaluation_managers[key]

    def same_inputs(
        self,
        data_shapes: Sequence[DataDescLike],
        label_shapes: Optional[Sequence[DataDescLike]] = None,
    ) -> bool:
        """Return whether inputs of these names and shapes are this manager's own."""
        data_descs, label_descs = _as_descs(data_shapes), _as_descs(label_shapes)
        return [(d.name, tuple(d.shape)) for d in data_descs] == [
            (d.name, tuple(d.shape)) for d in self.data_descs
        ] and [(d.name, tuple(d.shape)) for d in label_descs] == [
            (d.name, tuple(d.shape)) for d in self.label_descs
        ]

    # ----------------------------------------------------------------- batches
    def load_data_batch(self, batch: mx.io.DataBatch, labels: bool = True) -> None:
        """Copy a batch's data and labels into the executors, one slice per device.

        ``labels=False`` copies the data only (inference: a forward pass with
        ``is_train=False`` does not read the labels).
        """
        self._load(batch.data, self._data_targets, self._data_copies)
        if labels and self._label_targets:
            if not batch.label:
                raise ValueError(f"the batch has no label but the symbol needs {self.label_names}")
            self._load(batch.label, self._label_targets, self._label_copies)
        pad = batch.pad or 0
        if pad != self._pad:
            self._pad = pad
            real = self.batch_size - pad
            self.valid_rows = [max(0, min(s.stop, real) - s.start) for s in self.slices]

    def _load(
        self,
        sources: Sequence[mx.nd.NDArray],
        targets: List[List[mx.nd.NDArray]],
        copies: List[List[PreparedCopy]],
    ) -> None:
        """Copy each source (its slice per device) into its targets, as ``copyto`` does.

        Dense NDArrays take the copies prepared per target
        (:class:`~mxoid.invoke.PreparedCopy`); other sources ``copyto`` itself.
        """
        ndarray = mx.nd.NDArray
        if self._single:
            for source, device_targets, (copy,) in zip(sources, targets, copies):
                if type(source) is ndarray:
                    copy(source)
                else:
                    source.copyto(device_targets[0])
            return
        slices = self.slices
        for source, device_targets, device_copies in zip(sources, targets, copies):
            if type(source) is ndarray:
                for slc, copy in zip(slices, device_copies):
                    copy(source._slice(slc.start, slc.stop))  # what source[slc] returns
            else:
                for slc, target in zip(slices, device_targets):
                    source[slc].copyto(target)

    def forward(self, is_train: bool = False) -> None:
        """Run the forward pass on every device (asynchronously).

        The executors' output arrays are those bound (:attr:`outputs`), which
        every pass writes (see :func:`~mxoid.invoke.forward_pass`). Running sums
        kept as auxiliary states count the passes for training only.
        """
        self.training_pass = is_train
        private = self._private
        if private.switches and is_train != private.counting:
            private.count(is_train)
        for executor in self._next_pass or self.executors:
            forward_pass(executor, is_train)

    def zero_grads(self) -> None:
        """Set every gradient to zero (after an update, with ``grad_req='add'``)."""
        for device_grads in self._device_grads():
            if device_grads:
                mx.nd.reset_arrays(*device_grads, num_arrays=len(device_grads))

    def _device_grads(self) -> List[List[mx.nd.NDArray]]:
        if self._grads_by_device is None:
            self._grads_by_device = [
                [grads[k] for grads in self.grad_arrays if grads[k] is not None]
                for k in range(len(self.executors))
            ]
        return self._grads_by_device

    def backward(self) -> None:
        """Run the backward pass on every device (asynchronously)."""
        if self.shared_manager is not None:
            raise RuntimeError(
                "a manager that shares another's parameters is for forward passes only"
            )
        self._aux_agree = self._single or not self.aux_names
        if self._next_pass is None:
            for executor in self.executors:
                backward_pass(executor)
            return
        for twin, executor in zip(self._next_pass, self.executors):
            twin.backward()
            for source, target in zip(twin.outputs, executor.outputs):
                source.copyto(target)
        self._next_pass = None

    # ------------------------------------------------------- twin executors
    def bind_twins(self) -> List[mx.executor.Executor]:
        """Bind, per device, a second executor that shares every array of the training one.

        Parameters, gradients, auxiliary states, inputs and the memory pool
        are the training executor's, so a forward and backward pass on the
        twin trains exactly as one on the training executor would, where
        :func:`~mxoid.devices.one_random_generator` holds (elsewhere the twin's ``Dropout``
        draws from other random generators than the executor's). What the
        twin adds is a place to install a monitor callback
        (``executor.set_monitor_callback``) that costs nothing on the batches
        that do not use it. See :meth:`use_twins_once`.
        """
        if self.shared_manager is not None:
            raise RuntimeError("twins are bound for training managers only")
        twins = []
        for executor, ctx in zip(self.executors, self.contexts):
            grads = {n: g for n, g in executor.grad_dict.items() if g is not None}
            twins.append(
                self._bound_symbol.bind(
                    ctx,
                    args=executor.arg_dict,
                    args_grad=grads,
                    grad_req={
                        n: (self._grad_req(n, {}) if n in grads else "null")
                        for n in self._bound_symbol.list_arguments()
                    },
                    aux_states=executor.aux_dict,
                    shared_exec=executor,
                )
            )
        return twins

    def use_twins_once(self, twins: List[mx.executor.Executor]) -> None:
        """Run the next forward and backward pass on ``twins`` (from :meth:`bind_twins`).

        After that backward pass the twins' outputs are copied into
        :attr:`outputs`, and the training executors are used again.
        """
        self._next_pass = twins

    @property
    def pad(self) -> int:
        """Padding rows at the end of the loaded batch."""
        return self._pad

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
        for kind, values, names, arrays in (
            ("arg_params", arg_params, self.param_names, self.param_arrays),
            ("aux_params", aux_params or {}, self.aux_names, self.aux_arrays),
        ):
            index = {n: i for i, n in enumerate(names)}
            unknown = sorted(set(values) - set(index))
            if unknown:
                raise ValueError(
                    f"{kind} has {unknown}, which the symbol does not have; its {kind} are {names}"
                )
            for name, value in values.items():
                for target in arrays[index[name]]:
                    if tuple(value.shape) != target.shape:
                        raise ValueError(
                            f"{kind}[{name!r}] has shape {tuple(value.shape)}, "
                            f"the symbol needs {target.shape}"
                        )
                    if isinstance(value, mx.nd.NDArray):
                        value.astype(target.dtype, copy=False).copyto(target)
                    else:
                        target[:] = np.asarray(value, dtype=target.dtype)
        if aux_params and set(aux_params) == set(self.aux_names):
            self._root._aux_agree = True

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
        cpu = mx.cpu()
        aux_params = {}
        for name, arrays in zip(self.aux_names, self.aux_arrays):
            total = arrays[0].copyto(cpu)
            if (
                not self._root._aux_agree
            ):  # Module's arithmetic: (0 + a0 + a1 + ...) / n on the host
                for array in arrays[1:]:
                    total += array.copyto(cpu)
                total /= len(arrays)
            aux_params[name] = total
        return aux_params

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
        that covers the undeclared write. An extension that reads the
        network calls ``main_loop.synchronize()`` (the same thing) first.
        """
        mx.nd.waitall()

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
