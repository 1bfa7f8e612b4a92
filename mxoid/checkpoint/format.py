"""The checkpoint format: one folder, written atomically, verified when read.

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
    Plain JSON: the loop's :meth:`~mxoid.MainLoop.state_dict` (the keys of
    :data:`LOOP_STATE_KEYS`, and more).
``MANIFEST.json``
    Written last: the format version, the run the checkpoint belongs to,
    its sequence number, and the size and SHA-256 of every other file.

Everything is first written to a hidden ``.tmp-...`` folder and renamed
into place when complete, so a process killed at any moment leaves the
previous checkpoints whole. Replacing a folder (``best``) renames the old
one to ``.retired-...`` first; a process killed between the two renames
leaves it there, and :func:`mxoid.checkpoint.directory.clean_temporaries`
puts it back. A folder whose manifest is missing, malformed or does not
match its files is reported as damaged, naming the file. Directories of
checkpoints (order, locking, tidying, what ``resume_from`` names) are
:mod:`mxoid.checkpoint.directory`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import re
import shutil
import uuid
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import mxnet as mx
import numpy as np

from ..errors import clean_mxnet_message
from .random_state import check_random_states

__all__ = [
    "FORMAT_VERSION",
    "LOOP_STATE_KEYS",
    "CheckpointContents",
    "CheckpointError",
    "CheckpointVanished",
    "ResumeError",
    "checkpoint_name",
    "read_checkpoint",
    "read_manifest",
    "unique_token",
    "write_checkpoint",
]

FORMAT_VERSION = 1
PREFIX = "model"
MANIFEST = "MANIFEST.json"
LOOP_STATE = "loop.json"
OPTIMIZER_STATES = "optimizer.states"
GRADIENTS = "gradients.params"
FOLDER_NAME = re.compile(r"^checkpoint-(\d+)-epoch(\d+)-batch(\d+)$")
# .tmp-<name>-<token>: being written; .retired-<name>-<token>: a whole folder replaced by a
# newer one of the same name; .deleting-<name>-<token>: being deleted. (.old-... and
# .tmp-...-<pid> are the names of earlier mxoid versions.)
TEMPORARY_NAME = re.compile(r"^\.(tmp|retired|deleting|old)-(.+)-([0-9a-f]{12}|\d+)$")
LOOP_STATE_KEYS = (
    "log",
    "status",
    "extensions",
    "random",
    "data_position",
    "num_devices",
    "update_on_kvstore",
)
"""What every ``loop.json`` holds (:meth:`mxoid.MainLoop.state_dict` writes them, with more)."""

CANNOT_WRITE = (
    "cannot write checkpoint {path}: {cause}. Nothing was saved there (the "
    "previous checkpoints are whole); {fix}"
)


class CheckpointError(ValueError):
    """A checkpoint is incomplete, damaged or cannot be written; the message names the file."""


class CheckpointVanished(CheckpointError):
    """A checkpoint folder was removed while it was read.

    The run writing into its directory pruned it (``keep_last``) or replaced
    it (``best``): a newer checkpoint is there, and reading the directory
    again finds it.
    """


class ResumeError(ValueError):
    """The checkpoint is whole, but not of this training.

    It has another network, batch size, data, number of contexts or
    optimizer. The message names the checkpoint and the difference.
    """


@dataclass
class CheckpointContents:
    """What :func:`read_checkpoint` returns."""

    path: str
    arg_params: Dict[str, mx.nd.NDArray]
    aux_params: Dict[str, mx.nd.NDArray]
    loop_state: Dict[str, Any]
    optimizer_states: Optional[bytes]
    manifest: Dict[str, Any]
    gradients: Optional[Dict[str, mx.nd.NDArray]] = None
    """The gradients summed so far in a group of ``accumulate_batches``, by
    ``'<device>:<parameter>'``; None when the checkpoint is at a group's end."""
    symbol_json: str = ""
    """The network's symbol as JSON, as the folder held it when it was read."""

    @property
    def run_id(self) -> Optional[str]:
        """The run that wrote this checkpoint (None for checkpoints of mxoid 0.1)."""
        return self.manifest.get("run_id")


def checkpoint_name(sequence: int, epochs_done: int, iterations_done: int) -> str:
    """Return the folder name of a checkpoint."""
    return f"checkpoint-{sequence:06d}-epoch{epochs_done:04d}-batch{iterations_done:08d}"


def unique_token() -> str:
    """Return a short random token that makes a temporary folder's name unique."""
    return uuid.uuid4().hex[:12]


# ------------------------------------------------------------------- writing
def write_checkpoint(
    path: str,
    symbol: mx.sym.Symbol,
    arg_params: Dict[str, mx.nd.NDArray],
    aux_params: Dict[str, mx.nd.NDArray],
    loop_state: Dict[str, Any],
    optimizer_states: Optional[bytes],
    *,
    run_id: Optional[str] = None,
    sequence: Optional[int] = None,
    gradients: Optional[Dict[str, mx.nd.NDArray]] = None,
) -> str:
    """Write a checkpoint folder at ``path`` atomically (replacing one already there).

    ``gradients``, when given, go into ``gradients.params`` (the sums of a group of
    accumulated batches, which resumption needs in the middle of a group).

    Returns
    -------
    str
        ``path``.

    Raises
    ------
    CheckpointError
        When the folder cannot be written (full disk, read-only folder, a file
        in the way, a file size limit, state that JSON cannot hold); the
        message says which file, why, and what to do. The half-written
        temporary folder is removed, so a full disk is not kept full.
    """
    parent = os.path.dirname(os.path.abspath(path))
    temporary = os.path.join(parent, f".tmp-{os.path.basename(path)}-{unique_token()}")
    try:
        loop_json = _dump_json(loop_state, path)
        os.makedirs(parent, exist_ok=True)
        os.makedirs(temporary)
        _write_files(
            temporary,
            symbol,
            arg_params,
            aux_params,
            loop_json,
            optimizer_states,
            gradients,
            int(loop_state["status"]["epochs_done"]),
            {
                "run_id": run_id,
                "sequence": sequence,
                "iterations_done": loop_state["status"]["iterations_done"],
            },
        )
        _replace(temporary, path)
        _fsync_directory(parent)
    except BaseException as error:
        shutil.rmtree(temporary, ignore_errors=True)
        if isinstance(error, CheckpointError):
            raise
        if isinstance(error, (OSError, mx.base.MXNetError)):
            size = sum(
                a.size * np.dtype(a.dtype).itemsize
                for a in list(arg_params.values()) + list(aux_params.values())
            )
            raise CheckpointError(_write_failure(path, temporary, error, size)) from None
        raise
    return path


def _write_files(
    folder: str,
    symbol: mx.sym.Symbol,
    arg_params: Dict[str, mx.nd.NDArray],
    aux_params: Dict[str, mx.nd.NDArray],
    loop_json: str,
    optimizer_states: Optional[bytes],
    gradients: Optional[Dict[str, mx.nd.NDArray]],
    epoch: int,
    about: Dict[str, Any],
) -> None:
    mx.model.save_checkpoint(os.path.join(folder, PREFIX), epoch, symbol, arg_params, aux_params)
    if gradients:
        mx.nd.save(os.path.join(folder, GRADIENTS), gradients)
    with open(os.path.join(folder, LOOP_STATE), "w") as handle:
        handle.write(loop_json)
    if optimizer_states is not None:
        with open(os.path.join(folder, OPTIMIZER_STATES), "wb") as handle:
            handle.write(optimizer_states)
    files = {}
    for name in sorted(os.listdir(folder)):
        full = os.path.join(folder, name)
        _fsync_file(full)
        files[name] = {"size": os.path.getsize(full), "sha256": _sha256(full)}
    manifest = {"format_version": FORMAT_VERSION, "epoch": epoch, **about, "files": files}
    with open(os.path.join(folder, MANIFEST), "w") as handle:
        json.dump(manifest, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())


def _replace(temporary: str, path: str) -> None:
    """Rename ``temporary`` to ``path``; an existing ``path`` is retired first, then deleted.

    Between the two renames only the retired folder exists: :func:`clean_temporaries`
    puts it back if the process dies there.
    """
    if not os.path.lexists(path):
        os.rename(temporary, path)
        return
    if not os.path.isdir(path) or os.path.islink(path):
        raise FileExistsError(
            errno.EEXIST, "a file that is not a checkpoint folder is in the way", path
        )
    parent, name = os.path.split(path)
    retired = os.path.join(parent, f".retired-{name}-{unique_token()}")
    os.rename(path, retired)
    os.rename(temporary, path)
    shutil.rmtree(retired, ignore_errors=True)


def _write_failure(path: str, temporary: str, error: BaseException, size: int) -> str:
    """Say why a checkpoint could not be written, and what to do."""
    if isinstance(error, mx.base.MXNetError):
        # MXNet says only "FileStream.Write incomplete": write as much with Python to learn why.
        error = _probe_write(temporary, size) or error
        shutil.rmtree(temporary, ignore_errors=True)
    if isinstance(error, OSError):
        cause = f"{error.strerror or error} ({error.filename or path})"
        fix = fix_for(error, "fix the cause, then resume from the previous checkpoint")
    else:
        cause, fix = clean_mxnet_message(error), "fix the cause, then resume"
    return CANNOT_WRITE.format(path=path, cause=cause, fix=fix)


_FIXES = {
    errno.ENOSPC: "free disk space or point Checkpoint at another disk",
    errno.EDQUOT: "free space within your disk quota",
    errno.EFBIG: "raise the file size limit (ulimit -f)",
    errno.EROFS: "the file system is read-only: point Checkpoint at a writable folder",
    errno.EACCES: "make the folder writable, or point Checkpoint at another folder",
    errno.EPERM: "make the folder writable, or point Checkpoint at another folder",
    errno.EEXIST: "move the file that is in the way",
    errno.ENOTDIR: "a file stands where a folder is needed: move it away",
}


def fix_for(error: OSError, otherwise: str) -> str:
    """Return what to do about ``error``, met writing a checkpoint; ``otherwise`` when unknown."""
    return _FIXES.get(error.errno, otherwise)


def _probe_write(folder: str, size: int) -> Optional[OSError]:
    probe = os.path.join(folder, ".probe")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(probe, "wb") as handle:
            block = b"\0" * (1 << 16)
            for _ in range(size // len(block) + 1):
                handle.write(block)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:
        return error
    finally:
        try:
            os.remove(probe)
        except OSError:
            pass
    return None


def _dump_json(state: Dict[str, Any], path: str) -> str:
    """Return the loop state as JSON; a value JSON cannot hold is named by where it sits."""
    try:
        return json.dumps(state)
    except (TypeError, ValueError):
        pass
    for key, value in state.items():
        for inner, item in value.items() if key == "extensions" else [(None, value)]:
            try:
                json.dumps(item)
            except (TypeError, ValueError) as error:
                where = (
                    f"the state_dict() of extension {inner!r}"
                    if inner is not None
                    else f"the loop state {key!r}"
                )
                raise CheckpointError(
                    f"cannot write checkpoint {path}: {where} holds a value JSON cannot hold "
                    f"({error}); state_dict() must return plain data: numbers, strings, "
                    "None, lists and dicts with string keys"
                ) from None
    raise CheckpointError(f"cannot write checkpoint {path}: its state is not plain data")


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


# ------------------------------------------------------------------- helpers
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
