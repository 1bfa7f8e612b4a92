"""Turning what users pass as metrics (names, objects, functions) into metrics."""

from __future__ import annotations

from typing import Any, Callable, List, Mapping, Optional, Sequence, Union

import mxnet as mx
import numpy as np

from .device import (
    DEVICE_METRIC_NAMES,
    DEVICE_METRICS,
    TOP_K,
    DeviceMetric,
    token_cross_entropy,
    token_perplexity,
    top_k_accuracy,
)
from .host import HostMetric
from .naming import snake_case

__all__ = ["Metric", "MetricLike", "create_metrics"]

MetricLike = Union[
    str,
    mx.metric.EvalMetric,
    Callable[[np.ndarray, np.ndarray], float],
    "DeviceMetric",
    "HostMetric",
]
Metric = Union[DeviceMetric, HostMetric]
UNKNOWN_METRIC = (
    "unknown metric {name!r}: the names computed on the devices are {device}; other names must "
    "be MXNet metrics that mx.metric.create(name) can build. Pass an mx.metric.EvalMetric object "
    "or a function f(label, pred) -> float for anything else"
)
_ALIASES = {"acc": "accuracy", "ce": "cross_entropy"}


def _create_named(name: str, arguments: Optional[Mapping[str, Any]] = None) -> List[Metric]:
    arguments = dict(arguments or {})
    key = snake_case(name)
    key = _ALIASES.get(key, key)
    if key in ("top_k_accuracy", "top_k_acc") and set(arguments) <= {"top_k"}:
        key = f"top_k_accuracy_{arguments.pop('top_k', 1)}"
    if key in ("perplexity", "cross_entropy") and set(arguments) == {"ignore_label"}:
        return [_ignoring(key, arguments["ignore_label"])]
    if not arguments:
        if key in DEVICE_METRICS:
            return [DEVICE_METRICS[key]()]
        top_k = TOP_K.match(key)
        if top_k:
            k = int(top_k.group(1))
            return [DeviceMetric(f"top_k_accuracy_{k}", top_k_accuracy(k))]
    try:
        created = mx.metric.create(name, **arguments)
    except Exception as error:  # MXNet raises AssertionError, TypeError... for what it cannot build
        if arguments:
            raise ValueError(
                f"mx.metric.create({name!r}, **{arguments!r}) fails: {error}"
            ) from None
        raise ValueError(
            UNKNOWN_METRIC.format(name=name, device=list(DEVICE_METRIC_NAMES))
        ) from None
    return _create_one(created)


def _ignoring(key: str, ignore_label: Optional[float]) -> DeviceMetric:
    """Perplexity or cross-entropy over tokens, leaving out those labelled ``ignore_label``."""
    if key == "perplexity":
        return DeviceMetric("perplexity", token_perplexity(ignore_label), exponent=True)
    return DeviceMetric("cross_entropy", token_cross_entropy(ignore_label))


def _is_named_with_arguments(metric: Any) -> bool:
    return (
        isinstance(metric, tuple)
        and len(metric) == 2
        and isinstance(metric[0], str)
        and isinstance(metric[1], Mapping)
    )


def _create_one(metric: MetricLike) -> List[Metric]:
    if isinstance(metric, (DeviceMetric, HostMetric)):
        return [metric]
    if isinstance(metric, str):
        return _create_named(metric)
    if _is_named_with_arguments(metric):
        return _create_named(*metric)
    if isinstance(metric, mx.metric.CompositeEvalMetric):
        return [HostMetric(child) for child in metric.metrics]
    if type(metric) is mx.metric.Perplexity and metric.axis in (-1, 1):
        return [_ignoring("perplexity", metric.ignore_label)]  # the same, on the devices
    if isinstance(metric, mx.metric.EvalMetric) or callable(metric):
        return [HostMetric(metric)]
    raise TypeError(
        f"a metric is a name such as 'acc', an mx.metric.EvalMetric or a function "
        f"f(label, pred) -> float; got {type(metric).__name__} ({metric!r})"
    )


def create_metrics(metrics: Union[MetricLike, Sequence[MetricLike]]) -> List[Metric]:
    """Return the metrics described by a name, object or function, or a list of them.

    Names of :data:`DEVICE_METRIC_NAMES` become :class:`DeviceMetric`
    (``'top_k_accuracy_5'`` counts the label among the 5 best scores);
    other MXNet names, EvalMetric objects and functions become
    :class:`HostMetric`. A ``CompositeEvalMetric`` gives one metric per child.
    A pair ``(name, {keyword: value})`` is a name with the keywords
    ``mx.metric.create`` takes: ``('top_k_accuracy', {'top_k': 5})`` is
    computed on the devices (as ``'top_k_accuracy_5'``), others
    (``('f1', {'average': 'micro'})``) become host metrics.

    Raises
    ------
    ValueError
        For a name that is neither computed on the devices nor known to MXNet.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxoid.metrics import create_metrics
    >>> [m.name for m in create_metrics(["acc", "ce", mx.metric.F1()])]
    ['accuracy', 'cross_entropy', 'f1']
    >>> [m.name for m in create_metrics([("top_k_accuracy", {"top_k": 5}), "mse"])]
    ['top_k_accuracy_5', 'mse']
    """
    if isinstance(metrics, (list, tuple)) and not _is_named_with_arguments(metrics):
        return [created for metric in metrics for created in _create_one(metric)]
    return _create_one(metrics)
