"""Evaluate: metrics of named outputs on evaluation iterators, summed on the devices."""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional

import mxnet as mx
from mxnet.gluon.data import DataLoader

from ..data.evaluation import evaluation_iterator, random_states_kept, warn_left_out
from ..data.loader import as_data_iter
from ..executor_manager.devices import forward_work_load, split_batch
from ..executor_manager.pacing import Pacer
from ..metrics import Accumulators, MetricAccumulator, label_for_output, per_row_head
from ..metrics.head import dtypes_of
from .base import FIRING_KEYWORDS
from .metrics_extension import NOT_BOUND, MetricsExtension, MetricsSpec, _record_names

if TYPE_CHECKING:  # pragma: no cover
    from ..main_loop import MainLoop

__all__ = ["Evaluate"]


class Evaluate(MetricsExtension):
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
    ``get_params()`` returns and a checkpoint saves. Evaluation changes
    neither the parameters nor the training iterator, nor what training
    draws from NumPy's and Python's generators.

    How an iterator is read is :func:`mxoid.data.evaluation.evaluation_iterator`'s
    choice: an ``mx.rnn.BucketSentenceIter`` is read from its own arrays,
    every sentence once, in a fixed order (never reset, never shuffled);
    any other iterator is reset before and after use and read as it yields,
    what its resets draw from the global generators given back (a warning
    says when it yields fewer sentences than a ``BucketSentenceIter`` it
    wraps holds).

    Parameters
    ----------
    iterators : dict of str to mx.io.DataIter or gluon.data.DataLoader
        Name (the record prefix) -> iterator. Labels are found by name: the
        label of output ``'softmax'`` is ``'softmax_label'`` (any one label
        for a symbol with one output). A ``DataLoader`` is read through
        :class:`mxoid.data.DataLoaderIter`, its arrays named as the training inputs.
    metrics : dict or metric or list of metrics
        Output name (``'softmax'`` or ``'softmax_output'``) -> metric or list
        of metrics; a metric or list alone when the symbol has one output.
    parameters : ExponentialMovingAverage or StochasticWeightAveraging, optional
        Evaluate these averages instead of the parameters: swapped into the
        network's arrays for the evaluation, and back
        (:meth:`~mxoid.extensions.averaging.ParameterAverage.swapped_in`).
        Give the Evaluate its own iterator names (``{"ema_valid": valid}``).
    **kwargs
        Firing conditions and options of :class:`Extension`. Without any
        firing condition, it fires after every epoch (``every_n_epochs=1``).

    Attributes
    ----------
    iterators : dict of str to mx.io.DataIter
        Once attached, DataLoaders read through :class:`mxoid.data.DataLoaderIter`.
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
        self,
        iterators: Mapping[str, mx.io.DataIter],
        metrics: MetricsSpec,
        parameters: Any = None,
        **kwargs: Any,
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
                if not hasattr(iterator, attribute) and not isinstance(iterator, DataLoader):
                    raise TypeError(
                        f"iterator {name!r} must be an mx.io.DataIter or a Gluon DataLoader "
                        f"(it has no {attribute}); got {type(iterator).__name__}"
                    )
        if not any(kwargs.get(keyword) for keyword in FIRING_KEYWORDS):
            kwargs["every_n_epochs"] = 1
        super().__init__(metrics, **kwargs)
        self.iterators: Dict[str, mx.io.DataIter] = dict(iterators)
        self.parameters = parameters
        self._accumulators: Dict[str, MetricAccumulator] = {}
        self._records: Dict[str, List[str]] = {}
        self._pacers: Dict[str, Optional[Pacer]] = {}
        self._read: Dict[str, Any] = {}
        self._first_keys: Dict[str, Any] = {}

    @property
    def record_names(self) -> List[str]:
        """The names of the records the extension writes (known once attached)."""
        return [record for records in self._records.values() for record in records]

    def _bind(self, loop: MainLoop) -> None:
        names = (loop.manager.data_names, loop.manager.label_names)  # a DataLoader's, as training's
        self.iterators = {k: as_data_iter(it, *names) for k, it in self.iterators.items()}
        self._bound = bound = self._metrics_on_outputs(loop)
        single = len(loop.manager.metric_outputs) == 1
        self._accumulators, self._records, self._pacers = {}, {}, {}
        self._buckets: Dict[str, Accumulators] = {}
        self._read = {k: evaluation_iterator(it) for k, it in self.iterators.items()}
        for name, iterator in self.iterators.items():
            self._records[name] = _record_names(name, bound, single)
            data, labels = iterator.provide_data, iterator.provide_label
            # The iterator's largest shapes first (a bucketed iterator's own default key).
            key = self._first_keys[name] = loop.network.default_key_of(iterator)
            self._accumulators[name] = self._accumulator(loop, name, data, labels, key)
            self._buckets[name] = Accumulators(self._accumulators[name])

    def _accumulator(
        self, loop: MainLoop, name: str, data: Any, labels: Any, key: Any = None
    ) -> MetricAccumulator:
        """Bind the metrics for one iterator's batches of one shape (of graph ``key``).

        The graph and its executors are the loop's network's to choose
        (:meth:`mxoid.network.Network.graph`, :meth:`~mxoid.network.Network.forward_set`):
        a bucket's, a Gluon block's traced in predict mode.

        They get executors of their own (sharing the parameters, and the
        training executors' memory pool), which compute the per-row values as
        a private head (:func:`~mxoid.metrics.per_row_head`), whatever their
        shapes, the training ones included; metrics that cannot be built into
        the graph are computed by an operator call per device and batch, on
        the training executors for inputs of the training shapes.
        """
        manager, bound, network = loop.manager, self._bound, loop.network
        label_names = [desc[0] for desc in labels or []]
        try:
            symbol = network.graph(key, data, labels)
            for output, _ in bound:
                label_for_output(output, manager.metric_outputs, label_names)
            shapes = {desc[0]: tuple(desc[1]) for desc in list(data) + list(labels or [])}
            batch_size = next(iter(shapes.values()))[0]
            work_load = forward_work_load(batch_size, manager.training_set.work_load_list)
            rows = [s.stop - s.start for s in split_batch(batch_size, work_load)]
            types = dtypes_of(list(data) + list(labels or []))
            contexts = manager.training_set.contexts[: len(rows)]
            head = per_row_head(
                symbol, bound, label_names, shapes, rows, input_types=types, contexts=contexts
            )
            heads = [] if head is None else [head]
            executors = network.forward_set(manager, data, labels, heads, key)
            accumulator = MetricAccumulator(
                executors, bound, executors.private_outputs[0] if heads else None
            )
        except ValueError as error:
            raise ValueError(f"{self.name}, iterator {name!r}: {error}") from None
        # The host's lead over the devices bounded, as in training.
        self._pacers[id(accumulator)] = Pacer.of(executors, loop.max_batches_ahead)
        return accumulator

    def _accumulator_for(self, name: str, batch: mx.io.DataBatch) -> MetricAccumulator:
        """Return the accumulator of ``batch``: the iterator's, or its graph's (a bucket's)."""
        network = self.main_loop.network
        key = network.key_of(batch)
        if key is None or key == self._first_keys[name]:
            return self._accumulators[name]
        accumulators = self._buckets[name]
        found = accumulators.by_key.get(key)
        if found is None:
            data, labels = batch.provide_data, batch.provide_label
            found = self._accumulator(self.main_loop, name, data, labels, key)
            accumulators.add(key, found)
        return found

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
        swapped = self.parameters.swapped_in() if self.parameters is not None else nullcontext()
        try:
            with swapped:
                for name, iterator in self.iterators.items():
                    records.update(zip(self._records[name], self._evaluate(name, iterator)))
        finally:
            loop.synchronize()  # nor any training step while evaluation is in flight
        return records

    def _evaluate(self, name: str, iterator: mx.io.DataIter) -> List[float]:
        accumulators = self._buckets[name]
        accumulators.reset(zero=True)  # each evaluation its own sums: the same after a resumption
        read = self._read[name]
        with random_states_kept():  # what the iterator draws is not the training run's
            read.reset()
            try:
                for batch in read:
                    accumulator = self._accumulator_for(name, batch)
                    manager = accumulator.manager
                    manager.load_data_batch(batch)
                    manager.forward(is_train=False)
                    accumulator.update()
                    pacer = self._pacers[id(accumulator)]
                    if pacer is not None:
                        pacer.queued()
            finally:
                read.reset()
        if accumulators.rows == 0:
            raise ValueError(f"{self.name}: iterator {name!r} yielded no samples; is it empty?")
        warn_left_out(f"{self.name}, iterator {name!r}", iterator, accumulators.rows)
        return accumulators.values(self.reduce)
