"""Metrics accumulated on the devices, read to the host only when asked.

MXNet's ``EvalMetric.update`` copies every batch to the host (``asnumpy``),
which stalls the asynchronous engine once per batch. The metrics here keep
running sums on each device instead, updated by one cached operator call per
device and batch, and are read only when a value is wanted.

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

import copy
import math
import re
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple, Union

import mxnet as mx
import numpy as np

from .errors import clean_mxnet_message
from .executor_manager import output_short_name

if TYPE_CHECKING:  # pragma: no cover
    from .executor_manager import DataParallelExecutorManager

__all__ = ["DEVICE_METRIC_NAMES", "DeviceMetric", "HostMetric", "Metric", "MetricAccumulator",
           "MetricLike", "Reducer", "create_metrics", "label_for_output", "snake_case"]

MetricLike = Union[str, mx.metric.EvalMetric, Callable[[np.ndarray, np.ndarray], float],
                   "DeviceMetric", "HostMetric"]
Reducer = Callable[[np.ndarray], np.ndarray]
"""Maps the ``(metrics, 2)`` array of ``(sum, count)`` rows to the same, e.g. summed over workers."""

Shape = Tuple[int, ...]
PerRow = Callable[[mx.sym.Symbol, mx.sym.Symbol, Shape, Shape], Tuple[mx.sym.Symbol, int]]

DEVICE_METRIC_NAMES = ("acc", "accuracy", "top_k_accuracy_<k>", "mse", "mae", "rmse", "ce",
                       "cross-entropy", "nll_loss")
"""The metric names computed on the devices."""

_EPS = 1e-12  # MXNet's CrossEntropy and NegativeLogLikelihood add it before the log
_TOP_K = re.compile(r"^top_k_acc(?:uracy)?_(\d+)$")
_CACHED_OP_FLAGS = [("static_alloc", True), ("static_shape", True)]

UNKNOWN_METRIC = (
    "unknown metric {name!r}: the names computed on the devices are {device}; other names must "
    "be MXNet metrics that mx.metric.create(name) can build. Pass an mx.metric.EvalMetric object "
    "or a function f(label, pred) -> float for anything else")
NO_LABEL = (
    "no label for output {output!r}: a metric on it reads the label named {wanted!r} (or the "
    "only label, when the symbol has one output), but the data provides {labels}; name the "
    "iterator's label {wanted!r}, e.g. NDArrayIter(X, {{{wanted!r}: y}})")


def snake_case(name: str) -> str:
    """Return a metric name as used in log records: ``'cross-entropy'`` -> ``'cross_entropy'``."""
    return re.sub(r"[^0-9a-z_]+", "_", name.lower()).strip("_") or "metric"


def label_for_output(output: str, output_names: Sequence[str], label_names: Sequence[str]) -> str:
    """Return the label a metric on ``output`` compares with.

    The label of output ``'softmax'`` is ``'softmax_label'``; a symbol with
    one output and one label uses that label whatever its name.

    Raises
    ------
    ValueError
        If no label fits.
    """
    wanted = f"{output}_label"
    if wanted in label_names:
        return wanted
    if len(output_names) == 1 and len(label_names) == 1:
        return label_names[0]
    raise ValueError(NO_LABEL.format(output=output, wanted=wanted, labels=list(label_names)))


# ------------------------------------------------------------------ kernels
def _elements(shape: Shape) -> int:
    return int(np.prod(shape[1:], dtype=np.int64))


def _row_sums(values: mx.sym.Symbol) -> mx.sym.Symbol:
    return mx.sym.sum(mx.sym.reshape(values, shape=(0, -1)), axis=1)


def _shape_error(metric: str, pred_shape: Shape, label_shape: Shape, needs: str) -> ValueError:
    return ValueError(f"metric {metric!r} cannot compare an output of shape {pred_shape} with a "
                      f"label of shape {label_shape} (per device): it needs {needs}")


def _accuracy(pred: mx.sym.Symbol, label: mx.sym.Symbol, pred_shape: Shape,
              label_shape: Shape) -> Tuple[mx.sym.Symbol, int]:
    if pred_shape != label_shape:
        if len(pred_shape) < 2 or label_shape != pred_shape[:1] + pred_shape[2:]:
            raise _shape_error("accuracy", pred_shape, label_shape,
                               "scores with classes on axis 1 and labels without that axis")
        pred = mx.sym.argmax(pred, axis=1)
    hits = mx.sym.broadcast_equal(mx.sym.cast(pred, dtype="int32"), mx.sym.cast(label, dtype="int32"))
    return _row_sums(hits), _elements(label_shape)


def _top_k_accuracy(k: int) -> PerRow:
    def per_row(pred: mx.sym.Symbol, label: mx.sym.Symbol, pred_shape: Shape,
                label_shape: Shape) -> Tuple[mx.sym.Symbol, int]:
        if len(pred_shape) != 2 or _elements(label_shape) != 1 or pred_shape[1] < k:
            raise _shape_error(f"top_k_accuracy_{k}", pred_shape, label_shape,
                               f"scores of shape (rows, classes >= {k}) and one label per row")
        top = mx.sym.topk(pred, axis=1, k=k, ret_typ="indices")
        hits = mx.sym.broadcast_equal(mx.sym.cast(top, dtype="int32"),
                                      mx.sym.cast(mx.sym.reshape(label, shape=(-1, 1)), dtype="int32"))
        return mx.sym.sum(hits, axis=1), 1
    return per_row


def _difference(metric: str, pred: mx.sym.Symbol, label: mx.sym.Symbol, pred_shape: Shape,
                label_shape: Shape) -> mx.sym.Symbol:
    if _elements(pred_shape) != _elements(label_shape):
        raise _shape_error(metric, pred_shape, label_shape,
                           "as many values per row in the output as in the label")
    return mx.sym.reshape(label, shape=(0, -1)) - mx.sym.reshape(pred, shape=(0, -1))


def _squared_error(pred: mx.sym.Symbol, label: mx.sym.Symbol, pred_shape: Shape,
                   label_shape: Shape) -> Tuple[mx.sym.Symbol, int]:
    diff = _difference("mse", pred, label, pred_shape, label_shape)
    return mx.sym.sum(mx.sym.square(diff), axis=1), _elements(label_shape)


def _absolute_error(pred: mx.sym.Symbol, label: mx.sym.Symbol, pred_shape: Shape,
                    label_shape: Shape) -> Tuple[mx.sym.Symbol, int]:
    diff = _difference("mae", pred, label, pred_shape, label_shape)
    return mx.sym.sum(mx.sym.abs(diff), axis=1), _elements(label_shape)


def _negative_log_likelihood(pred: mx.sym.Symbol, label: mx.sym.Symbol, pred_shape: Shape,
                             label_shape: Shape) -> Tuple[mx.sym.Symbol, int]:
    if len(pred_shape) != 2 or _elements(label_shape) != 1:
        raise _shape_error("cross_entropy", pred_shape, label_shape,
                           "probabilities of shape (rows, classes) and one class index per row")
    prob = mx.sym.pick(pred, mx.sym.reshape(label, shape=(-1,)), axis=1)
    return -mx.sym.log(prob + _EPS), 1


# ------------------------------------------------------------------ metrics
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
        and returns it with the number of elements a row counts for. Raises
        ``ValueError`` for shapes it cannot compare.
    root : bool, default False
        Report the square root of the mean (RMSE).

    Examples
    --------
    >>> def squared_log_error(pred, label, pred_shape, label_shape):
    ...     diff = mx.sym.log1p(pred) - mx.sym.log1p(mx.sym.reshape(label, shape=pred_shape))
    ...     return mx.sym.sum(mx.sym.square(diff), axis=1), pred_shape[1]
    >>> Evaluate({"valid": valid_iter}, {"reg": DeviceMetric("msle", squared_log_error)})
    """

    def __init__(self, name: str, per_row: PerRow, *, root: bool = False) -> None:
        self.name = snake_case(name)
        self.per_row = per_row
        self.root = root

    def value(self, total: float, count: float) -> float:
        """Return the metric from the sum of per-element values and their count."""
        if count <= 0:
            return math.nan
        mean = total / count
        return math.sqrt(mean) if self.root else mean

    def __repr__(self) -> str:
        return f"<DeviceMetric {self.name!r}>"


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

    def __init__(self, metric: Union[mx.metric.EvalMetric, Callable[[np.ndarray, np.ndarray], float]],
                 name: Optional[str] = None) -> None:
        if isinstance(metric, mx.metric.EvalMetric):
            default = metric.name
        elif callable(metric):
            default = getattr(metric, "__name__", "custom")
            default = "custom" if default.startswith("<") else default
        else:
            raise TypeError(f"a HostMetric wraps an mx.metric.EvalMetric or a function "
                            f"f(label, pred) -> float, not {type(metric).__name__}")
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
        """Return ``(sum, count)``: the EvalMetric's ``(sum_metric, num_inst)``, or the
        function's values times rows and the rows."""
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

        Perplexity and PearsonCorrelation(average='micro') compute their value
        otherwise; their value is this worker's, whatever the totals.
        """
        metric = self.metric
        if isinstance(metric, mx.metric.EvalMetric) and type(metric).get is not mx.metric.EvalMetric.get:
            return float(metric.get()[1])
        return total / count if count > 0 else math.nan

    def __repr__(self) -> str:
        return f"<HostMetric {self.name!r}>"


Metric = Union[DeviceMetric, HostMetric]

_DEVICE_METRICS: Dict[str, Callable[[], DeviceMetric]] = {
    "accuracy": lambda: DeviceMetric("accuracy", _accuracy),
    "mse": lambda: DeviceMetric("mse", _squared_error),
    "mae": lambda: DeviceMetric("mae", _absolute_error),
    "rmse": lambda: DeviceMetric("rmse", _squared_error, root=True),
    "cross_entropy": lambda: DeviceMetric("cross_entropy", _negative_log_likelihood),
    "nll_loss": lambda: DeviceMetric("nll_loss", _negative_log_likelihood),
}
_ALIASES = {"acc": "accuracy", "ce": "cross_entropy"}


def _create_named(name: str) -> List[Metric]:
    key = snake_case(name)
    key = _ALIASES.get(key, key)
    if key in _DEVICE_METRICS:
        return [_DEVICE_METRICS[key]()]
    top_k = _TOP_K.match(key)
    if top_k:
        k = int(top_k.group(1))
        return [DeviceMetric(f"top_k_accuracy_{k}", _top_k_accuracy(k))]
    try:
        created = mx.metric.create(name)
    except Exception:  # MXNet raises AssertionError, TypeError... for names it cannot build
        raise ValueError(UNKNOWN_METRIC.format(name=name, device=list(DEVICE_METRIC_NAMES))) from None
    return _create_one(created)


def _create_one(metric: MetricLike) -> List[Metric]:
    if isinstance(metric, (DeviceMetric, HostMetric)):
        return [metric]
    if isinstance(metric, str):
        return _create_named(metric)
    if isinstance(metric, mx.metric.CompositeEvalMetric):
        return [HostMetric(child) for child in metric.metrics]
    if isinstance(metric, mx.metric.EvalMetric) or callable(metric):
        return [HostMetric(metric)]
    raise TypeError(f"a metric is a name such as 'acc', an mx.metric.EvalMetric or a function "
                    f"f(label, pred) -> float; got {type(metric).__name__} ({metric!r})")


def create_metrics(metrics: Union[MetricLike, Sequence[MetricLike]]) -> List[Metric]:
    """Return the metrics described by a name, object or function, or a list of them.

    Names of :data:`DEVICE_METRIC_NAMES` become :class:`DeviceMetric`
    (``'top_k_accuracy_5'`` counts the label among the 5 best scores);
    other MXNet names, EvalMetric objects and functions become
    :class:`HostMetric`. A ``CompositeEvalMetric`` gives one metric per child.

    Raises
    ------
    ValueError
        For a name that is neither computed on the devices nor known to MXNet.

    Examples
    --------
    >>> [m.name for m in create_metrics(["acc", "ce", mx.metric.F1()])]
    ['accuracy', 'cross_entropy', 'f1']
    """
    if isinstance(metrics, (list, tuple)):
        return [created for metric in metrics for created in _create_one(metric)]
    return _create_one(metrics)


# -------------------------------------------------------------- accumulator
class MetricAccumulator:
    """Running sums of metrics over the batches run through one executor manager.

    Call :meth:`update` after each forward pass of ``manager``: it adds the
    batch's real rows (the first ``manager.valid_rows[k]`` rows of device
    ``k``) to per-device sums, with one cached operator call per device and
    no host synchronization for :class:`DeviceMetric` (the operator graphs
    and every array are made here, once). :meth:`values` reads the sums.

    Parameters
    ----------
    manager : DataParallelExecutorManager
        Bound for the batches to come (its ``outputs`` and ``labels``).
    metrics : sequence of (str, Metric)
        Output name (without ``_output``) and metric on it.

    Attributes
    ----------
    rows : int
        Real rows added since the last :meth:`reset`.

    Examples
    --------
    >>> accumulator = MetricAccumulator(manager, [("softmax", m) for m in create_metrics("acc")])
    >>> for batch in it:
    ...     manager.load_data_batch(batch); manager.forward(); accumulator.update()
    >>> accumulator.values()
    [0.93]
    """

    def __init__(self, manager: "DataParallelExecutorManager",
                 metrics: Sequence[Tuple[str, Metric]]) -> None:
        self.manager = manager
        self.metrics: List[Metric] = []
        self.rows = 0
        device_entries, self._host = [], []
        for output, metric in metrics:
            output = output_short_name(output)
            if output not in manager.outputs:
                raise ValueError(f"no output named {output!r}; the symbol's outputs are "
                                 f"{manager.output_names}")
            label = label_for_output(output, manager.output_names, manager.label_names)
            if isinstance(metric, HostMetric):
                metric = copy.deepcopy(metric)  # each accumulator keeps its own state
                self._host.append((metric, manager.outputs[output], manager.labels[label]))
            else:
                device_entries.append((len(self.metrics), metric, output, label))
            self.metrics.append(metric)
        self._device_index = [entry[0] for entry in device_entries]
        self._elements = np.zeros(len(self.metrics))
        self._calls: List[List[tuple]] = [[], []]
        self._sums: List[List[List[mx.nd.NDArray]]] = [[], []]
        self._mask_position = 0
        self._masks: Dict[Tuple[int, ...], List[mx.nd.NDArray]] = {}
        if device_entries:
            self._bind_devices(device_entries)
        self._parity = 0

    def _bind_devices(self, entries: List[Tuple[int, DeviceMetric, str, str]]) -> None:
        manager = self.manager
        outputs = sorted({output for _, _, output, _ in entries})
        labels = sorted({label for _, _, _, label in entries})
        for device, ctx in enumerate(manager.contexts):
            pred_shapes = {o: tuple(manager.outputs[o][device].shape) for o in outputs}
            label_shapes = {n: tuple(manager.labels[n][device].shape) for n in labels}
            symbols = {f"pred{i}": mx.sym.var(f"pred{i}") for i in range(len(outputs))}
            symbols.update({f"label{i}": mx.sym.var(f"label{i}") for i in range(len(labels))})
            mask = mx.sym.var("mask")
            new_sums = []
            for position, (index, metric, output, label) in enumerate(entries):
                pred = symbols[f"pred{outputs.index(output)}"]
                label_symbol = symbols[f"label{labels.index(label)}"]
                sums, elements = metric.per_row(pred, label_symbol, pred_shapes[output],
                                                label_shapes[label])
                self._elements[index] = elements
                sums = mx.sym.cast(sums, dtype="float64")
                new_sums.append(mx.sym.var(f"sum{position}")
                                + mx.sym.where(mask, sums, mx.sym.zeros_like(sums)))
            graph = mx.sym.Group(new_sums)
            rows = manager.slices[device].stop - manager.slices[device].start
            inputs = {f"pred{i}": manager.outputs[o][device] for i, o in enumerate(outputs)}
            inputs.update({f"label{i}": manager.labels[n][device] for i, n in enumerate(labels)})
            inputs["mask"] = mx.nd.ones((rows,), ctx=ctx, dtype="float64")
            self._check_graph(graph, inputs, rows, [m for _, m, _, _ in entries])
            names = graph.list_arguments()
            self._mask_position = names.index("mask")
            operator = mx.nd.CachedOp(graph, flags=_CACHED_OP_FLAGS)
            sums = [[mx.nd.zeros((rows,), ctx=ctx, dtype="float64") for _ in entries] for _ in range(2)]
            for parity in (0, 1):
                inputs.update({f"sum{p}": array for p, array in enumerate(sums[parity])})
                self._calls[parity].append((operator, [inputs[n] for n in names], sums[1 - parity]))
                self._sums[parity].append(sums[parity])

    @staticmethod
    def _check_graph(graph: mx.sym.Symbol, inputs: Dict[str, mx.nd.NDArray], rows: int,
                     metrics: List[DeviceMetric]) -> None:
        shapes = {name: array.shape for name, array in inputs.items()}
        shapes.update({f"sum{p}": (rows,) for p in range(len(metrics))})
        try:
            _, out_shapes, _ = graph.infer_shape(**shapes)
        except mx.base.MXNetError as error:
            raise ValueError(f"the metrics {[m.name for m in metrics]} do not fit the outputs and "
                             f"labels of shapes {shapes}: {clean_mxnet_message(error)}") from None
        for metric, shape in zip(metrics, out_shapes):
            if tuple(shape) != (rows,):
                raise ValueError(f"metric {metric.name!r} gives per-row sums of shape "
                                 f"{tuple(shape)}; they must have shape ({rows},)")

    # ------------------------------------------------------------- batches
    def update(self) -> None:
        """Add the batch just run forward (its real rows only)."""
        manager = self.manager
        pad = manager.pad
        calls = self._calls[self._parity]
        if pad:
            masks = self._masks_for(manager.valid_rows)
            position = self._mask_position
            for (operator, args, out), mask in zip(calls, masks):
                args = list(args)
                args[position] = mask
                operator(*args, out=out)
        else:
            for operator, args, out in calls:
                operator(*args, out=out)
        if calls:
            self._parity = 1 - self._parity
        if self._host:
            self._update_host(manager.valid_rows)
        self.rows += manager.batch_size - pad

    def _masks_for(self, valid_rows: Sequence[int]) -> List[mx.nd.NDArray]:
        key = tuple(valid_rows)
        masks = self._masks.get(key)
        if masks is None:
            masks = []
            for valid, slc, ctx in zip(valid_rows, self.manager.slices, self.manager.contexts):
                flags = (np.arange(slc.stop - slc.start) < valid).astype("float64")
                masks.append(mx.nd.array(flags, ctx=ctx, dtype="float64"))
            self._masks[key] = masks
        return masks

    def _update_host(self, valid_rows: Sequence[int]) -> None:
        for metric, preds, labels in self._host:
            metric.update([label[:valid] for label, valid in zip(labels, valid_rows) if valid],
                          [pred[:valid] for pred, valid in zip(preds, valid_rows) if valid])

    def reset(self) -> None:
        """Forget every batch added."""
        for device_sums in self._sums[self._parity]:
            for array in device_sums:
                array[:] = 0
        for metric, _, _ in self._host:
            metric.reset()
        self.rows = 0

    # --------------------------------------------------------------- state
    def state_dict(self) -> Dict[str, object]:
        """Return the running sums as plain data (it reads the devices), for a checkpoint.

        The per-row sums are kept as they are on each device, so a resumed
        run adds the next batches to exactly the same numbers.
        """
        device_sums = [[array.asnumpy().tolist() for array in sums]
                       for sums in self._sums[self._parity]]
        host = [list(metric.totals()) for metric, _, _ in self._host]
        return {"rows": self.rows, "device_sums": device_sums, "host": host}

    def load_state_dict(self, state: Dict[str, object]) -> None:
        """Restore the running sums of :meth:`state_dict`."""
        self.rows = int(state["rows"])
        for sums, saved in zip(self._sums[self._parity], state["device_sums"]):
            for array, values in zip(sums, saved):
                array[:] = np.asarray(values, dtype="float64")
        for (metric, _, _), (total, count) in zip(self._host, state["host"]):
            metric.restore_totals(total, count)

    # -------------------------------------------------------------- values
    def totals(self) -> np.ndarray:
        """Return the ``(len(metrics), 2)`` array of ``(sum, count)`` per metric, on the host.

        This reads the devices (it waits for the batches added). Sums and
        counts add up across workers, so a distributed run can sum them
        before :meth:`values` divides.
        """
        totals = np.zeros((len(self.metrics), 2))
        totals[:, 1] = self.rows * self._elements
        device_sums = self._sums[self._parity]
        for position, index in enumerate(self._device_index):
            totals[index, 0] = sum(float(sums[position].asnumpy().sum()) for sums in device_sums)
        for index, metric in enumerate(self.metrics):
            if isinstance(metric, HostMetric):
                totals[index] = metric.totals()
        return totals

    def values(self, reduce: Optional[Reducer] = None) -> List[float]:
        """Return the value of each metric over the batches added since :meth:`reset`.

        Parameters
        ----------
        reduce : callable, optional
            Applied to :meth:`totals` before the division, e.g. a sum over
            workers in distributed training.
        """
        totals = self.totals()
        if reduce is not None:
            totals = np.asarray(reduce(totals), dtype=np.float64)
        return [metric.value(float(total), float(count))
                for metric, (total, count) in zip(self.metrics, totals)]
