"""Loss scaling: the loss's gradient multiplied by a scale in the graph, divided out in the step.

``MainLoop(..., loss_scale=...)`` multiplies the gradient that enters the
graph at each loss head by a scale ``s`` and divides the parameters' gradients
by ``s`` again in the step (:class:`mxoid.update.LossScaler`): float16's small gradients,
which would underflow to zero, are computed ``s`` times larger (MXNet's AMP,
``mx.contrib.amp``, does the same for Gluon's ``Trainer``). With
``loss_scale='dynamic'`` (the default under ``mixed_precision='float16'``) the
scale follows AMP's rule (:class:`DynamicLossScale`): it starts at ``2**16``; a step
whose gradients hold an inf or a NaN on any device is skipped on every device
(parameters and optimizer states unchanged) and halves the scale; after
``growth_interval`` (2000) steps without one it doubles, up to ``2**24``. A
float is a fixed (static) scale, whose overflows are skipped too.

How the scale enters the graph. MXNet 1.9.1's loss operators
(:data:`LOSS_OPERATORS`: ``SoftmaxOutput``, ``MakeLoss``, the regression
outputs...) ignore the gradient their output is given: their backward pass
writes ``grad_scale * (p - label)`` whatever comes from above, so a scaled head
gradient would change nothing. The scale is put in front of them instead: each
loss operator's input ``x`` becomes

    ``y = BlockGrad(x) + (x - BlockGrad(x)) * s``

with ``s`` the float32 input :data:`SCALE_NAME` of shape ``(1,)`` (``x`` is float32
too: AMP keeps every loss operator in float32, ``FP32_FUNCS``, and casts its input).
Forward, ``x - x`` is exactly 0 for a finite ``x``, so ``y`` is ``x`` bit for bit and every output
is as without scaling; backward, the ``BlockGrad`` terms pass nothing back and
``x`` gets ``s * dy`` exactly. (``contrib.gradientmultiplier`` multiplies by a
constant attribute: a changing scale would need new executors.) Multiplying
by a power of two commutes with floating-point rounding, so every gradient
is ``s`` times the unscaled one bit for bit (barring subnormals and
overflow), and ``rescale_grad / s`` times it is the unscaled step: float32
training with a power-of-two scale equals training without one, bit for bit.
(MXNet reads ``rescale_grad`` from its decimal text, not always exactly: where
it cannot read ``rescale_grad / s``, the gradients are multiplied by ``1 / s``
instead, :meth:`mxoid.update.Update.set_loss_scale`.)

``s`` is one array per device, shared by every executor set of the loop (the
buckets', the evaluation's); it is no parameter (``grad_req='null'``, not in
``get_params``, the kvstore, checkpoints' parameters), and checkpoints save
the graph without it (:func:`without_loss_scale`): ``Module.load`` and
``SymbolBlock.imports`` read the network as given.

The cost: the step must know on the host whether the gradients are finite
before it updates, so each step waits for its backward pass (one host sync
per step, as AMP's ``has_overflow``), which a loop without loss scaling
never does. Several devices agree by construction (the check reads every
device's gradients); under ``dist_sync`` the workers check the same summed
gradients when they run the optimizer, and agree through the kvstore (one
small exchange a step) when the servers run it; ``dist_async`` is refused.
Skipped steps are not counted in ``status.updates_done`` (the schedules'
count), as AMP's leave the optimizer's update count alone;
``status.skipped_updates`` counts them and ``status.loss_scale`` is the scale.

bfloat16 has float32's exponent range and needs no loss scaling (its default
is None); it is allowed with float32 and bfloat16 (that is how it is tested on
CPUs: float16 needs a GPU).
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence, Union

import mxnet as mx

from .executor_manager import LOSS_SCALE_INPUT as SCALE_NAME

__all__ = [
    "LOSS_OPERATORS",
    "SCALE_NAME",
    "DynamicLossScale",
    "ScaledGraphs",
    "check_loss_scale",
    "with_loss_scale",
    "without_loss_scale",
]

LOSS_OPERATORS = (
    "SoftmaxOutput",
    "LinearRegressionOutput",
    "LogisticRegressionOutput",
    "MAERegressionOutput",
    "SVMOutput",
    "MakeLoss",
    "make_loss",
)
"""MXNet's operators whose backward pass ignores their output's gradient (checked in tests)."""
_NO_GRADIENT = ("BlockGrad", "stop_gradient")
_CASTS = ("amp_cast", "amp_multicast")
_SCALED = "_mxoid_scaled"  # the suffix of the node that gives a loss operator its input
DYNAMIC_START, DYNAMIC_MAX, GROWTH_INTERVAL = 2.0**16, 2.0**24, 2000  # AMP's LossScaler's
FLOAT32_MAX = float(2**128 - 2**104)  # the largest float32: a larger scale would be inf there

BAD_VALUE = (
    "loss_scale={value!r}: give 'dynamic' (AMP's dynamic loss scaling), a positive float "
    "up to float32's largest, 3.4e38 (a fixed scale, best a power of two) or None (no loss "
    "scaling)"
)
NO_LOSS = (
    "loss_scale: the graph has no loss operator to scale ({ops}); its heads are {heads}. End "
    "the network with one of them (e.g. mx.sym.MakeLoss(loss)), or use loss_scale=None"
)
OTHER_HEAD = (
    "loss_scale: the head {head!r} ({op}) takes the gradient it is given, which loss scaling "
    "does not scale (it scales the inputs of {ops}); make it a loss with mx.sym.MakeLoss, "
    "hide it from backward with mx.sym.BlockGrad, or use loss_scale=None"
)


def check_loss_scale(value: Any, mixed_precision: Optional[str]) -> Union[None, float, Any]:
    """Return the loop's loss scaling: None, a fixed float or a :class:`DynamicLossScale`.

    ``'auto'``: ``'dynamic'`` under float16, else None. A ``ValueError`` for
    anything but these, ``'dynamic'``, a ``DynamicLossScale`` or a positive
    finite number.
    """
    if isinstance(value, str) and value == "auto":
        value = "dynamic" if mixed_precision == "float16" else None
    if isinstance(value, str) and value == "dynamic":
        return DynamicLossScale()
    if value is None or isinstance(value, DynamicLossScale):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(BAD_VALUE.format(value=value))
    if not 0 < float(value) <= FLOAT32_MAX:
        raise ValueError(BAD_VALUE.format(value=value))
    return float(value)


class DynamicLossScale:
    """AMP's dynamic loss scaling, its numbers settable (``MainLoop(loss_scale=...)``).

    ``loss_scale='dynamic'`` is ``DynamicLossScale()``: the scale starts at
    ``initial``; a step whose gradients are not all finite is skipped and halves
    it; after ``growth_interval`` steps in a row that were not skipped it
    doubles, up to ``maximum`` (``mx.contrib.amp.loss_scaler.LossScaler``'s
    ``2**16``, 2000 and ``2**24``).

    Parameters
    ----------
    initial : float, default 2**16
    growth_interval : int, default 2000
    maximum : float, default 2**24
    """

    def __init__(
        self,
        initial: float = DYNAMIC_START,
        growth_interval: int = GROWTH_INTERVAL,
        maximum: float = DYNAMIC_MAX,
    ) -> None:
        if not 0 < initial <= maximum <= FLOAT32_MAX or isinstance(growth_interval, bool):
            raise ValueError(
                f"DynamicLossScale(initial={initial!r}, maximum={maximum!r}): give "
                "0 < initial <= maximum <= 3.4e38 (float32's largest)"
            )
        if not isinstance(growth_interval, int) or growth_interval < 1:
            raise ValueError(f"growth_interval must be an int >= 1, got {growth_interval!r}")
        self.initial, self.growth_interval = float(initial), growth_interval
        self.maximum = float(maximum)

    def __repr__(self) -> str:
        return (
            f"DynamicLossScale(initial={self.initial!r}, growth_interval="
            f"{self.growth_interval!r}, maximum={self.maximum!r})"
        )


# ------------------------------------------------------------------ the graph
def _renumbered(graph: Dict[str, Any], nodes: List[Dict[str, Any]], old: List[int]) -> Any:
    """Return the symbol of ``nodes`` (in order; ``old``: their indices in ``graph``)."""
    index = {o: n for n, o in enumerate(old)}
    for node in nodes:
        node["inputs"] = [[index[e[0]], *e[1:]] for e in node["inputs"]]
    graph = dict(graph, nodes=nodes)
    graph["heads"] = [[index[h[0]], *h[1:]] for h in graph["heads"]]
    graph["arg_nodes"] = [n for n, node in enumerate(nodes) if node["op"] == "null"]
    graph.pop("node_row_ptr", None)
    return mx.sym.load_json(json.dumps(graph))


def _check_heads(nodes: List[Dict[str, Any]], heads: Sequence[Sequence[int]]) -> None:
    """Raise ``ValueError`` for a head through which a gradient enters unscaled."""
    for head in heads:
        node = nodes[head[0]]
        while node["op"] in _CASTS:  # AMP's casts back to float32
            node = nodes[node["inputs"][0][0]]
        if node["op"] not in LOSS_OPERATORS + _NO_GRADIENT + ("null",):
            raise ValueError(
                OTHER_HEAD.format(head=node["name"], op=node["op"], ops=", ".join(LOSS_OPERATORS))
            )


def with_loss_scale(symbol: mx.sym.Symbol) -> mx.sym.Symbol:
    """Return ``symbol`` with each loss operator's input scaled in backward by :data:`SCALE_NAME`.

    See the module's documentation. Raises ``ValueError`` when the graph has
    no loss operator, or a head that takes its gradient from outside.
    """
    graph = json.loads(symbol.tojson(remove_amp_cast=False))
    nodes = graph["nodes"]
    if any(n["op"] == "null" and n["name"] == SCALE_NAME for n in nodes):
        return symbol
    _check_heads(nodes, graph["heads"])
    out: List[Dict[str, Any]] = []
    old: List[int] = []
    scale: Optional[int] = None
    for i, node in enumerate(nodes):
        if node["op"] in LOSS_OPERATORS:
            if scale is None:
                scale = -1
                old.append(scale)
                attrs = {"__shape__": "(1,)", "__dtype__": "0", "__init__": '["one", {}]'}
                out.append({"op": "null", "name": SCALE_NAME, "attrs": attrs, "inputs": []})
            x, name = node["inputs"][0], node["name"]
            made = [
                ("BlockGrad", f"{name}_mxoid_block", [x]),
                ("elemwise_sub", f"{name}_mxoid_difference", [x, [-2 - 4 * i, 0, 0]]),
                ("broadcast_mul", f"{name}_mxoid_times_scale", [[-3 - 4 * i, 0, 0], [-1, 0, 0]]),
                ("elemwise_add", f"{name}{_SCALED}", [[-2 - 4 * i, 0, 0], [-4 - 4 * i, 0, 0]]),
            ]
            for k, (op, new_name, inputs) in enumerate(made):
                old.append(-2 - 4 * i - k)
                out.append({"op": op, "name": new_name, "inputs": inputs})
            node = dict(node, inputs=[[-5 - 4 * i, 0, 0], *node["inputs"][1:]])
        old.append(i)
        out.append(node)
    if scale is None:
        raise ValueError(NO_LOSS.format(ops=", ".join(LOSS_OPERATORS), heads=symbol.list_outputs()))
    return _renumbered(graph, out, old)


def without_loss_scale(symbol: mx.sym.Symbol) -> mx.sym.Symbol:
    """Return ``symbol`` as it was before :func:`with_loss_scale` (itself when unscaled)."""
    if SCALE_NAME not in symbol.list_arguments():
        return symbol
    graph = json.loads(symbol.tojson(remove_amp_cast=False))
    nodes = graph["nodes"]
    for node in nodes:  # each loss operator reads its own input again
        first = node["inputs"][0] if node["inputs"] else None
        if first is not None and nodes[first[0]]["name"].endswith(_SCALED):
            block = nodes[nodes[first[0]]["inputs"][0][0]]
            node["inputs"][0] = block["inputs"][0]
    used, stack = set(), [h[0] for h in graph["heads"]]
    while stack:
        n = stack.pop()
        if n not in used:
            used.add(n)
            stack.extend(e[0] for e in nodes[n]["inputs"])
    keep = [i for i in range(len(nodes)) if i in used]
    return _renumbered(graph, [nodes[i] for i in keep], keep)


class ScaledGraphs:
    """How a network makes its graphs under loss scaling: AMP's conversion, then the scale.

    What :class:`~mxoid.network.Network` takes as its ``precision`` (it calls
    :meth:`convert` on each graph it makes, once).

    Parameters
    ----------
    precision : mxoid.precision.MixedPrecision or None
    """

    def __init__(self, precision: Any) -> None:
        self.precision = precision
        self.dtype = None if precision is None else precision.dtype

    def __repr__(self) -> str:
        return f"ScaledGraphs({self.precision!r})"

    def convert(self, symbol: mx.sym.Symbol, input_names: Sequence[str]) -> mx.sym.Symbol:
        """Return ``symbol`` converted by AMP (under mixed precision), with the loss scale."""
        if self.precision is not None:
            symbol = self.precision.convert(symbol, input_names)
        return with_loss_scale(symbol)
