"""The update functions: the two ways to apply an optimizer step, as in MXNet's ``model.py``.

Every batch either pushes the gradients to the kvstore, which runs the
optimizer (:func:`update_params_on_kvstore`), or sums them through it and runs
one local updater per device (:func:`update_params`). The ``prepared_`` and
``local_update`` forms build their argument lists once, for a loop.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple, Union

import mxnet as mx

from ..executor_manager.invoke import PreparedPushPull

__all__ = [
    "local_update",
    "local_update_parts",
    "prepared_update_on_kvstore",
    "update_params",
    "update_params_on_kvstore",
]


def update_params_on_kvstore(
    param_arrays: List[List[mx.nd.NDArray]],
    grad_arrays: List[List[mx.nd.NDArray]],
    kvstore: mx.kvstore.KVStore,
    keys: Sequence[Union[int, str]],
) -> None:
    """Push each parameter's gradients to the kvstore, which updates it, and pull it back.

    ``keys`` are the parameters' kvstore keys, as given to :func:`initialize_kvstore`.
    """
    for index, (key, params, grads) in enumerate(zip(keys, param_arrays, grad_arrays)):
        if grads[0] is not None:  # fixed parameters have none
            kvstore.pushpull(key, grads, out=params, priority=-index)


def prepared_update_on_kvstore(
    param_arrays: List[List[mx.nd.NDArray]],
    grad_arrays: List[List[mx.nd.NDArray]],
    kvstore: mx.kvstore.KVStore,
    keys: Sequence[Union[int, str]],
) -> Callable[[], None]:
    """Return a function doing :func:`update_params_on_kvstore` with these arrays.

    Each parameter's ``pushpull`` is prepared once (:class:`~mxoid.invoke.PreparedPushPull`):
    the same calls, in the same order and priorities, without rebuilding their
    arguments every step.
    """
    pushpulls = [
        PreparedPushPull(kvstore, key, grads, params, priority=-index)
        for index, (key, params, grads) in enumerate(zip(keys, param_arrays, grad_arrays))
        if grads[0] is not None  # fixed parameters have none
    ]

    def update() -> None:
        for pushpull in pushpulls:
            pushpull()

    return update


def local_update(
    param_arrays: List[List[mx.nd.NDArray]],
    grad_arrays: List[List[mx.nd.NDArray]],
    updater: Callable,
    num_devices: int,
    kvstore: Optional[mx.kvstore.KVStore] = None,
    keys: Optional[Sequence[Union[int, str]]] = None,
) -> Callable[[], None]:
    """Return a function doing :func:`update_params` with these arrays, its lists built once."""
    reduce, apply = local_update_parts(
        param_arrays, grad_arrays, updater, num_devices, kvstore, keys
    )
    if reduce is None:
        return apply

    def update() -> None:
        reduce()
        apply()

    return update


def local_update_parts(
    param_arrays: List[List[mx.nd.NDArray]],
    grad_arrays: List[List[mx.nd.NDArray]],
    updater: Callable,
    num_devices: int,
    kvstore: Optional[mx.kvstore.KVStore] = None,
    keys: Optional[Sequence[Union[int, str]]] = None,
) -> Tuple[Optional[Callable[[], None]], Callable[[], None]]:
    """Return the two halves of :func:`update_params`, their lists built once.

    ``reduce()`` sums each parameter's gradients over the devices (and workers)
    through the kvstore, in place, so every device holds the sum (None without a
    kvstore); ``apply()`` runs the updater on each device. Fixed parameters
    (``None`` gradients) are left out; the indices stay ``i * num_devices + k``.
    """
    trainable = [i for i, grads in enumerate(grad_arrays) if grads[0] is not None]
    per_device = [
        (
            [i * num_devices + k for i in trainable],
            [grad_arrays[i][k] for i in trainable],
            [param_arrays[i][k] for i in trainable],
        )
        for k in range(num_devices)
    ]
    summed = (
        [
            PreparedPushPull(kvstore, keys[i], grad_arrays[i], grad_arrays[i], priority=-index)
            for index, i in enumerate(trainable)
        ]
        if kvstore is not None
        else []
    )

    def reduce() -> None:
        for pushpull in summed:
            pushpull()

    def apply() -> None:
        for indices, device_grads, weights in per_device:
            if indices:
                updater(indices, device_grads, weights)

    return (reduce if summed else None), apply


def update_params(
    param_arrays: List[List[mx.nd.NDArray]],
    grad_arrays: List[List[mx.nd.NDArray]],
    updater: Callable,
    num_devices: int,
    kvstore: Optional[mx.kvstore.KVStore] = None,
    keys: Optional[Sequence[Union[int, str]]] = None,
) -> None:
    """Update the parameters on each device with a local updater.

    With a kvstore, the gradients of all devices (and workers) are first
    summed through it (under ``keys``), so every device applies the same step.

    Parameters
    ----------
    updater : callable
        ``mx.optimizer.get_updater(optimizer)``; called once per device with
        lists of indices, gradients and weights. The index of parameter ``i``
        on device ``k`` is ``i * num_devices + k``.
    """
    local_update(param_arrays, grad_arrays, updater, num_devices, kvstore, keys)()
