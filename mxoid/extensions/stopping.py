"""Extensions that end training."""
from __future__ import annotations

from typing import Any, Optional

from .base import Extension

__all__ = ["FinishAfter"]


class FinishAfter(Extension):
    """Stop training after a number of epochs or batches.

    The limits are checked with ``>=``, after every epoch (or batch) and when
    training resumes, so a run resumed past its limit trains no more and one
    resumed with a raised limit goes on to it.

    Parameters
    ----------
    after_n_epochs : int, optional
        Stop once this many epochs are done.
    after_n_batches : int, optional
        Stop once this many batches are done, in the middle of an epoch if
        need be.
    **kwargs
        Other firing conditions and options of :class:`Extension`.

    Examples
    --------
    >>> MainLoop(net, train_iter, extensions=[FinishAfter(after_n_epochs=10)]).run()
    """

    stops_training = True

    def __init__(self, after_n_epochs: Optional[int] = None,
                 after_n_batches: Optional[int] = None, **kwargs: Any) -> None:
        if after_n_epochs is None and after_n_batches is None:
            raise ValueError("FinishAfter needs after_n_epochs or after_n_batches")
        for name, value in (("after_n_epochs", after_n_epochs), ("after_n_batches", after_n_batches)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        self.epoch_limit = after_n_epochs
        self.batch_limit = after_n_batches
        kwargs.setdefault("before_training", True)
        kwargs.setdefault("on_resumption", True)
        if after_n_epochs is not None:
            kwargs.setdefault("after_epoch", True)
        if after_n_batches is not None:
            kwargs.setdefault("after_batch", True)
        super().__init__(**kwargs)

    def do(self, which_callback: str, *args: Any) -> None:
        status = self.main_loop.status
        if self.epoch_limit is not None and status.epochs_done >= self.epoch_limit:
            self.main_loop.request_stop(f"{self.name}: {status.epochs_done} epochs done")
        elif self.batch_limit is not None and status.iterations_done >= self.batch_limit:
            self.main_loop.request_stop(f"{self.name}: {status.iterations_done} batches done")
