"""Metrics computed on the host: MXNet's EvalMetric objects and plain functions."""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Tuple, Union

import mxnet as mx
import numpy as np

from .naming import snake_case

__all__ = ["HostMetric"]


class HostMetric:
    """A metric computed on the host from the real rows of every batch (it synchronizes).

    Wraps an ``mx.metric.EvalMetric`` (updated by MXNet, with MXNet's
    semantics) or a function ``f(label, pred) -> float`` of NumPy arrays
    (called once per batch on its real rows, all devices together, and
    averaged over batches weighted by their real rows).

    Parameters
    ----------
    metric : mx.metric.EvalMetric or callable
    name : str, optional
        The metric part of record names; by default MXNet's metric name or
        the function's name (``'custom'`` for a lambda), in snake_case.
    """

    def __init__(
        self,
        metric: Union[mx.metric.EvalMetric, Callable[[np.ndarray, np.ndarray], float]],
        name: Optional[str] = None,
    ) -> None:
        if isinstance(metric, mx.metric.EvalMetric):
            default = metric.name
        elif callable(metric):
            default = getattr(metric, "__name__", "custom")
            default = "custom" if default.startswith("<") else default
        else:
            raise TypeError(
                f"a HostMetric wraps an mx.metric.EvalMetric or a function "
                f"f(label, pred) -> float, not {type(metric).__name__}"
            )
        self.metric = metric
        self.name = snake_case(name or default)
        self._total = 0.0
        self._count = 0.0

    def reset(self) -> None:
        """Forget every batch seen."""
        if isinstance(self.metric, mx.metric.EvalMetric):
            self.metric.reset()
        self._total = self._count = 0.0

    def update(self, labels: List[mx.nd.NDArray], preds: List[mx.nd.NDArray]) -> None:
        """Add a batch: the real rows of the label and the output on each device."""
        if isinstance(self.metric, mx.metric.EvalMetric):
            self.metric.update(labels, preds)
            return
        label = np.concatenate([array.asnumpy() for array in labels])
        pred = np.concatenate([array.asnumpy() for array in preds])
        self._total += float(self.metric(label, pred)) * len(label)
        self._count += len(label)

    def totals(self) -> Tuple[float, float]:
        """Return ``(sum, count)``.

        They are the EvalMetric's ``(sum_metric, num_inst)``, or the function's
        values times rows and the rows.
        """
        if isinstance(self.metric, mx.metric.EvalMetric):
            return float(self.metric.sum_metric), float(self.metric.num_inst)
        return self._total, self._count

    def restore_totals(self, total: float, count: float) -> None:
        """Set the running ``(sum, count)``, as :meth:`totals` returned them."""
        if isinstance(self.metric, mx.metric.EvalMetric):
            self.metric.sum_metric, self.metric.num_inst = total, count
        else:
            self._total, self._count = total, count

    def value(self, total: float, count: float) -> float:
        """Return ``total / count``, or MXNet's own value for EvalMetrics that are not a ratio.

        Perplexity is ``exp(total / count)`` (its sum is of log losses).
        PearsonCorrelation(average='micro') computes its value otherwise; its
        value is this metric's own (in distributed training, this worker's),
        whatever the totals.
        """
        metric = self.metric
        if isinstance(metric, mx.metric.Perplexity):
            return math.exp(total / count) if count > 0 else math.nan
        if (
            isinstance(metric, mx.metric.EvalMetric)
            and type(metric).get is not mx.metric.EvalMetric.get
        ):
            return float(metric.get()[1])
        return total / count if count > 0 else math.nan

    def __repr__(self) -> str:
        return f"<HostMetric {self.name!r}>"
