"""How sure a ratio or a difference is: bootstrap intervals (NumPy only).

Contenders in turns in the same processes: ratios round by round, drawn over the
processes, then their rounds (:func:`paired_ratio`). Contenders in processes of their
own: the ratio of medians, drawn over each one's processes, then epochs.
"""

from itertools import zip_longest
from typing import List, Optional, Sequence, Tuple

import numpy as np

BOOTSTRAP_DRAWS = 2000
LEVEL = 0.90


def two_stage(runs: Sequence[np.ndarray], draws: int = BOOTSTRAP_DRAWS, seed: int = 0):
    """Medians of ``draws`` two-stage resamples: runs with replacement, then values in each.

    All draws at once, as arrays: each draw picks ``len(runs)`` runs, then as many values
    of each picked run as it holds, with replacement (a run's values in a row padded to
    the longest run's length, the padding left out of the median).
    """
    rng = np.random.RandomState(seed)
    sizes = np.array([len(run) for run in runs])
    table = np.array(list(zip_longest(*runs, fillvalue=np.nan)), float).reshape(-1, len(runs)).T
    chosen = rng.randint(len(runs), size=(draws, len(runs)))
    size = sizes[chosen][..., None]  # (draws, runs, 1): each picked run's number of values
    picks = (rng.random_sample(chosen.shape + table.shape[1:]) * size).astype(np.int64)
    values = np.where(np.arange(table.shape[1]) < size, table[chosen[..., None], picks], np.nan)
    return np.nanmedian(values.reshape(draws, -1), axis=1)  # the padding left out


def middle(draws: np.ndarray, level: float = LEVEL) -> Tuple[float, float]:
    """The interval holding the middle ``level`` of the draws."""
    tail = (1 - level) / 2 * 100
    return float(np.percentile(draws, tail)), float(np.percentile(draws, 100 - tail))


def ratio_interval(row: dict, other: dict, level: float = LEVEL) -> Optional[Tuple[float, float]]:
    """The interval of ``row``'s median throughput over ``other``'s, unpaired.

    Rows hold ``samples_per_epoch`` and ``epoch_seconds`` (a list of epoch times per
    process); each draw resamples both rows' processes, then the epochs within each
    drawn one (fixed seeds). None without epochs.
    """
    runs = []
    for entry in (row, other):
        runs_seconds = [np.asarray(run, np.float64) for run in entry.get("epoch_seconds") or ()]
        rates = [entry["samples_per_epoch"] / run for run in runs_seconds if len(run)]
        if not rates:
            return None
        runs.append(rates)
    return middle(two_stage(runs[0], seed=0) / two_stage(runs[1], seed=1), level)


def round_ratios(row: dict, other: dict, key: str = "epoch_seconds") -> Optional[List[np.ndarray]]:
    """Per process, ``row``'s throughput over ``other``'s in each round both timed.

    Both rows must come from the same interleaved processes, in the same order;
    None otherwise. With ``key`` naming other times per round (``epoch_host_seconds``)
    the ratio is ``other``'s time over ``row``'s.
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


def paired_ratio(row: dict, other: dict, level: float = LEVEL):
    """``(estimate, interval)`` of ``row``'s throughput over ``other``'s, round by round:
    the median of the rounds' ratios, and two-stage draws (processes, then rounds).
    None unless both rows come from the same interleaved processes."""
    ratios = round_ratios(row, other)
    if ratios is None:
        return None
    return float(np.median(np.concatenate(ratios))), middle(two_stage(ratios), level)


def paired_time_ratio(row: dict, other: dict, key: str = "epoch_host_seconds") -> Optional[float]:
    """The median over the rounds of ``row``'s time over ``other``'s (None if unpaired)."""
    ratios = round_ratios(other, row, key)
    return None if ratios is None else float(np.median(np.concatenate(ratios)))


def paired_difference(times: Sequence[float], other: Sequence[float], level: float = LEVEL):
    """``(estimate, interval)`` of how much longer ``times`` took than ``other``, both the
    times of the same rounds of one process: the median of the rounds' differences, and
    the middle ``level`` of bootstrap medians of those differences."""
    rounds = min(len(times), len(other))
    if not rounds:
        raise ValueError("no rounds to compare")
    differences = np.asarray(times[:rounds], np.float64) - np.asarray(other[:rounds], np.float64)
    return float(np.median(differences)), middle(two_stage([differences]), level)
