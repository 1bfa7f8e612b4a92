"""The private head: the device metrics' per-row values computed in the network's own graph."""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import mxnet as mx
import numpy as np

from ..executor_manager.outputs import metric_output_names, output_short_name
from ..executor_manager.private_heads import COUNTING_SUFFIX
from .creation import Metric
from .host import HostMetric
from .naming import label_for_output

__all__ = ["dtypes_of", "per_row_head"]


def dtypes_of(descs: Sequence[Any]) -> Dict[str, str]:
    """Return name -> dtype name of data or label descriptions (float32 unless they say)."""
    return {desc[0]: np.dtype(getattr(desc, "dtype", None) or np.float32).name for desc in descs}


def per_row_head(
    symbol: mx.sym.Symbol,
    metrics: Sequence[Tuple[str, Metric]],
    label_names: Sequence[str],
    input_shapes: Dict[str, Tuple[int, ...]],
    rows_per_device: Sequence[int],
    running_sums: Optional[str] = None,
    input_types: Optional[Dict[str, Any]] = None,
    native: bool = True,
    contexts: Optional[Sequence[mx.Context]] = None,
) -> Optional[mx.sym.Symbol]:
    """Return a head computing the device metrics' per-row values in the symbol's own graph.

    Its output, behind ``BlockGrad``, has shape ``(rows, columns)`` in float64:
    for each metric computed on the devices (in the order given; host metrics
    are left out), the values :class:`MetricAccumulator` would compute from
    the outputs and labels after the forward pass, followed by each row's
    count for a metric whose rows count differently (an ignored label). Bound as a private head
    of the executors (``DataParallelExecutorManager(..., private_heads=[head])``),
    it spares the accumulator its operator call per device: one addition is
    left. ``input_shapes`` are those of a whole batch; the metrics see each
    device's shapes (its ``rows_per_device`` rows), as they do in the
    accumulator. None when there is no device metric, or when a metric does not
    fit every device's shapes (the accumulator then computes it itself, or
    reports why).

    With ``running_sums`` (a name starting with
    :data:`~mxoid.private_heads.RUNNING_SUMS_PREFIX`), for training
    executors: the head also adds the values to running sums of that name,
    inside the executor, so no operator call is left for the host. With
    MXNet's operators the sums are the gradient of an argument of that name,
    of the values' shape (``MakeLoss(sums * values)``, the values behind
    ``BlockGrad``), bound with ``grad_req='add'`` as the manager binds it:
    each backward pass adds the batch's values. With mxoid's fused operator
    they are an auxiliary state that the operator adds to in each forward
    pass while the argument ``<running_sums>_counting``
    (:data:`~mxoid.private_heads.COUNTING_SUFFIX`) is not 0, as the manager
    sets it for forward passes for training.

    Each of the head's operators costs the devices a dispatch, which on a small
    network is most of its cost; where the types allow (``input_types``: the
    inputs' dtypes, float32 where not given), the head takes fewer: a metric's
    ``float32_per_row`` where its output and label are float32, and one cast of
    the stacked values to float64 where every value is float32. Fewest of all,
    with ``native`` (the default): where every device metric is accuracy or
    cross-entropy (or NLL) of one float32 output of shape ``(rows, classes)``
    with float32 labels of shape ``(rows,)``, one operator of mxoid's computes
    all the values, the same bit for bit, when it can be built here and suits
    the ``contexts`` the head will run on (None: one CPU; see
    :mod:`mxoid.metrics.native`).
    """

    def device_shapes(rows: int) -> Dict[str, Tuple[int, ...]]:
        return {name: (rows,) + tuple(shape[1:]) for name, shape in input_shapes.items()}

    shapes = device_shapes(rows_per_device[0])
    types = {name: np.dtype((input_types or {}).get(name, np.float32)).name for name in shapes}
    out_types = _infer_types(symbol, types)
    try:
        _, out_shapes, _ = _infer_shapes(symbol, shapes)
    except mx.base.MXNetError:
        return None
    graph = _Graph(symbol, label_names, shapes, types, out_shapes, out_types)
    fused = _native_values(graph, metrics, contexts, running_sums) if native else None
    if fused is not None:
        values, width = fused
    else:
        try:
            columns = _columns(graph, metrics)
        except (ValueError, KeyError, mx.base.MXNetError):
            return None
        if not columns:
            return None
        column_types = [(_infer_types(column, types) or [None])[0] for column in columns]
        if all(dtype == "float32" for dtype in column_types):  # one cast, after the stack
            values = mx.sym.cast(mx.sym.stack(*columns, axis=1), dtype="float64")
        else:
            values = mx.sym.stack(*[mx.sym.cast(c, dtype="float64") for c in columns], axis=1)
        width = len(columns)
    head = mx.sym.BlockGrad(values)
    used = set(head.list_arguments())
    for rows in sorted(set(rows_per_device)):  # a metric may write its shapes into the graph
        try:
            given = {k: v for k, v in device_shapes(rows).items() if k in used}
            _, (shape,), _ = _infer_shapes(head, given)
        except mx.base.MXNetError:
            return None
        if tuple(shape) != (rows, width):
            return None
    if running_sums is None or fused is not None:  # the fused operator adds to its sums
        return head
    sums = mx.sym.var(running_sums, dtype="float64")  # shaped like the values when bound
    return mx.sym.Group([head, mx.sym.MakeLoss(sums * head)])


class _Graph(NamedTuple):
    """The symbol, and what :func:`per_row_head` worked out for one device's inputs."""

    symbol: mx.sym.Symbol
    label_names: Sequence[str]
    shapes: Dict[str, Tuple[int, ...]]  # the inputs'
    types: Dict[str, str]  # the inputs' dtype names
    out_shapes: Sequence[Tuple[int, ...]]
    out_types: Optional[List[str]]  # None where they cannot be told


def _columns(graph: _Graph, metrics: Sequence[Tuple[str, Metric]]) -> Optional[List[mx.sym.Symbol]]:
    """Each device metric's per-row values, from MXNet's operators (None: a label is missing)."""
    symbol, label_names, shapes, types, out_shapes, out_types = graph
    output_names = [output_short_name(n) for n in symbol.list_outputs()]
    internals = symbol.get_internals()
    available = set(internals.list_outputs())
    columns = []
    for output, metric in metrics:
        if isinstance(metric, HostMetric):
            continue
        label = label_for_output(output, metric_output_names(symbol), label_names)
        if label not in available:
            return None
        position = output_names.index(output)
        per_row = metric.per_row
        if out_types and out_types[position] == types.get(label) == "float32":
            per_row = getattr(metric, "float32_per_row", None) or per_row
        sums, elements = per_row(
            symbol[position], internals[label], tuple(out_shapes[position]), tuple(shapes[label])
        )
        columns.append(sums)
        if isinstance(elements, mx.sym.Symbol):  # each row's own count: a column after it
            columns.append(elements)
    return columns


def _native_values(
    graph: _Graph,
    metrics: Sequence[Tuple[str, Metric]],
    contexts: Optional[Sequence[mx.Context]],
    running_sums: Optional[str] = None,
) -> Optional[Tuple[mx.sym.Symbol, int]]:
    """``(values, columns)`` of the device metrics from mxoid's fused operator (None: not here).

    With ``running_sums``, the operator also adds the values to the running
    sums of that name (:func:`~mxoid.metrics.native.metric_sums`). It applies
    when every device metric is one it computes (:attr:`DeviceMetric.native`),
    all of one output of shape ``(rows, classes)`` and a label of shape ``(rows,)``,
    both float32, and the operator is available and suits the contexts
    (:mod:`mxoid.metrics.native`).
    """
    symbol, label_names, shapes, types, out_shapes, out_types = graph
    device = [(o, m) for o, m in metrics if not isinstance(m, HostMetric)]
    natives = [getattr(metric, "native", None) for _, metric in device]
    outputs = {output for output, _ in device}
    if not natives or None in natives or len(outputs) != 1:
        return None
    output_names = [output_short_name(n) for n in symbol.list_outputs()]
    (output,) = outputs
    label = label_for_output(output, metric_output_names(symbol), label_names)
    position = output_names.index(output)
    pred_shape, label_shape = tuple(out_shapes[position]), tuple(shapes.get(label, ()))
    if (
        len(pred_shape) != 2
        or label_shape != pred_shape[:1]
        or not out_types
        or out_types[position] != "float32"
        or types.get(label) != "float32"
        or label not in symbol.get_internals().list_outputs()
    ):
        return None
    from . import native  # builds and loads the operator on first use

    if not (native.suits(contexts) and native.available()):
        return None
    pred, label_symbol = symbol[position], symbol.get_internals()[label]
    if running_sums is None:
        return native.metric_rows(pred, label_symbol, natives), len(natives)
    counting = mx.sym.var(running_sums + COUNTING_SUFFIX, shape=(1,), dtype="float64")
    sums = mx.sym.var(running_sums, dtype="float64")
    return native.metric_sums(pred, label_symbol, natives, counting, sums), len(natives)


def _infer_types(symbol: mx.sym.Symbol, types: Dict[str, str]) -> Optional[List[str]]:
    """Return the dtype names of ``symbol``'s outputs given its inputs' (None if unknown)."""
    given = {name: dtype for name, dtype in types.items() if name in symbol.list_arguments()}
    try:
        _, out_types, _ = symbol._infer_type_impl(False, **given)
    except mx.base.MXNetError:
        return None
    if out_types is None:
        return None
    return [np.dtype(dtype).name for dtype in out_types]


def _infer_shapes(symbol: mx.sym.Symbol, shapes: Dict[str, Tuple[int, ...]]) -> Any:
    """``symbol.infer_shape(**shapes)`` without the lines MXNet prints when it fails."""
    result = symbol._infer_shape_impl(False, **shapes)
    if result[1] is None:  # shapes left unknown
        raise mx.base.MXNetError(f"cannot infer the shapes from {shapes}")
    return result
