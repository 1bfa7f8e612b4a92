"""One executor set: the executors of one symbol for one set of input shapes, one per device.

A :class:`~mxoid.executor_manager.DataParallelExecutorManager` binds its
training set with it, and binds further sets on first use (inputs of other
shapes, another graph of the same parameters), each sharing the training
set's parameter, gradient and auxiliary arrays and its memory pool, as
``BucketingModule.switch_bucket`` binds each bucket with a ``shared_module``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import mxnet as mx
import numpy as np

from ..errors import clean_mxnet_message
from .binding import DataDescLike, as_descs, batch_size_of, bind_own, bind_shared, check_input_names
from .devices import forward_work_load, split_batch
from .invoke import PreparedCopy, backward_pass, forward_pass
from .outputs import OutputArrays, metric_output_names, output_short_name
from .private_heads import LOSS_SCALE_INPUT, PrivateHeads
from .waiting import wait_for

__all__ = ["ExecutorSet"]


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
        check_input_names(self.arg_names, self.data_names, self.label_names)
        inputs = set(self.data_names) | set(self.label_names) | {LOSS_SCALE_INPUT}
        self.param_names = [n for n in self.arg_names if n not in inputs]
        self.fixed_param_names = list(fixed_param_names)
        self.grad_req = grad_req
        self.for_training = for_training
        self.output_names = [output_short_name(n) for n in symbol.list_outputs()]
        self.metric_outputs = metric_output_names(symbol)
        self.batch_size = batch_size_of(self.data_descs, self.label_descs)
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
    def _bind(self, device: int, ctx: mx.Context) -> mx.executor.Executor:
        shapes, types = self._input_shapes(device)
        tallies = self._private.tally_names

        def grad_req(name: str) -> str:
            return self._grad_req(name, shapes)

        try:
            if self.shared is None:
                return bind_own(self.bound_symbol, ctx, shapes, types, grad_req, tallies)
            base = self.shared.executors[device]
            return bind_shared(
                self.bound_symbol, base, ctx, shapes, types, grad_req, tallies, self.for_training
            )
        except (mx.base.MXNetError, RuntimeError) as error:
            raise ValueError(
                f"the symbol rejects the input shapes {shapes}: {clean_mxnet_message(error)}"
            ) from None

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
