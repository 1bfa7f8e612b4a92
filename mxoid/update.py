"""Update functions: the kvstore and the two ways to apply an optimizer step.

Plain functions, as in MXNet's own ``model.py``: a kvstore is created and
initialized once, then every batch either pushes the gradients to the
kvstore, which runs the optimizer (:func:`update_params_on_kvstore`), or
sums them through it and runs one local updater per device
(:func:`update_params`). :func:`prepare_update` does the whole set-up for a
loop in one call and returns an :class:`Update`: the optimizer, where it
runs, where its states live, and the function the loop calls every batch.
"""

from __future__ import annotations

import warnings
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import mxnet as mx

from .checkpoint.format import ResumeError
from .distributed.servers import is_asynchronous, is_distributed, set_server_optimizer
from .fused_updater import create_updater
from .invoke import PreparedPushPull

if TYPE_CHECKING:  # pragma: no cover
    from .executor_manager import DataParallelExecutorManager

__all__ = [
    "KVStoreLike",
    "Update",
    "optimizer_settings",
    "prepare_update",
    "create_kvstore",
    "create_optimizer",
    "initialize_kvstore",
    "kvstore_keys",
    "local_update",
    "local_update_parts",
    "update_params",
    "prepared_update_on_kvstore",
    "update_params_on_kvstore",
]

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
    return kv, bool(update_on_kvstore)


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
    keys = list(param_names) if keys is None else keys
    for key, name, arrays in zip(keys, param_names, param_arrays):
        kvstore.init(key, arg_params[name])
        if update_on_kvstore:
            kvstore.pull(key, out=arrays, priority=0)


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


class Update:
    """The optimizer step of a loop, as :func:`prepare_update` sets it up.

    Attributes
    ----------
    kvstore : KVStore or None
    update_on_kvstore : bool
        Whether the kvstore (its updater, or the servers) runs the optimizer.
    optimizer : mx.optimizer.Optimizer
        The optimizer that updates the parameters (replaced by
        :meth:`load_states`: the checkpoint's).
    updater : mx.optimizer.Updater or None
        The local updater, when the kvstore does not update.
    settings : dict
        :func:`optimizer_settings` of the optimizer as the loop was given it.
    step : callable
        Called with no argument after a backward pass (the last of a group, with
        gradient accumulation): sums the gradients and updates the parameters on
        every device. It is ``reduce`` then ``apply``.
    reduce : callable or None
        The first half: sums each gradient over the devices (and workers) in
        place, so every device holds the sum. None when there is nothing to sum
        there: one device and no kvstore, or the kvstore updates (it sums).
    apply : callable
        The second half: the optimizer's update.
    """

    def __init__(
        self,
        kvstore: Optional[mx.kvstore.KVStore],
        update_on_kvstore: bool,
        optimizer: mx.optimizer.Optimizer,
        updater: Optional[mx.optimizer.Updater],
        reduce: Optional[Callable[[], None]],
        apply: Callable[[], None],
    ) -> None:
        self.kvstore = kvstore
        self.update_on_kvstore = update_on_kvstore
        self.optimizer = optimizer
        self.updater = updater
        self.settings = optimizer_settings(optimizer)
        self.reduce, self.apply = reduce, apply
        if reduce is None:
            self.step = apply
        else:

            def step() -> None:
                reduce()
                apply()

            self.step = step

    def settle_buffers(self, synchronize: Callable[[], None]) -> None:
        """Let the kvstore's updater reuse its prepared calls (see ``FusedUpdater``).

        When it has buffers to settle, wait for the engine (``synchronize``)
        and note them: once at the end of the first epoch, and again after
        new plans (new optimizer states from a checkpoint).
        """
        updater = self._states_updater() if self.update_on_kvstore else None
        if getattr(updater, "buffers_to_settle", False):
            synchronize()
            updater.settle_buffers()

    def _states_updater(self) -> Optional[mx.optimizer.Updater]:
        """Return the updater holding the optimizer states here; None when the servers hold them."""
        if self.update_on_kvstore:
            return getattr(self.kvstore, "_updater", None)
        return self.updater

    def states(self) -> Optional[bytes]:
        """Return the optimizer and its states as MXNet dumps them.

        None with a distributed kvstore that updates (the states live on the servers).
        """
        updater = self._states_updater()
        return None if updater is None else updater.get_states(dump_optimizer=True)

    def load_states(self, states: bytes, started: Mapping[str, Any], where: str) -> List[str]:
        """Take the optimizer and states of a checkpoint; return the settings changed.

        The checkpoint's optimizer replaces this one, with its states (momentum,
        update counts, schedule), except for the settings this loop was given
        that differ from those the saved run ``started`` with: the new value wins.

        Raises
        ------
        ResumeError
            When the checkpoint's optimizer is of another type.
        """
        updater = self._states_updater()
        given = self.settings
        updater.set_states(states)
        restored = updater.optimizer
        if type(restored).__name__ != given["type"]:
            raise ResumeError(
                f"checkpoint {where} was trained with the optimizer {type(restored).__name__}, "
                f"this loop has {given['type']}; its states (momentum, moments) do not fit "
                f"another optimizer. Resume with optimizer={type(restored).__name__.lower()!r}, "
                "or start a new run from the checkpoint's parameters"
            )
        changes = []
        for name, value in given["settings"].items():
            before = started.get(name, value)
            if before == value:
                continue
            if name == "lr_scheduler":
                changes.append(
                    f"the optimizer's lr_scheduler changed ({before} -> {value}); "
                    "the checkpoint's scheduler and its state are kept"
                )
                continue
            current = getattr(restored, name, None)
            if name in ("lr_mult", "wd_mult"):
                getattr(restored, name).clear()
                getattr(restored, name).update(getattr(self.optimizer, name))
            elif name == "lr" and restored.lr_scheduler is not None:
                restored.lr_scheduler.base_lr = value
            else:
                setattr(restored, name, value)
            changes.append(
                f"the optimizer's {name}={value!r} given to this MainLoop (the run "
                f"started with {before!r}, and had {current!r} when saved); its "
                "state is kept"
            )
        restored.idx2name = self.optimizer.idx2name.copy()
        self.optimizer = restored
        if hasattr(updater, "_plans"):
            updater._plans.clear()
        return changes


def prepare_update(
    manager: DataParallelExecutorManager,
    symbol: mx.sym.Symbol,
    kvstore: Optional[mx.kvstore.KVStore],
    update_on_kvstore: bool,
    optimizer: Union[str, mx.optimizer.Optimizer],
    optimizer_params: Optional[Dict[str, object]],
    arg_params: Dict[str, mx.nd.NDArray],
    accumulate_batches: int = 1,
) -> Update:
    """Set up the optimizer step: the optimizer, the kvstore's contents, the updater.

    Call it once the devices hold the initial parameters (``arg_params``, host
    copies: they go on the kvstore). With a distributed kvstore the servers
    get their :class:`~mxoid.distributed.ServerOptimizer` (a collective
    call). On one machine an updating kvstore gets mxoid's faster updater.
    """
    optimizer = create_optimizer(
        optimizer,
        optimizer_params,
        symbol=symbol,
        param_names=manager.param_names,
        num_devices=len(manager.contexts),
        batch_size=manager.batch_size,
        kvstore=kvstore,
        update_on_kvstore=update_on_kvstore,
        accumulate_batches=accumulate_batches,
    )
    keys = kvstore_keys(kvstore, manager.param_names)
    updater = None if update_on_kvstore else create_updater(optimizer)
    if kvstore is not None:
        initialize_kvstore(
            kvstore, manager.param_arrays, arg_params, manager.param_names, update_on_kvstore, keys
        )
        if is_distributed(kvstore):
            set_server_optimizer(
                kvstore, optimizer if update_on_kvstore else None, len(manager.param_names)
            )
        elif update_on_kvstore:
            # What kvstore.set_optimizer does on one machine, with the faster updater.
            kvstore._set_updater(create_updater(optimizer, kvstore_buffers=True))
    if update_on_kvstore:
        reduce = None
        apply = prepared_update_on_kvstore(manager.param_arrays, manager.grad_arrays, kvstore, keys)
    else:
        reduce, apply = local_update_parts(
            manager.param_arrays, manager.grad_arrays, updater, len(manager.contexts), kvstore, keys
        )
    return Update(kvstore, update_on_kvstore, optimizer, updater, reduce, apply)
