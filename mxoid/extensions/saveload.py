"""Saving checkpoints that training resumes from exactly."""
from __future__ import annotations

import logging
import os
import zlib
from typing import Any, Dict, Optional

import mxnet as mx

from ..checkpoint import (checkpoint_name, list_checkpoints, remove_checkpoint,
                          remove_stale_temporaries, write_checkpoint)
from .base import Extension

__all__ = ["Checkpoint"]

logger = logging.getLogger(__name__)

_HIGHER_IS_BETTER = ("acc", "f1", "auc", "precision", "recall", "top_k")


class Checkpoint(Extension):
    """Save everything training needs to resume exactly, atomically.

    Each save writes a folder ``<directory>/checkpoint-<seq>-epoch<E>-batch<B>``
    (format in :mod:`mxoid.checkpoint`): the parameters in MXNet's own format,
    the optimizer states, the loop status and log, every extension's state,
    the random states and the training iterator's position. Resume with
    ``MainLoop(..., resume_from=directory)``.

    MXNet 1.x cannot report the state of its own random generator (dropout
    masks, random augmentation on the device). So that a resumed run draws
    the same numbers as an uninterrupted one, each save reseeds MXNet with a
    seed derived from the loop counters and stores it; resumption sets it
    again. Runs with and without a Checkpoint therefore draw different MXNet
    random numbers after the first save.

    Parameters
    ----------
    directory : str
        Where checkpoints go; created if needed.
    every_n_epochs : int or None, default 1
        Save after every n epochs.
    every_n_batches : int, optional
        Also save every n batches, in the middle of epochs.
    keep_last : int or None, default 3
        Keep the newest ``keep_last`` checkpoints, delete older ones. None keeps all.
    save_best_of : str, optional
        A log record (e.g. ``'valid_accuracy'``): whenever it improves, the
        state is also saved to ``<directory>/best`` (never deleted by
        ``keep_last``).
    best_mode : {'auto', 'min', 'max'}, default 'auto'
        Whether lower or higher ``save_best_of`` is better; 'auto' means
        higher for names with accuracy, f1, auc, precision or recall, lower
        otherwise (as Keras' ModelCheckpoint).
    prefix : str, default 'model'
        File prefix of the MXNet files inside a checkpoint.
    **kwargs
        Further firing conditions of :class:`Extension`. Saves also happen
        after training and on interruption (Ctrl-C, SIGTERM); never after an
        error, and never when :class:`NaNGuard` has marked the row with
        ``nan_detected``.

    Attributes
    ----------
    last_saved : str or None
        The folder of the newest checkpoint.

    Examples
    --------
    >>> loop = MainLoop(net, train, extensions=[FinishAfter(after_n_epochs=20),
    ...                 Checkpoint("runs/mlp", every_n_batches=500)],
    ...                 resume_from="runs/mlp")
    """

    rank_zero_only = True

    def __init__(self, directory: str, every_n_epochs: Optional[int] = 1,
                 every_n_batches: Optional[int] = None, keep_last: Optional[int] = 3,
                 save_best_of: Optional[str] = None, best_mode: str = "auto",
                 prefix: str = "model", **kwargs: Any) -> None:
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"keep_last must be at least 1 (or None to keep all), got {keep_last}")
        if best_mode not in ("auto", "min", "max"):
            raise ValueError(f"best_mode must be 'auto', 'min' or 'max', got {best_mode!r}")
        kwargs.setdefault("priority", 200)
        kwargs.setdefault("after_training", True)
        kwargs.setdefault("on_interrupt", True)
        if every_n_epochs:
            kwargs.setdefault("every_n_epochs", every_n_epochs)
        if every_n_batches:
            kwargs.setdefault("every_n_batches", every_n_batches)
        super().__init__(**kwargs)
        self.directory = directory
        self.keep_last = keep_last
        self.save_best_of = save_best_of
        if best_mode == "auto":
            best_mode = "max" if save_best_of and any(
                word in save_best_of.lower() for word in _HIGHER_IS_BETTER) else "min"
        self.best_mode = best_mode
        self.prefix = prefix
        self.sequence = 0
        self.best_value: Optional[float] = None
        self.last_saved: Optional[str] = None
        self._last_counters: Optional[list] = None

    def before_training(self) -> None:
        super().before_training()
        self._clean()

    def on_resumption(self) -> None:
        super().on_resumption()
        self._clean()

    def _clean(self) -> None:
        for path in remove_stale_temporaries(self.directory):
            logger.warning("removed %s, left half-written by a process that was killed", path)

    def do(self, which_callback: str, *args: Any) -> None:
        self.save()

    def after_batch(self, batch: Any) -> None:
        super().after_batch(batch)
        self._save_if_best()

    def after_epoch(self) -> None:
        super().after_epoch()
        self._save_if_best()

    def save(self) -> Optional[str]:
        """Save a checkpoint now; return its folder (None when skipped)."""
        loop = self.main_loop
        status = loop.status
        row = loop.log.current_row
        if "nan_detected" in row:
            logger.warning("not saving a checkpoint: %s is not finite", row["nan_detected"])
            return None
        counters = [status.iterations_done, status.epochs_done, status.epoch_started]
        if counters == self._last_counters:
            return self.last_saved
        self._last_counters = counters
        path = self._write(os.path.join(self.directory, checkpoint_name(
            self.sequence + 1, status.epochs_done, status.iterations_done)))
        self._prune()
        return path

    def _write(self, path: str) -> str:
        loop = self.main_loop
        status = loop.status
        self.sequence += 1
        self.last_saved = path
        loop.log.current_row["checkpoint_saved_to"] = path
        seed = zlib.crc32(f"{status.iterations_done}:{status.epochs_done}".encode()) & 0x7FFFFFFF
        state = loop.state_dict()
        state["mxnet_seed"] = seed
        arg_params, aux_params = loop.get_params()
        write_checkpoint(path, loop.symbol, arg_params, aux_params, state, loop.optimizer_states())
        mx.random.seed(seed)
        logger.info("checkpoint saved to %s", path)
        return path

    def _save_if_best(self) -> None:
        if not self.save_best_of:
            return
        log = self.main_loop.log
        row = log.get(self.main_loop.status.iterations_done)  # never create an empty row
        if not row or self.save_best_of not in row:
            return
        value = float(row[self.save_best_of])
        if value != value:  # NaN never improves
            return
        better = (self.best_value is None or
                  (value > self.best_value if self.best_mode == "max" else value < self.best_value))
        if better:
            self.best_value = value
            row[f"{self.save_best_of}_best_checkpoint"] = value
            loop = self.main_loop
            state = loop.state_dict()
            arg_params, aux_params = loop.get_params()
            write_checkpoint(os.path.join(self.directory, "best"), loop.symbol, arg_params,
                             aux_params, state, loop.optimizer_states())

    def _prune(self) -> None:
        if self.keep_last is None:
            return
        for path in list_checkpoints(self.directory)[:-self.keep_last]:
            remove_checkpoint(path)

    def state_dict(self) -> Dict[str, Any]:
        return {"sequence": self.sequence, "best_value": self.best_value,
                "last_saved": self.last_saved, "last_counters": self._last_counters}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.sequence = state["sequence"]
        self.best_value = state["best_value"]
        self.last_saved = state["last_saved"]
        self._last_counters = state["last_counters"]
