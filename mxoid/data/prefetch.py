"""Read the next batches on a background thread, keeping exact resumption.

A training step is only queued on MXNet's engine; the Python thread goes on at
once to read the next batch. When reading is Python work (a ``DataIter`` that
decodes or augments in Python, a Gluon ``DataLoader`` with ``num_workers=0``,
files read one by one), the devices wait for it. :class:`Prefetch` reads up to
``depth`` batches ahead on a thread of its own, so that reading overlaps with
the training step; the thread spends its time where Python lets go of the
interpreter lock (file reads, sleeps, NumPy, MXNet's own operators).

Batches read ahead but not yet trained are not lost on a checkpoint: after
each batch the thread notes where the wrapped iterator stands, and
:meth:`Prefetch.state_dict` gives the position after the last batch handed
out, not after the last one read. How the wrapped iterator is put back is what
:class:`~mxoid.checkpoint.data_position.DataPosition` does for it: an
``NDArrayIter`` directly, an iterator with ``state_dict()`` through its own
state (taken on the reading thread after each batch), any other by replay.
"""

from __future__ import annotations

import copy
import queue
import threading
import weakref
from typing import Any, Dict, Optional, Tuple

import mxnet as mx

from ..data.position import DataPosition, batches_per_epoch

__all__ = ["Prefetch"]

_END = object()
_FAILED = object()


class Prefetch(mx.io.DataIter):
    """An iterator that reads ``iterator``'s next batches on a background thread.

    Use it where the iterator goes: ``MainLoop(net, Prefetch(train_iter), ...)``,
    ``Evaluate({'valid': Prefetch(valid_iter)}, ...)``. It gives the same
    batches in the same order. ``reset()`` stops the thread, drops what it
    read ahead and resets the wrapped iterator; the thread starts again at the
    next batch asked for. An error raised while reading is raised again, with
    its own traceback, when the batch it was reading is asked for.

    Parameters
    ----------
    iterator : mx.io.DataIter
        Built as usual; it must not be read by anything else while wrapped.
    depth : int, default 2
        How many batches the thread reads ahead at most (read and not yet
        handed out).

    Examples
    --------
    >>> import mxnet as mx
    >>> import numpy as np
    >>> from mxoid.data import Prefetch
    >>> data = Prefetch(mx.io.NDArrayIter(np.zeros((10, 3)), np.arange(10), batch_size=5))
    >>> [batch.label[0].asnumpy().tolist() for batch in data]
    [[0.0, 1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0, 9.0]]
    """

    def __init__(self, iterator: mx.io.DataIter, depth: int = 2) -> None:
        if not isinstance(iterator, mx.io.DataIter) and not hasattr(iterator, "next"):
            raise TypeError(f"Prefetch wraps an mx.io.DataIter, not {type(iterator).__name__}")
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be an int >= 1, got {depth!r}")
        super().__init__(getattr(iterator, "batch_size", 0))
        self.iterator = iterator
        self.depth = depth
        self._position = DataPosition(iterator)
        self._kind = self._position.state_dict()["kind"]
        self._worker: Optional[Tuple[threading.Thread, threading.Event, queue.Queue, Any]] = None
        self._mark: Any = None  # where the iterator stood after the last batch handed out
        self._ended = False
        self._resets = 0  # of the wrapped iterator, since it was wrapped
        self._handed_out = 0  # batches handed out since the last reset

    # ------------------------------------------------------------ as a DataIter
    @property
    def provide_data(self) -> Any:
        """The wrapped iterator's ``provide_data``."""
        return self.iterator.provide_data

    @property
    def provide_label(self) -> Any:
        """The wrapped iterator's ``provide_label``."""
        return self.iterator.provide_label

    @property
    def default_bucket_key(self) -> Any:
        """The wrapped iterator's ``default_bucket_key`` (a BucketSentenceIter's); None without."""
        return getattr(self.iterator, "default_bucket_key", None)

    def __len__(self) -> int:
        """Return the wrapped iterator's number of batches per epoch, where it can tell."""
        count = batches_per_epoch(self.iterator)
        if count is None:
            raise TypeError(f"{type(self.iterator).__name__} does not tell its length")
        return count

    def next(self) -> mx.io.DataBatch:
        """Return the next batch (read ahead by the thread, or waited for)."""
        if self._ended:
            raise StopIteration
        if self._worker is None:
            self._start()
        item, mark = self._take()
        if item is _END:
            self._mark, self._ended = mark, True
            self._stop()
            raise StopIteration
        if item is _FAILED:
            self._stop()
            raise mark
        self._mark = mark
        self._handed_out += 1
        return item

    def reset(self) -> None:
        """Stop reading ahead, drop what was read, and reset the wrapped iterator."""
        self._stop()
        self._position.reset()  # NDArrayIter's order, and the random state for a replay
        self._resets += 1
        self._handed_out = 0
        self._mark = None
        self._ended = False

    # ------------------------------------------------------------ its position
    def state_dict(self) -> Dict[str, Any]:
        """Return the position after the last batch handed out (JSON-ready)."""
        state = self._position.state_dict()
        if self._mark is not None:  # else nothing was read since the last reset
            if self._kind == "ndarrayiter":
                state.update(self._mark)
            elif self._kind == "own":
                state["state"] = self._mark
        return {"position": state, "resets": self._resets, "handed_out": self._handed_out}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Put the wrapped iterator (freshly built) where :meth:`state_dict` found it."""
        self._stop()
        position = state["position"]
        self._position.check(position, "being resumed")
        self._position.restore(
            position,
            epochs_done=state["resets"],
            epoch_started=True,
            batches_done_in_epoch=state["handed_out"],
        )
        self._resets, self._handed_out = state["resets"], state["handed_out"]
        self._mark, self._ended = None, False

    # ------------------------------------------------------------ the thread
    def _start(self) -> None:
        stop = threading.Event()
        slots = threading.Semaphore(self.depth)  # one per batch read and not yet handed out
        batches: queue.Queue = queue.Queue()
        owner = weakref.ref(self)  # the thread must not keep the Prefetch alive
        iterator, kind = self.iterator, self._kind

        def wait_for_a_slot() -> bool:
            while not stop.is_set():
                if slots.acquire(timeout=0.1):
                    return True
                if owner() is None:  # the Prefetch is gone: nobody will read
                    return False
            return False

        def read() -> None:
            while wait_for_a_slot():
                try:
                    batch = iterator.next()
                except StopIteration:  # noted too: NDArrayIter's roll_over keeps rows here
                    batches.put((_END, _note(iterator, kind)))
                    return
                except BaseException as error:  # raised again where the batch is asked for
                    batches.put((_FAILED, error))
                    return
                batches.put((batch, _note(iterator, kind)))

        thread = threading.Thread(target=read, name="mxoid-prefetch", daemon=True)
        self._worker = (thread, stop, batches, slots)
        thread.start()

    def _take(self) -> Tuple[Any, Any]:
        assert self._worker is not None
        _, _, batches, slots = self._worker
        item = batches.get()
        slots.release()
        return item

    def _stop(self) -> None:
        if self._worker is None:
            return
        thread, stop, _, _ = self._worker
        stop.set()
        thread.join()
        self._worker = None

    def __del__(self) -> None:
        worker = getattr(self, "_worker", None)
        if worker is not None:
            worker[1].set()


def _note(iterator: Any, kind: str) -> Any:
    """Return where ``iterator`` stands now: what :meth:`Prefetch.state_dict` needs of it.

    Called on the reading thread, right after each batch.
    """
    if kind == "ndarrayiter":
        rolled = iterator._cache_data is not None or iterator._cache_label is not None
        return {"cursor": int(iterator.cursor), "rolled_over": rolled}
    if kind == "own":
        return copy.deepcopy(iterator.state_dict())
    return True  # replayed: the counts of resets and batches say it all
