"""Monitoring: metrics of named outputs on evaluation iterators and on the training batches."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import mxnet as mx

from ..executor_manager import (
    RUNNING_SUMS_PREFIX,
    forward_work_load,
    output_short_name,
    split_batch,
)
from ..metrics import (
    Metric,
    MetricAccumulator,
    MetricLike,
    Reducer,
    create_metrics,
    label_for_output,
    per_row_head,
)
from ..metrics.head import dtypes_of
from ..pacing import Pacer
from .base import FIRING_KEYWORDS, Extension

if TYPE_CHECKING:  # pragma: no cover
    from ..main_loop import MainLoop

__all__ = ["Evaluate", "MetricsSpec", "TrainingMonitoring", "private_heads"]

MetricsSpec = Union[
    MetricLike, Sequence[MetricLike], Mapping[str, Union[MetricLike, Sequence[MetricLike]]]
]
"""Metrics by output name (``{'softmax': 'acc', 'reg': ['mse', 'mae']}``), or, for a
symbol with one output, one metric or a list of them."""

NO_OUTPUT_NAMES = (
    "metrics are given without output names, but the symbol has {count} outputs {outputs}; "
    "map each output to its metrics, e.g. metrics={{{example!r}: 'acc'}}"
)
UNKNOWN_OUTPUT = (
    "no output named {name!r}; the symbol's outputs are {outputs} (with or without the "
    "'_output' suffix)"
)
NOT_BOUND = (
    "{name} is not attached to a MainLoop yet: pass it in MainLoop(..., extensions=[...]) "
    "(or call its attach(loop))"
)


def _parse_metrics(metrics: MetricsSpec) -> Tuple[bool, List[Tuple[Optional[str], List[Metric]]]]:
    """Create the metrics now (so that unknown names fail at once); outputs are checked later."""
    if isinstance(metrics, Mapping):
        if not metrics:
            raise ValueError("metrics is empty; name at least one, e.g. {'softmax': 'acc'}")
        parsed = []
        for output, spec in metrics.items():
            if not isinstance(output, str):
                raise TypeError(f"metrics maps output names to metrics; got the key {output!r}")
            parsed.append((output, create_metrics(spec)))
        return True, parsed
    created = create_metrics(metrics)
    if not created:
        raise ValueError("metrics is empty; name at least one, e.g. 'acc'")
    return False, [(None, created)]


def _bind_outputs(
    keyed: bool, parsed: List[Tuple[Optional[str], List[Metric]]], output_names: Sequence[str]
) -> List[Tuple[str, Metric]]:
    if not keyed:
        if len(output_names) != 1:
            raise ValueError(
                NO_OUTPUT_NAMES.format(
                    count=len(output_names), outputs=list(output_names), example=output_names[0]
                )
            )
        return [(output_names[0], metric) for metric in parsed[0][1]]
    bound = []
    for name, metrics in parsed:
        output = output_short_name(name)
        if output not in output_names:
            raise ValueError(UNKNOWN_OUTPUT.format(name=name, outputs=list(output_names)))
        bound += [(output, metric) for metric in metrics]
    return bound


def _record_names(
    prefix: str, bound: Sequence[Tuple[str, Metric]], single_output: bool
) -> List[str]:
    names = [
        f"{prefix}_{metric.name}" if single_output else f"{prefix}_{output}_{metric.name}"
        for output, metric in bound
    ]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(
            f"several metrics would write the records {repeated}; give each metric "
            "of an output only once (or wrap one in HostMetric(..., name=...))"
        )
    return names


class _MetricsExtension(Extension):
    """Shared parts of the monitoring extensions.

    Metrics bound to outputs, record names, the distributed ``reduce`` hook,
    and validation when the loop attaches the extension.
    """

    def __init__(self, metrics: MetricsSpec, **kwargs: Any) -> None:
        self._keyed, self._parsed = _parse_metrics(metrics)
        super().__init__(**kwargs)
        self.reduce: Optional[Reducer] = None

    def attach(self, loop: MainLoop) -> None:
        """Bind the metrics to the loop's outputs and labels, and check them.

        Also ask the loop for the sum over workers in distributed training.
        """
        super().attach(loop)
        self._bind(loop)
        if self.reduce is None:
            self.reduce = loop.reduction(self)

    def _bind(self, loop: MainLoop) -> None:
        raise NotImplementedError

    def _metrics_on_outputs(self, loop: MainLoop) -> List[Tuple[str, Metric]]:
        return _bind_outputs(self._keyed, self._parsed, loop.manager.output_names)


class Evaluate(_MetricsExtension):
    """Evaluate metrics of named outputs on several data iterators.

    Each iterator runs through the network (``is_train=False``) with the
    current parameters, and every metric of every output gets a record named
    ``<iterator>_<output>_<metric>`` (``valid_softmax_accuracy``), or
    ``<iterator>_<metric>`` (``valid_accuracy``) when the symbol has one
    output. Metric names (:data:`mxoid.metrics.DEVICE_METRIC_NAMES`) are
    computed on the devices and are means over every real sample of the
    iterator, as NumPy computes them on the whole data set: padding in the
    last batch never counts. ``mx.metric.EvalMetric`` objects and functions
    ``f(label, pred) -> float`` are computed on the host (see
    :func:`mxoid.metrics.create_metrics`).

    Iterators may have another batch size than training: executors are bound
    for each iterator's shapes once (the training shapes too), sharing the
    training parameters and memory pool, and they compute each row's metric
    values in their own graph (one array addition per device and batch is
    left); with host metrics only, an iterator of the training shapes runs on
    the training executors. Either way the loop
    first waits for the training step in flight and, on several devices,
    makes every device hold the averaged BatchNorm statistics
    (:meth:`MainLoop.get_params` describes the policy), and training goes on
    only once evaluation is computed: the network evaluated is the one
    ``get_params()`` returns and a checkpoint saves. Each iterator is reset
    before and after use. Evaluation changes neither the parameters nor the
    training iterator.

    Parameters
    ----------
    iterators : dict of str to mx.io.DataIter
        Name (the record prefix) -> iterator. Labels are found by name: the
        label of output ``'softmax'`` is ``'softmax_label'`` (any one label
        for a symbol with one output).
    metrics : dict or metric or list of metrics
        Output name (``'softmax'`` or ``'softmax_output'``) -> metric or list
        of metrics; a metric or list alone when the symbol has one output.
    **kwargs
        Firing conditions and options of :class:`Extension`. Without any
        firing condition, it fires after every epoch (``every_n_epochs=1``).

    Attributes
    ----------
    iterators : dict of str to mx.io.DataIter
    reduce : callable or None
        Hook for distributed training: when set, it maps the ``(sum, count)``
        rows of an iterator's metrics (a NumPy array, see
        :meth:`mxoid.metrics.MetricAccumulator.totals`) to their sums over
        the workers, before the division. None: this worker's values.

    Raises
    ------
    ValueError
        At construction for unknown metric names; when the loop attaches it,
        for unknown outputs, missing labels or shapes a metric cannot use.

    Examples
    --------
    .. code-block:: python

        Evaluate({"valid": valid_iter, "test": test_iter},
                 metrics={"softmax": "acc", "reg": ["mse", "mae"]})
    """

    def __init__(
        self, iterators: Mapping[str, mx.io.DataIter], metrics: MetricsSpec, **kwargs: Any
    ) -> None:
        if not isinstance(iterators, Mapping) or not iterators:
            raise TypeError(
                "iterators must be a non-empty dict of name -> mx.io.DataIter, e.g. "
                f"{{'valid': valid_iter}}; got {type(iterators).__name__}"
            )
        for name, iterator in iterators.items():
            if not isinstance(name, str) or not name:
                raise ValueError(
                    f"iterator names are the record prefixes, non-empty strings; got {name!r}"
                )
            for attribute in ("provide_data", "provide_label", "reset"):
                if not hasattr(iterator, attribute):
                    raise TypeError(
                        f"iterator {name!r} must be an mx.io.DataIter (it has no "
                        f"{attribute}); got {type(iterator).__name__}"
                    )
        if not any(kwargs.get(keyword) for keyword in FIRING_KEYWORDS):
            kwargs["every_n_epochs"] = 1
        super().__init__(metrics, **kwargs)
        self.iterators: Dict[str, mx.io.DataIter] = dict(iterators)
        self._accumulators: Dict[str, MetricAccumulator] = {}
        self._records: Dict[str, List[str]] = {}
        self._pacers: Dict[str, Optional[Pacer]] = {}

    def _bind(self, loop: MainLoop) -> None:
        bound = self._metrics_on_outputs(loop)
        single = len(loop.manager.output_names) == 1
        self._accumulators, self._records, self._pacers = {}, {}, {}
        for name, iterator in self.iterators.items():
            self._records[name] = _record_names(name, bound, single)
            label_names = [desc[0] for desc in iterator.provide_label or ()]
            try:
                for output, _ in bound:
                    label_for_output(output, loop.manager.output_names, label_names)
                self._accumulators[name] = self._accumulator(loop, iterator, bound)
            except ValueError as error:
                raise ValueError(f"{self.name}, iterator {name!r}: {error}") from None
            # The host's lead over the devices bounded, as in training.
            manager = self._accumulators[name].manager
            self._pacers[name] = Pacer.of(manager, loop.max_batches_ahead)

    @staticmethod
    def _accumulator(
        loop: MainLoop, iterator: mx.io.DataIter, bound: List[Tuple[str, Metric]]
    ) -> MetricAccumulator:
        """Bind the metrics of one iterator: in the evaluation graph itself where they fit.

        The iterator gets executors of its own (sharing the parameters, and the
        training executors' memory pool), which compute the per-row values as
        a private head (:func:`~mxoid.metrics.per_row_head`), whatever its
        shapes, the training ones included; metrics that cannot be built into
        the graph are computed by an operator call per device and batch, on
        the training executors for inputs of the training shapes.
        """
        manager = loop.manager
        data, labels = iterator.provide_data, iterator.provide_label
        shapes = {desc[0]: tuple(desc[1]) for desc in list(data) + list(labels or [])}
        label_names = [desc[0] for desc in labels or []]
        batch_size = next(iter(shapes.values()))[0]
        work_load = forward_work_load(batch_size, manager.work_load_list)
        rows = [s.stop - s.start for s in split_batch(batch_size, work_load)]
        types = dtypes_of(list(data) + list(labels or []))
        head = per_row_head(loop.symbol, bound, label_names, shapes, rows, input_types=types)
        if head is not None:
            manager = manager.evaluation_manager(data, labels, private_heads=[head])
            return MetricAccumulator(manager, bound, manager.private_outputs[0])
        return MetricAccumulator(manager.evaluation_manager(data, labels), bound)

    def do(self, which_callback: str, *args: Any) -> None:
        """Evaluate every iterator and write the records into the current row."""
        self.main_loop.log.current_row.update(self.evaluate())

    def evaluate(self) -> Dict[str, float]:
        """Run every iterator through the network now and return the records by name."""
        loop = self.main_loop
        if loop is None:
            raise RuntimeError(NOT_BOUND.format(name=self.name))
        # The model evaluated is the one get_params() returns and a checkpoint
        # saves; and no evaluation runs while the training step is in flight
        # (see DataParallelExecutorManager.synchronize).
        loop.manager.reconcile_aux_states()
        loop.synchronize()
        records: Dict[str, float] = {}
        try:
            for name, iterator in self.iterators.items():
                records.update(zip(self._records[name], self._evaluate(name, iterator)))
        finally:
            loop.synchronize()  # nor any training step while evaluation is in flight
        return records

    def _evaluate(self, name: str, iterator: mx.io.DataIter) -> List[float]:
        accumulator = self._accumulators[name]
        manager = accumulator.manager
        accumulator.reset()
        iterator.reset()
        pacer = self._pacers[name]
        try:
            for batch in iterator:
                manager.load_data_batch(batch)
                manager.forward(is_train=False)
                accumulator.update()
                if pacer is not None:
                    pacer.queued()
        finally:
            iterator.reset()
        if accumulator.rows == 0:
            raise ValueError(f"{self.name}: iterator {name!r} yielded no samples; is it empty?")
        return accumulator.values(self.reduce)


class TrainingMonitoring(_MetricsExtension):
    """Metrics of named outputs over the training batches, without per-batch host sync.

    After every batch the metrics are added to running sums on the devices
    (no ``asnumpy``): the training executors compute each row's values in the
    training graph itself (behind ``BlockGrad``, in outputs private to mxoid:
    the symbol, ``manager.outputs`` and checkpoints are unchanged), and the
    backward pass adds them to running sums, gradients of an argument private
    to mxoid bound with ``grad_req='add'``: the host queues nothing per
    batch (a padded batch takes its padding rows back out). The sums are read,
    written as records and reset only when the extension fires: at the end of
    each epoch and, with ``every_n_batches``, every N batches. Each write
    covers the batches since the previous write (or the start of training).
    Records are named ``train_<output>_<metric>``, or ``train_<metric>`` when
    the symbol has one output; values are means over the real samples of
    those batches (padding never counts), computed on the outputs of the
    training forward pass (``is_train=True``: with dropout, for instance).

    ``mx.metric.EvalMetric`` objects and functions are accepted too, but they
    are computed on the host and synchronize every batch.

    Parameters
    ----------
    metrics : dict or metric or list of metrics
        As for :class:`Evaluate`.
    every_n_batches : int, optional
        Also write every N batches.
    **kwargs
        Other firing conditions and options of :class:`Extension`;
        ``after_epoch=True`` by default.

    Attributes
    ----------
    reduce : callable or None
        Hook for distributed training, as in :class:`Evaluate`.
    accumulator : MetricAccumulator
        The running sums (set when the loop attaches the extension).

    Examples
    --------
    .. code-block:: python

        from mxoid import TrainingMonitoring
        monitoring = TrainingMonitoring({"softmax": ["acc", "ce"]}, every_n_batches=100)
    """

    def __init__(
        self, metrics: MetricsSpec, every_n_batches: Optional[int] = None, **kwargs: Any
    ) -> None:
        kwargs.setdefault("after_epoch", True)
        super().__init__(metrics, every_n_batches=every_n_batches, **kwargs)
        self.accumulator: Optional[MetricAccumulator] = None
        self._records: List[str] = []
        self._running_sums: Optional[str] = None  # the name of its head's running sums

    def _bind(self, loop: MainLoop) -> None:
        bound = self._metrics_on_outputs(loop)
        self._records = _record_names("train", bound, len(loop.manager.output_names) == 1)
        head = loop.private_outputs(self)
        running_sums = loop.manager.running_sums.get(self._running_sums) if head else None
        try:
            self.accumulator = MetricAccumulator(loop.manager, bound, head, running_sums)
        except ValueError as error:
            raise ValueError(f"{self.name}: {error}") from None

    def private_head(
        self,
        symbol: mx.sym.Symbol,
        label_names: Sequence[str],
        input_shapes: Dict[str, Tuple[int, ...]],
        rows_per_device: Sequence[int],
        running_sums: Optional[str] = None,
        input_types: Optional[Dict[str, Any]] = None,
    ) -> Optional[mx.sym.Symbol]:
        """Return the head that computes this extension's per-row values in the training graph.

        The loop binds it with the training executors (see
        :func:`mxoid.metrics.per_row_head`), with ``running_sums`` the name of
        the head's argument whose gradient the backward passes add the values
        to, and ``input_types`` the inputs' dtypes (the head takes fewer
        operators where it can tell they are float32); None when no head can be
        built here (no device metric, or metrics the outputs do not fit:
        attaching then says why).
        """
        output_names = [output_short_name(n) for n in symbol.list_outputs()]
        try:
            bound = _bind_outputs(self._keyed, self._parsed, output_names)
        except ValueError:
            return None
        self._running_sums = running_sums
        return per_row_head(
            symbol, bound, label_names, input_shapes, rows_per_device, running_sums, input_types
        )

    def after_batch(self, batch: Any) -> None:
        """Add the batch to the running sums (no host sync), then fire if a condition holds."""
        self.accumulator.update()
        super().after_batch(batch)

    def state_dict(self) -> Dict[str, Any]:
        """Return the running sums since the last write: a resumed run writes the same records."""
        return self.accumulator.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore the running sums that :meth:`state_dict` returned."""
        self.accumulator.load_state_dict(state)

    def do(self, which_callback: str, *args: Any) -> None:
        """Write the records over the batches since the last write, and reset the sums."""
        accumulator = self.accumulator
        if accumulator.rows == 0:
            return
        self.main_loop.log.current_row.update(zip(self._records, accumulator.values(self.reduce)))
        accumulator.reset()


def private_heads(
    extensions: Sequence[Extension],
    symbol: mx.sym.Symbol,
    data_descs: Sequence[Any],
    label_descs: Optional[Sequence[Any]],
    rows_per_device: Sequence[int],
) -> List[Tuple[Extension, mx.sym.Symbol]]:
    """Return the private heads the training executors compute for these extensions.

    One per :class:`TrainingMonitoring` whose metrics can be computed in the
    training graph, with the extension it serves. ``rows_per_device``: how the
    training batch is split.
    """
    if not rows_per_device:
        return []
    descs = list(data_descs) + list(label_descs or [])
    shapes = {desc[0]: tuple(desc[1]) for desc in descs}
    label_names = [desc[0] for desc in label_descs or []]
    heads = []
    for extension in extensions:
        if isinstance(extension, TrainingMonitoring):
            running_sums = f"{RUNNING_SUMS_PREFIX}{len(heads)}"
            head = extension.private_head(
                symbol, label_names, shapes, rows_per_device, running_sums, dtypes_of(descs)
            )
            if head is not None:
                heads.append((extension, head))
    return heads
