"""Update functions: the kvstore and the two ways to apply an optimizer step.

Plain functions, as in MXNet's own ``model.py``: a kvstore is created and
initialized once, then every batch either pushes the gradients to the
kvstore, which runs the optimizer (:func:`update_params_on_kvstore`), or
sums them through it and runs one local updater per device
(:func:`update_params`).
"""
from __future__ import annotations

import warnings
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import mxnet as mx

__all__ = [
    "KVStoreLike",
    "create_kvstore",
    "create_optimizer",
    "initialize_kvstore",
    "kvstore_keys",
    "local_update",
    "update_params",
    "update_params_on_kvstore",
]

KVStoreLike = Union[None, str, mx.kvstore.KVStore]
_KVSTORE_TYPES = ("local", "device", "nccl", "dist_sync", "dist_async", "dist_device_sync",
                  "dist_device_async", "dist_sync_device", "dist_async_device", "dist")


def create_kvstore(kvstore: KVStoreLike, num_devices: int,
                   update_on_kvstore: Optional[bool] = None
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
                "gradients; use kvstore='local' or 'device' to sum them")
        if update_on_kvstore:
            raise ValueError("update_on_kvstore=True needs a kvstore; pass kvstore='local'")
        return None, False
    if isinstance(kvstore, mx.kvstore.KVStore):
        kv = kvstore
    elif isinstance(kvstore, str):
        if kvstore not in _KVSTORE_TYPES:
            raise ValueError(f"unknown kvstore {kvstore!r}; use one of {list(_KVSTORE_TYPES)}, "
                             "None, or an mx.kv.KVStore")
        if num_devices == 1 and "dist" not in kvstore and not update_on_kvstore:
            return None, False
        kv = mx.kv.create(kvstore)
    else:
        raise TypeError(f"kvstore must be None, a str or an mx.kv.KVStore, not {type(kvstore).__name__}")
    if update_on_kvstore is None:
        update_on_kvstore = True
    return kv, bool(update_on_kvstore)


def create_optimizer(optimizer: Union[str, mx.optimizer.Optimizer],
                     optimizer_params: Optional[Dict[str, object]], *,
                     symbol: mx.sym.Symbol, param_names: Sequence[str], num_devices: int,
                     batch_size: int, kvstore: Optional[mx.kvstore.KVStore],
                     update_on_kvstore: bool) -> mx.optimizer.Optimizer:
    """Create the optimizer with the gradient rescaling and index-to-name map MXNet expects.

    Gradients are summed over the batch (and, with ``dist_sync``, over the
    workers), so ``rescale_grad`` defaults to ``1 / (batch_size * workers)``.
    The index-to-name map matches the indices the update functions use, so
    per-parameter settings (no weight decay on biases, ``lr_mult``) land on the
    right parameters.
    """
    if update_on_kvstore:
        idx2name = dict(enumerate(param_names))
    else:
        idx2name = {i * num_devices + k: name
                    for i, name in enumerate(param_names) for k in range(num_devices)}
    synchronous = kvstore is not None and "dist" in kvstore.type and "async" not in kvstore.type
    workers = kvstore.num_workers if synchronous else 1
    rescale_grad = 1.0 / (batch_size * workers)
    if isinstance(optimizer, mx.optimizer.Optimizer):
        return _adopt_optimizer(optimizer, idx2name, symbol, rescale_grad)
    if not isinstance(optimizer, str):
        raise TypeError(f"optimizer must be a name or an mx.optimizer.Optimizer, "
                        f"not {type(optimizer).__name__}")
    params = dict(optimizer_params or {})
    if "rescale_grad" not in params:
        params["rescale_grad"] = rescale_grad
    known = sorted(mx.optimizer.Optimizer.opt_registry)
    if optimizer.lower() not in known:
        raise ValueError(f"unknown optimizer {optimizer!r}; MXNet knows {known}")
    try:
        return mx.optimizer.create(optimizer, sym=symbol, param_idx2name=idx2name, **params)
    except TypeError as error:
        raise ValueError(f"optimizer {optimizer!r} rejects optimizer_params {params}: {error}") from None


def _adopt_optimizer(optimizer: mx.optimizer.Optimizer, idx2name: Dict[int, str],
                     symbol: mx.sym.Symbol, rescale_grad: float) -> mx.optimizer.Optimizer:
    """Use an optimizer the user created, as ``Module.init_optimizer`` does, keeping its
    multipliers.

    Its index-to-name map becomes the loop's (the indices the update functions
    use). Its own ``lr_mult`` / ``wd_mult`` (``set_lr_mult``, ``set_wd_mult``)
    are kept; the symbol's ``lr_mult`` / ``wd_mult`` attributes apply to the
    parameters they leave out. A ``rescale_grad`` other than ``1 / batch_size``
    gets the warning ``Module`` gives.
    """
    if optimizer.rescale_grad != rescale_grad:
        warnings.warn(f"Optimizer created manually outside MainLoop but rescale_grad is not "
                      f"normalized to 1.0/batch_size/num_workers ({optimizer.rescale_grad} vs. "
                      f"{rescale_grad}). Is this intended?", stacklevel=3)
    optimizer.idx2name = idx2name.copy()
    attributes = symbol.attr_dict()
    for name in set(idx2name.values()):
        for key, multipliers in (("__lr_mult__", optimizer.lr_mult),
                                 ("__wd_mult__", optimizer.wd_mult)):
            if key in attributes.get(name, {}) and name not in multipliers:
                multipliers[name] = float(attributes[name][key])
    return optimizer


def kvstore_keys(kvstore: Optional[mx.kvstore.KVStore], param_names: Sequence[str]) -> List[Union[int, str]]:
    """The kvstore key of each parameter: its index on one machine, its name when distributed.

    Integer keys spare the string conversions of every push and pull; the
    index is what the optimizer's index-to-name map expects. A distributed
    kvstore keeps the names, which its servers number in the same order.
    """
    if kvstore is not None and "dist" in kvstore.type:
        return list(param_names)
    return list(range(len(param_names)))


def initialize_kvstore(kvstore: mx.kvstore.KVStore, param_arrays: List[List[mx.nd.NDArray]],
                       arg_params: Dict[str, mx.nd.NDArray], param_names: Sequence[str],
                       update_on_kvstore: bool,
                       keys: Optional[Sequence[Union[int, str]]] = None) -> None:
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
    keys = list(param_names) if keys is None else keys
    for key, name, arrays in zip(keys, param_names, param_arrays):
        kvstore.init(key, arg_params[name])
        if update_on_kvstore:
            kvstore.pull(key, out=arrays, priority=0)


def update_params_on_kvstore(param_arrays: List[List[mx.nd.NDArray]],
                             grad_arrays: List[List[mx.nd.NDArray]],
                             kvstore: mx.kvstore.KVStore,
                             keys: Sequence[Union[int, str]]) -> None:
    """Push each parameter's gradients to the kvstore, which updates it, and pull it back.

    ``keys`` are the parameters' kvstore keys, as given to :func:`initialize_kvstore`.
    """
    for index, (key, params, grads) in enumerate(zip(keys, param_arrays, grad_arrays)):
        kvstore.pushpull(key, grads, out=params, priority=-index)


def local_update(param_arrays: List[List[mx.nd.NDArray]], grad_arrays: List[List[mx.nd.NDArray]],
                 updater: Callable, num_devices: int,
                 kvstore: Optional[mx.kvstore.KVStore] = None,
                 keys: Optional[Sequence[Union[int, str]]] = None) -> Callable[[], None]:
    """Return a function doing :func:`update_params` with these arrays, its lists built once."""
    per_device = [([i * num_devices + k for i in range(len(param_arrays))],
                   [grads[k] for grads in grad_arrays], [params[k] for params in param_arrays])
                  for k in range(num_devices)]
    summed = list(zip(keys, grad_arrays)) if kvstore is not None else []

    def update() -> None:
        for index, (key, grads) in enumerate(summed):
            kvstore.pushpull(key, grads, out=grads, priority=-index)
        for indices, device_grads, weights in per_device:
            if indices:
                updater(indices, device_grads, weights)
    return update


def update_params(param_arrays: List[List[mx.nd.NDArray]], grad_arrays: List[List[mx.nd.NDArray]],
                  updater: Callable, num_devices: int,
                  kvstore: Optional[mx.kvstore.KVStore] = None,
                  keys: Optional[Sequence[Union[int, str]]] = None) -> None:
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
