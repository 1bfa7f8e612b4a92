"""What a checkpoint holds of the loop itself, and how resumption gives it back.

:func:`loop_state` is what :meth:`mxoid.MainLoop.state_dict` returns (the
``loop.json`` of a checkpoint folder, :data:`~mxoid.checkpoint.format.LOOP_STATE_KEYS`
and more); :func:`restore_loop_state` is what :meth:`~mxoid.MainLoop.load_state_dict`
does with a checkpoint: it gives back the loop's parts, the log and status, the
extensions (through the dispatcher), the optimizer step (``loop.update``, with
:func:`given_settings_win`: the resume policy), the training iterator's
position, the random states and the gradients of an unfinished accumulation group
(in distributed training, this worker's own position and random states:
:mod:`.ranks`; derived anew for a job of another number of workers: :mod:`.resizing`).
"""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING, Any, Dict, List, Mapping

import mxnet as mx
import numpy as np

from ..checkpoint.format import CheckpointContents, CheckpointError, ResumeError
from ..checkpoint.random_state import get_random_states, set_random_states
from ..log.files import RESUMED_FROM
from ..log.records import plain_value
from .accumulation import restore_gradients
from .ranks import rank_entry, saved_workers, warn_inexact
from .resizing import follow_worker_count, resume_resized
from .server_optimizer import give_back_server_states

if TYPE_CHECKING:  # pragma: no cover
    from .loop import MainLoop

__all__ = ["given_settings_win", "input_state", "loop_state", "restore_loop_state"]

logger = logging.getLogger("mxoid.main_loop")  # where resumption has always been logged


def input_state(data_descs: Any) -> List[list]:
    """Return the training batch's data inputs as ``loop.json`` records them (``inputs``).

    ``[name, shape, type]`` each: the shapes :func:`mxoid.export_onnx` and
    :func:`mxoid.quantize` give a checkpoint's network when none are given.
    """
    return [[d.name, [int(s) for s in d.shape], np.dtype(d.dtype).name] for d in data_descs]


def loop_state(loop: MainLoop) -> Dict[str, Any]:
    """Return ``loop``'s state as plain JSON-ready data, for a checkpoint.

    Holds the log (records as plain values, see
    :func:`mxoid.log.records.plain_value`) with the status, each extension's
    ``state_dict()``, NumPy's and Python's random states, the training
    iterator's position, and what :func:`restore_loop_state` checks: the run,
    the devices, the batch size, the optimizer's settings.
    """
    log_state = loop.log.state_dict()
    log_state["rows"] = [
        [i, {k: plain_value(v) for k, v in row.items()}] for i, row in log_state["rows"]
    ]
    scaler = loop.update.loss_scaler
    return {
        "log": log_state,
        "status": loop.status.state_dict(),
        "extensions": loop.dispatcher.state_dict(),
        "random": get_random_states(),
        "data_position": loop.data_position.state_dict(),
        "num_devices": len(loop.contexts),
        "update_on_kvstore": loop.update_on_kvstore,
        "batch_size": loop.manager.batch_size,
        "run_id": loop.run_id,
        "optimizer": loop.update.settings,
        "accumulate_batches": loop.accumulate_batches,
        "fixed_param_names": list(loop.manager.fixed_param_names),
        "inputs": input_state(loop.manager.training_set.data_descs),
        "loss_scale": None if scaler is None else scaler.state_dict(),
        **loop.network.state(),
    }


def restore_loop_state(loop: MainLoop, checkpoint: CheckpointContents, stacklevel: int = 2) -> None:
    """Make ``loop`` continue the run of ``checkpoint``.

    Restore its optimizer states (the servers' too, with ``dist_sync`` and the
    optimizer on them: :mod:`.server_optimizer`), log, status, extension states, iterator
    position and random states (the parameters are set at construction). An
    optimizer setting of the loop that differs from the run's wins, with a
    warning (``stacklevel`` as ``warnings.warn`` takes it, from this function's
    caller).
    """
    state = checkpoint.loop_state
    update = loop.update
    rank, workers = 0, 1
    if loop.kvstore is not None:
        rank, workers = loop.kvstore.rank, loop.kvstore.num_workers
    started, rescale = follow_worker_count(
        state, (state.get("optimizer") or {}).get("settings", {}), update.settings, workers
    )

    def policy(restored: mx.optimizer.Optimizer) -> List[str]:
        changes = given_settings_win(
            restored, update.optimizer, update.settings, started, checkpoint.path
        )
        if rescale is not None:  # the default rescaling, of this job's number of workers
            restored.rescale_grad = rescale
        return changes

    if checkpoint.optimizer_states is not None:
        restored = update.load_states(checkpoint.optimizer_states)
        changes = policy(restored)
        update.use_optimizer(restored)
        for change in changes:
            warnings.warn(f"resuming from {checkpoint.path} with {change}", stacklevel=stacklevel)
    # with dist_sync and the optimizer on the servers; collective
    give_back_server_states(loop, checkpoint, policy, stacklevel)
    loop.log.load_state_dict(state["log"])
    loop.log.current_row[RESUMED_FROM] = checkpoint.path
    status = loop.status
    status.load_state_dict(state["status"])
    if "updates_done" not in state["status"]:  # mxoid 0.1: one update per batch
        status.updates_done = status.iterations_done
    scaler, saved_scale = update.loss_scaler, state.get("loss_scale")
    if scaler is not None and saved_scale:
        scaler.load_state_dict(saved_scale)
    elif saved_scale:  # the checkpoint's rescale_grad divided by the run's loss scale: none here
        update.set_loss_scale(1.0)
    status.loss_scale = None if scaler is None else scaler.scale
    if checkpoint.gradients:
        restore_gradients(loop.manager, checkpoint.gradients)
    fixed = state.get("fixed_param_names")
    if fixed is not None and sorted(fixed) != sorted(loop.manager.fixed_param_names):
        warnings.warn(
            f"resuming from {checkpoint.path} with fixed_param_names="
            f"{loop.manager.fixed_param_names} (the run had {fixed})",
            stacklevel=stacklevel,
        )
    status.stop_requested, status.stop_reason = False, None
    status.training_finished, status.epoch_interrupt_received = False, False
    status.interrupted = None
    status.rank, status.num_workers = rank, workers
    loop.run_id = state.get("run_id") or checkpoint.run_id or loop.run_id
    try:
        loop.dispatcher.load_state_dict(state["extensions"])
    except ValueError as error:
        raise CheckpointError(f"checkpoint {checkpoint.path}: {error}") from None
    if saved_workers(state) != workers:  # another number of workers: each part anew
        resume_resized(loop, checkpoint, stacklevel)
    else:
        own = rank_entry(state, rank, workers, checkpoint.path)
        loop.data_position.restore(
            own["data_position"],
            status.epochs_done,
            status.epoch_started,
            status.iterations_done_in_epoch,
        )
        set_random_states(own["random"])
        if own.get("mxnet_seed") is not None:
            mx.random.seed(int(own["mxnet_seed"]))
    warn_inexact(loop, state, checkpoint.path, stacklevel)
    loop.resumed_from = checkpoint.path
    logger.info(
        "resumed from %s after %d epochs, %d batches",
        checkpoint.path,
        status.epochs_done,
        status.iterations_done,
    )


def given_settings_win(
    restored: mx.optimizer.Optimizer,
    given: mx.optimizer.Optimizer,
    settings: Mapping[str, Any],
    started: Mapping[str, Any],
    where: str,
) -> List[str]:
    """Apply the resume policy to a checkpoint's optimizer; return the settings changed.

    The checkpoint's optimizer (``restored``, with its states) continues,
    except for the settings this loop was given (``settings``:
    :func:`~mxoid.update.optimizer_settings` of ``given``) that differ from
    those the saved run ``started`` with: the new value wins. A scheduler
    given anew does not replace the checkpoint's, whose state it would lose.

    Raises
    ------
    ResumeError
        When the checkpoint's optimizer is of another type.
    """
    if type(restored).__name__ != settings["type"]:
        raise ResumeError(
            f"checkpoint {where} was trained with the optimizer {type(restored).__name__}, "
            f"this loop has {settings['type']}; its states (momentum, moments) do not fit "
            f"another optimizer. Resume with optimizer={type(restored).__name__.lower()!r}, "
            "or start a new run from the checkpoint's parameters"
        )
    changes = []
    for name, value in settings["settings"].items():
        before = started.get(name, value)
        if before == value:
            continue
        if name == "lr_scheduler":
            changes.append(
                f"the optimizer's lr_scheduler changed ({before} -> {value}); "
                "the checkpoint's scheduler and its state are kept"
            )
            continue
        current = getattr(restored, name, None)
        if name in ("lr_mult", "wd_mult"):
            getattr(restored, name).clear()
            getattr(restored, name).update(getattr(given, name))
        elif name == "lr" and restored.lr_scheduler is not None:
            restored.lr_scheduler.base_lr = value
        else:
            setattr(restored, name, value)
        changes.append(
            f"the optimizer's {name}={value!r} given to this MainLoop (the run "
            f"started with {before!r}, and had {current!r} when saved); its "
            "state is kept"
        )
    return changes
