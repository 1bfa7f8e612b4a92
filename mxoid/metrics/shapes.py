"""Whether metrics fit the outputs and labels they read, before anything is bound.

- :func:`fits_on_devices`: whether a :class:`~mxoid.metrics.device.DeviceMetric` reads an
  output's rows on the devices (else its host twin is used);
- :func:`check_sums_graph`: one device's graph of per-row sums against its inputs' shapes,
  with a message naming the metrics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List

import mxnet as mx

from ..errors import clean_mxnet_message
from .device import DeviceMetric

if TYPE_CHECKING:  # pragma: no cover
    from ..executor_manager import DataParallelExecutorManager

__all__ = ["check_sums_graph", "fits_on_devices"]


def fits_on_devices(
    metric: DeviceMetric, manager: DataParallelExecutorManager, output: str, label: str
) -> bool:
    """Return whether ``metric`` reads the output's rows on the devices, or has no host twin."""
    if metric.host is None:
        return True  # refused below, saying why
    pred_shape = tuple(manager.outputs[output][0].shape)
    label_shape = tuple(manager.labels[label][0].shape)
    try:
        metric.per_row(mx.sym.var("pred"), mx.sym.var("label"), pred_shape, label_shape)
    except ValueError:
        return False
    return True


def check_sums_graph(
    graph: mx.sym.Symbol,
    inputs: Dict[str, mx.nd.NDArray],
    rows: int,
    metrics: List[DeviceMetric],
) -> None:
    """Check that ``graph`` (one device's per-row sums of ``metrics``) fits ``inputs``.

    Raises
    ------
    ValueError
        Naming the metrics and the shapes, where they do not fit or do not give one
        value per row.
    """
    arguments = set(graph.list_arguments())  # a metric may read no label ('loss')
    shapes = {name: array.shape for name, array in inputs.items() if name in arguments}
    outputs = len(graph.list_outputs())
    shapes.update({f"sum{p}": (rows,) for p in range(outputs)})
    try:
        _, out_shapes, _ = graph.infer_shape(**shapes)
    except mx.base.MXNetError as error:
        raise ValueError(
            f"the metrics {[m.name for m in metrics]} do not fit the outputs and "
            f"labels of shapes {shapes}: {clean_mxnet_message(error)}"
        ) from None
    for shape in out_shapes:
        if tuple(shape) != (rows,):
            raise ValueError(
                f"the metrics {[m.name for m in metrics]} give per-row sums of shape "
                f"{tuple(shape)}; they must have shape ({rows},)"
            )
