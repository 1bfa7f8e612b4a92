"""Where the training iterator stands, so that training can resume mid-epoch.

A checkpoint must put the training iterator back exactly where it was:
same order of samples, same next batch. How depends on the iterator:

- ``mx.io.NDArrayIter`` is repositioned directly. Its shuffle is cumulative
  (each ``reset()`` permutes the already permuted data), so its current
  order is kept as a permutation of the order it had when training started
  (which a freshly built, identically seeded iterator has again), together
  with its ``idx`` and ``cursor``. With ``last_batch_handle='roll_over'``
  the rows an epoch left over for the next are taken again from that order.
- An iterator with ``state_dict()`` / ``load_state_dict()`` methods restores
  itself.
- Any other iterator is replayed: a freshly built one is reset as many times
  as the interrupted run's had been (once per finished epoch), with NumPy's
  and Python's random states of each reset restored before it (the
  checkpoint keeps them all, one pair an epoch: about 14 kB of JSON), and the
  batches already trained in the epoch are read and skipped. (A checkpoint
  of mxoid 0.4 kept only the last epoch's states: resuming it past its
  second epoch is warned of as inexact.) That is exact when the iterator's
  order depends on nothing but how many times it was reset: MXNet's
  ``ImageRecordIter(round_batch=False)``
  (its shuffle has its own seed), or an iterator that shuffles from NumPy's
  global generator at each reset, from the same order each time. Nothing can
  tell, so a warning says the resumption may not be exact, unless the
  iterator has an attribute ``resets_are_deterministic = True``. (MXNet's
  ``ImageRecordIter`` with its default ``round_batch=True`` carries samples
  over from one epoch to the next, and then reports ``pad`` inconsistently:
  its resumption is not exact, and an evaluation iterator should use
  ``round_batch=False``.)
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Dict, List, Optional

import mxnet as mx
import numpy as np

from ..checkpoint.format import LOOP_STATE, CheckpointError, ResumeError
from ..checkpoint.random_state import check_random_states, get_random_states, set_random_states
from .sentences import SentencePosition, is_bucket_sentence_iter

__all__ = ["DETERMINISTIC_RESETS", "DataPosition", "batches_per_epoch"]

DETERMINISTIC_RESETS = "resets_are_deterministic"
"""An iterator with this attribute true says that its order depends only on how many
times it was reset: its replay on resumption is exact, and no warning is given."""
EARLIER_STATES_MISSING = (
    "{kind} is replayed over {resets} resets, but checkpoint {where} keeps the random states "
    "of its last reset only (an mxoid 0.4 checkpoint): the earlier resets draw from other "
    "states, and the order of its batches may differ from the interrupted run's. Resume from "
    "a checkpoint of this version, or give the iterator state_dict() / load_state_dict()"
)
REPLAYED = (
    "{kind} cannot be repositioned directly: it is reset {resets} time(s) and {skips} "
    "batch(es) are skipped to reach the checkpoint's position. That is exact only if its "
    "order depends on nothing but how many times it was reset (MXNet's "
    "ImageRecordIter(round_batch=False) does; round_batch=True does not). Give the iterator "
    "state_dict() / load_state_dict() to resume it exactly, or set its attribute "
    "{attribute} = True to say its resets are deterministic"
)


def _repositionable(iterator: Any) -> bool:
    return isinstance(iterator, mx.io.NDArrayIter)


def _shapes(iterator: Any) -> List[List[Any]]:
    return [
        [d[0], list(d[1])] for d in list(iterator.provide_data) + list(iterator.provide_label or [])
    ]


class DataPosition:
    """Follows the training iterator across epochs and puts it back on resumption.

    The main loop calls :meth:`reset` instead of ``iterator.reset()`` at the
    start of each epoch but the first.

    Parameters
    ----------
    iterator : mx.io.DataIter
        The training iterator, as freshly built (before any epoch).
    """

    def __init__(self, iterator: Any) -> None:
        self.iterator = iterator
        self._direct = _repositionable(iterator)
        self._order: Optional[np.ndarray] = None  # NDArrayIter's data order vs. at start
        self._epoch_start_random: Optional[Dict[str, Any]] = None
        self._epoch_start_randoms: List[Dict[str, Any]] = []  # each reset's, for a replay
        self._where = "?"  # the checkpoint resumed from, once checked
        self._sentences = SentencePosition(iterator) if is_bucket_sentence_iter(iterator) else None

    def reset(self) -> None:
        """Reset the iterator for a new epoch, keeping track of its order."""
        if self._sentences is not None:
            self._sentences.reset()
            return
        if not self._direct:
            self._epoch_start_random = get_random_states()
            self._epoch_start_randoms.append(self._epoch_start_random)
        self.iterator.reset()
        if self._direct and self.iterator.shuffle:
            current = np.asarray(self.iterator.idx)
            self._order = current.copy() if self._order is None else self._order[current]

    def state_dict(self) -> Dict[str, Any]:
        """Return the position (JSON-ready). Called at a checkpoint."""
        it = self.iterator
        shapes = _shapes(it)
        if self._direct:
            return {
                "kind": "ndarrayiter",
                "cursor": int(it.cursor),
                "idx": np.asarray(it.idx).tolist(),
                "num_data": int(it.num_data),
                "order": None if self._order is None else self._order.tolist(),
                "rolled_over": it._cache_data is not None or it._cache_label is not None,
                "shapes": shapes,
            }
        if self._sentences is not None:
            return {"kind": "bucketsentenceiter", **self._sentences.state_dict(), "shapes": shapes}
        if hasattr(it, "state_dict") and hasattr(it, "load_state_dict"):
            return {"kind": "own", "state": it.state_dict(), "shapes": shapes}
        return {
            "kind": "replay",
            "epoch_start_random": self._epoch_start_random,
            "epoch_start_randoms": list(self._epoch_start_randoms),
            "shapes": shapes,
        }

    def check(self, state: Dict[str, Any], where: str, *, resharded: bool = False) -> None:
        """Raise when this iterator cannot continue from ``state``, saved in checkpoint ``where``.

        :class:`ResumeError` when the iterator is not the one of ``state``:
        other inputs or shapes, another kind, or (``NDArrayIter``) another
        number of samples. :class:`CheckpointError` when ``state`` contradicts
        itself (an ``NDArrayIter``'s order that is not one of its samples, a
        cursor outside them): the checkpoint is damaged. ``resharded``: this
        iterator is another share of the data (another number of workers), so
        only its inputs and kind are compared; it does not continue from
        ``state`` (:meth:`skip_epoch`).
        """

        def refuse(what: str) -> None:
            raise ResumeError(
                f"checkpoint {where} was trained on other data: {what}. Resume "
                "with the training iterator built as for the interrupted run"
            )

        if state.get("shapes") is not None and state["shapes"] != _shapes(self.iterator):
            refuse(
                f"its inputs were {state['shapes']}, this iterator gives {_shapes(self.iterator)}"
            )
        kind = "ndarrayiter" if self._direct else None
        if state["kind"] == "ndarrayiter" and kind != "ndarrayiter":
            refuse(f"it was an mx.io.NDArrayIter, this is a {type(self.iterator).__name__}")
        if (state["kind"] == "bucketsentenceiter") != (self._sentences is not None):
            refuse(f"it was a {state['kind']} iterator, this is a {type(self.iterator).__name__}")
        if resharded:
            self._where = where
            return
        if self._sentences is not None:
            problem = self._sentences.problem(state)
            if problem is not None and problem.startswith("sizes"):
                refuse(f"its buckets' {problem}")
            if problem is not None:
                raise CheckpointError(
                    f"checkpoint file {os.path.join(where, LOOP_STATE)} is damaged: its "
                    f"'data_position.{problem}; use an earlier checkpoint"
                )
        for index, random_state in enumerate(state.get("epoch_start_randoms") or ()):
            problem = check_random_states(random_state)
            if problem is not None:
                raise CheckpointError(
                    f"checkpoint file {os.path.join(where, LOOP_STATE)} is damaged: its "
                    f"'data_position.epoch_start_randoms[{index}]' is malformed: {problem}; "
                    "use an earlier checkpoint"
                )
        self._where = where
        if kind == "ndarrayiter" and state["kind"] == "ndarrayiter":
            saved = state.get("num_data", len(state.get("idx") or ()))
            if saved != self.iterator.num_data:
                refuse(f"it had {saved} samples, this iterator has {self.iterator.num_data}")
            problem = _ndarrayiter_problem(state, saved, self.iterator.batch_size)
            if problem is not None:
                raise CheckpointError(
                    f"checkpoint file {os.path.join(where, LOOP_STATE)} is damaged: its "
                    f"'data_position.{problem}; use an earlier checkpoint"
                )

    def restore(
        self,
        state: Dict[str, Any],
        epochs_done: int,
        epoch_started: bool,
        batches_done_in_epoch: int,
    ) -> None:
        """Put a freshly built iterator where :meth:`state_dict` found the old one.

        Parameters
        ----------
        state : dict
            From :meth:`state_dict`.
        epochs_done, epoch_started, batches_done_in_epoch :
            The loop's counters at the checkpoint.
        """
        kind = state["kind"]
        it = self.iterator
        if kind == "ndarrayiter" and self._direct:
            self._restore_ndarrayiter(state)
        elif kind == "bucketsentenceiter":
            self._sentences.restore(state)
        elif kind == "own":
            it.load_state_dict(state["state"])
        else:
            self._replay(state, epochs_done, epoch_started, batches_done_in_epoch)

    def skip_epoch(self) -> None:
        """Put the freshly built iterator at the end of its epoch: no batch until the next reset.

        For a job resumed mid-epoch by another number of workers, whose shards
        cannot continue the interrupted epoch exactly. An ``NDArrayIter`` is
        moved there; any other iterator reads the rest of its epoch.
        """
        it = self.iterator
        if self._direct:
            it.cursor = it.num_data  # its next batch would start past the data
            return
        for _ in it:
            pass

    def _restore_ndarrayiter(self, state: Dict[str, Any]) -> None:
        it = self.iterator
        order = state["order"]
        if order is not None:
            self._order = np.asarray(order, dtype=np.int64)
            it.data = [(name, _take(array, self._order)) for name, array in it.data]
            it.label = [(name, _take(array, self._order)) for name, array in it.label]
            it.data_list = [x[1] for x in it.data] + [x[1] for x in it.label]
        it.idx = np.asarray(state["idx"], dtype=it.idx.dtype)
        it.cursor = int(state["cursor"])
        if state.get("rolled_over"):  # the rows the epoch left over, as NDArrayIter keeps them
            it._cache_data = it._batchify(it.data)
            it._cache_label = it._batchify(it.label)

    def _replay(
        self,
        state: Dict[str, Any],
        epochs_done: int,
        epoch_started: bool,
        batches_done_in_epoch: int,
    ) -> None:
        """Reset the fresh iterator as often as the interrupted run's was, then skip batches.

        Each reset from the random states its own reset drew from; the
        batches skipped are those already trained in the epoch.
        """
        epoch_start_random = state.get("epoch_start_random")
        randoms = state.get("epoch_start_randoms")
        it = self.iterator
        # The loop resets the iterator at the start of every epoch but the first. At an
        # epoch boundary the loop's own reset of the next epoch is still to come.
        resets = epochs_done if epoch_started else max(0, epochs_done - 1)
        skips = batches_done_in_epoch if epoch_started else 0
        if not getattr(it, DETERMINISTIC_RESETS, False):
            warnings.warn(
                REPLAYED.format(
                    kind=type(it).__name__,
                    resets=resets,
                    skips=skips,
                    attribute=DETERMINISTIC_RESETS,
                ),
                stacklevel=4,
            )
        if randoms is None or len(randoms) != resets:  # mxoid 0.4's: the last reset's only
            if resets > 1:
                warnings.warn(
                    EARLIER_STATES_MISSING.format(
                        kind=type(it).__name__,
                        resets=resets,
                        where=self._where,
                    ),
                    stacklevel=4,
                )
            randoms = [None] * (resets - 1) + [epoch_start_random] if resets else []
        for random_state in randoms:
            if random_state is not None:
                set_random_states(random_state)  # the random states of this very reset
            it.reset()
        self._epoch_start_random = epoch_start_random
        self._epoch_start_randoms = [r for r in randoms if r is not None]
        for _ in range(skips):
            next(it)


def _ndarrayiter_problem(state: Dict[str, Any], num_data: int, batch_size: int) -> Optional[str]:
    """Return what is inconsistent in an ``NDArrayIter``'s saved position, naming the field."""

    def permutation(values: Any) -> bool:
        return (
            isinstance(values, list)
            and len(values) == num_data
            and all(isinstance(v, int) and not isinstance(v, bool) for v in values)
            and sorted(values) == list(range(num_data))
        )

    if not permutation(state.get("idx")):
        return f"idx' is not an order of the iterator's {num_data} samples"
    if state.get("order") is not None and not permutation(state["order"]):
        return f"order' is not an order of the iterator's {num_data} samples"
    cursor = state.get("cursor")
    if (
        not isinstance(cursor, int)
        or isinstance(cursor, bool)
        or not -batch_size <= cursor < num_data + batch_size
    ):
        return f"cursor' is {cursor!r}, outside the iterator's {num_data} samples"
    return None


def _take(array: Any, order: np.ndarray) -> Any:
    # The same copy NDArrayIter's own shuffle makes.
    if isinstance(array, mx.nd.NDArray):
        return mx.nd.array(array.asnumpy()[order], array.context, dtype=array.dtype)
    return array[order]


def batches_per_epoch(data: Any) -> Optional[int]:
    """Return how many batches an epoch of ``data`` has, or None when it cannot tell.

    Uses ``len(data)`` when defined, ``mx.io.ResizeIter``'s size,
    ``mx.rnn.BucketSentenceIter``'s batches, and
    ``mx.io.NDArrayIter``'s ``num_data`` and ``batch_size``: a padded last
    batch counts, a discarded one does not, and ``'roll_over'`` (whose
    epochs differ in length) gives None.
    """
    try:
        return len(data)
    except TypeError:
        pass
    if isinstance(data, mx.io.ResizeIter):
        return int(data.size)
    if is_bucket_sentence_iter(data):
        return len(data.idx)
    if isinstance(data, mx.io.NDArrayIter):
        count, size = data.num_data, data.batch_size
        if data.last_batch_handle == "pad":
            return -(-count // size)
        if data.last_batch_handle == "discard":
            return count // size
    return None
