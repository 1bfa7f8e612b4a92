"""Metrics accumulated on the devices, read to the host only when asked.

MXNet's ``EvalMetric.update`` copies every batch to the host (``asnumpy``),
which stalls the asynchronous engine once per batch. The metrics here keep
running sums on each device instead, updated by one cached operator call per
device and batch (for the training batches, the training executors compute the
values themselves and add them to the sums), and are read
only when a value is wanted.

Three kinds of metric are accepted wherever mxoid asks for metrics
(:func:`create_metrics`):

- a name (``'acc'``, ``'mse'``, ``'ce'``...): a :class:`DeviceMetric`, the
  mean over every real sample (padding never counts), as NumPy computes it
  on the whole data set. MXNet's names not computed on the device (``'f1'``,
  ``'mcc'``...) fall back to MXNet's own metric on the host;
- an ``mx.metric.EvalMetric``: updated by MXNet on the host with the real
  rows of each batch, with MXNet's own semantics. It synchronizes every batch;
- a function ``f(label, pred) -> float`` of NumPy arrays: called once per
  batch on its real rows, weighted by their number. It synchronizes too.
"""

from __future__ import annotations

from .accumulator import MetricAccumulator, Reducer
from .combined import Accumulators
from .creation import Metric, MetricLike, create_metrics
from .device import DEVICE_METRIC_NAMES, DeviceMetric
from .head import per_row_head
from .host import HostMetric
from .naming import label_for_output, snake_case

__all__ = [
    "DEVICE_METRIC_NAMES",
    "DeviceMetric",
    "HostMetric",
    "Metric",
    "Accumulators",
    "MetricAccumulator",
    "MetricLike",
    "Reducer",
    "create_metrics",
    "label_for_output",
    "per_row_head",
    "snake_case",
]
