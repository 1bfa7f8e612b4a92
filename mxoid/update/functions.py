"""The update functions: the two ways to apply an optimizer step, as in MXNet's ``model.py``.

Every batch either pushes the gradients to the kvstore, which runs the
optimizer (:func:`update_params_on_kvstore`), or sums them through it and runs
one local updater per device (:func:`update_params`). The ``prepared_`` and
``local_update`` forms build their argument lists once, for a loop.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import mxnet as mx

from ..executor_manager.invoke import PreparedPushPull

__all__ = [
    "check_index_map",
    "local_update",
    "local_update_parts",
    "prepared_update_on_kvstore",
    "update_params",
    "update_params_on_kvstore",
]


WRONG_INDEX_MAP = (
    "the optimizer's index-to-name map has {found} entries for {params} parameters on "
    "{devices} devices; {path} calls it with {indices}, so its per-parameter settings "
    "(lr_mult, wd_mult, no weight decay on biases) would land on other parameters. Create "
    "it with mxoid.update.create_optimizer(..., update_on_kvstore={on_kvstore}), or give "
    "mx.optimizer.create(..., param_idx2name={example})"
)
NO_KVSTORE = (
    "update_params_on_kvstore needs a kvstore that updates, not None: with no kvstore "
    "(one device) update with update_params(param_arrays, grad_arrays, updater, 1)"
)


def check_index_map(
    optimizer: Optional[mx.optimizer.Optimizer], params: int, devices: int, on_kvstore: bool
) -> None:
    """Raise ``ValueError`` when ``optimizer``'s index map does not fit the update path.

    A kvstore's updater is called with each parameter's index ``i``; a local
    updater with ``i * devices + k``, parameter ``i`` on device ``k`` (as
    :func:`update_params` calls it): ``idx2name`` must map those indices to the
    parameters' names. An empty map (no per-parameter settings) fits both; on
    one device both are the same.
    """
    mapping = getattr(optimizer, "idx2name", None)
    expected = params if on_kvstore else params * devices
    if not mapping or devices == 1 or len(mapping) == expected:
        return
    path, indices, example = (
        ("the kvstore's updater", "each parameter's index i", "dict(enumerate(param_names))")
        if on_kvstore
        else (
            "a local updater",
            "i * num_devices + k for parameter i on device k",
            "{i * num_devices + k: name for i, name in enumerate(param_names) "
            "for k in range(num_devices)}",
        )
    )
    raise ValueError(
        WRONG_INDEX_MAP.format(
            found=len(mapping),
            params=params,
            devices=devices,
            path=path,
            indices=indices,
            on_kvstore=on_kvstore,
            example=example,
        )
    )


def _kvstore_optimizer(kvstore: Any) -> Optional[mx.optimizer.Optimizer]:
    return getattr(getattr(kvstore, "_updater", None), "optimizer", None)


def update_params_on_kvstore(
    param_arrays: List[List[mx.nd.NDArray]],
    grad_arrays: List[List[mx.nd.NDArray]],
    kvstore: mx.kvstore.KVStore,
    keys: Sequence[Union[int, str]],
) -> None:
    """Push each parameter's gradients to the kvstore, which updates it, and pull it back.

    Parameters
    ----------
    param_arrays, grad_arrays : list of list of NDArray
        Per parameter, one array per device (``manager.param_arrays`` /
        ``grad_arrays``); a fixed parameter's gradients are None and it is left out.
    kvstore : KVStore
        A kvstore with an optimizer (``kvstore.set_optimizer``; with a
        distributed kvstore, the servers'), whose index map is each parameter's
        index (:func:`~mxoid.update.create_optimizer` with ``update_on_kvstore=True``).
    keys : sequence of int or str
        The parameters' kvstore keys, as given to :func:`initialize_kvstore`.

    Raises
    ------
    TypeError
        For ``kvstore=None``.
    ValueError
        When the kvstore's optimizer has a local updater's index map.
    """
    if kvstore is None:
        raise TypeError(NO_KVSTORE)
    if param_arrays:
        check_index_map(_kvstore_optimizer(kvstore), len(param_arrays), len(param_arrays[0]), True)
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
    if kvstore is None:
        raise TypeError(NO_KVSTORE)
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
    check_index_map(getattr(updater, "optimizer", None), len(param_arrays), num_devices, False)
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
