"""The checkpoint format: written atomically, verified when read.

A checkpoint is a folder ``checkpoint-<seq>-epoch<E>-batch<B>`` holding

``model-symbol.json``, ``model-<E>.params``
    The network and its parameters in MXNet's own format:
    ``mx.model.load_checkpoint('<folder>/model', E)`` and
    ``mx.mod.Module.load('<folder>/model', E)`` read them.
``optimizer.states``
    The optimizer with its per-parameter states (momentum, Adam's moments
    and step counts), as MXNet's updater dumps them
    (``get_states(dump_optimizer=True)``). Absent with a distributed
    kvstore, whose states live on the servers.
``loop.json``
    Plain JSON: the loop status and log, each extension's ``state_dict()``,
    NumPy's and Python's random states, the MXNet seed set at the save, and
    the position of the training iterator.
``MANIFEST.json``
    Written last: the format version and the size and SHA-256 of every
    other file.

Everything is first written to a hidden ``.tmp-...`` folder and renamed
into place when complete, so a process killed at any moment leaves the
previous checkpoints whole. A folder whose manifest is missing or does not
match its files is reported as damaged, naming the file.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import warnings
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import mxnet as mx

from .errors import clean_mxnet_message

__all__ = [
    "FORMAT_VERSION",
    "CheckpointContents",
    "CheckpointError",
    "checkpoint_name",
    "latest_checkpoint",
    "list_checkpoints",
    "read_checkpoint",
    "remove_checkpoint",
    "remove_stale_temporaries",
    "write_checkpoint",
]

FORMAT_VERSION = 1
PREFIX = "model"
MANIFEST = "MANIFEST.json"
LOOP_STATE = "loop.json"
OPTIMIZER_STATES = "optimizer.states"
_NAME = re.compile(r"^checkpoint-(\d+)-epoch(\d+)-batch(\d+)$")
_TEMPORARY = re.compile(r"^\.(?:tmp|old)-.*-(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint is incomplete or damaged; the message names the file."""


@dataclass
class CheckpointContents:
    """What :func:`read_checkpoint` returns."""

    path: str
    arg_params: Dict[str, mx.nd.NDArray]
    aux_params: Dict[str, mx.nd.NDArray]
    loop_state: Dict[str, Any]
    optimizer_states: Optional[bytes]


def checkpoint_name(sequence: int, epochs_done: int, iterations_done: int) -> str:
    """The folder name of a checkpoint."""
    return f"checkpoint-{sequence:06d}-epoch{epochs_done:04d}-batch{iterations_done:08d}"


def write_checkpoint(path: str, symbol: mx.sym.Symbol, arg_params: Dict[str, mx.nd.NDArray],
                     aux_params: Dict[str, mx.nd.NDArray], loop_state: Dict[str, Any],
                     optimizer_states: Optional[bytes]) -> str:
    """Write a checkpoint folder at ``path`` atomically (replacing one already there).

    Returns
    -------
    str
        ``path``.
    """
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    temporary = os.path.join(parent, f".tmp-{os.path.basename(path)}-{os.getpid()}")
    if os.path.exists(temporary):
        shutil.rmtree(temporary)
    os.makedirs(temporary)
    epoch = int(loop_state["status"]["epochs_done"])
    mx.model.save_checkpoint(os.path.join(temporary, PREFIX), epoch, symbol, arg_params, aux_params)
    with open(os.path.join(temporary, LOOP_STATE), "w") as handle:
        json.dump(loop_state, handle)
    if optimizer_states is not None:
        with open(os.path.join(temporary, OPTIMIZER_STATES), "wb") as handle:
            handle.write(optimizer_states)
    files = {}
    for name in sorted(os.listdir(temporary)):
        full = os.path.join(temporary, name)
        _fsync_file(full)
        files[name] = {"size": os.path.getsize(full), "sha256": _sha256(full)}
    manifest = {"format_version": FORMAT_VERSION, "epoch": epoch,
                "iterations_done": loop_state["status"]["iterations_done"], "files": files}
    with open(os.path.join(temporary, MANIFEST), "w") as handle:
        json.dump(manifest, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    if os.path.exists(path):
        retired = os.path.join(parent, f".old-{os.path.basename(path)}-{os.getpid()}")
        os.rename(path, retired)
        os.rename(temporary, path)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.rename(temporary, path)
    _fsync_directory(parent)
    return path


def list_checkpoints(directory: str) -> List[str]:
    """Checkpoint folders in ``directory`` (renamed into place, maybe damaged), oldest first."""
    if not os.path.isdir(directory):
        return []
    found = []
    for name in os.listdir(directory):
        match = _NAME.match(name)
        if match and os.path.isdir(os.path.join(directory, name)):
            found.append((int(match.group(1)), os.path.join(directory, name)))
    return [path for _, path in sorted(found)]


def read_checkpoint(path: str) -> CheckpointContents:
    """Read and verify one checkpoint folder.

    Raises
    ------
    CheckpointError
        When a file is missing, truncated, altered or unreadable; the message
        names it.
    """
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.isfile(manifest_path):
        raise CheckpointError(f"checkpoint {path} is incomplete: {manifest_path} is missing "
                              "(its write was interrupted); use an earlier checkpoint")
    manifest = _read_json(manifest_path)
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{manifest_path} has format version {manifest.get('format_version')}"
                              f"; this mxoid reads version {FORMAT_VERSION}")
    for name, expected in manifest["files"].items():
        full = os.path.join(path, name)
        if not os.path.isfile(full):
            raise CheckpointError(f"checkpoint file {full} is missing")
        if os.path.getsize(full) != expected["size"] or _sha256(full) != expected["sha256"]:
            raise CheckpointError(f"checkpoint file {full} is damaged: its size or SHA-256 "
                                  "differs from the manifest; use an earlier checkpoint")
    params_file = os.path.join(path, f"{PREFIX}-{manifest['epoch']:04d}.params")
    try:
        saved = mx.nd.load(params_file)
    except mx.base.MXNetError as error:
        raise CheckpointError(f"checkpoint file {params_file} cannot be read: "
                              f"{clean_mxnet_message(error)}") from None
    arg_params = {k[4:]: v for k, v in saved.items() if k.startswith("arg:")}
    aux_params = {k[4:]: v for k, v in saved.items() if k.startswith("aux:")}
    states_file = os.path.join(path, OPTIMIZER_STATES)
    states = None
    if OPTIMIZER_STATES in manifest["files"]:
        with open(states_file, "rb") as handle:
            states = handle.read()
    return CheckpointContents(path, arg_params, aux_params,
                              _read_json(os.path.join(path, LOOP_STATE)), states)


def latest_checkpoint(directory: str) -> Optional[CheckpointContents]:
    """Return the newest whole checkpoint in ``directory``, or None if there is none.

    Damaged or incomplete checkpoints are skipped with a warning naming the file.
    """
    for path in reversed(list_checkpoints(directory)):
        try:
            return read_checkpoint(path)
        except CheckpointError as error:
            warnings.warn(f"skipping a damaged checkpoint: {error}", stacklevel=2)
    return None


def remove_checkpoint(path: str) -> None:
    """Delete a checkpoint folder: rename it away first, so no half-deleted one is ever listed."""
    parent, name = os.path.split(os.path.abspath(path))
    doomed = os.path.join(parent, f".old-{name}-{os.getpid()}")
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def remove_stale_temporaries(directory: str) -> List[str]:
    """Delete the half-written folders that killed processes left in ``directory``.

    Only folders of processes that no longer run are removed. Returns their paths.
    """
    removed = []
    if not os.path.isdir(directory):
        return removed
    for name in os.listdir(directory):
        match = _TEMPORARY.match(name)
        if match and not _process_alive(int(match.group(1))):
            path = os.path.join(directory, name)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_json(path: str) -> Dict[str, Any]:
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"checkpoint file {path} is damaged: {error}") from None


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync_file(path: str) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _fsync_directory(path: str) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
