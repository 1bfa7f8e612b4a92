"""The loop's own state in a checkpoint, and putting it back on resumption.

Parameters and optimizer states are saved in MXNet's own formats (see
:mod:`mxoid.checkpoint`); this module handles the rest: the log and status,
each extension's ``state_dict()``, NumPy's and Python's random states, the
MXNet seed, the training iterator's position, and the checks that the
resumed loop is the same training as the one saved.

What ``resume_from`` accepts
----------------------------
- A directory of checkpoints (what ``Checkpoint(directory)`` writes): the
  newest whole checkpoint in it, by order of writing. Damaged ones are
  skipped with a warning; when every checkpoint is damaged it is an error.
  A directory holding no checkpoint at all (or not yet existing, when it is
  the directory of one of the loop's own ``Checkpoint`` extensions) starts
  a new run, with a warning.
- One checkpoint folder (``.../checkpoint-000012-epoch0003-batch00000120``,
  or ``.../best``): exactly that checkpoint; damage is an error.

Anything else (a path that does not exist, a file) is an error.

What must match, and what may change
------------------------------------
Must match, or resumption is refused with an error naming the checkpoint:
the network (its parameter and auxiliary names and shapes), the number of
contexts, where the optimizer runs (``update_on_kvstore``), the optimizer's
type, the training batch size, and the training data (number of samples of
an ``NDArrayIter``, shapes of the inputs). May change, with a warning naming
each change: the optimizer's settings (learning rate, momentum, weight
decay, multipliers...): the value given to the resumed ``MainLoop`` wins
over the one the run started with, and the optimizer's state (momentum,
update counts, schedule) is kept. Extensions may change; those whose name
matches one in the checkpoint get its state back.
"""
from __future__ import annotations

import logging
import os
import warnings
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import mxnet as mx

from .checkpoint import (CheckpointContents, CheckpointError, is_checkpoint_folder,
                         list_checkpoints, read_checkpoint)
from .data_position import get_random_states, set_random_states
from .extensions.base import Extension
from .extensions.records import plain_value
from .log_files import RESUMED_FROM

if TYPE_CHECKING:  # pragma: no cover
    from .main_loop import MainLoop

__all__ = ["ResumeError", "checkpoint_folder", "extension_keys", "find_checkpoint", "loop_state",
           "optimizer_settings", "optimizer_states", "restore_loop"]

logger = logging.getLogger(__name__)

NO_CHECKPOINT_YET = ("resume_from={path!r} holds no whole checkpoint yet (no checkpoint at all): "
                     "training starts from scratch")
NOT_FOUND = ("resume_from={path!r} does not exist. To resume, give the directory a Checkpoint "
             "extension wrote into (or one checkpoint folder inside it); to start a new run, "
             "give no resume_from, or the directory of this loop's own Checkpoint")
ALL_DAMAGED = ("every checkpoint in {path} is damaged, so there is nothing to resume from:\n"
               "{errors}\nRepair or remove them to start over there, or resume from another "
               "directory")
_NOT_SETTINGS = ("begin_num_update", "num_update", "idx2name", "sym_info", "param_dict",
                 "aggregate_num", "allow_np_array")


class ResumeError(ValueError):
    """The checkpoint is whole, but not of this training: another network, batch size, data,
    number of contexts or optimizer. The message names the checkpoint and the difference."""


def checkpoint_folder(path: str) -> str:
    """The Checkpoint directory (what ``resume_from`` takes) of a checkpoint folder."""
    return os.path.dirname(os.path.abspath(path))


# ------------------------------------------------------------ finding
def find_checkpoint(resume_from: Optional["os.PathLike[str] | str"],
                    own_directories: Sequence[str] = (),
                    check: Any = None) -> Optional[CheckpointContents]:
    """The checkpoint ``resume_from`` names, under the rules of this module's documentation.

    Parameters
    ----------
    resume_from : str or path-like or None
    own_directories : sequence of str
        The directories of the loop's Checkpoint extensions: one of them may
        not exist yet (a first run).
    check : callable, optional
        ``check(contents)`` raises :class:`CheckpointError` when a whole
        checkpoint lacks something this loop needs (a damaged one: an earlier
        checkpoint is tried) or :class:`ResumeError` when it belongs to another
        training (never retried).

    Raises
    ------
    CheckpointError, ResumeError, ValueError
    """
    if resume_from is None:
        return None
    path = os.path.abspath(os.fspath(resume_from))
    check = check or (lambda contents: None)
    if is_checkpoint_folder(path):
        contents = read_checkpoint(path, check_finite=True)
        check(contents)
        return contents
    if not os.path.exists(path):
        if path in {os.path.abspath(d) for d in own_directories}:
            warnings.warn(NO_CHECKPOINT_YET.format(path=os.fspath(resume_from)), stacklevel=3)
            return None
        raise ValueError(NOT_FOUND.format(path=os.fspath(resume_from)))
    if not os.path.isdir(path):
        raise ValueError(f"resume_from={os.fspath(resume_from)!r} is a file, not a checkpoint "
                         "directory or folder")
    folders = list_checkpoints(path)
    if not folders:
        warnings.warn(NO_CHECKPOINT_YET.format(path=os.fspath(resume_from)), stacklevel=3)
        return None
    errors: List[str] = []
    for folder in reversed(folders):
        try:
            contents = read_checkpoint(folder, check_finite=True)
            check(contents)
            return contents
        except CheckpointError as error:
            errors.append(f"- {error}")
            warnings.warn(f"skipping a damaged checkpoint: {error}", stacklevel=3)
    raise CheckpointError(ALL_DAMAGED.format(path=path, errors="\n".join(errors)))


def check_compatible(loop: "MainLoop", contents: CheckpointContents) -> None:
    """Raise when ``contents`` cannot resume ``loop`` (see :func:`find_checkpoint`'s ``check``).

    Called before the loop has an optimizer: it checks the network, the
    parameters, the batch size, the data and the devices.
    """
    where = contents.path
    manager = loop.manager
    try:
        saved_symbol = mx.sym.load_json(contents.symbol_json)
    except mx.base.MXNetError:
        raise CheckpointError(f"checkpoint {where}: its model-symbol.json does not load") from None
    data_shapes = {d.name: tuple(d.shape) for d in manager.data_descs + manager.label_descs}
    ours = _parameter_shapes(loop.symbol, data_shapes)
    try:
        theirs = _parameter_shapes(saved_symbol, data_shapes)
    except mx.base.MXNetError:
        theirs = None
    if theirs != ours:
        raise ResumeError(_network_difference(where, ours, theirs))
    for kind, saved, expected in (("parameter", contents.arg_params, ours[0]),
                                  ("auxiliary state", contents.aux_params, ours[1])):
        missing = sorted(set(expected) - set(saved))
        if missing:
            raise CheckpointError(f"checkpoint {where} is damaged: it lacks the {kind}s "
                                  f"{missing} of its own network")
        for name, shape in expected.items():
            if tuple(saved[name].shape) != shape:
                raise CheckpointError(f"checkpoint {where} is damaged: {kind} {name!r} has "
                                      f"shape {tuple(saved[name].shape)}, its network needs {shape}")
    state = contents.loop_state
    for key, here in (("num_devices", len(loop.contexts)),
                      ("update_on_kvstore", loop.update_on_kvstore),
                      ("batch_size", manager.batch_size)):
        if key in state and state[key] != here:
            raise ResumeError(f"checkpoint {where} was saved with {key}={state[key]}, this loop "
                              f"has {key}={here}; exact resumption needs the same. Resume with "
                              f"the same setting, or start a new run from the checkpoint's "
                              "parameters (MainLoop(..., arg_params=..., aux_params=...))")
    if not loop.update_on_kvstore or not _distributed(loop):
        if contents.optimizer_states is None:
            raise CheckpointError(f"checkpoint {where} is damaged: it lacks optimizer.states "
                                  "(the momentum and update counts)")
    loop.data_position.check(state["data_position"], where)


def _distributed(loop: "MainLoop") -> bool:
    return loop.kvstore is not None and "dist" in loop.kvstore.type


def _parameter_shapes(symbol: mx.sym.Symbol, data_shapes: Dict[str, Tuple[int, ...]]
                      ) -> Tuple[Dict[str, Tuple[int, ...]], Dict[str, Tuple[int, ...]]]:
    known = {n: s for n, s in data_shapes.items() if n in symbol.list_arguments()}
    arg_shapes, _, aux_shapes = symbol.infer_shape(**known)
    args = {n: tuple(s) for n, s in zip(symbol.list_arguments(), arg_shapes) if n not in known}
    aux = {n: tuple(s) for n, s in zip(symbol.list_auxiliary_states(), aux_shapes)}
    return args, aux


def _network_difference(where: str, ours: Tuple[Dict, Dict],
                        theirs: Optional[Tuple[Dict, Dict]]) -> str:
    if theirs is None:
        return (f"checkpoint {where} was saved from another network: its symbol does not take "
                "this loop's inputs. Resume with the network it was trained with, or start a new "
                "run from its parameters")
    ours_all, theirs_all = {**ours[0], **ours[1]}, {**theirs[0], **theirs[1]}
    only_saved = sorted(set(theirs_all) - set(ours_all))
    only_here = sorted(set(ours_all) - set(theirs_all))
    shapes = sorted(f"{n}: {theirs_all[n]} saved, {ours_all[n]} here"
                    for n in set(ours_all) & set(theirs_all) if ours_all[n] != theirs_all[n])
    parts = [f"only in the checkpoint: {only_saved}" if only_saved else "",
             f"only in this network: {only_here}" if only_here else "",
             f"other shapes: {shapes}" if shapes else ""]
    return (f"checkpoint {where} was saved from another network ("
            + "; ".join(p for p in parts if p) + "). Resume with the network it was trained "
            "with, or start a new run from its parameters (MainLoop(..., arg_params=...))")


# ------------------------------------------------------------ saving
def extension_keys(extensions: Sequence[Extension]) -> Dict[str, Extension]:
    """Extensions by a key unique in the loop: the name, then ``name#2``... for repeats."""
    keys: Dict[str, Extension] = {}
    for extension in extensions:
        key, count = extension.name, 1
        while key in keys:
            count += 1
            key = f"{extension.name}#{count}"
        keys[key] = extension
    return keys


def optimizer_settings(optimizer: mx.optimizer.Optimizer) -> Dict[str, Any]:
    """The optimizer's type and settings (not its state), as plain data."""
    settings: Dict[str, Any] = {}
    for name, value in vars(optimizer).items():
        if name.startswith("_") or name in _NOT_SETTINGS:
            continue
        if name in ("lr_mult", "wd_mult"):
            settings[name] = {str(k): float(v) for k, v in value.items()}
        elif name == "lr_scheduler":
            settings[name] = None if value is None else type(value).__name__
        elif value is None or isinstance(value, (bool, int, float, str)):
            settings[name] = value
    return {"type": type(optimizer).__name__, "settings": settings}


def loop_state(loop: "MainLoop") -> Dict[str, Any]:
    """Return the loop's state as plain JSON-ready data."""
    log_state = loop.log.state_dict()
    log_state["rows"] = [[i, {k: plain_value(v) for k, v in row.items()}]
                         for i, row in log_state["rows"]]
    return {"log": log_state,
            "status": loop.status.state_dict(),
            "extensions": {key: extension.state_dict()
                           for key, extension in extension_keys(loop.extensions).items()},
            "random": get_random_states(),
            "data_position": loop.data_position.state_dict(),
            "num_devices": len(loop.contexts),
            "update_on_kvstore": loop.update_on_kvstore,
            "batch_size": loop.manager.batch_size,
            "run_id": loop.run_id,
            "optimizer": loop.optimizer_settings}


def optimizer_states(loop: "MainLoop") -> Optional[bytes]:
    """The optimizer and its states as MXNet dumps them, or None with a distributed
    kvstore (whose states live on the servers)."""
    if loop.update_on_kvstore:
        updater = getattr(loop.kvstore, "_updater", None)
        return None if updater is None else updater.get_states(dump_optimizer=True)
    return loop.updater.get_states(dump_optimizer=True)


# ------------------------------------------------------------ restoring
def restore_loop(loop: "MainLoop", checkpoint: CheckpointContents) -> None:
    """Put the optimizer states, log, status, extension states, iterator position and
    random states of ``checkpoint`` back into ``loop`` (parameters are set before)."""
    state = checkpoint.loop_state
    if checkpoint.optimizer_states is not None:
        _restore_optimizer(loop, checkpoint)
    loop.log.load_state_dict(state["log"])
    loop.log.current_row[RESUMED_FROM] = checkpoint.path
    status = loop.status
    status.load_state_dict(state["status"])
    status.stop_requested, status.stop_reason = False, None
    status.training_finished, status.epoch_interrupt_received = False, False
    status.interrupted = None
    if loop.kvstore is not None:
        status.rank, status.num_workers = loop.kvstore.rank, loop.kvstore.num_workers
    loop.run_id = state.get("run_id") or checkpoint.run_id or loop.run_id
    saved = state["extensions"]
    for key, extension in extension_keys(loop.extensions).items():
        if key in saved:
            try:
                extension.load_state_dict(saved[key])
            except (KeyError, TypeError, ValueError, AttributeError) as error:
                raise CheckpointError(f"checkpoint {checkpoint.path}: the state of extension "
                                      f"{key!r} does not load ({type(error).__name__}: "
                                      f"{error})") from None
    loop.data_position.restore(state["data_position"], status.epochs_done,
                               status.epoch_started, status.iterations_done_in_epoch)
    set_random_states(state["random"])
    if state.get("mxnet_seed") is not None:
        mx.random.seed(int(state["mxnet_seed"]))
    logger.info("resumed from %s after %d epochs, %d batches", checkpoint.path,
                status.epochs_done, status.iterations_done)


def _restore_optimizer(loop: "MainLoop", checkpoint: CheckpointContents) -> None:
    """The checkpoint's optimizer and states, with the settings the resumed loop was given
    where they changed."""
    updater = loop.kvstore._updater if loop.update_on_kvstore else loop.updater
    given = loop.optimizer_settings
    updater.set_states(checkpoint.optimizer_states)
    restored = updater.optimizer
    if type(restored).__name__ != given["type"]:
        raise ResumeError(
            f"checkpoint {checkpoint.path} was trained with the optimizer {type(restored).__name__}"
            f", this loop has {given['type']}; its states (momentum, moments) do not fit another "
            f"optimizer. Resume with optimizer={type(restored).__name__.lower()!r}, or start a "
            "new run from the checkpoint's parameters")
    started = (checkpoint.loop_state.get("optimizer") or {}).get("settings", {})
    for name, value in given["settings"].items():
        if name not in started or started[name] == value:
            continue
        if name == "lr_scheduler":
            warnings.warn(f"resuming from {checkpoint.path}: the optimizer's lr_scheduler "
                          f"changed ({started[name]} -> {value}); the checkpoint's scheduler "
                          "and its state are kept", stacklevel=4)
            continue
        current = getattr(restored, name, None)
        if name in ("lr_mult", "wd_mult"):
            getattr(restored, name).clear()
            getattr(restored, name).update(getattr(loop.optimizer, name))
        elif name == "lr" and restored.lr_scheduler is not None:
            restored.lr_scheduler.base_lr = value
        else:
            setattr(restored, name, value)
        warnings.warn(f"resuming from {checkpoint.path} with the optimizer's {name}={value!r} "
                      f"given to this MainLoop (the run started with {started[name]!r}, and had "
                      f"{plain_value(current)!r} when saved); its state is kept", stacklevel=4)
    restored.idx2name = loop.optimizer.idx2name.copy()
    loop.optimizer = restored
    if hasattr(updater, "_plans"):
        updater._plans.clear()
