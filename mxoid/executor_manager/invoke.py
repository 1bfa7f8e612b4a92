"""Operator calls prepared once, for the per-batch paths of the loop.

Calling an MXNet operator from Python (``mx.nd.sgd_mom_update(...)``) builds,
at every call, the argument lists, the handle arrays and the settings' strings
before MXNet's C API is reached: about as much host time as MXNet itself spends
queueing the operator. In a training step that calls one operator per
parameter, that is most of the Python thread's time on a small network.

:class:`PreparedCall` does that work once for a call whose arrays never change
(a parameter's update, the addition of a running sum): each call passes the
prepared handles, and the settings' strings are rebuilt only when a setting
changes. It calls what MXNet's own operator functions call
(``MXImperativeInvokeEx``), with the settings as MXNet's functions write them
(``str(value)``), so the operator computes exactly what the ``mx.nd`` function
computes.
"""

from __future__ import annotations

import ctypes
from typing import Any, Sequence, Tuple

import mxnet as mx
from mxnet.base import (
    _LIB,
    NDArrayHandle,
    OpHandle,
    c_handle_array,
    c_str,
    c_str_array,
    check_call,
    mx_uint,
)

__all__ = [
    "EngineBulk",
    "PreparedCall",
    "PreparedCopy",
    "PreparedPushPull",
    "backward_pass",
    "forward_pass",
]


class PreparedCall:
    """One MXNet operator on fixed arrays, called with only the settings that change.

    Parameters
    ----------
    op : str
        The operator's name, as in ``mx.nd`` (``'sgd_mom_update'``).
    inputs, outputs : sequence of NDArray
        Its arrays, kept alive here; an output may be an input (in place).
    **constants
        Settings that never change (``momentum=0.9``).

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxoid.invoke import PreparedCall
    >>> total, value = mx.nd.zeros((3,)), mx.nd.ones((3,))
    >>> add = PreparedCall("broadcast_add", [total, value], [total])
    >>> add(); add()
    >>> total.asnumpy().tolist()
    [2.0, 2.0, 2.0]
    """

    def __init__(
        self,
        op: str,
        inputs: Sequence[mx.nd.NDArray],
        outputs: Sequence[mx.nd.NDArray],
        **constants: Any,
    ) -> None:
        handle = OpHandle()
        check_call(_LIB.NNGetOpHandle(c_str(op), ctypes.byref(handle)))
        self.op = op
        self._handle = handle
        self._arrays = (list(inputs), list(outputs))  # the handles below point into them
        self._num_inputs = ctypes.c_int(len(inputs))
        self._inputs = c_handle_array(list(inputs))
        self._num_outputs = ctypes.c_int(len(outputs))
        self._outputs = ctypes.cast(c_handle_array(list(outputs)), ctypes.POINTER(NDArrayHandle))
        self._out_stypes = ctypes.POINTER(ctypes.c_int)()
        self._constant_keys = list(constants)
        self._constant_values = [str(value) for value in constants.values()]
        self._settings: Tuple[Tuple[str, Any], ...] = ()
        self._set(())

    @property
    def handles(self) -> Tuple[int, ...]:
        """The handles of the inputs and outputs, to tell whether other arrays were passed."""
        inputs, outputs = self._arrays
        return tuple(array.handle.value for array in inputs + outputs)

    def _set(self, settings: Tuple[Tuple[str, Any], ...]) -> None:
        keys = self._constant_keys + [key for key, _ in settings]
        values = self._constant_values + [str(value) for _, value in settings]
        self._num_params = ctypes.c_int(len(keys))
        self._keys = c_str_array(keys)
        self._values = c_str_array(values)
        self._settings = settings

    def __call__(self, **settings: Any) -> None:
        """Queue the operator with these settings (and the constant ones)."""
        given = tuple(settings.items())
        if given != self._settings:
            self._set(given)
        check_call(
            _LIB.MXImperativeInvokeEx(
                self._handle,
                self._num_inputs,
                self._inputs,
                ctypes.byref(self._num_outputs),
                ctypes.byref(self._outputs),
                self._num_params,
                self._keys,
                self._values,
                ctypes.byref(self._out_stypes),
            )
        )


class PreparedCopy(PreparedCall):
    """``source.copyto(target)`` into a fixed target, from a new source at each call.

    The call ``NDArray.copyto`` makes (the ``_copyto`` operator, which also
    copies across devices and casts the type), with the target's handle and the
    call's arrays built once: each call only puts the source's handle in.

    Parameters
    ----------
    target : NDArray
        Where every call copies to (kept alive here).

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxoid.invoke import PreparedCopy
    >>> target = mx.nd.zeros((2,))
    >>> copy = PreparedCopy(target)
    >>> copy(mx.nd.array([1, 2]))
    >>> target.asnumpy().tolist()
    [1.0, 2.0]
    """

    def __init__(self, target: mx.nd.NDArray) -> None:
        super().__init__("_copyto", [target], [target])  # the input is replaced at each call

    def __call__(self, source: mx.nd.NDArray) -> None:  # type: ignore[override]
        """Queue the copy of ``source`` (a dense NDArray) into the target."""
        self._inputs[0] = source.handle
        super().__call__()


class PreparedPushPull:
    """``kvstore.pushpull(key, values, out=outs, priority=priority)``, its arrays built once.

    The kvstore and arrays must stay the same; the call is the one
    ``KVStore.pushpull`` makes (``MXKVStorePushPull``, or ``MXKVStorePushPullEx``
    for string keys).

    Parameters
    ----------
    kvstore : mx.kv.KVStore
    key : int or str
    values, outs : sequence of NDArray
        One per device, as ``pushpull`` takes them.
    priority : int, default 0
    """

    def __init__(
        self,
        kvstore: mx.kv.KVStore,
        key: Any,
        values: Sequence[mx.nd.NDArray],
        outs: Sequence[mx.nd.NDArray],
        priority: int = 0,
    ) -> None:
        self._kvstore = kvstore
        self._arrays = (list(values), list(outs))
        if isinstance(key, str):
            self._function = _LIB.MXKVStorePushPullEx
            self._value_keys = c_str_array([key] * len(values))
            self._out_keys = c_str_array([key] * len(outs))
        else:
            self._function = _LIB.MXKVStorePushPull
            self._value_keys = (ctypes.c_int * len(values))(*([int(key)] * len(values)))
            self._out_keys = (ctypes.c_int * len(outs))(*([int(key)] * len(outs)))
        self._num_values = ctypes.c_uint(len(values))
        self._num_outs = ctypes.c_uint(len(outs))
        self._values = c_handle_array(list(values))
        self._outs = c_handle_array(list(outs))
        self._priority = ctypes.c_int(priority)

    def __call__(self) -> None:
        """Push the values (summed over devices, and workers) and pull the result into outs."""
        check_call(
            self._function(
                self._kvstore.handle,
                self._num_values,
                self._value_keys,
                self._num_outs,
                self._out_keys,
                self._values,
                self._outs,
                self._priority,
            )
        )


_TRAINING, _INFERENCE = ctypes.c_int(1), ctypes.c_int(0)
_NO_HEAD_GRADIENTS = (mx_uint(0), c_handle_array([]))


def forward_pass(executor: mx.executor.Executor, is_train: bool) -> None:
    """Queue ``executor``'s forward pass: what ``Executor.forward`` calls, and only that.

    ``Executor.forward`` then rebuilds its ``outputs`` list (a C call, and a
    new NDArray object per output, the old ones freed) at every pass; the
    arrays are the same ones each time, those bound, so ``executor.outputs``
    as bound stays right and the list is not rebuilt here.
    """
    check_call(_LIB.MXExecutorForward(executor.handle, _TRAINING if is_train else _INFERENCE))


def backward_pass(executor: mx.executor.Executor) -> None:
    """Queue ``executor``'s backward pass, as ``Executor.backward()`` does for loss outputs."""
    count, handles = _NO_HEAD_GRADIENTS
    check_call(_LIB.MXExecutorBackwardEx(executor.handle, count, handles, _TRAINING))


class EngineBulk:
    """Queue the operators called inside as one operation of MXNet's engine.

    What ``mx.engine.bulk(size)`` does (MXNet's imperative bulking: operators
    of one device queued from this thread, with no priority, run as one
    engine operation, in order), with its two C calls prepared once. Each
    engine operation costs its queuing, its dependency tracking and a pass
    through a worker's queue: an optimizer step of one small kernel per
    parameter pays that per parameter without it. Operators that bulking
    cannot hold (a copy, a kvstore call, an operator with a priority) are
    queued as usual, after those held so far.

    Parameters
    ----------
    size : int
        At most this many operators in one engine operation.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxoid.invoke import EngineBulk
    >>> total, value = mx.nd.zeros((3,)), mx.nd.ones((3,))
    >>> with EngineBulk(4):
    ...     for _ in range(3):
    ...         total += value
    >>> total.asnumpy().tolist()
    [3.0, 3.0, 3.0]
    """

    def __init__(self, size: int) -> None:
        self._size = ctypes.c_int(int(size))
        self._previous = ctypes.c_int(0)
        self._replaced = ctypes.c_int(0)

    def __enter__(self) -> EngineBulk:
        check_call(_LIB.MXEngineSetBulkSize(self._size, ctypes.byref(self._previous)))
        return self

    def __exit__(self, *exc_info: Any) -> None:
        # Back to the size before: the operators held so far are queued now.
        check_call(_LIB.MXEngineSetBulkSize(self._previous, ctypes.byref(self._replaced)))
