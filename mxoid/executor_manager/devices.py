"""The devices of a loop: which contexts, how a batch is shared, and their random generators."""

from __future__ import annotations

import os
from typing import Any, List, Sequence

import mxnet as mx

__all__ = ["check_contexts", "forward_work_load", "one_random_generator", "split_batch"]


def check_contexts(contexts: Any) -> List[mx.Context]:
    """Return the devices ``contexts`` names, as a list; ``[mx.cpu()]`` for None.

    Raises
    ------
    TypeError
        For anything but a Context or a list of them (``'cpu'`` for instance).
    ValueError
        For GPUs this machine (or this build of MXNet) does not have, or a device named twice.
    """
    if contexts is None:
        return [mx.cpu()]
    if isinstance(contexts, mx.Context):
        contexts = [contexts]
    if isinstance(contexts, (str, bytes)) or not isinstance(contexts, (list, tuple)):
        raise TypeError(
            f"contexts must be an mx.Context or a list of them, e.g. [mx.cpu()] or "
            f"[mx.gpu(0), mx.gpu(1)]; got {contexts!r}"
        )
    contexts = list(contexts)
    for context in contexts:
        if not isinstance(context, mx.Context):
            raise TypeError(
                f"contexts must be mx.Context objects such as mx.cpu() or "
                f"mx.gpu(0); got {context!r} in {contexts!r}"
            )
    gpus = [c for c in contexts if c.device_type == "gpu"]
    if gpus:
        available = mx.context.num_gpus()
        missing = [c for c in gpus if c.device_id >= available]
        if missing:
            where = (
                "this MXNet is a CPU-only build (install a CUDA build, e.g. mxnet-cu112, "
                "or use mx.cpu())"
                if available == 0
                else f"this machine has {available}"
            )
            raise ValueError(f"contexts {missing} name GPUs that do not exist: {where}")
    if len(set(map(str, contexts))) != len(contexts):
        raise ValueError(f"contexts {contexts} name a device twice; give each device once")
    return contexts


def one_random_generator(contexts: Sequence[mx.Context]) -> bool:
    """Return True where every operator bound on ``contexts`` draws from one random generator.

    MXNet hands each operator that asks for a parallel random generator
    (``Dropout``, and every operator loaded from a library) one of several
    copies, in turn as executors are bound: ``MXNET_CPU_PARALLEL_RAND_COPY``
    of them (1 by default, read when MXNet starts) for all CPU devices,
    ``MXNET_GPU_PARALLEL_RAND_COPY`` per GPU, and the states of cuDNN's Dropout
    likewise (``MXNET_GPU_CUDNN_DROPOUT_STATE_COPY``; 4 each by default, as
    MXNet 1.x documents its environment variables). Only on CPUs
    with one copy does an executor bound later (a twin, or one with an extra
    operator) leave the random numbers of the others as they were: elsewhere
    its operators take other copies, and change which copy the next one takes.
    """
    if not all(context.device_type == "cpu" for context in contexts):
        return False
    try:
        return int(os.environ.get("MXNET_CPU_PARALLEL_RAND_COPY", "1")) == 1
    except ValueError:  # whatever MXNet made of it, not known to be one copy
        return False


def split_batch(batch_size: int, work_load_list: Sequence[float]) -> List[slice]:
    """Split ``batch_size`` rows into one contiguous slice per device.

    Parameters
    ----------
    batch_size : int
        Rows in a batch.
    work_load_list : sequence of float
        Relative work load of each device; rows are shared in proportion.

    Returns
    -------
    list of slice
        One non-empty slice per device, covering ``range(batch_size)`` in order.

    Raises
    ------
    ValueError
        If a device would receive no rows (the batch is too small).
    """
    if any(w <= 0 for w in work_load_list):
        raise ValueError(f"work_load_list must hold positive numbers, got {list(work_load_list)}")
    if batch_size < len(work_load_list):
        raise ValueError(
            f"a batch of {batch_size} rows cannot be split across {len(work_load_list)} devices; "
            "use a batch size of at least the number of contexts"
        )
    total = float(sum(work_load_list))
    counts = [max(1, int(round(w * batch_size / total))) for w in work_load_list]
    counts[-1] = batch_size - sum(counts[:-1])
    if counts[-1] < 1:
        raise ValueError(
            f"work_load_list {list(work_load_list)} leaves a device with no rows of a "
            f"batch of {batch_size}; use a larger batch or a more even work load"
        )
    slices, start = [], 0
    for count in counts:
        slices.append(slice(start, start + count))
        start += count
    return slices


def forward_work_load(batch_size: int, work_load_list: Sequence[float]) -> List[float]:
    """Return the shares of the devices an executor set of ``batch_size`` rows runs on.

    A batch with fewer rows than devices runs on the first ``batch_size``
    devices, one row each; otherwise on all of them. So do the sets for
    forward passes (an evaluation or inference iterator of batch 1 on two
    devices) and the training sets bound beside the training one (a Gluon
    ``DataLoader``'s short last batch of 1 row on two devices: the devices
    without a row add nothing to that step's gradient).
    """
    return list(work_load_list[: max(1, batch_size)])
