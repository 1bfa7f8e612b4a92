"""The step's loss scale: on the devices, divided out of ``rescale_grad``, AMP's dynamic rule.

The graph side (the scale's input before each loss operator) and the user's
setting are in :mod:`mxoid.loss_scale`; this is the optimizer step's side.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

import mxnet as mx
import numpy as np

from ..distributed.servers import is_asynchronous, is_distributed
from ..distributed.workers import allreduce_sums
from ..executor_manager import LOSS_SCALE_INPUT
from ..executor_manager.waiting import wait_for

if TYPE_CHECKING:  # pragma: no cover
    from .step import Update

__all__ = ["LossScaler", "device_gradients", "exact_rescale", "loop_scaler"]

ASYNCHRONOUS = (
    "loss_scale={value!r} with the kvstore 'dist_async': each worker's push updates the "
    "servers alone, so a step with an overflow on one worker cannot be skipped by all. Use "
    "kvstore='dist_sync', or loss_scale=None (bfloat16 needs none)"
)


_CHUNK = 200  # arrays per multi_all_finite call, as AMP's has_overflow


class LossScaler:
    """The loss scale of a loop's step: its arrays, its value, whether a step is skipped.

    Parameters
    ----------
    setting : float or mxoid.loss_scale.DynamicLossScale
        A fixed scale, or the dynamic rule.
    scale_arrays : sequence of NDArray
        The graph's scale input on each device (shared by every executor set).
    gradients : sequence of sequence of NDArray
        Each device's parameter gradients, which :meth:`finite` checks.
    update : mxoid.update.Update
        The step whose ``rescale_grad`` divides the scale out.
    agree : callable, optional
        ``agree(overflows) -> total``: sums this worker's count of devices with
        an overflow over the workers (``dist_sync`` with the optimizer on the
        servers, whose push follows the check); None where every process sees
        the same summed gradients.

    Attributes
    ----------
    scale : float
        The scale of the coming backward passes.
    clean_steps : int
        Steps since the last skipped one or the last growth.
    skipped : int
        Steps skipped since training started.
    """

    def __init__(
        self,
        setting: Any,
        scale_arrays: Sequence[mx.nd.NDArray],
        gradients: Sequence[Sequence[mx.nd.NDArray]],
        update: Update,
        agree: Optional[Callable[[int], int]] = None,
    ) -> None:
        self.agree = agree
        self.dynamic = None if isinstance(setting, (int, float)) else setting
        self.scale = self.dynamic.initial if self.dynamic else float(setting)
        self.clean_steps, self.skipped = 0, 0
        self._arrays, self._update = list(scale_arrays), update
        self._gradients = [list(grads) for grads in gradients]
        self._flags = [mx.nd.ones((1,), ctx=array.context) for array in self._arrays]
        self._inverses = [mx.nd.ones((1,), ctx=array.context) for array in self._arrays]
        self.write()

    def write(self) -> None:
        """Give the devices the scale (and its inverse), the step the rescaling that divides it.

        The values are copied from float32 host arrays, bit for bit: MXNet reads a
        number given to an operator (``array[:] = 0.1``) from its decimal text,
        not always exactly (see :func:`exact_rescale`).
        """
        value = np.array([self.scale], dtype=np.float32)
        inverse = np.array([1.0], dtype=np.float32) / value
        for array, inverse_array in zip(self._arrays, self._inverses):
            mx.nd.array(value, ctx=array.context, dtype=np.float32).copyto(array)
            mx.nd.array(inverse, ctx=array.context, dtype=np.float32).copyto(inverse_array)
        self._update.set_loss_scale(self.scale)

    def unscale(self) -> None:
        """Divide every gradient by the scale, where the step's ``rescale_grad`` cannot.

        Queued on each device (``broadcast_mul`` by ``1 / scale`` in place); nothing
        when the update's ``divide_gradients`` is False.
        """
        if not self._update.divide_gradients:
            return
        for inverse, grads in zip(self._inverses, self._gradients):
            for grad in grads:
                mx.nd.broadcast_mul(grad, inverse, out=grad)

    def finite(self) -> bool:
        """Return whether every gradient on every device is finite (the step may update).

        One ``multi_all_finite`` per device (and 200 arrays) and one wait for
        them all: the host must know before the step. Where the workers'
        gradients are not summed before the check, the workers agree (``agree``:
        one small exchange through the servers), so that all skip or none.
        """
        for flag, grads in zip(self._flags, self._gradients):
            flag[:] = 1
            for start in range(0, len(grads), _CHUNK):
                chunk = grads[start : start + _CHUNK]
                mx.nd.multi_all_finite(*chunk, num_arrays=len(chunk), init_output=False, out=flag)
        for flag in self._flags:  # a Ctrl-C meanwhile is handled at once
            wait_for(flag.wait_to_read)
        overflows = sum(flag.asscalar() != 1 for flag in self._flags)
        if self.agree is not None:
            overflows = self.agree(int(overflows))
        return overflows == 0

    def follow(self, finite: bool) -> None:
        """Count a step after it was taken (``finite``) or skipped; the dynamic rule.

        A skipped step halves a dynamic scale; ``growth_interval`` steps taken
        in a row double it (up to its maximum). The new scale is for the next
        backward passes: called after the step, which divides by the old one.
        """
        rule = self.dynamic
        if finite:
            self.clean_steps += 1
            if rule is not None and self.clean_steps == rule.growth_interval:
                self.clean_steps = 0
                if self.scale < rule.maximum:
                    self.scale = min(rule.maximum, self.scale * 2)
                    self.write()
            return
        self.skipped += 1
        self.clean_steps = 0
        if rule is not None:
            self.scale /= 2
            self.write()

    def state_dict(self) -> Dict[str, Any]:
        """Return the scale, the clean steps and the skipped ones, as plain data."""
        return {"scale": self.scale, "clean_steps": self.clean_steps, "skipped": self.skipped}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s values (a fixed scale keeps its own value)."""
        if self.dynamic is not None:
            self.scale = float(state["scale"])
        self.clean_steps, self.skipped = int(state["clean_steps"]), int(state["skipped"])
        self.write()


def device_gradients(grad_arrays: Sequence[Sequence[Any]], devices: int) -> List[List[Any]]:
    """Return each device's gradient arrays from ``[parameter][device]`` lists (no None)."""
    return [[g[k] for g in grad_arrays if g[k] is not None] for k in range(devices)]


def loop_scaler(setting: Any, manager: Any, update: Update, kvstore: Any) -> LossScaler:
    """Return the :class:`LossScaler` of a loop's step under loss scaling (``setting``).

    Its arrays are the training set's scale inputs (which the manager's other
    sets share) and the parameters' gradients on each device. Under
    ``dist_sync`` with the workers running the optimizer, every worker checks
    the same summed gradients (pulled before the check); with the servers
    running it, the workers agree through :func:`~mxoid.distributed.allreduce_sums`.
    Raises ``ValueError`` with ``dist_async`` (:data:`ASYNCHRONOUS`).
    """
    agree = None
    if is_distributed(kvstore):
        if is_asynchronous(kvstore):
            raise ValueError(ASYNCHRONOUS.format(value=setting))
        if update.update_on_kvstore:

            def agree(overflows: int) -> int:
                return int(allreduce_sums(kvstore, "mxoid_loss_scale", [overflows])[0])

    arrays = [e.arg_dict[LOSS_SCALE_INPUT] for e in manager.training_set.executors]
    gradients = device_gradients(manager.grad_arrays, len(arrays))
    return LossScaler(setting, arrays, gradients, update, agree)


def _as_read(value: float) -> np.float32:
    """Return ``rescale_grad=value`` as MXNet's optimizer kernels read it (float32).

    MXNet passes an operator's numbers as text, which dmlc-core's parser reads
    into a float32, not always the nearest one; one ``sgd_update`` of a zero
    weight by a gradient of one with ``lr=1`` gives back ``-rescale_grad``.
    """
    with mx.autograd.pause():
        weight, grad = mx.nd.zeros((1,), ctx=mx.cpu()), mx.nd.ones((1,), ctx=mx.cpu())
        out = mx.nd.sgd_update(weight, grad, lr=1.0, wd=0.0, rescale_grad=value)
        return np.float32(-out.asnumpy()[0])


@functools.lru_cache(maxsize=256)
def exact_rescale(rescale: float, scale: float) -> Any:
    """Return a ``rescale_grad`` that MXNet reads as its reading of ``rescale`` / ``scale``.

    None where no nearby value reads so. Why: MXNet's optimizer kernels read
    ``rescale_grad`` from its decimal text with dmlc-core's float parser, which
    misses the nearest float32 for some values; the loop's unscaled step uses
    the parser's reading of ``rescale`` (``r``), and the scaled step must use
    ``r / scale`` exactly (a power of two: exact in float32) for the update to
    be the same bit for bit. Tried: ``r / scale`` itself, then values within
    1.5 float32 ulps of it (the parser's error), none below float32's normal
    range (MXNet refuses to read such a ``rescale_grad``); each reading is one tiny
    operator on the CPU and a wait, once per pair (cached), when the scale or
    the batch's rescaling changes.
    """
    target = np.float32(_as_read(rescale) / np.float32(scale))
    if not np.finfo(np.float32).tiny <= abs(target) < np.inf:  # MXNet refuses subnormals
        return None
    ulp = float(np.spacing(target))
    for step in (0, *(j for k in range(1, 13) for j in (k, -k))):
        value = float(target) + step * ulp / 8
        if _as_read(value) == target:
            return value
    return None
