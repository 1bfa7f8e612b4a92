"""Firing conditions: predicates on the log, the counts of batches and epochs, OnLogRecord.

A condition is a callable of the loop's log returning a bool, given to
:meth:`Extension.add_condition(hook, predicate) <mxoid.extensions.Extension.add_condition>`.
The counts (:func:`every_n_batches`, :func:`every_n_epochs`, :func:`after_n_batches`,
:func:`after_n_epochs`) work on any hook, as Ignite's ``Events.X(every=N)``: each counts
the batch (or epoch) the hook belongs to, so that every hook of the 4th batch sees 4.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

if TYPE_CHECKING:  # pragma: no cover
    from ..log import TrainingLog

__all__ = [
    "Count",
    "OnLogRecord",
    "Predicate",
    "after_n_batches",
    "after_n_epochs",
    "every_n_batches",
    "every_n_epochs",
]

Predicate = Callable[["TrainingLog"], bool]
"""A firing condition: called with the loop's log (``log.status`` holds the counters; the
counters are also readable on the log itself, ``log.iterations_done``)."""

IN_A_BATCH = frozenset(("before_batch", "after_backward", "before_update", "after_update"))
"""The hooks that run before their batch is counted in ``status.iterations_done``."""
IN_AN_EPOCH = IN_A_BATCH | {"before_epoch", "after_batch"}
"""The hooks that run before their epoch is counted in ``status.epochs_done``."""


class Count:
    """A firing condition on the number of the batch or epoch a hook belongs to.

    Made by :func:`every_n_batches` and its siblings. The number is the hook's own:
    ``before_batch``, ``after_backward``, ``before_update``, ``after_update`` and
    ``after_batch`` of the 4th batch all see 4 (``status.iterations_done`` counts a
    batch only from its ``after_batch``); ``before_epoch`` and every batch hook of the
    2nd epoch see epoch 2. Other hooks (``after_epoch``, ``before_training``,
    ``after_training``...) see the counts done. Given to
    :meth:`Extension.add_condition`, it is fitted to its hook there; called on its own
    it counts what is done, as at ``after_batch`` / ``after_epoch``.
    """

    __slots__ = ("unit", "n", "every", "ahead")

    def __init__(self, unit: str, n: int, every: bool, ahead: int = 0) -> None:
        if unit not in ("batches", "epochs"):
            raise ValueError(f"a count is of 'batches' or 'epochs', not {unit!r}")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            name = f"{'every' if every else 'after'}_n_{unit}"
            raise ValueError(f"{name} needs a positive int, got {n!r}")
        self.unit, self.n, self.every, self.ahead = unit, n, every, ahead

    def at(self, hook: str) -> Count:
        """Return this count as seen at ``hook`` (one ahead where its batch or epoch runs)."""
        ahead = hook in (IN_A_BATCH if self.unit == "batches" else IN_AN_EPOCH)
        return Count(self.unit, self.n, self.every, int(ahead))

    def __call__(self, log: TrainingLog) -> bool:
        """Return True when the hook's batch (or epoch) number is a multiple of n (is n)."""
        status = log.status
        done = status.iterations_done if self.unit == "batches" else status.epochs_done
        number = done + self.ahead
        return number % self.n == 0 if self.every else number == self.n

    def __repr__(self) -> str:
        return f"{'every' if self.every else 'after'}_n_{self.unit}({self.n})"


def every_n_batches(n: int) -> Count:
    """Hold at the hooks of every n-th batch: the 4th, 8th... with ``n=4``.

    Examples
    --------
    >>> from mxoid.extensions import Extension, every_n_batches
    >>> class GradientPeek(Extension):
    ...     def do(self, which_callback, *args):
    ...         pass  # read self.main_loop.manager.grad_arrays
    >>> peek = GradientPeek().add_condition("after_backward", every_n_batches(4))
    """
    return Count("batches", n, every=True)


def every_n_epochs(n: int) -> Count:
    """Hold at the hooks of every n-th epoch (at each of its batches, for a batch hook)."""
    return Count("epochs", n, every=True)


def after_n_batches(n: int) -> Count:
    """Hold at the hooks of the n-th batch only."""
    return Count("batches", n, every=False)


def after_n_epochs(n: int) -> Count:
    """Hold at the hooks of the n-th epoch only (at each of its batches, for a batch hook)."""
    return Count("epochs", n, every=False)


def always(log: TrainingLog) -> bool:
    """Hold every time: the condition of a hook keyword given True."""
    return True


class OnLogRecord:
    """A firing condition: true once for each row in which ``record`` is written, as Blocks'.

    It holds at the first check after the record is written into the current row
    (``log.current_row``), and not again for that row (a record written in
    ``after_batch`` and checked in both ``after_batch`` and ``after_epoch``
    fires once). Give the same instance to the hooks it should watch.

    Examples
    --------
    Save a checkpoint whenever TrackBest reports a new best validation accuracy::

        best = TrackBest("valid_accuracy", mode="max")
        keep = Checkpoint("runs/best", every_n_epochs=None, after_training=False,
                          on_interrupt=False, keep_last=1)
        keep.add_condition("after_epoch", OnLogRecord("valid_accuracy_new_best"))
    """

    def __init__(self, record: str) -> None:
        if not isinstance(record, str) or not record:
            raise ValueError(f"OnLogRecord needs a record name, got {record!r}")
        self.record = record
        self._fired: Optional[int] = None

    def __call__(self, log: TrainingLog) -> bool:
        """Return True if ``record`` was written in the current row, once per row."""
        iteration = log.current_iteration
        if self._fired == iteration or log.last_iteration(self.record) != iteration:
            return False
        self._fired = iteration
        return True

    def __repr__(self) -> str:
        return f"OnLogRecord({self.record!r})"
