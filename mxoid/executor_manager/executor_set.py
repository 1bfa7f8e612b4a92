"""One executor set: the executors of one symbol for one set of input shapes, one per device.

A :class:`~mxoid.executor_manager.DataParallelExecutorManager` binds its
training set with it, and binds further sets on first use (inputs of other
shapes, another graph of the same parameters), each sharing the training
set's parameter, gradient and auxiliary arrays and its memory pool, as
``BucketingModule.switch_bucket`` binds each bucket with a ``shared_module``.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import mxnet as mx
import numpy as np

from ..errors import clean_mxnet_message
from .devices import forward_work_load, split_batch
from .initialization import fixed_gammas
from .invoke import PreparedCopy, backward_pass, forward_pass
from .outputs import OutputArrays, metric_output_names, output_short_name
from .private_heads import LOSS_SCALE_INPUT, RUNNING_SUMS_PREFIX, PrivateHeads
from .waiting import wait_for

__all__ = ["DataDescLike", "ExecutorSet", "as_descs"]

DataDescLike = Union[mx.io.DataDesc, Tuple[str, Tuple[int, ...]]]


def as_descs(shapes: Optional[Iterable[DataDescLike]]) -> List[mx.io.DataDesc]:
    """Return ``DataDesc`` objects for descriptions or ``(name, shape)`` pairs."""
    descs = []
    for item in shapes or ():
        if isinstance(item, mx.io.DataDesc):
            descs.append(item)
        else:
            descs.append(mx.io.DataDesc(item[0], tuple(item[1])))
    return descs


def _same_shape(array: mx.nd.NDArray, shape: Sequence[int], name: str) -> mx.nd.NDArray:
    """Return the shared ``array`` of ``name``, which must have the ``shape`` these inputs give."""
    if array.shape != tuple(shape):
        raise ValueError(
            f"parameter {name!r} has shape {tuple(shape)} for these inputs but "
            f"{array.shape} in the executors it shares; it cannot be shared"
        )
    return array


def _own_aux(name: str, shape: Sequence[int], ctx: mx.Context, dtype: Any) -> mx.nd.NDArray:
    """Return a set's own auxiliary state: a private head's sums, never a network's."""
    if not name.startswith(RUNNING_SUMS_PREFIX):
        raise ValueError(
            f"auxiliary state {name!r} of these inputs is not in the executors they share; "
            "it cannot be shared"
        )
    return mx.nd.zeros(shape, ctx, dtype=dtype)


class ExecutorSet:
    """The executors of ``symbol`` for inputs of one set of shapes: one per device.

    A batch of ``batch_size`` rows is split across the devices by
    ``work_load_list``. A set bound with ``shared`` (another set: the
    manager's training set) takes that set's parameter, gradient and
    auxiliary arrays by name, the same arrays and not copies, and allocates
    its own memory from that set's pool (``shared_exec``); it must not need
    parameters of other shapes. Such a set is for training (a bucket's set)
    or for forward passes only. A set so bound given fewer rows than devices
    binds the first ``batch_size`` devices, one row each
    (:func:`~mxoid.executor_manager.devices.forward_work_load`); a training
    one zeroes the gradients of the devices it leaves out at each backward
    pass (with ``grad_req='write'``; with ``'add'`` they keep what they have
    summed), so that the step sums the gradients of its rows alone.

    Parameters
    ----------
    symbol : mx.sym.Symbol
        The network.
    contexts : sequence of mx.Context
        The devices.
    data_descs, label_descs : sequence of DataDesc or (name, shape)
        The inputs; the first dimension is the batch size.
    work_load_list : sequence of float
        Each device's share of a batch.
    shared : ExecutorSet, optional
        The set whose arrays and memory this one shares.
    fixed_param_names : sequence of str
        Parameters that get no gradient.
    grad_req : {'write', 'add'}
        As the manager's.
    for_training : bool
        False binds no gradient at all.
    private_heads : sequence of mx.sym.Symbol
        Outputs for mxoid, bound after the symbol's (see
        :mod:`~mxoid.executor_manager.private_heads`).
    head_owners : sequence of object, optional
        Who asked for each private head, in their order (the extensions whose
        :meth:`~mxoid.extensions.Extension.private_head` gave it): what
        :meth:`private_output_of` answers them.

    Attributes
    ----------
    executors : list of mx.executor.Executor
    param_arrays, grad_arrays, aux_arrays : list of list of NDArray
        The set's parameters (``param_names``), their gradients (``None`` for
        fixed ones and for sets without gradients) and auxiliary states
        (``aux_names``), one array per device.
    outputs : OutputArrays
        Output name -> one array per device, written by :meth:`forward`.
    labels : dict of str to list of NDArray
        The label slice on each device for the loaded batch.
    valid_rows : list of int
        Rows of the loaded batch that are real (not padding), per device.
    private_outputs, running_sums
        Of the private heads (see :class:`~mxoid.DataParallelExecutorManager`).
    training_pass : bool
        Whether the last forward pass was for training.
    """

    def __init__(
        self,
        symbol: mx.sym.Symbol,
        contexts: Sequence[mx.Context],
        data_descs: Sequence[DataDescLike],
        label_descs: Optional[Sequence[DataDescLike]],
        work_load_list: Sequence[float],
        *,
        shared: Optional[ExecutorSet] = None,
        fixed_param_names: Sequence[str] = (),
        grad_req: str = "write",
        for_training: bool = True,
        private_heads: Sequence[mx.sym.Symbol] = (),
        head_owners: Sequence[Any] = (),
    ) -> None:
        self.symbol = symbol
        self.shared = shared
        self._head_of = {id(owner): index for index, owner in enumerate(head_owners)}
        # What the executors run: the symbol, and the private heads after its outputs.
        self._private = PrivateHeads(symbol, private_heads, for_training)
        self.bound_symbol = self._private.symbol
        self.data_descs, self.label_descs = as_descs(data_descs), as_descs(label_descs)
        if not self.data_descs:
            raise ValueError("no data shapes given; pass the iterator's provide_data")
        self.data_names = [d.name for d in self.data_descs]
        self.label_names = [d.name for d in self.label_descs]
        self.arg_names = symbol.list_arguments()
        self.aux_names = symbol.list_auxiliary_states()
        self._check_input_names()
        inputs = set(self.data_names) | set(self.label_names) | {LOSS_SCALE_INPUT}
        self.param_names = [n for n in self.arg_names if n not in inputs]
        self.fixed_param_names = list(fixed_param_names)
        self.grad_req = grad_req
        self.for_training = for_training
        self.output_names = [output_short_name(n) for n in symbol.list_outputs()]
        self.metric_outputs = metric_output_names(symbol)
        self.batch_size = self._check_batch_size()
        contexts, work_load_list = list(contexts), list(work_load_list)
        if not self.for_training or shared is not None:  # the first devices, for fewer rows
            work_load_list = forward_work_load(self.batch_size, work_load_list)
            contexts = contexts[: len(work_load_list)]
        self.contexts, self.work_load_list = contexts, list(work_load_list)
        self.slices = split_batch(self.batch_size, self.work_load_list)
        self.executors = [self._bind(i, ctx) for i, ctx in enumerate(self.contexts)]
        self._take_arrays()
        self._idle_grads = self._grads_left_out()

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

    def _check_batch_size(self) -> int:
        batch_size = int(self.data_descs[0].shape[0])
        for desc in self.data_descs + self.label_descs:
            if not desc.shape or desc.shape[0] != batch_size:
                raise ValueError(
                    f"the symbol rejects the input shapes: {desc.name!r} has shape "
                    f"{tuple(desc.shape)} but {self.data_names[0]!r} has a batch of "
                    f"{batch_size}; every input needs the batch size as its first dimension"
                )
        return batch_size

    def _grad_req(self, name: str, inputs: Mapping[str, tuple]) -> str:
        """Return how ``name``'s gradient is written: ``'null'`` or ``grad_req``.

        ``'null'`` for inputs and fixed parameters (no gradient, and no backward
        work for them), and for everything when not for training.
        """
        if not self.for_training or name in inputs or name in self.fixed_param_names:
            return "null"
        if name == LOSS_SCALE_INPUT:
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
            if self.shared is None:
                names = self.bound_symbol.list_arguments()  # the heads' after the symbol's
                grad_req = {n: self._grad_req(n, shapes) for n in names}
                executor = self.bound_symbol.simple_bind(
                    ctx, grad_req=grad_req, type_dict=types, **shapes
                )
                return self._with_tallies(executor, ctx, grad_req)
            return self._bind_shared(device, ctx, shapes, types)
        except (mx.base.MXNetError, RuntimeError) as error:
            raise ValueError(
                f"the symbol rejects the input shapes {shapes}: {clean_mxnet_message(error)}"
            ) from None

    def _with_tallies(
        self, executor: mx.executor.Executor, ctx: mx.Context, grad_req: Dict[str, str]
    ) -> mx.executor.Executor:
        """Bind again with each tally's gradient array its argument's own (see ``TALLY_SUFFIX``).

        ``simple_bind`` gives every argument a gradient array of its own; the
        executor bound again takes the same arrays and memory pool.
        """
        tallies = self._private.tally_names
        if not tallies:
            return executor
        grads = {n: g for n, g in executor.grad_dict.items() if g is not None}
        for name in tallies:
            grads[name] = executor.arg_dict[name]
            grads[name][:] = 0
        return self.bound_symbol.bind(
            ctx,
            args=executor.arg_dict,
            args_grad=grads,
            grad_req=grad_req,
            aux_states=executor.aux_dict,
            shared_exec=executor,
        )

    def _bind_shared(
        self, device: int, ctx: mx.Context, shapes: Dict[str, tuple], types: Dict[str, np.dtype]
    ) -> mx.executor.Executor:
        """Bind on device ``device`` with the arrays of the shared set's executor, by name.

        Its parameters are bound with the shared gradient arrays even for forward
        passes only (no memory is added): an executor bound with
        ``grad_req='null'`` is fused by MXNet's MKLDNN subgraph backend, which
        caches the weights at its first forward and then silently uses stale
        weights. A private head's arrays (running sums, switches) are the set's
        own, each set's sums read apart; a tally (one count over every set) is
        shared where the shared set has it.
        """
        base = self.shared.executors[device]
        symbol = self.bound_symbol
        arg_shapes, _, aux_shapes = symbol.infer_shape(**shapes)
        arg_types, _, aux_types = symbol.infer_type(**types)
        # A forward pass writes 1 into a fixed gamma: never into the training one.
        fixed = set() if self.for_training else set(fixed_gammas(symbol))
        args, grads, grad_req = {}, {}, {}
        for name, shape, dtype in zip(symbol.list_arguments(), arg_shapes, arg_types):
            private = name.startswith(RUNNING_SUMS_PREFIX)
            theirs = base.arg_dict.get(name)
            tally = name in self._private.tally_names
            if private and (theirs is None or theirs.shape != tuple(shape) or not tally):
                args[name] = mx.nd.zeros(shape, ctx, dtype=dtype)
                grad_req[name] = self._grad_req(name, shapes)
                if grad_req[name] != "null":  # the set's own sums
                    grads[name] = args[name] if tally else mx.nd.zeros(shape, ctx, dtype=dtype)
                continue
            if name in shapes or name in fixed or theirs is None:  # inputs, fixed gammas
                create = mx.nd.ones if name in fixed else mx.nd.zeros
                args[name] = create(shape, ctx, dtype=dtype)
                grad_req[name] = "null"
                continue
            args[name] = _same_shape(theirs, shape, name)
            if base.grad_dict.get(name) is None:  # a fixed parameter, a head's switch
                grad_req[name] = "null"
            else:
                grads[name] = base.grad_dict[name]
                grad_req[name] = self._grad_req(name, shapes) if self.for_training else "write"
        aux_states = [
            base.aux_dict[name]
            if name in base.aux_dict and not name.startswith(RUNNING_SUMS_PREFIX)
            else _own_aux(name, shape, ctx, dtype)
            for name, shape, dtype in zip(symbol.list_auxiliary_states(), aux_shapes, aux_types)
        ]
        return symbol.bind(
            ctx,
            args=args,
            args_grad=grads,
            grad_req=grad_req,
            aux_states=aux_states,
            shared_exec=base,
        )

    def _take_arrays(self) -> None:
        """Name the bound executors' arrays, and prepare the copies of each batch into them."""
        execs = self.executors
        self.param_arrays = [[e.arg_dict[n] for e in execs] for n in self.param_names]
        self.grad_arrays = [[e.grad_dict.get(n) for e in execs] for n in self.param_names]
        if not self.for_training:  # a forward-only set has no gradients of its own
            self.grad_arrays = [[None] * len(execs) for _ in self.param_names]
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
        self._pad = 0
        self.valid_rows = [s.stop - s.start for s in self.slices]
        self._next_pass: Optional[List[mx.executor.Executor]] = None
        # One prepared copy per input array and device, into its executor's array.
        self._data_copies = [[PreparedCopy(t) for t in ts] for ts in self._data_targets]
        self._label_copies = [[PreparedCopy(t) for t in ts] for ts in self._label_targets]

    def _grads_left_out(self) -> List[mx.nd.NDArray]:
        """Return the shared set's parameter gradients on the devices this training set leaves out.

        A backward pass of this set writes no gradient there: with
        ``grad_req='write'`` they still hold the last step's, which the step
        would sum in, so :meth:`backward` zeroes them.
        """
        shared = self.shared
        if shared is None or not self.for_training or self.grad_req != "write":
            return []
        devices = range(len(self.executors), len(shared.executors))
        return [g[k] for g in shared.grad_arrays for k in devices if g[k] is not None]

    def private_output_of(self, owner: Any) -> Optional[List[mx.nd.NDArray]]:
        """Return, per device, the output of the private head ``owner`` asked for, or None."""
        index = self._head_of.get(id(owner))
        return None if index is None else self.private_outputs[index]

    def same_inputs(
        self,
        data_shapes: Sequence[DataDescLike],
        label_shapes: Optional[Sequence[DataDescLike]] = None,
    ) -> bool:
        """Return whether inputs of these names and shapes are this set's own."""

        def named(descs: Sequence[DataDescLike]) -> List[Tuple[str, tuple]]:
            return [(d.name, tuple(d.shape)) for d in as_descs(descs)]

        return named(data_shapes) == named(self.data_descs) and named(label_shapes or []) == named(
            self.label_descs
        )

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
        (:class:`~mxoid.executor_manager.invoke.PreparedCopy`); other sources
        ``copyto`` itself.
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

    def synchronize(self) -> None:
        """Wait for the engine (see :meth:`mxoid.DataParallelExecutorManager.synchronize`)."""
        wait_for(mx.nd.waitall)

    @property
    def pad(self) -> int:
        """Padding rows at the end of the loaded batch."""
        return self._pad

    def forward(self, is_train: bool = False) -> None:
        """Run the forward pass on every device (asynchronously).

        The executors' output arrays are those bound (:attr:`outputs`), which
        every pass writes (see :func:`~mxoid.executor_manager.invoke.forward_pass`).
        Running sums kept as auxiliary states count the passes for training only.
        """
        self.training_pass = is_train
        private = self._private
        if private.switches and is_train != private.counting:
            private.count(is_train)
        for executor in self._next_pass or self.executors:
            forward_pass(executor, is_train)

    def backward(self) -> None:
        """Run the backward pass on every device (asynchronously)."""
        if not self.for_training:
            raise RuntimeError(
                "this executor set is for forward passes only (bound with for_training=False)"
            )
        if self._idle_grads:  # the devices without a row add nothing to the step
            mx.nd.reset_arrays(*self._idle_grads, num_arrays=len(self._idle_grads))
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
        """Bind, per device, a second executor that shares every array of this set's.

        See :meth:`mxoid.DataParallelExecutorManager.bind_twins`.
        """
        if not self.for_training:
            raise RuntimeError("twins are bound for training sets only")
        twins = []
        for executor, ctx in zip(self.executors, self.contexts):
            grads = {n: g for n, g in executor.grad_dict.items() if g is not None}
            twins.append(
                self.bound_symbol.bind(
                    ctx,
                    args=executor.arg_dict,
                    args_grad=grads,
                    grad_req={
                        n: (self._grad_req(n, {}) if n in grads else "null")
                        for n in self.bound_symbol.list_arguments()
                    },
                    aux_states=executor.aux_dict,
                    shared_exec=executor,
                )
            )
        return twins

    def use_twins_once(self, twins: List[mx.executor.Executor]) -> None:
        """Run the next forward and backward pass on ``twins`` (from :meth:`bind_twins`)."""
        self._next_pass = twins
