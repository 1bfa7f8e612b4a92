"""A faster updater for the common optimizers: one fused kernel call per parameter.

MXNet 1.9.1's stock ``Updater`` sends every dense SGD step through its
multi-tensor kernels (``multi_sgd_update`` / ``multi_sgd_mom_update``), which
cost 1.5-2x more on the CPU than the one-parameter kernels, and works out each
parameter's learning rate, weight decay and keyword arguments again at every
call. :class:`FusedUpdater` works out what does not change once per parameter
(its multipliers, state, keywords and the prepared call of
:class:`~mxoid.invoke.PreparedCall`: a *plan*) and then calls MXNet's own fused
kernel for it directly:

=================================  =====================  =======================
optimizer                          kernel                 against the stock path
=================================  =====================  =======================
``SGD`` with momentum              ``sgd_mom_update``     bit-identical
``SGD`` without momentum           ``sgd_update``         rounds differently (~1e-7)
``NAG`` with momentum              ``nag_mom_update``     bit-identical
``NAG`` without momentum           ``sgd_update``         bit-identical
``Adam``                           ``adam_update``        bit-identical
=================================  =====================  =======================

A step over a list of parameters (the loop's local updates, one call per
device) queues its kernels as one operation of MXNet's engine
(:class:`~mxoid.invoke.EngineBulk`, MXNet's imperative bulking): each engine
operation costs its queuing, its dependency tracking and a pass through a
worker's queue, paid once per step instead of once per parameter.

A kvstore that updates (``update_on_kvstore``: the ``'local'`` and ``'device'``
kvstores on several devices) calls its updater with new array handles at every
step, pointing to the same storage (its summed gradient and its copy of the
weight). An updater made for a kvstore (``kvstore_buffers=True``) keeps the
first call's arrays; once :meth:`FusedUpdater.settle_buffers` has noted their
data pointers (the loop calls it after waiting for the engine, at the end of
the first epoch), a call whose arrays have the same data pointers reuses the
call prepared on them, and one whose do not calls the ``mx.nd`` kernel on the
arrays given (as every updater does for handles it was not prepared with, and
as this one does until then).

Everything else takes the stock path: other optimizers, ``multi_precision``,
sparse arrays. Update counts are kept as the optimizer keeps them (so Adam's
bias correction, learning-rate schedulers and ``num_update`` are MXNet's), the
learning rate is read from the optimizer (or its ``lr_scheduler``) at every step,
so ``set_learning_rate`` works, and states save and load as the stock updater's
do: checkpoints load in ``Module``.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any, Dict, Optional, Union

import mxnet as mx
from mxnet.base import _LIB, check_call

from ..executor_manager.invoke import EngineBulk, PreparedCall

__all__ = ["FusedSGDUpdater", "FusedUpdater", "create_updater", "fused_kernel"]


def fused_kernel(optimizer: mx.optimizer.Optimizer) -> Optional[str]:
    """Return the name of the kernel :class:`FusedUpdater` calls for ``optimizer``, or None.

    None means the stock path (an optimizer without a fused kernel here, or
    ``multi_precision``).
    """
    if getattr(optimizer, "multi_precision", False):
        return None
    kind = type(optimizer)
    if kind is mx.optimizer.SGD:
        return "sgd_mom_update" if optimizer.momentum > 0 else "sgd_update"
    if kind is mx.optimizer.NAG:
        return "nag_mom_update" if optimizer.momentum > 0 else "sgd_update"
    if kind is mx.optimizer.Adam:
        return "adam_update"
    return None


class FusedUpdater(mx.optimizer.Updater):
    """MXNet's ``Updater`` with SGD, NAG and Adam done as one fused kernel call per parameter.

    See the module's documentation for the kernels and how their results
    compare with the stock updater's.

    Parameters
    ----------
    optimizer : mx.optimizer.Optimizer
    kvstore_buffers : bool, default False
        Whether a kvstore calls it (``kvstore._set_updater``) with its own
        buffers, whose storage does not change between steps of a key: new
        handles to the arrays of the first call then reuse its prepared call,
        once :meth:`settle_buffers` was called. Only for kvstores: a caller
        passing another view of the same data (a slice at the same address)
        would get the whole array updated.
    """

    def __init__(self, optimizer: mx.optimizer.Optimizer, kvstore_buffers: bool = False) -> None:
        super().__init__(optimizer)
        self.kvstore_buffers = kvstore_buffers
        self._plans: Dict[Any, Optional[_Plan]] = {}
        self._bulks: Dict[int, EngineBulk] = {}
        self._kernel = fused_kernel(optimizer)
        self._function = getattr(mx.nd, self._kernel) if self._kernel else None

    def set_states(self, states: bytes) -> None:
        """Load the states as the stock updater does; forget the plans made with the old ones."""
        super().set_states(states)
        self._plans.clear()
        self._kernel = fused_kernel(self.optimizer)
        self._function = getattr(mx.nd, self._kernel) if self._kernel else None

    def __call__(self, index: Union[int, str, list], grad: Any, weight: Any) -> None:
        """Update ``weight`` with ``grad`` (or lists of them, pair by pair).

        The optimizers of the module's table take their fused kernel; anything
        else, the stock path.
        """
        if self._kernel is None:
            return super().__call__(index, grad, weight)
        if isinstance(index, (list, tuple)):
            bulk = self._bulks.get(len(index))
            if bulk is None:
                bulk = self._bulks[len(index)] = EngineBulk(len(index))
            with bulk:  # the step's kernels as one engine operation
                for one_index, one_grad, one_weight in zip(index, grad, weight):
                    self._update_one(one_index, one_grad, one_weight)
        else:
            self._update_one(index, grad, weight)

    def _update_one(self, index: Any, grad: mx.nd.NDArray, weight: mx.nd.NDArray) -> None:
        plan = self._plans.get(index, False)
        if plan is False:
            plan = self._plans[index] = self._plan(index, grad, weight)
        if plan is None:
            super().__call__(index, grad, weight)
            return
        optimizer = self.optimizer
        optimizer._update_count(plan.key)
        if optimizer.lr_scheduler is not None:
            lr = optimizer.lr_scheduler(optimizer.num_update)
        else:
            lr = optimizer.lr
        lr *= plan.lr_mult
        if plan.adam:  # Adam's bias correction, as Adam.update computes it
            t = optimizer._index_update_count[plan.key]
            lr *= math.sqrt(1.0 - optimizer.beta2**t) / (1.0 - optimizer.beta1**t)
        wd = optimizer.wd * plan.wd_mult
        if (weight.handle.value == plan.weight and grad.handle.value == plan.grad) or (
            self.kvstore_buffers and plan.same_storage(weight, grad)
        ):
            plan.call(lr=lr, wd=wd, rescale_grad=optimizer.rescale_grad)
        else:  # other arrays than those prepared
            self._function(
                weight,
                grad,
                *plan.states,
                out=weight,
                lr=lr,
                wd=wd,
                rescale_grad=optimizer.rescale_grad,
                **plan.constants,
            )

    @property
    def buffers_to_settle(self) -> bool:
        """Whether some kvstore buffers await :meth:`settle_buffers`."""
        return any(plan is not None and plan.buffers for plan in self._plans.values())

    def settle_buffers(self) -> None:
        """Note the data pointers of the kvstore buffers the plans were prepared on.

        Call it only once the engine has computed everything queued before
        (``mx.nd.waitall()``): a kvstore allocates its buffers lazily, on the
        engine's thread, when their first write runs, and reading the data
        pointer of a buffer not allocated yet would allocate it from this
        thread too, racing with the engine.
        """
        for plan in self._plans.values():
            if plan is not None and plan.buffers:
                weight, grad = plan.buffers
                plan.pointers = (
                    data_pointer(weight, plan.scratch),
                    data_pointer(grad, plan.scratch),
                )
                plan.buffers = ()

    def _plan(self, index: Any, grad: mx.nd.NDArray, weight: mx.nd.NDArray) -> Optional[_Plan]:
        if weight.stype != "default" or grad.stype != "default":
            return None
        optimizer = self.optimizer
        key = mx.base.py_str(index) if isinstance(index, bytes) else index  # kvstore keys
        if key not in self.states:
            self.states[key] = optimizer.create_state_multi_precision(key, weight)
            self.states_synced[key] = True
        # The multipliers alone: _get_lrs / _get_wds with a base of 1 and no scheduler.
        lr, wd, scheduler = optimizer.lr, optimizer.wd, optimizer.lr_scheduler
        optimizer.lr, optimizer.wd, optimizer.lr_scheduler = 1.0, 1.0, None
        try:
            lr_mult, wd_mult = optimizer._get_lrs([key])[0], optimizer._get_wds([key])[0]
        finally:
            optimizer.lr, optimizer.wd, optimizer.lr_scheduler = lr, wd, scheduler
        plan = _Plan(key, self.states[key], lr_mult, wd_mult, self._kernel == "adam_update")
        plan.call = self._prepare(plan, grad, weight)
        return plan

    def _prepare(self, plan: _Plan, grad: mx.nd.NDArray, weight: mx.nd.NDArray) -> PreparedCall:
        """Prepare the kernel call on these arrays, with the keywords the optimizer passes."""
        optimizer, kernel = self.optimizer, self._kernel
        constants: Dict[str, Any] = {}  # rescale_grad is read at each step: see Update.average_over
        if optimizer.clip_gradient:
            constants["clip_gradient"] = optimizer.clip_gradient
        if kernel == "adam_update":
            constants.update(
                beta1=optimizer.beta1,
                beta2=optimizer.beta2,
                epsilon=optimizer.epsilon,
                lazy_update=optimizer.lazy_update,
            )
            plan.states = list(plan.state)  # the mean and the variance
        else:
            if kernel in ("sgd_mom_update", "nag_mom_update"):
                constants["momentum"] = optimizer.momentum
            if type(optimizer) is mx.optimizer.SGD:
                constants["lazy_update"] = optimizer.lazy_update
            plan.states = [] if kernel == "sgd_update" else [plan.state]
        plan.constants = constants
        plan.weight, plan.grad = weight.handle.value, grad.handle.value
        if self.kvstore_buffers:
            plan.buffers = (weight, grad)  # their pointers: see settle_buffers
        return PreparedCall(kernel, [weight, grad, *plan.states], [weight], **constants)


class _Plan:
    """What does not change between two steps of one parameter."""

    __slots__ = (
        "key",
        "state",
        "states",
        "lr_mult",
        "wd_mult",
        "adam",
        "call",
        "constants",
        "weight",
        "grad",
        "pointers",
        "scratch",
        "buffers",
    )

    def __init__(self, key: Any, state: Any, lr_mult: float, wd_mult: float, adam: bool) -> None:
        self.key, self.state, self.adam = key, state, adam
        self.lr_mult, self.wd_mult = lr_mult, wd_mult
        self.call: Optional[PreparedCall] = None
        self.states: list = []  # the kernel's state arrays, after the weight and gradient
        self.constants: Dict[str, Any] = {}  # its settings but the rate and weight decay
        self.weight = self.grad = 0  # the handles the call was prepared with
        self.pointers = (None, None)  # and their data pointers, once settled
        self.scratch = ctypes.c_void_p()
        self.buffers: tuple = ()  # a kvstore's arrays whose pointers are still to be noted

    def same_storage(self, weight: mx.nd.NDArray, grad: mx.nd.NDArray) -> bool:
        """Whether these arrays (other handles) point to the data the call was prepared on.

        The prepared arrays are kept alive by the call, so their storage cannot
        be freed and given to other arrays: the same pointers are the same
        arrays (as a kvstore passes them: new handles to its own buffers, which
        were allocated when their pointers were noted).
        """
        pointers = self.pointers
        return (
            pointers[0] is not None
            and data_pointer(weight, self.scratch) == pointers[0]
            and data_pointer(grad, self.scratch) == pointers[1]
        )


def data_pointer(array: mx.nd.NDArray, scratch: ctypes.c_void_p) -> Optional[int]:
    """Return the address of ``array``'s data (without waiting for the engine), or None."""
    check_call(_LIB.MXNDArrayGetData(array.handle, ctypes.byref(scratch)))
    return scratch.value


FusedSGDUpdater = FusedUpdater
"""The former name of :class:`FusedUpdater` (it fused momentum SGD only)."""


def create_updater(
    optimizer: mx.optimizer.Optimizer, kvstore_buffers: bool = False
) -> mx.optimizer.Updater:
    """Return the updater mxoid uses: :class:`FusedUpdater`.

    It falls back to MXNet's own path for the optimizers it has no kernel for;
    ``kvstore_buffers``: it is the updater of a kvstore (see :class:`FusedUpdater`).
    """
    return FusedUpdater(optimizer, kvstore_buffers=kvstore_buffers)
