"""Building a loop: its inputs checked, and the private heads its extensions ask for."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

import mxnet as mx

from ..checkpoint import CheckpointContents
from ..executor_manager import DataParallelExecutorManager, forward_work_load, split_batch
from ..executor_manager.binding import as_descs
from ..executor_manager.initialization import initial_params
from ..executor_manager.private_heads import RUNNING_SUMS_PREFIX
from ..extensions.base import Extension, HeadRequest
from ..network import AskHeads

if TYPE_CHECKING:  # pragma: no cover
    from .loop import MainLoop

__all__ = [
    "bind_training",
    "check_inputs",
    "check_rows",
    "heads_asker",
    "private_heads",
    "rows_per_device",
    "set_initial_params",
]

FEWER_ROWS_THAN_DEVICES = (
    "the training batches have {rows} row(s), fewer than the {devices} devices {contexts}: "
    "a batch of {rows} rows cannot be split across {devices} devices, and each device trains "
    "a slice of every batch. Use a batch size of at least {devices} (the iterator's "
    "batch_size, or DataLoader(batch_size=...)), or train on fewer devices "
    "(contexts={fewer})"
)


def check_inputs(symbol: Any, train_data: Any, initializer: Any) -> None:
    """Raise ``TypeError`` for a symbol, iterator or initializer of the wrong type, saying which."""
    if not isinstance(symbol, mx.sym.Symbol):
        raise TypeError(f"symbol must be an mx.sym.Symbol, not {type(symbol).__name__}")
    for attribute in ("provide_data", "provide_label", "reset"):
        if not hasattr(train_data, attribute):
            raise TypeError(
                f"train_data must be an mx.io.DataIter (it has no {attribute}); "
                f"got {type(train_data).__name__}"
            )
    if initializer is not None and not isinstance(initializer, mx.init.Initializer):
        raise TypeError(
            f"initializer must be an mx.init.Initializer such as mx.init.Xavier(), "
            f"not {type(initializer).__name__} ({initializer!r})"
        )


def rows_per_device(
    data_descs: Sequence[Any], devices: int, work_load_list: Optional[Sequence[float]]
) -> List[int]:
    """Return how many rows of a batch each device gets (as the manager splits it).

    A batch of fewer rows than devices (a short last batch) takes the first
    devices, one row each (:func:`~mxoid.executor_manager.forward_work_load`):
    the list is as long as the devices the executors run on. Empty when the
    inputs are not right: the manager then says what is wrong.
    """
    shares = list(work_load_list) if work_load_list is not None else [1] * devices
    try:
        batch_size = int(list(data_descs)[0][1][0])
        if not devices or len(shares) != devices:
            return []
        shares = forward_work_load(batch_size, shares)
        return [s.stop - s.start for s in split_batch(batch_size, shares)]
    except (ValueError, TypeError, IndexError):
        return []


def head_request(
    symbol: mx.sym.Symbol,
    data_descs: Sequence[Any],
    label_descs: Optional[Sequence[Any]],
    contexts: Sequence[mx.Context],
    work_load_list: Optional[Sequence[float]],
    key: Any = None,
) -> Optional[HeadRequest]:
    """Return what extensions are told when the executors for these inputs are bound.

    None when the inputs are not right (the manager then says what is wrong).
    """
    rows = rows_per_device(data_descs, len(contexts), work_load_list)
    if not rows:
        return None
    return HeadRequest(
        symbol,
        list(data_descs),
        list(label_descs or []),
        rows,
        list(contexts)[: len(rows)],
        RUNNING_SUMS_PREFIX,
        key,
    )


def private_heads(
    extensions: Sequence[Extension], request: Optional[HeadRequest]
) -> List[Tuple[Extension, mx.sym.Symbol]]:
    """Ask each extension for its private head (:meth:`Extension.private_head`).

    Returns ``(extension, head)`` for those that gave one, in their order:
    the executors bind the heads in that order, each keeping its running
    sums under a name of its own.
    """
    heads: List[Tuple[Extension, mx.sym.Symbol]] = []
    if request is None:
        return heads
    for extension in extensions:
        head = extension.private_head(
            request._replace(running_sums=f"{RUNNING_SUMS_PREFIX}{len(heads)}")
        )
        if head is not None:
            heads.append((extension, head))
    return heads


def heads_asker(
    extensions: Sequence[Extension],
    contexts: Sequence[mx.Context],
    work_load_list: Optional[Sequence[float]],
) -> AskHeads:
    """Return ``ask_heads(symbol, data_descs, label_descs, key) -> (heads, owners)``.

    What executors bound for these inputs (of bucket ``key``) compute for the
    extensions: their private heads (:func:`private_heads`), and the extension
    that asked for each (:meth:`~mxoid.executor_manager.ExecutorSet.private_output_of`).
    """

    def ask_heads(
        symbol: mx.sym.Symbol, data_descs: Sequence[Any], label_descs: Sequence[Any], key: Any
    ) -> Tuple[List[mx.sym.Symbol], List[Extension]]:
        request = head_request(symbol, data_descs, label_descs, contexts, work_load_list, key)
        heads = private_heads(extensions, request)
        return [head for _, head in heads], [extension for extension, _ in heads]

    return ask_heads


def bind_training(
    loop: MainLoop,
    ask_heads: AskHeads,
    work_load_list: Optional[Sequence[float]],
    fixed_param_names: Optional[Sequence[str]],
) -> DataParallelExecutorManager:
    """Bind the loop's training executors, with the private heads its extensions ask for.

    Each head's extension is known to the training set
    (:meth:`~mxoid.executor_manager.ExecutorSet.private_output_of`).
    """
    data = loop.train_data
    check_rows(data, loop.contexts)
    heads, owners = ask_heads(
        loop.symbol, data.provide_data, data.provide_label, loop.network.default_key
    )
    return DataParallelExecutorManager(
        loop.symbol,
        loop.contexts,
        data.provide_data,
        data.provide_label,
        work_load_list=work_load_list,
        fixed_param_names=fixed_param_names or (),
        grad_req="add" if loop.accumulate_batches > 1 else "write",
        private_heads=heads,
        head_owners=owners,
    )


def check_rows(train_data: Any, contexts: Sequence[mx.Context]) -> None:
    """Refuse training batches of fewer rows than devices, naming the batch size and the fix.

    Each device trains a slice of every batch (a short last batch of fewer
    rows is trained on the devices that get one: :func:`rows_per_device`).
    """
    rows = int(as_descs(train_data.provide_data)[0].shape[0])
    if rows < len(contexts):
        raise ValueError(
            FEWER_ROWS_THAN_DEVICES.format(
                rows=rows,
                devices=len(contexts),
                contexts=list(contexts),
                fewer=list(contexts)[: max(1, rows)],
            )
        )


def set_initial_params(
    manager: DataParallelExecutorManager,
    symbol: mx.sym.Symbol,
    initializer: Optional[mx.init.Initializer],
    arg_params: Optional[Mapping[str, mx.nd.NDArray]],
    aux_params: Optional[Mapping[str, mx.nd.NDArray]],
    allow_extra: bool,
    checkpoint: Optional[CheckpointContents],
) -> Dict[str, mx.nd.NDArray]:
    """Set every device's parameters: the checkpoint's, or those given, or drawn anew.

    Call it before the kvstore is initialized: with several devices it holds
    the master copy, which would overwrite values set later. Returns the
    parameters' host values (the kvstore starts from them).
    """
    if checkpoint is not None:
        arg_params, aux_params = checkpoint.arg_params, checkpoint.aux_params
    arg_values, aux_values = initial_params(
        manager,
        symbol,
        initializer,
        arg_params,
        aux_params,
        allow_extra=allow_extra or checkpoint is not None,
    )
    manager.set_params(arg_values, aux_values)
    return arg_values
