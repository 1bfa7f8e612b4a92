"""Checkpoint averaging, as Sockeye's ``sockeye.average``: the mean of several checkpoints.

:func:`average_checkpoints` returns the mean of the parameters of checkpoint
folders; :func:`choose_checkpoints` picks a directory's best ``n`` by a
record of their logs (or its last ``n``); :func:`write_average` writes the
mean in MXNet's format (``<out>-symbol.json``, ``<out>-0000.params``) and, for
a Gluon block's checkpoints, Gluon's (``<out>.params``, ``<out>-net-symbol.json``).
``mxoid average`` does the three.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Dict, List, Optional, Sequence, Tuple

import mxnet as mx
import numpy as np

from .directory import list_checkpoints
from .format import PREFIX, CheckpointError
from .reading import read_checkpoint

__all__ = ["average_checkpoints", "choose_checkpoints", "record_at", "write_average"]

GLUON_PARAMS, GLUON_SYMBOL = "net.params", "net-symbol.json"
Params = Tuple[Dict[str, mx.nd.NDArray], Dict[str, mx.nd.NDArray]]


def _mean(named: Sequence[Dict[str, mx.nd.NDArray]], what: str) -> Dict[str, mx.nd.NDArray]:
    names = set(named[0])
    for values in named[1:]:
        if set(values) != names:
            raise CheckpointError(
                f"the checkpoints hold different {what}: {sorted(names ^ set(values))}; "
                "average checkpoints of one network"
            )
    mean = {}
    for name in sorted(names):
        arrays = [values[name].asnumpy() for values in named]
        dtype = arrays[0].dtype
        mean[name] = mx.nd.array(np.mean(np.stack(arrays).astype(np.float64), axis=0), dtype=dtype)
    return mean


def average_checkpoints(folders: Sequence[str]) -> Params:
    """Return ``(arg_params, aux_params)``, the mean of the checkpoint folders' parameters.

    Each folder is read and verified (:func:`mxoid.checkpoint.read_checkpoint`);
    the mean is taken in float64 and given in each parameter's type. The
    BatchNorm statistics are averaged too, as Sockeye averages every array.

    Raises
    ------
    CheckpointError
        When a folder is damaged, or the folders hold different parameters.
    """
    if not folders:
        raise ValueError("average_checkpoints needs at least one checkpoint folder")
    contents = [read_checkpoint(os.fspath(folder)) for folder in folders]
    return (
        _mean([c.arg_params for c in contents], "parameters"),
        _mean([c.aux_params for c in contents], "auxiliary states"),
    )


def record_at(folder: str, record: str) -> Optional[float]:
    """Return the last value of ``record`` a checkpoint's log holds (None: never written)."""
    log = read_checkpoint(folder).loop_state["log"]
    value = None
    for _, row in log["rows"]:
        if isinstance(row.get(record), (int, float)) and not isinstance(row[record], bool):
            value = float(row[record])
    return value


def choose_checkpoints(
    directory: str, n: int, by: Optional[str] = None, mode: str = "min"
) -> List[str]:
    """Return ``directory``'s best ``n`` checkpoints by record ``by``, or its last ``n``.

    The value of a checkpoint is the last value of ``by`` in its own log;
    checkpoints whose log lacks it are left out. Best first (``mode``:
    ``'min'`` or ``'max'``); the last ``n`` newest first.
    """
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
    folders = list_checkpoints(directory)
    if by is None:
        return folders[::-1][:n]
    scored = [(record_at(f, by), i, f) for i, f in enumerate(folders)]
    scored = [(v if mode == "min" else -v, -i, f) for v, i, f in scored if v is not None]
    return [folder for _, _, folder in sorted(scored)[:n]]


def write_average(out: str, folders: Sequence[str], params: Params) -> List[str]:
    """Write the mean of ``folders`` (``params``) at prefix ``out``; return the files written.

    ``<out>-symbol.json`` (the first folder's network) and ``<out>-0000.params``:
    ``mx.mod.Module.load(out, 0)`` and ``gluon.SymbolBlock.imports`` read them.
    Checkpoints of a Gluon block also give ``<out>.params`` (``block.load_parameters``)
    and ``<out>-net-symbol.json`` (the block's graph in predict mode).
    """
    arg_params, aux_params = params
    newest = folders[0]
    written = [f"{out}-symbol.json", f"{out}-0000.params"]
    directory = os.path.dirname(os.path.abspath(out))
    os.makedirs(directory, exist_ok=True)
    shutil.copyfile(os.path.join(newest, f"{PREFIX}-symbol.json"), written[0])
    values: Dict[str, Any] = {f"arg:{k}": v for k, v in arg_params.items()}
    values.update({f"aux:{k}": v for k, v in aux_params.items()})
    mx.nd.save(written[1], values)
    if all(os.path.isfile(os.path.join(f, GLUON_PARAMS)) for f in folders):
        named = [mx.nd.load(os.path.join(f, GLUON_PARAMS)) for f in folders]
        mx.nd.save(f"{out}.params", _mean(named, "Gluon parameters"))
        shutil.copyfile(os.path.join(newest, GLUON_SYMBOL), f"{out}-{GLUON_SYMBOL}")
        written += [f"{out}.params", f"{out}-{GLUON_SYMBOL}"]
    return written
