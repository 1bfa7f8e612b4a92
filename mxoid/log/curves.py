"""Where records and rows sit on a learning curve: panels of records, and epochs of rows.

What ``mxoid plot`` draws, worked out from a log's rows without matplotlib.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from .files import EPOCHS_DONE, ITERATION

__all__ = ["SPLITS", "epoch_positions", "metric_families"]

SPLITS = ("train", "valid", "validation", "val", "dev", "test")
"""Record prefixes always read as the data a metric was measured on."""


def metric_families(records: Sequence[str]) -> Dict[str, List[Tuple[str, str]]]:
    """Group records into panels: family -> ``[(label, record), ...]``.

    ``train_accuracy``, ``valid_accuracy`` and ``test_accuracy`` form the
    family ``accuracy`` with the lines train, valid and test: a record
    ``<prefix>_<rest>`` joins the family ``<rest>`` when its prefix is one
    of :data:`SPLITS` or another record shares ``<rest>``. Any other record
    is a family of its own.

    Examples
    --------
    >>> from mxoid.log.curves import metric_families
    >>> families = metric_families(["train_accuracy", "valid_accuracy", "learning_rate"])
    >>> families["accuracy"]
    [('train', 'train_accuracy'), ('valid', 'valid_accuracy')]
    >>> families["learning_rate"]
    [('learning_rate', 'learning_rate')]
    """
    split = {name: name.split("_", 1) for name in records if "_" in name}
    rests: Dict[str, int] = {}
    for _prefix, rest in split.values():
        rests[rest] = rests.get(rest, 0) + 1
    families: Dict[str, List[Tuple[str, str]]] = {}
    for name in records:
        if name in split and (split[name][0] in SPLITS or rests[split[name][1]] > 1):
            prefix, rest = split[name]
            families.setdefault(rest, []).append((prefix, name))
        else:
            families.setdefault(name, []).append((name, name))
    return families


def epoch_positions(rows: Sequence[Dict[str, Any]]) -> List[float]:
    """Return the epoch (fractional between epoch ends) at which each row was written.

    The row that ends epoch ``e`` is the first row with ``epochs_done == e``;
    rows between two epoch ends are placed in proportion to their iteration.
    """
    ends: Dict[int, int] = {}
    for row in rows:
        epoch, iteration = row.get(EPOCHS_DONE), row.get(ITERATION)
        if isinstance(epoch, int) and epoch > 0 and isinstance(iteration, int):
            ends[epoch] = min(ends.get(epoch, iteration), iteration)
    known = sorted((iteration, epoch) for epoch, iteration in ends.items())
    points = [(0, 0)] + [point for point in known if point[0] > 0]
    # Keep the points increasing in both coordinates.
    xp, fp = [points[0][0]], [points[0][1]]
    for iteration, epoch in points[1:]:
        if iteration > xp[-1] and epoch > fp[-1]:
            xp.append(iteration)
            fp.append(epoch)
    positions = []
    for row in rows:
        iteration = row.get(ITERATION, 0)
        positions.append(_interpolate(iteration, xp, fp))
    return positions


def _interpolate(x: float, xp: List[int], fp: List[int]) -> float:
    if len(xp) == 1:
        return float(x)  # no epoch ended: the iteration stands in
    for i in range(1, len(xp)):
        if x <= xp[i]:
            return fp[i - 1] + (x - xp[i - 1]) * (fp[i] - fp[i - 1]) / (xp[i] - xp[i - 1])
    return fp[-1] + (x - xp[-1]) * (fp[-1] - fp[-2]) / (xp[-1] - xp[-2])
