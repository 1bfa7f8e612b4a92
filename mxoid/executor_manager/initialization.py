"""The parameters: initial values (the ones given, the rest drawn), fixed ones, their shapes."""

from __future__ import annotations

import difflib
import json
import logging
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Tuple

import mxnet as mx

from .private_heads import LOSS_SCALE_INPUT

if TYPE_CHECKING:  # pragma: no cover
    from .manager import DataParallelExecutorManager

__all__ = [
    "check_fixed",
    "fixed_gammas",
    "initial_params",
    "parameter_shapes",
    "shape_differences",
]

logger = logging.getLogger(__name__)


def initial_params(
    manager: DataParallelExecutorManager,
    symbol: mx.sym.Symbol,
    initializer: Optional[mx.init.Initializer],
    arg_params: Optional[Mapping[str, mx.nd.NDArray]],
    aux_params: Optional[Mapping[str, mx.nd.NDArray]],
    allow_extra: bool = False,
) -> Tuple[Dict[str, mx.nd.NDArray], Dict[str, mx.nd.NDArray]]:
    """Host values for every parameter: the given ones, the rest from the initializer.

    Missing values are drawn in sorted name order, as ``Module.init_params`` does.

    Parameters
    ----------
    allow_extra : bool, default False
        Ignore (and log) given values the network does not have, as Module's
        ``allow_extra``: the parameters of a pretrained model with another head.

    Raises
    ------
    ValueError
        For values the network does not have (unless ``allow_extra``), or of
        another shape than the network's: the message names them and says what
        to do.
    """
    initializer = initializer or mx.init.Uniform(0.01)
    attrs = symbol.attr_dict()
    values = []
    for kind, given, names, arrays in (
        ("arg_params", arg_params, manager.param_names, manager.param_arrays),
        ("aux_params", aux_params, manager.aux_names, manager.aux_arrays),
    ):
        given = dict(given or {})
        shapes = {n: a[0] for n, a in zip(names, arrays)}
        unknown = sorted(set(given) - set(shapes))
        if unknown and not allow_extra:
            raise ValueError(
                f"{kind} has {unknown}, which this network does not have (its parameters are "
                f"{sorted(shapes)}). To start from a model with other layers (a pretrained "
                "network with another head), pass allow_extra=True to ignore them"
            )
        if unknown:
            logger.info("ignoring %s %s: the network does not have them", kind, unknown)
        wrong = [
            f"{kind}[{name!r}] has shape {tuple(given[name].shape)}, this network needs "
            f"{shapes[name].shape}"
            for name in sorted(set(given) & set(shapes))
            if tuple(given[name].shape) != shapes[name].shape
        ]
        if wrong:
            names = [w.split("'")[1] for w in wrong]
            raise ValueError(
                f"{'; '.join(wrong)} (a new head with other classes?). Leave "
                f"{', '.join(map(repr, names))} out of the values given and the initializer "
                "draws them anew"
            )
        result = {}
        for name in sorted(shapes):
            template = shapes[name]
            value = given.get(name)
            if isinstance(value, mx.nd.NDArray) and value.dtype == template.dtype:
                result[name] = value.copyto(mx.cpu())  # one operator; mx.nd.array takes three
            elif name in given:
                result[name] = mx.nd.array(value, ctx=mx.cpu(), dtype=template.dtype)
            else:
                array = mx.nd.zeros(template.shape, ctx=mx.cpu(), dtype=template.dtype)
                initializer(mx.init.InitDesc(name, attrs.get(name, None)), array)
                result[name] = array
        values.append(result)
    return values[0], values[1]


Shapes = Dict[str, Tuple[int, ...]]


def parameter_shapes(
    symbol: mx.sym.Symbol, input_shapes: Mapping[str, Tuple[int, ...]]
) -> Tuple[Shapes, Shapes]:
    """Return the shapes of a symbol's parameters and auxiliary states for these input shapes.

    Raises
    ------
    mxnet.base.MXNetError
        When the symbol does not take these inputs.
    """
    known = {n: tuple(s) for n, s in input_shapes.items() if n in symbol.list_arguments()}
    arg_shapes, _, aux_shapes = symbol.infer_shape(**known)
    args = {
        n: tuple(s)
        for n, s in zip(symbol.list_arguments(), arg_shapes)
        if n not in known and n != LOSS_SCALE_INPUT
    }
    aux = {n: tuple(s) for n, s in zip(symbol.list_auxiliary_states(), aux_shapes)}
    return args, aux


def shape_differences(ours: Shapes, theirs: Shapes) -> str:
    """Say how two sets of parameter shapes differ: names on one side only, other shapes."""
    only_theirs = sorted(set(theirs) - set(ours))
    only_ours = sorted(set(ours) - set(theirs))
    shapes = sorted(
        f"{n}: {theirs[n]} saved, {ours[n]} here"
        for n in set(ours) & set(theirs)
        if ours[n] != theirs[n]
    )
    parts = [
        f"only in the checkpoint: {only_theirs}" if only_theirs else "",
        f"only in this network: {only_ours}" if only_ours else "",
        f"other shapes: {shapes}" if shapes else "",
    ]
    return "; ".join(part for part in parts if part)


def check_fixed(names: Sequence[str], param_names: Sequence[str]) -> List[str]:
    """Return ``names`` as a list, or raise naming the closest parameters of a mistyped one."""
    if isinstance(names, str):
        names = [names]
    names = list(names or ())
    for name in names:
        if name not in param_names:
            close = difflib.get_close_matches(name, param_names, n=3, cutoff=0.5)
            hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise ValueError(
                f"fixed_param_names has {name!r}, which is not a parameter of the "
                f"network{hint} Its parameters are {list(param_names)}"
            )
    return names


_BATCH_NORMS = ("BatchNorm", "BatchNorm_v1", "_contrib_SyncBatchNorm")


def fixed_gammas(symbol: mx.sym.Symbol) -> List[str]:
    """Return the gamma arguments of ``symbol``'s BatchNorms with ``fix_gamma`` (MXNet's default).

    Such a BatchNorm writes 1 into its gamma array in every forward pass,
    training or not, while the optimizer's weight decay and momentum move it
    between passes: an evaluation on executors sharing the training gammas
    would change what the next update and checkpoint see.
    """
    nodes = json.loads(symbol.tojson())["nodes"]
    names = []
    for node in nodes:
        if node["op"] not in _BATCH_NORMS:
            continue
        attributes = node.get("attrs") or node.get("attr") or node.get("param") or {}
        if str(attributes.get("fix_gamma", "True")).lower() in ("true", "1"):
            gamma = nodes[node["inputs"][1][0]]
            if gamma["op"] == "null":
                names.append(gamma["name"])
    return names
