"""The private head: the device metrics' per-row values computed in the network's own graph."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import mxnet as mx

from ..executor_manager import output_short_name
from .creation import Metric
from .host import HostMetric
from .naming import label_for_output

__all__ = ["per_row_head"]


def per_row_head(
    symbol: mx.sym.Symbol,
    metrics: Sequence[Tuple[str, Metric]],
    label_names: Sequence[str],
    input_shapes: Dict[str, Tuple[int, ...]],
    rows_per_device: Sequence[int],
    running_sums: Optional[str] = None,
) -> Optional[mx.sym.Symbol]:
    """Return a head computing the device metrics' per-row values in the symbol's own graph.

    Its output, behind ``BlockGrad``, has shape ``(rows, metrics)`` in float64:
    for each metric computed on the devices (in the order given; host metrics
    are left out), the values :class:`MetricAccumulator` would compute from
    the outputs and labels after the forward pass. Bound as a private head
    of the executors (``DataParallelExecutorManager(..., private_heads=[head])``),
    it spares the accumulator its operator call per device: one addition is
    left. ``input_shapes`` are those of a whole batch; the metrics see each
    device's shapes (its ``rows_per_device`` rows), as they do in the
    accumulator. None when there is no device metric, or when a metric does not
    fit every device's shapes (the accumulator then computes it itself, or
    reports why).

    With ``running_sums`` (a name starting with
    :data:`~mxoid.executor_manager.RUNNING_SUMS_PREFIX`), for training
    executors: the head also takes an argument of that name, of the values'
    shape, whose gradient is the values (``MakeLoss(sums * values)``, the
    values behind ``BlockGrad``). Bound with ``grad_req='add'``, as the
    manager binds it, each backward pass adds the batch's values to that
    gradient inside the executor: no operator call is left for the host.
    """
    output_names = [output_short_name(n) for n in symbol.list_outputs()]
    internals = symbol.get_internals()
    available = set(internals.list_outputs())

    def device_shapes(rows: int) -> Dict[str, Tuple[int, ...]]:
        return {name: (rows,) + tuple(shape[1:]) for name, shape in input_shapes.items()}

    shapes = device_shapes(rows_per_device[0])
    try:
        _, out_shapes, _ = _infer_shapes(symbol, shapes)
        columns = []
        for output, metric in metrics:
            if isinstance(metric, HostMetric):
                continue
            label = label_for_output(output, output_names, label_names)
            if label not in available:
                return None
            position = output_names.index(output)
            sums, _ = metric.per_row(
                symbol[position],
                internals[label],
                tuple(out_shapes[position]),
                tuple(shapes[label]),
            )
            columns.append(mx.sym.cast(sums, dtype="float64"))
    except (ValueError, KeyError, mx.base.MXNetError):
        return None
    if not columns:
        return None
    head = mx.sym.BlockGrad(mx.sym.stack(*columns, axis=1))
    used = set(head.list_arguments())
    for rows in sorted(set(rows_per_device)):  # a metric may write its shapes into the graph
        try:
            given = {k: v for k, v in device_shapes(rows).items() if k in used}
            _, (shape,), _ = _infer_shapes(head, given)
        except mx.base.MXNetError:
            return None
        if tuple(shape) != (rows, len(columns)):
            return None
    if running_sums is None:
        return head
    sums = mx.sym.var(running_sums, dtype="float64")  # shaped like the values when bound
    return mx.sym.Group([head, mx.sym.MakeLoss(sums * head)])


def _infer_shapes(symbol: mx.sym.Symbol, shapes: Dict[str, Tuple[int, ...]]) -> Any:
    """``symbol.infer_shape(**shapes)`` without the lines MXNet prints when it fails."""
    result = symbol._infer_shape_impl(False, **shapes)
    if result[1] is None:  # shapes left unknown
        raise mx.base.MXNetError(f"cannot infer the shapes from {shapes}")
    return result
