"""The optimizer: created with the rescaling and the index-to-name map the update functions use."""

from __future__ import annotations

import warnings
from typing import Any, Dict, Optional, Sequence, Union

import mxnet as mx

from ..distributed.servers import is_asynchronous, is_distributed

__all__ = ["create_optimizer", "optimizer_settings"]


def create_optimizer(
    optimizer: Union[str, mx.optimizer.Optimizer],
    optimizer_params: Optional[Dict[str, object]],
    *,
    symbol: mx.sym.Symbol,
    param_names: Sequence[str],
    num_devices: int,
    batch_size: int,
    kvstore: Optional[mx.kvstore.KVStore],
    update_on_kvstore: bool,
    accumulate_batches: int = 1,
) -> mx.optimizer.Optimizer:
    """Create the optimizer with the gradient rescaling and index-to-name map MXNet expects.

    Gradients are summed over the batch (and, with ``dist_sync``, over the
    workers, and over the ``accumulate_batches`` batches of a group), so
    ``rescale_grad`` defaults to ``1 / (accumulate_batches * batch_size * workers)``.
    The index-to-name map matches the indices the update functions use, so
    per-parameter settings (no weight decay on biases, ``lr_mult``) land on the
    right parameters.

    Parameters
    ----------
    optimizer : str or mx.optimizer.Optimizer
        A name (``'sgd'``, ``'adam'``...) with ``optimizer_params``, or an
        optimizer object, whose own ``lr_mult`` / ``wd_mult`` are kept (as
        ``Module.init_optimizer`` keeps them) and whose index map is replaced.
    optimizer_params : dict, optional
        E.g. ``{'learning_rate': 0.1, 'momentum': 0.9, 'wd': 1e-4}``.
    symbol : mx.sym.Symbol
        The network: its ``lr_mult`` / ``wd_mult`` attributes apply.
    param_names : sequence of str
        The parameters the update functions are given, in their order (a
        group of them, for an optimizer per group).
    num_devices : int
        Devices in this process.
    batch_size : int
        Rows of a batch of this process.
    kvstore : KVStore or None
        As :func:`~mxoid.update.create_kvstore` returned it.
    update_on_kvstore : bool
        Where the optimizer runs: its index map is each parameter's index ``i``
        for the kvstore's updater (:func:`update_params_on_kvstore`), ``i *
        num_devices + k`` for a local updater (:func:`update_params`).
    accumulate_batches : int, default 1
        Batches whose gradients one step sums.
    """
    if update_on_kvstore:
        idx2name = dict(enumerate(param_names))
    else:
        idx2name = {
            i * num_devices + k: name
            for i, name in enumerate(param_names)
            for k in range(num_devices)
        }
    synchronous = is_distributed(kvstore) and not is_asynchronous(kvstore)
    workers = kvstore.num_workers if synchronous else 1
    rescale_grad = 1.0 / (accumulate_batches * batch_size * workers)
    if isinstance(optimizer, mx.optimizer.Optimizer):
        return _adopt_optimizer(optimizer, idx2name, symbol, rescale_grad)
    if not isinstance(optimizer, str):
        raise TypeError(
            f"optimizer must be a name or an mx.optimizer.Optimizer, not {type(optimizer).__name__}"
        )
    params = dict(optimizer_params or {})
    if "rescale_grad" not in params:
        params["rescale_grad"] = rescale_grad
    known = sorted(mx.optimizer.Optimizer.opt_registry)
    if optimizer.lower() not in known:
        raise ValueError(f"unknown optimizer {optimizer!r}; MXNet knows {known}")
    try:
        return mx.optimizer.create(optimizer, sym=symbol, param_idx2name=idx2name, **params)
    except TypeError as error:
        raise ValueError(
            f"optimizer {optimizer!r} rejects optimizer_params {params}: {error}"
        ) from None


def _adopt_optimizer(
    optimizer: mx.optimizer.Optimizer,
    idx2name: Dict[int, str],
    symbol: mx.sym.Symbol,
    rescale_grad: float,
) -> mx.optimizer.Optimizer:
    """Use an optimizer the user created, as ``Module.init_optimizer`` does.

    Its multipliers are kept.

    Its index-to-name map becomes the loop's (the indices the update functions
    use). Its own ``lr_mult`` / ``wd_mult`` (``set_lr_mult``, ``set_wd_mult``)
    are kept; the symbol's ``lr_mult`` / ``wd_mult`` attributes apply to the
    parameters they leave out. A ``rescale_grad`` other than ``1 / batch_size``
    gets the warning ``Module`` gives.
    """
    if optimizer.rescale_grad != rescale_grad:
        warnings.warn(
            f"Optimizer created manually outside MainLoop but rescale_grad is not "
            f"normalized to 1.0/batch_size/num_workers ({optimizer.rescale_grad} vs. "
            f"{rescale_grad}). Is this intended?",
            stacklevel=3,
        )
    optimizer.idx2name = idx2name.copy()
    attributes = symbol.attr_dict()
    for name in set(idx2name.values()):
        for key, multipliers in (
            ("__lr_mult__", optimizer.lr_mult),
            ("__wd_mult__", optimizer.wd_mult),
        ):
            if key in attributes.get(name, {}) and name not in multipliers:
                multipliers[name] = float(attributes[name][key])
    return optimizer


_NOT_SETTINGS = (
    "begin_num_update",
    "num_update",
    "idx2name",
    "sym_info",
    "param_dict",
    "aggregate_num",
    "allow_np_array",
)


def optimizer_settings(optimizer: mx.optimizer.Optimizer) -> Dict[str, Any]:
    """Return the optimizer's type and settings (not its state: no update counts), as plain data."""
    settings: Dict[str, Any] = {}
    for name, value in vars(optimizer).items():
        if name.startswith("_") or name in _NOT_SETTINGS:
            continue
        if name in ("lr_mult", "wd_mult"):
            settings[name] = {str(k): float(v) for k, v in value.items()}
        elif name == "lr_scheduler":
            settings[name] = None if value is None else type(value).__name__
        elif value is None or isinstance(value, (bool, int, float, str)):
            settings[name] = value
    return {"type": type(optimizer).__name__, "settings": settings}
