"""Initial parameter values: the ones given, the rest from an initializer."""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Tuple

import mxnet as mx

from .executor_manager import DataParallelExecutorManager

__all__ = ["initial_params", "parameter_shapes", "shape_differences"]


def initial_params(
    manager: DataParallelExecutorManager,
    symbol: mx.sym.Symbol,
    initializer: Optional[mx.init.Initializer],
    arg_params: Optional[Mapping[str, mx.nd.NDArray]],
    aux_params: Optional[Mapping[str, mx.nd.NDArray]],
) -> Tuple[Dict[str, mx.nd.NDArray], Dict[str, mx.nd.NDArray]]:
    """Host values for every parameter: the given ones, the rest from the initializer.

    Missing values are drawn in sorted name order, as ``Module.init_params`` does.
    """
    initializer = initializer or mx.init.Uniform(0.01)
    attrs = symbol.attr_dict()
    values = []
    for given, names, arrays in (
        (arg_params, manager.param_names, manager.param_arrays),
        (aux_params, manager.aux_names, manager.aux_arrays),
    ):
        given = dict(given or {})
        shapes = {n: a[0] for n, a in zip(names, arrays)}
        unknown = sorted(set(given) - set(shapes))
        if unknown:
            raise ValueError(
                f"initial parameters {unknown} are not parameters of the symbol; "
                f"its parameters are {sorted(shapes)}"
            )
        result = {}
        for name in sorted(shapes):
            template = shapes[name]
            if name in given:
                value = given[name]
                if tuple(value.shape) != template.shape:
                    raise ValueError(
                        f"initial value of {name!r} has shape {tuple(value.shape)}, "
                        f"the symbol needs {template.shape}"
                    )
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
    args = {n: tuple(s) for n, s in zip(symbol.list_arguments(), arg_shapes) if n not in known}
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
