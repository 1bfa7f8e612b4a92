"""Monitoring: metrics of named outputs on the training batches, computed in the training graph.

:class:`Evaluate` (the same metrics on evaluation iterators) lives in
:mod:`.evaluation`, and is importable from here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import mxnet as mx
import numpy as np

from ..executor_manager.outputs import metric_output_names, output_short_name
from ..metrics import Accumulators, Metric, MetricAccumulator, per_row_head
from ..metrics.head import dtypes_of
from .base import HeadRequest
from .evaluation import Evaluate as Evaluate  # importable from here, as before
from .metrics_extension import MetricsExtension, _bind_outputs, _record_names
from .metrics_extension import MetricsSpec as MetricsSpec

if TYPE_CHECKING:  # pragma: no cover
    from ..main_loop import MainLoop

__all__ = ["TrainingMonitoring"]


class TrainingMonitoring(MetricsExtension):
    """Metrics of named outputs over the training batches, without per-batch host sync.

    After every batch the metrics are added to running sums on the devices
    (no ``asnumpy``): the training executors compute each row's values in the
    training graph itself (behind ``BlockGrad``, in outputs private to mxoid:
    the symbol, ``manager.outputs`` and checkpoints are unchanged), and add
    them to running sums private to mxoid: the host queues nothing per
    batch (a padded batch takes its padding rows back out). With mxoid's
    fused operator (:mod:`mxoid.metrics.native`) that operator adds them in
    the forward passes for training (not those of an evaluation on the
    training executors); with MXNet's operators the backward pass does (the
    sums are the gradient of an argument bound with ``grad_req='add'``). The sums are read,
    written as records and reset only when the extension fires: at the end of
    each epoch and, with ``every_n_batches``, every N batches. A write every N
    batches covers the batches since the previous write (the window, as
    ``mx.callback.Speedometer`` shows with ``auto_reset``); a write at the end
    of an epoch covers the whole epoch (the batches since the previous epoch's
    write, or the start of training), whatever was written in between, as
    ``Module.fit``'s ``Train-accuracy`` does: the epoch's figure stays the
    epoch's.
    Records are named ``<prefix>_<output>_<metric>``, or ``<prefix>_<metric>``
    when the symbol has one output (``prefix`` is ``'train'`` unless given);
    values are means over the real samples of those batches (padding never
    counts), computed on the outputs of the training forward pass
    (``is_train=True``: with dropout, for instance).

    ``mx.metric.EvalMetric`` objects and functions are accepted too, but they
    are computed on the host and synchronize every batch.

    Parameters
    ----------
    metrics : dict or metric or list of metrics
        As for :class:`Evaluate`.
    every_n_batches : int, optional
        Also write every N batches.
    prefix : str
        The start of the record names (``'train'``). Two metric extensions of a
        loop may not write the same records: a second TrainingMonitoring over
        windows of N batches beside one over epochs needs another prefix.
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
        self,
        metrics: MetricsSpec,
        every_n_batches: Optional[int] = None,
        prefix: str = "train",
        **kwargs: Any,
    ) -> None:
        if not isinstance(prefix, str) or not prefix:
            raise ValueError(f"prefix starts the record names, a non-empty string; got {prefix!r}")
        kwargs.setdefault("after_epoch", True)
        super().__init__(metrics, every_n_batches=every_n_batches, **kwargs)
        self.prefix = prefix
        self.accumulator: Optional[MetricAccumulator] = None
        self._records: List[str] = []
        self._bound: List[Tuple[str, Metric]] = []
        self._sums_of: Dict[Any, str] = {}  # bucket key -> the name of its head's running sums
        self._buckets: Optional[Accumulators] = None
        self._pending: Dict[str, Dict[str, Any]] = {}  # states of buckets not bound yet
        self._since_epoch: Optional[np.ndarray] = None  # (sum, count) read since an epoch's write

    def _bind(self, loop: MainLoop) -> None:
        self._bound = bound = self._metrics_on_outputs(loop)
        self._records = _record_names(self.prefix, bound, len(loop.manager.metric_outputs) == 1)
        self.accumulator = self._accumulator(loop, None)
        self._buckets = Accumulators(self.accumulator)

    def _accumulator(self, loop: MainLoop, key: Any) -> MetricAccumulator:
        """Return an accumulator of the executors the loop trains on now (bucket ``key``'s)."""
        head = loop.private_outputs(self)
        executors = loop.manager.current
        name = self._sums_of.get(key)
        running_sums = executors.running_sums.get(name) if head and name else None
        try:  # a bucket's sums are new zeros, its first batch already added to them
            return MetricAccumulator(
                executors, self._bound, head, running_sums, zero_sums=key is None
            )
        except ValueError as error:
            raise ValueError(f"{self.name}: {error}") from None

    def private_head(self, request: HeadRequest) -> Optional[mx.sym.Symbol]:
        """Return the head that computes this extension's per-row values in the training graph.

        The training executors bind it (see :func:`mxoid.metrics.per_row_head`)
        and add the values to running sums named ``request.running_sums``; the
        head takes fewer operators where it can tell the inputs are float32,
        and suits the devices it runs on. None when no head can be built here
        (no device metric, or metrics the outputs do not fit: attaching then
        says why).
        """
        symbol = request.symbol
        output_names = [output_short_name(n) for n in symbol.list_outputs()]
        try:
            bound = _bind_outputs(
                self._keyed, self._parsed, output_names, metric_output_names(symbol)
            )
        except ValueError:
            return None
        descs = list(request.data_descs) + list(request.label_descs)
        self._sums_of[request.key] = request.running_sums
        return per_row_head(
            symbol,
            bound,
            [desc[0] for desc in request.label_descs],
            {desc[0]: tuple(desc[1]) for desc in descs},
            request.rows_per_device,
            request.running_sums,
            dtypes_of(descs),
            contexts=request.contexts,
        )

    @property
    def record_names(self) -> List[str]:
        """The names of the records the extension writes (known once attached)."""
        return list(self._records)

    def after_backward(self, batch: Any) -> None:
        """Add the batch just trained to the running sums (no host sync).

        In ``after_backward`` the outputs, the values of the private head and
        the padding are the training pass's; a later hook's evaluation (an
        ``Evaluate`` at the training batch size runs on the training
        executors, others share their memory) replaces them. A bucket's
        executors (with a ``sym_gen``) have an accumulator of their own.
        """
        loop = self.main_loop
        if loop.manager.current is loop.manager.training_set:
            self.accumulator.update()
            return
        key = loop.network.key_of(batch)
        accumulator = self._buckets.by_key.get(key)
        if accumulator is None:
            accumulator = self._accumulator(loop, key)
            self._buckets.add(key, accumulator)
            if repr(key) in self._pending:  # this batch is in its running sums already
                accumulator.load_state_dict(self._pending.pop(repr(key)), onto_running=True)
        accumulator.update()

    def state_dict(self) -> Dict[str, Any]:
        """Return the running sums since the last write: a resumed run writes the same records.

        With buckets, each bucket's under ``buckets`` by ``repr(key)``.
        """
        state = self.accumulator.state_dict()
        if self._since_epoch is not None:  # windows written in this epoch: its write adds them
            state["since_epoch"] = self._since_epoch.tolist()
        if self._buckets.by_key or self._pending:
            state["buckets"] = {
                **self._pending,
                **{repr(k): a.state_dict() for k, a in self._buckets.by_key.items()},
            }
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore the running sums that :meth:`state_dict` returned.

        A bucket's come back when its executors are bound again.
        """
        self.accumulator.load_state_dict(state)
        self._pending = dict(state.get("buckets", {}))
        since = state.get("since_epoch")
        self._since_epoch = None if since is None else np.asarray(since, dtype=np.float64)

    def do(self, which_callback: str, *args: Any) -> None:
        """Write the records over the batches since the last write, and reset the sums.

        At an epoch's end, over the batches since the previous epoch's write.
        """
        accumulators = self._buckets
        epoch_end = which_callback == "after_epoch"
        totals = self._since_epoch
        if accumulators.rows + sum(s["rows"] for s in self._pending.values()) > 0:
            read = accumulators.totals(self.reduce, self._pending)
            accumulators.reset()
            totals = read if totals is None else totals + read
            self._since_epoch = totals
            if not epoch_end:
                totals = read  # a window's records
        elif not epoch_end or totals is None:
            return
        if epoch_end:
            self._since_epoch = None
        values = accumulators.values_of(totals)
        self.main_loop.log.current_row.update(zip(self._records, values))
