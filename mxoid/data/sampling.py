"""Which samples each epoch of a Gluon ``DataLoader`` loads, in which order, with which seeds.

:class:`~mxoid.data.loader.DataLoaderIter` takes the order of each epoch out
of the loader's hands, so that a checkpoint can put it back without loading
the batches already trained on:

- :class:`EpochOrder` draws an epoch's order as the loader would at
  ``iter(loader)`` (its sampler, from the same NumPy state), cuts it into
  batches as ``BatchSampler`` does (``'keep'``, ``'discard'``, or
  ``'rollover'`` carrying the leftover samples into the next epoch), and keeps
  what gives the order back: nothing for a ``SequentialSampler``; NumPy's and
  Python's global random states of the draw for a ``RandomSampler`` (the same
  draw is made again from them); the indices themselves for any other sampler
  or batch sampler.
- :class:`KeyBatches` hands the batches from the next one on to the loader's
  workers, each sample as a key ``(index, seed, epoch, batch)`` (``batch``:
  the batch's number in the epoch for its first sample, -1 for the others),
  and :class:`SeededDataset` seeds NumPy's and Python's generators (and in a
  worker process MXNet's CPU generator) before each batch's first sample, from
  the run's seed, the epoch and the batch's number (:func:`batch_seed`); a
  batch is loaded by one worker, its samples in order: a random augmentation
  is the same in every run with that seed, in a resumed epoch (which starts at
  a batch), and whatever the worker that loads it. On threads of this process
  (``thread_pool=True``), where a batch's samples load in no fixed order, each
  sample is seeded (:func:`sample_seed`).
"""

from __future__ import annotations

import hashlib
import os
import random
import warnings
from typing import Any, Dict, List, Optional, Tuple

import mxnet as mx
import numpy as np

from ..checkpoint.format import ResumeError
from ..checkpoint.random_state import (
    RANDOM_STATE_LOCK,
    check_random_states,
    get_random_states,
    set_random_states,
)
from .position import DETERMINISTIC_RESETS

__all__ = [
    "RANDOM_STATE_LOCK",
    "EpochOrder",
    "KeyBatches",
    "SeededDataset",
    "batch_seed",
    "draws_nothing",
    "sample_seed",
]

SEQUENTIAL, RANDOM, CAPTURED, BATCHES = "sequential", "random", "captured", "batches"
LAST_BATCH = ("keep", "discard", "rollover")
NOT_INDICES = (
    "DataLoaderIter needs a sampler that yields integer indices into the dataset; "
    "{sampler} yielded {value!r}"
)
OTHER_SAMPLER = (
    "DataLoaderIter resumed the epoch of a {sampler} from the order it saved; the later "
    "epochs come out as in the interrupted run only if that sampler's order depends on "
    "nothing but its earlier epochs (replayed: {replayed} iteration(s)) and NumPy's and "
    "Python's global generators (restored by the loop). Give the sampler an attribute "
    "{attribute} = True to say so and silence this warning, or use a SequentialSampler or "
    "RandomSampler (DataLoader(shuffle=...))"
)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """Return the 31-bit seed of sample ``index`` in epoch ``epoch`` of a run seeded ``seed``.

    Examples
    --------
    >>> sample_seed(0, 0, 0) == sample_seed(0, 0, 0) != sample_seed(0, 1, 0)
    True
    """
    digest = hashlib.blake2b(f"{seed}:{epoch}:{index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def batch_seed(seed: int, epoch: int, batch: int) -> int:
    """Return the 31-bit seed of the ``batch``-th batch of epoch ``epoch`` in a run seeded ``seed``.

    Examples
    --------
    >>> batch_seed(0, 0, 1) == batch_seed(0, 0, 1) != batch_seed(0, 1, 1) != sample_seed(0, 0, 1)
    True
    """
    digest = hashlib.blake2b(f"{seed}:{epoch}:batch {batch}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def draws_nothing(dataset: Any) -> bool:
    """Return whether loading a sample of ``dataset`` is known to draw no random number.

    True for arrays and sequences (NumPy's, MXNet's, lists, tuples) and for
    Gluon's ``ArrayDataset`` and ``SimpleDataset`` of those, exactly (not a
    subclass, not transformed): their samples are read by indexing alone, so
    seeding the generators before them changes nothing but the time it takes.

    Examples
    --------
    >>> import numpy as np
    >>> from mxnet.gluon.data import ArrayDataset
    >>> dataset = ArrayDataset(np.zeros((4, 2)), np.arange(4))
    >>> draws_nothing(dataset), draws_nothing(dataset.transform_first(lambda x: x + 1))
    (True, False)
    """
    data = mx.gluon.data.dataset
    if type(dataset) is data.ArrayDataset:
        return all(draws_nothing(part) for part in dataset._data)
    if type(dataset) is data.SimpleDataset:
        return draws_nothing(dataset._data)
    return type(dataset) in (np.ndarray, mx.nd.NDArray, mx.np.ndarray, list, tuple, range)


class SeededDataset:
    """A dataset whose item ``(index, seed, epoch, batch)`` is ``dataset[index]``, loaded seeded.

    Before a batch's first sample (``batch``: its number in the epoch; -1 for
    the other samples), NumPy's and Python's global generators are seeded with
    :func:`batch_seed`, and in a worker process (``num_workers > 0``) MXNet's
    CPU generator too (``mx.random.seed(value, ctx=mx.cpu())``). A batch is
    loaded by one worker (or by the reading thread), its samples in order, so
    each sample's draws are the same in every run and resumed epoch (which
    start at a batch), whichever worker loads it. Once a batch, not per
    sample: seeding costs time the augmentation itself does not take. MXNet's
    CPU generator re-seeds its 1,024 parallel generators, about 1.3 ms of CPU
    each time (per sample it made a worker 75 times slower on batches of 32
    small samples: 0.5 ms a batch unseeded, 40 ms seeded); NumPy's and
    Python's took about 17 us a sample together (3 times a NumPy jitter of 64
    values, 5 us), 0.5 us a sample once a batch of 32. On threads of this
    process (``thread_pool=True``), whose samples load in no fixed order, each
    sample is seeded with :func:`sample_seed` (its index). The generators are
    left as they are in a worker: they are the worker's own. A dataset that
    :func:`draws_nothing` is read as it is, nothing seeded (:attr:`seeded`
    False). In this process the generators are the training's: their states
    are given back after the sample (``thread_pool=True``: each sample loaded
    under :data:`RANDOM_STATE_LOCK`, one at a time) or after the batch
    (``num_workers=0``: by :class:`~mxoid.data.loader.DataLoaderIter`, which
    reads the batch under the lock), so that the training's own draws go on as
    without the loader. MXNet's generator is not touched there, as its state
    cannot be read back: MXNet's random operators in a transform draw from the
    training's generator.

    Parameters
    ----------
    dataset : Dataset
        The loader's dataset (anything with ``__getitem__`` and ``__len__``).
    threads : bool
        Whether samples are loaded on threads of this process (a thread pool).

    Attributes
    ----------
    seeded : bool
        Whether the generators are seeded before the samples (False for a
        dataset that :func:`draws_nothing`).
    """

    def __init__(self, dataset: Any, threads: bool) -> None:
        self.dataset = dataset
        self.threads = threads
        self.seeded = not draws_nothing(dataset)
        self._pid = os.getpid()

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: Tuple[int, int, int, int]) -> Any:
        index, seed, epoch, batch = key
        if not self.seeded:
            return self.dataset[index]
        if not self.threads:  # a batch's samples loaded in order: seeded before its first
            if batch >= 0:
                value = batch_seed(seed, epoch, batch)
                np.random.seed(value)
                random.seed(value)
                if os.getpid() != self._pid:  # a worker process
                    mx.random.seed(value, ctx=mx.cpu())
            return self.dataset[index]
        value = sample_seed(seed, epoch, index)
        with RANDOM_STATE_LOCK:
            numpy_state, python_state = np.random.get_state(), random.getstate()
            np.random.seed(value)
            random.seed(value)
            try:
                return self.dataset[index]
            finally:
                np.random.set_state(numpy_state)
                random.setstate(python_state)


class KeyBatches:
    """A batch sampler of dataset keys: an epoch's batches from ``start`` on.

    A key is ``(index, seed, epoch, batch)``, what :class:`SeededDataset`
    loads (``batch``: the batch's number in the epoch, from 0, for its first
    sample; -1 for the others). The batches to come are fixed when the loader
    calls ``iter()``.
    """

    def __init__(self) -> None:
        self.batches: List[List[int]] = []
        self.start, self.seed, self.epoch = 0, 0, 0

    def __iter__(self) -> Any:
        batches, seed, epoch = self.batches[self.start :], self.seed, self.epoch
        return (
            [(batch[0], seed, epoch, number)] + [(index, seed, epoch, -1) for index in batch[1:]]
            for number, batch in enumerate(batches, self.start)
        )

    def __len__(self) -> int:
        return len(self.batches) - self.start


def _kind(batch_sampler: Any) -> str:
    sampler_module = mx.gluon.data.sampler
    if type(batch_sampler) is not sampler_module.BatchSampler:
        return BATCHES
    sampler = type(batch_sampler._sampler)
    if sampler is sampler_module.SequentialSampler:
        return SEQUENTIAL
    return RANDOM if sampler is sampler_module.RandomSampler else CAPTURED


def _indices(values: Any, owner: Any) -> List[int]:
    """Return ``values`` as a list of ints; a ``TypeError`` naming ``owner`` if they are not."""
    values = list(values)
    array = np.asarray(values) if values else np.zeros(0, dtype=np.int64)
    if array.ndim == 1 and array.dtype.kind in "iu":
        return array.tolist()
    wrong = next(
        (v for v in values if isinstance(v, bool) or not isinstance(v, (int, np.integer))),
        values[0],
    )
    raise TypeError(NOT_INDICES.format(sampler=type(owner).__name__, value=wrong))


class EpochOrder:
    """The batches of sample indices of each epoch of a ``DataLoader``'s batch sampler.

    Parameters
    ----------
    batch_sampler : Sampler
        The loader's ``_batch_sampler``: MXNet's ``BatchSampler`` (around any
        sampler), or a batch sampler of the user's (``DataLoader(batch_sampler=...)``).
    num_samples : int
        The length of the loader's dataset.

    Attributes
    ----------
    batches : list of list of int
        The current epoch's batches of indices.
    epoch : int
        The current epoch, from 0 (-1 before the first :meth:`draw`).
    batch_size : int or None
        The ``BatchSampler``'s batch size; None for a batch sampler of the user's.
    """

    def __init__(self, batch_sampler: Any, num_samples: int) -> None:
        self.batch_sampler = batch_sampler
        self.kind = _kind(batch_sampler)
        self.num_samples = num_samples
        self.batch_size: Optional[int] = None
        self.last_batch: Optional[str] = None
        self.carried: List[int] = []  # rolled over into the current epoch
        self._leftover: List[int] = []  # to roll over into the next
        if self.kind != BATCHES:
            self.sampler = batch_sampler._sampler
            self.batch_size = int(batch_sampler._batch_size)
            self.last_batch = batch_sampler._last_batch
            if self.last_batch not in LAST_BATCH:
                raise ValueError(f"last_batch must be one of {LAST_BATCH}, got {self.last_batch!r}")
            self._leftover = _indices(batch_sampler._prev, batch_sampler)
        self.batches: List[List[int]] = []
        self.epoch = -1
        self._draw: Optional[Dict[str, Any]] = None  # RANDOM: the random states of the draw
        self._order: Optional[List[Any]] = None  # CAPTURED, BATCHES: what the sampler gave
        self._iterations = 0  # of the sampler, since it was wrapped

    def draw(self, carry: bool) -> None:
        """Start the next epoch: its order drawn as ``iter(loader)`` draws it.

        ``carry``: whether the leftover of a ``'rollover'`` epoch goes into this one
        (the previous epoch was read to its end).
        """
        carried = self._leftover if carry else []
        with RANDOM_STATE_LOCK:
            self._draw = get_random_states() if self.kind == RANDOM else None
            order = self._iterate()
        self._order = order if self.kind in (CAPTURED, BATCHES) else None
        self.epoch += 1
        self._cut(order, carried)

    def _iterate(self) -> List[Any]:
        self._iterations += 1
        if self.kind == BATCHES:
            return [_indices(batch, self.batch_sampler) for batch in self.batch_sampler]
        return _indices(self.sampler, self.sampler)

    def _cut(self, order: List[Any], carried: List[int]) -> None:
        """Set the epoch's batches, as ``BatchSampler`` cuts them, and its leftover."""
        self.carried, self._leftover = list(carried), []
        if self.kind == BATCHES:
            self.batches = order
            return
        indices, size = self.carried + order, self.batch_size
        assert size is not None
        whole = len(indices) // size * size
        self.batches = [indices[i : i + size] for i in range(0, whole, size)]
        if whole < len(indices):
            if self.last_batch == "keep":
                self.batches.append(indices[whole:])
            elif self.last_batch == "rollover":
                self._leftover = indices[whole:]

    # ------------------------------------------------------------ its state
    def state_dict(self) -> Dict[str, Any]:
        """Return what gives this epoch's batches back (plain data)."""
        return {
            "sampler": self.kind,
            "epoch": self.epoch,
            "num_samples": self.num_samples,
            "batch_size": self.batch_size,
            "last_batch": self.last_batch,
            "carried": list(self.carried),
            "draw": self._draw,
            "order": self._order,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Give back the epoch of :meth:`state_dict`, without drawing from the global generators.

        Raises :class:`~mxoid.checkpoint.format.ResumeError` when the state is of
        another loader (sampler, number of samples, batch size, last batch).
        """
        self._check(state)
        if self.kind == RANDOM:
            with RANDOM_STATE_LOCK:
                now = get_random_states()
                set_random_states(state["draw"])
                try:  # the same draw from the same states
                    order = _indices(self.sampler, self.sampler)
                finally:
                    set_random_states(now)
        elif self.kind == SEQUENTIAL:
            order = _indices(self.sampler, self.sampler)
        else:
            order = state["order"]
            self._replay(state["epoch"] + 1)
        self.epoch, self._draw = state["epoch"], state["draw"]
        self._order = order if self.kind in (CAPTURED, BATCHES) else None
        self._cut(order, state["carried"])

    def _replay(self, iterations: int) -> None:
        """Iterate the sampler until it has been as often as the saved run's; warn unless told."""
        owner = self.batch_sampler if self.kind == BATCHES else self.sampler
        replayed = max(0, iterations - self._iterations)
        with RANDOM_STATE_LOCK:
            now = get_random_states()
            try:
                for _ in range(replayed):
                    self._iterate()
            finally:
                set_random_states(now)
        if not getattr(owner, DETERMINISTIC_RESETS, False):
            warnings.warn(
                OTHER_SAMPLER.format(
                    sampler=type(owner).__name__, replayed=replayed, attribute=DETERMINISTIC_RESETS
                ),
                stacklevel=4,
            )

    def _check(self, state: Dict[str, Any]) -> None:
        def refuse(what: str, saved: Any, here: Any) -> None:
            raise ResumeError(
                f"the DataLoader being resumed had {what} {saved!r}, this one has {here!r}; "
                "resume with the loader built as for the interrupted run"
            )

        for key, what, here in (
            ("sampler", "a sampler of kind", self.kind),
            ("num_samples", "a number of samples", self.num_samples),
            ("batch_size", "a batch size", self.batch_size),
            ("last_batch", "last_batch", self.last_batch),
        ):
            if state.get(key) != here:
                refuse(what, state.get(key), here)
        problem = None
        carried = state.get("carried")
        if not isinstance(carried, list) or not all(type(i) is int for i in carried):
            problem = "carried"
        elif self.kind == RANDOM:
            problem = check_random_states(state.get("draw"))
        elif self.kind in (CAPTURED, BATCHES) and not isinstance(state.get("order"), list):
            problem = "no order"
        if problem is not None or not isinstance(state.get("epoch"), int):
            raise ValueError(f"the DataLoader's saved position is damaged: {problem or 'epoch'}")
