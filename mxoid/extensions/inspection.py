"""Looking inside the network while it trains: :class:`Monitor`, as ``mx.mon.Monitor``."""

from __future__ import annotations

import ctypes
import math
import re
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set, Tuple, Union

import mxnet as mx
import numpy as np

from ..executor_manager.devices import one_random_generator
from ..log.records import MONITOR_PREFIX
from .base import Extension

if TYPE_CHECKING:  # pragma: no cover
    from ..main_loop import MainLoop

__all__ = ["STATS", "Monitor"]

Stat = Callable[[mx.nd.NDArray], mx.nd.NDArray]


def _rms(x: mx.nd.NDArray) -> mx.nd.NDArray:
    return mx.nd.norm(x) / math.sqrt(x.size)


STATS: Dict[str, Stat] = {
    "rms": _rms,
    "norm": lambda x: mx.nd.norm(x),
    "mean_abs": lambda x: mx.nd.mean(mx.nd.abs(x)),
    "max_abs": lambda x: mx.nd.max(mx.nd.abs(x)),
    "mean": lambda x: mx.nd.mean(x),
}
"""Statistics by name. ``'rms'``, ``norm(x) / sqrt(x.size)``, is ``mx.mon.Monitor``'s default."""
_LOW_PRECISION = (np.dtype(np.float16), np.dtype([("bfloat16", np.uint16)]))


def _widened(x: mx.nd.NDArray) -> mx.nd.NDArray:
    """Return ``x`` as float32 where it is bfloat16 or float16 (mixed precision's arrays)."""
    return mx.nd.amp_cast(x, dtype="float32") if np.dtype(x.dtype) in _LOW_PRECISION else x


class Monitor(Extension):
    """Statistics of the network's arrays every N batches, as ``mx.mon.Monitor`` in Module.fit.

    On every ``every_n_batches``-th batch (batches N, 2N, ...) it collects,
    for every array whose name matches ``pattern`` (``re.match``, as
    ``mx.mon.Monitor``), one statistic:

    - the outputs of every operator in the forward and the backward pass
      (``fc1_output``; ``fc1_backward_output1``, the gradient of the second
      input of ``fc1``, its weight), as MXNet's monitor callback names them;
      with ``monitor_all=True`` their inputs too;
    - after the optimizer step, the arguments (weights, data, labels) and the
      auxiliary states (BatchNorm's statistics).

    Each becomes the record ``monitor_<name>_<stat>`` in the row of that
    batch (of the first device; every device trains the same network on its
    slice of the batch). ``mx.mon.Monitor`` prints the same values; it fires
    on batches 1, N + 1, ..., so the two agree batch for batch when its
    ``step`` starts at 1.

    On CPUs it costs nothing on the other batches: the callback sits on a
    twin of each training executor that shares all its arrays
    (:meth:`~mxoid.DataParallelExecutorManager.bind_twins`), and only the
    monitored batches run on the twins. But a twin's random operators
    (``Dropout``) draw from the executor's generators only where MXNet keeps
    one for the CPU (:func:`~mxoid.devices.one_random_generator`).
    Elsewhere (GPUs, ``MXNET_CPU_PARALLEL_RAND_COPY`` > 1) the callback sits on
    the first training executor, as ``Module.fit`` installs ``mx.mon.Monitor``:
    that executor then runs its operators one at a time, calling the callback
    for each, on every batch. Either way training is the same, bit for bit,
    with or without the Monitor. A monitored batch waits for the engine when
    its values are read; an output is recorded as the batch's training pass
    computed it, and so are the inputs (``data``, the labels), even where
    another extension runs an evaluation on the training executors before or
    after it.

    Parameters
    ----------
    pattern : str, default '.*'
        E.g. ``'.*weight|.*output'`` (weights and outputs), ``'.*backward.*'``
        (gradients).
    every_n_batches : int, default 100
    stat : str or callable, default 'rms'
        A name of :data:`STATS` (``'rms'``, ``'norm'``, ``'mean_abs'``,
        ``'max_abs'``, ``'mean'``) or a function of an NDArray returning a
        one-element NDArray (the record then ends in ``stat_name``).
    stat_name : str, optional
        The record suffix of a function ``stat`` (its ``__name__`` by default).
    monitor_all : bool, default False
        Also the inputs of every operator, as ``mx.mon.Monitor(monitor_all=True)``.
    **kwargs
        Options of :class:`Extension` (``name``, ``priority``); it fires on
        its own schedule, so firing conditions are not taken.

    Examples
    --------
    >>> from mxoid import Monitor
    >>> monitor = Monitor(".*weight|.*backward.*", every_n_batches=50, stat="norm")
    """

    def __init__(
        self,
        pattern: str = ".*",
        every_n_batches: int = 100,
        stat: Union[str, Stat] = "rms",
        stat_name: Optional[str] = None,
        monitor_all: bool = False,
        **kwargs: Any,
    ) -> None:
        if (
            isinstance(every_n_batches, bool)
            or not isinstance(every_n_batches, int)
            or every_n_batches < 1
        ):
            raise ValueError(f"every_n_batches must be an int >= 1, got {every_n_batches!r}")
        if isinstance(stat, str):
            if stat not in STATS:
                raise ValueError(f"unknown stat {stat!r}; the names are {sorted(STATS)}")
            self.stat, self.stat_name = STATS[stat], stat_name or stat
        elif callable(stat):
            self.stat = stat
            self.stat_name = stat_name or getattr(stat, "__name__", "stat")
        else:
            raise TypeError(f"stat must be a name or a function, got {type(stat).__name__}")
        try:
            self.pattern = re.compile(pattern)
        except (re.error, TypeError) as error:
            raise ValueError(f"pattern {pattern!r} is not a regular expression: {error}") from None
        super().__init__(**kwargs)
        self.every_n_batches = every_n_batches
        self.monitor_all = monitor_all
        self._active = False
        self._queue: Dict[str, mx.nd.NDArray] = {}
        self._twins: List[mx.executor.Executor] = []
        self._watched: Optional[mx.executor.Executor] = None
        self._watching: Dict[int, Tuple[Any, List[mx.executor.Executor]]] = {}  # by set
        self._input_names: Set[str] = set()
        self._inputs_pending = False

    def attach(self, loop: MainLoop) -> None:
        """Install the callback on the first device's twin executor (or training executor)."""
        super().attach(loop)
        manager = self._manager = loop.manager
        self._input_names = set(manager.data_names) | set(manager.label_names)
        # Kept on the instance: MXNet holds only a raw pointer to the callback.
        self._callback = self._collect
        self._watching = {}
        self._watch(manager.training_set)

    def _watch(self, executors: Any) -> None:
        """Watch the executor set that trains the next batch (a bucket's: bound on first use).

        Its twins are bound, and the callback installed on the first one, once per set.
        """
        watched = self._watching.get(id(executors))
        if watched is None:
            if one_random_generator(self._manager.contexts):
                twins = executors.bind_twins()
                watched = (twins[0], twins)
            else:
                watched = (executors.executors[0], [])
            watched[0].set_monitor_callback(self._callback, self.monitor_all)
            self._watching[id(executors)] = watched  # the manager keeps every set it bound
        self._watched, self._twins = watched

    def _collect(self, name: Any, handle: Any) -> None:
        # Only the batch's training pass: not an evaluation on the training executors
        # that another extension's hook runs before or after it.
        if not self._active or not self._manager.training_pass:
            return
        if self._inputs_pending:  # the batch is loaded: its inputs, before anything else is
            self._inputs_pending = False
            arrays = self._watched.arg_dict
            for input_name in self._input_names:
                if self.pattern.match(input_name):
                    self._queue[input_name] = self.stat(_widened(arrays[input_name]))
        name = name.decode() if isinstance(name, bytes) else str(name)
        if name not in self._queue and self.pattern.match(name):
            array = mx.nd.NDArray(ctypes.cast(handle, mx.base.NDArrayHandle), writable=False)
            self._queue[name] = self.stat(_widened(array))

    def before_batch(self, batch: Any) -> None:
        """On a monitored batch, have the loop run it on the twins of the executors it trains on.

        With buckets, the batch's bucket's set
        (:meth:`mxoid.main_loop.epochs.Training.executors_for`).
        """
        if (self.main_loop.status.iterations_done + 1) % self.every_n_batches == 0:
            self._active = True
            self._inputs_pending = True
            self._queue = {}
            executors = self.main_loop.training.executors_for(batch)
            self._watch(executors)
            if self._twins:
                executors.use_twins_once(self._twins)

    def after_batch(self, batch: Any) -> None:
        """Add the weights' statistics after the step, and write the records."""
        if not self._active:
            return
        self._active = False
        executor = self._watched
        queue = self._queue
        for names, arrays in (
            (executor._symbol.list_arguments(), executor.arg_arrays),
            (executor._symbol.list_auxiliary_states(), executor.aux_arrays),
        ):
            for name, array in zip(names, arrays):
                if name not in self._input_names and self.pattern.match(name):
                    queue[name] = self.stat(_widened(array))
        self.main_loop.synchronize()
        row = self.main_loop.log.current_row
        for name, value in queue.items():
            row[f"{MONITOR_PREFIX}{name}_{self.stat_name}"] = _to_record(value)
        self._queue = {}


def _to_record(value: Any) -> Any:
    if isinstance(value, mx.nd.NDArray):
        value = value.asnumpy()
        return float(value.reshape(-1)[0]) if value.size == 1 else value.tolist()
    return value
