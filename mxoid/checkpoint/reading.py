"""Reading one checkpoint folder, and verifying it: every file, and what the loop state says.

A folder whose manifest is missing, malformed or does not match its files,
or whose ``loop.json`` contradicts itself, is reported as damaged with a
:class:`~mxoid.checkpoint.format.CheckpointError` naming the file and the
field; one removed while it is read (a run pruning its directory) with a
:class:`~mxoid.checkpoint.format.CheckpointVanished`. Each file is read
once: what :func:`read_checkpoint` returns is the folder as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from typing import Any, Dict, Optional, Tuple

import mxnet as mx
import numpy as np

from ..errors import clean_mxnet_message
from .format import (
    FORMAT_VERSION,
    GRADIENTS,
    LOOP_STATE,
    LOOP_STATE_KEYS,
    MANIFEST,
    OPTIMIZER_STATES,
    PREFIX,
    SERVER_STATES,
    CheckpointContents,
    CheckpointError,
    CheckpointVanished,
)
from .random_state import check_random_states

__all__ = ["read_checkpoint", "read_manifest"]


def read_manifest(path: str) -> Dict[str, Any]:
    """Return the checked manifest of a checkpoint folder.

    Raises
    ------
    CheckpointError
        When it is missing, not JSON, of another format version, or lacks a field.
    """
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.isfile(manifest_path):
        raise CheckpointError(
            f"checkpoint {path} is incomplete: {manifest_path} is missing "
            "(its write was interrupted); use an earlier checkpoint"
        )
    manifest = _read_json(manifest_path)
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{manifest_path} is damaged: not a JSON object")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{manifest_path} has format version {manifest.get('format_version')}"
            f"; this mxoid reads version {FORMAT_VERSION}"
        )
    files = manifest.get("files")
    if (
        not isinstance(files, dict)
        or not isinstance(manifest.get("epoch"), int)
        or not all(
            isinstance(v, dict)
            and isinstance(v.get("size"), int)
            and isinstance(v.get("sha256"), str)
            for v in files.values()
        )
    ):
        raise CheckpointError(
            f"{manifest_path} is damaged: it lacks 'epoch' or the size and "
            "SHA-256 of each file ('files'); use an earlier checkpoint"
        )
    return manifest


# ------------------------------------------------------------------- reading
def read_checkpoint(path: str, *, check_finite: bool = False) -> CheckpointContents:
    """Read and verify one checkpoint folder.

    Every file must match the manifest, the loop state must have every part
    resumption needs, the optimizer states must load, and with
    ``check_finite`` every parameter must be finite. Everything is read once:
    the contents returned are the folder's as it was, even if it is removed
    afterwards.

    Raises
    ------
    CheckpointVanished
        When the folder is removed while it is read (a run pruning its
        directory): a newer checkpoint is there.
    CheckpointError
        When a file is missing, truncated, altered, malformed or unreadable;
        the message names it.
    """
    try:
        return _read_folder(path, check_finite)
    except (OSError, CheckpointError) as error:
        if not os.path.isdir(path):
            raise CheckpointVanished(
                f"checkpoint {path} was removed while it was read (the run writing into "
                "its directory pruned or replaced it); read the directory again for "
                "its newest checkpoint"
            ) from None
        if isinstance(error, OSError):
            raise CheckpointError(
                f"checkpoint {path} cannot be read: {error.strerror or error} "
                f"({error.filename or path})"
            ) from None
        raise


def _read_folder(path: str, check_finite: bool) -> CheckpointContents:
    manifest = read_manifest(path)
    files = manifest["files"]
    params_name = f"{PREFIX}-{manifest['epoch']:04d}.params"
    symbol_name = f"{PREFIX}-symbol.json"
    for required in (params_name, LOOP_STATE, symbol_name):
        if required not in files:
            raise CheckpointError(
                f"checkpoint {path} is damaged: its manifest does not list "
                f"{required}; use an earlier checkpoint"
            )
    contents = {}
    for name, expected in files.items():
        full = os.path.join(path, name)
        if not os.path.isfile(full):
            raise CheckpointError(f"checkpoint file {full} is missing")
        with open(full, "rb") as handle:
            data = handle.read()
        if len(data) != expected["size"] or hashlib.sha256(data).hexdigest() != expected["sha256"]:
            raise CheckpointError(
                f"checkpoint file {full} is damaged: its size or SHA-256 "
                "differs from the manifest; use an earlier checkpoint"
            )
        contents[name] = data
    params_file = os.path.join(path, params_name)
    arg_params, aux_params = _read_params(params_file, contents[params_name], check_finite)
    loop_state = _parse_json(os.path.join(path, LOOP_STATE), contents[LOOP_STATE])
    _check_loop_state(os.path.join(path, LOOP_STATE), loop_state)
    states = contents.get(OPTIMIZER_STATES)
    if states is not None:
        _check_optimizer_states(os.path.join(path, OPTIMIZER_STATES), states)
    server_states = None
    if SERVER_STATES in contents:
        server_states = _server_states(os.path.join(path, SERVER_STATES), contents[SERVER_STATES])
    gradients = None
    if GRADIENTS in contents:
        gradients = _load_arrays(os.path.join(path, GRADIENTS), contents[GRADIENTS])
    return CheckpointContents(
        path,
        arg_params,
        aux_params,
        loop_state,
        states,
        manifest,
        gradients,
        symbol_json=contents[symbol_name].decode("utf-8", errors="replace"),
        server_states=server_states,
    )


def _load_arrays(path: str, data: bytes) -> Any:
    """Return the arrays ``mx.nd.save`` wrote into ``path``, from the bytes read from it."""
    try:
        return mx.nd.load_frombuffer(data)
    except mx.base.MXNetError as error:
        raise CheckpointError(
            f"checkpoint file {path} cannot be read: {clean_mxnet_message(error)}"
        ) from None


def _read_params(
    params_file: str, data: bytes, check_finite: bool
) -> Tuple[Dict[str, mx.nd.NDArray], Dict[str, mx.nd.NDArray]]:
    saved = _load_arrays(params_file, data)
    if not isinstance(saved, dict) or not all(k.startswith(("arg:", "aux:")) for k in saved):
        raise CheckpointError(
            f"checkpoint file {params_file} is damaged: it does not hold "
            "MXNet's 'arg:' / 'aux:' named arrays"
        )
    if check_finite:
        bad = sorted(k[4:] for k, v in saved.items() if not np.all(np.isfinite(v.asnumpy())))
        if bad:
            raise CheckpointError(
                f"checkpoint file {params_file} holds NaN or infinite values "
                f"in {bad}: training had diverged when it was saved; resume "
                "from an earlier checkpoint"
            )
    arg_params = {k[4:]: v for k, v in saved.items() if k.startswith("arg:")}
    aux_params = {k[4:]: v for k, v in saved.items() if k.startswith("aux:")}
    return arg_params, aux_params


def _check_loop_state(path: str, state: Any) -> None:
    """Raise :class:`CheckpointError` naming the field of ``loop.json`` that is malformed."""
    missing = [key for key in LOOP_STATE_KEYS if not isinstance(state, dict) or key not in state]
    if missing:
        raise CheckpointError(
            f"checkpoint file {path} is damaged: it lacks {missing}; use an earlier checkpoint"
        )
    problem = _loop_state_problem(state)
    if problem is not None:
        raise CheckpointError(
            f"checkpoint file {path} is damaged: {problem}; use an earlier checkpoint"
        )


_COUNTERS = ("iterations_done", "updates_done", "epochs_done", "iterations_done_in_epoch")


def _loop_state_problem(state: Dict[str, Any]) -> Optional[str]:
    """Return what is malformed in a loop state, naming the field; None when it is well formed."""
    log, status, position = state["log"], state["status"], state["data_position"]
    if not isinstance(log, dict) or not isinstance(log.get("rows"), list):
        return "its 'log' is not a dict with a list of 'rows'"
    if not all(
        isinstance(row, list) and len(row) == 2 and _is_count(row[0]) and isinstance(row[1], dict)
        for row in log["rows"]
    ):
        return "its 'log.rows' are not [iteration, {record: value}] pairs"
    if not isinstance(status, dict):
        return "its 'status' is not a dict"
    for name in _COUNTERS:
        if name in status and not _is_count(status[name]):
            return f"its 'status.{name}' is {status[name]!r}, not a count"
    if not _is_count(status.get("iterations_done")) or not _is_count(status.get("epochs_done")):
        return "its 'status' lacks iterations_done or epochs_done"
    if status.get("iterations_done_in_epoch", 0) > status["iterations_done"]:
        return "its 'status.iterations_done_in_epoch' exceeds 'status.iterations_done'"
    if not isinstance(state["extensions"], dict):
        return "its 'extensions' is not a dict"
    if not isinstance(position, dict) or "kind" not in position:
        return "its 'data_position' is not a dict with a 'kind'"
    for field, random_state in (
        ("random", state["random"]),
        ("data_position.epoch_start_random", position.get("epoch_start_random")),
    ):
        if field == "random" or random_state is not None:
            problem = check_random_states(random_state)
            if problem is not None:
                return f"its '{field}' is malformed: {problem}"
    seed = state.get("mxnet_seed")
    if seed is not None and not _is_count(seed):
        return f"its 'mxnet_seed' is {seed!r}, not an int >= 0"
    return None


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_optimizer_states(path: str, states: bytes) -> None:
    try:
        loaded = pickle.loads(states)
    except Exception as error:  # pickle raises many kinds for garbage
        raise CheckpointError(
            f"checkpoint file {path} is damaged: the optimizer states do not "
            f"load ({type(error).__name__}: {error}); use an earlier "
            "checkpoint"
        ) from None
    if not (
        isinstance(loaded, tuple)
        and len(loaded) == 2
        and isinstance(loaded[0], dict)
        and isinstance(loaded[1], mx.optimizer.Optimizer)
    ):
        raise CheckpointError(
            f"checkpoint file {path} is damaged: it does not hold an "
            "optimizer and its states; use an earlier checkpoint"
        )


def _server_states(path: str, data: bytes) -> Dict[str, Any]:
    """Return the servers' states of ``servers-optimizer.states``, each server's dump checked."""
    try:
        loaded = pickle.loads(data)
        dumps = loaded["servers"]
        layout = loaded["layout"]
        whole = isinstance(dumps, list) and {"num_servers", "bigarray_bound"} <= set(layout)
        for dump in dumps if whole else ():
            states = pickle.loads(dump)
            whole = whole and isinstance(states, tuple) and len(states) == 2
            whole = whole and isinstance(states[0], dict) and hasattr(states[1], "optimizer")
    except Exception:  # pickle raises many kinds for garbage
        whole = False
    if not whole:
        raise CheckpointError(
            f"checkpoint file {path} is damaged: it does not hold the parameter servers' "
            "optimizer states; use an earlier checkpoint"
        )
    return loaded


def _read_json(path: str) -> Any:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as error:
        raise CheckpointError(f"checkpoint file {path} cannot be read: {error}") from None
    return _parse_json(path, data)


def _parse_json(path: str, data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError as error:
        raise CheckpointError(f"checkpoint file {path} is damaged: {error}") from None
