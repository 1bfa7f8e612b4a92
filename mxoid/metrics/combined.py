"""Metric accumulators of several executor sets (a bucket's each), read as one."""

from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

from .accumulator import MetricAccumulator, Reducer
from .host import HostMetric

__all__ = ["Accumulators", "totals_of_state"]


def totals_of_state(
    accumulator: MetricAccumulator, state: Dict[str, object]
) -> Tuple[np.ndarray, Dict[str, object]]:
    """Return the totals a :meth:`state_dict` of an accumulator like this one holds.

    With the state after a read and a reset: what a bucket's accumulator, whose
    executors are not bound again yet after a resumption, adds to a write.
    """
    read = np.zeros(accumulator._columns)
    for device in state["device_sums"]:
        read += [float(np.sum(column)) for column in device]
    totals = np.zeros((len(accumulator.metrics), 2))
    totals[:, 1] = int(state["rows"]) * accumulator._elements
    since = read - np.asarray(state["baseline"], dtype="float64")
    for index, column in accumulator._value_column.items():
        totals[index, 0] = since[column]
    for index, column in accumulator._count_column.items():
        totals[index, 1] = since[column]
    host = iter(state["host"])
    for index, metric in enumerate(accumulator.metrics):
        if isinstance(metric, HostMetric):
            totals[index] = next(host)
    after = {**state, "rows": 0, "baseline": read.tolist()}
    after["host"] = [[0.0, 0.0] for _ in state["host"]]
    return totals, after


class Accumulators:
    """The accumulators of several executor sets (a bucket's each), read as one.

    The metrics are the same in each; their ``(sum, count)`` totals add up.
    ``first`` is the accumulator of the default executors; the others are
    added with :meth:`add` as their executors are bound.
    """

    def __init__(self, first: MetricAccumulator) -> None:
        self.first = first
        self.by_key: Dict[object, MetricAccumulator] = {}

    def add(self, key: object, accumulator: MetricAccumulator) -> None:
        """Keep ``accumulator``, of the executors of bucket ``key``."""
        self.by_key[key] = accumulator

    def __iter__(self) -> Iterator[MetricAccumulator]:
        yield self.first
        yield from self.by_key.values()

    @property
    def rows(self) -> int:
        """Real rows added since the last reset, in every accumulator."""
        return sum(accumulator.rows for accumulator in self)

    def values(
        self, reduce: Optional[Reducer] = None, pending: Optional[Dict[str, Dict]] = None
    ) -> List[float]:
        """Return each metric's value over the batches of every accumulator.

        ``pending``: the states of accumulators not made again yet after a
        resumption, by key; their totals count too, and they become the states
        after this read and a reset.
        """
        return self.values_of(self.totals(reduce, pending))

    def totals(
        self, reduce: Optional[Reducer] = None, pending: Optional[Dict[str, Dict]] = None
    ) -> np.ndarray:
        """Return each metric's ``(sum, count)`` over the batches of every accumulator.

        Summed over the workers by ``reduce``; ``pending`` as for :meth:`values`.
        Totals of several reads add up: :meth:`values_of` their sum is the
        value over all their batches.
        """
        totals = sum(accumulator.totals() for accumulator in self)
        for key, state in list((pending or {}).items()):
            more, pending[key] = totals_of_state(self.first, state)
            totals = totals + more
        if reduce is not None:
            totals = np.asarray(reduce(totals), dtype=np.float64)
        return np.asarray(totals, dtype=np.float64)

    def values_of(self, totals: np.ndarray) -> List[float]:
        """Return each metric's value of ``(sum, count)`` totals (:meth:`totals`)."""
        return [
            metric.value(float(total), float(count))
            for metric, (total, count) in zip(self.first.metrics, totals)
        ]

    def reset(self, zero: bool = False) -> None:
        """Reset every accumulator (see :meth:`MetricAccumulator.reset`)."""
        for accumulator in self:
            accumulator.reset(zero)
