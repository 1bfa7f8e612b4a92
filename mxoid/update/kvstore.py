"""The kvstore: where gradients are summed, and where its keys and first values come from."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple, Union

import mxnet as mx

from ..distributed.servers import is_distributed
from ..distributed.workers import tell_launcher_rank

__all__ = ["KVStoreLike", "create_kvstore", "initialize_kvstore", "kvstore_keys"]

NOT_A_KVSTORE = (
    "initialize_kvstore needs a kvstore, not {what}. create_kvstore returns None where one "
    "device in one process needs none (kvstore='local' on one device, update_on_kvstore not "
    "asked for): then there is nothing to initialize. Skip initialize_kvstore, and update "
    "with update_params(param_arrays, grad_arrays, updater, 1) (no kvstore)"
)

KVStoreLike = Union[None, str, mx.kvstore.KVStore]
_KVSTORE_TYPES = (
    "local",
    "device",
    "nccl",
    "dist_sync",
    "dist_async",
    "dist_device_sync",
    "dist_device_async",
    "dist_sync_device",
    "dist_async_device",
    "dist",
)


def create_kvstore(
    kvstore: KVStoreLike, num_devices: int, update_on_kvstore: Optional[bool] = None
) -> Tuple[Optional[mx.kvstore.KVStore], bool]:
    """Create the kvstore and decide where the optimizer runs.

    Parameters
    ----------
    kvstore : None, str or KVStore
        ``None``, ``'local'``, ``'device'``, ``'dist_sync'``, ``'dist_async'``,
        ``'dist_device_sync'`` or a ``KVStore`` already created.
    num_devices : int
        Devices in this process.
    update_on_kvstore : bool, optional
        ``True`` runs the optimizer on the kvstore, ``False`` runs one local
        updater per device on gradients summed through the kvstore. By
        default the kvstore updates whenever there is one.

    Returns
    -------
    kvstore : KVStore or None
        ``None`` when a single device in a single process needs no kvstore
        (and ``update_on_kvstore`` was not asked for).
    update_on_kvstore : bool

    Raises
    ------
    ValueError
        For ``kvstore=None`` on several devices: MXNet would then train each
        device on its own gradients. mxoid refuses instead.
    """
    if kvstore is None:
        if num_devices > 1:
            raise ValueError(
                f"kvstore=None with {num_devices} devices would train each device on its own "
                "gradients; use kvstore='local' or 'device' to sum them"
            )
        if update_on_kvstore:
            raise ValueError("update_on_kvstore=True needs a kvstore; pass kvstore='local'")
        return None, False
    if isinstance(kvstore, mx.kvstore.KVStore):
        kv = kvstore
    elif isinstance(kvstore, str):
        if kvstore not in _KVSTORE_TYPES:
            raise ValueError(
                f"unknown kvstore {kvstore!r}; use one of {list(_KVSTORE_TYPES)}, "
                "None, or an mx.kv.KVStore"
            )
        if num_devices == 1 and "dist" not in kvstore and not update_on_kvstore:
            return None, False
        kv = mx.kv.create(kvstore)
    else:
        raise TypeError(
            f"kvstore must be None, a str or an mx.kv.KVStore, not {type(kvstore).__name__}"
        )
    if update_on_kvstore is None:
        update_on_kvstore = True
    tell_launcher_rank(kv)
    return kv, bool(update_on_kvstore)


def kvstore_keys(
    kvstore: Optional[mx.kvstore.KVStore], param_names: Sequence[str]
) -> List[Union[int, str]]:
    """Return each parameter's kvstore key: its index on one machine, its name when distributed.

    Integer keys spare the string conversions of every push and pull; the
    index is what the optimizer's index-to-name map expects. A distributed
    kvstore keeps the names, which its servers number in the same order.
    """
    if is_distributed(kvstore):
        return list(param_names)
    return list(range(len(param_names)))


def initialize_kvstore(
    kvstore: mx.kvstore.KVStore,
    param_arrays: List[List[mx.nd.NDArray]],
    arg_params: Dict[str, mx.nd.NDArray],
    param_names: Sequence[str],
    update_on_kvstore: bool,
    keys: Optional[Sequence[Union[int, str]]] = None,
) -> None:
    """Put every parameter on the kvstore, in ``param_names`` order.

    The order matters: the kvstore numbers keys in the order they are first
    initialized, and the optimizer's index-to-name map relies on it. With the
    update on the kvstore, the devices then pull the kvstore's copy, so every
    device (and every worker) starts from the same values.

    Parameters
    ----------
    keys : sequence of int or str, optional
        The kvstore key of each parameter (:func:`kvstore_keys`); the names by default.
    """
    if not isinstance(kvstore, mx.kvstore.KVStore):
        raise TypeError(NOT_A_KVSTORE.format(what=type(kvstore).__name__))
    keys = list(param_names) if keys is None else keys
    for key, name, arrays in zip(keys, param_names, param_arrays):
        kvstore.init(key, arg_params[name])
        if update_on_kvstore:
            kvstore.pull(key, out=arrays, priority=0)
