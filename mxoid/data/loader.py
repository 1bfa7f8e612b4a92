"""A Gluon ``DataLoader`` as an ``mx.io.DataIter``: for training, evaluation, and exact resumption.

The loop and :class:`~mxoid.extensions.Evaluate` read MXNet's data iterators:
named inputs of fixed shapes (``provide_data``, ``provide_label``), and
batches of ``batch_size`` rows whose last ``pad`` are padding.
:class:`DataLoaderIter` gives a ``DataLoader``'s batches so: the arrays of
each batch named in order, a short last batch padded.

It also makes a run with a ``DataLoader`` reproducible and resumable in the
middle of an epoch. The order of each epoch is drawn by the adapter, as the
loader would draw it, and kept (:class:`~mxoid.data.sampling.EpochOrder`);
each batch is loaded with the random generators seeded from the run's seed,
the epoch and the batch's number (:class:`~mxoid.data.sampling.SeededDataset`),
in this process or in a worker. A resumption gives the epoch's order back and
starts the workers at the next batch: the batches already trained on are not
loaded again.
"""

from __future__ import annotations

import os
import random
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import mxnet as mx
import numpy as np

from .sampling import RANDOM_STATE_LOCK, EpochOrder, KeyBatches, SeededDataset

__all__ = [
    "DataLoaderIter",
    "WorkerBatchify",
    "as_data_iter",
    "as_input_iter",
    "batchify_without_waiting",
]

Names = Union[str, Sequence[str]]

NOT_A_LOADER = "expected an mx.io.DataIter or an mx.gluon.data.DataLoader, got {kind}{hint}"
A_DATASET = (
    ": a Gluon Dataset is read through a loader, e.g. "
    "mx.gluon.data.DataLoader(dataset, batch_size=32, shuffle=True)"
)
NAMES_AND_ARRAYS = (
    "the DataLoader yields {count} array(s) per batch (shapes {shapes}), but {expected} "
    "name(s) were given: data_names={data_names}, label_names={label_names}. Name every array "
    "the loader yields, the data first, e.g. DataLoaderIter(loader, data_names={fix_data}, "
    "label_names={fix_label})"
)
OTHER_SHAPE = (
    "batch {batch} of the DataLoader has {name!r} of shape {shape} and type {dtype}, but its "
    "first batch had {first_shape} and {first_dtype}; DataLoaderIter gives arrays of fixed "
    "shapes: make the dataset's samples, or the loader's batchify_fn, of one shape"
)
ZERO_COPY_TYPES = ("float16", "float32", "float64", "uint8", "int8", "int32", "int64")
# A worker's batch array of at most this many bytes comes back pickled by value (see
# WorkerBatchify): passing a shared-memory file descriptor costs about 1 ms an array.
BY_VALUE_BYTES = 1 << 20
NO_BATCHES = "the DataLoader yields no batches: its dataset has {count} sample(s)"


def as_data_iter(
    obj: Any, data_names: Names = ("data",), label_names: Names = ("softmax_label",)
) -> Any:
    """Return ``obj`` as an ``mx.io.DataIter``.

    An ``mx.io.DataIter`` (or an object with ``provide_data``, ``provide_label``,
    ``reset`` and ``next``) is returned as it is; a Gluon ``DataLoader`` as a
    :class:`DataLoaderIter` with these names; anything else raises a ``TypeError``
    naming what is accepted.

    Examples
    --------
    >>> import mxnet as mx
    >>> import numpy as np
    >>> from mxoid.data import as_data_iter
    >>> it = mx.io.NDArrayIter(np.zeros((4, 2)), np.zeros(4), batch_size=2)
    >>> as_data_iter(it) is it
    True
    >>> as_data_iter([1, 2])
    Traceback (most recent call last):
    ...
    TypeError: expected an mx.io.DataIter or an mx.gluon.data.DataLoader, got list
    """
    if isinstance(obj, mx.io.DataIter) or all(
        hasattr(obj, name) for name in ("provide_data", "provide_label", "reset", "next")
    ):
        return obj
    if isinstance(obj, mx.gluon.data.DataLoader):
        return DataLoaderIter(obj, data_names=data_names, label_names=label_names)
    hint = A_DATASET if isinstance(obj, mx.gluon.data.Dataset) else ""
    raise TypeError(NOT_A_LOADER.format(kind=type(obj).__name__, hint=hint))


def as_input_iter(obj: Any, data_names: Names, label_names: Names) -> Any:
    """Return ``obj`` as :func:`as_data_iter` does, a ``DataLoader`` of data alone accepted too.

    For prediction, which reads no labels: a loader whose batches hold the
    data arrays only is named by ``data_names`` alone.
    """
    if not isinstance(obj, mx.gluon.data.DataLoader):
        return as_data_iter(obj, data_names, label_names)
    try:
        return DataLoaderIter(obj, data_names=data_names, label_names=label_names)
    except ValueError:
        if not label_names:
            raise
        return DataLoaderIter(obj, data_names=data_names, label_names=())


class DataLoaderIter(mx.io.DataIter):
    """A Gluon ``DataLoader`` read as an ``mx.io.DataIter``, resumable mid-epoch exactly.

    Use it where an iterator goes: ``MainLoop(net, DataLoaderIter(loader), ...)``,
    ``Evaluate({'valid': DataLoaderIter(valid_loader)}, ...)``. The arrays of
    each batch (``(data, label)``, or more, or one) are named in order by
    ``data_names`` then ``label_names``. ``provide_data`` and ``provide_label``
    have the shapes and types of the first batch (read when the adapter is
    built, and served first), with ``batch_size`` rows: the ``DataLoader``'s
    ``batch_size``, or for ``DataLoader(batch_sampler=...)`` the first batch's
    size. A shorter batch (``last_batch='keep'``) is padded to ``batch_size``
    rows by repeating its last row, and its ``pad`` says how many rows are
    padding, as ``mx.io.NDArrayIter(last_batch_handle='pad')`` says it: the
    loop's metrics and :class:`~mxoid.extensions.Evaluate` do not count them.
    Repeating a real row (rather than zeros) keeps every row a real sample: a
    valid label, finite values, BatchNorm's batch statistics and the training
    step of a padded batch made of real data, as ``NDArrayIter`` pads with the
    first rows of the data. ``'discard'`` and ``'rollover'`` are as the loader
    has them. With :attr:`keep_short` set (the loop sets it on the adapter it
    trains a Gluon block from), the short batch comes out at its real size
    instead, unpadded, with ``provide_data`` / ``provide_label`` of its own
    and ``batch.short`` True: the loop trains it as Gluon's
    ``trainer.step(real_rows)`` does (:mod:`mxoid.network.gluon`). Batches come
    out as the loader gives them: NDArrays on the CPU (``cpu_pinned`` with
    ``pin_memory=True``; from worker processes, with Gluon's batch function,
    arrays of up to 1 MiB on ``cpu``, sent by value, larger ones on
    ``cpu_shared``: :class:`WorkerBatchify`).

    The order of each epoch is the adapter's: it is drawn from the loader's
    sampler as ``iter(loader)`` would draw it, from the same NumPy state, so
    that the adapter serves the batches the bare loader would serve after the
    same ``np.random.seed(...)``: the first epoch's when the adapter is built,
    each next one at :meth:`reset`. :meth:`state_dict` keeps how to draw it
    again: for a ``SequentialSampler`` nothing, for a ``RandomSampler`` (a
    ``DataLoader(shuffle=True)``) NumPy's and Python's random states before
    its draw (the same draw is made again from them), for any other sampler
    or batch sampler the indices themselves; and the epoch, the batches
    served, the samples a ``'rollover'`` carried into the epoch, and the seed.
    :meth:`load_state_dict` gives the epoch's order back and the workers start
    at the next batch: the batches already served are not loaded again. The
    later epochs of a sampler of another kind come out as in the interrupted
    run if its order depends only on its earlier epochs (the adapter iterates
    it again as often, without loading anything) and on NumPy's and Python's
    global generators: a warning says so at resumption, unless the sampler has
    ``resets_are_deterministic = True``.

    Each batch is loaded with NumPy's and Python's global generators seeded
    from ``(seed, epoch, batch number)`` before its first sample, and in a
    worker process MXNet's CPU generator too (see
    :class:`~mxoid.data.sampling.SeededDataset`; in a thread pool, whose
    samples load in no fixed order, each sample from ``(seed, epoch, index)``;
    a dataset of arrays, which draws nothing, is read unseeded:
    :func:`~mxoid.data.sampling.draws_nothing`): a random augmentation is the
    same in two runs with the same seed and in a resumed epoch, with or
    without workers, and workers forked with one random state do not repeat
    each other's. In this process (``num_workers=0``,
    ``thread_pool=True``) MXNet's generator is left to the training, so an
    augmentation drawn by MXNet's random operators there is reproduced by
    ``mx.random.seed`` (and by a :class:`~mxoid.extensions.Checkpoint`'s
    reseeding), not by this seed; in a thread pool its draws from several
    threads come in no fixed order. Generators of the dataset's own (a
    ``np.random.RandomState`` attribute) are not seeded.

    The loader itself is not read: the adapter builds a ``DataLoader`` of its
    own with the same dataset (seeded), ``batchify_fn``, ``num_workers``,
    ``pin_memory``, ``pin_device_id``, ``prefetch``, ``thread_pool`` and
    ``timeout`` (so a ``DataLoader`` subclass' ``__iter__`` is not used, and
    the workers of a loader built with ``num_workers > 0`` stay idle).

    Parameters
    ----------
    loader : mx.gluon.data.DataLoader
        The loader, as built for a run.
    data_names : str or sequence of str, default ``('data',)``
        The names of the first arrays of each batch (the symbol's data inputs).
    label_names : str or sequence of str, default ``('softmax_label',)``
        The names of the arrays after them (the symbol's labels); ``()`` for a
        loader that yields data only.
    seed : int, optional
        The seed of the samples' random generators. By default one is drawn
        from NumPy's global generator without advancing it: ``np.random.seed(s)``
        before building the adapter reproduces a run. It is kept in
        :meth:`state_dict`.

    Attributes
    ----------
    seed : int
        The seed of the samples' random generators.
    epoch : int
        The current epoch, from 0.
    keep_short : bool
        Whether a short batch comes out at its real size (False: padded).

    Examples
    --------
    >>> import mxnet as mx
    >>> import numpy as np
    >>> from mxoid.data import DataLoaderIter
    >>> dataset = mx.gluon.data.ArrayDataset(np.ones((5, 2), "float32"), np.arange(5.0))
    >>> it = DataLoaderIter(mx.gluon.data.DataLoader(dataset, batch_size=2))
    >>> it.provide_data, it.provide_label
    ([DataDesc[data,(2, 2),<class 'numpy.float32'>,NCHW]], [DataDesc[softmax_label,(2,),<class 'numpy.float64'>,NCHW]])
    >>> [(batch.label[0].asnumpy().tolist(), batch.pad) for batch in it]
    [([0.0, 1.0], 0), ([2.0, 3.0], 0), ([4.0, 4.0], 1)]
    """  # noqa: E501

    def __init__(
        self,
        loader: Any,
        data_names: Names = ("data",),
        label_names: Names = ("softmax_label",),
        seed: Optional[int] = None,
    ) -> None:
        if not isinstance(loader, mx.gluon.data.DataLoader):
            raise TypeError(
                f"DataLoaderIter reads an mx.gluon.data.DataLoader, not {type(loader).__name__}"
                + (A_DATASET if isinstance(loader, mx.gluon.data.Dataset) else "")
            )
        self.data_names, self.label_names = (
            _names(data_names, "data_names"),
            _names(label_names, "label_names"),
        )
        if not self.data_names:
            raise ValueError("data_names must name at least one array")
        self.seed = _seed(seed)
        self._order = EpochOrder(loader._batch_sampler, len(loader._dataset))
        self._keys = KeyBatches()
        batchify = loader._batchify_fn
        gluon_data = mx.gluon.data.dataloader
        if batchify in (gluon_data.default_batchify_fn, gluon_data.default_mp_batchify_fn):
            batchify = WorkerBatchify(by_value=not loader._pin_memory)
        self._loader = mx.gluon.data.DataLoader(
            SeededDataset(loader._dataset, threads=loader._thread_pool),
            batch_sampler=self._keys,
            batchify_fn=batchify,
            num_workers=loader._num_workers,
            pin_memory=loader._pin_memory,
            pin_device_id=loader._pin_device_id,
            prefetch=loader._prefetch,
            thread_pool=loader._thread_pool,
            timeout=loader._timeout,
        )
        self.keep_short = False
        self._stream: Any = None  # the internal loader's iterator, from the next batch on
        # samples loaded by _read itself, the generators' states to give back
        self._in_process = loader._num_workers == 0 and self._loader._dataset.seeded
        self._served = 0  # batches of the epoch handed out
        self._order.draw(carry=False)
        if not self._order.batches:
            raise ValueError(NO_BATCHES.format(count=len(loader._dataset)))
        first = _arrays(self._read())
        self._check_names(first)
        self._peeked: Optional[List[mx.nd.NDArray]] = first
        size = self._order.batch_size or first[0].shape[0]
        self._descs = [
            mx.io.DataDesc(name, (size,) + array.shape[1:], array.dtype)
            for name, array in zip(self.data_names + self.label_names, first)
        ]
        super().__init__(size)

    # ------------------------------------------------------------ as a DataIter
    @property
    def provide_data(self) -> List[mx.io.DataDesc]:
        """The data arrays' names, shapes (``batch_size`` rows) and types."""
        return self._descs[: len(self.data_names)]

    @property
    def provide_label(self) -> List[mx.io.DataDesc]:
        """The label arrays' names, shapes (``batch_size`` rows) and types."""
        return self._descs[len(self.data_names) :]

    @property
    def epoch(self) -> int:
        """The current epoch, from 0."""
        return self._order.epoch

    def __len__(self) -> int:
        """Return the number of batches of the current epoch."""
        return len(self._order.batches)

    def next(self) -> mx.io.DataBatch:
        """Return the next batch of the epoch (``StopIteration`` at its end)."""
        if self._served >= len(self._order.batches):
            self._stream = None
            raise StopIteration
        arrays = self._peeked if self._peeked is not None else _arrays(self._read())
        self._peeked = None
        data, label, pad = self._batch(arrays)
        self._served += 1
        if pad < 0:  # a short batch kept at its real size
            rows = self.batch_size + pad
            descs = [mx.io.DataDesc(d.name, (rows,) + d.shape[1:], d.dtype) for d in self._descs]
            count = len(data)
            batch = mx.io.DataBatch(
                data, label, pad=0, provide_data=descs[:count], provide_label=descs[count:]
            )
            batch.short = True
            return batch
        return mx.io.DataBatch(
            data=data,
            label=label,
            pad=pad,
            index=None,
            provide_data=self.provide_data,
            provide_label=self.provide_label,
        )

    def iter_next(self) -> bool:
        """Move to the next batch (:meth:`getdata` ...); return False at the epoch's end."""
        try:
            self._current = self.next()
        except StopIteration:
            return False
        return True

    def getdata(self) -> List[mx.nd.NDArray]:
        """Return the data arrays of the batch :meth:`iter_next` moved to."""
        return self._current.data

    def getlabel(self) -> List[mx.nd.NDArray]:
        """Return the label arrays of the batch :meth:`iter_next` moved to."""
        return self._current.label

    def getpad(self) -> int:
        """Return the padding rows of the batch :meth:`iter_next` moved to."""
        return self._current.pad

    def getindex(self) -> None:
        """Return None: the batches have no index."""
        return None

    def reset(self) -> None:
        """Start the next epoch; nothing happens while no batch of this one was served.

        So ``reset()`` before a first epoch, or twice in a row, draws one order
        (as ``for batch in loader`` does once per loop over it). A ``'rollover'``
        epoch read to its end carries its leftover samples into the next.
        """
        if self._served == 0:
            return
        self._stream, self._peeked = None, None
        self._order.draw(carry=self._served == len(self._order.batches))
        self._served = 0

    # ------------------------------------------------------------ its position
    def state_dict(self) -> Dict[str, Any]:
        """Return the epoch's order, the batches served and the seed (JSON-ready)."""
        return {"seed": self.seed, "served": self._served, "order": self._order.state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue where :meth:`state_dict` was taken (this adapter built as for that run).

        Nothing is loaded until the next batch is asked for: the workers then
        load from the batch after those served.
        """
        self._order.load_state_dict(state["order"])
        served = state["served"]
        if isinstance(served, bool) or not isinstance(served, int):
            raise ValueError(f"the DataLoader's saved position is damaged: served={served!r}")
        if not 0 <= served <= len(self._order.batches):
            raise ValueError(
                f"the DataLoader's saved position is damaged: {served} batches served of the "
                f"epoch's {len(self._order.batches)}"
            )
        self.seed, self._served = _seed(state["seed"]), served
        self._stream, self._peeked = None, None

    # ------------------------------------------------------------ batches
    def _read(self) -> Any:
        """Return the next batch the internal loader gives, starting it where needed."""
        if self._stream is None:
            keys = self._keys
            keys.batches, keys.start = self._order.batches, self._served
            keys.seed, keys.epoch = self.seed, self._order.epoch
            self._stream = iter(self._loader)
        if not self._in_process:
            return next(self._stream)
        with RANDOM_STATE_LOCK:  # the samples seed the generators: their states given back
            numpy_state, python_state = np.random.get_state(), random.getstate()
            try:
                return next(self._stream)
            finally:
                np.random.set_state(numpy_state)
                random.setstate(python_state)

    def _check_names(self, arrays: List[mx.nd.NDArray]) -> None:
        expected = len(self.data_names) + len(self.label_names)
        if len(arrays) == expected:
            return
        count = len(arrays)
        fix_label = self.label_names[: max(0, count - 1)]
        fix_data = self.data_names[: count - len(fix_label)]
        fix_data += tuple(f"data{i}" for i in range(len(fix_data), count - len(fix_label)))
        raise ValueError(
            NAMES_AND_ARRAYS.format(
                count=count,
                shapes=[tuple(a.shape) for a in arrays],
                expected=expected,
                data_names=self.data_names,
                label_names=self.label_names,
                fix_data=fix_data,
                fix_label=fix_label,
            )
        )

    def _batch(self, arrays: List[mx.nd.NDArray]) -> Tuple[list, list, int]:
        """Return a batch's data, labels and padding: its arrays checked, padded to batch_size.

        With :attr:`keep_short`, a short batch is not padded: its padding is
        returned negative (the rows it lacks).
        """
        self._check_names(arrays)
        rows = arrays[0].shape[0]
        for desc, array in zip(self._descs, arrays):
            shape = (rows,) + desc.shape[1:]
            if (
                array.shape != shape
                or np.dtype(array.dtype) != np.dtype(desc.dtype)
                or (not 0 < rows <= self.batch_size)
            ):
                raise ValueError(
                    OTHER_SHAPE.format(
                        batch=self._served,
                        name=desc.name,
                        shape=array.shape,
                        dtype=np.dtype(array.dtype).name,
                        first_shape=desc.shape,
                        first_dtype=np.dtype(desc.dtype).name,
                    )
                )
        pad = self.batch_size - rows
        if pad and self.keep_short:
            pad = -pad
        elif pad:
            arrays = [
                mx.nd.concat(a, mx.nd.repeat(a[rows - 1 : rows], repeats=pad, axis=0), dim=0)
                for a in arrays
            ]
        count = len(self.data_names)
        return arrays[:count], arrays[count:], pad


def batchify_without_waiting(data: List[Any]) -> Any:
    """Return the batch Gluon's ``default_batchify_fn`` makes, made without waiting for MXNet.

    That function copies a batch of NumPy samples into a new NDArray, a copy
    that waits for every operator queued on the CPU before it (MXNet's engine
    runs it behind them): the host stops at each batch until the devices have
    trained the one before, and reading never overlaps training. Here the
    NumPy batch is shared with the NDArray instead (``mx.nd.from_numpy(...,
    zero_copy=True)``): the same values, type and shape, nothing queued, and
    the loop's copy into the executors is queued as any operator. Batches of
    NDArray samples, and types DLPack does not carry, are Gluon's own.

    Examples
    --------
    >>> import numpy as np
    >>> batch = batchify_without_waiting([(np.ones(2, "float32"), 0.0), (np.zeros(2, "float32"), 1.0)])
    >>> [(array.shape, array.dtype.__name__) for array in batch]
    [((2, 2), 'float32'), ((2,), 'float64')]
    """  # noqa: E501
    first = data[0]
    if isinstance(first, tuple):
        return [batchify_without_waiting(list(field)) for field in zip(*data)]
    if isinstance(first, (mx.nd.NDArray, mx.np.ndarray)) or mx.util.is_np_array():
        return mx.gluon.data.dataloader.default_batchify_fn(data)
    array = np.ascontiguousarray(np.asarray(data))
    if array.dtype.name not in ZERO_COPY_TYPES:
        return mx.gluon.data.dataloader.default_batchify_fn(data)
    return mx.nd.from_numpy(array, zero_copy=True)


class WorkerBatchify:
    """Gluon's default batches: :func:`batchify_without_waiting`'s, and by value from workers.

    In this process (no worker, or a thread pool) a batch is
    :func:`batchify_without_waiting`'s. In a worker process Gluon's own
    (``default_mp_batchify_fn``) puts each batch array in shared memory and
    the loader's process rebuilds it from a file descriptor passed through
    ``multiprocessing``'s resource sharer: a connection and an authentication
    per array, about 1 ms of the training thread's time each, more than a
    batch of small samples takes to train (2 of the 3 ms a batch of an MLP on
    the digits took on two loaded cores). Here an array of at most
    :data:`BY_VALUE_BYTES` comes back pickled by value, as a NumPy array (the
    adapter shares it with an NDArray, zero-copy); a larger one, or any with
    ``by_value`` False (``pin_memory=True``: Gluon pins NDArrays), in shared
    memory as Gluon's. The values, types and shapes are Gluon's.

    Parameters
    ----------
    by_value : bool
        Whether a worker sends small arrays by value.
    """

    def __init__(self, by_value: bool = True) -> None:
        self.by_value = by_value
        self._pid = os.getpid()

    def __call__(self, data: List[Any]) -> Any:
        """Return the batch of these samples (in this process, or in a worker)."""
        if os.getpid() == self._pid:
            return batchify_without_waiting(data)
        return _worker_batch(data, self.by_value)


def _worker_batch(data: List[Any], by_value: bool) -> Any:
    """Return a worker's batch: NumPy arrays up to BY_VALUE_BYTES, else Gluon's shared NDArrays."""
    first = data[0]
    if isinstance(first, tuple):
        return [_worker_batch(list(field), by_value) for field in zip(*data)]
    if isinstance(first, (mx.nd.NDArray, mx.np.ndarray)) or mx.util.is_np_array():
        return mx.gluon.data.dataloader.default_mp_batchify_fn(data)
    array = np.ascontiguousarray(np.asarray(data))
    if by_value and array.dtype.name in ZERO_COPY_TYPES and array.nbytes <= BY_VALUE_BYTES:
        return array
    return mx.gluon.data.dataloader.default_mp_batchify_fn(data)


def _names(names: Names, what: str) -> Tuple[str, ...]:
    if isinstance(names, str):
        names = (names,)
    names = tuple(names)
    if not all(isinstance(name, str) and name for name in names):
        raise TypeError(f"{what} must be names (non-empty strings), got {names!r}")
    return names


def _seed(seed: Optional[int]) -> int:
    if seed is None:  # drawn from NumPy's global generator, without advancing it
        generator = np.random.RandomState()
        with RANDOM_STATE_LOCK:
            generator.set_state(np.random.get_state())
        return int(generator.randint(0, 2**31 - 1))
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    return int(seed)


def _arrays(batch: Any) -> List[mx.nd.NDArray]:
    """Return a loader's batch as a list of NDArrays (``mx.np`` ones and NumPy's converted)."""
    items = list(batch) if isinstance(batch, (list, tuple)) else [batch]
    arrays = []
    for item in items:
        if isinstance(item, mx.np.ndarray):
            arrays.append(item.as_nd_ndarray())
        elif isinstance(item, mx.nd.NDArray):
            arrays.append(item)
        else:
            item = np.asarray(item)
            if item.dtype.name in ZERO_COPY_TYPES and item.flags.c_contiguous:
                arrays.append(mx.nd.from_numpy(item, zero_copy=True))  # a worker's, by value
            else:
                arrays.append(mx.nd.array(item, dtype=item.dtype))
    return arrays
