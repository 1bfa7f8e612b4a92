"""Monitoring: metrics of named outputs on the training batches, computed in the training graph.

:class:`Evaluate` (the same metrics on evaluation iterators) lives in
:mod:`.evaluation`, and is importable from here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

import mxnet as mx

from ..executor_manager import output_short_name
from ..metrics import MetricAccumulator, per_row_head
from ..metrics.head import dtypes_of
from ..private_heads import RUNNING_SUMS_PREFIX
from .base import Extension
from .evaluation import Evaluate as Evaluate  # importable from here, as before
from .metrics_extension import MetricsExtension, _bind_outputs, _record_names
from .metrics_extension import MetricsSpec as MetricsSpec

if TYPE_CHECKING:  # pragma: no cover
    from ..main_loop import MainLoop

__all__ = ["TrainingMonitoring", "private_heads", "training_pass_reader"]


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
    each epoch and, with ``every_n_batches``, every N batches. Each write
    covers the batches since the previous write (or the start of training).
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
        self._running_sums: Optional[str] = None  # the name of its head's running sums

    def _bind(self, loop: MainLoop) -> None:
        bound = self._metrics_on_outputs(loop)
        self._records = _record_names(self.prefix, bound, len(loop.manager.output_names) == 1)
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
        contexts: Optional[Sequence[mx.Context]] = None,
    ) -> Optional[mx.sym.Symbol]:
        """Return the head that computes this extension's per-row values in the training graph.

        The loop binds it with the training executors (see
        :func:`mxoid.metrics.per_row_head`), with ``running_sums`` the name of
        the head's running sums, to which the executors add the values,
        ``input_types`` the inputs' dtypes (the head takes fewer operators
        where it can tell they are float32), and ``contexts`` the
        devices it runs on; None when no head can be built here (no device
        metric, or metrics the outputs do not fit: attaching then says why).
        """
        output_names = [output_short_name(n) for n in symbol.list_outputs()]
        try:
            bound = _bind_outputs(self._keyed, self._parsed, output_names)
        except ValueError:
            return None
        self._running_sums = running_sums
        return per_row_head(
            symbol,
            bound,
            label_names,
            input_shapes,
            rows_per_device,
            running_sums,
            input_types,
            contexts=contexts,
        )

    @property
    def record_names(self) -> List[str]:
        """The names of the records the extension writes (known once attached)."""
        return list(self._records)

    def read_training_pass(self) -> None:
        """Add the batch just trained to the running sums (no host sync).

        The loop calls it right after each batch's forward and backward passes,
        before the update and before any hook: an evaluation in a hook (an
        ``Evaluate`` at the training batch size runs on the training executors,
        others share their memory) replaces the outputs, the values of the
        private head and the padding that this reads.
        """
        self.accumulator.update()

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
    contexts: Optional[Sequence[mx.Context]] = None,
) -> List[Tuple[Extension, mx.sym.Symbol]]:
    """Return the private heads the training executors compute for these extensions.

    One per :class:`TrainingMonitoring` whose metrics can be computed in the
    training graph, with the extension it serves. ``rows_per_device``: how the
    training batch is split; ``contexts``: the devices (None: one CPU).
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
                symbol,
                label_names,
                shapes,
                rows_per_device,
                running_sums,
                dtypes_of(descs),
                contexts,
            )
            if head is not None:
                heads.append((extension, head))
    return heads


def training_pass_reader(extensions: Sequence[Extension]) -> Optional[Callable[[], None]]:
    """Return what the loop calls after each batch's training pass (None: nothing to call).

    Each attached :class:`TrainingMonitoring` among ``extensions`` adds the
    batch to its running sums (:meth:`TrainingMonitoring.read_training_pass`).
    """
    reads = [
        e.read_training_pass
        for e in extensions
        if isinstance(e, TrainingMonitoring) and e.accumulator is not None
    ]
    if not reads:
        return None
    if len(reads) == 1:
        return reads[0]

    def read_all() -> None:
        for read in reads:
            read()

    return read_all
