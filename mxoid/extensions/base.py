"""The Extension base class and its firing conditions."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

if TYPE_CHECKING:  # pragma: no cover
    from ..log import TrainingStatus
    from ..main_loop import MainLoop

__all__ = ["HOOKS", "Extension", "Predicate"]

HOOKS = ("before_training", "on_resumption", "before_epoch", "before_batch", "after_batch",
         "after_epoch", "after_training", "on_interrupt", "on_error")
"""Every hook the loop dispatches, in the order they first fire."""

Predicate = Callable[["TrainingStatus"], bool]


def _every(counter: str, n: int) -> Predicate:
    return lambda status: getattr(status, counter) % n == 0


def _exactly(counter: str, n: int) -> Predicate:
    return lambda status: getattr(status, counter) == n


def _always(status: "TrainingStatus") -> bool:
    return True


def _positive(name: str, value: Optional[int]) -> Optional[int]:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class Extension:
    """Something that acts on the training loop at its hooks.

    There are two ways to write one; pick whichever reads better.

    1. Override hooks. Each overridden hook runs every time the loop reaches
       it: ``before_training()``, ``on_resumption()``, ``before_epoch()``,
       ``before_batch(batch)``, ``after_batch(batch)``, ``after_epoch()``,
       ``after_training()``, ``on_interrupt()``, ``on_error(exception)``.
       Hooks not overridden cost nothing: the loop never dispatches them.
    2. Implement :meth:`do` and pass firing conditions to the constructor
       (``every_n_epochs=2``, ``after_n_batches=100``, ``after_training=True``
       ...). ``do(which_callback, *args)`` then runs whenever one of the
       conditions holds. This is how every built-in extension is written, so
       users can change when any of them fires; a subclass sets its defaults
       with ``kwargs.setdefault('after_epoch', True)`` before calling
       ``super().__init__(**kwargs)``.

    The loop is reachable as ``self.main_loop``: its ``manager`` (executors,
    parameters, gradients, ``outputs`` of the last batch), ``optimizer``,
    ``kvstore``, ``status``, ``log`` and ``current_batch``. Records go into
    ``self.main_loop.log.current_row``. To stop training, call
    ``self.main_loop.request_stop(reason)`` and set the class attribute
    ``stops_training = True``, so the loop knows something can stop it.

    Parameters
    ----------
    name : str, optional
        Shown in error messages and the profile. The class name by default.
    priority : float, default 0
        Extensions run in ascending priority, then in list order. Log writers
        and checkpoints use high priorities so that they see every record of
        the row.
    every_n_batches, every_n_epochs : int, optional
        Fire ``do('after_batch', batch)`` / ``do('after_epoch')`` when the
        count of batches / epochs done is a multiple of n.
    after_n_batches, after_n_epochs : int, optional
        Fire once, when exactly n batches / epochs are done.
    before_training, before_epoch, before_batch, after_batch, after_epoch,
    after_training, on_resumption, on_interrupt, on_error : bool
        Fire ``do`` at every occurrence of that hook.
    rank_zero_only : bool, optional
        Override the class default of :attr:`rank_zero_only`.

    Attributes
    ----------
    stops_training : bool
        Class attribute: True when the extension may request a stop.
    rank_zero_only : bool
        In distributed training, run only on the worker of rank 0. A class
        default (True for extensions with side effects: printing, progress
        bars, log files, checkpoints), overridden per instance with the
        ``rank_zero_only=`` keyword.
    main_loop : MainLoop
        Set by the loop when it is constructed.

    Examples
    --------
    >>> class GradientNorm(Extension):
    ...     def __init__(self, **kwargs):
    ...         kwargs.setdefault("every_n_batches", 50)
    ...         super().__init__(**kwargs)
    ...     def do(self, which_callback, *args):
    ...         grads = self.main_loop.manager.grad_arrays
    ...         norm = sum(float((g[0] ** 2).sum().asscalar()) for g in grads) ** 0.5
    ...         self.main_loop.log.current_row["grad_norm"] = norm
    """

    stops_training: bool = False
    rank_zero_only: bool = False
    main_loop: "MainLoop"

    def __init__(self, *, name: Optional[str] = None, priority: float = 0,
                 every_n_batches: Optional[int] = None, every_n_epochs: Optional[int] = None,
                 after_n_batches: Optional[int] = None, after_n_epochs: Optional[int] = None,
                 before_training: bool = False, before_epoch: bool = False,
                 before_batch: bool = False, after_batch: bool = False,
                 after_epoch: bool = False, after_training: bool = False,
                 on_resumption: bool = False, on_interrupt: bool = False,
                 on_error: bool = False, rank_zero_only: Optional[bool] = None) -> None:
        self.name = name or type(self).__name__
        self.priority = priority
        if rank_zero_only is not None:
            self.rank_zero_only = rank_zero_only
        self.conditions: Dict[str, List[Predicate]] = {}
        flags = {"before_training": before_training, "before_epoch": before_epoch,
                 "before_batch": before_batch, "after_batch": after_batch,
                 "after_epoch": after_epoch, "after_training": after_training,
                 "on_resumption": on_resumption, "on_interrupt": on_interrupt,
                 "on_error": on_error}
        for hook, wanted in flags.items():
            if wanted:
                self.add_condition(hook)
        if _positive("every_n_batches", every_n_batches):
            self.add_condition("after_batch", _every("iterations_done", every_n_batches))
        if _positive("every_n_epochs", every_n_epochs):
            self.add_condition("after_epoch", _every("epochs_done", every_n_epochs))
        if _positive("after_n_batches", after_n_batches):
            self.add_condition("after_batch", _exactly("iterations_done", after_n_batches))
        if _positive("after_n_epochs", after_n_epochs):
            self.add_condition("after_epoch", _exactly("epochs_done", after_n_epochs))

    def add_condition(self, hook: str, predicate: Optional[Predicate] = None) -> "Extension":
        """Fire :meth:`do` at ``hook`` when ``predicate(status)`` is true (always when None).

        Returns the extension, so calls can be chained.
        """
        if hook not in HOOKS:
            raise ValueError(f"unknown hook {hook!r}; the hooks are {list(HOOKS)}")
        self.conditions.setdefault(hook, []).append(predicate or _always)
        return self

    def handles(self, hook: str) -> bool:
        """True when the loop must dispatch ``hook`` to this extension."""
        return hook in self.conditions or getattr(type(self), hook) is not getattr(Extension, hook)

    def do(self, which_callback: str, *args: Any) -> None:
        """Act; called when a firing condition holds. Subclasses with conditions implement it."""
        raise NotImplementedError(
            f"{type(self).__name__} has firing conditions but does not implement "
            "do(which_callback, *args)")

    def _fire(self, hook: str, *args: Any) -> None:
        status = self.main_loop.status
        for predicate in self.conditions.get(hook, ()):
            if predicate(status):
                self.do(hook, *args)
                return

    # The hooks. Overriding one makes the loop dispatch it on every occurrence.
    def before_training(self) -> None:
        """Before the first epoch (not again when training resumes)."""
        self._fire("before_training")

    def on_resumption(self) -> None:
        """When training resumes from a checkpoint, instead of ``before_training``."""
        self._fire("on_resumption")

    def before_epoch(self) -> None:
        """At the start of each epoch, before its first batch is read."""
        self._fire("before_epoch")

    def before_batch(self, batch: Any) -> None:
        """Before ``batch`` is loaded into the executors."""
        self._fire("before_batch", batch)

    def after_batch(self, batch: Any) -> None:
        """After the update of ``batch``; ``status.iterations_done`` counts it."""
        self._fire("after_batch", batch)

    def after_epoch(self) -> None:
        """After the last batch of an epoch; ``status.epochs_done`` counts it."""
        self._fire("after_epoch")

    def after_training(self) -> None:
        """When training ends, by a stop request or an interruption."""
        self._fire("after_training")

    def on_interrupt(self) -> None:
        """When training is interrupted by Ctrl-C or SIGTERM, before ``after_training``."""
        self._fire("on_interrupt")

    def on_error(self, exception: BaseException) -> None:
        """When training or a hook raised ``exception``, before it propagates."""
        self._fire("on_error", exception)

    # State carried by checkpoints.
    def state_dict(self) -> Dict[str, Any]:
        """Return the extension's own state as plain data; stateless extensions return ``{}``."""
        return {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore the state returned by :meth:`state_dict`."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
