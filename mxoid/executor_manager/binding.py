"""How an executor set binds its executors: its inputs checked, one executor per device.

- :func:`check_input_names`, :func:`batch_size_of`: the inputs an iterator describes,
  against the symbol's arguments, with a message naming the fix;
- :func:`bind_own`: a set of its own (``simple_bind``), the manager's training set;
- :func:`bind_shared`: a set that takes another set's parameter, gradient and auxiliary
  arrays by name, and its memory pool (``shared_exec``), as
  ``BucketingModule.switch_bucket`` binds a bucket.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import mxnet as mx
import numpy as np

from .initialization import fixed_gammas
from .private_heads import RUNNING_SUMS_PREFIX

__all__ = [
    "DataDescLike",
    "as_descs",
    "batch_size_of",
    "bind_own",
    "bind_shared",
    "check_input_names",
]

DataDescLike = Union[mx.io.DataDesc, Tuple[str, Tuple[int, ...]]]


def as_descs(shapes: Optional[Iterable[DataDescLike]]) -> List[mx.io.DataDesc]:
    """Return ``DataDesc`` objects for descriptions or ``(name, shape)`` pairs."""
    descs = []
    for item in shapes or ():
        if isinstance(item, mx.io.DataDesc):
            descs.append(item)
        else:
            descs.append(mx.io.DataDesc(item[0], tuple(item[1])))
    return descs


def check_input_names(
    arg_names: Sequence[str], data_names: Sequence[str], label_names: Sequence[str]
) -> None:
    """Check that the symbol takes every input the iterator names, and is given its inputs.

    Raises
    ------
    ValueError
        Naming the input and the fix (rename the iterator's data or label).
    """
    known = set(arg_names)
    for kind, names in (("data", data_names), ("label", label_names)):
        for name in names:
            if name not in known:
                raise ValueError(
                    f"the iterator provides {kind} {name!r}, which the symbol does not take; "
                    f"the symbol's arguments are {list(arg_names)}. Rename the iterator's "
                    f"{kind} (e.g. NDArrayIter(..., {kind}_name=...)) to match the symbol"
                )
    given = set(data_names) | set(label_names)
    missing = [
        n for n in arg_names if n not in given and (n.endswith("_label") or n in ("data", "label"))
    ]
    if missing:
        raise ValueError(
            f"the symbol takes {missing} as input but the iterator provides only "
            f"{sorted(given)}; name the iterator's data and label after the symbol's inputs"
        )


def batch_size_of(
    data_descs: Sequence[mx.io.DataDesc], label_descs: Sequence[mx.io.DataDesc]
) -> int:
    """Return the batch size: the first dimension of every input.

    Raises
    ------
    ValueError
        For an input whose first dimension differs.
    """
    batch_size = int(data_descs[0].shape[0])
    for desc in list(data_descs) + list(label_descs):
        if not desc.shape or desc.shape[0] != batch_size:
            raise ValueError(
                f"the symbol rejects the input shapes: {desc.name!r} has shape "
                f"{tuple(desc.shape)} but {data_descs[0].name!r} has a batch of "
                f"{batch_size}; every input needs the batch size as its first dimension"
            )
    return batch_size


def bind_own(
    symbol: mx.sym.Symbol,
    ctx: mx.Context,
    shapes: Dict[str, tuple],
    types: Dict[str, np.dtype],
    grad_req: Callable[[str], str],
    tally_names: Sequence[str],
) -> mx.executor.Executor:
    """Bind ``symbol`` on ``ctx`` with arrays of its own, each tally's gradient its argument.

    ``simple_bind`` gives every argument a gradient array of its own; with
    tallies (see ``TALLY_SUFFIX``) the executor is bound again, each tally's
    gradient array its argument's own, with the same arrays and memory pool.
    """
    requests = {n: grad_req(n) for n in symbol.list_arguments()}
    executor = symbol.simple_bind(ctx, grad_req=requests, type_dict=types, **shapes)
    if not tally_names:
        return executor
    grads = {n: g for n, g in executor.grad_dict.items() if g is not None}
    for name in tally_names:
        grads[name] = executor.arg_dict[name]
        grads[name][:] = 0
    return symbol.bind(
        ctx,
        args=executor.arg_dict,
        args_grad=grads,
        grad_req=requests,
        aux_states=executor.aux_dict,
        shared_exec=executor,
    )


def bind_shared(
    symbol: mx.sym.Symbol,
    base: mx.executor.Executor,
    ctx: mx.Context,
    shapes: Dict[str, tuple],
    types: Dict[str, np.dtype],
    grad_req: Callable[[str], str],
    tally_names: Sequence[str],
    for_training: bool,
) -> mx.executor.Executor:
    """Bind ``symbol`` on ``ctx`` with the arrays of ``base`` (the shared set's executor), by name.

    Its parameters are bound with the shared gradient arrays even for forward
    passes only (no memory is added): an executor bound with
    ``grad_req='null'`` is fused by MXNet's MKLDNN subgraph backend, which
    caches the weights at its first forward and then silently uses stale
    weights. A private head's arrays (running sums, switches) are the set's
    own, each set's sums read apart; a tally (one count over every set) is
    shared where the shared set has it.
    """
    arg_shapes, _, aux_shapes = symbol.infer_shape(**shapes)
    arg_types, _, aux_types = symbol.infer_type(**types)
    # A forward pass writes 1 into a fixed gamma: never into the training one.
    fixed = set() if for_training else set(fixed_gammas(symbol))
    args, grads, requests = {}, {}, {}
    for name, shape, dtype in zip(symbol.list_arguments(), arg_shapes, arg_types):
        private = name.startswith(RUNNING_SUMS_PREFIX)
        theirs = base.arg_dict.get(name)
        tally = name in tally_names
        if private and (theirs is None or theirs.shape != tuple(shape) or not tally):
            args[name] = mx.nd.zeros(shape, ctx, dtype=dtype)
            requests[name] = grad_req(name)
            if requests[name] != "null":  # the set's own sums
                grads[name] = args[name] if tally else mx.nd.zeros(shape, ctx, dtype=dtype)
            continue
        if name in shapes or name in fixed or theirs is None:  # inputs, fixed gammas
            create = mx.nd.ones if name in fixed else mx.nd.zeros
            args[name] = create(shape, ctx, dtype=dtype)
            requests[name] = "null"
            continue
        args[name] = _same_shape(theirs, shape, name)
        if base.grad_dict.get(name) is None:  # a fixed parameter, a head's switch
            requests[name] = "null"
        else:
            grads[name] = base.grad_dict[name]
            requests[name] = grad_req(name) if for_training else "write"
    aux_states = [
        base.aux_dict[name]
        if name in base.aux_dict and not name.startswith(RUNNING_SUMS_PREFIX)
        else _own_aux(name, shape, ctx, dtype)
        for name, shape, dtype in zip(symbol.list_auxiliary_states(), aux_shapes, aux_types)
    ]
    return symbol.bind(
        ctx, args=args, args_grad=grads, grad_req=requests, aux_states=aux_states, shared_exec=base
    )


def _same_shape(array: mx.nd.NDArray, shape: Sequence[int], name: str) -> mx.nd.NDArray:
    """Return the shared ``array`` of ``name``, which must have the ``shape`` these inputs give."""
    if array.shape != tuple(shape):
        raise ValueError(
            f"parameter {name!r} has shape {tuple(shape)} for these inputs but "
            f"{array.shape} in the executors it shares; it cannot be shared"
        )
    return array


def _own_aux(name: str, shape: Sequence[int], ctx: mx.Context, dtype: Any) -> mx.nd.NDArray:
    """Return a set's own auxiliary state: a private head's sums, never a network's."""
    if not name.startswith(RUNNING_SUMS_PREFIX):
        raise ValueError(
            f"auxiliary state {name!r} of these inputs is not in the executors they share; "
            "it cannot be shared"
        )
    return mx.nd.zeros(shape, ctx, dtype=dtype)
