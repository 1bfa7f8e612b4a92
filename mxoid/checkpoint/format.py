"""The checkpoint format: one folder, written atomically, verified when read.

A checkpoint is a folder ``checkpoint-<seq>-epoch<E>-batch<B>`` holding

``model-symbol.json``, ``model-<E>.params``
    The network and its parameters in MXNet's own format:
    ``mx.model.load_checkpoint('<folder>/model', E)`` and
    ``mx.mod.Module.load('<folder>/model', E)`` read them.
``model.buckets``, ``model-<key>-symbol.json``
    With a ``sym_gen`` whose default bucket key is an int: what
    ``mx.mod.BucketingModule.load('<folder>/model', E, sym_gen, key)`` reads
    too (the default bucket's symbol; BucketingModule cannot load tuple keys).
``optimizer.states``
    The optimizer with its per-parameter states (momentum, Adam's moments
    and step counts), as MXNet's updater dumps them
    (``get_states(dump_optimizer=True)``). Absent with a distributed
    kvstore that updates, whose states live on the servers (see
    ``servers-optimizer.states``); present with
    ``update_on_kvstore=False`` (every worker holds the same states).
``servers-optimizer.states``
    With ``dist_sync`` and the optimizer on the parameter servers: every
    server's optimizer and states, as its updater dumps them, by server
    rank, with how the servers split the keys (a pickled dict: ``layout``,
    ``servers``; :mod:`mxoid.distributed.server_states`).
``loop.json``
    Plain JSON: the loop's :meth:`~mxoid.MainLoop.state_dict` (the keys of
    :data:`LOOP_STATE_KEYS`, and more); in distributed training also
    ``rank_states``, every worker's own random states, iterator position and
    MXNet seed, by rank (:mod:`mxoid.main_loop.ranks`).
``MANIFEST.json``
    Written last: the format version, the run the checkpoint belongs to,
    its sequence number, and the size and SHA-256 of every other file.

Everything is first written to a hidden ``.tmp-...`` folder and renamed
into place when complete, so a process killed at any moment leaves the
previous checkpoints whole. Replacing a folder (``best``) renames the old
one to ``.retired-...`` first; a process killed between the two renames
leaves it there, and :func:`mxoid.checkpoint.directory.clean_temporaries`
puts it back. Reading and verifying a folder is :mod:`mxoid.checkpoint.reading`;
directories of checkpoints (order, locking, tidying, what ``resume_from``
names) are :mod:`mxoid.checkpoint.directory`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import mxnet as mx
import numpy as np

from ..errors import clean_mxnet_message
from ..loss_scale import without_loss_scale

__all__ = [
    "FORMAT_VERSION",
    "LOOP_STATE_KEYS",
    "CheckpointContents",
    "CheckpointError",
    "CheckpointVanished",
    "ResumeError",
    "checkpoint_name",
    "fix_for",
    "unique_token",
    "write_checkpoint",
]

FORMAT_VERSION = 1
PREFIX = "model"
MANIFEST = "MANIFEST.json"
LOOP_STATE = "loop.json"
OPTIMIZER_STATES = "optimizer.states"
SERVER_STATES = "servers-optimizer.states"
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
    server_states: Optional[Dict[str, Any]] = None
    """The parameter servers' optimizer states (``layout``, and ``servers``: each
    server's dump, by rank); None when the checkpoint holds none."""

    @property
    def run_id(self) -> Optional[str]:
        """The run that wrote this checkpoint (None for checkpoints of mxoid 0.1)."""
        return self.manifest.get("run_id")

    @property
    def identity(self) -> Tuple[Optional[str], Any, int, str]:
        """(run, sequence number, batches done, path): which checkpoint this is, on any host."""
        status = self.loop_state.get("status", {})
        return (
            self.run_id,
            self.manifest.get("sequence"),
            status.get("iterations_done", 0),
            self.path,
        )


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
    extra_files: Optional[Dict[str, Callable[[str], Any]]] = None,
) -> str:
    """Write a checkpoint folder at ``path`` atomically (replacing one already there).

    ``gradients``, when given, go into ``gradients.params`` (the sums of a group of
    accumulated batches, which resumption needs in the middle of a group).
    ``extra_files``: file name -> a function writing it at the path it is given (a
    Gluon block's ``net.params``), listed in the manifest and verified as the others.

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
            loop_state.get("default_bucket_key"),
            extra_files or {},
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


def _save_model(
    prefix: str,
    epoch: int,
    symbol: mx.sym.Symbol,
    arg_params: Dict[str, mx.nd.NDArray],
    aux_params: Dict[str, mx.nd.NDArray],
) -> None:
    """Write ``mx.model.save_checkpoint``'s two files, without its log line.

    MXNet logs ``Saved checkpoint to "<file>"`` at INFO, which would name the
    temporary folder (gone once the checkpoint is whole); the Checkpoint
    extension logs the folder's final path once.
    """
    symbol.save(f"{prefix}-symbol.json", remove_amp_cast=True)
    values = {f"arg:{name}": value.as_in_context(mx.cpu()) for name, value in arg_params.items()}
    values.update(
        {f"aux:{name}": value.as_in_context(mx.cpu()) for name, value in aux_params.items()}
    )
    mx.nd.save(f"{prefix}-{epoch:04d}.params", values)


def _write_files(
    folder: str,
    symbol: mx.sym.Symbol,
    arg_params: Dict[str, mx.nd.NDArray],
    aux_params: Dict[str, mx.nd.NDArray],
    loop_json: str,
    optimizer_states: Optional[bytes],
    gradients: Optional[Dict[str, mx.nd.NDArray]],
    epoch: int,
    bucket_key: Any,
    extra_files: Dict[str, Callable[[str], Any]],
    about: Dict[str, Any],
) -> None:
    symbol = without_loss_scale(symbol)  # the network as given (mxoid.loss_scale)
    _save_model(os.path.join(folder, PREFIX), epoch, symbol, arg_params, aux_params)
    if isinstance(bucket_key, int) and not isinstance(bucket_key, bool):
        # What BucketingModule.load(prefix, epoch, sym_gen, default_bucket_key) reads too.
        mx.nd.save(
            os.path.join(folder, f"{PREFIX}.buckets"), mx.nd.array([bucket_key], dtype="int32")
        )
        symbol.save(os.path.join(folder, f"{PREFIX}-{bucket_key}-symbol.json"))
    if gradients:
        mx.nd.save(os.path.join(folder, GRADIENTS), gradients)
    for name, write in extra_files.items():
        write(os.path.join(folder, name))
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


# ------------------------------------------------------------------- helpers
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
