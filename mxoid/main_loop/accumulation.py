"""The optimizer step after each backward pass, and gradients accumulated over several batches.

With ``MainLoop(accumulate_batches=k)`` the executors add every batch's
gradients (``grad_req='add'``) and the loop takes one optimizer step after
every k-th batch, then zeroes them; a group may span an epoch end. A
checkpoint taken in the middle of a group keeps the gradients summed so far
(:func:`pending_gradients`), and training resumed from it completes the group.
"""

from __future__ import annotations

import warnings
from typing import Callable, Dict, Optional

import mxnet as mx

from ..executor_manager import DataParallelExecutorManager
from ..extensions.dispatch import HookDispatcher
from ..log.status import TrainingStatus
from ..update import Update

__all__ = [
    "check_accumulate_batches",
    "open_group",
    "pending_gradients",
    "restore_gradients",
    "step_function",
    "warn_open_group",
]


def check_accumulate_batches(value: object) -> int:
    """Return ``value`` if it is an int >= 1, or raise ``ValueError`` saying so."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"accumulate_batches must be an int >= 1, got {value!r}")
    return value


def step_function(
    status: TrainingStatus,
    manager: DataParallelExecutorManager,
    update: Update,
    dispatcher: HookDispatcher,
    accumulate_batches: int,
) -> Callable[[], None]:
    """Return what the loop calls after each backward pass: the update, when due.

    Without gradient accumulation, update hooks and loss scaling, the optimizer
    step and a count, nothing else. With ``accumulate_batches=k`` the step comes
    after every k-th batch (a group may span an epoch end), then the gradients
    are zeroed; ``before_update`` / ``after_update`` fire around it. Under loss
    scaling (``update.loss_scaler``) the summed gradients are checked first: a
    step with an inf or a NaN is skipped (no hook fires, ``status.skipped_updates``
    counts it) and the scale follows its rule (:class:`mxoid.update.LossScaler`).
    """
    before = dispatcher.runner("before_update")
    after = dispatcher.runner("after_update")
    scaler = update.loss_scaler
    k = accumulate_batches
    if k == 1 and before is None and after is None and scaler is None:
        step = update.step

        def plain() -> None:
            step()
            status.updates_done += 1

        return plain

    def grouped() -> None:
        if open_group(status, k) + 1 < k:
            return  # the group goes on: the gradients add up
        if update.reduce is not None:
            update.reduce()
        finite = scaler is None or scaler.finite()
        if finite:
            if before is not None:
                before()
            if scaler is not None:
                scaler.unscale()
            update.apply()
            status.updates_done += 1
            if after is not None:
                after()
        else:
            status.skipped_updates += 1
        if scaler is not None:  # the scale of the next batches, once this step is taken
            scaler.follow(finite)
            status.loss_scale = scaler.scale
        if k > 1:
            manager.zero_grads()

    return grouped


def open_group(status: TrainingStatus, accumulate_batches: int) -> int:
    """Return how many batches of an unfinished accumulation group are trained."""
    steps = status.updates_done + status.skipped_updates
    return status.iterations_done - steps * accumulate_batches


def warn_open_group(status: TrainingStatus, accumulate_batches: int) -> None:
    """Warn when training ends in the middle of a group: its gradients are not applied."""
    open_batches = open_group(status, accumulate_batches)
    if open_batches:
        warnings.warn(
            f"training ended {open_batches} batch(es) into a group of accumulate_batches="
            f"{accumulate_batches}: their gradients were not applied (a checkpoint "
            "keeps them, and training resumed from it completes the group)",
            stacklevel=4,  # the caller of MainLoop.run
        )


def pending_gradients(
    status: TrainingStatus, manager: DataParallelExecutorManager, accumulate_batches: int
) -> Optional[Dict[str, mx.nd.NDArray]]:
    """Return the gradients summed so far in an unfinished group, as host copies.

    By ``'<device>:<parameter>'``, for a checkpoint taken in the middle of a
    group; None when no group is open (or nothing accumulates).
    """
    if open_group(status, accumulate_batches) == 0:
        return None
    manager.synchronize()
    return {
        f"{device}:{name}": grads[device].copyto(mx.cpu())
        for name, grads in zip(manager.param_names, manager.grad_arrays)
        if grads[0] is not None
        for device in range(len(manager.executors))
    }


def restore_gradients(
    manager: DataParallelExecutorManager, gradients: Dict[str, mx.nd.NDArray]
) -> None:
    """Copy a checkpoint's ``'<device>:<parameter>'`` gradients into the manager's."""
    for name, grads in zip(manager.param_names, manager.grad_arrays):
        for device, grad in enumerate(grads):
            if grad is not None:
                gradients[f"{device}:{name}"].copyto(grad)
