"""Trained models from where MXNet and mxoid save them: for fine-tuning and inference.

:func:`load_model` and :func:`load_params` accept

- an mxoid checkpoint folder (``checkpoint-0003-epoch2-batch0``);
- an mxoid checkpoint directory: its newest whole checkpoint, or with
  ``epoch=e`` the newest whole one taken when ``e`` epochs were done;
- a Module checkpoint prefix (``mx.model.save_checkpoint(prefix, epoch, ...)``
  or ``Module.save_checkpoint``: ``prefix-symbol.json`` and
  ``prefix-NNNN.params``): the highest epoch saved, or ``epoch``;
- a ``.params`` file as ``mx.nd.save`` writes it (``arg:`` / ``aux:``
  prefixes as Module saves them; names without a prefix are ``arg_params``).
"""

from __future__ import annotations

import glob
import os
import re
from typing import Dict, List, Optional, Tuple

import mxnet as mx

from ..errors import clean_mxnet_message
from .directory import is_checkpoint_folder, newest_whole
from .format import FOLDER_NAME, CheckpointContents, CheckpointError
from .reading import read_checkpoint

__all__ = ["checkpoint_of_epoch", "load_model", "load_params"]

Params = Dict[str, mx.nd.NDArray]


def load_params(
    source: os.PathLike[str] | str, epoch: Optional[int] = None
) -> Tuple[Params, Params]:
    """Return ``(arg_params, aux_params)`` saved at ``source`` (see the module's documentation).

    Examples
    --------
    .. code-block:: python

        arg_params, aux_params = mxoid.load_params("pretrained/lenet", epoch=10)
        del arg_params["fc2_weight"], arg_params["fc2_bias"]  # a new head
        MainLoop(new_net, data, arg_params=arg_params, aux_params=aux_params,
                 allow_extra=True, fixed_param_names=["conv1_weight", "conv1_bias"], ...)
    """
    _, arg_params, aux_params = load_model(source, epoch, need_symbol=False)
    return arg_params, aux_params


def load_model(
    source: os.PathLike[str] | str, epoch: Optional[int] = None, *, need_symbol: bool = True
) -> Tuple[Optional[mx.sym.Symbol], Params, Params]:
    """Return ``(symbol, arg_params, aux_params)`` saved at ``source``.

    The symbol is None for a ``.params`` file (which holds none); with
    ``need_symbol`` that is an error.

    Raises
    ------
    FileNotFoundError
        When ``source`` names nothing saved, with what was looked for.
    CheckpointError
        When what it names is damaged or incomplete.
    """
    path = os.fspath(source)
    full = os.path.abspath(path)
    if is_checkpoint_folder(full):
        return _from_checkpoint(read_checkpoint(full))
    if os.path.isdir(full):
        return _from_checkpoint(_newest_of_epoch(full, epoch))
    if os.path.isfile(full):
        if need_symbol:
            raise ValueError(
                f"{path!r} is a parameters file, without the network; give a Module "
                "checkpoint prefix or an mxoid checkpoint instead"
            )
        arg_params, aux_params = _split(_load_ndarrays(full))
        return None, arg_params, aux_params
    symbol, arg_params, aux_params = _from_prefix(path, epoch)
    if symbol is None and need_symbol:
        raise FileNotFoundError(f"no {path}-symbol.json: the Module checkpoint lacks its network")
    return symbol, arg_params, aux_params


def _from_checkpoint(contents: CheckpointContents) -> Tuple[mx.sym.Symbol, Params, Params]:
    try:
        symbol = mx.sym.load_json(contents.symbol_json)
    except mx.base.MXNetError as error:
        raise CheckpointError(
            f"the network of checkpoint {contents.path} cannot be read: "
            f"{clean_mxnet_message(error)}"
        ) from None
    return symbol, contents.arg_params, contents.aux_params


def checkpoint_of_epoch(directory: str, epoch: Optional[int] = None) -> str:
    """Return the newest whole checkpoint folder in ``directory`` (taken after ``epoch`` epochs).

    Raises
    ------
    FileNotFoundError
        When there is none (saying which were damaged).
    """
    return _newest_of_epoch(directory, epoch).path


def _newest_of_epoch(directory: str, epoch: Optional[int]) -> CheckpointContents:
    """Read the newest whole checkpoint in ``directory`` (taken after ``epoch`` epochs), once."""

    def of_epoch(folders: List[str]) -> List[str]:
        if epoch is None:
            return folders
        return [f for f in folders if int(FOLDER_NAME.match(os.path.basename(f)).group(2)) == epoch]

    contents, damaged = newest_whole(directory, read_checkpoint, of_epoch)
    if contents is not None:
        return contents
    at = "" if epoch is None else f" taken after epoch {epoch}"
    detail = f" (damaged: {'; '.join(map(str, damaged.values()))})" if damaged else ""
    raise FileNotFoundError(f"{directory!r} holds no whole mxoid checkpoint{at}{detail}")


def _from_prefix(
    prefix: str, epoch: Optional[int]
) -> Tuple[Optional[mx.sym.Symbol], Params, Params]:
    symbol_file = f"{prefix}-symbol.json"
    if epoch is None:
        pattern = re.compile(re.escape(os.path.basename(prefix)) + r"-(\d{4,})\.params$")
        epochs = sorted(
            int(m.group(1))
            for m in (
                pattern.match(os.path.basename(f))
                for f in glob.glob(f"{glob.escape(prefix)}-*.params")
            )
            if m
        )
        if not epochs:
            raise FileNotFoundError(
                f"nothing saved at {prefix!r}: it is not an mxoid checkpoint folder or "
                f"directory, nor a file, and there is no {prefix}-NNNN.params (a Module "
                "checkpoint prefix)"
            )
        epoch = epochs[-1]
    params_file = f"{prefix}-{epoch:04d}.params"
    if not os.path.isfile(params_file):
        raise FileNotFoundError(f"no {params_file} (Module checkpoint {prefix!r}, epoch {epoch})")
    symbol = None
    if os.path.isfile(symbol_file):
        try:
            symbol = mx.sym.load(symbol_file)
        except mx.base.MXNetError as error:
            raise CheckpointError(
                f"{symbol_file} cannot be read: {clean_mxnet_message(error)}"
            ) from None
    arg_params, aux_params = _split(_load_ndarrays(params_file))
    return symbol, arg_params, aux_params


def _load_ndarrays(path: str) -> Dict[str, mx.nd.NDArray]:
    try:
        loaded = mx.nd.load(path)
    except mx.base.MXNetError as error:
        raise CheckpointError(f"{path} cannot be read: {clean_mxnet_message(error)}") from None
    if not isinstance(loaded, dict):
        raise CheckpointError(f"{path} holds a list of arrays without names, not parameters")
    return loaded


def _split(loaded: Dict[str, mx.nd.NDArray]) -> Tuple[Params, Params]:
    arg_params: Params = {}
    aux_params: Params = {}
    for key, value in loaded.items():
        kind, _, name = key.partition(":")
        if kind == "aux" and name:
            aux_params[name] = value
        else:
            arg_params[name if kind == "arg" and name else key] = value
    return arg_params, aux_params
