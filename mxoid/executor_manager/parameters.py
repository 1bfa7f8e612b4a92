"""Parameter values in and out of the devices: checked copies in, MXNet's averages out."""

from __future__ import annotations

from typing import List, Mapping, Sequence, Union

import mxnet as mx
import numpy as np

__all__ = ["copy_into_devices", "host_average"]

ArrayLike = Union[mx.nd.NDArray, np.ndarray]


def copy_into_devices(
    kind: str,
    values: Mapping[str, ArrayLike],
    names: Sequence[str],
    arrays: Sequence[List[mx.nd.NDArray]],
) -> None:
    """Copy ``values`` by name into every device's array of that name (cast to its type).

    Raises
    ------
    ValueError
        For a name not in ``names`` or a value of another shape, naming ``kind``
        (``'arg_params'``, ``'aux_params'``).
    """
    index = {n: i for i, n in enumerate(names)}
    unknown = sorted(set(values) - set(index))
    if unknown:
        raise ValueError(
            f"{kind} has {unknown}, which the symbol does not have; its {kind} are {list(names)}"
        )
    for name, value in values.items():
        for target in arrays[index[name]]:
            if tuple(value.shape) != target.shape:
                raise ValueError(
                    f"{kind}[{name!r}] has shape {tuple(value.shape)}, "
                    f"the symbol needs {target.shape}"
                )
            if isinstance(value, mx.nd.NDArray):
                value.astype(target.dtype, copy=False).copyto(target)
            else:
                target[:] = np.asarray(value, dtype=target.dtype)


def host_average(block: Sequence[mx.nd.NDArray]) -> mx.nd.NDArray:
    """Return the average of one array's copies on the devices, on the host.

    MXNet's arithmetic (``Module.get_params``, the manager's ``copy_to``):
    ``(0 + a0 + a1 + ...) / n``; one device's array is copied as it is.
    """
    cpu = mx.cpu()
    if len(block) == 1:
        return block[0].copyto(cpu)
    return sum(array.copyto(cpu) for array in block) / len(block)
