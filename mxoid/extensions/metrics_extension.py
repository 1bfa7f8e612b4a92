"""What Evaluate and TrainingMonitoring share: metrics bound to named outputs, record names."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Mapping, Optional, Sequence, Tuple, Union

from ..executor_manager.outputs import output_short_name
from ..metrics import Metric, MetricLike, Reducer, create_metrics
from .base import Extension

if TYPE_CHECKING:  # pragma: no cover
    from ..main_loop import MainLoop

__all__ = ["MetricsExtension", "MetricsSpec"]

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
    keyed: bool,
    parsed: List[Tuple[Optional[str], List[Metric]]],
    output_names: Sequence[str],
    metric_outputs: Sequence[str],
) -> List[Tuple[str, Metric]]:
    if not keyed:
        if len(metric_outputs) != 1:
            raise ValueError(
                NO_OUTPUT_NAMES.format(
                    count=len(metric_outputs),
                    outputs=list(metric_outputs),
                    example=metric_outputs[0],
                )
            )
        return [(metric_outputs[0], metric) for metric in parsed[0][1]]
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


class MetricsExtension(Extension):
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

    @property
    def record_names(self) -> List[str]:
        """The names of the records the extension writes (known once attached; none here)."""
        return []

    def _metrics_on_outputs(self, loop: MainLoop) -> List[Tuple[str, Metric]]:
        manager = loop.manager
        bound = _bind_outputs(
            self._keyed, self._parsed, manager.output_names, manager.metric_outputs
        )
        loop.network.check_metrics(bound)  # a metric that cannot read its output: refused
        return bound
