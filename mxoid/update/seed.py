"""MXNet's own kvstore and update functions, by their names and call forms in ``mx.model``.

mxoid descends from the MXNet pull request that split ``_train_multi_device``
into the executor manager and ``mx.model``'s ``_create_kvstore``,
``_initialize_kvstore``, ``_update_params_on_kvstore`` and ``_update_params``. A
loop written against those switches to mxoid's by changing its imports::

    from mxoid import DataParallelExecutorManager
    from mxoid.update import (
        _create_kvstore, _initialize_kvstore, _update_params, _update_params_on_kvstore
    )

Each takes MXNet's arguments (positionally or by keyword) and does what MXNet's
does, through mxoid's own functions (:func:`~mxoid.update.create_kvstore`,
:func:`~mxoid.update.initialize_kvstore`, :func:`~mxoid.update.update_params_on_kvstore`,
:func:`~mxoid.update.update_params`): the kvstore's keys are the parameters'
names, as MXNet's. Where mxoid refuses what MXNet allows, it says why:
``kvstore=None`` on several devices (each device would train on its own
gradients), and an optimizer whose index map does not fit the update path.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import mxnet as mx
import numpy as np

from .functions import update_params, update_params_on_kvstore
from .kvstore import KVStoreLike, create_kvstore, initialize_kvstore

__all__ = ["_create_kvstore", "_initialize_kvstore", "_update_params", "_update_params_on_kvstore"]

LARGEST_LOCAL_UPDATE = 1024 * 1024 * 16
"""Above this many elements in one parameter, MXNet's ``'local'`` kvstore does not update."""
NO_KEYS = (
    "_update_params with a kvstore needs param_names: the parameters' kvstore keys, "
    "as given to _initialize_kvstore"
)


def _create_kvstore(
    kvstore: KVStoreLike, num_device: int, arg_params: Dict[str, mx.nd.NDArray]
) -> Tuple[Optional[mx.kvstore.KVStore], bool]:
    """Create the kvstore and decide where the optimizer runs, as ``mx.model._create_kvstore``.

    None for one device in one process (a kvstore type without ``dist``);
    otherwise the kvstore, updating unless ``MXNET_UPDATE_ON_KVSTORE=0``, or
    ``'local'`` has a parameter of over 16M elements, or the kvstore cannot
    run an optimizer. ``kvstore=None`` on several devices is refused
    (:func:`~mxoid.update.create_kvstore`).
    """
    update_on_kvstore = bool(int(os.getenv("MXNET_UPDATE_ON_KVSTORE", "1")))
    kv, _ = create_kvstore(kvstore, num_device)
    if kv is None:
        return None, False
    if kvstore == "local" and arg_params:
        largest = max(int(np.prod(param.shape)) for param in arg_params.values())
        update_on_kvstore = update_on_kvstore and largest <= LARGEST_LOCAL_UPDATE
    return kv, update_on_kvstore and kv.is_capable(mx.kvstore.KVStoreBase.OPTIMIZER)


def _initialize_kvstore(
    kvstore: mx.kvstore.KVStore,
    param_arrays: List[List[mx.nd.NDArray]],
    arg_params: Dict[str, mx.nd.NDArray],
    param_names: Sequence[str],
    update_on_kvstore: bool,
) -> None:
    """Put every parameter on the kvstore under its name; the devices pull it when it updates."""
    initialize_kvstore(kvstore, param_arrays, arg_params, param_names, update_on_kvstore)


def _update_params_on_kvstore(
    param_arrays: List[List[mx.nd.NDArray]],
    grad_arrays: List[List[mx.nd.NDArray]],
    kvstore: mx.kvstore.KVStore,
    param_names: Sequence[str],
) -> None:
    """Push each parameter's gradients to the kvstore, which updates it, and pull it back."""
    update_params_on_kvstore(param_arrays, grad_arrays, kvstore, param_names)


def _update_params(
    param_arrays: List[List[mx.nd.NDArray]],
    grad_arrays: List[List[mx.nd.NDArray]],
    updater: Callable,
    num_device: int,
    kvstore: Optional[mx.kvstore.KVStore] = None,
    param_names: Optional[Sequence[str]] = None,
) -> None:
    """Sum the gradients through the kvstore if any, then run ``updater`` on each device.

    Parameter ``i`` on device ``k`` is the updater's index ``i * num_device + k``.
    """
    if kvstore is not None and param_names is None:
        raise TypeError(NO_KEYS)
    update_params(param_arrays, grad_arrays, updater, num_device, kvstore, param_names)
