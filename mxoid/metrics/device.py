"""Metrics computed on the devices: per-row sums built from MXNet operators."""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Dict, Optional, Tuple, Union

import mxnet as mx
import numpy as np

from .naming import snake_case

__all__ = [
    "DEVICE_METRICS",
    "DEVICE_METRIC_NAMES",
    "TOP_K",
    "DeviceMetric",
    "PerRow",
    "token_cross_entropy",
    "token_perplexity",
    "top_k_accuracy",
]

Shape = Tuple[int, ...]
PerRow = Callable[
    [mx.sym.Symbol, mx.sym.Symbol, Shape, Shape], Tuple[mx.sym.Symbol, Union[int, mx.sym.Symbol]]
]
DEVICE_METRIC_NAMES = (
    "acc",
    "accuracy",
    "top_k_accuracy_<k>",
    "mse",
    "mae",
    "rmse",
    "loss",
    "ce",
    "cross-entropy",
    "nll_loss",
    "perplexity",
    "('perplexity' or 'ce', {'ignore_label': n})",
)
"""The metric names computed on the devices."""

_EPS = 1e-12  # MXNet's CrossEntropy and NegativeLogLikelihood add it before the log
TOP_K = re.compile(r"^top_k_acc(?:uracy)?_(\d+)$")


def _elements(shape: Shape) -> int:
    return int(np.prod(shape[1:], dtype=np.int64))


def _row_sums(values: mx.sym.Symbol, shape: Shape) -> mx.sym.Symbol:
    """Each row's sum of ``values`` (of ``shape``); one value per row is its own sum."""
    if len(shape) == 1:  # two operators fewer in the training graph, the common case
        return values
    return mx.sym.sum(mx.sym.reshape(values, shape=(0, -1)), axis=1)


def _shape_error(metric: str, pred_shape: Shape, label_shape: Shape, needs: str) -> ValueError:
    return ValueError(
        f"metric {metric!r} cannot compare an output of shape {pred_shape} with a "
        f"label of shape {label_shape} (per device): it needs {needs}"
    )


def _accuracy(
    pred: mx.sym.Symbol, label: mx.sym.Symbol, pred_shape: Shape, label_shape: Shape
) -> Tuple[mx.sym.Symbol, int]:
    if pred_shape != label_shape:
        if len(pred_shape) < 2 or label_shape != pred_shape[:1] + pred_shape[2:]:
            raise _shape_error(
                "accuracy",
                pred_shape,
                label_shape,
                "scores with classes on axis 1 and labels without that axis",
            )
        pred = mx.sym.argmax(pred, axis=1)
    hits = mx.sym.broadcast_equal(
        mx.sym.cast(pred, dtype="int32"), mx.sym.cast(label, dtype="int32")
    )
    return _row_sums(hits, label_shape), _elements(label_shape)


def _accuracy_float32(
    pred: mx.sym.Symbol, label: mx.sym.Symbol, pred_shape: Shape, label_shape: Shape
) -> Tuple[mx.sym.Symbol, int]:
    """:func:`_accuracy` with fewer operators, for a float32 output and label.

    ``argmax`` gives each row's index as a float32 integer, and ``fix`` truncates
    the label toward zero, as the int32 casts of MXNet's ``Accuracy`` (and of
    :func:`_accuracy`) do: the same hits, for every label (NaN, negative,
    fractional or out of range ones included), with one operator for the two
    casts, and float32 hits (which let the head cast all its values at once).
    """
    if pred_shape == label_shape:
        return _accuracy(pred, label, pred_shape, label_shape)
    if len(pred_shape) < 2 or label_shape != pred_shape[:1] + pred_shape[2:]:
        return _accuracy(pred, label, pred_shape, label_shape)  # the same error
    hits = mx.sym.broadcast_equal(mx.sym.argmax(pred, axis=1), mx.sym.fix(label))
    return _row_sums(hits, label_shape), _elements(label_shape)


def top_k_accuracy(k: int) -> PerRow:
    """Return the :data:`PerRow` function of metric ``top_k_accuracy_<k>``.

    A row counts 1 when its label is among its ``k`` best scores. The scores
    must have shape ``(rows, classes >= k)``, with one label per row (the
    function raises ``ValueError`` otherwise).
    """

    def per_row(
        pred: mx.sym.Symbol, label: mx.sym.Symbol, pred_shape: Shape, label_shape: Shape
    ) -> Tuple[mx.sym.Symbol, int]:
        if len(pred_shape) != 2 or _elements(label_shape) != 1 or pred_shape[1] < k:
            raise _shape_error(
                f"top_k_accuracy_{k}",
                pred_shape,
                label_shape,
                f"scores of shape (rows, classes >= {k}) and one label per row",
            )
        top = mx.sym.topk(pred, axis=1, k=k, ret_typ="indices")
        hits = mx.sym.broadcast_equal(
            mx.sym.cast(top, dtype="int32"),
            mx.sym.cast(mx.sym.reshape(label, shape=(-1, 1)), dtype="int32"),
        )
        return mx.sym.sum(hits, axis=1), 1

    return per_row


def _difference(
    metric: str, pred: mx.sym.Symbol, label: mx.sym.Symbol, pred_shape: Shape, label_shape: Shape
) -> mx.sym.Symbol:
    if _elements(pred_shape) != _elements(label_shape):
        raise _shape_error(
            metric, pred_shape, label_shape, "as many values per row in the output as in the label"
        )
    return mx.sym.reshape(label, shape=(0, -1)) - mx.sym.reshape(pred, shape=(0, -1))


def _squared_error(
    pred: mx.sym.Symbol, label: mx.sym.Symbol, pred_shape: Shape, label_shape: Shape
) -> Tuple[mx.sym.Symbol, int]:
    diff = _difference("mse", pred, label, pred_shape, label_shape)
    return mx.sym.sum(mx.sym.square(diff), axis=1), _elements(label_shape)


def _absolute_error(
    pred: mx.sym.Symbol, label: mx.sym.Symbol, pred_shape: Shape, label_shape: Shape
) -> Tuple[mx.sym.Symbol, int]:
    diff = _difference("mae", pred, label, pred_shape, label_shape)
    return mx.sym.sum(mx.sym.abs(diff), axis=1), _elements(label_shape)


def _mean_value(
    pred: mx.sym.Symbol, label: mx.sym.Symbol, pred_shape: Shape, label_shape: Shape
) -> Tuple[mx.sym.Symbol, int]:
    """MXNet's ``Loss``: the mean of the output's values (a loss's); the label is not read.

    Per row where the output has a row per label's (a Gluon loss's); else (a loss already
    averaged, of shape ``(1,)``) a ``ValueError``: MXNet's ``Loss`` on the host takes it.
    """
    if not pred_shape or not label_shape or pred_shape[0] != label_shape[0]:
        raise _shape_error("loss", pred_shape, label_shape, "one value (or row) per row")
    return _row_sums(pred, pred_shape), _elements(pred_shape)


def _negative_log_likelihood(
    pred: mx.sym.Symbol, label: mx.sym.Symbol, pred_shape: Shape, label_shape: Shape
) -> Tuple[mx.sym.Symbol, Any]:
    tokens = int(np.prod(label_shape, dtype=np.int64))
    if len(pred_shape) == 2 and _elements(label_shape) > 1 and pred_shape[0] == tokens:
        # MXNet's CrossEntropy ravels the label: one class per row of scores (a token's).
        return token_cross_entropy()(pred, label, pred_shape, label_shape)
    if len(pred_shape) != 2 or _elements(label_shape) != 1:
        raise _shape_error(
            "cross_entropy",
            pred_shape,
            label_shape,
            "probabilities of shape (rows, classes) and one class index per row (or per token, "
            "as MXNet's CrossEntropy ravels the label: (rows, time) against (rows * time, "
            "classes))",
        )
    if len(label_shape) != 1:  # one label per row, e.g. (rows, 1): as a vector
        label = mx.sym.reshape(label, shape=(-1,))
    prob = mx.sym.pick(pred, label, axis=1)
    return -mx.sym.log(prob + _EPS), 1


def _token_losses(
    metric: str, ignore_label: Optional[float], clip: Callable[[mx.sym.Symbol], mx.sym.Symbol]
) -> PerRow:
    """Return the per-row function of ``-log(clip(p))`` summed over a row's tokens, with counts.

    ``pred`` holds one row of class scores per token, ``(tokens, classes)``;
    ``label`` one class per token, in rows of a sample each (``(rows, time)``,
    batch-major, or ``(tokens,)``). Tokens whose label is ``ignore_label`` count
    for nothing, as MXNet's ``Perplexity(ignore_label)`` leaves them out.
    """

    def per_row(
        pred: mx.sym.Symbol, label: mx.sym.Symbol, pred_shape: Shape, label_shape: Shape
    ) -> Tuple[mx.sym.Symbol, mx.sym.Symbol]:
        tokens = int(np.prod(label_shape, dtype=np.int64))
        if len(pred_shape) != 2 or pred_shape[0] != tokens:
            raise _shape_error(
                metric,
                pred_shape,
                label_shape,
                "scores of shape (tokens, classes) and one class per token",
            )
        flat = mx.sym.reshape(label, shape=(-1,))
        losses = -mx.sym.log(clip(mx.sym.pick(pred, flat, axis=1)))
        if ignore_label is None:
            counts = mx.sym.ones_like(losses)
        else:
            counts = flat != float(ignore_label)
            losses = losses * counts
        rows = label_shape[0]
        return tuple(  # type: ignore[return-value]
            mx.sym.sum(mx.sym.reshape(values, shape=(rows, -1)), axis=1)
            for values in (losses, counts)
        )

    return per_row


def token_perplexity(ignore_label: Optional[float] = None) -> PerRow:
    """Return the per-row function of ``perplexity``, as MXNet's (``log(max(p, 1e-10))``)."""
    return _token_losses("perplexity", ignore_label, lambda p: mx.sym.maximum(p, 1e-10))


def token_cross_entropy(ignore_label: Optional[float] = None) -> PerRow:
    """Return the per-row function of ``cross_entropy`` over tokens (``log(p + 1e-12)``)."""
    return _token_losses("cross_entropy", ignore_label, lambda p: p + _EPS)


class DeviceMetric:
    """A metric computed on the devices: the mean (or its root) of a per-sample value.

    Parameters
    ----------
    name : str
        The metric part of record names, in snake_case (``'accuracy'``).
    per_row : callable
        ``per_row(pred, label, pred_shape, label_shape) -> (sums, elements)``:
        builds, from the symbols of one device's output and label, the sum of
        the per-element values of each row (a symbol of shape ``(rows,)``),
        and returns it with the number of elements a row counts for (an int,
        or a symbol of each row's count: an ignored label counts for nothing).
        Raises ``ValueError`` for shapes it cannot compare.
    root : bool, default False
        Report the square root of the mean (RMSE).
    exponent : bool, default False
        Report the exponential of the mean (perplexity).
    float32_per_row : callable, optional
        The same values with fewer operators, valid when the output and the
        label are both float32 (what :func:`~mxoid.metrics.head.per_row_head`
        builds into a graph where it can tell they are).
    host : callable, optional
        Returns the same metric computed on the host, for outputs that
        ``per_row`` refuses (``'loss'`` of a loss already averaged).
    native : str, optional
        The column of mxoid's fused operator (:mod:`mxoid.metrics.native`)
        that computes the same values, bit for bit, in one operator
        (``'accuracy'`` or ``'cross_entropy'``); for mxoid's own metrics.

    Examples
    --------
    >>> def squared_log_error(pred, label, pred_shape, label_shape):
    ...     diff = mx.sym.log1p(pred) - mx.sym.log1p(mx.sym.reshape(label, shape=pred_shape))
    ...     return mx.sym.sum(mx.sym.square(diff), axis=1), pred_shape[1]
    >>> msle = DeviceMetric("msle", squared_log_error)  # e.g. Evaluate(..., {"reg": msle})
    >>> msle.name
    'msle'
    """

    def __init__(
        self,
        name: str,
        per_row: PerRow,
        *,
        root: bool = False,
        exponent: bool = False,
        float32_per_row: Optional[PerRow] = None,
        native: Optional[str] = None,
        host: Optional[Callable[[], Any]] = None,
    ) -> None:
        self.name = snake_case(name)
        self.host = host
        self.per_row = per_row
        self.root = root
        self.exponent = exponent
        self.float32_per_row = float32_per_row
        self.native = native

    def value(self, total: float, count: float) -> float:
        """Return the metric from the sum of per-element values and their count."""
        if count <= 0:
            return math.nan
        mean = total / count
        if self.exponent:
            return math.exp(mean)
        return math.sqrt(mean) if self.root else mean

    def __repr__(self) -> str:
        return f"<DeviceMetric {self.name!r}>"


DEVICE_METRICS: Dict[str, Callable[[], DeviceMetric]] = {
    "accuracy": lambda: DeviceMetric(
        "accuracy", _accuracy, float32_per_row=_accuracy_float32, native="accuracy"
    ),
    "mse": lambda: DeviceMetric("mse", _squared_error),
    "mae": lambda: DeviceMetric("mae", _absolute_error),
    "rmse": lambda: DeviceMetric("rmse", _squared_error, root=True),
    "loss": lambda: DeviceMetric("loss", _mean_value, host=mx.metric.Loss),
    "cross_entropy": lambda: DeviceMetric(
        "cross_entropy", _negative_log_likelihood, native="cross_entropy"
    ),
    "nll_loss": lambda: DeviceMetric("nll_loss", _negative_log_likelihood, native="cross_entropy"),
    "perplexity": lambda: DeviceMetric("perplexity", token_perplexity(), exponent=True),
}
