"""The in-memory log: iteration number -> row of records, as in Blocks."""

from __future__ import annotations

import bisect
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from .status import TrainingStatus

_STATUS_FIELDS = frozenset(TrainingStatus())

__all__ = ["TrainingLog"]

_MISSING = object()


class TrainingLog(Mapping):
    """Records by iteration: ``log[i]`` is the row (a dict) of iteration ``i``.

    Row ``i`` holds what extensions wrote after ``i`` batches: records of
    ``before_training`` land in row 0, those written during batch ``i``
    (``after_backward``, ``before_update``, ``after_update``, ``after_batch``)
    or in ``after_epoch`` in row ``i``; ``before_batch`` of batch ``i`` writes
    in row ``i - 1``, before the batch starts. Rows are created on first
    write, so iterations nobody wrote about take no memory and are absent
    from :meth:`items`.

    Attributes
    ----------
    status : TrainingStatus
        The loop's counters (the same object as ``MainLoop.status``).
    epoch_ends : list of int
        The iteration at which each epoch ended, in order.
    batch_in_progress : bool
        Set by the loop from the end of ``before_batch`` until the batch is
        counted (``status.iterations_done``): meanwhile the current row is
        that batch's, one ahead of the count.

    Examples
    --------
    .. code-block:: python

        loop.log.current_row["my_record"] = 0.5
        loop.log.last("valid_accuracy")
        # -> 0.97
        [(i, row["valid_accuracy"]) for i, row in loop.log.items() if "valid_accuracy" in row]
    """

    def __init__(self, status: Optional[TrainingStatus] = None) -> None:
        self.status = status if status is not None else TrainingStatus()
        self._rows: Dict[int, Dict[str, Any]] = {}
        self._latest: Dict[str, Tuple[int, Any]] = {}
        self.epoch_ends: List[int] = []
        self.batch_in_progress = False

    def __getitem__(self, iteration: int) -> Dict[str, Any]:
        return self._rows[iteration]

    def __getattr__(self, name: str) -> Any:
        # The status's counters, read on the log itself: a firing condition written for
        # the status (``lambda status: status.epochs_done > 2``) works on the log.
        if name.startswith("_") or name not in _STATUS_FIELDS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self.status, name)

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._rows))

    def __len__(self) -> int:
        return len(self._rows)

    # Mapping's defaults go through __getitem__ and a KeyError; writers ask per batch.
    def __contains__(self, iteration: object) -> bool:
        return iteration in self._rows

    def get(self, iteration: int, default: Any = None) -> Any:
        """Return the row of ``iteration``, or ``default`` when there is none (none is created)."""
        return self._rows.get(iteration, default)

    def row(self, iteration: int) -> Dict[str, Any]:
        """Return the row of ``iteration``, creating it if needed."""
        found = self._rows.get(iteration)
        if found is None:
            found = self._rows[iteration] = _Row(self, iteration)
        return found

    @property
    def current_iteration(self) -> int:
        """The iteration of :attr:`current_row`: the batch in progress, or the batches done.

        ``status.iterations_done``, plus one from ``after_backward`` to just
        before ``after_batch``, when the batch is trained but not yet counted.
        """
        return self.status.iterations_done + self.batch_in_progress

    @property
    def current_row(self) -> Dict[str, Any]:
        """The row of the current iteration (:attr:`current_iteration`), for writing records."""
        return self.row(self.status.iterations_done + self.batch_in_progress)

    @property
    def previous_row(self) -> Dict[str, Any]:
        """The row of the iteration before the current one (empty when absent)."""
        return self._rows.get(self.current_iteration - 1, {})

    def last(self, name: str, default: Any = _MISSING) -> Any:
        """Return the newest value of record ``name``.

        Raises
        ------
        KeyError
            If no row holds ``name`` and no default is given.
        """
        found = self._latest.get(name)
        if found is None:
            if default is _MISSING:
                raise KeyError(
                    f"no record named {name!r} in the log; records so far: {sorted(self._latest)}"
                )
            return default
        return found[1]

    def last_iteration(self, name: str) -> Optional[int]:
        """Return the iteration of the newest value of ``name``, or None."""
        found = self._latest.get(name)
        return None if found is None else found[0]

    def remove_record(self, iteration: int, name: str) -> None:
        """Delete record ``name`` from the row of ``iteration``.

        It is an undo: e.g. a checkpoint whose write failed takes back its
        ``checkpoint_saved_to``.
        """
        row = self._rows.get(iteration)
        if row is None or name not in row:
            return
        dict.__delitem__(row, name)
        latest = self._latest.get(name)
        if latest is not None and latest[0] == iteration:
            del self._latest[name]
            for other in sorted(self._rows, reverse=True):
                if name in self._rows[other]:
                    self._latest[name] = (other, self._rows[other][name])
                    break

    def epochs_done_at(self, iteration: int) -> int:
        """Return the epochs done when the row of ``iteration`` was complete.

        They are the epochs that ended at or before it (``status.epochs_done``
        as it stood then).
        """
        return bisect.bisect_right(self.epoch_ends, iteration)

    def record_names(self) -> List[str]:
        """Names of every record written so far, sorted."""
        return sorted(self._latest)

    def _note(self, iteration: int, name: str, value: Any) -> None:
        latest = self._latest.get(name)
        if latest is None or latest[0] <= iteration:
            self._latest[name] = (iteration, value)

    def state_dict(self) -> Dict[str, Any]:
        """Return the rows and status as plain data (JSON-serializable when the records are)."""
        return {
            "status": self.status.state_dict(),
            "rows": [[i, dict(self._rows[i])] for i in sorted(self._rows)],
            "epoch_ends": list(self.epoch_ends),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Replace the rows and status with those of :meth:`state_dict`."""
        self.status.load_state_dict(state["status"])
        self.batch_in_progress = False
        self._rows.clear()
        self._latest.clear()
        self.epoch_ends = [int(i) for i in state.get("epoch_ends", [])]
        for iteration, values in state["rows"]:
            self.row(int(iteration)).update(values)

    def to_dataframe(self):
        """Return the log as a pandas DataFrame indexed by iteration (needs pandas)."""
        try:
            import pandas
        except ImportError:
            raise ImportError("TrainingLog.to_dataframe needs pandas: pip install pandas") from None
        return pandas.DataFrame.from_dict({i: dict(r) for i, r in self.items()}, orient="index")


class _Row(dict):
    """A log row that keeps the log's index of newest values up to date."""

    __slots__ = ("_log", "_iteration")

    def __init__(self, log: TrainingLog, iteration: int) -> None:
        super().__init__()
        self._log = log
        self._iteration = iteration

    def __setitem__(self, name: str, value: Any) -> None:
        dict.__setitem__(self, name, value)
        self._log._note(self._iteration, name, value)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for name, value in dict(*args, **kwargs).items():
            self[name] = value

    def setdefault(self, name: str, default: Any = None) -> Any:
        if name not in self:
            self[name] = default
        return self[name]
