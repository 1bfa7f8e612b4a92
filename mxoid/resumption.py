"""The loop's own state in a checkpoint, and putting it back on resumption.

Parameters and optimizer states are saved in MXNet's own formats (see
:mod:`mxoid.checkpoint`); this module handles the rest: the log and status,
each extension's ``state_dict()``, NumPy's and Python's random states, the
MXNet seed, and the training iterator's position.
"""
from __future__ import annotations

import logging
import os
import warnings
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence

import mxnet as mx

from .checkpoint import CheckpointContents, latest_checkpoint
from .data_position import get_random_states, set_random_states
from .extensions.base import Extension

if TYPE_CHECKING:  # pragma: no cover
    from .main_loop import MainLoop

__all__ = ["checkpoint_folder", "extension_keys", "find_checkpoint", "loop_state",
           "optimizer_states", "restore_loop"]

logger = logging.getLogger(__name__)


def find_checkpoint(resume_from: Optional[str]) -> Optional[CheckpointContents]:
    """The newest whole checkpoint in ``resume_from`` (None, with a warning, when there is none)."""
    if resume_from is None:
        return None
    checkpoint = latest_checkpoint(resume_from)
    if checkpoint is None:
        warnings.warn(f"resume_from={resume_from!r} holds no whole checkpoint yet: "
                      "training starts from scratch", stacklevel=3)
    return checkpoint


def checkpoint_folder(path: str) -> str:
    """The Checkpoint directory (what ``resume_from`` takes) of a checkpoint folder."""
    return os.path.dirname(os.path.abspath(path))


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


def loop_state(loop: "MainLoop") -> Dict[str, Any]:
    """Return the loop's state as plain JSON-ready data."""
    return {"log": loop.log.state_dict(),
            "status": loop.status.state_dict(),
            "extensions": {key: extension.state_dict()
                           for key, extension in extension_keys(loop.extensions).items()},
            "random": get_random_states(),
            "data_position": loop.data_position.state_dict(),
            "num_devices": len(loop.contexts),
            "update_on_kvstore": loop.update_on_kvstore}


def optimizer_states(loop: "MainLoop") -> Optional[bytes]:
    """The optimizer and its states as MXNet dumps them, or None with a distributed
    kvstore (whose states live on the servers)."""
    if loop.update_on_kvstore:
        updater = getattr(loop.kvstore, "_updater", None)
        return None if updater is None else updater.get_states(dump_optimizer=True)
    return loop.updater.get_states(dump_optimizer=True)


def restore_loop(loop: "MainLoop", checkpoint: CheckpointContents) -> None:
    """Put the optimizer states, log, status, extension states, iterator position and
    random states of ``checkpoint`` back into ``loop`` (parameters are set before)."""
    state = checkpoint.loop_state
    for key, here in (("num_devices", len(loop.contexts)),
                      ("update_on_kvstore", loop.update_on_kvstore)):
        if state[key] != here:
            raise ValueError(f"checkpoint {checkpoint.path} was saved with {key}={state[key]}, "
                             f"this loop has {key}={here}; resume with the same contexts "
                             "and kvstore settings")
    if checkpoint.optimizer_states is not None:
        updater = loop.kvstore._updater if loop.update_on_kvstore else loop.updater
        updater.set_states(checkpoint.optimizer_states)
        loop.optimizer = updater.optimizer
    loop.log.load_state_dict(state["log"])
    status = loop.status
    status.load_state_dict(state["status"])
    status.stop_requested, status.stop_reason = False, None
    status.training_finished, status.epoch_interrupt_received = False, False
    status.interrupted = None
    if loop.kvstore is not None:
        status.rank, status.num_workers = loop.kvstore.rank, loop.kvstore.num_workers
    saved = state["extensions"]
    for key, extension in extension_keys(loop.extensions).items():
        if key in saved:
            extension.load_state_dict(saved[key])
    loop.data_position.restore(state["data_position"], status.epochs_done,
                               status.epoch_started, status.iterations_done_in_epoch)
    set_random_states(state["random"])
    if state.get("mxnet_seed") is not None:
        mx.random.seed(int(state["mxnet_seed"]))
    logger.info("resumed from %s after %d epochs, %d batches", checkpoint.path,
                status.epochs_done, status.iterations_done)
