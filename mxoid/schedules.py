"""Learning-rate schedules of published recipes, per optimizer step, for LearningRateSchedule.

Each schedule is a callable of the loop status, as
:class:`~mxoid.extensions.LearningRateSchedule` takes it, and gives the rate
of the coming step ``t = status.updates_done + 1`` (1 for the first; with
``accumulate_batches`` the steps are optimizer steps). A schedule depends on
``t`` alone, so a resumed run continues it exactly. :meth:`Schedule.rate`
gives the rate of any step.

- :class:`Noam`: ``factor * model_size**-0.5 * min(t**-0.5, t * warmup**-1.5)``
  (the Transformer's, Sockeye's ``noam``);
- :class:`InverseSqrt`: ``base_lr * t / warmup`` up to ``warmup``, then
  ``base_lr * sqrt(warmup / t)`` (fairseq's ``inverse_sqrt``);
- :class:`WarmupCosine`: linear warmup to ``base_lr``, then a half cosine to
  ``final`` at step ``total``, ``final`` afterwards (GluonCV's classification);
- :class:`Warmup`: any other schedule (an ``mx.lr_scheduler.LRScheduler`` too)
  times ``min(1, t / steps)``.
"""

from __future__ import annotations

import math
from typing import Any

import mxnet as mx

__all__ = ["InverseSqrt", "Noam", "Schedule", "Warmup", "WarmupCosine"]


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")


class Schedule:
    """A learning rate by optimizer step: call it with the loop status, or :meth:`rate`."""

    def rate(self, step: int) -> float:
        """Return the rate of optimizer step ``step`` (1 for the first)."""
        raise NotImplementedError

    def __call__(self, status: Any) -> float:
        """Return the rate of the coming step, ``status.updates_done + 1``."""
        return self.rate(status.updates_done + 1)

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({settings})"


class Noam(Schedule):
    """The Transformer's schedule: ``factor * model_size**-0.5 * min(t**-0.5, t * warmup**-1.5)``.

    Examples
    --------
    >>> from mxoid.schedules import Noam
    >>> round(Noam(512, warmup=4000).rate(4000), 6)
    0.000699
    """

    def __init__(self, model_size: int, warmup: int, factor: float = 1.0) -> None:
        for name, value in (("model_size", model_size), ("warmup", warmup), ("factor", factor)):
            _positive(name, value)
        self.model_size, self.warmup, self.factor = model_size, warmup, factor

    def rate(self, step: int) -> float:
        """Return the rate of step ``step``."""
        return self.factor * self.model_size**-0.5 * min(step**-0.5, step * self.warmup**-1.5)


class InverseSqrt(Schedule):
    """Linear warmup to ``base_lr`` over ``warmup`` steps, then ``base_lr * sqrt(warmup / t)``."""

    def __init__(self, warmup: int, base_lr: float = 1.0) -> None:
        _positive("warmup", warmup)
        _positive("base_lr", base_lr)
        self.warmup, self.base_lr = warmup, base_lr

    def rate(self, step: int) -> float:
        """Return the rate of step ``step``."""
        if step <= self.warmup:
            return self.base_lr * step / self.warmup
        return self.base_lr * math.sqrt(self.warmup / step)


class WarmupCosine(Schedule):
    """Linear warmup to ``base_lr``, a half cosine down to ``final`` at step ``total``.

    ``base_lr * t / warmup`` for ``t <= warmup``; then
    ``final + (base_lr - final) * (1 + cos(pi * (t - warmup) / (total - warmup))) / 2``;
    ``final`` from ``total`` on.
    """

    def __init__(self, warmup: int, total: int, final: float = 0.0, base_lr: float = 1.0) -> None:
        _positive("base_lr", base_lr)
        if not (isinstance(warmup, int) and isinstance(total, int) and 0 <= warmup < total):
            raise ValueError(f"need ints 0 <= warmup < total, got {warmup!r} and {total!r}")
        if not 0 <= final <= base_lr:
            raise ValueError(f"final must be between 0 and base_lr, got {final!r}")
        self.warmup, self.total, self.final, self.base_lr = warmup, total, final, base_lr

    def rate(self, step: int) -> float:
        """Return the rate of step ``step``."""
        if step <= self.warmup:
            return self.base_lr * step / self.warmup
        if step >= self.total:
            return self.final
        progress = (step - self.warmup) / (self.total - self.warmup)
        return self.final + (self.base_lr - self.final) * (1 + math.cos(math.pi * progress)) / 2


class Warmup(Schedule):
    """Another schedule, times ``min(1, t / steps)``: a linear warmup over ``steps`` steps.

    ``schedule``: a :class:`Schedule`, an ``mx.lr_scheduler.LRScheduler``
    (called with the step, as the optimizer calls it), or a callable of the status.
    """

    def __init__(self, schedule: Any, steps: int) -> None:
        if not callable(schedule):
            raise TypeError(f"schedule must be callable, got {type(schedule).__name__}")
        _positive("steps", steps)
        self.schedule, self.steps = schedule, steps

    def rate(self, step: int) -> float:
        """Return the rate of step ``step`` (not for a wrapped callable of the status)."""
        return self._inner(step, None) * min(1.0, step / self.steps)

    def __call__(self, status: Any) -> float:
        """Return the rate of the coming step, ``status.updates_done + 1``."""
        step = status.updates_done + 1
        return self._inner(step, status) * min(1.0, step / self.steps)

    def _inner(self, step: int, status: Any) -> float:
        inner = self.schedule
        if isinstance(inner, mx.lr_scheduler.LRScheduler):
            return inner(step)
        if isinstance(inner, Schedule):
            return inner.rate(step)
        if status is None:
            raise TypeError(f"{inner!r} is a callable of the loop status: call the Warmup with it")
        return inner(status)
