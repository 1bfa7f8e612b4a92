"""How sure a throughput ratio is: bootstrap intervals over runs and their epochs.

Two designs, two estimators (NumPy only; the runner imports no MXNet):

- Contenders timed in processes of their own (``run.py --separate``): the ratio
  of the median throughputs, its interval drawn over the runs (workers) of
  each contender, then their epochs (:func:`ratio_interval`).
- Contenders trained in turns in one process (``interleave.py``, the default):
  epoch ``r`` of one contender and epoch ``r`` of another ran in the same round,
  a fraction of a second apart, so the ratio is taken round by round and the
  estimate is the median of those ratios; its interval draws the processes,
  then the rounds of each drawn process (:func:`paired_ratio`). A process can
  favour one contender a little (where its arrays landed), so the processes
  are drawn too, not only the rounds.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

__all__ = [
    "BOOTSTRAP_DRAWS",
    "paired_difference",
    "paired_ratio",
    "paired_time_ratio",
    "ratio_interval",
]

BOOTSTRAP_DRAWS = 2000


def _two_stage(runs: Sequence[np.ndarray], draws: int, seed: int = 0) -> np.ndarray:
    """Medians of ``draws`` two-stage resamples: runs with replacement, then values in each."""
    rng = np.random.RandomState(seed)
    out = np.empty(draws)
    for i in range(draws):
        chosen = [runs[k] for k in rng.randint(len(runs), size=len(runs))]
        out[i] = np.median(np.concatenate([rng.choice(r, r.size) for r in chosen]))
    return out


def ratio_interval(row: dict, other: dict, level: float = 0.90) -> Optional[Tuple[float, float]]:
    """The ``level`` bootstrap interval of ``row``'s median throughput over ``other``'s.

    Each draw resamples both contenders in two stages, as they were measured:
    their runs (workers) with replacement, then the timed epochs within each
    drawn run, and takes the ratio of the medians of the pooled epochs; the
    interval holds the middle ``level`` of 2000 draws (fixed seed). Drawing the
    runs too carries the difference between workers of one contender (on a
    shared machine a worker can sit at its own level for all of its epochs),
    which resampling pooled epochs alone would hide. None without epochs.
    """
    runs = []
    for entry in (row, other):
        rates = [
            entry["samples_per_epoch"] / np.asarray(run, dtype=np.float64)
            for run in entry.get("epoch_seconds") or ()
            if len(run)
        ]
        if not rates:
            return None
        runs.append(rates)
    mine, theirs = runs
    draws = _two_stage(mine, BOOTSTRAP_DRAWS, seed=0) / _two_stage(theirs, BOOTSTRAP_DRAWS, seed=1)
    tail = (1 - level) / 2 * 100
    return float(np.percentile(draws, tail)), float(np.percentile(draws, 100 - tail))


def round_ratios(row: dict, other: dict, key: str = "epoch_seconds") -> Optional[List[np.ndarray]]:
    """Per process, ``row``'s throughput over ``other``'s in each round they both timed.

    Both rows must come from the same interleaved processes, in the same order
    (``epoch_seconds``: one list of round times per process). None when they
    do not, or have no rounds. ``key`` names other times per round
    (``epoch_host_seconds``): the ratio is then ``other``'s over ``row``'s.
    """
    mine, theirs = row.get(key) or [], other.get(key) or []
    if not (row.get("interleaved") and other.get("interleaved")) or len(mine) != len(theirs):
        return None
    ratios = []
    for a, b in zip(mine, theirs):
        rounds = min(len(a), len(b))
        if rounds:
            ratios.append(np.asarray(b[:rounds], np.float64) / np.asarray(a[:rounds], np.float64))
    return ratios or None


def paired_ratio(
    row: dict, other: dict, level: float = 0.90
) -> Optional[Tuple[float, Tuple[float, float]]]:
    """``(estimate, interval)`` of ``row``'s throughput over ``other``'s, round by round.

    The estimate is the median of the per-round ratios of all processes; the
    interval holds the middle ``level`` of 2000 two-stage draws (processes,
    then rounds within each; fixed seed). None unless both rows come from the
    same interleaved processes.
    """
    ratios = round_ratios(row, other)
    if ratios is None:
        return None
    estimate = float(np.median(np.concatenate(ratios)))
    draws = _two_stage(ratios, BOOTSTRAP_DRAWS)
    tail = (1 - level) / 2 * 100
    return estimate, (float(np.percentile(draws, tail)), float(np.percentile(draws, 100 - tail)))


def paired_time_ratio(row: dict, other: dict, key: str = "epoch_host_seconds") -> Optional[float]:
    """The median, over every round of the same processes, of ``row``'s time over ``other``'s.

    For the Python thread's host time per batch (``epoch_host_seconds``); None
    unless both rows come from the same interleaved processes.
    """
    ratios = round_ratios(other, row, key)
    return None if ratios is None else float(np.median(np.concatenate(ratios)))


def paired_difference(
    times: Sequence[float], other: Sequence[float], level: float = 0.90
) -> Tuple[float, Tuple[float, float]]:
    """``(estimate, interval)`` of how much longer ``times`` took than ``other``, round by round.

    Both are the times of the same rounds of one process (an epoch each, as
    ``interleave.py`` trains them); the estimate is the median of the per-round
    differences, and the interval holds the middle ``level`` of 2000 bootstrap
    medians of those differences, drawn with replacement (fixed seed).
    """
    rounds = min(len(times), len(other))
    if not rounds:
        raise ValueError("no rounds to compare")
    differences = np.asarray(times[:rounds], np.float64) - np.asarray(other[:rounds], np.float64)
    draws = _two_stage([differences], BOOTSTRAP_DRAWS)
    tail = (1 - level) / 2 * 100
    return float(np.median(differences)), (
        float(np.percentile(draws, tail)),
        float(np.percentile(draws, 100 - tail)),
    )
